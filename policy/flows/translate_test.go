package flows

import (
	"fmt"
	"net"
	"reflect"
	"strings"
	"testing"

	of "github.com/seine-net/seine/datapath/openflow"
	"github.com/seine-net/seine/datapath/pipeline"
	"github.com/seine-net/seine/policy/apis/controlplane/v1alpha1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
)

func cidr(s string) *net.IPNet {
	_, n, err := net.ParseCIDR(s)
	if err != nil {
		panic(err)
	}
	return n
}

var testBridge = pipeline.Bridge{Round: 1, GatewayPort: 2, GatewayMAC: net.HardwareAddr{0x0a, 0, 0, 0, 0, 1},
	GatewayIP: net.ParseIP("10.244.1.1"), PodCIDR: cidr("10.244.1.0/24"), NodeIP: net.ParseIP("198.18.0.11"), TunnelPort: 1}

// fixture: three local Pods and a peer group of two remote Pods.
//
//	default/a 10.244.1.3 ofport 3
//	default/b 10.244.1.4 ofport 4  http=TCP/8080
//	default/c 10.244.1.5 ofport 5  http=TCP/9090, metrics=UDP/9100
//	peers "g-peers": default/x 10.244.2.10 (dns=UDP/53), default/y 10.244.2.11 (dns=UDP/5353)
func fixture() *MapSource {
	pods := map[string]Pod{}
	for i, n := range []string{"a", "b", "c"} {
		pods["default/"+n] = Pod{Namespace: "default", Name: n, OFPort: uint32(3 + i), IP: net.ParseIP(fmt.Sprintf("10.244.1.%d", 3+i))}
	}
	return &MapSource{
		Pods: pods,
		AppliedToGroups: map[string][]v1alpha1.GroupMember{
			"g-all": {
				{Namespace: "default", Name: "a", IPs: []string{"10.244.1.3"}},
				{Namespace: "default", Name: "b", IPs: []string{"10.244.1.4"}, Ports: []v1alpha1.NamedPort{{Name: "http", Protocol: "TCP", Port: 8080}}},
				{Namespace: "default", Name: "c", IPs: []string{"10.244.1.5"}, Ports: []v1alpha1.NamedPort{
					{Name: "http", Protocol: "TCP", Port: 9090}, {Name: "metrics", Protocol: "UDP", Port: 9100}}},
			},
			"g-a": {{Namespace: "default", Name: "a", IPs: []string{"10.244.1.3"}}},
			// a member that is not attached here yet
			"g-remote": {{Namespace: "default", Name: "zz", IPs: []string{"10.244.1.99"}}},
		},
		AddressGroups: map[string][]v1alpha1.GroupMember{
			"g-peers": {
				{Namespace: "default", Name: "x", IPs: []string{"10.244.2.10"}, Ports: []v1alpha1.NamedPort{{Name: "dns", Protocol: "UDP", Port: 53}}},
				{Namespace: "default", Name: "y", IPs: []string{"10.244.2.11"}, Ports: []v1alpha1.NamedPort{{Name: "dns", Protocol: "UDP", Port: 5353}}},
			},
		},
	}
}

func policy(name, atg string, types []string, rules ...v1alpha1.Rule) *v1alpha1.NetworkPolicy {
	return &v1alpha1.NetworkPolicy{ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec: v1alpha1.NetworkPolicySpec{AppliedToGroup: atg, PolicyTypes: types, Rules: rules}}
}

func port(proto string, p int32) v1alpha1.PolicyPort {
	v := intstr.FromInt32(p)
	return v1alpha1.PolicyPort{Protocol: proto, Port: &v}
}

func named(proto, name string) v1alpha1.PolicyPort {
	v := intstr.FromString(name)
	return v1alpha1.PolicyPort{Protocol: proto, Port: &v}
}

func portRange(proto string, lo, hi int32) v1alpha1.PolicyPort {
	p := port(proto, lo)
	p.EndPort = &hi
	return p
}

func translate(t *testing.T, src Source, ids IDs, nps ...*v1alpha1.NetworkPolicy) evalSet {
	t.Helper()
	sets := [][]of.Flow{pipeline.PolicyBaseFlows(testBridge)}
	var trs []Policy
	for i, np := range nps {
		tr := Translate(np, pipeline.Cookie(1, pipeline.CategoryPolicy, uint64(i+1)), src, ids)
		if len(tr.Warnings) > 0 {
			t.Logf("%s: warnings %v", np.Name, tr.Warnings)
		}
		sets = append(sets, tr.Flows)
		trs = append(trs, tr)
	}
	return evalSet{flows: MergeAll(sets...), iso: isolations(trs...)}
}

