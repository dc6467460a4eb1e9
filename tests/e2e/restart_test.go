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

	"github.com/seine-net/seine/datapath/csumseed"
	"github.com/seine-net/seine/node/config"
	"github.com/seine-net/seine/tests/sandbox"
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
	stopProbes := func() { cancel(); wg.Wait() }
	t.Cleanup(stopProbes) // a failed step below must not leave the probes running
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
	// probes waits until three more probes have run: with no daemon at
	// all, and after the restarts.
	probes := func(what string) {
		t.Helper()
		want := sent.Load() + 3
		eventually(t, 30*time.Second, "three probes "+what, func() error {
			if n := sent.Load(); n < want {
				return fmt.Errorf("%d of %d probes sent", n, want)
			}
			return nil
		})
	}
	for _, n := range c.Nodes()[:2] {
		stopSeine(t, c, n.Name)
		probes("with no daemon on " + n.Name)
		if err := c.StartSeine(testCtx(t, time.Minute), n.Name, nil); err != nil {
			t.Fatal(err)
		}
	}
	probes("after the restarts")
	stopProbes()
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

// TestVSwitchdRestart restarts ovs-vswitchd on the client's Node under a
// running seine, as a package upgrade or a crash does. seine notices on
// its own (its OpenFlow connection drops), reconnects, checks its checksum
// seed filters and replays its groups and flows; Pod traffic across Nodes
// comes back without anything else restarting, and so does a large
// transfer through a ClusterIP whose endpoint is on the other Node (NATed
// with TSO, so it leaves through the seed filters). How long the outage
// lasted is logged, not asserted: ovs-vswitchd's own start dominates it.
func TestVSwitchdRestart(t *testing.T) {
	requireMode(t, config.ModeEncap)
	c := shared
	pods := createPods(t, c, "vsrestart", 0, 1)
	client, server := pods[0], pods[1]
	node := c.Nodes()[0]
	ctx := testCtx(t, 3*time.Minute)
	// A Pod with an egress limit: its meter lives in ovs-vswitchd's memory,
	// and its Classifier flow cannot come back without it.
	sp, err := c.CreatePod(ctx, sandbox.PodSpec{Namespace: "vsrestart", Name: "shaped", Node: node.Name, Ports: demoPorts,
		Annotations: map[string]string{"kubernetes.io/egress-bandwidth": "50M"}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.DeletePod(context.Background(), "vsrestart", "shaped") })
	shaped := podRef{ns: "vsrestart", name: "shaped", node: node.Name, ip: sp.Status.PodIP}
	shapedMeter := strings.Trim(strings.TrimSpace(ovs(t, node, "ovs-vsctl", "get", "Port", hostVethOf(t, node, shaped.ip), "external_ids:seine.io/egress-meter")), `"`)

	restarted := time.Now()
	if err := c.RestartVSwitchd(ctx, node.Name); err != nil {
		t.Fatal(err)
	}
	eventually(t, time.Minute, "Pod to Pod across Nodes after ovs-vswitchd restarted", func() error {
		if r := probe(t, c, client, server.ip, tcpPort, corev1.ProtocolTCP); r.Outcome != echo.Connected || r.Reply != server.name {
			return fmt.Errorf("%s (%v)", r, r.Err)
		}
		return nil
	})
	t.Logf("ovs-vswitchd restarted on %s: Pod traffic across Nodes back %s after the restart began",
		node.Name, time.Since(restarted).Round(time.Millisecond))
	if !c.NodeProcesses(node)["seine"] {
		t.Fatalf("seine on %s is not running after ovs-vswitchd restarted", node.Name)
	}
	if out := ovs(t, node, "ovs-ofctl", "meter-stats", brInt(node), "meter="+shapedMeter); !strings.Contains(out, "flow_count:1 ") {
		t.Errorf("the shaped Pod's meter %q after ovs-vswitchd restarted: want it used by its Classifier flow:\n%s", shapedMeter, out)
	}
	expectConnected(t, probe(t, c, shaped, server.ip, tcpPort, corev1.ProtocolTCP), server.name, "the shaped Pod after ovs-vswitchd restarted")

	// The checksum seed filters are in place (kept by the taps, or
	// attached again on reconnect), and the daemon says so.
	leaving := map[bool]string{true: "seine-tun0", false: "seine-seg0"}[sandboxTunnel == "vxlan"]
	for _, hook := range [][2]string{{"seine-gw0", "ingress"}, {leaving, "egress"}} {
		out, err := c.NodeExec(ctx, node.Name, "tc", "filter", "show", "dev", hook[0], hook[1])
		if err != nil || !strings.Contains(string(out), csumseed.ProgramName) {
			t.Errorf("%s after ovs-vswitchd restarted: no checksum seed filter on %s %s (%v):\n%s", node.Name, hook[0], hook[1], err, out)
		}
	}
	m, err := c.NodeMetrics(ctx, node.Name)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(m, "seine_nat_checksum_hooks_missing 0\n") {
		t.Errorf("%s after ovs-vswitchd restarted: %q", node.Name, grepLines(m, "seine_nat_checksum_hooks_missing"))
	}

	// UDP, and NATed bulk across Nodes.
	expectConnected(t, probe(t, c, client, server.ip, udpPort, corev1.ProtocolUDP), server.name, "UDP after ovs-vswitchd restarted")
	l, err := c.ListenIn(server.ns, server.name, ":"+strconv.Itoa(bulkPort))
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	go bulkReceiver(l)
	bulkThroughClusterIP(t, c, server, client, "the tunnel, after ovs-vswitchd restarted")
}
