package reference

import (
	"fmt"
	"net"
	"testing"

	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"

	"github.com/seine-net/seine/tests/netpol"
)

func modelState() *netpol.State {
	ips, nodes := map[netpol.PodID]net.IP{}, map[netpol.PodID]string{}
	for i, ns := range netpol.Namespaces() {
		for j, name := range netpol.PodNames() {
			n := netpol.NodeOf(i, j, 3)
			ips[netpol.PodID{Namespace: ns, Name: name}] = net.IPv4(10, 244, byte(n), byte(2+i)).To4()
			nodes[netpol.PodID{Namespace: ns, Name: name}] = fmt.Sprintf("node-%d", n+1)
		}
	}
	return netpol.NewModelState(ips, nodes)
}

var checkedPorts = []netpol.PortProto{
	{Port: 80, Protocol: corev1.ProtocolTCP}, {Port: 81, Protocol: corev1.ProtocolTCP},
	{Port: 80, Protocol: corev1.ProtocolUDP}, {Port: 81, Protocol: corev1.ProtocolUDP},
	{Port: 80, Protocol: corev1.ProtocolSCTP},
}

// TestEvaluatorAgreesWithCyclonus cross-checks netpol.Evaluate against
// cyclonus on random policy sets (seed from SEINE_NETPOL_SEED or the
// clock, logged).
func TestEvaluatorAgreesWithCyclonus(t *testing.T) {
	seed, err := netpol.Seed()
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("seed %d (%s=%d to repeat)", seed, netpol.SeedEnv, seed)
	s := modelState()
	g := &netpol.Generator{R: netpol.NewRand(seed), S: s}
	const sets = 1500
	allowed, total := 0, 0
	for n := 0; n < sets; n++ {
		pols := g.Policies(4)
		ref, err := New(pols, s)
		if err != nil {
			t.Fatalf("set %d: %v", n, err)
		}
		for _, pp := range checkedPorts {
			own, err := netpol.Expect(pols, s, pp, false)
			if err != nil {
				t.Fatalf("set %d: %v", n, err)
			}
			theirs := ref.Expect(pp, false)
			if d := netpol.Diff(pp.String(), theirs, own); d != "" {
				t.Fatalf("set %d disagrees with cyclonus (expected = cyclonus, observed = ours):\n%s\npolicies:\n%s", n, d, Dump(pols))
			}
			allowed += own.Count()
			total += 81
		}
	}
	// The generator must produce a useful mix, not all-allowed or all-denied.
	frac := float64(allowed) / float64(total)
	t.Logf("%d sets, %.0f%% of connections allowed", sets, 100*frac)
	if frac < 0.2 || frac > 0.9 {
		t.Errorf("allowed fraction %.2f: generator is lopsided", frac)
	}
}

// TestCyclonusOnScenarios: every conformance scenario's derived tables
// agree with cyclonus too.
func TestCyclonusOnScenarios(t *testing.T) {
	for _, sc := range netpol.Scenarios() {
		s := modelState()
		for i, st := range sc.Steps {
			st.ApplyLabels(s)
			pols := st.Policies(s)
			ref, err := New(pols, s)
			if err != nil {
				t.Fatalf("%s step %d: %v", sc.Name, i, err)
			}
			for _, pp := range st.Probes {
				own, err := netpol.Expect(pols, s, pp, true)
				if err != nil {
					t.Fatal(err)
				}
				if d := netpol.Diff(pp.String(), ref.Expect(pp, true), own); d != "" {
					t.Errorf("%s/%s step %d:\n%s", sc.Group, sc.Name, i, d)
				}
			}
		}
	}
}

func TestNewDefaultsPolicyTypes(t *testing.T) {
	s := modelState()
	p := netpol.NewPolicy("x", "p", netpol.Labels())
	p.Spec.Egress = []networkingv1.NetworkPolicyEgressRule{netpol.To(nil, netpol.Port(80, ""))}
	ref, err := New([]*networkingv1.NetworkPolicy{p}, s)
	if err != nil {
		t.Fatal(err)
	}
	if len(p.Spec.PolicyTypes) != 0 {
		t.Errorf("New modified its input")
	}
	xa, ya := s.Pod(netpol.PodID{Namespace: "x", Name: "a"}), s.Pod(netpol.PodID{Namespace: "y", Name: "a"})
	if ref.Allowed(ya, xa, 80, corev1.ProtocolTCP) {
		t.Errorf("implied Ingress type not applied")
	}
	if !ref.Allowed(xa, ya, 80, corev1.ProtocolTCP) || ref.Allowed(xa, ya, 81, corev1.ProtocolTCP) {
		t.Errorf("implied Egress type not applied")
	}
}