func in(src *MapSource, to string, from string, proto uint8, dport uint16) packet {
	p := src.Pods["default/"+to]
	return packet{outPort: p.OFPort, src: net.ParseIP(from), dst: p.IP, proto: proto, dport: dport, source: pipeline.FromTunnel}
}

func out(src *MapSource, from string, to string, proto uint8, dport uint16) packet {
	p := src.Pods["default/"+from]
	return packet{inPort: p.OFPort, src: p.IP, dst: net.ParseIP(to), proto: proto, dport: dport, source: pipeline.FromPod}
}

type verdictCase struct {
	name  string
	table pipeline.Table
	pkt   packet
	want  bool
}

func checkVerdicts(t *testing.T, fs evalSet, cases []verdictCase) {
	t.Helper()
	for _, c := range cases {
		if got := passes(fs, c.table, c.pkt); got != c.want {
			t.Errorf("%s: allowed=%v, want %v", c.name, got, c.want)
		}
	}
}

func TestDefaultDeny(t *testing.T) {
	src := fixture()
	fs := translate(t, src, NewAllocator[ConjKey](0),
		policy("deny-in", "g-a", []string{"Ingress"}),
		policy("deny-out", "g-all", []string{"Egress"}))
	checkVerdicts(t, fs, []verdictCase{
		{"ingress to isolated a", pipeline.IngressRule, in(src, "a", "10.244.2.10", ProtoTCP, 80), false},
		{"ingress to non-isolated b", pipeline.IngressRule, in(src, "b", "10.244.2.10", ProtoTCP, 80), true},
		{"egress from isolated b", pipeline.EgressRule, out(src, "b", "10.244.2.10", ProtoTCP, 80), false},
		{"established ingress to a passes", pipeline.IngressRule, func() packet { p := in(src, "a", "10.244.2.10", ProtoTCP, 80); p.est = true; return p }(), true},
		{"established egress from b passes", pipeline.EgressRule, func() packet { p := out(src, "b", "10.244.2.10", ProtoTCP, 80); p.est = true; return p }(), true},
		{"host (gateway IP) to a passes", pipeline.IngressRule, packet{outPort: 3, src: net.ParseIP("10.244.1.1"), dst: net.ParseIP("10.244.1.3"), proto: ProtoTCP, dport: 8080, source: pipeline.FromGateway}, true},
		{"host (Node IP) to a passes", pipeline.IngressRule, packet{outPort: 3, src: net.ParseIP("198.18.0.11"), dst: net.ParseIP("10.244.1.3"), proto: ProtoTCP, dport: 8080, source: pipeline.FromGateway}, true},
		{"gateway IP via the tunnel is not exempt", pipeline.IngressRule, packet{outPort: 3, src: net.ParseIP("10.244.1.1"), dst: net.ParseIP("10.244.1.3"), proto: ProtoTCP, dport: 8080, source: pipeline.FromTunnel}, false},
		// A Pod reaching itself through a Service (the DNAT commit set the
		// hairpin bit) passes its own isolation both ways.
		{"isolated a reaching itself through a Service", pipeline.IngressRule, packet{inPort: 3, outPort: 3, src: net.ParseIP("10.244.1.3"), dst: net.ParseIP("10.244.1.3"), proto: ProtoUDP, dport: 53, source: pipeline.FromPod, ctMark: pipeline.CtMarkHairpin}, true},
		{"isolated b reaching itself through a Service", pipeline.EgressRule, packet{inPort: 4, outPort: 4, src: net.ParseIP("10.244.1.4"), dst: net.ParseIP("10.244.1.4"), proto: ProtoTCP, dport: 80, source: pipeline.FromPod, ctMark: pipeline.CtMarkHairpin}, true},
		{"the hairpin bit from the tunnel is not exempt", pipeline.IngressRule, packet{outPort: 3, src: net.ParseIP("10.244.1.3"), dst: net.ParseIP("10.244.1.3"), proto: ProtoTCP, dport: 80, source: pipeline.FromTunnel, ctMark: pipeline.CtMarkHairpin}, false},
		{"other ct_mark bits are not exempt", pipeline.IngressRule, packet{inPort: 4, outPort: 3, src: net.ParseIP("10.244.1.4"), dst: net.ParseIP("10.244.1.3"), proto: ProtoTCP, dport: 80, source: pipeline.FromPod, ctMark: pipeline.CtMarkExternal | pipeline.CtMarkServiceSNAT}, false},
	})
	// Default deny costs the policies no flow: the only default-table
	// flows are the two fixed drops of PolicyBaseFlows, and the isolation
	// is reported per Pod instead.
	n := 0
	for _, f := range fs.flows {
		if f.Table == uint8(pipeline.IngressDefault) || f.Table == uint8(pipeline.EgressDefault) {
			n++
			if len(f.Actions) != 0 || f.Priority != pipeline.PrioPolicyDefault || f.Cookie != pipeline.Cookie(1, pipeline.CategoryPolicy, 0) {
				t.Errorf("default flow %v %v is not a fixed drop at PrioPolicyDefault", f.Match, f.Actions)
			}
		}
	}
	if n != 2 {
		t.Errorf("%d default-deny flows, want the 2 fixed ones", n)
	}
	want := map[uint32]isolation{3: {ingress: true, egress: true}, 4: {egress: true}, 5: {egress: true}}
	if !reflect.DeepEqual(fs.iso, want) {
		t.Errorf("isolation by ofport %v, want %v", fs.iso, want)
	}
	tr := Translate(policy("both", "g-a", []string{"Ingress", "Egress"}), 1, src, NewAllocator[ConjKey](0))
	if !tr.Ingress || !tr.Egress || len(tr.Flows) != 0 || len(tr.Targets) != 1 {
		t.Errorf("deny-all policy: ingress %v egress %v, %d flows, targets %v", tr.Ingress, tr.Egress, len(tr.Flows), tr.Targets)
	}
}

