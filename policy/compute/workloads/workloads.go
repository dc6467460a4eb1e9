// Package workloads generates the scale shapes the policy controller is
// benchmarked with (modelled on the shapes of Antrea's NetworkPolicy
// controller benchmarks, written anew here): many small namespaces, many
// label-selective policies, one group shared by every policy, and one policy
// per Pod. Pods are spread round-robin over the Nodes and carry one IPv4
// address each.
package workloads

import (
	"fmt"

	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
)

// Workload is a set of source objects.
type Workload struct {
	Name       string
	Nodes      []*corev1.Node
	Namespaces []*corev1.Namespace
	Pods       []*corev1.Pod
	Policies   []*networkingv1.NetworkPolicy
}

// NodeCount is how many Nodes every workload spreads its Pods over.
const NodeCount = 100

type builder struct {
	w    Workload
	npod int
	// podSink, when set, receives each Pod instead of Workload.Pods.
	podSink func(*corev1.Pod)
}

// Option changes how a workload is built.
type Option func(*builder)

// PodsTo hands each Pod to sink as it is made instead of keeping it in
// Workload.Pods, so that a benchmark holds only the form its consumer
// keeps (the policy controller's informer keeps a compact one).
func PodsTo(sink func(*corev1.Pod)) Option { return func(b *builder) { b.podSink = sink } }

func newBuilder(name string, opts []Option) *builder {
	b := &builder{w: Workload{Name: name}}
	for _, o := range opts {
		o(b)
	}
	for i := 0; i < NodeCount; i++ {
		b.w.Nodes = append(b.w.Nodes, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("node-%03d", i)}})
	}
	return b
}

func (b *builder) ns(name string) {
	b.w.Namespaces = append(b.w.Namespaces, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{
		Name: name, Labels: map[string]string{"kubernetes.io/metadata.name": name}}})
}

func (b *builder) pod(ns, name string, lbls map[string]string) {
	i := b.npod
	b.npod++
	p := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name, UID: types.UID(fmt.Sprintf("pod-%d", i)), Labels: lbls},
		Spec: corev1.PodSpec{
			NodeName:   b.w.Nodes[i%NodeCount].Name,
			Containers: []corev1.Container{{Name: "c", Image: "none", Ports: []corev1.ContainerPort{{Name: "http", ContainerPort: 8080}}}},
		},
		Status: corev1.PodStatus{Phase: corev1.PodRunning, PodIPs: []corev1.PodIP{{IP: fmt.Sprintf("10.%d.%d.%d", 64+i>>16&63, i>>8&255, i&255)}}},
	}
	if b.podSink != nil {
		b.podSink(p)
		return
	}
	b.w.Pods = append(b.w.Pods, p)
}

func (b *builder) policy(ns, name string, target, from *metav1.LabelSelector, types_ ...networkingv1.PolicyType) {
	np := &networkingv1.NetworkPolicy{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name, UID: types.UID(fmt.Sprintf("np-%d", len(b.w.Policies)))},
		Spec:       networkingv1.NetworkPolicySpec{PolicyTypes: types_},
	}
	if target != nil {
		np.Spec.PodSelector = *target
	}
	if from != nil {
		np.Spec.Ingress = []networkingv1.NetworkPolicyIngressRule{{From: []networkingv1.NetworkPolicyPeer{{PodSelector: from}}}}
	}
	b.w.Policies = append(b.w.Policies, np)
}

func match(k, v string) *metav1.LabelSelector {
	return &metav1.LabelSelector{MatchLabels: map[string]string{k: v}}
}

