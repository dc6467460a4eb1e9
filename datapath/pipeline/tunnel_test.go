package pipeline_test

import (
	"net"
	"regexp"
	"strings"
	"testing"

	of "github.com/seine-net/seine/datapath/openflow"
	"github.com/seine-net/seine/datapath/pipeline"
)

func TestPeerMAC(t *testing.T) {
	if got := pipeline.PeerMAC(net.ParseIP("198.18.0.12")).String(); got != "0e:5f:c6:12:00:0c" {
		t.Fatalf("PeerMAC(198.18.0.12) = %s", got)
	}
	m := pipeline.PeerMAC(net.ParseIP("10.0.0.1"))
	if m[0]&1 != 0 || m[0]&2 == 0 {
		t.Fatalf("PeerMAC %s is not a locally administered unicast address", m)
	}
	if m.String() == pipeline.VirtualMAC().String() {
		t.Fatal("PeerMAC equals the virtual MAC")
	}
	if pipeline.PeerMAC(net.ParseIP("fd00::1")) != nil {
		t.Fatal("PeerMAC of an IPv6 address")
	}
}

// TestTunnelEgress installs the pipeline with each TunnelEgress on a real
// OVS bridge and traces a Pod's packet to a peer Node's podCIDR: it leaves
// for the peer's PeerMAC through the tunnel port (with tun_dst unless the
// kernel device picks the remote), or through the segmentation port, on
// which it comes back and TunnelOutput sends it to the tunnel with tun_dst.
func TestTunnelEgress(t *testing.T) {
	for _, egress := range []pipeline.TunnelEgress{pipeline.TunnelByTunDst, pipeline.TunnelByMAC, pipeline.TunnelSegmented} {
		t.Run(egress.String(), func(t *testing.T) {
			tun := geneveTun0
			if egress == pipeline.TunnelByMAC {
				tun = internalTun0
			}
			o, c, ctx := testBridge(t, tun, gw0, podPort("p1", 3), seg0)
			br := pipeline.Bridge{Round: 1, GatewayPort: 2, GatewayMAC: mustMAC("0a:00:00:00:00:01"),
				GatewayIP: net.ParseIP("10.244.1.1"), PodCIDR: mustCIDR("10.244.1.0/24"),
				NodeIP: net.ParseIP("198.18.0.11"), TunnelPort: 1, Tunnel: egress}
			if egress == pipeline.TunnelSegmented {
				br.SegmentPort = 5
			}
			pod := pipeline.Pod{OFPort: 3, IP: net.ParseIP("10.244.1.5"), MAC: mustMAC("0a:00:00:00:01:05")}
			peer := pipeline.PeerNode{ID: 9, PodCIDR: mustCIDR("10.244.2.0/24"), NodeIP: net.ParseIP("198.18.0.12"),
				GatewayIP: net.ParseIP("10.244.2.1")}
			addFlows(ctx, t, c, pipeline.BaseFlows(br), pipeline.PodFlows(br, pod), pipeline.PeerNodeFlows(br, peer))
			last := func(s string) string {
				lines := strings.Split(strings.TrimSpace(s), "\n")
				return lines[len(lines)-1]
			}
			out := o.Run("ovs-appctl", "ofproto/trace", "br-int",
				"in_port=3,dl_src=0a:00:00:00:01:05,dl_dst=0a:00:00:00:00:01,ip,nw_ttl=64,nw_src=10.244.1.5,nw_dst=10.244.2.7")
			outputs := func(trace, port string) bool {
				return regexp.MustCompile(`(output:|output port is )` + port + `\b`).MatchString(trace)
			}
			if !strings.Contains(out, "set_field:0e:5f:c6:12:00:0c->eth_dst") {
				t.Errorf("not addressed to the peer's PeerMAC:\n%s", out)
			}
			tunDst := strings.Contains(out, "198.18.0.12->tun_dst")
			switch egress {
			case pipeline.TunnelByTunDst:
				if !outputs(out, "1") || !tunDst {
					t.Errorf("want output to the tunnel port 1 with tun_dst 198.18.0.12:\n%s", out)
				}
			case pipeline.TunnelByMAC:
				if !outputs(out, "1") || tunDst {
					t.Errorf("want output to port 1 without tunnel metadata:\n%s", out)
				}
			case pipeline.TunnelSegmented:
				if !outputs(out, "5") || outputs(out, "1") || tunDst {
					t.Errorf("want output to the segmentation port 5 only:\n%s", out)
				}
				back := o.Run("ovs-appctl", "ofproto/trace", "br-int",
					"in_port=5,dl_src=0a:00:00:00:00:01,dl_dst=0e:5f:c6:12:00:0c,ip,nw_ttl=63,nw_src=10.244.1.5,nw_dst=10.244.2.7")
				if !strings.Contains(back, "198.18.0.12->tun_dst") || !outputs(back, "1") {
					t.Errorf("segments back on port 5 must go to the tunnel with tun_dst:\n%s", back)
				}
				other := o.Run("ovs-appctl", "ofproto/trace", "br-int",
					"in_port=5,dl_src=0a:00:00:00:00:01,dl_dst=0a:00:00:00:01:05,ip,nw_ttl=63,nw_src=10.244.1.5,nw_dst=10.244.1.7")
				if !strings.HasSuffix(last(other), "drop") {
					t.Errorf("a packet on the segmentation port not for a peer must be dropped:\n%s", other)
				}
			}
		})
	}
}

