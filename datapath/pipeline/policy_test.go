package pipeline_test

import (
	"net"
	"reflect"
	"regexp"
	"strconv"
	"strings"
	"testing"

	of "github.com/seine-net/seine/datapath/openflow"
	"github.com/seine-net/seine/datapath/pipeline"
)

func TestPolicyBaseFlows(t *testing.T) {
	br := pipeline.Bridge{Round: 3, GatewayPort: 2, GatewayIP: net.ParseIP("10.244.1.1"), NodeIP: net.ParseIP("198.18.0.11")}
	fs := pipeline.PolicyBaseFlows(br)
	if len(fs) != 12 {
		t.Fatalf("%d flows, want 12 (four bypasses per direction: replies, related, established TCP, hairpin; two host sources, two default drops)", len(fs))
	}
	drops := map[uint8]of.Flow{}
	for _, f := range fs {
		if f.Cookie != pipeline.Cookie(3, pipeline.CategoryPolicy, 0) {
			t.Errorf("flow %v: cookie %#x", f.Match, f.Cookie)
		}
		if f.Table == uint8(pipeline.EgressDefault) || f.Table == uint8(pipeline.IngressDefault) {
			drops[f.Table] = f
			continue
		}
		if f.Priority <= pipeline.PrioPolicyAllow {
			t.Errorf("bypass flow %v: priority %d is not above the allows", f.Match, f.Priority)
		}
		g := f.Actions[len(f.Actions)-1].(of.GotoTable)
		want := pipeline.IngressDefault.Next()
		if f.Table == uint8(pipeline.EgressRule) {
			want = pipeline.EgressDefault.Next()
		}
		if g.Table != uint8(want) {
			t.Errorf("flow in table %d goes to %d, want %d", f.Table, g.Table, want)
		}
	}
	// Which tracked packets skip the rule tables: replies, related
	// packets and established TCP; never a UDP, SCTP or ICMP packet in
	// the original direction, established or not.
	skips := func(table pipeline.Table, proto uint8, state uint32) bool {
		for _, f := range fs {
			m := f.Match
			if f.Table != uint8(table) || m.IPSrc != nil || len(m.Regs) > 0 || m.CtMark != nil || m.CtState == nil ||
				(m.IPProto != 0 && m.IPProto != proto) {
				continue
			}
			if state&m.CtState.Set == m.CtState.Set && state&m.CtState.Clear == 0 {
				return true
			}
		}
		return false
	}
	for _, table := range []pipeline.Table{pipeline.EgressRule, pipeline.IngressRule} {
		for _, c := range []struct {
			proto uint8
			state uint32
			want  bool
		}{
			{6, of.CtTrk | of.CtEst, true},
			{6, of.CtTrk | of.CtEst | of.CtRpl, true},
			{17, of.CtTrk | of.CtEst | of.CtRpl, true},
			{1, of.CtTrk | of.CtRel, true},
			{6, of.CtTrk | of.CtNew, false},
			{17, of.CtTrk | of.CtNew, false},
			{17, of.CtTrk | of.CtEst, false},
			{132, of.CtTrk | of.CtEst, false},
			{1, of.CtTrk | of.CtEst, false},
		} {
			if got := skips(table, c.proto, c.state); got != c.want {
				t.Errorf("%s: proto %d ct_state %#x skips the policy: %v, want %v", table, c.proto, c.state, got, c.want)
			}
		}
	}
	// A Pod's connection to itself through a Service skips both
	// directions, whatever its state; only from a Pod port.
	for _, table := range []pipeline.Table{pipeline.EgressRule, pipeline.IngressRule} {
		n := 0
		for _, f := range fs {
			m := f.Match
			if f.Table != uint8(table) || m.CtMark == nil {
				continue
			}
			n++
			if m.CtMark.Value != pipeline.CtMarkHairpin || m.CtMark.Mask != pipeline.CtMarkHairpin ||
				m.CtState == nil || m.CtState.Set != of.CtTrk || m.CtState.Clear != 0 || m.IPProto != 0 ||
				!reflect.DeepEqual(m.Regs, []of.RegMatch{pipeline.PktSource.Match(pipeline.FromPod)}) {
				t.Errorf("%s: hairpin bypass matches %+v, want ct_state=+trk, the hairpin ct_mark bit and a Pod source", table, m)
			}
		}
		if n != 1 {
			t.Errorf("%s: %d hairpin bypasses, want 1", table, n)
		}
	}
	// One default drop per direction, keyed on the direction's bit, below
	// the allows and above the miss flow.
	for table, bit := range map[pipeline.Table]pipeline.RegField{
		pipeline.EgressDefault:  pipeline.EgressIsolated,
		pipeline.IngressDefault: pipeline.IngressIsolated,
	} {
		f, ok := drops[uint8(table)]
		if !ok {
			t.Errorf("no default drop in %s", table)
			continue
		}
		if len(f.Actions) != 0 || f.Priority != pipeline.PrioPolicyDefault ||
			f.Priority >= pipeline.PrioPolicyRule || f.Priority <= pipeline.PrioDefault {
			t.Errorf("%s: default flow %v prio %d actions %v is not a drop between miss and allows", table, f.Match, f.Priority, f.Actions)
		}
		if !reflect.DeepEqual(f.Match.Regs, []of.RegMatch{bit.Match(1)}) || f.Match.EthType != pipeline.EthTypeIPv4 {
			t.Errorf("%s: default drop matches %+v, want ip and %s=1", table, f.Match, bit)
		}
	}
	if pipeline.EgressDefault.Next() != pipeline.L3Forwarding || pipeline.IngressDefault.Next() != pipeline.ConntrackCommit {
		t.Error("policy allows do not continue where the pipeline expects")
	}
}

