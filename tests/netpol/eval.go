package netpol

import (
	"fmt"
	"net"

	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/util/intstr"
)

// Verdict is the evaluator's answer for one connection, per direction.
type Verdict struct {
	// IngressIsolated: some policy selecting the destination Pod has the
	// Ingress policy type.
	IngressIsolated bool
	// IngressAllowed: the destination accepts the connection (not isolated,
	// or a rule of an ingress policy selecting it matches).
	IngressAllowed bool
	// EgressIsolated / EgressAllowed: the same for the source Pod.
	EgressIsolated bool
	EgressAllowed  bool
}

// Allowed is true when both directions allow the connection.
func (v Verdict) Allowed() bool { return v.IngressAllowed && v.EgressAllowed }

// PolicyTypes returns the policy types that are in force for p: the
// explicit spec.policyTypes, or when empty, Ingress always plus Egress when
// the policy has egress rules (NetworkPolicySpec.policyTypes in the
// networking.k8s.io/v1 API reference). The API server stores the same
// default, so both forms must evaluate alike.
func PolicyTypes(p *networkingv1.NetworkPolicy) (ingress, egress bool) {
	if len(p.Spec.PolicyTypes) == 0 {
		return true, len(p.Spec.Egress) > 0
	}
	for _, t := range p.Spec.PolicyTypes {
		switch t {
		case networkingv1.PolicyTypeIngress:
			ingress = true
		case networkingv1.PolicyTypeEgress:
			egress = true
		}
	}
	return ingress, egress
}

// Evaluate decides whether a connection from Pod src to Pod dst on
// port/proto (the destination port number; named ports resolve against
// dst's container ports) is allowed by policies in state s.
//
// Rules (networking.k8s.io/v1): a Pod is isolated for a direction when a
// policy in its namespace selects it (spec.podSelector) and has that
// policy type; an isolated Pod accepts a connection in that direction only
// if some rule of such a policy matches both a peer and a port; policies
// are additive (unions); a connection needs both the source's egress and
// the destination's ingress to allow it.
func Evaluate(policies []*networkingv1.NetworkPolicy, s *State, src, dst *Pod, port int32, proto corev1.Protocol) (Verdict, error) {
	v := Verdict{IngressAllowed: true, EgressAllowed: true}
	ingressMatched, egressMatched := false, false
	for _, p := range policies {
		wantIngress, wantEgress := PolicyTypes(p)
		if wantIngress && p.Namespace == dst.Namespace {
			sel, err := selectorMatches(&p.Spec.PodSelector, dst.Labels)
			if err != nil {
				return v, fmt.Errorf("policy %s/%s podSelector: %w", p.Namespace, p.Name, err)
			}
			if sel {
				v.IngressIsolated = true
				for i, r := range p.Spec.Ingress {
					ok, err := ruleMatches(p.Namespace, r.From, r.Ports, s, src, dst, port, proto)
					if err != nil {
						return v, fmt.Errorf("policy %s/%s ingress rule %d: %w", p.Namespace, p.Name, i, err)
					}
					if ok {
						ingressMatched = true
					}
				}
			}
		}
		if wantEgress && p.Namespace == src.Namespace {
			sel, err := selectorMatches(&p.Spec.PodSelector, src.Labels)
			if err != nil {
				return v, fmt.Errorf("policy %s/%s podSelector: %w", p.Namespace, p.Name, err)
			}
			if sel {
				v.EgressIsolated = true
				for i, r := range p.Spec.Egress {
					ok, err := ruleMatches(p.Namespace, r.To, r.Ports, s, dst, dst, port, proto)
					if err != nil {
						return v, fmt.Errorf("policy %s/%s egress rule %d: %w", p.Namespace, p.Name, i, err)
					}
					if ok {
						egressMatched = true
					}
				}
			}
		}
	}
	v.IngressAllowed = !v.IngressIsolated || ingressMatched
	v.EgressAllowed = !v.EgressIsolated || egressMatched
	return v, nil
}

// ruleMatches reports whether one rule of a policy in namespace policyNS
// matches peer Pod peer and the destination dst's port/proto. An empty
// peer list matches every peer and an empty port list every port.
func ruleMatches(policyNS string, peers []networkingv1.NetworkPolicyPeer, ports []networkingv1.NetworkPolicyPort,
	s *State, peer, dst *Pod, port int32, proto corev1.Protocol) (bool, error) {
	okPort, err := portsMatch(ports, dst, port, proto)
	if err != nil || !okPort {
		return false, err
	}
	if len(peers) == 0 {
		return true, nil
	}
	for _, pr := range peers {
		ok, err := peerMatches(policyNS, pr, s, peer)
		if err != nil {
			return false, err
		}
		if ok {
			return true, nil
		}
	}
	return false, nil
}

