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
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/seine-net/seine/node/config"
	"github.com/seine-net/seine/tests/sandbox"
	"github.com/seine-net/seine/tests/sandbox/echo"
)

// TestHostPorts creates a Pod with a TCP and a UDP hostPort on the first
// Node (served by the daemon: no portmap in the conflist) and reaches it
// on the Node's address from outside the cluster (the client's address
// kept), from a Pod on another Node and one on the same Node, from itself
// (hairpin), and from the Node's host through its own address and
// 127.0.0.1. Pods keep their address, so an ingress policy admitting only
// the external host refuses them through the hostPort, the Pod itself
// still gets in. A mapping whose hostIP is not the Node's (the external
// host's address) takes no traffic from the Node's Pods to that address.
// Once the Pod is deleted, the host port answers no more and the Node's
// hostPort table holds nothing of it.
func TestHostPorts(t *testing.T) {
	if e2eMode == config.ModeNetworkPolicyOnly {
		t.Skip("the primary CNI's portmap serves hostPorts in networkPolicyOnly mode")
	}
	c := shared
	nsName := "hostports"
	nodes := c.Nodes()
	const hostTCP, hostUDP = 30480, 30453
	ctx := testCtx(t, 3*time.Minute)
	_, err := c.CreatePod(ctx, sandbox.PodSpec{Namespace: nsName, Name: "hp", Node: nodes[0].Name,
		Labels: map[string]string{"app": "hp"}, Ports: []sandbox.Port{
			{Name: "http", Port: tcpPort, Protocol: corev1.ProtocolTCP, HostPort: hostTCP},
			{Name: "dns", Port: udpPort, Protocol: corev1.ProtocolUDP, HostPort: hostUDP},
		}})
	if err != nil {
		t.Fatal(err)
	}
	deleted := false
	t.Cleanup(func() {
		if !deleted {
			_ = c.DeletePod(context.Background(), nsName, "hp")
		}
	})
	clients := svcPods(t, c, nsName, "hp-client", 0, 1)
	extNS, extIP := c.ExternalHost()

	type source struct {
		name  string
		probe func(ip string, port int, proto corev1.Protocol) echo.Result
	}
	fromNS := func(netns string) func(string, int, corev1.Protocol) echo.Result {
		return func(ip string, port int, proto corev1.Protocol) echo.Result {
			return c.ProbeFrom(testCtx(t, 10*time.Second), netns, ip, port, proto, 2*time.Second)
		}
	}
	fromPod := func(namespace, name string) func(string, int, corev1.Protocol) echo.Result {
		return func(ip string, port int, proto corev1.Protocol) echo.Result {
			return c.Probe(testCtx(t, 10*time.Second), namespace, name, ip, port, proto, 2*time.Second)
		}
	}
	sources := []source{
		{"outside the cluster", fromNS(extNS)},
		{"a Pod on another Node", fromPod(nsName, clients[1].name)},
		{"a Pod on the same Node", fromPod(nsName, clients[0].name)},
		{"the Pod itself", fromPod(nsName, "hp")},
		{"the Node's host", fromNS(nodes[0].NetNS)},
	}
	for _, s := range sources {
		eventually(t, 20*time.Second, s.name+" to the hostPorts", func() error {
			for _, p := range []struct {
				port  int
				proto corev1.Protocol
			}{{hostTCP, corev1.ProtocolTCP}, {hostUDP, corev1.ProtocolUDP}} {
				r := s.probe(nodes[0].IP, p.port, p.proto)
				if r.Outcome != echo.Connected || r.Reply != "hp" {
					return fmt.Errorf("%s %s:%d: %s", p.proto, nodes[0].IP, p.port, r)
				}
				if s.name == "outside the cluster" && p.proto == corev1.ProtocolTCP {
					if host, _, _ := net.SplitHostPort(r.Client); host != extIP {
						return fmt.Errorf("server saw client %s, want the external host %s", r.Client, extIP)
					}
				}
			}
			return nil
		})
	}
	// Other Pods keep their address (only the Pod itself and localhost
	// are masqueraded), so the Pod's NetworkPolicies judge them: an
	// ingress policy admitting only the external host refuses them
	// through the hostPort as it does directly.
	for _, cl := range clients {
		r := fromPod(nsName, cl.name)(nodes[0].IP, hostTCP, corev1.ProtocolTCP)
		if host, _, _ := net.SplitHostPort(r.Client); r.Outcome != echo.Connected || host != cl.ip {
			t.Errorf("%s to the hostPort: %s, server saw client %q, want the Pod's address %s", cl.name, r, r.Client, cl.ip)
		}
	}
	pols := c.Client().NetworkingV1().NetworkPolicies(nsName)
	if _, err := pols.Create(ctx, &networkingv1.NetworkPolicy{ObjectMeta: metav1.ObjectMeta{Name: "hp-external-only"},
		Spec: networkingv1.NetworkPolicySpec{PodSelector: metav1.LabelSelector{MatchLabels: map[string]string{"app": "hp"}},
			PolicyTypes: []networkingv1.PolicyType{networkingv1.PolicyTypeIngress},
			Ingress: []networkingv1.NetworkPolicyIngressRule{{From: []networkingv1.NetworkPolicyPeer{
				{IPBlock: &networkingv1.IPBlock{CIDR: extIP + "/32"}}}}}}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = pols.Delete(context.Background(), "hp-external-only", metav1.DeleteOptions{}) })
	for _, cl := range clients {
		eventually(t, 15*time.Second, cl.name+" refused through the hostPort", func() error {
			if r := fromPod(nsName, cl.name)(nodes[0].IP, hostTCP, corev1.ProtocolTCP); r.Outcome != echo.TimedOut {
				return fmt.Errorf("got %s, want timed out (dropped by the policy)", r)
			}
			return nil
		})
	}
	for _, s := range []source{sources[0], sources[3]} {
		if r := s.probe(nodes[0].IP, hostTCP, corev1.ProtocolTCP); r.Outcome != echo.Connected || r.Reply != "hp" {
			t.Errorf("%s to the hostPort under the policy: %s", s.name, r)
		}
	}
	if err := pols.Delete(ctx, "hp-external-only", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	eventually(t, 10*time.Second, "the Node's host through 127.0.0.1", func() error {
		if r := fromNS(nodes[0].NetNS)("127.0.0.1", hostTCP, corev1.ProtocolTCP); r.Outcome != echo.Connected || r.Reply != "hp" {
			return fmt.Errorf("got %s", r)
		}
		return nil
	})
	// Another Node does not serve the port.
	if r := fromNS(extNS)(nodes[1].IP, hostTCP, corev1.ProtocolTCP); r.Outcome == echo.Connected || r.Outcome == echo.Failed {
		t.Errorf("%s:%d on a Node without the Pod: %s (%v), want refused or timed out", nodes[1].IP, hostTCP, r, r.Err)
	}

	// A hostIP that is not the Node's maps nothing: the Node's Pods still
	// reach the external host's own server on that address and port.
	const hijackPort = 30481
	srv, err := c.Serve(extNS, "ext", []sandbox.Port{{Port: hijackPort, Protocol: corev1.ProtocolTCP}})
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Close()
	if _, err := c.CreatePod(ctx, sandbox.PodSpec{Namespace: nsName, Name: "hijack", Node: nodes[0].Name,
		Ports: []sandbox.Port{{Name: "http", Port: tcpPort, Protocol: corev1.ProtocolTCP, HostPort: hijackPort, HostIP: extIP}}}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.DeletePod(context.Background(), nsName, "hijack") })
	if out, err := c.NodeExec(testCtx(t, 10*time.Second), nodes[0].Name, "nft", "list", "map", "ip", "seine-hostport", "ip-ports"); err != nil ||
		!strings.Contains(string(out), extIP+" . tcp . "+strconv.Itoa(hijackPort)) {
		t.Fatalf("the hostIP mapping is not in the table: %v\n%s", err, out)
	}
	for i := 0; i < 3; i++ {
		if r := fromPod(nsName, clients[0].name)(extIP, hijackPort, corev1.ProtocolTCP); r.Outcome != echo.Connected || r.Reply != "ext" {
			t.Errorf("a Pod to %s:%d, the hostIP of another Pod's mapping: %s, want the external host's answer", extIP, hijackPort, r)
		}
	}

	if err := c.DeletePod(ctx, nsName, "hp"); err != nil {
		t.Fatal(err)
	}
	deleted = true
	eventually(t, 20*time.Second, "the hostPort gone with its Pod", func() error {
		if r := fromNS(extNS)(nodes[0].IP, hostTCP, corev1.ProtocolTCP); r.Outcome == echo.Connected || r.Outcome == echo.Failed {
			return fmt.Errorf("still answered, or the probe failed: %s (%v)", r, r.Err)
		}
		out, err := c.NodeExec(testCtx(t, 10*time.Second), nodes[0].Name, "nft", "list", "table", "ip", "seine-hostport")
		if err != nil {
			return fmt.Errorf("%v: %s", err, out)
		}
		if strings.Contains(string(out), strconv.Itoa(hostTCP)) || strings.Contains(string(out), strconv.Itoa(hostUDP)) {
			return fmt.Errorf("table still maps the ports:\n%s", out)
		}
		return nil
	})
}