// TestNATChecksumDetour traces TCP packets on a bridge with the
// segmentation pair: a packet conntrack NATed (--ct-next ...,dnat) that
// leaves for a peer Node or the gateway goes to the segmentation port with
// its saved fields put back; one that was not NATed, or that goes to a
// local Pod, is not detoured; and a packet back from the detour re-enters
// the pipeline as coming from the port named in its destination MAC.
func TestNATChecksumDetour(t *testing.T) {
	o, c, ctx := testBridge(t, internalTun0, gw0, podPort("p1", 3), podPort("p2", 4), seg0)
	br := pipeline.Bridge{Round: 1, GatewayPort: 2, GatewayMAC: mustMAC("0a:00:00:00:00:01"),
		GatewayIP: net.ParseIP("10.244.1.1"), PodCIDR: mustCIDR("10.244.1.0/24"),
		NodeIP: net.ParseIP("198.18.0.11"), TunnelPort: 1, Tunnel: pipeline.TunnelByMAC, SegmentPort: 5}
	if !br.NATChecksumDetour() {
		t.Fatal("a bridge with a segmentation pair must detour NATed packets")
	}
	// p1 has an egress limit: its packets pass meter 3 once, also those
	// that take the detour.
	p1 := pipeline.Pod{OFPort: 3, IP: net.ParseIP("10.244.1.5"), MAC: mustMAC("0a:00:00:00:01:05"), EgressMeter: 3}
	p2 := pipeline.Pod{OFPort: 4, IP: net.ParseIP("10.244.1.6"), MAC: mustMAC("0a:00:00:00:01:06")}
	peer := pipeline.PeerNode{ID: 9, PodCIDR: mustCIDR("10.244.2.0/24"), NodeIP: net.ParseIP("198.18.0.12"),
		GatewayIP: net.ParseIP("10.244.2.1")}
	if err := c.EnsureMeter(ctx, of.MeterEntry{ID: 3, RateKbps: 1_000_000, BurstKbits: 1_000_000}); err != nil {
		t.Fatal(err)
	}
	addFlows(ctx, t, c, pipeline.BaseFlows(br), pipeline.PodFlows(br, p1), pipeline.PodFlows(br, p2),
		pipeline.PeerNodeFlows(br, peer))
	outputs := func(trace, port string) bool {
		return regexp.MustCompile(`(output:|output port is )` + port + `\b`).MatchString(trace)
	}
	// Two conntrack passes: NATLookup's lookup (here without a ct_mark,
	// as for a connection committed before the marks existed) and the
	// Conntrack table's ct(nat).
	trace := func(flow, lookup, ct string) string {
		return o.Run("ovs-appctl", "ofproto/trace", "br-int", flow, "--ct-next", lookup, "--ct-next", ct)
	}
	fromPod := "in_port=3,dl_src=0a:00:00:00:01:05,dl_dst=0a:00:00:00:00:01,tcp,nw_ttl=64,nw_src=10.244.1.5,tp_src=40000,tp_dst=80,nw_dst="
	cases := []struct {
		name, flow, lookup, ct, port string
		saved, detour                bool
	}{
		{"NATed, to a peer Node", fromPod + "10.244.2.7", "trk,est", "trk,est,dnat", "5", true, true},
		{"NATed, to the host", fromPod + "198.19.0.10", "trk,est", "trk,est,dnat", "5", true, true},
		{"not NATed, to a peer Node", fromPod + "10.244.2.7", "trk,est", "trk,est", "1", true, false},
		{"NATed, to a local Pod", fromPod + "10.244.1.6", "trk,est", "trk,est,snat", "4", true, false},
		// A new connection is saved only where a Service NATs it.
		{"new, to a peer Node", fromPod + "10.244.2.7", "trk,new", "trk,new", "1", false, false},
		// NATed without the NAT mark (an earlier release's commit) and
		// still new: not saved, so no detour (nothing to restore).
		{"NATed without a mark, new, to a peer Node", fromPod + "10.244.2.7", "trk,new", "trk,new,dnat", "1", false, false},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			out := trace(tc.flow, tc.lookup, tc.ct)
			if !outputs(out, tc.port) {
				t.Fatalf("want output to port %s:\n%s", tc.port, out)
			}
			if n := strings.Count(out, "meter:3"); n != 1 {
				t.Fatalf("the packet passed its Pod's meter %d times, want once:\n%s", n, out)
			}
			saved := strings.Contains(out, "move:NXM_OF_IP_SRC[]->NXM_NX_REG7[]")
			if saved != tc.saved {
				t.Fatalf("headers saved: %v, want %v:\n%s", saved, tc.saved, out)
			}
			// Saving un-wildcards the ports: no datapath flow of a
			// packet that is not saved may match them.
			if !tc.saved && regexp.MustCompile(`Megaflow:.*tp_src=`).MatchString(out) {
				t.Fatalf("a datapath flow matches the source port although nothing saved it:\n%s", out)
			}
			restored := strings.Contains(out, "move:NXM_NX_REG7[]->NXM_OF_IP_SRC[]")
			if restored != tc.detour {
				t.Fatalf("saved fields put back: %v, want %v:\n%s", restored, tc.detour, out)
			}
		})
	}
	// That connection gets the mark, so its next packets are saved.
	if out := trace(fromPod+"10.244.2.7", "trk,new", "trk,new,dnat"); !regexp.MustCompile(`110\. .*\n\s+ct\(commit,zone=65520,exec\(load:0x1->NXM_NX_CT_MARK\[5\.\.6\]\)\)`).MatchString(out) {
		t.Errorf("a DNATed new packet without the NAT mark must mark its connection:\n%s", out)
	}
	back := trace("in_port=5,dl_src=0a:00:00:00:01:05,dl_dst=0e:5f:ff:ff:00:03,tcp,nw_ttl=64,nw_src=10.244.1.5,nw_dst=10.244.2.7,tp_src=40000,tp_dst=80",
		"trk,est", "trk,est,dnat")
	if !strings.Contains(back, "in_port=3, priority 191") || !outputs(back, "1") || strings.Contains(back, "output:5") {
		t.Fatalf("back from the detour: want the pipeline again as from port 3, out to the tunnel without a second detour:\n%s", back)
	}
	if strings.Contains(back, "meter:3") {
		t.Fatalf("back from the detour, the packet passed its Pod's meter again:\n%s", back)
	}
}

