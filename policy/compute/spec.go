package compute

import (
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"

	"github.com/seine-net/seine/policy/apis/controlplane/v1alpha1"
)

// keyedSel is a peer selector with its group key.
type keyedSel struct {
	key string
	sel v1alpha1.GroupSelector
}

// PolicyTypes returns the directions for which a NetworkPolicy isolates its
// target Pods, in the order Ingress, Egress: the explicit spec.policyTypes
// when set, otherwise Ingress always and Egress when egress rules exist
// (networking.k8s.io/v1 NetworkPolicySpec.policyTypes).
func PolicyTypes(spec *networkingv1.NetworkPolicySpec) []string {
	in, eg := false, false
	if len(spec.PolicyTypes) > 0 {
		for _, t := range spec.PolicyTypes {
			switch t {
			case networkingv1.PolicyTypeIngress:
				in = true
			case networkingv1.PolicyTypeEgress:
				eg = true
			}
		}
	} else {
		in, eg = true, len(spec.Egress) > 0
	}
	var out []string
	if in {
		out = append(out, string(networkingv1.PolicyTypeIngress))
	}
	if eg {
		out = append(out, string(networkingv1.PolicyTypeEgress))
	}
	return out
}

// computeSpec returns the computed spec of np, its target selector, and
// its distinct peer selectors with their keys (in first-use order). Rules
// of a direction the policy does not isolate are dropped: they cannot
// allow anything the Pods are not already allowed.
func computeSpec(np *networkingv1.NetworkPolicy) (v1alpha1.NetworkPolicySpec, v1alpha1.GroupSelector, []keyedSel) {
	tgSel := NormalizeGroupSelector(v1alpha1.GroupSelector{Namespace: np.Namespace, PodSelector: &np.Spec.PodSelector})
	spec := v1alpha1.NetworkPolicySpec{
		Source: v1alpha1.PolicyReference{Namespace: np.Namespace, Name: np.Name, UID: string(np.UID),
			Generation: np.Generation},
		AppliedToGroup: groupKeyNorm(tgSel),
		PolicyTypes:    PolicyTypes(&np.Spec),
	}
	var peers []keyedSel
	seen := map[string]bool{}
	convPeers := func(ps []networkingv1.NetworkPolicyPeer, r *v1alpha1.Rule) {
		if len(ps) == 0 {
			r.AllPeers = true
			return
		}
		inRule := map[string]bool{}
		for _, p := range ps {
			if p.IPBlock != nil {
				r.IPBlocks = append(r.IPBlocks, v1alpha1.IPBlock{CIDR: p.IPBlock.CIDR, Except: append([]string(nil), p.IPBlock.Except...)})
				continue
			}
			if p.PodSelector == nil && p.NamespaceSelector == nil {
				continue // invalid peer; the API server rejects it
			}
			sel := NormalizeGroupSelector(v1alpha1.GroupSelector{PodSelector: p.PodSelector, NamespaceSelector: p.NamespaceSelector})
			if p.NamespaceSelector == nil {
				sel.Namespace = np.Namespace
			}
			k := groupKeyNorm(sel)
			if !inRule[k] {
				inRule[k] = true
				r.AddressGroups = append(r.AddressGroups, k)
			}
			if !seen[k] {
				seen[k] = true
				peers = append(peers, keyedSel{key: k, sel: sel})
			}
		}
	}
	for _, t := range spec.PolicyTypes {
		if t == string(networkingv1.PolicyTypeIngress) {
			for _, ir := range np.Spec.Ingress {
				r := v1alpha1.Rule{Direction: v1alpha1.DirectionIn, Ports: convPorts(ir.Ports)}
				convPeers(ir.From, &r)
				spec.Rules = append(spec.Rules, r)
			}
		} else {
			for _, er := range np.Spec.Egress {
				r := v1alpha1.Rule{Direction: v1alpha1.DirectionOut, Ports: convPorts(er.Ports)}
				convPeers(er.To, &r)
				numeric, named := splitNamedPorts(r.Ports)
				allPods := func() string {
					sel := NormalizeGroupSelector(v1alpha1.GroupSelector{PodSelector: &metav1.LabelSelector{}, NamespaceSelector: &metav1.LabelSelector{}})
					k := groupKeyNorm(sel)
					if !seen[k] {
						seen[k] = true
						peers = append(peers, keyedSel{key: k, sel: sel})
					}
					return k
				}
				if !r.AllPeers || len(named) == 0 {
					spec.Rules = append(spec.Rules, r)
					if len(named) > 0 && len(r.IPBlocks) > 0 {
						// A Pod inside an ipBlock is reached on the port its
						// own name resolves to: every Pod, kept to the blocks.
						spec.Rules = append(spec.Rules, v1alpha1.Rule{Direction: v1alpha1.DirectionOut,
							AddressGroups: []string{allPods()}, Ports: named, WithinIPBlocks: r.IPBlocks})
					}
					continue
				}
				// A named port is resolved per destination Pod, so "to every
				// peer on a named port" means every Pod that has the port:
				// the named ports go to a rule whose peers are all Pods (the
				// agent resolves names from the AddressGroup members), the
				// numbered ones keep matching every destination.
				if len(numeric) > 0 {
					spec.Rules = append(spec.Rules, v1alpha1.Rule{Direction: v1alpha1.DirectionOut, AllPeers: true, Ports: numeric})
				}
				spec.Rules = append(spec.Rules, v1alpha1.Rule{Direction: v1alpha1.DirectionOut, AddressGroups: []string{allPods()}, Ports: named})
			}
		}
	}
	return spec, tgSel, peers
}

// splitNamedPorts separates ports given by name from the others.
func splitNamedPorts(ps []v1alpha1.PolicyPort) (numeric, named []v1alpha1.PolicyPort) {
	for _, p := range ps {
		if p.Port != nil && p.Port.Type == intstr.String {
			named = append(named, p)
		} else {
			numeric = append(numeric, p)
		}
	}
	return numeric, named
}

func convPorts(ps []networkingv1.NetworkPolicyPort) []v1alpha1.PolicyPort {
	if len(ps) == 0 {
		return nil
	}
	out := make([]v1alpha1.PolicyPort, 0, len(ps))
	for _, p := range ps {
		proto := string(corev1.ProtocolTCP)
		if p.Protocol != nil && *p.Protocol != "" {
			proto = string(*p.Protocol)
		}
		pp := v1alpha1.PolicyPort{Protocol: proto}
		if p.Port != nil {
			v := *p.Port
			pp.Port = &v
		}
		if p.EndPort != nil {
			v := *p.EndPort
			pp.EndPort = &v
		}
		out = append(out, pp)
	}
	return out
}
