package pipeline_test

import (
	"net"
	"regexp"
	"strings"
	"testing"

	of "github.com/seine-net/seine/datapath/openflow"
	"github.com/seine-net/seine/datapath/ovstest"
	"github.com/seine-net/seine/datapath/pipeline"
)

// modeBridge is an OVS bridge with a gateway (ofport 2), two Pod ports (3,
// 4) and, when tunnel, a flow-based Geneve port (1), loaded with flows.
type modeBridge struct {
	o *ovstest.OVS
}

func newModeBridge(t *testing.T, tunnel bool, flows []of.Flow, groups []of.GroupEntry) *modeBridge {
	t.Helper()
	var ports []testPort
	if tunnel {
		ports = append(ports, geneveTun0)
	}
	o, c, ctx := testBridge(t, append(ports, gw0, podPort("p1", 3), podPort("p2", 4))...)
	for _, g := range groups {
		if err := c.ApplyGroups(ctx, []of.GroupMod{{Op: of.GroupOpAdd, Group: g}}); err != nil {
			t.Fatal(err)
		}
	}
	addFlows(ctx, t, c, flows)
	return &modeBridge{o: o}
}

// trace runs ofproto/trace, resuming each conntrack recirculation with the
// given states.
func (m *modeBridge) trace(flow string, ct ...string) string {
	args := []string{"ofproto/trace", "br-int", flow}
	for _, s := range ct {
		args = append(args, "--ct-next", s)
	}
	return m.o.Run("ovs-appctl", args...)
}

// outputs reports whether the OpenFlow part of a trace outputs to port.
func outputs(trace, port string) bool {
	return regexp.MustCompile(`(output:|output port is |Datapath actions: .*\b)` + port + `\b`).MatchString(trace)
}

var (
	modeGwMAC = mustMAC("0a:00:00:00:00:01")
	modeP1    = pipeline.Pod{OFPort: 3, IP: net.ParseIP("10.244.1.5"), MAC: mustMAC("0a:00:00:00:01:05")}
	modeP2    = pipeline.Pod{OFPort: 4, IP: net.ParseIP("10.244.1.6"), MAC: mustMAC("0a:00:00:00:01:06")}
	// routedPeer is reached through the host (same transport subnet, or
	// the underlay routes its podCIDR); tunnelPeer through Geneve.
	routedPeer = pipeline.PeerNode{ID: 8, PodCIDR: mustCIDR("10.244.2.0/24"), NodeIP: net.ParseIP("198.18.0.12"),
		GatewayIP: net.ParseIP("10.244.2.1")}
	tunnelPeer = pipeline.PeerNode{ID: 9, PodCIDR: mustCIDR("10.244.3.0/24"), NodeIP: net.ParseIP("198.18.1.13"),
		GatewayIP: net.ParseIP("10.244.3.1")}
)

const fromP1 = "in_port=3,dl_src=0a:00:00:00:01:05,dl_dst=0a:00:00:00:00:01,ip,nw_ttl=64,nw_src=10.244.1.5,"

