package compute

import (
	"fmt"
	"math/rand"
	"reflect"
	"slices"
	"sort"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"

	"github.com/seine-net/seine/policy/apis/controlplane/v1alpha1"
	"github.com/seine-net/seine/policy/realization"
)

func TestGroupKeyNormalization(t *testing.T) {
	a := v1alpha1.GroupSelector{Namespace: "ns", PodSelector: sel(map[string]string{"a": "1", "b": "2"},
		metav1.LabelSelectorRequirement{Key: "x", Operator: metav1.LabelSelectorOpIn, Values: []string{"q", "p", "q"}},
		metav1.LabelSelectorRequirement{Key: "c", Operator: metav1.LabelSelectorOpExists})}
	b := v1alpha1.GroupSelector{Namespace: "ns", PodSelector: sel(map[string]string{"b": "2", "a": "1"},
		metav1.LabelSelectorRequirement{Key: "c", Operator: metav1.LabelSelectorOpExists},
		metav1.LabelSelectorRequirement{Key: "x", Operator: metav1.LabelSelectorOpIn, Values: []string{"p", "q"}})}
	if GroupKey(a) != GroupKey(b) {
		t.Errorf("equivalent selectors got keys %s and %s", GroupKey(a), GroupKey(b))
	}
	empty := v1alpha1.GroupSelector{Namespace: "ns", PodSelector: &metav1.LabelSelector{}}
	nilSel := v1alpha1.GroupSelector{Namespace: "ns"}
	if GroupKey(empty) != GroupKey(nilSel) {
		t.Error("empty and nil pod selectors must share a group")
	}
	other := v1alpha1.GroupSelector{Namespace: "other"}
	if GroupKey(other) == GroupKey(nilSel) {
		t.Error("groups of different namespaces must differ")
	}
	allNS := v1alpha1.GroupSelector{Namespace: "ns", NamespaceSelector: &metav1.LabelSelector{}}
	if GroupKey(allNS) == GroupKey(nilSel) {
		t.Error("namespaceSelector {} (all namespaces) must differ from the policy namespace")
	}
	if k := GroupKey(a); len(k) != 17 || k[0] != 'g' || slices.Contains([]byte(k), '-') {
		t.Errorf("key %q: want g + 16 hex digits", k)
	}
}

func TestSelectorsAndTargets(t *testing.T) {
	m := New(0)
	m.UpsertNamespace(mkNS("ns", nil))
	m.UpsertPod(mkPod("ns", "web1", "n1", "10.0.0.1", map[string]string{"app": "web", "tier": "fe"}))
	m.UpsertPod(mkPod("ns", "web2", "n2", "10.0.0.2", map[string]string{"app": "web"}))
	m.UpsertPod(mkPod("ns", "db", "n1", "10.0.0.3", map[string]string{"app": "db"}))
	m.UpsertPod(mkPod("other", "web3", "n1", "10.0.0.4", map[string]string{"app": "web"}))
	// Terminal, hostNetwork and unscheduled Pods are never targets.
	done := mkPod("ns", "done", "n1", "10.0.0.5", map[string]string{"app": "web"})
	done.Status.Phase = corev1.PodSucceeded
	m.UpsertPod(done)
	hn := mkPod("ns", "hostnet", "n1", "10.0.0.6", map[string]string{"app": "web"})
	hn.Spec.HostNetwork = true
	m.UpsertPod(hn)
	m.UpsertPod(mkPod("ns", "pending", "", "", map[string]string{"app": "web"}))

	m.UpsertNetworkPolicy(mkNP("ns", "labels", sel(map[string]string{"app": "web"}), nil, nil))
	m.UpsertNetworkPolicy(mkNP("ns", "exprs", sel(nil,
		metav1.LabelSelectorRequirement{Key: "app", Operator: metav1.LabelSelectorOpNotIn, Values: []string{"web"}}), nil, nil))
	m.UpsertNetworkPolicy(mkNP("ns", "exists", sel(nil,
		metav1.LabelSelectorRequirement{Key: "tier", Operator: metav1.LabelSelectorOpExists}), nil, nil))
	m.UpsertNetworkPolicy(mkNP("ns", "all", nil, nil, nil))

	cases := []struct {
		policy string
		n1, n2 []string
	}{
		{"labels", []string{"ns/web1"}, []string{"ns/web2"}},
		{"exprs", []string{"ns/db"}, nil},
		{"exists", []string{"ns/web1"}, nil},
		{"all", []string{"ns/db", "ns/web1"}, []string{"ns/web2"}},
	}
	for _, c := range cases {
		p := mustPolicy(t, m, "ns", c.policy)
		if got := atgMembers(m, p.Spec.AppliedToGroup, "n1"); !reflect.DeepEqual(got, c.n1) {
			t.Errorf("%s on n1: got %v, want %v", c.policy, got, c.n1)
		}
		if got := atgMembers(m, p.Spec.AppliedToGroup, "n2"); !reflect.DeepEqual(got, c.n2) {
			t.Errorf("%s on n2: got %v, want %v", c.policy, got, c.n2)
		}
		want := []string{"n1"}
		if c.n2 != nil {
			want = append(want, "n2")
		}
		if got := spanNodes(p.Labels, "n1", "n2", "n3"); !reflect.DeepEqual(got, want) {
			t.Errorf("%s span %v, want %v", c.policy, got, want)
		}
		if p.Status.SpanSize != int32(len(want)) {
			t.Errorf("%s spanSize %d", c.policy, p.Status.SpanSize)
		}
	}
	// A policy that selects nothing has an empty span: no object.
	m.UpsertNetworkPolicy(mkNP("ns", "none", sel(map[string]string{"app": "nothing"}), nil, nil))
	if _, ok := policyObj(t, m, "ns", "none"); ok {
		t.Error("policy with no target Pod must not exist")
	}
}

