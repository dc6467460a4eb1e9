package netpol

import (
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// Step is one state of a scenario. The test sets the step's labels (they
// add to earlier steps' and stay until the scenario ends), makes the
// step's policies the complete set of policies (creating, updating by
// name, deleting the others), derives the expected truth tables with the
// evaluator, and probes Probes.
type Step struct {
	// Name says what changed, for reports.
	Name string
	// Policies returns the policies of this step; s holds the Pod IPs
	// (for ipBlocks) and the labels in force.
	Policies func(s *State) []*networkingv1.NetworkPolicy
	// NamespaceLabels are labels to add to namespaces before the step.
	NamespaceLabels map[string]map[string]string
	// PodLabels are labels to add to Pods before the step.
	PodLabels map[PodID]map[string]string
	// Probes are the destination ports to check.
	Probes []PortProto
}

// Scenario is one test of the upstream Kubernetes NetworkPolicy e2e suite
// (test/e2e/network/netpol/network_policy.go), re-created: same name and
// intent, policies written here from its description.
type Scenario struct {
	// Group is "TCP", "UDP" or "SCTP": the upstream test family.
	Group string
	// Name is the upstream test name.
	Name  string
	Steps []Step
}

// ApplyLabels adds a step's label changes to s.
func (st Step) ApplyLabels(s *State) {
	for ns, l := range st.NamespaceLabels {
		if s.NamespaceLabels[ns] == nil {
			s.NamespaceLabels[ns] = map[string]string{}
		}
		for k, v := range l {
			s.NamespaceLabels[ns][k] = v
		}
	}
	for id, l := range st.PodLabels {
		if p := s.Pod(id); p != nil {
			for k, v := range l {
				p.Labels[k] = v
			}
		}
	}
}

const (
	tcp  = corev1.ProtocolTCP
	udp  = corev1.ProtocolUDP
	sctp = corev1.ProtocolSCTP
)

func probes(proto corev1.Protocol, ports ...int32) []PortProto {
	var out []PortProto
	for _, p := range ports {
		out = append(out, PortProto{Port: p, Protocol: proto})
	}
	return out
}

// fixed wraps a constant policy list.
func fixed(ps ...*networkingv1.NetworkPolicy) func(*State) []*networkingv1.NetworkPolicy {
	return func(*State) []*networkingv1.NetworkPolicy { return ps }
}

func one(name string, pol func(*State) []*networkingv1.NetworkPolicy, pr []PortProto) []Step {
	return []Step{{Name: name, Policies: pol, Probes: pr}}
}

func denyIngressX() *networkingv1.NetworkPolicy {
	return NewPolicy("x", "deny-ingress", Labels(), Ingress())
}

// ipOf is the /32 of a model Pod's IP.
func ipOf(s *State, ns, name string) string {
	p := s.Pod(PodID{ns, name})
	if p == nil || p.IP == nil {
		return "0.0.0.0/32" // no IP: matches no Pod; the test reports the missing IP
	}
	return CIDR(p.IP, 32)
}

// Scenarios returns the 48 scenarios: 42 TCP, 3 UDP and 3 SCTP, in the
// upstream list's order (shared/conformance/upstream-netpol-e2e.txt).
func Scenarios() []Scenario {
	// Selectors used throughout.
	var (
		all   = Labels()
		podA  = Labels(LabelPod, "a")
		podB  = Labels(LabelPod, "b")
		podC  = Labels(LabelPod, "c")
		nsX   = Labels(LabelNS, "x")
		nsY   = Labels(LabelNS, "y")
		nsZ   = Labels(LabelNS, "z")
		notNS = func(ns string) metav1.LabelSelector { return Expr(LabelNS, metav1.LabelSelectorOpNotIn, ns) }
	)
	t80, t81, t8081 := probes(tcp, 80), probes(tcp, 81), probes(tcp, 80, 81)
	sc := func(name string, steps []Step) Scenario { return Scenario{Group: "TCP", Name: name, Steps: steps} }
	fromA := func(name string, peers ...networkingv1.NetworkPolicyPeer) func(*State) []*networkingv1.NetworkPolicy {
		return fixed(NewPolicy("x", name, podA, Ingress(From(peers))))
	}
	exceptPolicy := func(s *State) *networkingv1.NetworkPolicy {
		a := s.Pod(PodID{"x", "a"})
		wide := "0.0.0.0/4"
		if a != nil && a.IP != nil {
			wide = CIDR(a.IP, 4)
		}
		return NewPolicy("x", "deny-client-a-via-except-cidr-egress-rule", podA,
			Egress(To(Peers(IPPeer(wide, ipOf(s, "x", "b"))))))
	}
	allowEgressAToB := NewPolicy("x", "allow-egress-a-to-b", podA, Egress(To(Peers(PodPeer(podB)))))
	tcpScenarios := []Scenario{
		sc("should support a 'default-deny-ingress' policy", one("deny ingress to x", fixed(denyIngressX()), t80)),
		sc("should support a 'default-deny-all' policy", one("deny all of x",
			fixed(NewPolicy("x", "deny-all", all, Ingress(), Egress())), t80)),
		sc("should enforce policy to allow traffic from pods within server namespace based on PodSelector",
			one("x/a from x/b", fromA("x-a-allows-x-b", PodPeer(podB)), t80)),
		sc("should enforce policy to allow ingress traffic for a target", one("deny x, allow all to x/a", fixed(
			denyIngressX(),
			NewPolicy("x", "allow-all-to-a", podA, Ingress(From(Peers(NSPodPeer(all, all)))))), t80)),
		sc("should enforce policy to allow ingress traffic from pods in all namespaces",
			one("x/a from all namespaces", fromA("allow-from-all-ns", NSPeer(all)), t80)),
		sc("should enforce policy to allow traffic only from a different namespace, based on NamespaceSelector",
			one("x/a from ns=y", fromA("allow-from-ns-y", NSPeer(nsY)), t80)),
		sc("should enforce policy based on PodSelector with MatchExpressions",
			one("x/a from pod In [b]", fromA("allow-pod-in-b", PodPeer(Expr(LabelPod, metav1.LabelSelectorOpIn, "b"))), t80)),
		sc("should enforce policy based on NamespaceSelector with MatchExpressions",
			one("x/a from ns In [y]", fromA("allow-ns-in-y", NSPeer(Expr(LabelNS, metav1.LabelSelectorOpIn, "y"))), t80)),
		sc("should enforce policy based on PodSelector or NamespaceSelector",
			one("x/a from ns NotIn [x] or pod=b", fromA("allow-ns-or-pod", NSPeer(notNS("x")), PodPeer(podB)), t80)),
		sc("should enforce policy based on PodSelector and NamespaceSelector",
			one("x/a from pod=b in ns NotIn [x]", fromA("allow-ns-and-pod", NSPodPeer(notNS("x"), podB)), t80)),
		sc("should enforce policy based on Multiple PodSelectors and NamespaceSelectors",
			one("x/a from pod In [b,c] in ns NotIn [x]", fromA("allow-ns-and-pods",
				NSPodPeer(notNS("x"), Expr(LabelPod, metav1.LabelSelectorOpIn, "b", "c"))), t80)),
		sc("should enforce policy based on any PodSelectors",
			one("x/a from pod=b or pod=c", fromA("allow-any-pod-selector", PodPeer(podB), PodPeer(podC)), t80)),
		sc("should enforce policy to allow traffic only from a pod in a different namespace based on PodSelector and NamespaceSelector",
			one("x/a from y/a", fromA("allow-y-a", NSPodPeer(nsY, podA)), t80)),
		sc("should enforce policy based on Ports", one("x/a from ns=y on 81", fixed(
			NewPolicy("x", "allow-ingress-on-port-81-ns-y", podA, Ingress(From(Peers(NSPeer(nsY)), Port(81, ""))))), t8081)),
		sc("should enforce multiple, stacked policies with overlapping podSelectors", []Step{
			{Name: "x/a from ns=y on 81", Probes: t8081, Policies: fixed(
				NewPolicy("x", "allow-ingress-on-port-81-ns-y", podA, Ingress(From(Peers(NSPeer(nsY)), Port(81, "")))))},
			{Name: "plus x/a from ns=y on 80", Probes: t8081, Policies: fixed(
				NewPolicy("x", "allow-ingress-on-port-81-ns-y", podA, Ingress(From(Peers(NSPeer(nsY)), Port(81, "")))),
				NewPolicy("x", "allow-ingress-on-port-80-ns-y", podA, Ingress(From(Peers(NSPeer(nsY)), Port(80, "")))))},
		}),
		sc("should support allow-all policy", one("allow all into x", fixed(
			NewPolicy("x", "allow-all", all, Ingress(From(nil)))), t8081)),
		sc("should allow ingress access on one named port", one("x on serve-81-tcp", fixed(
			NewPolicy("x", "allow-all-on-serve-81-tcp", all, Ingress(From(nil, NamedPort("serve-81-tcp", ""))))), t8081)),
		sc("should allow ingress access from namespace on one named port", one("x from ns=y on serve-80-tcp", fixed(
			NewPolicy("x", "allow-ns-y-on-serve-80-tcp", all, Ingress(From(Peers(NSPeer(nsY)), NamedPort("serve-80-tcp", ""))))), t8081)),
		sc("should allow egress access on one named port", one("x egress on serve-80-tcp", fixed(
			NewPolicy("x", "allow-egress-on-serve-80-tcp", all, Egress(To(nil, NamedPort("serve-80-tcp", ""))))), t8081)),
		sc("should enforce updated policy", []Step{
			{Name: "allow all into x", Probes: t81, Policies: fixed(NewPolicy("x", "allow-all-mutate-to-deny-all", all, Ingress(From(nil))))},
			{Name: "updated to deny all into x", Probes: t81, Policies: fixed(NewPolicy("x", "allow-all-mutate-to-deny-all", all, Ingress()))},
		}),
		sc("should allow ingress access from updated namespace", []Step{
			{Name: "x/a from ns2=updated (no such namespace yet)", Probes: t80,
				Policies: fromA("allow-from-updated-ns", NSPeer(Labels("ns2", "updated")))},
			{Name: "namespace y labelled ns2=updated", Probes: t80,
				Policies:        fromA("allow-from-updated-ns", NSPeer(Labels("ns2", "updated"))),
				NamespaceLabels: map[string]map[string]string{"y": {"ns2": "updated"}}},
		}),
		sc("should allow ingress access from updated pod", []Step{
			{Name: "x/a from pod=b,pod2=updated (no such Pod yet)", Probes: t80,
				Policies: fromA("allow-from-updated-pod", PodPeer(Labels(LabelPod, "b", "pod2", "updated")))},
			{Name: "x/b labelled pod2=updated", Probes: t80,
				Policies:  fromA("allow-from-updated-pod", PodPeer(Labels(LabelPod, "b", "pod2", "updated"))),
				PodLabels: map[PodID]map[string]string{{"x", "b"}: {"pod2": "updated"}}},
		}),
		sc("should deny ingress from pods on other namespaces", one("x from its own namespace only", fixed(
			NewPolicy("x", "deny-other-namespaces", all, Ingress(From(Peers(PodPeer(all)))))), t80)),
		sc("should deny ingress access to updated pod", []Step{
			{Name: "deny into target=isolated (none yet)", Probes: t80,
				Policies: fixed(NewPolicy("x", "deny-ingress-via-label-selector", Labels("target", "isolated"), Ingress()))},
			{Name: "x/a labelled target=isolated", Probes: t80,
				Policies:  fixed(NewPolicy("x", "deny-ingress-via-label-selector", Labels("target", "isolated"), Ingress())),
				PodLabels: map[PodID]map[string]string{{"x", "a"}: {"target": "isolated"}}},
		}),
		sc("should deny egress from pods based on PodSelector", one("deny egress of x/a", fixed(
			NewPolicy("x", "deny-egress-pod-a", podA, Egress())), t80)),
		sc("should deny egress from all pods in a namespace", one("deny egress of x", fixed(
			NewPolicy("x", "deny-egress-ns-x", all, Egress())), t80)),
		sc("should work with Ingress, Egress specified together", one("x/a from x/b, egress on TCP 80", fixed(
			NewPolicy("x", "allow-client-b-egress-80", podA,
				Ingress(From(Peers(PodPeer(podB)))), Egress(To(nil, Port(80, tcp))))), t8081)),
		sc("should support denying of egress traffic on the client side (even if the server explicitly allows this traffic)",
			one("x/a egress to ns=z only; y/a and y/b accept x/a", fixed(
				NewPolicy("x", "allow-egress-to-ns-z", podA, Egress(To(Peers(NSPeer(nsZ))))),
				NewPolicy("y", "allow-from-xa-on-ya", podA, Ingress(From(Peers(NSPodPeer(nsX, podA))))),
				NewPolicy("y", "allow-from-xa-on-yb", podB, Ingress(From(Peers(NSPodPeer(nsX, podA))))),
			), t80)),
		sc("should enforce egress policy allowing traffic to a server in a different namespace based on PodSelector and NamespaceSelector",
			one("x/a egress to y/a", fixed(NewPolicy("x", "allow-egress-to-y-a", podA, Egress(To(Peers(NSPodPeer(nsY, podA)))))), t80)),
		sc("should enforce ingress policy allowing any port traffic to a server on a specific protocol",
			one("x/a on any TCP port", fixed(NewPolicy("x", "allow-ingress-any-tcp", podA, Ingress(From(nil, AnyPort(tcp))))),
				append(probes(tcp, 80, 81), probes(udp, 80)...))),
		sc("should enforce multiple ingress policies with ingress allow-all policy taking precedence", []Step{
			{Name: "x on TCP 80 only", Probes: t81, Policies: fixed(NewPolicy("x", "allow-ingress-port-80", all, Ingress(From(nil, Port(80, "")))))},
			{Name: "plus allow all into x", Probes: t81, Policies: fixed(
				NewPolicy("x", "allow-ingress-port-80", all, Ingress(From(nil, Port(80, "")))),
				NewPolicy("x", "allow-ingress", all, Ingress(From(nil))))},
		}),
		sc("should enforce multiple egress policies with egress allow-all policy taking precedence", []Step{
			{Name: "x/a egress on TCP 80 only", Probes: t81, Policies: fixed(NewPolicy("x", "allow-egress-port-80", podA, Egress(To(nil, Port(80, "")))))},
			{Name: "plus allow all egress of x/a", Probes: t81, Policies: fixed(
				NewPolicy("x", "allow-egress-port-80", podA, Egress(To(nil, Port(80, "")))),
				NewPolicy("x", "allow-egress", podA, Egress(To(nil))))},
		}),
		sc("should stop enforcing policies after they are deleted", []Step{
			{Name: "deny all of x", Probes: t80, Policies: fixed(NewPolicy("x", "deny-all", all, Ingress(), Egress()))},
			{Name: "policy deleted", Probes: t80, Policies: fixed()},
		}),
		sc("should allow egress access to server in CIDR block", one("x/a egress to y/b's /32",
			func(s *State) []*networkingv1.NetworkPolicy {
				return []*networkingv1.NetworkPolicy{NewPolicy("x", "allow-client-a-via-cidr-egress-rule", podA,
					Egress(To(Peers(IPPeer(ipOf(s, "y", "b"))))))}
			}, t80)),
		sc("should enforce except clause while egress access to server in CIDR block", one("x/a egress to a /4 except x/b",
			func(s *State) []*networkingv1.NetworkPolicy { return []*networkingv1.NetworkPolicy{exceptPolicy(s)} }, t80)),
		sc("should ensure an IP overlapping both IPBlock.CIDR and IPBlock.Except is allowed", []Step{
			{Name: "x/a egress to a /4 except x/b", Probes: t80,
				Policies: func(s *State) []*networkingv1.NetworkPolicy { return []*networkingv1.NetworkPolicy{exceptPolicy(s)} }},
			{Name: "plus x/a egress to x/b's /32", Probes: t80,
				Policies: func(s *State) []*networkingv1.NetworkPolicy {
					return []*networkingv1.NetworkPolicy{exceptPolicy(s), NewPolicy("x", "allow-client-a-via-cidr-egress-rule", podA,
						Egress(To(Peers(IPPeer(ipOf(s, "x", "b"))))))}
				}},
		}),
		sc("should enforce policies to check ingress and egress policies can be controlled independently based on PodSelector", []Step{
			{Name: "no policy", Probes: t80, Policies: fixed()},
			{Name: "x/a egress to x/b only", Probes: t80, Policies: fixed(allowEgressAToB)},
			{Name: "plus deny ingress into x/a", Probes: t80, Policies: fixed(allowEgressAToB,
				NewPolicy("x", "deny-ingress-to-a", podA, Ingress()))},
		}),
		sc("should not mistakenly treat 'protocol: SCTP' as 'protocol: TCP', even if the plugin doesn't support SCTP",
			one("deny x; x/a on SCTP 80", fixed(denyIngressX(),
				NewPolicy("x", "allow-only-sctp-ingress-on-port-80", podA, Ingress(From(nil, Port(80, sctp))))), t80)),
		sc("should properly isolate pods that are selected by a policy allowing SCTP, even if the plugin doesn't support SCTP",
			one("x/a on SCTP 80 only", fixed(
				NewPolicy("x", "allow-only-sctp-ingress-on-port-80", podA, Ingress(From(nil, Port(80, sctp))))), t81)),
		sc("should not allow access by TCP when a policy specifies only UDP", one("x/a on UDP 81 only", fixed(
			NewPolicy("x", "allow-only-udp-ingress-on-port-81", podA, Ingress(From(nil, Port(81, udp))))), t81)),
		sc("should enforce policy to allow traffic based on NamespaceSelector with MatchLabels using default ns label",
			one("x/a from kubernetes.io/metadata.name=y", fromA("allow-from-metadata-name-y", NSPeer(Labels(LabelMetadataName, "y"))), t80)),
		sc("should enforce policy based on NamespaceSelector with MatchExpressions using default ns label",
			one("x/a egress to kubernetes.io/metadata.name NotIn [y]", fixed(NewPolicy("x", "allow-egress-metadata-name-not-y", podA,
				Egress(To(Peers(NSPeer(Expr(LabelMetadataName, metav1.LabelSelectorOpNotIn, "y"))))))), t80)),
	}
	out := tcpScenarios
	for _, proto := range []corev1.Protocol{udp, sctp} {
		p80, p8081 := probes(proto, 80), probes(proto, 80, 81)
		out = append(out,
			Scenario{Group: string(proto), Name: "should support a 'default-deny-ingress' policy",
				Steps: one("deny ingress to x", fixed(denyIngressX()), p80)},
			Scenario{Group: string(proto), Name: "should enforce policy based on Ports",
				Steps: one("x/a from ns=y on "+string(proto)+" 81", fixed(
					NewPolicy("x", "allow-ingress-on-port-81-ns-y", podA, Ingress(From(Peers(NSPeer(nsY)), Port(81, proto))))), p8081)},
			Scenario{Group: string(proto), Name: "should enforce policy to allow traffic only from a pod in a different namespace based on PodSelector and NamespaceSelector",
				Steps: one("x/a from y/a", fromA("allow-y-a", NSPodPeer(nsY, podA)), p80)},
		)
	}
	return out
}