func TestAllowByPeersAndPorts(t *testing.T) {
	src := fixture()
	fs := translate(t, src, NewAllocator[ConjKey](0),
		policy("web", "g-all", []string{"Ingress"},
			v1alpha1.Rule{Direction: v1alpha1.DirectionIn, AddressGroups: []string{"g-peers"},
				Ports: []v1alpha1.PolicyPort{port("TCP", 80), portRange("UDP", 1000, 1999), port("SCTP", 7777), {Protocol: "UDP"}}[:3]},
			v1alpha1.Rule{Direction: v1alpha1.DirectionIn,
				IPBlocks: []v1alpha1.IPBlock{{CIDR: "172.16.0.0/12", Except: []string{"172.16.5.0/24"}}},
				Ports:    []v1alpha1.PolicyPort{{Protocol: "UDP"}}}))
	checkVerdicts(t, fs, []verdictCase{
		{"peer x tcp/80", pipeline.IngressRule, in(src, "a", "10.244.2.10", ProtoTCP, 80), true},
		{"peer y tcp/80", pipeline.IngressRule, in(src, "c", "10.244.2.11", ProtoTCP, 80), true},
		{"peer x tcp/81", pipeline.IngressRule, in(src, "a", "10.244.2.10", ProtoTCP, 81), false},
		{"peer x udp/80", pipeline.IngressRule, in(src, "a", "10.244.2.10", ProtoUDP, 80), false},
		{"non-peer tcp/80", pipeline.IngressRule, in(src, "a", "10.244.2.12", ProtoTCP, 80), false},
		{"peer udp 1000", pipeline.IngressRule, in(src, "b", "10.244.2.10", ProtoUDP, 1000), true},
		{"peer udp 1500", pipeline.IngressRule, in(src, "b", "10.244.2.10", ProtoUDP, 1500), true},
		{"peer udp 1999", pipeline.IngressRule, in(src, "b", "10.244.2.10", ProtoUDP, 1999), true},
		{"peer udp 999", pipeline.IngressRule, in(src, "b", "10.244.2.10", ProtoUDP, 999), false},
		{"peer udp 2000", pipeline.IngressRule, in(src, "b", "10.244.2.10", ProtoUDP, 2000), false},
		{"peer sctp 7777", pipeline.IngressRule, in(src, "b", "10.244.2.10", ProtoSCTP, 7777), true},
		{"peer tcp 7777", pipeline.IngressRule, in(src, "b", "10.244.2.10", ProtoTCP, 7777), false},
		{"ipBlock udp any port", pipeline.IngressRule, in(src, "a", "172.20.1.1", ProtoUDP, 4242), true},
		{"ipBlock tcp", pipeline.IngressRule, in(src, "a", "172.20.1.1", ProtoTCP, 4242), false},
		{"ipBlock except", pipeline.IngressRule, in(src, "a", "172.16.5.9", ProtoUDP, 4242), false},
		{"ipBlock edge inside", pipeline.IngressRule, in(src, "a", "172.16.6.0", ProtoUDP, 4242), true},
		{"outside ipBlock", pipeline.IngressRule, in(src, "a", "172.32.0.1", ProtoUDP, 4242), false},
	})
}