func TestPeersNamespaceSelectorAndSharing(t *testing.T) {
	m := New(0)
	m.UpsertNamespace(mkNS("a", map[string]string{"team": "x"}))
	m.UpsertNamespace(mkNS("b", map[string]string{"team": "x"}))
	m.UpsertNamespace(mkNS("c", map[string]string{"team": "y"}))
	for i, ns := range []string{"a", "b", "c"} {
		m.UpsertPod(mkPod(ns, "web", "n1", fmt.Sprintf("10.0.%d.1", i), map[string]string{"app": "web"}))
		m.UpsertPod(mkPod(ns, "db", "n2", fmt.Sprintf("10.0.%d.2", i), map[string]string{"app": "db"}))
	}
	teamX := sel(map[string]string{"team": "x"})
	web := sel(map[string]string{"app": "web"})
	m.UpsertNetworkPolicy(mkNP("a", "p", sel(map[string]string{"app": "db"}), from(
		peer(web, nil),   // web in a
		peer(nil, teamX), // everything in a, b
		peer(web, teamX), // web in a, b
		networkingv1.NetworkPolicyPeer{IPBlock: &networkingv1.IPBlock{CIDR: "192.0.2.0/24", Except: []string{"192.0.2.1/32"}}},
	), nil))
	p := mustPolicy(t, m, "a", "p")
	if len(p.Spec.Rules) != 1 || len(p.Spec.Rules[0].AddressGroups) != 3 || p.Spec.Rules[0].AllPeers {
		t.Fatalf("rules: %+v", p.Spec.Rules)
	}
	if got := p.Spec.Rules[0].IPBlocks; !reflect.DeepEqual(got, []v1alpha1.IPBlock{{CIDR: "192.0.2.0/24", Except: []string{"192.0.2.1/32"}}}) {
		t.Errorf("ipBlocks %v", got)
	}
	want := [][]string{{"a/web"}, {"a/db", "a/web", "b/db", "b/web"}, {"a/web", "b/web"}}
	for i, key := range p.Spec.Rules[0].AddressGroups {
		got := agAll(m, key)
		if !reflect.DeepEqual(got, map[int][]string{0: want[i]}) {
			t.Errorf("peer %d: got %v, want %v", i, got, want[i])
		}
	}
	// Namespace relabel: c joins team x.
	m.TakeDirty()
	m.UpsertNamespace(mkNS("c", map[string]string{"team": "x"}))
	dirty := keySet(m.TakeDirty())
	if got := agAll(m, p.Spec.Rules[0].AddressGroups[2]); !reflect.DeepEqual(got[0], []string{"a/web", "b/web", "c/web"}) {
		t.Errorf("after relabel: %v", got)
	}
	if dirty[Key{KindAddressGroup, p.Spec.Rules[0].AddressGroups[0] + "-0"}] {
		t.Error("namespace relabel of c must not touch the group of a's web Pods")
	}
	if !dirty[Key{KindAddressGroup, p.Spec.Rules[0].AddressGroups[2] + "-0"}] {
		t.Error("namespace relabel of c must touch the team-x web group")
	}
	if dirty[Key{KindNetworkPolicy, p.Name}] {
		t.Error("namespace relabel must not touch the policy itself")
	}

	// Group sharing: a second policy with the same selectors shares groups.
	m.UpsertNetworkPolicy(mkNP("a", "q", sel(map[string]string{"app": "db"}), from(peer(web, teamX)), nil))
	q := mustPolicy(t, m, "a", "q")
	if q.Spec.AppliedToGroup != p.Spec.AppliedToGroup || q.Spec.Rules[0].AddressGroups[0] != p.Spec.Rules[0].AddressGroups[2] {
		t.Error("identical selectors must share groups")
	}
	// The shared AddressGroup survives deleting one of its users.
	m.DeleteNetworkPolicy("a", "p")
	if len(agAll(m, q.Spec.Rules[0].AddressGroups[0])) != 1 {
		t.Error("shared AddressGroup vanished with one of its policies")
	}
	if len(agAll(m, p.Spec.Rules[0].AddressGroups[0])) != 0 {
		t.Error("AddressGroup only p used must be gone")
	}
}

func TestSpansOfAddressGroups(t *testing.T) {
	m := New(0)
	m.UpsertPod(mkPod("ns", "client", "n1", "10.0.0.1", map[string]string{"app": "client"}))
	m.UpsertPod(mkPod("ns", "srv1", "n2", "10.0.0.2", map[string]string{"app": "srv"}))
	m.UpsertPod(mkPod("ns", "srv2", "n3", "10.0.0.3", map[string]string{"app": "srv"}))
	client := sel(map[string]string{"app": "client"})
	m.UpsertNetworkPolicy(mkNP("ns", "p", sel(map[string]string{"app": "srv"}), from(peer(client, nil)), nil))
	p := mustPolicy(t, m, "ns", "p")
	agKey := p.Spec.Rules[0].AddressGroups[0]
	o, ok := m.Desired(Key{KindAddressGroup, agKey + "-0"})
	if !ok {
		t.Fatal("client AddressGroup missing")
	}
	// The client group is needed where the servers are (n2, n3), not where
	// the client runs.
	if got := spanNodes(o.(*v1alpha1.AddressGroup).Labels, "n1", "n2", "n3"); !reflect.DeepEqual(got, []string{"n2", "n3"}) {
		t.Errorf("AddressGroup span %v", got)
	}
	// ATG spans its node only.
	o, ok = m.Desired(Key{KindAppliedToGroup, p.Spec.AppliedToGroup + "-" + v1alpha1.NodeKey("n2")})
	if !ok || !reflect.DeepEqual(spanNodes(o.GetLabels(), "n1", "n2", "n3"), []string{"n2"}) {
		t.Errorf("ATG span labels %v", o.GetLabels())
	}
	// A second policy on n1 extends the span.
	m.UpsertNetworkPolicy(mkNP("ns", "q", client, from(peer(client, nil)), nil))
	o, _ = m.Desired(Key{KindAddressGroup, agKey + "-0"})
	if got := spanNodes(o.GetLabels(), "n1", "n2", "n3"); len(got) != 3 {
		t.Errorf("span after q: %v", got)
	}
	// Servers go away: p has no span any more; the group spans n1 only.
	m.DeletePod("ns", "srv1")
	m.DeletePod("ns", "srv2")
	if _, ok := policyObj(t, m, "ns", "p"); ok {
		t.Error("p without targets must not exist")
	}
	o, _ = m.Desired(Key{KindAddressGroup, agKey + "-0"})
	if got := spanNodes(o.GetLabels(), "n1", "n2", "n3"); !reflect.DeepEqual(got, []string{"n1"}) {
		t.Errorf("span after servers left: %v", got)
	}
	m.DeleteNetworkPolicy("ns", "q")
	if _, ok := m.Desired(Key{KindAddressGroup, agKey + "-0"}); ok {
		t.Error("AddressGroup with empty span must not exist")
	}
}

