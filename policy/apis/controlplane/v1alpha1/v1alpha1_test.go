package v1alpha1

import (
	"strings"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/apimachinery/pkg/util/validation"
)

// Span labels of the longest Node names are valid label keys and differ per
// Node.
func TestSpanLabelIsValidLabelKey(t *testing.T) {
	long := strings.Repeat("a", 253)
	a, b := SpanLabel(long), SpanLabel(long[:252])
	for _, l := range []string{a, b, SpanLabel("n1")} {
		if errs := validation.IsQualifiedName(l); len(errs) > 0 {
			t.Errorf("SpanLabel %q is not a valid label key: %v", l, errs)
		}
	}
	if a == b || !strings.HasPrefix(a, SpanLabelPrefix) {
		t.Errorf("SpanLabel: %q and %q", a, b)
	}
	if errs := validation.IsDNS1123Subdomain(NodeKey(long)); len(errs) > 0 {
		t.Errorf("NodeKey is not a valid object name: %v", errs)
	}
}

// The generated deep copies share no memory with the original.
func TestDeepCopyIsIndependent(t *testing.T) {
	port := intstr.FromInt32(80)
	end := int32(90)
	np := &NetworkPolicy{
		ObjectMeta: metav1.ObjectMeta{Name: "np-1", Labels: map[string]string{SpanLabel("n1"): ""}},
		Spec: NetworkPolicySpec{
			PolicyTypes: []string{"Ingress"},
			Rules: []Rule{{Direction: DirectionIn, AddressGroups: []string{"g"},
				IPBlocks: []IPBlock{{CIDR: "10.0.0.0/8", Except: []string{"10.1.0.0/16"}}},
				Ports:    []PolicyPort{{Protocol: "TCP", Port: &port, EndPort: &end}}}},
		},
	}
	cp := np.DeepCopyObject().(*NetworkPolicy)
	cp.Labels["x"] = "y"
	cp.Spec.PolicyTypes[0] = "Egress"
	cp.Spec.Rules[0].AddressGroups[0] = "h"
	cp.Spec.Rules[0].IPBlocks[0].Except[0] = "x"
	cp.Spec.Rules[0].Ports[0].Port.IntVal = 81
	*cp.Spec.Rules[0].Ports[0].EndPort = 91
	r := np.Spec.Rules[0]
	if len(np.Labels) != 1 || np.Spec.PolicyTypes[0] != "Ingress" || r.AddressGroups[0] != "g" ||
		r.IPBlocks[0].Except[0] != "10.1.0.0/16" || r.Ports[0].Port.IntVal != 80 || *r.Ports[0].EndPort != 90 {
		t.Errorf("original changed through its copy: %+v", np)
	}

	pr := &PodRealization{Spec: PodRealizationSpec{Pods: map[string]string{"a/b/c": "d"}}}
	prc := pr.DeepCopy()
	prc.Spec.Pods["a/b/c"] = "e"
	if pr.Spec.Pods["a/b/c"] != "d" {
		t.Errorf("PodRealization pods shared with copy")
	}
	ag := &AddressGroup{Spec: AddressGroupSpec{
		Selector: GroupSelector{PodSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"app": "x"}}},
		Members:  []GroupMember{{IPs: []string{"10.0.0.1"}, Ports: []NamedPort{{Name: "http", Port: 80}}}},
	}}
	agc := ag.DeepCopy()
	agc.Spec.Selector.PodSelector.MatchLabels["app"] = "y"
	agc.Spec.Members[0].IPs[0] = "10.0.0.2"
	agc.Spec.Members[0].Ports[0].Port = 81
	if ag.Spec.Selector.PodSelector.MatchLabels["app"] != "x" || ag.Spec.Members[0].IPs[0] != "10.0.0.1" || ag.Spec.Members[0].Ports[0].Port != 80 {
		t.Errorf("AddressGroup shares memory with its copy: %+v", ag)
	}
}

// Every kind and its list are registered and are runtime.Objects.
func TestAddToScheme(t *testing.T) {
	s := runtime.NewScheme()
	if err := AddToScheme(s); err != nil {
		t.Fatal(err)
	}
	for _, kind := range []string{"AddressGroup", "AppliedToGroup", "NetworkPolicy", "PodRealization"} {
		for _, k := range []string{kind, kind + "List"} {
			if _, err := s.New(SchemeGroupVersion.WithKind(k)); err != nil {
				t.Errorf("scheme lacks %s: %v", k, err)
			}
		}
	}
}

// Doubling a Node's PodRealization slices moves a Pod from slice i only to
// slice i or i+slices; slice names are valid object names; one slice is
// the unsliced object.
func TestPodRealizationSlice(t *testing.T) {
	key := NodeKey(strings.Repeat("a", 253))
	if PodRealizationName(key, 0) != key || PodRealizationSlice("ns", "p", 1) != 0 || PodRealizationSlice("ns", "p", 0) != 0 {
		t.Fatal("slice 0 of an unsliced PodRealization is not the Node's object")
	}
	if errs := validation.IsDNS1123Subdomain(PodRealizationName(key, 1023)); len(errs) > 0 {
		t.Errorf("slice name is not a valid object name: %v", errs)
	}
	seen := map[int]bool{}
	for i := range 1000 {
		name := "pod-" + strings.Repeat("x", i%7) + string(rune('a'+i%26)) + strings.Repeat("y", i/26)
		for s := 1; s <= 64; s *= 2 {
			a, b := PodRealizationSlice("ns", name, s), PodRealizationSlice("ns", name, 2*s)
			if a < 0 || a >= s || (b != a && b != a+s) {
				t.Fatalf("%s: slice %d of %d, then %d of %d", name, a, s, b, 2*s)
			}
		}
		seen[PodRealizationSlice("ns", name, 8)] = true
	}
	if len(seen) != 8 {
		t.Errorf("1,000 Pods fill only %d of 8 slices", len(seen))
	}
}