// TestPartialChecksumsRewrittenNeedNoDetour traces the same NATed packets
// on a bridge whose leaving devices rewrite partial checksums
// (PartialChecksumsRewritten): they leave straight through the tunnel or
// the gateway, nothing is saved, and the detour's tables keep only their miss flows.
func TestPartialChecksumsRewrittenNeedNoDetour(t *testing.T) {
	o, c, ctx := testBridge(t, internalTun0, gw0, podPort("p1", 3), seg0)
	br := pipeline.Bridge{Round: 1, GatewayPort: 2, GatewayMAC: mustMAC("0a:00:00:00:00:01"),
		GatewayIP: net.ParseIP("10.244.1.1"), PodCIDR: mustCIDR("10.244.1.0/24"),
		NodeIP: net.ParseIP("198.18.0.11"), TunnelPort: 1, Tunnel: pipeline.TunnelByMAC, SegmentPort: 5,
		PartialChecksumsRewritten: true}
	if br.NATChecksumDetour() {
		t.Fatal("a bridge whose leaving devices rewrite partial checksums must not detour")
	}
	p1 := pipeline.Pod{OFPort: 3, IP: net.ParseIP("10.244.1.5"), MAC: mustMAC("0a:00:00:00:01:05")}
	peer := pipeline.PeerNode{ID: 9, PodCIDR: mustCIDR("10.244.2.0/24"), NodeIP: net.ParseIP("198.18.0.12"),
		GatewayIP: net.ParseIP("10.244.2.1")}
	var mods []of.FlowMod
	for _, fs := range [][]of.Flow{pipeline.BaseFlows(br), pipeline.PodFlows(br, p1), pipeline.PeerNodeFlows(br, peer)} {
		for _, f := range fs {
			if (f.Table == uint8(pipeline.NATLookup) || f.Table == uint8(pipeline.SaveHeaders)) && f.Priority > 0 {
				t.Errorf("a flow in the detour's table %s: %+v", pipeline.Table(f.Table), f)
			}
			mods = append(mods, of.FlowMod{Op: of.OpAdd, Flow: f})
		}
	}
	if err := c.Apply(ctx, mods); err != nil {
		t.Fatal(err)
	}
	// A Service's flows save headers only for the detour.
	sp := pipeline.ServicePort{ID: 7, VIPs: []net.IP{net.ParseIP("10.96.0.10")}, Protocol: 6, Port: 80,
		Endpoints: []pipeline.ServiceEndpoint{{IP: net.ParseIP("10.244.2.5"), Port: 8080}}}
	saves := func(b pipeline.Bridge) bool {
		fs, _, err := pipeline.ServicePortFlows(b, sp)
		if err != nil {
			t.Fatal(err)
		}
		for _, f := range fs {
			for _, a := range f.Actions {
				if l, ok := a.(of.LoadReg); ok && l == pipeline.HeadersSaved.Load(1) {
					return true
				}
			}
		}
		return false
	}
	detour := br
	detour.PartialChecksumsRewritten = false
	if saves(br) || !saves(detour) {
		t.Errorf("Service flows save headers: %v rewriting, %v with the detour; want false, true", saves(br), saves(detour))
	}
	fromPod := "in_port=3,dl_src=0a:00:00:00:01:05,dl_dst=0a:00:00:00:00:01,tcp,nw_ttl=64,nw_src=10.244.1.5,tp_src=40000,tp_dst=80,nw_dst="
	for dst, port := range map[string]string{"10.244.2.7": "1", "198.19.0.10": "2"} {
		out := o.Run("ovs-appctl", "ofproto/trace", "br-int", fromPod+dst, "--ct-next", "trk,est,dnat")
		if !regexp.MustCompile(`(output:|output port is )`+port+`\b`).MatchString(out) || strings.Contains(out, "output:5") {
			t.Errorf("NATed packet to %s: want it out of port %s, not the segmentation port:\n%s", dst, port, out)
		}
		if strings.Contains(out, "NXM_NX_REG7") || regexp.MustCompile(`Megaflow:.*tp_src=`).MatchString(out) {
			t.Errorf("NATed packet to %s: headers saved (registers or an exact-port datapath flow):\n%s", dst, out)
		}
	}
}