func TestNamedPortsPerPod(t *testing.T) {
	src := fixture()
	ids := NewAllocator[ConjKey](0)
	np := policy("named", "g-all", []string{"Ingress", "Egress"},
		v1alpha1.Rule{Direction: v1alpha1.DirectionIn, AllPeers: true, Ports: []v1alpha1.PolicyPort{named("TCP", "http")}},
		v1alpha1.Rule{Direction: v1alpha1.DirectionOut, AddressGroups: []string{"g-peers"}, Ports: []v1alpha1.PolicyPort{named("UDP", "dns")}})
	fs := translate(t, src, ids, np)
	checkVerdicts(t, fs, []verdictCase{
		{"b http=8080", pipeline.IngressRule, in(src, "b", "10.0.0.1", ProtoTCP, 8080), true},
		{"b 9090 is not its http", pipeline.IngressRule, in(src, "b", "10.0.0.1", ProtoTCP, 9090), false},
		{"c http=9090", pipeline.IngressRule, in(src, "c", "10.0.0.1", ProtoTCP, 9090), true},
		{"c 8080 is not its http", pipeline.IngressRule, in(src, "c", "10.0.0.1", ProtoTCP, 8080), false},
		{"a has no http", pipeline.IngressRule, in(src, "a", "10.0.0.1", ProtoTCP, 8080), false},
		{"egress to x dns=53", pipeline.EgressRule, out(src, "a", "10.244.2.10", ProtoUDP, 53), true},
		{"egress to x 5353", pipeline.EgressRule, out(src, "a", "10.244.2.10", ProtoUDP, 5353), false},
		{"egress to y dns=5353", pipeline.EgressRule, out(src, "a", "10.244.2.11", ProtoUDP, 5353), true},
		{"egress to y 53", pipeline.EgressRule, out(src, "a", "10.244.2.11", ProtoUDP, 53), false},
		{"egress to y tcp 5353", pipeline.EgressRule, out(src, "a", "10.244.2.11", ProtoTCP, 5353), false},
	})
	tr := Translate(np, 1, src, ids)
	want := []ConjKey{{"named", 0, "TCP/8080"}, {"named", 0, "TCP/9090"}, {"named", 1, "UDP/53"}, {"named", 1, "UDP/5353"}}
	if !reflect.DeepEqual(tr.Conj, want) {
		t.Errorf("conjunctions %v, want %v", tr.Conj, want)
	}
}

// WithinIPBlocks keeps only the group members inside the blocks: x
// (10.244.2.10) is in 10.244.2.10/32, y is not.
func TestWithinIPBlocks(t *testing.T) {
	src := fixture()
	ids := NewAllocator[ConjKey](0)
	np := policy("within", "g-all", []string{"Egress"},
		v1alpha1.Rule{Direction: v1alpha1.DirectionOut, AddressGroups: []string{"g-peers"}, Ports: []v1alpha1.PolicyPort{named("UDP", "dns")},
			WithinIPBlocks: []v1alpha1.IPBlock{{CIDR: "10.244.2.0/24", Except: []string{"10.244.2.11/32"}}}})
	fs := translate(t, src, ids, np)
	checkVerdicts(t, fs, []verdictCase{
		{"egress to x dns=53", pipeline.EgressRule, out(src, "a", "10.244.2.10", ProtoUDP, 53), true},
		{"y is outside the block", pipeline.EgressRule, out(src, "a", "10.244.2.11", ProtoUDP, 5353), false},
		{"the block alone allows nothing", pipeline.EgressRule, out(src, "a", "10.244.2.12", ProtoUDP, 53), false},
	})
}

func TestNamedPortCoveringAllPodsJoinsMainConjunction(t *testing.T) {
	src := fixture()
	src.AppliedToGroups["g-bc"] = src.AppliedToGroups["g-all"][1:]
	src.AppliedToGroups["g-bc"][1].Ports = []v1alpha1.NamedPort{{Name: "http", Protocol: "TCP", Port: 8080}}
	tr := Translate(policy("p", "g-bc", []string{"Ingress"},
		v1alpha1.Rule{Direction: v1alpha1.DirectionIn, AllPeers: true, Ports: []v1alpha1.PolicyPort{named("TCP", "http"), port("TCP", 443)}}),
		1, src, NewAllocator[ConjKey](0))
	if len(tr.Conj) != 1 || tr.Conj[0].Split != "" {
		t.Fatalf("conjunctions %v, want the main one only", tr.Conj)
	}
	// 2 Pod flows + 2 port flows + conj_id.
	if len(tr.Flows) != 5 {
		t.Errorf("%d flows, want 5:\n%s", len(tr.Flows), dump(tr.Flows))
	}
}

func dump(fs []of.Flow) string {
	var b strings.Builder
	for _, f := range fs {
		fmt.Fprintf(&b, "table=%d,priority=%d,%v actions=%#v\n", f.Table, f.Priority, f.Match, f.Actions)
	}
	return b.String()
}