// SmallNamespaces is workload 1: n namespaces (25,000 at full size), each
// with a default-deny policy, a policy for app=a allowing app=b, one for
// app=b allowing app=a, and 4 Pods (2 a, 2 b).
func SmallNamespaces(n int, opts ...Option) Workload {
	b := newBuilder("small-namespaces", opts)
	for i := 0; i < n; i++ {
		ns := fmt.Sprintf("ns-%d", i)
		b.ns(ns)
		b.policy(ns, "default-deny", nil, nil, networkingv1.PolicyTypeIngress)
		b.policy(ns, "allow-a", match("app", "a"), match("app", "b"))
		b.policy(ns, "allow-b", match("app", "b"), match("app", "a"))
		for j := 0; j < 4; j++ {
			b.pod(ns, fmt.Sprintf("pod-%d", j), map[string]string{"app": []string{"a", "b"}[j%2]})
		}
	}
	return b.w
}

// LabelledPolicies is workload 2: nsCount namespaces (100), each with a
// default-deny policy and perNS policies (100), policy j selecting the
// Pods labelled l=j and allowing them among themselves, with podsPerLabel
// (10) Pods per label.
func LabelledPolicies(nsCount, perNS, podsPerLabel int, opts ...Option) Workload {
	b := newBuilder("labelled-policies", opts)
	for i := 0; i < nsCount; i++ {
		ns := fmt.Sprintf("ns-%d", i)
		b.ns(ns)
		b.policy(ns, "default-deny", nil, nil, networkingv1.PolicyTypeIngress)
		for j := 0; j < perNS; j++ {
			l := fmt.Sprintf("l%d", j)
			b.policy(ns, "np-"+l, match("l", l), match("l", l))
			for k := 0; k < podsPerLabel; k++ {
				b.pod(ns, fmt.Sprintf("pod-%d-%d", j, k), map[string]string{"l": l})
			}
		}
	}
	return b.w
}

// SharedGroup is workload 3: one namespace with pods Pods (10,000) and
// policies policies (10,000) that all select every Pod as targets and as
// peers.
func SharedGroup(pods, policies int, opts ...Option) Workload {
	b := newBuilder("shared-group", opts)
	b.ns("shared")
	for i := 0; i < pods; i++ {
		b.pod("shared", fmt.Sprintf("pod-%d", i), map[string]string{"app": "web"})
	}
	all := &metav1.LabelSelector{}
	for i := 0; i < policies; i++ {
		b.policy("shared", fmt.Sprintf("np-%d", i), all, all)
	}
	return b.w
}

// PolicyPerPod is workload 4: one namespace with n Pods (10,000) and one
// policy per Pod selecting it and allowing the next Pod.
func PolicyPerPod(n int, opts ...Option) Workload {
	b := newBuilder("policy-per-pod", opts)
	b.ns("per-pod")
	for i := 0; i < n; i++ {
		b.pod("per-pod", fmt.Sprintf("pod-%d", i), map[string]string{"pod": fmt.Sprintf("p%d", i)})
	}
	for i := 0; i < n; i++ {
		b.policy("per-pod", fmt.Sprintf("np-%d", i), match("pod", fmt.Sprintf("p%d", i)), match("pod", fmt.Sprintf("p%d", (i+1)%n)))
	}
	return b.w
}

// Spec names a workload and builds it on demand (a full-size workload
// holds hundreds of MB of objects, so only the one in use should exist).
type Spec struct {
	Name  string
	Build func(opts ...Option) Workload
}

// All returns workloads 1–4 with every count divided by scale (1 = full
// size: 100,000 Pods in 1 and 2, 10,000 in 3 and 4; workload 2 scales its
// namespace count).
func All(scale int) []Spec {
	if scale < 1 {
		scale = 1
	}
	return []Spec{
		{"small-namespaces", func(o ...Option) Workload { return SmallNamespaces(25000/scale, o...) }},
		{"labelled-policies", func(o ...Option) Workload { return LabelledPolicies(max(100/scale, 1), 100, 10, o...) }},
		{"shared-group", func(o ...Option) Workload { return SharedGroup(10000/scale, 10000/scale, o...) }},
		{"policy-per-pod", func(o ...Option) Workload { return PolicyPerPod(10000/scale, o...) }},
	}
}