// TestHybridPeers: a hybrid Node tunnels to one peer and routes to the
// other through the gateway (the host routes it to the peer's Node IP);
// a noEncap Node, with no tunnel port, routes to both.
func TestHybridPeers(t *testing.T) {
	for _, tc := range []struct {
		name   string
		tunnel bool
	}{{"hybrid", true}, {"noEncap", false}} {
		t.Run(tc.name, func(t *testing.T) {
			br := pipeline.Bridge{Round: 1, GatewayPort: 2, GatewayMAC: modeGwMAC, GatewayIP: net.ParseIP("10.244.1.1"),
				PodCIDR: mustCIDR("10.244.1.0/24"), NodeIP: net.ParseIP("198.18.0.11")}
			if tc.tunnel {
				br.TunnelPort = 1
			}
			flows := append(pipeline.BaseFlows(br), pipeline.PodFlows(br, modeP1)...)
			flows = append(flows, pipeline.RoutedPeerNodeFlows(br, routedPeer)...)
			if tc.tunnel {
				flows = append(flows, pipeline.PeerNodeFlows(br, tunnelPeer)...)
			} else {
				flows = append(flows, pipeline.RoutedPeerNodeFlows(br, tunnelPeer)...)
			}
			m := newModeBridge(t, tc.tunnel, flows, nil)
			out := m.trace(fromP1 + "nw_dst=10.244.2.7")
			if !outputs(out, "2") || strings.Contains(out, "tun_dst") || strings.Contains(out, "dec_ttl") {
				t.Errorf("to the routed peer: want the gateway, no tunnel, TTL left to the host:\n%s", out)
			}
			out = m.trace(fromP1 + "nw_dst=10.244.3.7")
			switch {
			case tc.tunnel && (!outputs(out, "1") || !strings.Contains(out, "198.18.1.13->tun_dst")):
				t.Errorf("to the tunnelled peer: want the tunnel to 198.18.1.13:\n%s", out)
			case !tc.tunnel && !outputs(out, "2"):
				t.Errorf("to the other peer without a tunnel: want the gateway:\n%s", out)
			}
			// From the host (routed in by a peer) to a local Pod.
			out = m.trace("in_port=2,dl_src=0a:00:00:00:00:01,dl_dst=0a:00:00:00:01:05,ip,nw_ttl=63,nw_src=10.244.2.7,nw_dst=10.244.1.5")
			if !outputs(out, "3") {
				t.Errorf("from a routed peer to a local Pod:\n%s", out)
			}
			// The routed peer's gateway is not answered: the host routes
			// to its Node IP, not its gateway.
			out = m.trace("in_port=2,arp,arp_op=1,dl_src=0a:00:00:00:00:01,arp_sha=0a:00:00:00:00:01,arp_spa=10.244.1.1,arp_tpa=10.244.2.1")
			if strings.Contains(out, "IN_PORT") {
				t.Errorf("ARP for the routed peer's gateway answered:\n%s", out)
			}
		})
	}
}