func TestSharedFlowsCarrySeveralConjunctions(t *testing.T) {
	src := fixture()
	ids := NewAllocator[ConjKey](0)
	np := policy("two", "g-all", []string{"Ingress"},
		v1alpha1.Rule{Direction: v1alpha1.DirectionIn, AddressGroups: []string{"g-peers"}, Ports: []v1alpha1.PolicyPort{port("TCP", 80)}},
		v1alpha1.Rule{Direction: v1alpha1.DirectionIn, AddressGroups: []string{"g-peers"}, Ports: []v1alpha1.PolicyPort{port("TCP", 443)}})
	tr := Translate(np, 1, src, ids)
	// 3 Pods + 2 peers + 2 ports + 2 conj_id: the Pod and peer flows are
	// shared by both rules.
	if len(tr.Flows) != 9 {
		t.Fatalf("%d flows, want 9:\n%s", len(tr.Flows), dump(tr.Flows))
	}
	for _, f := range tr.Flows {
		if f.Match.IPSrc != nil || len(f.Match.Regs) > 0 && f.Table == uint8(pipeline.IngressRule) {
			if len(f.Actions) != 2 {
				t.Errorf("shared flow %v has actions %v, want two conjunctions", f.Match, f.Actions)
			}
		}
	}
	// Across policies too: a second policy with the same peers adds no
	// peer flow, only conjunction actions.
	np2 := policy("other", "g-a", []string{"Ingress"},
		v1alpha1.Rule{Direction: v1alpha1.DirectionIn, AddressGroups: []string{"g-peers"}, Ports: []v1alpha1.PolicyPort{port("UDP", 53)}})
	tr2 := Translate(np2, 2, src, ids)
	merged := MergeAll(tr.Flows, tr2.Flows)
	// new: 1 port flow + 1 conj_id; the Pod a flow and the peers are
	// shared.
	if len(merged) != len(tr.Flows)+2 {
		t.Fatalf("merged %d flows, want %d:\n%s", len(merged), len(tr.Flows)+2, dump(merged))
	}
	for _, f := range merged {
		if f.Match.IPSrc == nil {
			continue
		}
		if len(f.Actions) != 3 {
			t.Errorf("peer flow %v: %v, want three conjunctions", f.Match, f.Actions)
		}
		if f.Cookie != 1 {
			t.Errorf("merged flow cookie %d, want the lowest (1)", f.Cookie)
		}
	}
}

func TestPlainAllowAndUnion(t *testing.T) {
	src := fixture()
	fs := translate(t, src, NewAllocator[ConjKey](0),
		policy("narrow", "g-all", []string{"Ingress"},
			v1alpha1.Rule{Direction: v1alpha1.DirectionIn, AddressGroups: []string{"g-peers"}, Ports: []v1alpha1.PolicyPort{port("TCP", 80)}}),
		policy("open-a", "g-a", []string{"Ingress"}, v1alpha1.Rule{Direction: v1alpha1.DirectionIn, AllPeers: true}),
		// An egress rule is ignored when Egress is not a policy type.
		policy("ignored", "g-all", []string{"Ingress"}, v1alpha1.Rule{Direction: v1alpha1.DirectionOut, AllPeers: true}))
	checkVerdicts(t, fs, []verdictCase{
		{"a is open to all", pipeline.IngressRule, in(src, "a", "1.2.3.4", ProtoUDP, 9), true},
		{"b only to peers tcp/80", pipeline.IngressRule, in(src, "b", "1.2.3.4", ProtoTCP, 80), false},
		{"b from peer tcp/80", pipeline.IngressRule, in(src, "b", "10.244.2.11", ProtoTCP, 80), true},
		{"egress not isolated", pipeline.EgressRule, out(src, "b", "1.2.3.4", ProtoTCP, 80), true},
	})
	for _, f := range fs.flows {
		if f.Priority == pipeline.PrioPolicyAllow && (f.Match.Regs == nil || len(f.Actions) != 1) {
			t.Errorf("unexpected plain allow %v %v", f.Match, f.Actions)
		}
	}
}

func TestUnattachedTargetsAndEmptyPeers(t *testing.T) {
	src := fixture()
	tr := Translate(policy("remote", "g-remote", []string{"Ingress"}, v1alpha1.Rule{Direction: v1alpha1.DirectionIn, AllPeers: true}),
		1, src, NewAllocator[ConjKey](0))
	if len(tr.Flows) != 0 || len(tr.Targets) != 0 {
		t.Errorf("policy without attached targets: %d flows, targets %v", len(tr.Flows), tr.Targets)
	}
	// A rule whose peer group is empty allows nothing and costs nothing.
	tr = Translate(policy("empty", "g-a", []string{"Ingress"},
		v1alpha1.Rule{Direction: v1alpha1.DirectionIn, AddressGroups: []string{"g-none"}}), 1, src, NewAllocator[ConjKey](0))
	if len(tr.Flows) != 0 || len(tr.Conj) != 0 || len(tr.Targets) != 1 || !tr.Ingress {
		t.Errorf("empty peers: %d flows (want none: a is only isolated), conj %v, targets %v:\n%s",
			len(tr.Flows), tr.Conj, tr.Targets, dump(tr.Flows))
	}
}

