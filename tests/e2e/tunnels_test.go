package e2e

import (
	"context"
	"fmt"
	"net"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/intstr"

	"github.com/seine-net/seine/datapath/csumseed"
	"github.com/seine-net/seine/node/config"
	"github.com/seine-net/seine/tests/sandbox"
	"github.com/seine-net/seine/tunnel"
)

// TestTunnelTypes restarts seine on every Node with each tunnel type and
// checks cross-Node Pod traffic over it, small and large (8 MiB: with
// userspace TSO, 64 KiB segments reach the tunnel); Pods created before
// the restart keep working (their flows are restored from OVSDB). Each
// switch also moves the Node between the two tunnel kinds of the
// userspace datapath (tunnel.Choose): VXLAN goes through a kernel VXLAN
// device and the transport interface stays the kernel's; Geneve and GRE
// through OVS's tunnel port, the transport bridge and, with userspace
// TSO, the segmentation port. It ends on the sandbox's own type.
//
// With Geneve, not the datapath's default, it also checks how a Node whose
// configuration leaves tunnelType empty chooses (checkTunnelTypeChoice)
// and that OVS's tunnel neighbor cache is filled before traffic
// (checkNeighborsFilledBeforeTraffic).
func TestTunnelTypes(t *testing.T) {
	requireMode(t, config.ModeEncap)
	c := shared
	pods := createPods(t, c, "tunnels", 0, 1, 2)
	var types []string
	for _, typ := range []string{tunnel.Geneve, tunnel.GRE, tunnel.VXLAN} {
		if typ != sandboxTunnel {
			types = append(types, typ)
		}
	}
	for _, typ := range append(types, sandboxTunnel) {
		t.Run(typ, func(t *testing.T) {
			ctx := testCtx(t, 3*time.Minute)
			// Registered first: a failure while the Nodes switch leaves
			// some of them on typ.
			t.Cleanup(func() {
				if t.Failed() && typ != sandboxTunnel {
					for _, n := range c.Nodes() {
						_ = c.StopSeine(n.Name)
						_ = c.StartSeine(context.Background(), n.Name, map[string]string{"tunnelType": sandboxTunnel})
					}
				}
			})
			for _, n := range c.Nodes() {
				stopSeine(t, c, n.Name)
				if err := c.StartSeine(ctx, n.Name, map[string]string{"tunnelType": typ}); err != nil {
					t.Fatal(err)
				}
			}
			if typ == tunnel.Geneve {
				checkTunnelTypeChoice(t, c, typ)
				checkNeighborsFilledBeforeTraffic(t, c)
			}
			wantMTU := map[string]string{"geneve": "1450", "vxlan": "1450", "gre": "1458"}[typ]
			for _, n := range c.Nodes() {
				checkTunnelKind(t, c, n, typ)
				out, err := c.NodeExec(ctx, n.Name, "cat", "/sys/class/net/seine-gw0/mtu")
				if err != nil || strings.TrimSpace(string(out)) != wantMTU {
					t.Errorf("gateway MTU on %s with %s: %q (%v), want %s", n.Name, typ, out, err, wantMTU)
				}
			}
			// Bulk between Pods created under this tunnel type: their
			// routes through the gateway carry its MTU (a Pod keeps the
			// route MTU it was created with; docs/configuration.md).
			fresh := createPods(t, c, "tunnels-"+typ, 0, 1, 2)
			l, err := c.ListenIn(fresh[0].ns, fresh[0].name, ":"+strconv.Itoa(bulkPort))
			if err != nil {
				t.Fatal(err)
			}
			defer l.Close()
			go bulkReceiver(l)
			for _, from := range fresh[1:] {
				conn, err := c.DialFrom(ctx, from.ns, from.name, net.JoinHostPort(fresh[0].ip, strconv.Itoa(bulkPort)))
				if err != nil {
					t.Fatalf("connecting from %s over %s: %v", from.node, typ, err)
				}
				if err := sendBulk(conn); err != nil {
					t.Errorf("%d bytes from %s over %s: %v", bulkSize, from.node, typ, err)
				}
			}
			// The same through a ClusterIP whose endpoint is on another
			// Node: NATed on the client's Node, its large segments leave
			// through this type's checksum seed hook (seine-tun0 with
			// VXLAN, seine-seg0 with Geneve and GRE).
			bulkThroughClusterIP(t, c, fresh[0], fresh[1], typ)
			tx0 := tunnelStat(t, c.Nodes()[0], "tx_packets")
			for _, pair := range [][2]podRef{{pods[0], pods[1]}, {pods[1], pods[2]}, {pods[2], pods[0]}} {
				expectConnected(t, probe(t, c, pair[0], pair[1].ip, tcpPort, corev1.ProtocolTCP), pair[1].name, "TCP over "+typ)
				expectConnected(t, probe(t, c, pair[0], pair[1].ip, udpPort, corev1.ProtocolUDP), pair[1].name, "UDP over "+typ)
			}
			// OVS refreshes Interface statistics every 5 s.
			eventually(t, 15*time.Second, "packets through the "+typ+" tunnel", func() error {
				if tunnelStat(t, c.Nodes()[0], "tx_packets") <= tx0 {
					return fmt.Errorf("no packets left %s through the %s tunnel", c.Nodes()[0].Name, typ)
				}
				return nil
			})
		})
	}
}

