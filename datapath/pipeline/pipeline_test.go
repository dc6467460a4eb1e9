package pipeline_test

import (
	"net"
	"regexp"
	"strconv"
	"strings"
	"testing"

	"github.com/seine-net/seine/datapath/pipeline"
)

func mustCIDR(s string) *net.IPNet {
	_, n, err := net.ParseCIDR(s)
	if err != nil {
		panic(err)
	}
	return n
}

func mustMAC(s string) net.HardwareAddr {
	m, err := net.ParseMAC(s)
	if err != nil {
		panic(err)
	}
	return m
}

func TestTablesAreOrderedAndNamed(t *testing.T) {
	prev := -1
	seen := map[string]bool{}
	for _, ti := range pipeline.Tables() {
		if int(ti.Table) <= prev {
			t.Fatalf("table %s (%d) is not after table %d", ti.Name, ti.Table, prev)
		}
		if ti.Name == "" || seen[ti.Name] {
			t.Fatalf("table %d has empty or duplicate name %q", ti.Table, ti.Name)
		}
		seen[ti.Name] = true
		prev = int(ti.Table)
	}
	if got := pipeline.L3Forwarding.String(); got != "L3Forwarding" {
		t.Fatalf("L3Forwarding.String() = %q", got)
	}
}

func TestRegFieldLayout(t *testing.T) {
	if m := pipeline.PktSource.Match(pipeline.FromPod); m.Reg != 0 || m.Value != 3 || m.Mask != 0xf {
		t.Fatalf("PktSource match %+v", m)
	}
	if m := pipeline.OutputResolved.Match(1); m.Value != 1<<16 || m.Mask != 1<<16 {
		t.Fatalf("OutputResolved match %+v", m)
	}
	if l := pipeline.TargetOFPort.Load(7); l.Reg != 1 || l.NBits != 32 || l.Value != 7 {
		t.Fatalf("TargetOFPort load %+v", l)
	}
	if s := pipeline.PktSource.String(); s != "reg0[0..3]" {
		t.Fatalf("PktSource.String() = %q", s)
	}
	// No two fields of one register overlap.
	fields := []pipeline.RegField{pipeline.PktSource, pipeline.OutputResolved, pipeline.TargetOFPort}
	for i, a := range fields {
		for _, b := range fields[i+1:] {
			if a.Reg() == b.Reg() && a.Mask()&b.Mask() != 0 {
				t.Fatalf("%s overlaps %s", a, b)
			}
		}
	}
}

func TestCookieLayout(t *testing.T) {
	c := pipeline.Cookie(7, pipeline.CategoryPod, 42)
	if c&pipeline.CookieRoundMask != 7<<pipeline.CookieRoundShift {
		t.Fatalf("round bits of %#x", c)
	}
	if (c&pipeline.CookieCategoryMask)>>pipeline.CookieCategoryShift != uint64(pipeline.CategoryPod) {
		t.Fatalf("category bits of %#x", c)
	}
	if c&(1<<40-1) != 42 {
		t.Fatalf("id bits of %#x", c)
	}
}