func TestConjIDsAreStable(t *testing.T) {
	src := fixture()
	ids := NewAllocator[ConjKey](0)
	np := policy("p", "g-all", []string{"Ingress"},
		v1alpha1.Rule{Direction: v1alpha1.DirectionIn, AddressGroups: []string{"g-peers"}, Ports: []v1alpha1.PolicyPort{port("TCP", 80)}})
	a := Translate(np, 1, src, ids)
	b := Translate(np, 1, src, ids)
	if !reflect.DeepEqual(a.Flows, b.Flows) {
		t.Fatal("translating twice gave different flows")
	}
	id, _ := ids.Lookup(ConjKey{"p", 0, ""})
	ids.Release(ConjKey{"p", 0, ""})
	other, _ := ids.Get(ConjKey{"q", 0, ""})
	if other == id {
		t.Errorf("released ID %d reused at once", id)
	}
}

func TestAllocatorReusesOnlyAfterFree(t *testing.T) {
	a := NewAllocator[string](3)
	x, _ := a.Get("x")
	y, _ := a.Get("y")
	z, _ := a.Get("z")
	if _, ok := a.Get("w"); ok {
		t.Fatal("allocated beyond max")
	}
	a.Release("y")
	a.Release("x")
	if w, _ := a.Get("w"); w != y {
		t.Errorf("got %d, want the oldest freed %d", w, y)
	}
	if v, _ := a.Get("v"); v != x {
		t.Errorf("got %d, want %d", v, x)
	}
	if again, _ := a.Get("z"); again != z || a.Len() != 3 {
		t.Errorf("z changed ID or Len wrong")
	}
}

// ConjIDs fills band 0 first, then the next band with room; a freed ID
// makes room in its band again.
func TestConjIDsFillBandsInOrder(t *testing.T) {
	c := NewConjIDs(2, 2)
	key := func(i int) ConjKey { return ConjKey{Policy: "p", Rule: i} }
	want := []uint32{1, 2, 1<<pipeline.ConjBandShift | 1, 1<<pipeline.ConjBandShift | 2}
	for i, w := range want {
		if id, ok := c.Get(key(i)); !ok || id != w {
			t.Fatalf("key %d: got %#x %v, want %#x", i, id, ok, w)
		}
	}
	if _, ok := c.Get(key(4)); ok {
		t.Fatal("allocated beyond the last band")
	}
	if id, ok := c.Get(key(2)); !ok || id != want[2] {
		t.Errorf("a known key changed ID: %#x", id)
	}
	c.Release(key(0))
	if id, ok := c.Get(key(5)); !ok || id>>pipeline.ConjBandShift != 0 {
		t.Errorf("after a release in band 0: got %#x %v, want an ID of band 0", id, ok)
	}
	if id, ok := c.Lookup(key(3)); !ok || id != want[3] || c.Len() != 4 {
		t.Errorf("Lookup %#x %v, Len %d", id, ok, c.Len())
	}
	// Keep frees a policy's other IDs, however they were allocated.
	c.Keep("p", []ConjKey{key(1), key(5)})
	if c.Len() != 2 {
		t.Errorf("after Keep: %d IDs in use, want 2", c.Len())
	}
	c.Keep("p", nil)
	if c.Len() != 0 {
		t.Errorf("after Keep of nothing: %d IDs in use", c.Len())
	}
	if prio, ok := pipeline.PolicyRulePriority(want[3]); !ok || prio != pipeline.PrioPolicyRule-1 {
		t.Errorf("band 1 priority %d %v", prio, ok)
	}
	if _, ok := pipeline.PolicyRulePriority(pipeline.ConjBands << pipeline.ConjBandShift); ok {
		t.Error("an ID past the last band has a priority")
	}
}