// bulkThroughClusterIP sends bulkSize bytes from client to server (which
// runs bulkReceiver on bulkPort) through a ClusterIP whose only endpoint
// is server.
func bulkThroughClusterIP(t *testing.T, c *sandbox.Cluster, server, client podRef, typ string) {
	t.Helper()
	ctx := testCtx(t, 30*time.Second)
	patch := []byte(`{"metadata":{"labels":{"bulk":"server"}}}`)
	if _, err := c.Client().CoreV1().Pods(server.ns).Patch(ctx, server.name, types.MergePatchType, patch, metav1.PatchOptions{}); err != nil {
		t.Fatal(err)
	}
	svc := createService(t, c, server.ns, "bulk", "", func(s *corev1.Service) {
		s.Spec.Selector = map[string]string{"bulk": "server"}
		s.Spec.Ports = []corev1.ServicePort{{Name: "bulk", Port: bulkPort, Protocol: corev1.ProtocolTCP,
			TargetPort: intstr.FromInt32(bulkPort)}}
	})
	addr := net.JoinHostPort(svc.Spec.ClusterIP, strconv.Itoa(bulkPort))
	var last error
	// The Service may take a moment to be programmed; a connection that
	// opened must carry every byte.
	eventually(t, 20*time.Second, "connecting through the ClusterIP", func() error {
		conn, err := c.DialFrom(testCtx(t, 3*time.Second), client.ns, client.name, addr)
		if err != nil {
			return err
		}
		last = sendBulk(conn)
		return nil
	})
	if last != nil {
		t.Errorf("%d bytes from %s through ClusterIP %s over %s: %v", bulkSize, client.node, addr, typ, last)
	}
}

// checkTunnelTypeChoice restarts the first Node with tunnelType empty
// while every Node runs typ, which is not the datapath's default, three
// times, taking away one source of tunnel.PickType each time: it keeps typ
// from its tunnel port; with the port deleted, from its AgentInfo; with
// the AgentInfo deleted too (a Node joining), from its peers. The daemon's
// log names the source, and its Pods reach the other Nodes' after each.
func checkTunnelTypeChoice(t *testing.T, c *sandbox.Cluster, typ string) {
	t.Helper()
	ctx := testCtx(t, 2*time.Minute)
	ops, _ := opsClients(t, c)
	n0 := c.Nodes()[0]
	pods := createPods(t, c, "tnl-choice", 0, 1, 2)
	// Every AgentInfo reports typ first: a daemon writes it after its CNI
	// socket serves, the moment StartSeine returns.
	eventually(t, 30*time.Second, "every AgentInfo reporting "+typ, func() error {
		l, err := ops.OpsV1alpha1().AgentInfos().List(ctx, metav1.ListOptions{})
		if err != nil {
			return err
		}
		for _, a := range l.Items {
			if a.Status.TunnelType != typ {
				return fmt.Errorf("%s reports %q", a.Name, a.Status.TunnelType)
			}
		}
		return nil
	})
	for _, step := range []struct {
		from                 tunnel.TypeSource
		dropPort, dropReport bool
	}{
		{tunnel.FromBridge, false, false},
		{tunnel.FromAgentInfo, true, false},
		{tunnel.FromPeers, true, true},
	} {
		stopSeine(t, c, n0.Name)
		if step.dropPort {
			ovs(t, n0, "ovs-vsctl", "--if-exists", "del-port", "br-int", "seine-tun0")
		}
		if step.dropReport {
			if err := ops.OpsV1alpha1().AgentInfos().Delete(ctx, n0.Name, metav1.DeleteOptions{}); err != nil {
				t.Fatalf("deleting the AgentInfo of %s: %v", n0.Name, err)
			}
		}
		if err := c.StartSeine(ctx, n0.Name, nil); err != nil {
			t.Fatal(err)
		}
		if got := lastLogLine(t, n0.LogPath, "tunnel type chosen"); !strings.Contains(got, `"tunnel_type": "`+typ+`"`) ||
			!strings.Contains(got, `"tunnel_type_source": "`+string(step.from)+`"`) {
			t.Errorf("%s, tunnelType empty, %+v: chose %s", n0.Name, step, got)
		}
		checkTunnelKind(t, c, n0, typ)
		for _, to := range pods[1:] {
			expectConnected(t, probe(t, c, pods[0], to.ip, tcpPort, corev1.ProtocolTCP), to.name,
				fmt.Sprintf("TCP from %s after a restart with tunnelType empty (%s)", n0.Name, step.from))
		}
	}
}

