package e2e

import (
	"context"
	"fmt"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/containernetworking/cni/pkg/types"
	current "github.com/containernetworking/cni/pkg/types/100"
	corev1 "k8s.io/api/core/v1"

	"github.com/seine-net/seine/node/config"
	"github.com/seine-net/seine/tests/sandbox"
)

// peersAcrossSubnets returns Pods on Node 1 and Node 2 (same transport
// subnet) and Node 3 (the other one), and fails the test unless the
// sandbox has that layout.
func peersAcrossSubnets(t *testing.T, c *sandbox.Cluster, ns string) (n1, n2, n3 podRef) {
	t.Helper()
	nodes := c.Nodes()
	if len(nodes) < 3 || nodes[0].Subnet != nodes[1].Subnet || nodes[0].Subnet == nodes[2].Subnet {
		t.Fatalf("want Nodes 1 and 2 in one transport subnet and Node 3 in another (SEINE_E2E_SUBNETS=2), have %+v", nodes)
	}
	pods := createPods(t, c, ns, 0, 1, 2)
	return pods[0], pods[1], pods[2]
}

// capture runs probes while tcpdump listens on the underlay side of a
// Node's transport link, and returns what it saw.
func capture(t *testing.T, c *sandbox.Cluster, node, filter string, probes func()) []string {
	t.Helper()
	cp, err := c.CaptureUnderlay(testCtx(t, 20*time.Second), node, filter)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cp.Stop() })
	probes()
	time.Sleep(200 * time.Millisecond) // the last packets through the capture (--immediate-mode)
	return cp.Stop()
}

// probeBoth connects over TCP and UDP, ten times each.
func probeBoth(t *testing.T, c *sandbox.Cluster, from, to podRef) {
	t.Helper()
	for i := 0; i < 10; i++ {
		expectConnected(t, probe(t, c, from, to.ip, tcpPort, corev1.ProtocolTCP), to.name, "TCP "+from.node+" to "+to.node)
		expectConnected(t, probe(t, c, from, to.ip, udpPort, corev1.ProtocolUDP), to.name, "UDP "+from.node+" to "+to.node)
	}
}

// outer returns the source and destination (address.port) of the outer
// IPv4 header of a tcpdump -nn line ("12:00:00.000000 IP a.p > b.q: ..."),
// not of a packet tcpdump decodes inside a tunnel header further on.
func outer(l string) (src, dst string) {
	f := strings.Fields(l)
	if len(f) < 5 || f[1] != "IP" || f[3] != ">" {
		return "", ""
	}
	return f[2], strings.TrimSuffix(f[4], ":")
}

// countOuter counts the lines whose outer source starts with srcPrefix and
// destination with dstPrefix.
func countOuter(lines []string, srcPrefix, dstPrefix string) int {
	n := 0
	for _, l := range lines {
		if src, dst := outer(l); src != "" && strings.HasPrefix(src, srcPrefix) && strings.HasPrefix(dst, dstPrefix) {
			n++
		}
	}
	return n
}

// TestModeHybridUnderlay captures Node 1's packets on the underlay: its
// Pod's traffic to the Pod on Node 2 (same subnet) is plain, Pod IP to Pod
// IP, with no tunnel at all; to the Pod on Node 3 (other subnet) it is
// the sandbox's tunnel (VXLAN, UDP 4789) between the Node IPs, and no Pod
// IP shows in the clear.
func TestModeHybridUnderlay(t *testing.T) {
	requireMode(t, config.ModeHybrid)
	c := shared
	p1, p2, p3 := peersAcrossSubnets(t, c, "hybrid-cap")
	n1, n2, n3 := c.Nodes()[0], c.Nodes()[1], c.Nodes()[2]

	// Each probe sends at least one packet (UDP) or three (TCP) from
	// Node 1: 40 for the ten of each.
	same := capture(t, c, n1.Name, "", func() { probeBoth(t, c, p1, p2) })
	if got := countOuter(same, p1.ip+".", p2.ip+"."); got < 40 {
		t.Errorf("same subnet: %d packets %s -> %s in the clear, want at least 40:\n%s", got, p1.ip, p2.ip, strings.Join(same, "\n"))
	}
	port := tunnelUDPPort(sandboxTunnel)
	if got := countOuter(same, "", n2.IP+"."+port); got != 0 {
		t.Errorf("same subnet: %d %s packets:\n%s", got, sandboxTunnel, strings.Join(same, "\n"))
	}
	cross := capture(t, c, n1.Name, "", func() { probeBoth(t, c, p1, p3) })
	if got := countOuter(cross, n1.IP+".", n3.IP+"."+port); got < 40 {
		t.Errorf("other subnet: %d %s packets %s -> %s:%s, want at least 40:\n%s", got, sandboxTunnel, n1.IP, n3.IP, port, strings.Join(cross, "\n"))
	}
	if got := countOuter(cross, p1.ip+".", ""); got != 0 {
		t.Errorf("other subnet: %d packets with the Pod IP in the clear:\n%s", got, strings.Join(cross, "\n"))
	}
	// The routes behind it, on Node 1.
	ctx := testCtx(t, 10*time.Second)
	out, err := c.NodeExec(ctx, n1.Name, "ip", "route", "show", "proto", "95")
	if err != nil {
		t.Fatal(err)
	}
	routes := string(out)
	if !strings.Contains(routes, nodePodCIDR(t, c, n2.Name)+" via "+n2.IP+" ") ||
		!strings.Contains(routes, nodePodCIDR(t, c, n3.Name)+" via "+FirstIPOf(t, nodePodCIDR(t, c, n3.Name))+" dev seine-gw0") {
		t.Errorf("routes of %s: want %s direct and %s through the tunnel:\n%s", n1.Name, n2.Name, n3.Name, routes)
	}
}