// No two register fields of the layout share a bit.
func TestRegisterFieldsDoNotOverlap(t *testing.T) {
	used := map[[2]uint32]string{} // (register, bit) → field
	for _, r := range pipeline.Registers() {
		for bit := uint32(0); bit < 32; bit++ {
			if r.Field.Mask()&(1<<bit) == 0 {
				continue
			}
			k := [2]uint32{uint32(r.Field.Reg()), bit}
			if other, ok := used[k]; ok {
				t.Errorf("reg%d bit %d used by %s and %s", k[0], bit, r.Name, other)
			}
			used[k] = r.Name
		}
	}
	if len(used) == 0 {
		t.Fatal("no register fields")
	}
	if pipeline.IngressIsolated.String() != "reg0[24]" || pipeline.EgressIsolated.String() != "reg0[25]" {
		t.Errorf("isolation bits at %s and %s", pipeline.IngressIsolated, pipeline.EgressIsolated)
	}
}

// An isolated Pod's flows differ from a non-isolated one's only in the
// Classifier (egress bit) and L2Forwarding (ingress bit) flows, so that
// flowsync re-sends just those two when isolation changes.
func TestPodFlowsCarryIsolation(t *testing.T) {
	br := pipeline.Bridge{Round: 1, GatewayPort: 2, GatewayMAC: mustMAC("0a:00:00:00:00:01")}
	p := pipeline.Pod{OFPort: 3, IP: net.ParseIP("10.244.1.5"), MAC: mustMAC("0a:00:00:00:01:05")}
	open := pipeline.PodFlows(br, p)
	iso := p
	iso.IngressIsolated, iso.EgressIsolated = true, true
	closed := pipeline.PodFlows(br, iso)
	if len(open) != len(closed) {
		t.Fatalf("%d flows open, %d isolated", len(open), len(closed))
	}
	has := func(acts []of.Action, load of.LoadReg) bool {
		for _, a := range acts {
			if a == of.Action(load) {
				return true
			}
		}
		return false
	}
	changed := 0
	for i := range open {
		if reflect.DeepEqual(open[i], closed[i]) {
			continue
		}
		changed++
		switch pipeline.Table(closed[i].Table) {
		case pipeline.Classifier:
			if !has(closed[i].Actions, pipeline.EgressIsolated.Load(1)) || has(open[i].Actions, pipeline.EgressIsolated.Load(1)) {
				t.Errorf("Classifier actions %v / %v", open[i].Actions, closed[i].Actions)
			}
		case pipeline.L2Forwarding:
			if !has(closed[i].Actions, pipeline.IngressIsolated.Load(1)) || has(open[i].Actions, pipeline.IngressIsolated.Load(1)) {
				t.Errorf("L2Forwarding actions %v / %v", open[i].Actions, closed[i].Actions)
			}
		default:
			t.Errorf("flow in table %s changed with isolation", pipeline.Table(closed[i].Table))
		}
		if _, ok := closed[i].Actions[len(closed[i].Actions)-1].(of.GotoTable); !ok {
			t.Errorf("flow in table %d does not end with goto_table", closed[i].Table)
		}
	}
	if changed != 2 {
		t.Errorf("%d flows changed with isolation, want 2", changed)
	}
}

