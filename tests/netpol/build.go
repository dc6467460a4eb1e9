package netpol

import (
	"fmt"
	"net"

	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
)

// SpecOption edits a NetworkPolicySpec under construction.
type SpecOption func(*networkingv1.NetworkPolicySpec)

// NewPolicy builds a NetworkPolicy named name in namespace ns selecting
// podSelector, edited by opts.
func NewPolicy(ns, name string, podSelector metav1.LabelSelector, opts ...SpecOption) *networkingv1.NetworkPolicy {
	p := &networkingv1.NetworkPolicy{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name},
		Spec:       networkingv1.NetworkPolicySpec{PodSelector: podSelector},
	}
	for _, o := range opts {
		o(&p.Spec)
	}
	return p
}

// Ingress sets the ingress rules and adds the Ingress policy type (with no
// rules the selected Pods accept no ingress at all).
func Ingress(rules ...networkingv1.NetworkPolicyIngressRule) SpecOption {
	return func(s *networkingv1.NetworkPolicySpec) {
		s.Ingress = rules
		addType(s, networkingv1.PolicyTypeIngress)
	}
}

// Egress sets the egress rules and adds the Egress policy type.
func Egress(rules ...networkingv1.NetworkPolicyEgressRule) SpecOption {
	return func(s *networkingv1.NetworkPolicySpec) {
		s.Egress = rules
		addType(s, networkingv1.PolicyTypeEgress)
	}
}

func addType(s *networkingv1.NetworkPolicySpec, t networkingv1.PolicyType) {
	for _, have := range s.PolicyTypes {
		if have == t {
			return
		}
	}
	s.PolicyTypes = append(s.PolicyTypes, t)
}

// Labels is a matchLabels selector from key, value pairs; Labels() is the
// empty selector (everything).
func Labels(kv ...string) metav1.LabelSelector {
	if len(kv)%2 != 0 {
		panic(fmt.Sprintf("netpol.Labels: odd number of arguments %q", kv))
	}
	s := metav1.LabelSelector{}
	for i := 0; i < len(kv); i += 2 {
		if s.MatchLabels == nil {
			s.MatchLabels = map[string]string{}
		}
		s.MatchLabels[kv[i]] = kv[i+1]
	}
	return s
}

// Expr is a selector with one matchExpression.
func Expr(key string, op metav1.LabelSelectorOperator, values ...string) metav1.LabelSelector {
	return metav1.LabelSelector{MatchExpressions: []metav1.LabelSelectorRequirement{{Key: key, Operator: op, Values: values}}}
}

// Sel returns a pointer to a copy of s, for peer selectors.
func Sel(s metav1.LabelSelector) *metav1.LabelSelector { return &s }

// PodPeer selects Pods of the policy's namespace.
func PodPeer(s metav1.LabelSelector) networkingv1.NetworkPolicyPeer {
	return networkingv1.NetworkPolicyPeer{PodSelector: Sel(s)}
}

// NSPeer selects every Pod of the matching namespaces.
func NSPeer(s metav1.LabelSelector) networkingv1.NetworkPolicyPeer {
	return networkingv1.NetworkPolicyPeer{NamespaceSelector: Sel(s)}
}

// NSPodPeer selects matching Pods of matching namespaces.
func NSPodPeer(ns, pod metav1.LabelSelector) networkingv1.NetworkPolicyPeer {
	return networkingv1.NetworkPolicyPeer{NamespaceSelector: Sel(ns), PodSelector: Sel(pod)}
}

// IPPeer is an ipBlock peer.
func IPPeer(cidr string, except ...string) networkingv1.NetworkPolicyPeer {
	return networkingv1.NetworkPolicyPeer{IPBlock: &networkingv1.IPBlock{CIDR: cidr, Except: except}}
}

// Port is a numbered port; proto "" leaves the protocol unset (TCP).
func Port(n int32, proto corev1.Protocol) networkingv1.NetworkPolicyPort {
	v := intstr.FromInt32(n)
	return networkingv1.NetworkPolicyPort{Port: &v, Protocol: protoPtr(proto)}
}

// PortRange is port..end.
func PortRange(n, end int32, proto corev1.Protocol) networkingv1.NetworkPolicyPort {
	p := Port(n, proto)
	p.EndPort = &end
	return p
}

// NamedPort is a port by container port name.
func NamedPort(name string, proto corev1.Protocol) networkingv1.NetworkPolicyPort {
	v := intstr.FromString(name)
	return networkingv1.NetworkPolicyPort{Port: &v, Protocol: protoPtr(proto)}
}

// AnyPort is every port of proto.
func AnyPort(proto corev1.Protocol) networkingv1.NetworkPolicyPort {
	return networkingv1.NetworkPolicyPort{Protocol: protoPtr(proto)}
}

func protoPtr(p corev1.Protocol) *corev1.Protocol {
	if p == "" {
		return nil
	}
	return &p
}

// From is an ingress rule.
func From(peers []networkingv1.NetworkPolicyPeer, ports ...networkingv1.NetworkPolicyPort) networkingv1.NetworkPolicyIngressRule {
	return networkingv1.NetworkPolicyIngressRule{From: peers, Ports: ports}
}

// To is an egress rule.
func To(peers []networkingv1.NetworkPolicyPeer, ports ...networkingv1.NetworkPolicyPort) networkingv1.NetworkPolicyEgressRule {
	return networkingv1.NetworkPolicyEgressRule{To: peers, Ports: ports}
}

// Peers makes a peer list.
func Peers(p ...networkingv1.NetworkPolicyPeer) []networkingv1.NetworkPolicyPeer { return p }

// CIDR returns the canonical network of ip/bits (host bits cleared), e.g.
// CIDR(10.244.1.5, 4) = "0.0.0.0/4"; the API server rejects or warns on
// CIDRs with host bits set.
func CIDR(ip net.IP, bits int) string {
	ip4 := ip.To4()
	m := net.CIDRMask(bits, 32)
	return (&net.IPNet{IP: ip4.Mask(m), Mask: m}).String()
}