// peerMatches applies one NetworkPolicyPeer to a Pod:
//   - ipBlock: the Pod IP is inside cidr and outside every except;
//   - podSelector alone: matching Pods of the policy's namespace;
//   - namespaceSelector alone: every Pod of matching namespaces;
//   - both: matching Pods of matching namespaces.
func peerMatches(policyNS string, pr networkingv1.NetworkPolicyPeer, s *State, pod *Pod) (bool, error) {
	if pr.IPBlock != nil {
		if pr.PodSelector != nil || pr.NamespaceSelector != nil {
			return false, fmt.Errorf("peer sets ipBlock together with a selector")
		}
		return ipBlockContains(pr.IPBlock, pod.IP)
	}
	if pr.PodSelector == nil && pr.NamespaceSelector == nil {
		return false, fmt.Errorf("peer sets none of podSelector, namespaceSelector, ipBlock")
	}
	if pr.NamespaceSelector == nil {
		if pod.Namespace != policyNS {
			return false, nil
		}
	} else {
		nsLabels, ok := s.NamespaceLabels[pod.Namespace]
		if !ok {
			return false, fmt.Errorf("no labels known for namespace %q", pod.Namespace)
		}
		m, err := selectorMatches(pr.NamespaceSelector, nsLabels)
		if err != nil || !m {
			return false, err
		}
	}
	if pr.PodSelector == nil {
		return true, nil
	}
	return selectorMatches(pr.PodSelector, pod.Labels)
}

// selectorMatches applies a label selector; an empty selector matches
// everything (metav1.LabelSelector: "An empty label selector matches all
// objects").
func selectorMatches(sel *metav1.LabelSelector, l map[string]string) (bool, error) {
	ls, err := metav1.LabelSelectorAsSelector(sel)
	if err != nil {
		return false, fmt.Errorf("label selector: %w", err)
	}
	return ls.Matches(labels.Set(l)), nil
}

// ipBlockContains: ip in cidr and in none of except.
func ipBlockContains(b *networkingv1.IPBlock, ip net.IP) (bool, error) {
	_, cidr, err := net.ParseCIDR(b.CIDR)
	if err != nil {
		return false, fmt.Errorf("ipBlock cidr %q: %w", b.CIDR, err)
	}
	if ip == nil || !cidr.Contains(ip) {
		return false, nil
	}
	for _, e := range b.Except {
		_, ex, err := net.ParseCIDR(e)
		if err != nil {
			return false, fmt.Errorf("ipBlock except %q: %w", e, err)
		}
		if ex.Contains(ip) {
			return false, nil
		}
	}
	return true, nil
}

// portsMatch applies a rule's port list to the destination port/proto.
// Each NetworkPolicyPort: protocol defaults to TCP; no port means every
// port of that protocol; a number matches it (or the range port..endPort);
// a name matches when dst declares a container port of that name with the
// same protocol and that number.
func portsMatch(ports []networkingv1.NetworkPolicyPort, dst *Pod, port int32, proto corev1.Protocol) (bool, error) {
	if len(ports) == 0 {
		return true, nil
	}
	for _, pp := range ports {
		pproto := corev1.ProtocolTCP
		if pp.Protocol != nil {
			pproto = *pp.Protocol
		}
		if pproto != proto {
			continue
		}
		if pp.Port == nil {
			if pp.EndPort != nil {
				return false, fmt.Errorf("endPort without port")
			}
			return true, nil
		}
		if pp.Port.Type == intstr.String {
			if pp.EndPort != nil {
				return false, fmt.Errorf("endPort with named port %q", pp.Port.StrVal)
			}
			for _, cp := range dst.Ports {
				if cp.Name == pp.Port.StrVal && cp.Protocol == proto && cp.Port == port {
					return true, nil
				}
			}
			continue
		}
		lo, hi := pp.Port.IntVal, pp.Port.IntVal
		if pp.EndPort != nil {
			hi = *pp.EndPort
			if hi < lo {
				return false, fmt.Errorf("endPort %d < port %d", hi, lo)
			}
		}
		if lo <= port && port <= hi {
			return true, nil
		}
	}
	return false, nil
}

// Expect computes the truth table of s's Pods for port/proto under
// policies. Self pairs (a Pod to its own IP) are always allowed: the
// kernel delivers them over the Pod's loopback without leaving its
// network namespace, and Pods cannot block that (Kubernetes "Network
// Policies", what you can't do); pass selfBypass=false to get the API
// verdict for them as well (e.g. for traces through the datapath).
func Expect(policies []*networkingv1.NetworkPolicy, s *State, pp PortProto, selfBypass bool) (*Matrix, error) {
	m := NewMatrix(s.PodIDs(), false)
	for i := range s.Pods {
		for j := range s.Pods {
			if i == j && selfBypass {
				m.Set(i, j, true)
				continue
			}
			v, err := Evaluate(policies, s, &s.Pods[i], &s.Pods[j], pp.Port, pp.Protocol)
			if err != nil {
				return nil, err
			}
			m.Set(i, j, v.Allowed())
		}
	}
	return m, nil
}