// lastLogLine returns the last line of the log at path that contains
// what.
func lastLogLine(t *testing.T, path, what string) string {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(string(b), "\n")
	for i := len(lines) - 1; i >= 0; i-- {
		if strings.Contains(lines[i], what) {
			return lines[i]
		}
	}
	t.Fatalf("no line with %q in %s", what, path)
	return ""
}

// checkNeighborsFilledBeforeTraffic empties a Node's OVS tunnel neighbor
// cache and kernel neighbor table, restarts its seine, and checks that the
// cache holds every peer Node before any Pod sends a packet, and that the
// first connection from a Pod there to each peer gets through on its first
// SYN. OVS's userspace tunnelling (Geneve, GRE) drops a packet whose outer
// next hop it has not resolved yet; before seine filled the cache, the
// first connection between two Nodes lost its SYN.
func checkNeighborsFilledBeforeTraffic(t *testing.T, c *sandbox.Cluster) {
	t.Helper()
	nodes := c.Nodes()
	pods := createPods(t, c, "tnl-neigh", 0, 1, 2)
	ctx := testCtx(t, 2*time.Minute)
	n0 := nodes[0]
	stopSeine(t, c, n0.Name)
	restarted := false
	t.Cleanup(func() {
		if !restarted { // the Pods' deletion needs the daemon
			_ = c.StartSeine(context.Background(), n0.Name, nil)
		}
	})
	// OVS also learns neighbours from the ARP packets crossing br-phy, and
	// peers that restarted just before (an earlier test) may still be
	// resolving this Node: flush until the cache stays empty.
	eventually(t, 15*time.Second, "an empty tunnel neighbor cache on "+n0.Name, func() error {
		ovs(t, n0, "ovs-appctl", "tnl/neigh/flush")
		if out, err := c.NodeExec(ctx, n0.Name, "ip", "neigh", "flush", "dev", "br-phy"); err != nil {
			return fmt.Errorf("flushing the kernel's neighbors: %v: %s", err, out)
		}
		if out := ovs(t, n0, "ovs-appctl", "tnl/neigh/show"); strings.Contains(out, nodes[1].IP) || strings.Contains(out, nodes[2].IP) {
			return fmt.Errorf("cache not empty after the flush:\n%s", out)
		}
		return nil
	})
	if err := c.StartSeine(ctx, n0.Name, nil); err != nil {
		t.Fatal(err)
	}
	restarted = true
	eventually(t, 10*time.Second, "peers in the tunnel neighbor cache of "+n0.Name, func() error {
		out := ovs(t, n0, "ovs-appctl", "tnl/neigh/show")
		for _, peer := range nodes[1:] {
			if !strings.Contains(out, peer.IP+" ") {
				return fmt.Errorf("%s (%s) missing:\n%s", peer.Name, peer.IP, out)
			}
		}
		return nil
	})
	// The cached MAC is the peer's: its transport bridge took the MAC of
	// the physical interface, which the peer's neighbours knew before
	// seine started.
	cache := ovs(t, n0, "ovs-appctl", "tnl/neigh/show")
	for _, peer := range nodes {
		phy, br := linkMAC(t, c, peer.Name, "eth0"), linkMAC(t, c, peer.Name, "br-phy")
		if phy != br {
			t.Errorf("%s: br-phy has MAC %s, its transport interface eth0 %s", peer.Name, br, phy)
		}
		if peer.Name == n0.Name {
			continue
		}
		for _, line := range strings.Split(cache, "\n") {
			if f := strings.Fields(line); len(f) >= 2 && f[0] == peer.IP && f[1] != br {
				t.Errorf("%s caches %s (%s) at %s, but its MAC is %s", n0.Name, peer.Name, peer.IP, f[1], br)
			}
		}
	}
	for _, dst := range pods[1:] {
		// Shorter than TCP's 1 s initial retransmission timeout: only the
		// first SYN can succeed.
		r := c.Probe(ctx, pods[0].ns, pods[0].name, dst.ip, tcpPort, corev1.ProtocolTCP, 500*time.Millisecond)
		expectConnected(t, r, dst.name, "first connection from "+n0.Name+" to "+dst.node)
	}
}

