package e2e

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"

	"github.com/seine-net/seine/node/config"
	"github.com/seine-net/seine/tests/sandbox"
)

// TestTunnelTypes restarts seine on every Node with each tunnel type and
// checks cross-Node Pod traffic over it; Pods created before the restart
// keep working (their flows are restored from OVSDB). It ends on geneve.
func TestTunnelTypes(t *testing.T) {
	requireMode(t, config.ModeEncap)
	c := shared
	pods := createPods(t, c, "tunnels", 0, 1, 2)
	for _, typ := range []string{"vxlan", "gre", "geneve"} {
		t.Run(typ, func(t *testing.T) {
			ctx := testCtx(t, 3*time.Minute)
			for _, n := range c.Nodes() {
				if err := c.StopSeine(n.Name); err != nil {
					t.Fatal(err)
				}
				if err := c.StartSeine(ctx, n.Name, map[string]string{"tunnelType": typ}); err != nil {
					t.Fatal(err)
				}
			}
			t.Cleanup(func() {
				if t.Failed() && typ != "geneve" {
					for _, n := range c.Nodes() {
						_ = c.StopSeine(n.Name)
						_ = c.StartSeine(context.Background(), n.Name, nil)
					}
				}
			})
			wantMTU := map[string]string{"geneve": "1450", "vxlan": "1450", "gre": "1458"}[typ]
			for _, n := range c.Nodes() {
				if got := strings.TrimSpace(ovs(t, n, "ovs-vsctl", "get", "Interface", "seine-tun0", "type")); got != typ {
					t.Fatalf("tunnel port type on %s is %s, want %s", n.Name, got, typ)
				}
				out, err := c.NodeExec(ctx, n.Name, "cat", "/sys/class/net/seine-gw0/mtu")
				if err != nil || strings.TrimSpace(string(out)) != wantMTU {
					t.Errorf("gateway MTU on %s with %s: %q (%v), want %s", n.Name, typ, out, err, wantMTU)
				}
			}
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

// TestTunnelNeighborsFilledBeforeTraffic empties a Node's OVS tunnel
// neighbor cache and kernel neighbor table, restarts its seine, and checks
// that the cache holds every peer Node before any Pod sends a packet, and
// that the first connection from a Pod there to each peer gets through on
// its first SYN. OVS's userspace tunnelling drops a packet whose outer
// next hop it has not resolved yet; before seine filled the cache, the
// first connection between two Nodes lost its SYN.
func TestTunnelNeighborsFilledBeforeTraffic(t *testing.T) {
	requireMode(t, config.ModeEncap)
	c := shared
	nodes := c.Nodes()
	pods := createPods(t, c, "tnl-neigh", 0, 1, 2)
	ctx := testCtx(t, 2*time.Minute)
	n0 := nodes[0]
	if err := c.StopSeine(n0.Name); err != nil {
		t.Fatal(err)
	}
	ovs(t, n0, "ovs-appctl", "tnl/neigh/flush")
	if out, err := c.NodeExec(ctx, n0.Name, "ip", "neigh", "flush", "dev", "br-phy"); err != nil {
		t.Fatalf("flushing the kernel's neighbors: %v: %s", err, out)
	}
	if out := ovs(t, n0, "ovs-appctl", "tnl/neigh/show"); strings.Contains(out, nodes[1].IP) || strings.Contains(out, nodes[2].IP) {
		t.Fatalf("cache not empty after the flush:\n%s", out)
	}
	if err := c.StartSeine(ctx, n0.Name, nil); err != nil {
		t.Fatal(err)
	}
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