// Many rules sharing one port, peers and Pods, translated with bands of
// two conjunctions: no flow carries more than two conjunction actions,
// and every packet gets the verdict it gets without bands (the lookup
// falls through to lower priorities when no conjunction completes).
func TestBandsKeepEveryVerdict(t *testing.T) {
	src := fixture()
	var nps []*v1alpha1.NetworkPolicy
	for i := 0; i < 6; i++ {
		peers := []string{"g-peers", "g-other"}[i%2]
		nps = append(nps, policy(fmt.Sprintf("np%d", i), []string{"g-a", "g-all"}[i%2], []string{"Ingress", "Egress"},
			v1alpha1.Rule{Direction: v1alpha1.DirectionIn, AddressGroups: []string{peers}, Ports: []v1alpha1.PolicyPort{port("TCP", 80)}},
			v1alpha1.Rule{Direction: v1alpha1.DirectionIn, AddressGroups: []string{peers}, Ports: []v1alpha1.PolicyPort{port("UDP", int32(1000+i))}},
			v1alpha1.Rule{Direction: v1alpha1.DirectionOut, AddressGroups: []string{peers}, Ports: []v1alpha1.PolicyPort{port("TCP", int32(8000+i))}}))
	}
	src.AddressGroups["g-other"] = []v1alpha1.GroupMember{{IPs: []string{"10.244.2.11"}}, {IPs: []string{"10.244.3.5"}}}
	plain := translate(t, src, NewAllocator[ConjKey](0), nps...)
	banded := translate(t, src, NewConjIDs(2, pipeline.ConjBands), nps...)
	prios := map[uint16]bool{}
	for _, f := range banded.flows {
		n := 0
		for _, a := range f.Actions {
			if _, ok := a.(of.Conjunction); ok {
				n++
			}
		}
		if n > 2 {
			t.Errorf("flow %v carries %d conjunction actions, the band holds 2", f.Match, n)
		}
		if n > 0 {
			prios[f.Priority] = true
		}
	}
	if len(prios) < 5 {
		t.Fatalf("conjunctions at %d priorities: the bands were not exercised", len(prios))
	}
	checked, allowed := 0, 0
	for _, pod := range []string{"a", "b", "c"} {
		for _, peer := range []string{"10.244.2.10", "10.244.2.11", "10.244.3.5", "10.244.9.9"} {
			for _, pp := range []struct {
				proto uint8
				port  uint16
			}{{ProtoTCP, 80}, {ProtoTCP, 81}, {ProtoUDP, 1000}, {ProtoUDP, 1003}, {ProtoUDP, 1006}, {ProtoTCP, 8001}, {ProtoTCP, 8004}} {
				for _, c := range []struct {
					table pipeline.Table
					pkt   packet
				}{{pipeline.IngressRule, in(src, pod, peer, pp.proto, pp.port)}, {pipeline.EgressRule, out(src, pod, peer, pp.proto, pp.port)}} {
					want := passes(plain, c.table, c.pkt)
					if got := passes(banded, c.table, c.pkt); got != want {
						t.Errorf("%s %s %s %d/%d: banded %v, unbanded %v", c.table, pod, peer, pp.proto, pp.port, got, want)
					}
					checked++
					if want {
						allowed++
					}
				}
			}
		}
	}
	if allowed == 0 || allowed == checked {
		t.Fatalf("%d of %d packets allowed: the comparison says nothing", allowed, checked)
	}
}

func TestSubtractCIDRs(t *testing.T) {
	got, err := SubtractCIDRs("10.0.0.0/8", []string{"10.1.0.0/16", "192.168.0.0/16"})
	if err != nil {
		t.Fatal(err)
	}
	var s []string
	for _, n := range got {
		s = append(s, n.String())
	}
	want := "10.0.0.0/16 10.2.0.0/15 10.4.0.0/14 10.8.0.0/13 10.16.0.0/12 10.32.0.0/11 10.64.0.0/10 10.128.0.0/9"
	if strings.Join(s, " ") != want {
		t.Errorf("got %v, want %s", s, want)
	}
	// Exhaustive check on a small block with several excepts.
	got, _ = SubtractCIDRs("192.0.2.0/24", []string{"192.0.2.7/32", "192.0.2.64/27", "192.0.2.200/30"})
	for i := 0; i < 256; i++ {
		ip := net.IPv4(192, 0, 2, byte(i))
		excluded := i == 7 || (i >= 64 && i < 96) || (i >= 200 && i < 204)
		covered := 0
		for _, n := range got {
			if n.Contains(ip) {
				covered++
			}
		}
		if excluded && covered != 0 || !excluded && covered != 1 {
			t.Errorf("%s: covered %d times, excluded %v", ip, covered, excluded)
		}
	}
	if got, _ := SubtractCIDRs("10.0.0.0/24", []string{"10.0.0.0/16"}); len(got) != 0 {
		t.Errorf("fully excepted block gave %v", got)
	}
	if got, _ := SubtractCIDRs("fd00::/64", nil); got != nil {
		t.Errorf("IPv6 gave %v", got)
	}
	if _, err := SubtractCIDRs("10.0.0.0/33", nil); err == nil {
		t.Error("malformed CIDR accepted")
	}
	// Leading zeros, which API servers before 1.33 admitted, read as
	// decimal.
	if got, err := SubtractCIDRs("010.000.002.000/24", []string{"010.0.2.128/25"}); err != nil || len(got) != 1 || got[0].String() != "10.0.2.0/25" {
		t.Errorf("leading zeros: %v, %v; want 10.0.2.0/25", got, err)
	}
}

