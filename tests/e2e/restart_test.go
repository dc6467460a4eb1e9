package e2e

import (
	"context"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"

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
			if r.Outcome != echo.Connected {
				failed.Add(1)
				firstFailure.CompareAndSwap(nil, r.String())
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

// TestMTU: Pods and the gateway get the transport MTU (1500 in the
// sandbox) minus the Geneve overhead (50) in the modes that tunnel (hybrid
// too: some peers are tunnelled), the whole of it in noEncap; in
// networkPolicyOnly the primary CNI sets the Pods' (1500 in the sandbox)
// and the gateway has the transport's.
func TestMTU(t *testing.T) {
	c := shared
	want := 1500
	if e2eMode.UsesTunnel() {
		want = 1450
	}
	pods := createPods(t, c, "mtu", 0)
	ctx := testCtx(t, 30*time.Second)
	out, err := c.Exec(ctx, pods[0].ns, pods[0].name, "cat", "/sys/class/net/eth0/mtu")
	if err != nil {
		t.Fatal(err)
	}
	if got, _ := strconv.Atoi(strings.TrimSpace(string(out))); got != want {
		t.Errorf("Pod MTU %d, want %d", got, want)
	}
	for _, n := range c.Nodes() {
		out, err := c.NodeExec(ctx, n.Name, "cat", "/sys/class/net/seine-gw0/mtu")
		if err != nil {
			t.Fatal(err)
		}
		if got, _ := strconv.Atoi(strings.TrimSpace(string(out))); got != want {
			t.Errorf("gateway MTU on %s is %d, want %d", n.Name, got, want)
		}
	}
}