// FirstIPOf is the first host address of a CIDR (a Node's gateway IP).
func FirstIPOf(t *testing.T, cidr string) string {
	t.Helper()
	_, n, err := net.ParseCIDR(cidr)
	if err != nil {
		t.Fatal(err)
	}
	ip := n.IP.To4()
	return net.IPv4(ip[0], ip[1], ip[2], ip[3]+1).String()
}

// TestModeNoEncapUnderlay: the router has a static route to every Node's
// podCIDR via its Node (standing for a cloud route controller); no Node
// has a tunnel port or a transport bridge; Pods talk across Nodes in both
// subnets and not one tunnel packet (Geneve 6081, VXLAN 4789, GRE) shows on
// the underlay, the Pod IPs do.
func TestModeNoEncapUnderlay(t *testing.T) {
	requireMode(t, config.ModeNoEncap)
	c := shared
	ctx := testCtx(t, 20*time.Second)
	out, err := c.UnderlayExec(ctx, "ip", "route", "show")
	if err != nil {
		t.Fatal(err)
	}
	for _, n := range c.Nodes() {
		if want := nodePodCIDR(t, c, n.Name) + " via " + n.IP + " "; !strings.Contains(string(out), want) {
			t.Errorf("the router has no %q:\n%s", want, out)
		}
		if ports := ovs(t, n, "ovs-vsctl", "list-ports", "br-int"); strings.Contains(ports, "seine-tun0") {
			t.Errorf("%s has a tunnel port:\n%s", n.Name, ports)
		}
		if brs := ovs(t, n, "ovs-vsctl", "list-br"); strings.TrimSpace(brs) != "br-int" {
			t.Errorf("%s has bridges %q, want br-int only", n.Name, brs)
		}
	}
	p1, p2, p3 := peersAcrossSubnets(t, c, "noencap-cap")
	tunnelled := "udp port 6081 or udp port 4789 or ip proto 47"
	var seen []string
	var podPackets int
	for _, n := range c.Nodes() {
		lines := capture(t, c, n.Name, "", func() {
			switch n.Name {
			case p1.node:
				probeBoth(t, c, p1, p2)
				probeBoth(t, c, p1, p3)
			case p3.node:
				probeBoth(t, c, p3, p2)
			}
		})
		for _, l := range lines {
			_, dst := outer(l)
			if strings.HasSuffix(dst, ".6081") || strings.HasSuffix(dst, ".4789") || strings.Contains(l, "GRE") {
				seen = append(seen, n.Name+": "+l)
			}
		}
		podPackets += countOuter(lines, "10.244.", "10.244.")
	}
	if len(seen) > 0 {
		t.Errorf("tunnel packets (%s) on the underlay:\n%s", tunnelled, strings.Join(seen, "\n"))
	}
	// 40 packets at least for each of the three Pod pairs (probeBoth).
	if podPackets < 120 {
		t.Errorf("%d packets between Pod IPs on the underlay, want at least 120", podPackets)
	}
}

