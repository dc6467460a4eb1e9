package netpol

import (
	"fmt"
	"net"
	"testing"

	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// testState is the model with Pod j of namespace i on Node (i+j)%3 and IP
// 10.244.<node>.<10+3i+j>.
func testState() *State {
	ips, nodes := map[PodID]net.IP{}, map[PodID]string{}
	for i, ns := range Namespaces() {
		for j, name := range PodNames() {
			n := NodeOf(i, j, 3)
			ips[PodID{ns, name}] = net.IPv4(10, 244, byte(n), byte(10+3*i+j)).To4()
			nodes[PodID{ns, name}] = fmt.Sprintf("node-%d", n+1)
		}
	}
	return NewModelState(ips, nodes)
}

func pod(s *State, ns, name string) *Pod { return s.Pod(PodID{ns, name}) }

func TestEvaluateHandChecked(t *testing.T) {
	s := testState()
	xa, xb, xc, ya, yb, za := pod(s, "x", "a"), pod(s, "x", "b"), pod(s, "x", "c"), pod(s, "y", "a"), pod(s, "y", "b"), pod(s, "z", "a")
	type conn struct {
		from, to *Pod
		port     int32
		proto    corev1.Protocol
		want     bool
	}
	cases := []struct {
		name  string
		pols  []*networkingv1.NetworkPolicy
		conns []conn
	}{
		{"no policy allows everything", nil, []conn{{xa, yb, 80, tcp, true}, {yb, xa, 81, udp, true}}},
		{"deny ingress isolates only the selected direction",
			[]*networkingv1.NetworkPolicy{NewPolicy("x", "p", Labels(), Ingress())},
			[]conn{{ya, xa, 80, tcp, false}, {xb, xa, 80, tcp, false}, {xa, ya, 80, tcp, true}, {ya, yb, 80, tcp, true}}},
		{"implied policyTypes: rules-less spec is ingress-only",
			[]*networkingv1.NetworkPolicy{{ObjectMeta: metav1.ObjectMeta{Namespace: "x", Name: "p"}}},
			[]conn{{ya, xa, 80, tcp, false}, {xa, ya, 80, tcp, true}}},
		{"implied policyTypes: egress rules imply Egress",
			[]*networkingv1.NetworkPolicy{{ObjectMeta: metav1.ObjectMeta{Namespace: "x", Name: "p"},
				Spec: networkingv1.NetworkPolicySpec{PodSelector: Labels(LabelPod, "a"),
					Egress: []networkingv1.NetworkPolicyEgressRule{To(Peers(PodPeer(Labels(LabelPod, "b"))))}}}},
			// Ingress is implied too, with no rules: x/a accepts nothing.
			[]conn{{xa, xb, 80, tcp, true}, {xa, xc, 80, tcp, false}, {xb, xa, 80, tcp, false}}},
		{"explicit Egress type ignores ingress isolation",
			[]*networkingv1.NetworkPolicy{NewPolicy("x", "p", Labels(LabelPod, "a"), Egress())},
			[]conn{{xb, xa, 80, tcp, true}, {xa, xb, 80, tcp, false}}},
		{"podSelector peer is namespace-local",
			[]*networkingv1.NetworkPolicy{NewPolicy("x", "p", Labels(LabelPod, "a"), Ingress(From(Peers(PodPeer(Labels(LabelPod, "b"))))))},
			[]conn{{xb, xa, 80, tcp, true}, {yb, xa, 80, tcp, false}, {xc, xa, 80, tcp, false}}},
		{"namespaceSelector with podSelector is an AND",
			[]*networkingv1.NetworkPolicy{NewPolicy("x", "p", Labels(LabelPod, "a"), Ingress(From(Peers(NSPodPeer(Labels(LabelNS, "y"), Labels(LabelPod, "b"))))))},
			[]conn{{yb, xa, 80, tcp, true}, {ya, xa, 80, tcp, false}, {xb, xa, 80, tcp, false}}},
		{"two peers are an OR",
			[]*networkingv1.NetworkPolicy{NewPolicy("x", "p", Labels(LabelPod, "a"), Ingress(From(Peers(NSPeer(Labels(LabelNS, "y")), PodPeer(Labels(LabelPod, "b"))))))},
			[]conn{{yb, xa, 80, tcp, true}, {ya, xa, 80, tcp, true}, {xb, xa, 80, tcp, true}, {xc, xa, 80, tcp, false}, {za, xa, 80, tcp, false}}},
		{"NotIn and DoesNotExist expressions",
			[]*networkingv1.NetworkPolicy{NewPolicy("x", "p", Labels(), Ingress(From(Peers(
				NSPodPeer(Expr(LabelNS, metav1.LabelSelectorOpNotIn, "x", "y"), Expr("missing", metav1.LabelSelectorOpDoesNotExist))))))},
			[]conn{{za, xb, 80, tcp, true}, {ya, xb, 80, tcp, false}, {xa, xb, 80, tcp, false}}},
		{"default namespace label",
			[]*networkingv1.NetworkPolicy{NewPolicy("x", "p", Labels(), Ingress(From(Peers(NSPeer(Labels(LabelMetadataName, "z"))))))},
			[]conn{{za, xb, 80, tcp, true}, {ya, xb, 80, tcp, false}}},
		{"ports: number, protocol default TCP",
			[]*networkingv1.NetworkPolicy{NewPolicy("x", "p", Labels(), Ingress(From(nil, Port(81, ""))))},
			[]conn{{ya, xa, 81, tcp, true}, {ya, xa, 80, tcp, false}, {ya, xa, 81, udp, false}}},
		{"ports: named port resolves on the destination with its protocol",
			[]*networkingv1.NetworkPolicy{NewPolicy("x", "p", Labels(), Ingress(From(nil, NamedPort("serve-81-udp", udp), NamedPort("serve-80-tcp", udp))))},
			[]conn{{ya, xa, 81, udp, true}, {ya, xa, 81, tcp, false}, {ya, xa, 80, udp, false}, {ya, xa, 80, tcp, false}}},
		{"ports: endPort range and protocol-only port",
			[]*networkingv1.NetworkPolicy{NewPolicy("x", "p", Labels(), Ingress(From(nil, PortRange(79, 80, ""), AnyPort(sctp))))},
			[]conn{{ya, xa, 80, tcp, true}, {ya, xa, 81, tcp, false}, {ya, xa, 81, sctp, true}, {ya, xa, 80, udp, false}}},
		{"egress named port resolves on the destination Pod",
			[]*networkingv1.NetworkPolicy{NewPolicy("x", "p", Labels(), Egress(To(nil, NamedPort("serve-80-tcp", ""))))},
			[]conn{{xa, ya, 80, tcp, true}, {xa, ya, 81, tcp, false}, {ya, xa, 81, tcp, true}}},
		{"ipBlock with except",
			[]*networkingv1.NetworkPolicy{NewPolicy("x", "p", Labels(LabelPod, "a"), Egress(To(Peers(IPPeer("10.244.0.0/16", CIDR(xb.IP, 32))))))},
			[]conn{{xa, xb, 80, tcp, false}, {xa, xc, 80, tcp, true}, {xa, yb, 80, tcp, true}}},
		{"ipBlock on ingress matches the source IP",
			[]*networkingv1.NetworkPolicy{NewPolicy("x", "p", Labels(LabelPod, "a"), Ingress(From(Peers(IPPeer(CIDR(yb.IP, 32))))))},
			[]conn{{yb, xa, 80, tcp, true}, {ya, xa, 80, tcp, false}}},
		{"egress AND ingress must both allow",
			[]*networkingv1.NetworkPolicy{
				NewPolicy("x", "e", Labels(LabelPod, "a"), Egress(To(Peers(NSPeer(Labels()))))),
				NewPolicy("y", "i", Labels(LabelPod, "b"), Ingress(From(Peers(PodPeer(Labels()))))),
			},
			[]conn{{xa, yb, 80, tcp, false}, {xa, ya, 80, tcp, true}, {ya, yb, 80, tcp, true}}},
		{"policies are additive",
			[]*networkingv1.NetworkPolicy{
				NewPolicy("x", "p1", Labels(LabelPod, "a"), Ingress(From(nil, Port(80, "")))),
				NewPolicy("x", "p2", Labels(LabelPod, "a"), Ingress(From(Peers(NSPeer(Labels(LabelNS, "y")))))),
			},
			[]conn{{za, xa, 80, tcp, true}, {za, xa, 81, tcp, false}, {ya, xa, 81, tcp, true}}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			for _, c := range tc.conns {
				v, err := Evaluate(tc.pols, s, c.from, c.to, c.port, c.proto)
				if err != nil {
					t.Fatal(err)
				}
				if v.Allowed() != c.want {
					t.Errorf("%s -> %s %s/%d: got %v (%+v), want %v", c.from.PodID, c.to.PodID, c.proto, c.port, v.Allowed(), v, c.want)
				}
			}
		})
	}
}