// linkMAC returns the MAC of a network device of a Node.
func linkMAC(t *testing.T, c *sandbox.Cluster, node, dev string) string {
	t.Helper()
	out, err := c.NodeExec(testCtx(t, 10*time.Second), node, "cat", "/sys/class/net/"+dev+"/address")
	if err != nil {
		t.Fatalf("MAC of %s on %s: %v: %s", dev, node, err, out)
	}
	return strings.TrimSpace(string(out))
}

// checkTunnelKind checks how Node n carries the tunnel type typ with the
// userspace datapath: VXLAN as a kernel VXLAN device attached as an
// ordinary port, with a forwarding entry per peer and no transport bridge
// (the Node IP stays on eth0); Geneve and GRE as OVS's tunnel port through
// the transport bridge, with the segmentation port on the integration
// bridge and its veth peer off it (the peer hairpins in the kernel; the
// sandbox runs ovs-vswitchd with userspace TSO). With VXLAN and the
// checksum seed program (this mode's natChecksum) nothing passes through
// the pair, so it is gone, also after a Geneve or GRE run made it.
func checkTunnelKind(t *testing.T, c *sandbox.Cluster, n sandbox.Node, typ string) {
	t.Helper()
	ctx := testCtx(t, 10*time.Second)
	got := strings.TrimSpace(ovs(t, n, "ovs-vsctl", "get", "Interface", "seine-tun0", "type"))
	ports := ovs(t, n, "ovs-vsctl", "list-ports", "br-int")
	_, phyErr := tryOVS(n, "ovs-vsctl", "br-exists", "br-phy")
	addrs, err := c.NodeExec(ctx, n.Name, "ip", "-4", "-o", "addr", "show", "dev", "eth0")
	if err != nil {
		t.Fatal(err)
	}
	onEth0 := strings.Contains(string(addrs), n.IP+"/")
	// Partial checksums are rewritten where packets leave (the default
	// natChecksum): at the gateway's ingress and at the egress of the
	// device the tunnel's packets leave through first.
	leaving := map[bool]string{true: "seine-tun0", false: "seine-seg0"}[typ == "vxlan"]
	for _, hook := range [][2]string{{"seine-gw0", "ingress"}, {leaving, "egress"}} {
		out, err := c.NodeExec(ctx, n.Name, "tc", "filter", "show", "dev", hook[0], hook[1])
		if err != nil || !strings.Contains(string(out), csumseed.ProgramName) {
			t.Errorf("%s with %s: no checksum seed filter on %s %s (%v):\n%s", n.Name, typ, hook[0], hook[1], err, out)
		}
	}
	if typ == "vxlan" {
		dev, err := c.NodeExec(ctx, n.Name, "ip", "-d", "link", "show", "seine-tun0")
		if got != `""` || err != nil || !strings.Contains(string(dev), "vxlan id 0 ") {
			t.Fatalf("%s: seine-tun0 has OVS type %s and is %q (%v), want a kernel VXLAN device as a system port", n.Name, got, dev, err)
		}
		fdb, _ := c.NodeExec(ctx, n.Name, "bridge", "fdb", "show", "dev", "seine-tun0")
		for _, peer := range c.Nodes() {
			if peer.Name != n.Name && !strings.Contains(string(fdb), "dst "+peer.IP+" ") {
				t.Errorf("%s: no forwarding entry for peer %s:\n%s", n.Name, peer.IP, fdb)
			}
		}
		if phyErr == nil || !onEth0 {
			t.Errorf("%s with vxlan: br-phy exists %v, Node IP on eth0 %v, ports %q", n.Name, phyErr == nil, onEth0, ports)
		}
		if _, err := c.NodeExec(ctx, n.Name, "ip", "link", "show", "seine-seg0"); err == nil || strings.Contains(ports, "seine-seg0") {
			t.Errorf("%s with vxlan: the idle segmentation pair is left (device exists %v), br-int ports %q", n.Name, err == nil, ports)
		}
		return
	}
	if got != typ {
		t.Fatalf("tunnel port type on %s is %s, want %s", n.Name, got, typ)
	}
	if phyErr != nil || onEth0 || !strings.Contains(ports, "seine-seg0") || strings.Contains(ports, "seine-seg1") {
		t.Errorf("%s with %s: br-phy exists %v, Node IP on eth0 %v, br-int ports %q", n.Name, typ, phyErr == nil, onEth0, ports)
	}
	if _, err := c.NodeExec(ctx, n.Name, "ip", "link", "show", "seine-tun0"); err == nil {
		t.Errorf("%s with %s: a kernel device seine-tun0 is left", n.Name, typ)
	}
}
