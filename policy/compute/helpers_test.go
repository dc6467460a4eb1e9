package compute

import (
	"encoding/json"
	"testing"

	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/seine-net/seine/policy/apis/controlplane/v1alpha1"
)

func mkNS(name string, lbls map[string]string) *corev1.Namespace {
	return &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: name, Labels: lbls}}
}

func mkNode(name string) *corev1.Node { return &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name}} }

// mkPod returns a running Pod on nodeName with ip ("" = none yet).
func mkPod(ns, name, nodeName, ip string, lbls map[string]string) *corev1.Pod {
	p := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name, UID: types.UID("uid-" + ns + "-" + name), Labels: lbls},
		Spec:       corev1.PodSpec{NodeName: nodeName, Containers: []corev1.Container{{Name: "c"}}},
		Status:     corev1.PodStatus{Phase: corev1.PodRunning},
	}
	if ip != "" {
		p.Status.PodIPs = []corev1.PodIP{{IP: ip}}
	}
	return p
}

func sel(ml map[string]string, exprs ...metav1.LabelSelectorRequirement) *metav1.LabelSelector {
	return &metav1.LabelSelector{MatchLabels: ml, MatchExpressions: exprs}
}

func mkNP(ns, name string, pod *metav1.LabelSelector, ingress []networkingv1.NetworkPolicyIngressRule,
	egress []networkingv1.NetworkPolicyEgressRule, types_ ...networkingv1.PolicyType) *networkingv1.NetworkPolicy {
	np := &networkingv1.NetworkPolicy{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name, UID: types.UID("np-uid-" + ns + "-" + name)},
		Spec:       networkingv1.NetworkPolicySpec{Ingress: ingress, Egress: egress, PolicyTypes: types_},
	}
	if pod != nil {
		np.Spec.PodSelector = *pod
	}
	return np
}

func from(peers ...networkingv1.NetworkPolicyPeer) []networkingv1.NetworkPolicyIngressRule {
	return []networkingv1.NetworkPolicyIngressRule{{From: peers}}
}

func peer(pod, ns *metav1.LabelSelector) networkingv1.NetworkPolicyPeer {
	return networkingv1.NetworkPolicyPeer{PodSelector: pod, NamespaceSelector: ns}
}

// policyObj returns the computed policy of a source policy built by mkNP.
func policyObj(t *testing.T, m *Model, ns, name string) (*v1alpha1.NetworkPolicy, bool) {
	t.Helper()
	o, ok := m.Desired(Key{KindNetworkPolicy, "np-np-uid-" + ns + "-" + name})
	if !ok {
		return nil, false
	}
	return o.(*v1alpha1.NetworkPolicy), true
}

func mustPolicy(t *testing.T, m *Model, ns, name string) *v1alpha1.NetworkPolicy {
	t.Helper()
	p, ok := policyObj(t, m, ns, name)
	if !ok {
		t.Fatalf("computed policy of %s/%s does not exist", ns, name)
	}
	return p
}

// atgMembers returns "ns/name" of the members of the AppliedToGroup of key
// on nodeName (nil if it does not exist).
func atgMembers(m *Model, key, nodeName string) []string {
	o, ok := m.Desired(Key{KindAppliedToGroup, key + "-" + v1alpha1.NodeKey(nodeName)})
	if !ok {
		return nil
	}
	var out []string
	for _, mb := range o.(*v1alpha1.AppliedToGroup).Spec.Members {
		out = append(out, mb.Namespace+"/"+mb.Name)
	}
	return out
}

// agAll returns every slice of AddressGroup key as slice → member names.
func agAll(m *Model, key string) map[int][]string {
	out := map[int][]string{}
	for _, k := range m.DesiredKeys() {
		if k.Kind != KindAddressGroup {
			continue
		}
		o, _ := m.Desired(k)
		ag := o.(*v1alpha1.AddressGroup)
		if ag.Labels[v1alpha1.GroupLabel] != key {
			continue
		}
		names := []string{}
		for _, mb := range ag.Spec.Members {
			names = append(names, mb.Namespace+"/"+mb.Name)
		}
		out[int(ag.Spec.Slice)] = names
	}
	return out
}

// snapshot renders every desired object as JSON by key.
func snapshot(t *testing.T, m *Model) map[Key]string {
	t.Helper()
	out := map[Key]string{}
	for _, k := range m.DesiredKeys() {
		o, ok := m.Desired(k)
		if !ok {
			t.Fatalf("DesiredKeys lists %v but Desired says it does not exist", k)
		}
		b, err := json.Marshal(o)
		if err != nil {
			t.Fatal(err)
		}
		out[k] = string(b)
	}
	return out
}

func keySet(ks []Key) map[Key]bool {
	out := map[Key]bool{}
	for _, k := range ks {
		out[k] = true
	}
	return out
}

func spanNodes(labels map[string]string, nodes ...string) []string {
	var in []string
	for _, n := range nodes {
		if _, ok := labels[v1alpha1.SpanLabel(n)]; ok {
			in = append(in, n)
		}
	}
	return in
}