func TestSlicingStability(t *testing.T) {
	m := New(2)
	lbl := map[string]string{"app": "x"}
	for i := 0; i < 5; i++ {
		m.UpsertPod(mkPod("ns", fmt.Sprintf("p%d", i), "n1", fmt.Sprintf("10.0.0.%d", i+1), lbl))
	}
	m.UpsertNetworkPolicy(mkNP("ns", "p", nil, from(peer(sel(lbl), nil)), nil))
	key := mustPolicy(t, m, "ns", "p").Spec.Rules[0].AddressGroups[0]
	all := agAll(m, key)
	if len(all) != 3 || len(all[0]) != 2 || len(all[1]) != 2 || len(all[2]) != 1 {
		t.Fatalf("slices %v", all)
	}
	slot := map[string]int{}
	for s, names := range all {
		for _, n := range names {
			slot[n] = s
		}
	}
	victim := all[0][0]
	m.TakeDirty()
	m.DeletePod("ns", victim[len("ns/"):])
	dirty := m.TakeDirty()
	var agDirty []string
	for _, k := range dirty {
		if k.Kind == KindAddressGroup {
			agDirty = append(agDirty, k.Name)
		}
	}
	if !reflect.DeepEqual(agDirty, []string{key + "-0"}) {
		t.Errorf("deleting one Pod touched AddressGroups %v", agDirty)
	}
	// A new Pod fills the hole in slice 0; nobody else moves.
	m.UpsertPod(mkPod("ns", "new", "n1", "10.0.0.99", lbl))
	all = agAll(m, key)
	for s, names := range all {
		for _, n := range names {
			if n == "ns/new" {
				if s != 0 {
					t.Errorf("new Pod went to slice %d, want the hole in 0", s)
				}
				continue
			}
			if slot[n] != s {
				t.Errorf("%s moved from slice %d to %d", n, slot[n], s)
			}
		}
	}
	// Emptying the last slice shrinks the count; the PodRealization digest
	// reflects slice counts.
	m.UpsertNode(mkNode("n1"))
	before := prDigests(t, m, "n1")
	m.DeletePod("ns", all[2][0][len("ns/"):])
	if got := agAll(m, key); len(got) != 2 {
		t.Errorf("slices after emptying the last: %v", got)
	}
	after := prDigests(t, m, "n1")
	if before["ns/p0/uid-ns-p0"] == after["ns/p0/uid-ns-p0"] && before["ns/p1/uid-ns-p1"] == after["ns/p1/uid-ns-p1"] {
		t.Error("digest did not change with the slice count")
	}
	// Losing the IP releases the slice; gaining one assigns it again.
	m.TakeDirty()
	p := mkPod("ns", "new", "n1", "", lbl)
	m.UpsertPod(p)
	if got := agAll(m, key); slices.Contains(got[0], "ns/new") {
		t.Error("Pod without IPs is still an AddressGroup member")
	}
}

func prDigests(t *testing.T, m *Model, nodeName string) map[string]string {
	t.Helper()
	o, ok := m.Desired(Key{KindPodRealization, v1alpha1.NodeKey(nodeName)})
	if !ok {
		t.Fatalf("no PodRealization for %s", nodeName)
	}
	return o.(*v1alpha1.PodRealization).Spec.Pods
}