// TestPolicyOnlyBridge: in networkPolicyOnly mode the bridge answers every
// ARP request with the virtual MAC (spa and tpa swapped), routes to local
// Pods by IP with one TTL hop between Pods (none for packets the host
// already routed), and sends everything else to the gateway. Without a Pod
// range of its own, it knows a local Pod's connection that the host hands
// back (to the Node's NodePort) by the Pod's address: the Node's own
// frontend (LocalPods) takes it, and no other address.
func TestPolicyOnlyBridge(t *testing.T) {
	br := pipeline.Bridge{Round: 1, GatewayPort: 2, GatewayMAC: modeGwMAC, NodeIP: net.ParseIP("198.18.0.11"), PolicyOnly: true}
	flows := append(pipeline.BaseFlows(br), pipeline.PodFlows(br, modeP1)...)
	flows = append(flows, pipeline.PodFlows(br, modeP2)...)
	flows = append(flows, pipeline.ServiceBaseFlows(br)...)
	fromNode := pipeline.ServicePort{ID: 12, VIPs: []net.IP{pipeline.NodePortVIP}, Protocol: 6, Port: 30080, External: true,
		LocalPods: true, Endpoints: []pipeline.ServiceEndpoint{{IP: net.ParseIP("10.244.2.7"), Port: 8080}}}
	fs, groups, err := pipeline.ServicePortFlows(br, fromNode)
	if err != nil {
		t.Fatal(err)
	}
	m := newModeBridge(t, false, append(flows, fs...), groups)
	for src, want := range map[string]bool{"10.244.1.5": true, "10.244.1.6": true, "10.244.1.99": false, "198.19.0.10": false} {
		out := m.trace("in_port=2,dl_src=0a:00:00:00:00:01,dl_dst=0e:5e:1e:00:00:01,tcp,nw_ttl=64,nw_src="+src+",tp_src=40000,nw_dst=169.254.100.2,tp_dst=30080", "trk,new")
		if got := strings.Contains(out, "group:12"); got != want {
			t.Errorf("from %s, handed back by the host to the NodePort: reaches the Node's own frontend %v, want %v:\n%s", src, got, want, out)
		}
	}
	for _, tc := range []struct{ name, flow string }{
		{"from a Pod for its primary's gateway", "in_port=3,arp,arp_op=1,dl_src=0a:00:00:00:01:05,arp_sha=0a:00:00:00:01:05,arp_spa=10.244.1.5,arp_tpa=10.244.1.1"},
		{"from a Pod for another Pod", "in_port=3,arp,arp_op=1,dl_src=0a:00:00:00:01:05,arp_sha=0a:00:00:00:01:05,arp_spa=10.244.1.5,arp_tpa=10.244.1.6"},
		{"from the host for a Pod", "in_port=2,arp,arp_op=1,dl_src=0a:00:00:00:00:01,arp_sha=0a:00:00:00:00:01,arp_spa=198.18.0.11,arp_tpa=10.244.1.5"},
	} {
		t.Run("ARP "+tc.name, func(t *testing.T) {
			out := m.trace(tc.flow)
			for _, want := range []string{"0e:5e:1e:00:00:01->arp_sha", "move:NXM_OF_ARP_TPA[]->NXM_NX_REG2[]",
				"move:NXM_OF_ARP_SPA[]->NXM_OF_ARP_TPA[]", "move:NXM_NX_REG2[]->NXM_OF_ARP_SPA[]", "IN_PORT"} {
				if !strings.Contains(out, want) {
					t.Fatalf("no %q: want a reply with the virtual MAC on in_port:\n%s", want, out)
				}
			}
			if outputs(out, "3") && !strings.HasPrefix(tc.flow, "in_port=3") || outputs(out, "4") {
				t.Fatalf("ARP forwarded to a Pod:\n%s", out)
			}
		})
	}
	out := m.trace("in_port=3,arp,arp_op=2,dl_src=0a:00:00:00:01:05,arp_sha=0a:00:00:00:01:05,arp_spa=10.244.1.5,arp_tpa=10.244.1.6")
	if !strings.HasSuffix(strings.TrimSpace(out), "drop") {
		t.Errorf("an ARP reply from a Pod is not dropped:\n%s", out)
	}
	out = m.trace(fromP1 + "nw_dst=10.244.1.6")
	if !outputs(out, "4") || !strings.Contains(out, "dec_ttl") || !strings.Contains(out, "0a:00:00:00:01:06->eth_dst") {
		t.Errorf("Pod to local Pod: want port 4, its MAC and one TTL hop:\n%s", out)
	}
	out = m.trace("in_port=2,dl_src=0a:00:00:00:00:01,dl_dst=0e:5e:1e:00:00:01,ip,nw_ttl=63,nw_src=10.244.2.9,nw_dst=10.244.1.5")
	if !outputs(out, "3") || strings.Contains(out, "dec_ttl") {
		t.Errorf("host to local Pod: want port 3 and no second TTL hop:\n%s", out)
	}
	for _, dst := range []string{"10.244.2.9", "10.244.1.99", "198.19.0.10", "10.244.1.1"} {
		if out := m.trace(fromP1 + "nw_dst=" + dst); !outputs(out, "2") {
			t.Errorf("Pod to %s: want the gateway:\n%s", dst, out)
		}
	}
	if out := m.trace("in_port=3,dl_src=0a:00:00:00:01:05,dl_dst=0a:00:00:00:00:01,ip,nw_ttl=64,nw_src=10.244.1.9,nw_dst=198.19.0.10"); !strings.HasSuffix(strings.TrimSpace(out), "drop") {
		t.Errorf("a spoofed source is not dropped:\n%s", out)
	}
}

