package e2e

import (
	"context"
	"fmt"
	"net"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/seine-net/seine/node/config"
	"github.com/seine-net/seine/tests/sandbox"
	"github.com/seine-net/seine/tests/sandbox/echo"
)

const (
	tcpPort = 8080
	udpPort = 5353
)

var demoPorts = []sandbox.Port{
	{Name: "http", Port: tcpPort, Protocol: corev1.ProtocolTCP},
	{Name: "dns", Port: udpPort, Protocol: corev1.ProtocolUDP},
}

type podRef struct {
	ns, name, node, ip string
}

// createPods creates one Pod per entry of nodes (index into Nodes()) in a
// fresh namespace and deletes them when the test ends: each deletion is
// registered before its Pod is created, so a Pod that never got Ready, or
// the Pods before one that failed, go too.
func createPods(t *testing.T, c *sandbox.Cluster, ns string, nodes ...int) []podRef {
	t.Helper()
	ctx := testCtx(t, 3*time.Minute)
	var pods []podRef
	for i, ni := range nodes {
		node := c.Nodes()[ni]
		name := fmt.Sprintf("p%d-n%d", i, ni+1)
		cleanupPod(t, c, ns, name)
		p, err := c.CreatePod(ctx, sandbox.PodSpec{Namespace: ns, Name: name, Node: node.Name,
			Labels: map[string]string{"app": "e2e"}, Ports: demoPorts})
		if err != nil {
			t.Fatalf("creating pod %s on %s: %v", name, node.Name, err)
		}
		pods = append(pods, podRef{ns: ns, name: name, node: node.Name, ip: p.Status.PodIP})
	}
	return pods
}

// cleanupPod deletes the Pod ns/name when the test ends (DeletePod does
// nothing for a Pod that does not exist): register it before creating the
// Pod.
func cleanupPod(t *testing.T, c *sandbox.Cluster, ns, name string) {
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
		defer cancel()
		if err := c.DeletePod(ctx, ns, name); err != nil {
			t.Errorf("deleting pod %s/%s: %v", ns, name, err)
		}
	})
}

func probe(t *testing.T, c *sandbox.Cluster, from podRef, host string, port int, proto corev1.Protocol) echo.Result {
	t.Helper()
	return c.Probe(testCtx(t, 10*time.Second), from.ns, from.name, host, port, proto, 3*time.Second)
}

func expectConnected(t *testing.T, r echo.Result, want, what string) {
	t.Helper()
	if r.Outcome != echo.Connected || (want != "" && r.Reply != want) {
		t.Errorf("%s: got %s (err %v), want connected %s", what, r, r.Err, want)
	}
}

func ping(t *testing.T, c *sandbox.Cluster, from podRef, ip string) {
	t.Helper()
	out, err := c.Exec(testCtx(t, 15*time.Second), from.ns, from.name, "ping", "-c", "1", "-W", "3", ip)
	if err != nil {
		t.Errorf("ping %s from %s/%s: %v\n%s", ip, from.ns, from.name, err, out)
	}
}

func TestPodToPod(t *testing.T) {
	c := shared
	// Two Pods on Node 1, one on Node 2, one on Node 3.
	pods := createPods(t, c, "podtopod", 0, 0, 1, 2)
	_, podCIDR1, _ := net.ParseCIDR(nodePodCIDR(t, c, pods[0].node))
	for _, p := range pods[:2] {
		if !podCIDR1.Contains(net.ParseIP(p.ip)) {
			t.Fatalf("pod %s IP %s is outside its Node's podCIDR %s", p.name, p.ip, podCIDR1)
		}
	}
	seen := map[string]bool{}
	for _, p := range pods {
		if seen[p.ip] {
			t.Fatalf("IP %s given to two Pods", p.ip)
		}
		seen[p.ip] = true
	}
	cases := []struct {
		name     string
		from, to podRef
	}{
		{"same Node", pods[0], pods[1]},
		{"across Nodes 1 to 2", pods[0], pods[2]},
		{"across Nodes 2 to 3", pods[2], pods[3]},
		{"across Nodes 3 to 1", pods[3], pods[1]},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			expectConnected(t, probe(t, c, tc.from, tc.to.ip, tcpPort, corev1.ProtocolTCP), tc.to.name, "TCP")
			expectConnected(t, probe(t, c, tc.from, tc.to.ip, udpPort, corev1.ProtocolUDP), tc.to.name, "UDP")
			ping(t, c, tc.from, tc.to.ip)
		})
	}
}