func TestNamedPortsAndPolicyTypes(t *testing.T) {
	m := New(0)
	p := mkPod("ns", "web", "n1", "10.0.0.1", map[string]string{"app": "web"})
	p.Spec.Containers = []corev1.Container{
		{Name: "a", Ports: []corev1.ContainerPort{{Name: "http", ContainerPort: 8080}, {ContainerPort: 9}}},
		{Name: "b", Ports: []corev1.ContainerPort{{Name: "dns", ContainerPort: 53, Protocol: corev1.ProtocolUDP}}},
	}
	m.UpsertPod(p)
	udp := corev1.ProtocolUDP
	named := intstr.FromString("http")
	end := int32(90)
	n80 := intstr.FromInt32(80)
	np := mkNP("ns", "ports", nil, []networkingv1.NetworkPolicyIngressRule{{Ports: []networkingv1.NetworkPolicyPort{
		{Port: &named}, {Protocol: &udp, Port: &n80, EndPort: &end}, {}}}}, nil)
	m.UpsertNetworkPolicy(np)
	pol := mustPolicy(t, m, "ns", "ports")
	o, _ := m.Desired(Key{KindAppliedToGroup, pol.Spec.AppliedToGroup + "-" + v1alpha1.NodeKey("n1")})
	wantPorts := []v1alpha1.NamedPort{{Name: "http", Protocol: "TCP", Port: 8080}, {Name: "dns", Protocol: "UDP", Port: 53}}
	if got := o.(*v1alpha1.AppliedToGroup).Spec.Members[0].Ports; !reflect.DeepEqual(got, wantPorts) {
		t.Errorf("named ports %v, want %v", got, wantPorts)
	}
	r := pol.Spec.Rules[0]
	if !r.AllPeers || r.Direction != v1alpha1.DirectionIn || len(r.Ports) != 3 {
		t.Fatalf("rule %+v", r)
	}
	if r.Ports[0].Protocol != "TCP" || r.Ports[0].Port.StrVal != "http" || r.Ports[1].Protocol != "UDP" ||
		r.Ports[1].Port.IntVal != 80 || *r.Ports[1].EndPort != 90 || r.Ports[2].Port != nil || r.Ports[2].Protocol != "TCP" {
		t.Errorf("ports %+v", r.Ports)
	}

	egress := []networkingv1.NetworkPolicyEgressRule{{}}
	ingress := []networkingv1.NetworkPolicyIngressRule{{}}
	cases := []struct {
		name      string
		in        []networkingv1.NetworkPolicyIngressRule
		eg        []networkingv1.NetworkPolicyEgressRule
		explicit  []networkingv1.PolicyType
		wantTypes []string
		wantDirs  []v1alpha1.Direction
	}{
		{"deny-ingress", nil, nil, nil, []string{"Ingress"}, nil},
		{"implied-egress", ingress, egress, nil, []string{"Ingress", "Egress"}, []v1alpha1.Direction{"In", "Out"}},
		{"egress-only", ingress, egress, []networkingv1.PolicyType{"Egress"}, []string{"Egress"}, []v1alpha1.Direction{"Out"}},
		{"deny-all", nil, nil, []networkingv1.PolicyType{"Egress", "Ingress"}, []string{"Ingress", "Egress"}, nil},
	}
	for _, c := range cases {
		m.UpsertNetworkPolicy(mkNP("ns", c.name, nil, c.in, c.eg, c.explicit...))
		pol := mustPolicy(t, m, "ns", c.name)
		if !reflect.DeepEqual(pol.Spec.PolicyTypes, c.wantTypes) {
			t.Errorf("%s: policyTypes %v, want %v", c.name, pol.Spec.PolicyTypes, c.wantTypes)
		}
		var dirs []v1alpha1.Direction
		for _, r := range pol.Spec.Rules {
			dirs = append(dirs, r.Direction)
			if !r.AllPeers {
				t.Errorf("%s: empty from/to must be AllPeers", c.name)
			}
		}
		if !reflect.DeepEqual(dirs, c.wantDirs) {
			t.Errorf("%s: rule directions %v, want %v", c.name, dirs, c.wantDirs)
		}
	}
}

func TestPodChangesTouchOnlyTheirObjects(t *testing.T) {
	m := New(0)
	for i := 0; i < 4; i++ {
		m.UpsertNode(mkNode(fmt.Sprintf("n%d", i)))
	}
	for i := 0; i < 20; i++ {
		m.UpsertPod(mkPod("ns", fmt.Sprintf("p%d", i), fmt.Sprintf("n%d", i%4), fmt.Sprintf("10.0.0.%d", i+1),
			map[string]string{"app": fmt.Sprintf("a%d", i%5)}))
	}
	for i := 0; i < 5; i++ {
		s := sel(map[string]string{"app": fmt.Sprintf("a%d", i)})
		m.UpsertNetworkPolicy(mkNP("ns", fmt.Sprintf("np%d", i), s, from(peer(s, nil)), nil))
	}
	m.TakeDirty()
	g0 := mustPolicy(t, m, "ns", "np0").Spec.AppliedToGroup
	g1 := mustPolicy(t, m, "ns", "np1").Spec.AppliedToGroup
	// p0 (a0, on n0) becomes a1: it leaves group a0 and joins group a1.
	m.UpsertPod(mkPod("ns", "p0", "n0", "10.0.0.1", map[string]string{"app": "a1"}))
	got := keySet(m.TakeDirty())
	want := keySet([]Key{
		{KindAppliedToGroup, g0 + "-" + v1alpha1.NodeKey("n0")},
		{KindAppliedToGroup, g1 + "-" + v1alpha1.NodeKey("n0")},
		{KindAddressGroup, g0 + "-0"},
		{KindAddressGroup, g1 + "-0"},
		{KindPodRealization, v1alpha1.NodeKey("n0")},
	})
	// Pods of a1: p1 (n1), p6 (n2), p11 (n3), p16 (n0): a1 already spans
	// n0; a0 keeps p5 (n1), p10 (n2), p15 (n3) and loses n0, so np0's span
	// changes and its AddressGroup's span (the span of np0) too.
	want[Key{KindNetworkPolicy, "np-np-uid-ns-np0"}] = true
	if !reflect.DeepEqual(got, want) {
		t.Errorf("label change dirtied\n%v\nwant\n%v", got, want)
	}
	// An update that changes nothing relevant is free.
	p := mkPod("ns", "p0", "n0", "10.0.0.1", map[string]string{"app": "a1"})
	p.Status.Conditions = []corev1.PodCondition{{Type: corev1.PodReady, Status: corev1.ConditionTrue}}
	m.UpsertPod(p)
	if d := m.TakeDirty(); len(d) != 0 {
		t.Errorf("irrelevant update dirtied %v", d)
	}
	// A Pod moving Nodes (recreated elsewhere with the same name and a new
	// UID) touches both Nodes' objects.
	p = mkPod("ns", "p0", "n3", "10.0.0.1", map[string]string{"app": "a1"})
	p.UID = "moved"
	m.UpsertPod(p)
	got = keySet(m.TakeDirty())
	for _, k := range []Key{
		{KindAppliedToGroup, g1 + "-" + v1alpha1.NodeKey("n0")},
		{KindAppliedToGroup, g1 + "-" + v1alpha1.NodeKey("n3")},
		{KindPodRealization, v1alpha1.NodeKey("n0")},
		{KindPodRealization, v1alpha1.NodeKey("n3")},
		{KindAddressGroup, g1 + "-0"},
	} {
		if !got[k] {
			t.Errorf("move did not dirty %v", k)
		}
	}
	if got[Key{KindAddressGroup, g0 + "-0"}] || got[Key{KindNetworkPolicy, "np-np-uid-ns-np2"}] {
		t.Errorf("move dirtied unrelated objects: %v", got)
	}
	if prDigests(t, m, "n3")["ns/p0/moved"] == "" {
		t.Error("moved Pod missing from n3's PodRealization")
	}
	if _, ok := prDigests(t, m, "n0")["ns/p0/uid-ns-p0"]; ok {
		t.Error("moved Pod still in n0's PodRealization")
	}
}