// TestIsolationInOVS installs the pipeline with the policy base flows and
// two Pods, p1 isolated for ingress and p2 for egress, with no allow rule,
// and checks with ofproto/trace which new connections get through.
func TestIsolationInOVS(t *testing.T) {
	o, c, ctx := testBridge(t, geneveTun0, gw0, podPort("p1", 3), podPort("p2", 4), podPort("p3", 5))

	br := pipeline.Bridge{Round: 1, GatewayPort: 2, GatewayMAC: mustMAC("0a:00:00:00:00:01"), GatewayIP: net.ParseIP("10.244.1.1"),
		PodCIDR: mustCIDR("10.244.1.0/24"), NodeIP: net.ParseIP("198.18.0.11"), TunnelPort: 1}
	p1 := pipeline.Pod{OFPort: 3, IP: net.ParseIP("10.244.1.5"), MAC: mustMAC("0a:00:00:00:01:05"), IngressIsolated: true}
	p2 := pipeline.Pod{OFPort: 4, IP: net.ParseIP("10.244.1.6"), MAC: mustMAC("0a:00:00:00:01:06"), EgressIsolated: true}
	p3 := pipeline.Pod{OFPort: 5, IP: net.ParseIP("10.244.1.7"), MAC: mustMAC("0a:00:00:00:01:07")}
	peer := pipeline.PeerNode{ID: 9, PodCIDR: mustCIDR("10.244.2.0/24"), NodeIP: net.ParseIP("198.18.0.12"), GatewayIP: net.ParseIP("10.244.2.1")}
	flows := append(pipeline.BaseFlows(br), pipeline.PolicyBaseFlows(br)...)
	for _, p := range []pipeline.Pod{p1, p2, p3} {
		flows = append(flows, pipeline.PodFlows(br, p)...)
	}
	flows = append(flows, pipeline.PeerNodeFlows(br, peer)...)
	addFlows(ctx, t, c, flows)
	trace := func(flow, ct string) string {
		out := o.Run("ovs-appctl", "ofproto/trace", "br-int", flow, "--ct-next", ct)
		lines := strings.Split(strings.TrimSpace(out), "\n")
		last := lines[len(lines)-1]
		if !strings.HasPrefix(last, "Datapath actions:") {
			t.Fatalf("trace of %s: no datapath actions:\n%s", flow, out)
		}
		if strings.HasSuffix(last, " drop") {
			return "drop"
		}
		if m := regexp.MustCompile(`output port is (\d+)`).FindStringSubmatch(out); m != nil {
			return "output:" + m[1]
		}
		if m := regexp.MustCompile(`(?m)^\s*\d+\. .*\n\s+output:(\d+)`).FindStringSubmatch(out); m != nil {
			return "output:" + m[1]
		}
		return last
	}
	const ipf = "tcp,tcp_dst=80,nw_ttl=64,"
	fromPod := func(p pipeline.Pod, dstMAC, dst string) string {
		return "in_port=" + itoa(p.OFPort) + ",dl_src=" + p.MAC.String() + ",dl_dst=" + dstMAC + "," + ipf + "nw_src=" + p.IP.String() + ",nw_dst=" + dst
	}
	fromTunnel := func(p pipeline.Pod) string {
		return "in_port=1,tun_id=0,tun_src=198.18.0.12,tun_dst=198.18.0.11,dl_src=0a:00:00:00:00:02,dl_dst=0e:5e:1e:00:00:01," + ipf +
			"nw_src=10.244.2.7,nw_dst=" + p.IP.String()
	}
	gw := "0a:00:00:00:00:01"
	cases := []struct{ name, flow, ct, want string }{
		{"peer to ingress-isolated p1", fromTunnel(p1), "trk,new", "drop"},
		{"established peer to p1", fromTunnel(p1), "trk,est", "output:3"},
		{"host (gateway IP) to p1", "in_port=2,dl_src=" + gw + ",dl_dst=" + p1.MAC.String() + "," + ipf + "nw_src=10.244.1.1,nw_dst=10.244.1.5", "trk,new", "output:3"},
		{"host (Node IP) to p1", "in_port=2,dl_src=" + gw + ",dl_dst=" + p1.MAC.String() + "," + ipf + "nw_src=198.18.0.11,nw_dst=10.244.1.5", "trk,new", "output:3"},
		{"p1 to outside (not egress-isolated)", fromPod(p1, gw, "192.0.2.1"), "trk,new", "output:2"},
		{"p3 to p1", fromPod(p3, gw, "10.244.1.5"), "trk,new", "drop"},
		{"peer to p2 (not ingress-isolated)", fromTunnel(p2), "trk,new", "output:4"},
		{"egress-isolated p2 to outside", fromPod(p2, gw, "192.0.2.1"), "trk,new", "drop"},
		{"egress-isolated p2 to p3", fromPod(p2, gw, "10.244.1.7"), "trk,new", "drop"},
		{"established p2 to outside", fromPod(p2, gw, "192.0.2.1"), "trk,est", "output:2"},
		{"p3 to outside", fromPod(p3, gw, "192.0.2.1"), "trk,new", "output:2"},
		{"peer to p3", fromTunnel(p3), "trk,new", "output:5"},
	}
	for _, tc := range cases {
		if got := trace(tc.flow, tc.ct); got != tc.want {
			t.Errorf("%s: %s (ct %s) → %s, want %s", tc.name, tc.flow, tc.ct, got, tc.want)
		}
	}
}

func itoa(v uint32) string { return strconv.Itoa(int(v)) }