// TestCrossNodeTrafficUsesTunnel checks that cross-Node packets really
// cross the tunnel: the tunnel port's counters on both Nodes grow by at
// least the packets of the probes.
func TestCrossNodeTrafficUsesTunnel(t *testing.T) {
	requireMode(t, config.ModeEncap)
	c := shared
	pods := createPods(t, c, "tunnel", 0, 1)
	n1, n2 := c.Nodes()[0], c.Nodes()[1]
	tx0 := tunnelStat(t, n1, "tx_packets")
	rx0 := tunnelStat(t, n2, "rx_packets")
	const probes = 10
	for i := 0; i < probes; i++ {
		expectConnected(t, probe(t, c, pods[0], pods[1].ip, tcpPort, corev1.ProtocolTCP), pods[1].name, "TCP")
	}
	// Each TCP probe sends at least 3 packets (SYN, ACK, FIN) one way.
	eventually(t, 10*time.Second, "tunnel counters", func() error {
		tx := tunnelStat(t, n1, "tx_packets") - tx0
		rx := tunnelStat(t, n2, "rx_packets") - rx0
		if tx < 3*probes || rx < 3*probes {
			return fmt.Errorf("tunnel tx on %s grew by %d, rx on %s by %d; want >= %d", n1.Name, tx, n2.Name, rx, 3*probes)
		}
		return nil
	})
}

var statRE = regexp.MustCompile(`(\w+)=(\d+)`)

func tunnelStat(t *testing.T, n sandbox.Node, key string) int64 {
	t.Helper()
	out := ovs(t, n, "ovs-vsctl", "get", "Interface", "seine-tun0", "statistics")
	for _, m := range statRE.FindAllStringSubmatch(out, -1) {
		if m[1] == key {
			v, _ := strconv.ParseInt(m[2], 10, 64)
			return v
		}
	}
	t.Fatalf("no %s in tunnel statistics of %s: %s", key, n.Name, out)
	return 0
}