// TestTakeDirtyOrder checks TakeDirty returns each dirty key once, in the
// order it was first marked.
func TestTakeDirtyOrder(t *testing.T) {
	m := New(0)
	for _, n := range []string{"n2", "n0", "n1"} {
		m.UpsertNode(mkNode(n))
	}
	m.DeleteNode("n0") // marks n0's PodRealization again
	want := []Key{
		{KindPodRealization, v1alpha1.NodeKey("n2")},
		{KindPodRealization, v1alpha1.NodeKey("n0")},
		{KindPodRealization, v1alpha1.NodeKey("n1")},
	}
	if got := m.TakeDirty(); !reflect.DeepEqual(got, want) {
		t.Errorf("TakeDirty = %v, want %v", got, want)
	}
	if got := m.TakeDirty(); len(got) != 0 {
		t.Errorf("second TakeDirty = %v, want none", got)
	}
}

func TestPodRealizationDigest(t *testing.T) {
	m := New(0)
	m.UpsertNode(mkNode("n1"))
	m.UpsertPod(mkPod("ns", "web", "n1", "10.0.0.1", map[string]string{"app": "web"}))
	m.UpsertPod(mkPod("ns", "lone", "n1", "10.0.0.2", map[string]string{"app": "lone"}))
	web := sel(map[string]string{"app": "web"})
	m.UpsertNetworkPolicy(mkNP("ns", "a", web, from(peer(web, nil)), nil))
	m.UpsertNetworkPolicy(mkNP("ns", "b", nil, nil, nil))
	pa, pb := mustPolicy(t, m, "ns", "a"), mustPolicy(t, m, "ns", "b")
	want := realization.Digest([]realization.Policy{
		{Name: pa.Name, SpecHash: realization.SpecHash(pa.Spec), AddressGroupSlices: map[string]int{pa.Spec.Rules[0].AddressGroups[0]: 1}},
		{Name: pb.Name, SpecHash: realization.SpecHash(pb.Spec)},
	})
	d := prDigests(t, m, "n1")
	if d["ns/web/uid-ns-web"] != want {
		t.Errorf("web digest %s, want %s", d["ns/web/uid-ns-web"], want)
	}
	wantLone := realization.Digest([]realization.Policy{{Name: pb.Name, SpecHash: realization.SpecHash(pb.Spec)}})
	if d["ns/lone/uid-ns-lone"] != wantLone {
		t.Errorf("lone digest %s, want %s", d["ns/lone/uid-ns-lone"], wantLone)
	}
	// No policy: the empty digest; the PodRealization exists though empty
	// of policies, and without the Node it does not exist.
	m.DeleteNetworkPolicy("ns", "a")
	m.DeleteNetworkPolicy("ns", "b")
	if got := prDigests(t, m, "n1")["ns/web/uid-ns-web"]; got != realization.Digest(nil) {
		t.Errorf("digest without policies %s", got)
	}
	m.DeleteNode("n1")
	if _, ok := m.Desired(Key{KindPodRealization, v1alpha1.NodeKey("n1")}); ok {
		t.Error("PodRealization of a deleted Node exists")
	}
}

// A Node whose agent reads slices gets its PodRealization split as its Pods
// grow; then one Pod's relabel rewrites only the slice holding it, and the
// agent turning slicing off (a rollback) brings one object back.
func TestPodRealizationSlices(t *testing.T) {
	m := New(0, WithPodRealizationSliceSize(4))
	m.UpsertNode(mkNode("n1"))
	m.SetPodRealizationSlicing("n1", true)
	web := sel(map[string]string{"app": "web"})
	m.UpsertNetworkPolicy(mkNP("ns", "a", web, nil, nil))
	for i := range 20 {
		m.UpsertPod(mkPod("ns", fmt.Sprintf("p%d", i), "n1", fmt.Sprintf("10.0.0.%d", i+1), map[string]string{"app": "db"}))
	}
	key := v1alpha1.NodeKey("n1")
	m.TakeDirty()
	prs := map[string]*v1alpha1.PodRealization{}
	for _, k := range m.DesiredKeys() {
		if k.Kind == KindPodRealization {
			o, _ := m.Desired(k)
			prs[k.Name] = o.(*v1alpha1.PodRealization)
		}
	}
	if len(prs) != 8 { // 20 Pods: 5 per slice would exceed 4
		t.Fatalf("%d PodRealizations for 20 Pods at 4 per slice, want 8", len(prs))
	}
	slice := v1alpha1.PodRealizationSlice("ns", "p3", 8)
	name := v1alpha1.PodRealizationName(key, slice)
	if _, ok := prs[name].Spec.Pods["ns/p3/uid-ns-p3"]; !ok || prs[name].Spec.Slices != 8 || int(prs[name].Spec.Slice) != slice {
		t.Fatalf("p3 not in %s (slice %d of %d): %v", name, prs[name].Spec.Slice, prs[name].Spec.Slices, prs[name].Spec.Pods)
	}

	m.UpsertPod(mkPod("ns", "p3", "n1", "10.0.0.4", map[string]string{"app": "web"}))
	var dirty []string
	for _, k := range m.TakeDirty() {
		if k.Kind == KindPodRealization {
			dirty = append(dirty, k.Name)
		}
	}
	if !slices.Equal(dirty, []string{name}) {
		t.Errorf("p3's relabel dirtied PodRealizations %v, want only %s", dirty, name)
	}

	// 20 -> 4 Pods: 8 slices shrink to 2 (4 Pods fill a quarter of 4 slices).
	for i := 4; i < 20; i++ {
		m.DeletePod("ns", fmt.Sprintf("p%d", i))
	}
	got := keySet(m.TakeDirty())
	for i := range 8 {
		k := Key{KindPodRealization, v1alpha1.PodRealizationName(key, i)}
		_, exists := m.Desired(k)
		if !got[k] || exists != (i < 2) {
			t.Errorf("after shrinking, slice %d: dirty %v, exists %v", i, got[k], exists)
		}
	}

	m.SetPodRealizationSlicing("n1", false)
	got = keySet(m.TakeDirty())
	if !got[Key{KindPodRealization, key}] || !got[Key{KindPodRealization, v1alpha1.PodRealizationName(key, 1)}] {
		t.Errorf("turning slicing off dirtied %v", got)
	}
	if pods := prDigests(t, m, "n1"); len(pods) != 4 {
		t.Errorf("one PodRealization again, with %d Pods, want 4", len(pods))
	}
	if _, ok := m.Desired(Key{KindPodRealization, v1alpha1.PodRealizationName(key, 1)}); ok {
		t.Error("slice 1 still desired without slicing")
	}
}