func TestPortRange(t *testing.T) {
	for _, c := range []struct{ lo, hi uint16 }{{1000, 1999}, {0, 0}, {80, 80}, {1, 65535}, {0, 32767}, {32768, 65535}, {5, 6}} {
		pms := PortRange(c.lo, c.hi)
		for p := 0; p <= 65535; p++ {
			hit := 0
			for _, m := range pms {
				if uint16(p)&m.Mask == m.Port&m.Mask {
					hit++
				}
			}
			inside := p >= int(c.lo) && p <= int(c.hi)
			if inside && hit != 1 || !inside && hit != 0 {
				t.Fatalf("range %d-%d: port %d matched %d times", c.lo, c.hi, p, hit)
			}
		}
	}
	if n := len(PortRange(1000, 1999)); n > 2*16 {
		t.Errorf("1000-1999 took %d masks", n)
	}
	if PortRange(0, 65535) != nil {
		t.Error("full range should be nil (no port match)")
	}
}

// TestFlowEconomy: a policy selecting 100 local Pods, with one rule whose
// peers are a 100-Pod group and whose ports are 3, costs |pods| + |peers| +
// |ports| + 1 flows for the rule (never the product) and nothing for the
// default deny (the Pods' own flows carry their isolation, and the drop is
// one fixed flow per direction): fewer than 250 flows in all, and still so
// counting the fixed flows of PolicyBaseFlows.
func TestFlowEconomy(t *testing.T) {
	src, np := economyPolicy("eco", 100, 100)
	tr := Translate(np, 1, src, NewAllocator[ConjKey](0))
	rule := 0
	for _, f := range tr.Flows {
		if f.Table == uint8(pipeline.IngressRule) {
			rule++
		}
	}
	base := len(pipeline.PolicyBaseFlows(testBridge))
	t.Logf("rule flows %d, policy total %d, with the %d fixed policy flows %d", rule, len(tr.Flows), base, len(tr.Flows)+base)
	if rule != 100+100+3+1 {
		t.Errorf("rule flows %d, want 204", rule)
	}
	if len(tr.Flows) >= 250 || len(tr.Flows)+base >= 250 {
		t.Errorf("policy costs %d flows (%d with the fixed ones), want < 250", len(tr.Flows), len(tr.Flows)+base)
	}
	if len(tr.Flows) != rule {
		t.Errorf("total %d, want only the rule flows (%d)", len(tr.Flows), rule)
	}
	if len(tr.Targets) != 100 || !tr.Ingress || tr.Egress {
		t.Errorf("%d targets, ingress %v, egress %v; want 100 isolated for ingress only", len(tr.Targets), tr.Ingress, tr.Egress)
	}
}

// economyPolicy builds nPods local targets and a peer group of nPeers with
// one ingress rule on 3 ports.
func economyPolicy(name string, nPods, nPeers int) (*MapSource, *v1alpha1.NetworkPolicy) {
	src := &MapSource{Pods: map[string]Pod{}, AppliedToGroups: map[string][]v1alpha1.GroupMember{},
		AddressGroups: map[string][]v1alpha1.GroupMember{}}
	for i := 0; i < nPods; i++ {
		n := fmt.Sprintf("t%d", i)
		ip := fmt.Sprintf("10.244.1.%d", i+2)
		src.Pods["ns/"+n] = Pod{Namespace: "ns", Name: n, OFPort: uint32(10 + i), IP: net.ParseIP(ip)}
		src.AppliedToGroups["targets"] = append(src.AppliedToGroups["targets"], v1alpha1.GroupMember{Namespace: "ns", Name: n, IPs: []string{ip}})
	}
	for i := 0; i < nPeers; i++ {
		src.AddressGroups["peers"] = append(src.AddressGroups["peers"],
			v1alpha1.GroupMember{Namespace: "ns", Name: fmt.Sprintf("p%d", i), IPs: []string{fmt.Sprintf("10.245.%d.%d", i/250, i%250+1)}})
	}
	return src, policy(name, "targets", []string{"Ingress"}, v1alpha1.Rule{Direction: v1alpha1.DirectionIn,
		AddressGroups: []string{"peers"}, Ports: []v1alpha1.PolicyPort{port("TCP", 80), port("TCP", 443), port("UDP", 53)}})
}
