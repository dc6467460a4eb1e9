package e2e

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"

	"github.com/seine-net/seine/node/config"
	"github.com/seine-net/seine/tests/sandbox/echo"
)

// TestRestartKeepsTraffic restarts seine on both ends of a cross-Node
// connection while new connections are opened every 50 ms: none may fail,
// since a restarting daemon never clears the flows it replaces.
func TestRestartKeepsTraffic(t *testing.T) {
	c := shared
	pods := createPods(t, c, "restart", 0, 1)
	var sent, failed atomic.Int64
	var firstFailure atomic.Value
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		for ctx.Err() == nil {
			r := c.Probe(context.Background(), pods[0].ns, pods[0].name, pods[1].ip, tcpPort, corev1.ProtocolTCP, 2*time.Second)
			sent.Add(1)
			if r.Outcome != echo.Connected || r.Reply != pods[1].name {
				failed.Add(1)
				firstFailure.CompareAndSwap(nil, fmt.Sprintf("%s (%v)", r, r.Err))
			}
			time.Sleep(50 * time.Millisecond)
		}
	}()
	for _, n := range c.Nodes()[:2] {
		if err := c.StopSeine(n.Name); err != nil {
			t.Fatal(err)
		}
		time.Sleep(300 * time.Millisecond) // traffic keeps flowing with no daemon at all
		if err := c.StartSeine(testCtx(t, time.Minute), n.Name, nil); err != nil {
			t.Fatal(err)
		}
	}
	time.Sleep(time.Second)
	cancel()
	wg.Wait()
	if sent.Load() < 10 {
		t.Fatalf("only %d probes ran", sent.Load())
	}
	if failed.Load() > 0 {
		t.Fatalf("%d of %d connections failed across daemon restarts (first: %v)", failed.Load(), sent.Load(), firstFailure.Load())
	}
	t.Logf("%d connections, none failed, across restarts of seine on two Nodes", sent.Load())
}

// TestMTU: Pod interfaces get the transport's MTU (1500 in the sandbox)
// in every mode (in networkPolicyOnly the primary CNI sets it, 1500 too).
// In the modes that tunnel (hybrid too: some peers are tunnelled), the
// gateway and the Pods' routes through it get the transport's MTU less
// the tunnel overhead (50 for VXLAN and Geneve): a Pod sends 1500-byte packets to a Pod of its
// own Node and 1450-byte ones to a Pod of another, both with the Don't
// Fragment bit, and one byte more across Nodes fails in the Pod itself
// ("message too long"), not somewhere on the way.
func TestMTU(t *testing.T) {
	c := shared
	path, gw := 1500, 1500
	if e2eMode.UsesTunnel() {
		path, gw = 1450, 1450
	}
	if e2eMode == config.ModeNetworkPolicyOnly {
		gw = 1500
	}
	pods := createPods(t, c, "mtu", 0, 0, 1)
	ctx := testCtx(t, 60*time.Second)
	out, err := c.Exec(ctx, pods[0].ns, pods[0].name, "cat", "/sys/class/net/eth0/mtu")
	if err != nil {
		t.Fatal(err)
	}
	if got, _ := strconv.Atoi(strings.TrimSpace(string(out))); got != 1500 {
		t.Errorf("Pod MTU %d, want 1500", got)
	}
	for _, n := range c.Nodes() {
		out, err := c.NodeExec(ctx, n.Name, "cat", "/sys/class/net/seine-gw0/mtu")
		if err != nil {
			t.Fatal(err)
		}
		if got, _ := strconv.Atoi(strings.TrimSpace(string(out))); got != gw {
			t.Errorf("gateway MTU on %s is %d, want %d", n.Name, got, gw)
		}
	}
	// ping's payload is the packet less 28 bytes of IPv4 and ICMP headers.
	ping := func(to podRef, size int) error {
		out, err := c.Exec(ctx, pods[0].ns, pods[0].name, "ping", "-c", "1", "-W", "3", "-M", "do",
			"-s", strconv.Itoa(size-28), to.ip)
		if err != nil {
			return fmt.Errorf("%w: %s", err, out)
		}
		return nil
	}
	if err := ping(pods[1], 1500); err != nil {
		t.Errorf("1500-byte ping to a Pod on the same Node: %v", err)
	}
	if err := ping(pods[2], path); err != nil {
		t.Errorf("%d-byte ping to a Pod on another Node: %v", path, err)
	}
	if path < 1500 {
		if err := ping(pods[2], path+1); err == nil || !strings.Contains(err.Error(), "message too long") {
			t.Errorf("%d-byte ping to a Pod on another Node: %v, want \"message too long\" from the Pod's route", path+1, err)
		}
	}
}