// TestPipelineForwarding installs the pipeline on a real OVS bridge and
// checks the forwarding decisions with ofproto/trace.
func TestPipelineForwarding(t *testing.T) {
	o, c, ctx := testBridge(t, geneveTun0, gw0, podPort("p1", 3), podPort("p2", 4))

	gwMAC := mustMAC("0a:00:00:00:00:01")
	br := pipeline.Bridge{Round: 1, GatewayPort: 2, GatewayMAC: gwMAC, GatewayIP: net.ParseIP("10.244.1.1"),
		PodCIDR: mustCIDR("10.244.1.0/24"), NodeIP: net.ParseIP("198.18.0.11"), TunnelPort: 1}
	p1 := pipeline.Pod{OFPort: 3, IP: net.ParseIP("10.244.1.5"), MAC: mustMAC("0a:00:00:00:01:05")}
	p2 := pipeline.Pod{OFPort: 4, IP: net.ParseIP("10.244.1.6"), MAC: mustMAC("0a:00:00:00:01:06")}
	peer := pipeline.PeerNode{ID: 9, PodCIDR: mustCIDR("10.244.2.0/24"), NodeIP: net.ParseIP("198.18.0.12"),
		GatewayIP: net.ParseIP("10.244.2.1")}
	addFlows(ctx, t, c, pipeline.BaseFlows(br), pipeline.PodFlows(br, p1), pipeline.PodFlows(br, p2),
		pipeline.PeerNodeFlows(br, peer))

	trace := func(flow string) string {
		return o.Run("ovs-appctl", "ofproto/trace", "br-int", flow)
	}
	lastLine := func(s string) string {
		lines := strings.Split(strings.TrimSpace(s), "\n")
		return lines[len(lines)-1]
	}
	ip := "ip,nw_ttl=64,"
	cases := []struct {
		name, flow, want string
	}{
		{"pod to local pod", "in_port=3,dl_src=0a:00:00:00:01:05,dl_dst=0a:00:00:00:01:06," + ip + "nw_src=10.244.1.5,nw_dst=10.244.1.6", "output port is 4"},
		{"pod to peer podCIDR goes to the tunnel", "in_port=3,dl_src=0a:00:00:00:01:05,dl_dst=0a:00:00:00:00:01," + ip + "nw_src=10.244.1.5,nw_dst=10.244.2.7", "output port is 1"},
		{"pod to outside goes to the gateway", "in_port=3,dl_src=0a:00:00:00:01:05,dl_dst=0a:00:00:00:00:01," + ip + "nw_src=10.244.1.5,nw_dst=198.19.0.10", "output port is 2"},
		{"spoofed source IP is dropped", "in_port=3,dl_src=0a:00:00:00:01:05,dl_dst=0a:00:00:00:00:01," + ip + "nw_src=10.244.1.99,nw_dst=198.19.0.10", "drop"},
		{"spoofed source MAC is dropped", "in_port=3,dl_src=0a:00:00:00:09:09,dl_dst=0a:00:00:00:00:01," + ip + "nw_src=10.244.1.5,nw_dst=198.19.0.10", "drop"},
		{"tunnel to local pod", "in_port=1,tun_id=0,tun_src=198.18.0.12,tun_dst=198.18.0.11,dl_src=0a:00:00:00:00:02,dl_dst=0e:5e:1e:00:00:01," + ip + "nw_src=10.244.2.7,nw_dst=10.244.1.5", "output port is 3"},
		{"host to local pod", "in_port=2,dl_src=0a:00:00:00:00:01,dl_dst=0a:00:00:00:01:05," + ip + "nw_src=10.244.1.1,nw_dst=10.244.1.5", "output port is 3"},
		{"host to peer podCIDR", "in_port=2,dl_src=0a:00:00:00:00:01,dl_dst=0e:5e:1e:00:00:01," + ip + "nw_src=10.244.1.1,nw_dst=10.244.2.7", "output port is 1"},
		{"pod to a peer Node's IP goes to the tunnel", "in_port=3,dl_src=0a:00:00:00:01:05,dl_dst=0a:00:00:00:00:01," + ip + "nw_src=10.244.1.5,nw_dst=198.18.0.12", "output port is 1"},
		{"tunnel to this Node's IP goes to the host", "in_port=1,tun_id=0,tun_src=198.18.0.12,tun_dst=198.18.0.11,dl_src=0a:00:00:00:00:02,dl_dst=0e:5e:1e:00:00:01," + ip + "nw_src=10.244.2.7,nw_dst=198.18.0.11", "output port is 2"},
		{"ARP for a local pod is delivered to it", "in_port=3,arp,arp_op=1,dl_src=0a:00:00:00:01:05,arp_sha=0a:00:00:00:01:05,arp_spa=10.244.1.5,arp_tpa=10.244.1.6", "output port is 4"},
		{"ARP for the gateway goes to the gateway", "in_port=3,arp,arp_op=1,dl_src=0a:00:00:00:01:05,arp_sha=0a:00:00:00:01:05,arp_spa=10.244.1.5,arp_tpa=10.244.1.1", "output port is 2"},
		{"ARP for a peer gateway is answered", "in_port=2,arp,arp_op=1,dl_src=0a:00:00:00:00:01,arp_sha=0a:00:00:00:00:01,arp_spa=10.244.1.1,arp_tpa=10.244.2.1", "IN_PORT"},
		{"spoofed ARP is dropped", "in_port=3,arp,arp_op=1,dl_src=0a:00:00:00:01:05,arp_sha=0a:00:00:00:01:05,arp_spa=10.244.1.77,arp_tpa=10.244.1.6", "drop"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			out := trace(tc.flow)
			last := lastLine(out)
			if tc.want == "IN_PORT" {
				if !strings.Contains(out, "IN_PORT") || !strings.Contains(out, "0e:5e:1e:00:00:01->arp_sha") {
					t.Fatalf("want an ARP reply with the virtual MAC on in_port:\n%s", out)
				}
				return
			}
			if !strings.Contains(last, "Datapath actions:") {
				t.Fatalf("no datapath actions in trace:\n%s", out)
			}
			switch tc.want {
			case "drop":
				if !strings.HasSuffix(last, "drop") {
					t.Fatalf("want drop, got %q\n%s", last, out)
				}
			default:
				port := strings.TrimPrefix(tc.want, "output port is ")
				if !regexp.MustCompile(`(output:|output port is )` + port + `\b`).MatchString(out) {
					t.Fatalf("want %s, got %q\n%s", tc.want, last, out)
				}
			}
		})
	}
	// The tunnelled packet carries the peer's Node IP as tun_dst.
	out := trace("in_port=3,dl_src=0a:00:00:00:01:05,dl_dst=0a:00:00:00:00:01," + ip + "nw_src=10.244.1.5,nw_dst=10.244.2.7")
	if !strings.Contains(out, "198.18.0.12") {
		t.Fatalf("tunnel destination not set:\n%s", out)
	}
	// Table names are part of the dump once OVSDB names them (checked in
	// the ovsdb package); here: every table's miss flow exists.
	dump := o.Run("ovs-ofctl", "-O", "OpenFlow13", "dump-flows", o.MgmtSocket("br-int"))
	for _, ti := range pipeline.Tables() {
		if !strings.Contains(dump, "table="+strconv.Itoa(int(ti.Table))+",") && ti.Table != 0 {
			t.Errorf("no flow in table %s:\n%s", ti.Name, dump)
		}
	}
}