// TestServiceHostSNAT: a connection entering from the gateway (NodePort)
// whose endpoint is behind the gateway (a routed peer's Pod) is SNATed to
// ServiceHostSNATIP and hairpinned out of the gateway; with the endpoint
// behind the tunnel it keeps the gateway IP as before; replies to
// ServiceHostSNATIP are un-SNATed.
func TestServiceHostSNAT(t *testing.T) {
	br := pipeline.Bridge{Round: 1, GatewayPort: 2, GatewayMAC: modeGwMAC, GatewayIP: net.ParseIP("10.244.1.1"),
		PodCIDR: mustCIDR("10.244.1.0/24"), NodeIP: net.ParseIP("198.18.0.11"), TunnelPort: 1}
	flows := append(pipeline.BaseFlows(br), pipeline.PodFlows(br, modeP1)...)
	flows = append(flows, pipeline.RoutedPeerNodeFlows(br, routedPeer)...)
	flows = append(flows, pipeline.PeerNodeFlows(br, tunnelPeer)...)
	flows = append(flows, pipeline.ServiceBaseFlows(br)...)
	np := pipeline.ServicePort{ID: 11, VIPs: []net.IP{pipeline.NodePortVIP}, Protocol: 6, Port: 30080, External: true, SNAT: true,
		Endpoints: []pipeline.ServiceEndpoint{{IP: net.ParseIP("10.244.2.7"), Port: 8080}, {IP: net.ParseIP("10.244.3.7"), Port: 8080}}}
	clusterIP := pipeline.ServicePort{ID: 12, VIPs: []net.IP{net.ParseIP("10.96.0.10")}, Protocol: 6, Port: 80,
		Endpoints: []pipeline.ServiceEndpoint{{IP: net.ParseIP("10.244.2.7"), Port: 8080}}}
	var groups []of.GroupEntry
	for _, sp := range []pipeline.ServicePort{np, clusterIP} {
		fs, gs, err := pipeline.ServicePortFlows(br, sp)
		if err != nil {
			t.Fatal(err)
		}
		flows = append(flows, fs...)
		groups = append(groups, gs...)
	}
	m := newModeBridge(t, true, flows, groups)
	npSyn := "in_port=2,dl_src=0a:00:00:00:00:01,dl_dst=0e:5e:1e:00:00:01,tcp,nw_ttl=64,nw_src=198.19.0.10,tp_src=40000,nw_dst=169.254.100.2,tp_dst=30080"
	// Endpoint 10.244.2.7 (routed): host SNAT, back out of the gateway.
	out := m.trace("reg6=0x0af40207,"+npSyn, "trk,new", "trk,new", "trk,new")
	for _, want := range []string{"nat(dst=10.244.2.7:8080)", "nat(src=169.254.100.3)", "IN_PORT"} {
		if !strings.Contains(out, want) {
			t.Errorf("NodePort to a routed endpoint: no %q:\n%s", want, out)
		}
	}
	// Endpoint 10.244.3.7 (tunnel): SNAT to the gateway IP, to the tunnel.
	out = m.trace("reg6=0x0af40307,"+npSyn, "trk,new", "trk,new", "trk,new")
	if !strings.Contains(out, "nat(src=10.244.1.1)") || strings.Contains(out, "169.254.100.3") || !strings.Contains(out, "198.18.1.13->tun_dst") {
		t.Errorf("NodePort to a tunnelled endpoint: want SNAT to the gateway IP into the tunnel:\n%s", out)
	}
	// The host's own connection to a ClusterIP with a routed endpoint.
	hostSyn := "in_port=2,dl_src=0a:00:00:00:00:01,dl_dst=0e:5e:1e:00:00:01,tcp,nw_ttl=64,nw_src=10.244.1.1,tp_src=40000,nw_dst=10.96.0.10,tp_dst=80"
	out = m.trace("reg6=0x0af40207,"+hostSyn, "trk,new", "trk,new", "trk,new")
	if !strings.Contains(out, "nat(src=169.254.100.3)") || !strings.Contains(out, "IN_PORT") {
		t.Errorf("host to a ClusterIP with a routed endpoint: want host SNAT and hairpin:\n%s", out)
	}
	// A Pod's connection to the same ClusterIP keeps its address.
	out = m.trace("reg6=0x0af40207,in_port=3,dl_src=0a:00:00:00:01:05,dl_dst=0a:00:00:00:00:01,tcp,nw_ttl=64,nw_src=10.244.1.5,tp_src=40000,nw_dst=10.96.0.10,tp_dst=80",
		"trk,new", "trk,new", "trk,new")
	if strings.Contains(out, "nat(src=") || !outputs(out, "2") {
		t.Errorf("Pod to a ClusterIP with a routed endpoint: want no SNAT, out of the gateway:\n%s", out)
	}
	// Replies to the host SNAT address are un-SNATed first.
	out = m.trace("in_port=2,dl_src=0a:00:00:00:00:01,dl_dst=0e:5e:1e:00:00:01,tcp,nw_ttl=63,nw_src=10.244.2.7,tp_src=8080,nw_dst=169.254.100.3,tp_dst=40000")
	if !strings.Contains(out, "ct(table=30,zone=65521,nat)") {
		t.Errorf("reply to the host SNAT address is not un-SNATed:\n%s", out)
	}
	// Later packets and replies of a host-SNAT connection hairpin.
	est := "in_port=2,ct_state=trk|est,ct_mark=0x1a,dl_src=0a:00:00:00:00:01,dl_dst=0e:5e:1e:00:00:01,tcp,nw_ttl=64,nw_src=198.19.0.10,tp_src=40000,nw_dst=10.244.2.7,tp_dst=8080"
	if out := m.trace(est, "trk,est"); !strings.Contains(out, "nat(src=169.254.100.3)") || !strings.Contains(out, "IN_PORT") {
		t.Errorf("established host-SNAT packet:\n%s", out)
	}
}