// TestIncrementalMatchesRebuild drives random events and checks, after
// each or after a few, that (1) every object whose desired content changed
// is in the dirty set, once, (2) every Pod is in the PodRealization slice
// its name hashes to, and (3) the model equals one built from scratch from
// the final state. PodRealizations split above 2 Pods per slice on the
// Nodes whose agent reads slices, which the events switch on and off.
func TestIncrementalMatchesRebuild(t *testing.T) {
	rng := rand.New(rand.NewSource(7))
	m := New(3, WithPodRealizationSliceSize(2))
	pods := map[string]*corev1.Pod{}
	nss := map[string]*corev1.Namespace{}
	nps := map[string]*networkingv1.NetworkPolicy{}
	nodes := map[string]bool{}
	sliced := map[string]bool{}
	maxSlices := 0
	lbl := func() map[string]string {
		l := map[string]string{"app": fmt.Sprintf("a%d", rng.Intn(4))}
		if rng.Intn(2) == 0 {
			l["tier"] = fmt.Sprintf("t%d", rng.Intn(2))
		}
		return l
	}
	selector := func() *metav1.LabelSelector {
		switch rng.Intn(4) {
		case 0:
			return nil
		case 1:
			return sel(map[string]string{"app": fmt.Sprintf("a%d", rng.Intn(4))})
		case 2:
			return sel(nil, metav1.LabelSelectorRequirement{Key: "tier", Operator: metav1.LabelSelectorOpIn, Values: []string{"t0", "t1"}})
		default:
			return sel(nil, metav1.LabelSelectorRequirement{Key: "app", Operator: metav1.LabelSelectorOpNotIn, Values: []string{"a0"}})
		}
	}
	prev := snapshot(t, m)
	const steps = 1500
	for step := 0; step < steps; step++ {
		ns := fmt.Sprintf("ns%d", rng.Intn(3))
		switch op := rng.Intn(11); {
		case op < 4:
			name := fmt.Sprintf("p%d", rng.Intn(15))
			ip := ""
			if rng.Intn(4) > 0 {
				ip = fmt.Sprintf("10.%d.0.%d", rng.Intn(3), rng.Intn(250))
			}
			p := mkPod(ns, name, fmt.Sprintf("n%d", rng.Intn(4)), ip, lbl())
			if rng.Intn(10) == 0 {
				p.Status.Phase = corev1.PodFailed
			}
			if rng.Intn(3) == 0 {
				p.Spec.Containers[0].Ports = []corev1.ContainerPort{{Name: "http", ContainerPort: int32(rng.Intn(3) + 80)}}
			}
			pods[ns+"/"+name] = p
			m.UpsertPod(p)
		case op == 4:
			name := fmt.Sprintf("p%d", rng.Intn(15))
			delete(pods, ns+"/"+name)
			m.DeletePod(ns, name)
		case op == 5:
			n := mkNS(ns, map[string]string{"team": fmt.Sprintf("t%d", rng.Intn(2))})
			nss[ns] = n
			m.UpsertNamespace(n)
		case op == 6:
			name := fmt.Sprintf("np%d", rng.Intn(6))
			var peers []networkingv1.NetworkPolicyPeer
			for i := rng.Intn(3); i > 0; i-- {
				var nsSel *metav1.LabelSelector
				if rng.Intn(2) == 0 {
					nsSel = sel(map[string]string{"team": fmt.Sprintf("t%d", rng.Intn(2))})
				}
				ps := selector()
				if ps == nil && nsSel == nil {
					ps = &metav1.LabelSelector{}
				}
				peers = append(peers, peer(ps, nsSel))
			}
			np := mkNP(ns, name, selector(), from(peers...), nil)
			if rng.Intn(3) == 0 {
				np.Spec.Egress = []networkingv1.NetworkPolicyEgressRule{{To: peers}}
			}
			nps[ns+"/"+name] = np
			m.UpsertNetworkPolicy(np)
		case op == 7:
			name := fmt.Sprintf("np%d", rng.Intn(6))
			delete(nps, ns+"/"+name)
			m.DeleteNetworkPolicy(ns, name)
		case op == 8:
			n := fmt.Sprintf("n%d", rng.Intn(4))
			nodes[n] = true
			m.UpsertNode(mkNode(n))
		case op == 10:
			n := fmt.Sprintf("n%d", rng.Intn(4))
			sliced[n] = rng.Intn(4) > 0
			m.SetPodRealizationSlicing(n, sliced[n])
		default:
			if rng.Intn(3) == 0 {
				n := fmt.Sprintf("n%d", rng.Intn(4))
				delete(nodes, n)
				m.DeleteNode(n)
			} else {
				delete(nss, ns)
				m.DeleteNamespace(ns)
			}
		}
		if step < steps-1 && rng.Intn(3) == 0 {
			continue // several events in one dirty set
		}
		keys := m.TakeDirty()
		dirty := keySet(keys)
		if len(dirty) != len(keys) {
			t.Fatalf("step %d: TakeDirty returned a key twice: %v", step, keys)
		}
		cur := snapshot(t, m)
		for k, v := range cur {
			if prev[k] != v && !dirty[k] {
				t.Fatalf("step %d: %v changed but is not dirty", step, k)
			}
		}
		for k := range prev {
			if _, ok := cur[k]; !ok && !dirty[k] {
				t.Fatalf("step %d: %v vanished but is not dirty", step, k)
			}
		}
		prev = cur
		checkDigests(t, m, step)
		maxSlices = max(maxSlices, checkPRSlices(t, m, step, sliced))
	}
	if maxSlices < 4 {
		t.Fatalf("no Node's PodRealization was split in 4 or more; the test proves little (most: %d)", maxSlices)
	}
	// Rebuild from scratch in a fixed order and compare.
	r := New(3, WithPodRealizationSliceSize(2))
	for n, on := range sliced {
		r.SetPodRealizationSlicing(n, on)
	}
	for _, k := range sortedKeys(nodes) {
		r.UpsertNode(mkNode(k))
	}
	for _, k := range sortedKeys(nss) {
		r.UpsertNamespace(nss[k])
	}
	for _, k := range sortedKeys(pods) {
		r.UpsertPod(pods[k])
	}
	for _, k := range sortedKeys(nps) {
		r.UpsertNetworkPolicy(nps[k])
	}
	fresh := snapshot(t, r)
	if len(fresh) == 0 {
		t.Fatal("random run ended with no objects; the test proves nothing")
	}
	for k, v := range fresh {
		if prev[k] == v {
			continue
		}
		if k.Kind == KindAddressGroup || k.Kind == KindPodRealization {
			continue // slice counts depend on history; checked below
		}
		t.Errorf("%v differs from a rebuild:\nincremental %s\nrebuild     %s", k, prev[k], v)
	}
	for k := range prev {
		if _, ok := fresh[k]; !ok && k.Kind != KindAddressGroup && k.Kind != KindPodRealization {
			t.Errorf("%v exists only in the incremental model", k)
		}
	}
	// PodRealizations: the same Pods per Node whatever the slicing, with
	// the same digests when the AddressGroup slice counts agree.
	a, b := podsByNode(t, m), podsByNode(t, r)
	if !reflect.DeepEqual(sliceCounts(m), sliceCounts(r)) {
		for _, x := range []map[string]map[string]string{a, b} {
			for _, pods := range x {
				for k := range pods {
					pods[k] = ""
				}
			}
		}
	}
	if !reflect.DeepEqual(a, b) {
		t.Errorf("PodRealizations differ from a rebuild:\nincremental %v\nrebuild     %v", a, b)
	}
	// AddressGroups: same members per group whatever the slicing.
	if a, b := agMembersByGroup(t, m), agMembersByGroup(t, r); !reflect.DeepEqual(a, b) {
		t.Errorf("AddressGroup members differ:\n%v\n%v", a, b)
	}
}