func nodePodCIDR(t *testing.T, c *sandbox.Cluster, node string) string {
	t.Helper()
	n, err := c.Client().CoreV1().Nodes().Get(testCtx(t, 10*time.Second), node, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return n.Spec.PodCIDR
}

func TestPodAndNodeTraffic(t *testing.T) {
	c := shared
	pods := createPods(t, c, "podnode", 0, 1)
	nodes := c.Nodes()
	// A server on every Node's host network namespace.
	for _, n := range nodes[:2] {
		srv, err := c.Serve(n.NetNS, "host-"+n.Name, []sandbox.Port{{Port: 9090, Protocol: corev1.ProtocolTCP}})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(srv.Close)
	}
	expectConnected(t, probe(t, c, pods[0], nodes[0].IP, 9090, corev1.ProtocolTCP), "host-"+nodes[0].Name, "Pod to its own Node")
	expectConnected(t, probe(t, c, pods[0], nodes[1].IP, 9090, corev1.ProtocolTCP), "host-"+nodes[1].Name, "Pod to a peer Node")
	ping(t, c, pods[0], nodes[1].IP)
	for _, from := range nodes[:2] {
		for _, to := range pods {
			r := c.ProbeFrom(testCtx(t, 10*time.Second), from.NetNS, to.ip, tcpPort, corev1.ProtocolTCP, 3*time.Second)
			expectConnected(t, r, to.name, fmt.Sprintf("Node %s to Pod %s on %s", from.Name, to.name, to.node))
		}
	}
}

// TestPodToExternalIsMasqueraded checks that the external host sees the
// Node IP as the source of a Pod's connection (the Pod IP where the Node
// does not masquerade: see expectedSource).
func TestPodToExternalIsMasqueraded(t *testing.T) {
	c := shared
	pods := createPods(t, c, "external", 1)
	extNS, extIP := c.ExternalHost()
	srv, err := c.Serve(extNS, "external", []sandbox.Port{{Port: 7070, Protocol: corev1.ProtocolTCP}, {Port: 7070, Protocol: corev1.ProtocolUDP}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(srv.Close)
	want := expectedSource(t, c, pods[0])
	for _, proto := range []corev1.Protocol{corev1.ProtocolTCP, corev1.ProtocolUDP} {
		r := probe(t, c, pods[0], extIP, 7070, proto)
		expectConnected(t, r, "external", "Pod to external host over "+string(proto))
		if host, _, _ := net.SplitHostPort(r.Client); host != want {
			t.Errorf("external host saw the %s connection from %q, want %s", proto, r.Client, want)
		}
	}
	// And Pod-to-Pod traffic keeps the Pod's address.
	other := createPods(t, c, "external2", 0)
	r := probe(t, c, other[0], pods[0].ip, tcpPort, corev1.ProtocolTCP)
	expectConnected(t, r, pods[0].name, "Pod to Pod")
	if host, _, _ := net.SplitHostPort(r.Client); host != other[0].ip {
		t.Errorf("Pod-to-Pod connection arrived from %q, want the Pod IP %s (not masqueraded)", r.Client, other[0].ip)
	}
}

// TestPodDeletionReleasesEverything checks that a deleted Pod's IP, veth,
// OVS port and flows are gone.
func TestPodDeletionReleasesEverything(t *testing.T) {
	c := shared
	n := c.Nodes()[2]
	ctx := testCtx(t, 2*time.Minute)
	cleanupPod(t, c, "lifecycle", "short-lived") // if a step fails before the deletion under test
	p, err := c.CreatePod(ctx, sandbox.PodSpec{Namespace: "lifecycle", Name: "short-lived", Node: n.Name, Ports: demoPorts})
	if err != nil {
		t.Fatal(err)
	}
	ip := p.Status.PodIP
	port := portOfPod(t, n, "lifecycle", "short-lived")
	if port == "" {
		t.Fatalf("no OVS port names Pod lifecycle/short-lived")
	}
	if !strings.Contains(ovs(t, n, "ovs-ofctl", "dump-flows", brInt(n)), "nw_dst="+ip+" ") {
		t.Fatalf("no flow for %s before deletion", ip)
	}
	if err := c.DeletePod(ctx, "lifecycle", "short-lived"); err != nil {
		t.Fatal(err)
	}
	eventually(t, 20*time.Second, "Pod state released", func() error {
		if flows := ovs(t, n, "ovs-ofctl", "dump-flows", brInt(n)); strings.Contains(flows, ip+",") || strings.Contains(flows, ip+" ") {
			return fmt.Errorf("flows still mention %s", ip)
		}
		if portOfPod(t, n, "lifecycle", "short-lived") != "" {
			return fmt.Errorf("OVS port %s still present", port)
		}
		if out, err := c.NodeExec(ctx, n.Name, "ip", "link", "show", port); err == nil {
			return fmt.Errorf("veth %s still present: %s", port, out)
		}
		if out, _ := c.NodeExec(ctx, n.Name, "ip", "route", "show", ip); strings.Contains(string(out), "seine-gw0") {
			return fmt.Errorf("route to %s through the gateway still present", ip)
		}
		if alloc := ipamAllocations(t, c, n); strings.Contains(alloc, `"`+ip+`"`) {
			return fmt.Errorf("IP %s still allocated", ip)
		}
		return nil
	})
}

// portOfPod returns the OVS port whose external_ids name the Pod.
func portOfPod(t *testing.T, n sandbox.Node, ns, pod string) string {
	t.Helper()
	out := ovs(t, n, "ovs-vsctl", "--columns=name", "--bare", "find", "Port",
		"external_ids:seine.io/pod-namespace="+ns, "external_ids:seine.io/pod-name="+pod)
	return strings.TrimSpace(out)
}