// TestModeNoSNAT: with SNAT the external host sees the Node IP of a Pod's
// connection; restarted with noSNAT, the same Node leaves the Pod IP, and
// the external host still answers (the router routes Pod addresses).
func TestModeNoSNAT(t *testing.T) {
	requireMode(t, config.ModeNoEncap, config.ModeHybrid)
	c := shared
	pods := createPods(t, c, "nosnat", 2)
	node := c.Nodes()[2]
	extNS, extIP := c.ExternalHost()
	srv, err := c.Serve(extNS, "external", []sandbox.Port{{Port: 7070, Protocol: corev1.ProtocolTCP}, {Port: 7070, Protocol: corev1.ProtocolUDP}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(srv.Close)
	check := func(want string) {
		t.Helper()
		for _, proto := range []corev1.Protocol{corev1.ProtocolTCP, corev1.ProtocolUDP} {
			r := probe(t, c, pods[0], extIP, 7070, proto)
			expectConnected(t, r, "external", "Pod to external over "+string(proto))
			if host, _, _ := net.SplitHostPort(r.Client); host != want {
				t.Errorf("external host saw the %s connection from %q, want %s", proto, r.Client, want)
			}
		}
	}
	restart := func(set map[string]string) {
		t.Helper()
		stopSeine(t, c, node.Name)
		if err := c.StartSeine(testCtx(t, time.Minute), node.Name, set); err != nil {
			t.Fatal(err)
		}
	}
	check(node.IP)
	t.Cleanup(func() { restart(nil) })
	restart(map[string]string{"noSNAT": "true"})
	if _, snat, err := c.DaemonMode(testCtx(t, 10*time.Second), node.Name); err != nil || snat {
		t.Fatalf("after the restart with noSNAT: snat %v, %v", snat, err)
	}
	check(pods[0].ip)
	restart(nil)
	check(node.IP)
}

// TestModePolicyOnlyChain checks the networkPolicyOnly setup around a
// Pod: the installed conflist runs ptp then seine; the Pod's host veth is
// a port of br-int and its host route points at seine-gw0; CHECK passes;
// the bridge routes Pod to Pod with one TTL hop as the host did; and the
// primary rewriting its conflist gets seine chained again.
func TestModePolicyOnlyChain(t *testing.T) {
	requireMode(t, config.ModeNetworkPolicyOnly)
	c := shared
	n := c.Nodes()[0]
	pods := createPods(t, c, "chain", 0, 0, 1)
	ctx := testCtx(t, time.Minute)
	conflist := c.InstalledConflist(n)
	cc, err := c.CNI(n.Name, nil)
	if err != nil {
		t.Fatal(err)
	}
	var types []string
	for _, p := range cc.List.Plugins {
		types = append(types, p.Network.Type)
	}
	if got := strings.Join(types, ","); got != "ptp,seine,portmap" {
		t.Fatalf("%s runs %s, want ptp,seine,portmap", conflist, got)
	}
	port := portOfPod(t, n, "chain", pods[0].name)
	if port == "" {
		t.Fatal("the Pod's host veth is not a port of br-int")
	}
	out, err := c.NodeExec(ctx, n.Name, "ip", "route", "get", pods[0].ip)
	if err != nil || !strings.Contains(string(out), "dev seine-gw0") || !strings.Contains(string(out), "src "+n.IP) {
		t.Errorf("route to the Pod: %s (%v), want via seine-gw0 from %s", out, err, n.IP)
	}
	if out, err := c.NodeExec(ctx, n.Name, "ip", "-4", "addr", "show", "dev", "seine-gw0"); err != nil || strings.Contains(string(out), "inet ") {
		t.Errorf("seine-gw0 has an address in networkPolicyOnly mode: %s (%v)", out, err)
	}
	// One TTL hop between Pods of a Node, as through the host.
	out, err = c.Exec(ctx, "chain", pods[0].name, "ping", "-c", "1", "-W", "3", pods[1].ip)
	if err != nil || !strings.Contains(string(out), "ttl=63") {
		t.Errorf("ping to a Pod on the same Node: %v\n%s\nwant ttl=63", err, out)
	}
	// The primary rewrites its conflist without seine.
	primary, err := sandbox.PrimaryConflist(nodePodCIDR(t, c, n.Name), n)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.NodeExec(ctx, n.Name, "sh", "-c", fmt.Sprintf("cat > %s.new <<'EOF'\n%sEOF\nmv %s.new %s", conflist, primary, conflist, conflist)); err != nil {
		t.Fatal(err)
	}
	eventually(t, 10*time.Second, "seine chained again", func() error {
		cc, err := c.CNI(n.Name, nil)
		if err != nil {
			return err
		}
		if len(cc.List.Plugins) < 2 || cc.List.Plugins[1].Network.Type != "seine" {
			return fmt.Errorf("plugins %d, second %v", len(cc.List.Plugins), cc.List.Plugins)
		}
		return nil
	})
	// A new Pod after the rewrite is attached, and talks.
	more := createPods(t, c, "chain2", 0)
	if portOfPod(t, n, "chain2", more[0].name) == "" {
		t.Error("a Pod created after the primary's rewrite is not attached")
	}
	expectConnected(t, probe(t, c, more[0], pods[2].ip, tcpPort, corev1.ProtocolTCP), pods[2].name, "new Pod to a Pod on another Node")
}

// TestModePolicyOnlyUnchained: an attachment made through ptp alone (seine
// removed from the chain) is plain ptp: no OVS port, the host route on the
// veth, and it reaches Pods on its Node and others and the external host;
// and a chained attachment whose seine part is deleted (CNI DEL of seine
// alone) goes back to exactly that, still connected, and CHECK of the
// chain fails until seine attaches it again.
func TestModePolicyOnlyUnchained(t *testing.T) {
	requireMode(t, config.ModeNetworkPolicyOnly)
	c := shared
	n := c.Nodes()[0]
	ctx := testCtx(t, 2*time.Minute)
	targets := createPods(t, c, "unchained", 0, 1)
	extNS, extIP := c.ExternalHost()
	srv, err := c.Serve(extNS, "external", []sandbox.Port{{Port: 7071, Protocol: corev1.ProtocolTCP}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(srv.Close)

	primary, err := sandbox.PrimaryConflist(nodePodCIDR(t, c, n.Name), n)
	if err != nil {
		t.Fatal(err)
	}
	plain := newCNIEnv(t, c, n, primary)
	chained := newCNIEnv(t, c, n, nil)
	netns := newPodNS(t, "seine-e2e-unch1")
	res, err := plain.add(ctx, plain.rt("unchained-1", netns))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = plain.del(context.Background(), plain.rt("unchained-1", netns)) })
	ip := resultIP(t, res)
	checkPlain := func(what string) {
		t.Helper()
		out, err := c.NodeExec(ctx, n.Name, "ip", "route", "get", ip)
		if err != nil || strings.Contains(string(out), "seine-gw0") {
			t.Errorf("%s: route to %s: %s (%v), want the veth", what, ip, out, err)
		}
		if ports := ovs(t, n, "ovs-vsctl", "--columns=name", "--bare", "find", "Port", "external_ids:seine.io/ip="+ip); strings.TrimSpace(ports) != "" {
			t.Errorf("%s: %s has an OVS port %s", what, ip, ports)
		}
		for _, to := range targets {
			r := c.ProbeFrom(ctx, netnsName(netns), to.ip, tcpPort, corev1.ProtocolTCP, 3*time.Second)
			expectConnected(t, r, to.name, what+": to "+to.name+" on "+to.node)
		}
		r := c.ProbeFrom(ctx, netnsName(netns), extIP, 7071, corev1.ProtocolTCP, 3*time.Second)
		expectConnected(t, r, "external", what+": to the external host")
	}
	checkPlain("ptp alone")
	if err := plain.del(ctx, plain.rt("unchained-1", netns)); err != nil {
		t.Fatal(err)
	}

	// Through the chain, then seine's part deleted alone.
	netns2 := newPodNS(t, "seine-e2e-unch2")
	rt := chained.rt("unchained-2", netns2)
	res, err = chained.add(ctx, rt)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = chained.del(context.Background(), rt) })
	ip = resultIP(t, res)
	if err := chained.Check(ctx, rt); err != nil {
		t.Errorf("CHECK of a chained attachment: %v", err)
	}
	if out, _ := c.NodeExec(ctx, n.Name, "ip", "route", "get", ip); !strings.Contains(string(out), "seine-gw0") {
		t.Errorf("chained: route to %s does not use seine-gw0: %s", ip, out)
	}
	seineOnly := newCNIEnv(t, c, n, []byte(fmt.Sprintf(`{"cniVersion":"1.0.0","name":"sandbox-routed","plugins":[{"type":"seine","socketPath":%q}]}`, n.CNISocket)))
	if err := seineOnly.del(ctx, seineOnly.rt("unchained-2", netns2)); err != nil {
		t.Fatal(err)
	}
	func() {
		out, err := c.NodeExec(ctx, n.Name, "ip", "route", "get", ip)
		if err != nil || strings.Contains(string(out), "seine-gw0") {
			t.Errorf("after seine's DEL: route to %s: %s (%v), want the veth", ip, out, err)
		}
		if ports := ovs(t, n, "ovs-vsctl", "--columns=name", "--bare", "find", "Port", "external_ids:seine.io/ip="+ip); strings.TrimSpace(ports) != "" {
			t.Errorf("after seine's DEL: %s still has an OVS port %s", ip, ports)
		}
		for _, to := range targets {
			r := c.ProbeFrom(ctx, netnsName(netns2), to.ip, tcpPort, corev1.ProtocolTCP, 3*time.Second)
			expectConnected(t, r, to.name, "after seine's DEL: to "+to.name)
		}
	}()
	if err := chained.Check(ctx, rt); err == nil {
		t.Error("CHECK of the chain passed with seine's part gone")
	}
}

// resultIP is the IPv4 address of a CNI ADD result.
func resultIP(t *testing.T, res types.Result) string {
	t.Helper()
	r, err := current.NewResultFromResult(res)
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range r.IPs {
		if c.Address.IP.To4() != nil {
			return c.Address.IP.String()
		}
	}
	t.Fatalf("no IPv4 address in %+v", r)
	return ""
}

// netnsName is the name of a namespace from its /run/netns path.
func netnsName(path string) string { return path[strings.LastIndex(path, "/")+1:] }