// podsByNode merges each Node's PodRealizations (one object or slices).
func podsByNode(t *testing.T, m *Model) map[string]map[string]string {
	t.Helper()
	out := map[string]map[string]string{}
	for _, k := range m.DesiredKeys() {
		if k.Kind != KindPodRealization {
			continue
		}
		o, _ := m.Desired(k)
		pr := o.(*v1alpha1.PodRealization)
		if out[pr.Spec.NodeName] == nil {
			out[pr.Spec.NodeName] = map[string]string{}
		}
		for pk, d := range pr.Spec.Pods {
			if _, dup := out[pr.Spec.NodeName][pk]; dup {
				t.Errorf("pod %s is in two PodRealizations of %s", pk, pr.Spec.NodeName)
			}
			out[pr.Spec.NodeName][pk] = d
		}
	}
	return out
}

// checkPRSlices checks the PodRealization layout of every Node: one object
// "<NodeKey>" without Slices for a Node whose agent does not read slices;
// otherwise a power of two of them, named PodRealizationName(key, i), each
// holding exactly the Pods PodRealizationSlice puts there, with at most 2
// Pods per slice and more than a quarter of that (the hysteresis).
// It returns the largest slice count.
func checkPRSlices(t *testing.T, m *Model, step int, sliced map[string]bool) int {
	t.Helper()
	byNode := map[string][]*v1alpha1.PodRealization{}
	for _, k := range m.DesiredKeys() {
		if k.Kind == KindPodRealization {
			o, _ := m.Desired(k)
			pr := o.(*v1alpha1.PodRealization)
			byNode[pr.Spec.NodeName] = append(byNode[pr.Spec.NodeName], pr)
		}
	}
	most := 0
	for node, prs := range byNode {
		n := len(prs)
		most = max(most, n)
		total := 0
		for _, pr := range prs {
			total += len(pr.Spec.Pods)
		}
		switch {
		case !sliced[node] && (n != 1 || prs[0].Spec.Slices != 0 || prs[0].Name != v1alpha1.NodeKey(node)):
			t.Fatalf("step %d: node %s without slicing has %d PodRealizations (first %s, slices %d)", step, node, n, prs[0].Name, prs[0].Spec.Slices)
		case n&(n-1) != 0:
			t.Fatalf("step %d: node %s has %d PodRealization slices, not a power of two", step, node, n)
		case n > 1 && (total > n*2 || total*4 <= n*2):
			// grown while over 2 Pods per slice, halved at a quarter of that
			t.Fatalf("step %d: node %s has %d slices for %d Pods", step, node, n, total)
		}
		for _, pr := range prs {
			i := int(pr.Spec.Slice)
			if n > 1 && (int(pr.Spec.Slices) != n || pr.Name != v1alpha1.PodRealizationName(v1alpha1.NodeKey(node), i)) {
				t.Fatalf("step %d: %s: slice %d of %d, but node %s has %d", step, pr.Name, i, pr.Spec.Slices, node, n)
			}
			for pk := range pr.Spec.Pods {
				parts := strings.Split(pk, "/")
				if want := v1alpha1.PodRealizationSlice(parts[0], parts[1], n); want != i {
					t.Fatalf("step %d: pod %s in slice %d of %s, hashes to %d", step, pk, i, node, want)
				}
			}
		}
	}
	return most
}