// TestBandwidthShaping creates a Pod with kubernetes.io/ingress-bandwidth
// and egress-bandwidth of 20M on the first Node and sends 4 MB each way
// between it and a Pod on the same Node. Each transfer must pass through
// its token bucket (the tbf on the Pod's eth0 for egress, on its host veth
// for ingress, both reporting overlimits) and take at least 0.8 s: 4 MB at
// 20 Mbit/s is 1.6 s, less the 250 KB bucket. Unshaped, it takes a few
// milliseconds. This is a lower bound on the time, which a slow machine
// only makes easier to meet.
//
// The egress limit has a backstop, the OpenFlow meter on the Pod's port:
// it drops nothing of the shaped transfer, and once the Pod deletes its
// own qdisc (as one with CAP_NET_ADMIN can), it holds the next 4 MB to
// the same lower bound and drops packets.
func TestBandwidthShaping(t *testing.T) {
	c := shared
	nsName := "bandwidth"
	nodes := c.Nodes()
	ctx := testCtx(t, 3*time.Minute)
	shaped, err := c.CreatePod(ctx, sandbox.PodSpec{Namespace: nsName, Name: "shaped", Node: nodes[0].Name, Ports: demoPorts,
		Annotations: map[string]string{"kubernetes.io/ingress-bandwidth": "20M", "kubernetes.io/egress-bandwidth": "20M"}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.DeletePod(context.Background(), nsName, "shaped") })
	peer := svcPods(t, c, nsName, "bw-peer", 0)[0]

	const size = 4 << 20
	// send dials to (namespace/pod, addr) from the other Pod and writes
	// size bytes, returning how long until the receiver had them all.
	send := func(fromNS, fromPod, toNS, toPod, toIP string) time.Duration {
		t.Helper()
		l, err := c.ListenIn(toNS, toPod, ":"+strconv.Itoa(bulkPort))
		if err != nil {
			t.Fatal(err)
		}
		defer l.Close()
		done := make(chan int64, 1)
		go func() {
			conn, err := l.Accept()
			if err != nil {
				done <- -1
				return
			}
			defer conn.Close()
			var n int64
			buf := make([]byte, 64<<10)
			for {
				m, err := conn.Read(buf)
				n += int64(m)
				if err != nil {
					break
				}
			}
			done <- n
		}()
		conn, err := c.DialFrom(testCtx(t, 10*time.Second), fromNS, fromPod, net.JoinHostPort(toIP, strconv.Itoa(bulkPort)))
		if err != nil {
			t.Fatal(err)
		}
		start := time.Now()
		_ = conn.SetDeadline(time.Now().Add(60 * time.Second))
		if _, err := conn.Write(make([]byte, size)); err != nil {
			t.Fatal(err)
		}
		_ = conn.Close()
		if n := <-done; n != size {
			t.Fatalf("receiver got %d bytes, want %d", n, size)
		}
		return time.Since(start)
	}
	// overlimits reads the root tbf of dev: in the shaped Pod, or on the
	// Node when onNode.
	overlimits := func(dev string, onNode bool) int {
		t.Helper()
		argv := []string{"tc", "-s", "qdisc", "show", "dev", dev, "root"}
		var out []byte
		var err error
		if onNode {
			out, err = c.NodeExec(testCtx(t, 10*time.Second), nodes[0].Name, argv...)
		} else {
			out, err = c.Exec(testCtx(t, 10*time.Second), nsName, "shaped", argv...)
		}
		if err != nil {
			t.Fatalf("tc: %v: %s", err, out)
		}
		if !strings.Contains(string(out), "qdisc tbf") || !strings.Contains(string(out), "rate 20Mbit") {
			t.Fatalf("%s has no 20 Mbit/s tbf:\n%s", dev, out)
		}
		m := regexp.MustCompile(`overlimits (\d+)`).FindStringSubmatch(string(out))
		if m == nil {
			t.Fatalf("no overlimits in:\n%s", out)
		}
		n, _ := strconv.Atoi(m[1])
		return n
	}
	hostVeth := hostVethOf(t, nodes[0], shaped.Status.PodIP)

	egressBefore := overlimits("eth0", false)
	if d := send(nsName, "shaped", peer.ns, peer.name, peer.ip); d < 800*time.Millisecond {
		t.Errorf("4 MB out of the shaped Pod took %v, want at least 0.8 s at 20 Mbit/s", d)
	}
	if after := overlimits("eth0", false); after <= egressBefore {
		t.Errorf("egress tbf overlimits %d → %d: the transfer did not wait for tokens", egressBefore, after)
	}
	ingressBefore := overlimits(hostVeth, true)
	if d := send(peer.ns, peer.name, nsName, "shaped", shaped.Status.PodIP); d < 800*time.Millisecond {
		t.Errorf("4 MB into the shaped Pod took %v, want at least 0.8 s at 20 Mbit/s", d)
	}
	if after := overlimits(hostVeth, true); after <= ingressBefore {
		t.Errorf("ingress tbf overlimits %d → %d: the transfer did not wait for tokens", ingressBefore, after)
	}

	// The meter: 22,000 kbps, the Pod's packets only, nothing dropped yet
	// (the switch's counters, and the daemon's metric of them).
	meterID := strings.Trim(strings.TrimSpace(ovs(t, nodes[0], "ovs-vsctl", "get", "Port", hostVeth, "external_ids:seine.io/egress-meter")), `"`)
	dropMetric := regexp.MustCompile(`(?m)^seine_pod_egress_meter_dropped_packets_total\{namespace="bandwidth",pod="shaped"\} (\d+)$`)
	meter := func() (flows, dropped int) {
		t.Helper()
		out := ovs(t, nodes[0], "ovs-ofctl", "meter-stats", brInt(nodes[0]), "meter="+meterID)
		m := regexp.MustCompile(`flow_count:(\d+) .*\n\s*0: packet_count:(\d+)`).FindStringSubmatch(out)
		if m == nil {
			t.Fatalf("no stats of meter %s:\n%s", meterID, out)
		}
		flows, _ = strconv.Atoi(m[1])
		dropped, _ = strconv.Atoi(m[2])
		metrics, err := c.NodeMetrics(testCtx(t, 10*time.Second), nodes[0].Name)
		if err != nil {
			t.Fatal(err)
		}
		if mm := dropMetric.FindStringSubmatch(metrics); mm == nil || mm[1] != m[2] {
			t.Errorf("meter %s dropped %d packets, but the daemon exports %q", meterID, dropped,
				grepLines(metrics, "seine_pod_egress_meter_dropped_packets_total"))
		}
		return flows, dropped
	}
	if out := ovs(t, nodes[0], "ovs-ofctl", "dump-meters", brInt(nodes[0]), "meter="+meterID); !strings.Contains(out, "rate=22000 ") {
		t.Fatalf("meter %s is not at 22,000 kbps:\n%s", meterID, out)
	}
	flows, dropped := meter()
	if flows != 1 || dropped != 0 {
		t.Errorf("meter %s: %d flows, %d packets dropped; want 1 flow (the Pod's Classifier flow) and no drop while the Pod's qdisc shapes", meterID, flows, dropped)
	}
	if out, err := c.Exec(testCtx(t, 10*time.Second), nsName, "shaped", "tc", "qdisc", "del", "dev", "eth0", "root"); err != nil {
		t.Fatalf("deleting the Pod's qdisc: %v: %s", err, out)
	}
	d := send(nsName, "shaped", peer.ns, peer.name, peer.ip)
	if d < 800*time.Millisecond {
		t.Errorf("4 MB out of the Pod without its qdisc took %v, want at least 0.8 s: the meter did not hold it", d)
	}
	_, after := meter()
	if after <= dropped {
		t.Errorf("meter %s dropped %d → %d packets: the unshaped transfer never exceeded it", meterID, dropped, after)
	}
	t.Logf("without its qdisc, 4 MB out of the Pod took %v; the meter dropped %d packets", d.Round(time.Millisecond), after-dropped)
}

// hostVethOf returns the name of the OVS port whose external_ids carry
// the Pod address ip on Node n.
func hostVethOf(t *testing.T, n sandbox.Node, ip string) string {
	t.Helper()
	out := strings.TrimSpace(ovs(t, n, "ovs-vsctl", "--bare", "--columns=name", "find", "Port", "external_ids:seine.io/ip="+ip))
	if out == "" || strings.Contains(out, "\n") {
		t.Fatalf("OVS port of %s on %s: %q", ip, n.Name, out)
	}
	return out
}