func TestEvaluateRejectsInvalidPeers(t *testing.T) {
	s := testState()
	bad := []networkingv1.NetworkPolicyPeer{
		{},
		{IPBlock: &networkingv1.IPBlock{CIDR: "10.0.0.0/8"}, PodSelector: &metav1.LabelSelector{}},
		{IPBlock: &networkingv1.IPBlock{CIDR: "not-a-cidr"}},
	}
	for i, pr := range bad {
		p := NewPolicy("x", "p", Labels(), Ingress(From(Peers(pr))))
		if _, err := Evaluate([]*networkingv1.NetworkPolicy{p}, s, pod(s, "y", "a"), pod(s, "x", "a"), 80, tcp); err == nil {
			t.Errorf("peer %d (%+v): no error", i, pr)
		}
	}
}

func TestExpectSelfBypass(t *testing.T) {
	s := testState()
	pols := []*networkingv1.NetworkPolicy{NewPolicy("x", "deny", Labels(), Ingress(), Egress())}
	m, err := Expect(pols, s, PortProto{80, tcp}, true)
	if err != nil {
		t.Fatal(err)
	}
	// x is cut off in both directions: 3 rows and 3 columns of 9, minus the
	// 3 x self pairs and the 9 x-x cells counted twice.
	if got, want := m.Count(), 81-(27+27-9)+3; got != want {
		t.Errorf("allowed cells: got %d, want %d\n%s", got, want, m)
	}
	i := m.Index(PodID{"x", "a"})
	if !m.Get(i, i) {
		t.Errorf("x/a to itself denied with selfBypass")
	}
	m2, _ := Expect(pols, s, PortProto{80, tcp}, false)
	if m2.Get(i, i) {
		t.Errorf("x/a to itself allowed without selfBypass")
	}
}