func agMembersByGroup(t *testing.T, m *Model) map[string][]string {
	out := map[string][]string{}
	for _, k := range m.DesiredKeys() {
		if k.Kind != KindAddressGroup {
			continue
		}
		o, _ := m.Desired(k)
		ag := o.(*v1alpha1.AddressGroup)
		g := ag.Labels[v1alpha1.GroupLabel]
		if out[g] == nil {
			out[g] = []string{}
		}
		for _, mb := range ag.Spec.Members {
			out[g] = append(out[g], mb.Namespace+"/"+mb.Name)
		}
		sort.Strings(out[g])
	}
	return out
}

// checkDigests recomputes every PodRealization digest from the other
// desired objects alone, as an agent would: the policies whose
// AppliedToGroup on the Pod's Node lists it, with the slice counts of their
// AddressGroups.
func checkDigests(t *testing.T, m *Model, step int) {
	t.Helper()
	objs := map[Kind][]metav1.Object{}
	for _, k := range m.DesiredKeys() {
		o, _ := m.Desired(k)
		objs[k.Kind] = append(objs[k.Kind], o)
	}
	slicesOf := map[string]int{}
	for _, o := range objs[KindAddressGroup] {
		slicesOf[o.GetLabels()[v1alpha1.GroupLabel]]++
	}
	atgs := map[string]bool{} // group/node/ns/name
	for _, o := range objs[KindAppliedToGroup] {
		a := o.(*v1alpha1.AppliedToGroup)
		for _, mb := range a.Spec.Members {
			atgs[a.Labels[v1alpha1.GroupLabel]+"/"+a.Spec.NodeName+"/"+mb.Namespace+"/"+mb.Name] = true
		}
	}
	for _, o := range objs[KindPodRealization] {
		pr := o.(*v1alpha1.PodRealization)
		for podKey, got := range pr.Spec.Pods {
			parts := strings.Split(podKey, "/")
			var ps []realization.Policy
			for _, po := range objs[KindNetworkPolicy] {
				np := po.(*v1alpha1.NetworkPolicy)
				if !atgs[np.Spec.AppliedToGroup+"/"+pr.Spec.NodeName+"/"+parts[0]+"/"+parts[1]] {
					continue
				}
				rp := realization.Policy{Name: np.Name, SpecHash: realization.SpecHash(np.Spec)}
				for _, r := range np.Spec.Rules {
					for _, ag := range r.AddressGroups {
						if rp.AddressGroupSlices == nil {
							rp.AddressGroupSlices = map[string]int{}
						}
						rp.AddressGroupSlices[ag] = slicesOf[ag]
					}
				}
				ps = append(ps, rp)
			}
			if want := realization.Digest(ps); got != want {
				t.Fatalf("step %d: digest of %s on %s is %s, recomputed %s from %d policies", step, podKey, pr.Spec.NodeName, got, want, len(ps))
			}
		}
	}
}

// sliceCounts maps each group key to its slice count.
func sliceCounts(m *Model) map[string]int {
	out := map[string]int{}
	for k, g := range m.groups {
		out[k] = len(g.slices)
	}
	return out
}

func sortedKeys[V any](m map[string]V) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}

// An egress rule with a named port and an ipBlock peer keeps its own rule
// and gains one towards every Pod, kept to the blocks, on the named ports:
// the Pods inside the block resolve the name themselves.
func TestEgressNamedPortToIPBlock(t *testing.T) {
	m := New(0)
	m.UpsertNode(mkNode("n1"))
	m.UpsertNamespace(mkNS("ns", nil))
	m.UpsertPod(mkPod("ns", "web", "n1", "10.0.0.1", map[string]string{"app": "web"}))
	named, n9 := intstr.FromString("http"), intstr.FromInt32(9)
	np := mkNP("ns", "out", nil, nil, []networkingv1.NetworkPolicyEgressRule{{
		Ports: []networkingv1.NetworkPolicyPort{{Port: &named}, {Port: &n9}},
		To:    []networkingv1.NetworkPolicyPeer{{IPBlock: &networkingv1.IPBlock{CIDR: "10.0.0.0/8", Except: []string{"10.1.0.0/16"}}}},
	}})
	m.UpsertNetworkPolicy(np)
	rules := mustPolicy(t, m, "ns", "out").Spec.Rules
	if len(rules) != 2 {
		t.Fatalf("rules %+v, want the rule as written plus the named-port rule", rules)
	}
	if len(rules[0].IPBlocks) != 1 || len(rules[0].Ports) != 2 || len(rules[0].WithinIPBlocks) != 0 {
		t.Errorf("first rule %+v, want the rule as written", rules[0])
	}
	r := rules[1]
	if len(r.AddressGroups) != 1 || len(r.IPBlocks) != 0 || len(r.Ports) != 1 || r.Ports[0].Port.StrVal != "http" ||
		!reflect.DeepEqual(r.WithinIPBlocks, rules[0].IPBlocks) {
		t.Errorf("named-port rule %+v, want every Pod within the block on the named port", r)
	}
}
