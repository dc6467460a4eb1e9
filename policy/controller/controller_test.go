package controller

import (
	"context"
	"reflect"
	"sort"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	dto "github.com/prometheus/client_model/go"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/client-go/tools/cache"

	opsv1alpha1 "github.com/seine-net/seine/node/apis/ops/v1alpha1"
	opsclient "github.com/seine-net/seine/node/client/clientset/versioned"
	"github.com/seine-net/seine/policy/apis/controlplane/v1alpha1"
	cpinformers "github.com/seine-net/seine/policy/client/informers"
	"github.com/seine-net/seine/policy/compute"
	"github.com/seine-net/seine/policy/realization"
)

func node(name string) *corev1.Node { return &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name}} }

func pod(ns, name, nodeName, ip string, lbls map[string]string) *corev1.Pod {
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name, Labels: lbls},
		Spec: corev1.PodSpec{NodeName: nodeName, Containers: []corev1.Container{{Name: "c", Image: "none",
			Ports: []corev1.ContainerPort{{Name: "http", ContainerPort: 8080, Protocol: corev1.ProtocolTCP}}}}},
		Status: corev1.PodStatus{Phase: corev1.PodRunning, PodIPs: []corev1.PodIP{{IP: ip}}},
	}
}

func match(k, v string) *metav1.LabelSelector {
	return &metav1.LabelSelector{MatchLabels: map[string]string{k: v}}
}

// stored is a snapshot of every controlplane object: kind/name → object.
type stored map[string]metav1.Object

func snapshot(t *testing.T, e *env) stored {
	t.Helper()
	ctx := context.Background()
	c := e.cp.ControlplaneV1alpha1()
	out := stored{}
	ags, err := c.AddressGroups().List(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	for i := range ags.Items {
		out["AddressGroup/"+ags.Items[i].Name] = &ags.Items[i]
	}
	atgs, err := c.AppliedToGroups().List(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	for i := range atgs.Items {
		out["AppliedToGroup/"+atgs.Items[i].Name] = &atgs.Items[i]
	}
	nps, err := c.NetworkPolicies().List(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	for i := range nps.Items {
		out["NetworkPolicy/"+nps.Items[i].Name] = &nps.Items[i]
	}
	prs, err := c.PodRealizations().List(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	for i := range prs.Items {
		out["PodRealization/"+prs.Items[i].Name] = &prs.Items[i]
	}
	return out
}

func (s stored) np(uid string) *v1alpha1.NetworkPolicy {
	o, _ := s["NetworkPolicy/np-"+uid].(*v1alpha1.NetworkPolicy)
	return o
}

func (s stored) atg(key, nodeName string) *v1alpha1.AppliedToGroup {
	o, _ := s["AppliedToGroup/"+key+"-"+v1alpha1.NodeKey(nodeName)].(*v1alpha1.AppliedToGroup)
	return o
}

func (s stored) pr(nodeName string) *v1alpha1.PodRealization {
	o, _ := s["PodRealization/"+v1alpha1.NodeKey(nodeName)].(*v1alpha1.PodRealization)
	return o
}

func spanOf(l map[string]string, nodes ...string) []string {
	var out []string
	for _, n := range nodes {
		if _, ok := l[v1alpha1.SpanLabel(n)]; ok {
			out = append(out, n)
		}
	}
	return out
}

// agentDigest recomputes a Pod's digest from stored objects the way an
// agent would: the policies whose AppliedToGroup on the Node lists the
// Pod, and the slice counts of their AddressGroups.
func agentDigest(s stored, nodeName, ns, name string) string {
	slices := map[string]int{}
	for k, o := range s {
		if strings.HasPrefix(k, "AddressGroup/") {
			slices[o.GetLabels()[v1alpha1.GroupLabel]]++
		}
	}
	var ps []realization.Policy
	for k, o := range s {
		if !strings.HasPrefix(k, "NetworkPolicy/") {
			continue
		}
		np := o.(*v1alpha1.NetworkPolicy)
		atg := s.atg(np.Spec.AppliedToGroup, nodeName)
		if atg == nil {
			continue
		}
		in := false
		for _, m := range atg.Spec.Members {
			in = in || (m.Namespace == ns && m.Name == name)
		}
		if !in {
			continue
		}
		rp := realization.Policy{Name: np.Name, SpecHash: realization.SpecHash(np.Spec)}
		for _, r := range np.Spec.Rules {
			for _, g := range r.AddressGroups {
				if rp.AddressGroupSlices == nil {
					rp.AddressGroupSlices = map[string]int{}
				}
				rp.AddressGroupSlices[g] = slices[g]
			}
		}
		ps = append(ps, rp)
	}
	return realization.Digest(ps)
}

func TestControllerAgainstAPIServer(t *testing.T) {
	e := startEnv(t)
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()

	nodes := []*corev1.Node{node("n1"), node("n2"), node("n3")}
	nss := []*corev1.Namespace{
		{ObjectMeta: metav1.ObjectMeta{Name: "web", Labels: map[string]string{"team": "x"}}},
		{ObjectMeta: metav1.ObjectMeta{Name: "clients", Labels: map[string]string{"team": "y"}}},
	}
	pods := []*corev1.Pod{
		pod("web", "web-0", "n1", "10.244.1.10", map[string]string{"app": "web"}),
		pod("web", "web-1", "n2", "10.244.2.10", map[string]string{"app": "web"}),
		pod("web", "db-0", "n3", "10.244.3.10", map[string]string{"app": "db"}),
		pod("clients", "client-0", "n1", "10.244.1.20", map[string]string{"app": "client"}),
	}
	http := intstr.FromString("http")
	allowClient := &networkingv1.NetworkPolicy{
		ObjectMeta: metav1.ObjectMeta{Namespace: "web", Name: "allow-client"},
		Spec: networkingv1.NetworkPolicySpec{
			PodSelector: *match("app", "web"),
			Ingress: []networkingv1.NetworkPolicyIngressRule{{
				From:  []networkingv1.NetworkPolicyPeer{{PodSelector: match("app", "client"), NamespaceSelector: match("team", "y")}},
				Ports: []networkingv1.NetworkPolicyPort{{Port: &http}},
			}},
		},
	}
	denyAll := &networkingv1.NetworkPolicy{ObjectMeta: metav1.ObjectMeta{Namespace: "web", Name: "deny-all"}}
	e.createAll(t, ctx, nodes, nss, pods, []*networkingv1.NetworkPolicy{allowClient, denyAll})
	npUID := func(name string) string {
		np, err := e.kube.NetworkingV1().NetworkPolicies("web").Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		return string(np.UID)
	}
	allowUID, denyUID := npUID("allow-client"), npUID("deny-all")

	reg := prometheus.NewRegistry()
	ops := opsclient.NewForConfigOrDie(e.rc)
	cfg := Config{Identity: "cp-a", LeaseName: "seine-test", Registry: reg,
		LeaseDuration: 3 * time.Second, RenewDeadline: 2 * time.Second, RetryPeriod: 250 * time.Millisecond,
		Ops: ops, PodRealizationSliceSize: 1}
	a, stopA := startController(t, e, e.cp, cfg)
	waitFor(t, 30*time.Second, "controller a leads", a.IsLeader)
	waitIdle(t, a, 60*time.Second, 500*time.Millisecond)
	s := snapshot(t, e)

	// --- Status: the term, the counts, the initial round ---
	st := a.Status()
	if !st.Leading || time.Since(st.Since) > time.Minute || st.InitialSync <= 0 || st.LastRound == nil || st.LastRound.Objects == 0 {
		t.Errorf("Status after the initial sync: %+v", st)
	}
	if st.Sources["pods"] != len(pods) || st.Sources["networkpolicies"] != 2 || st.Sources["nodes"] != len(nodes) ||
		st.Computed[compute.KindNetworkPolicy] != 2 || st.Computed[compute.KindPodRealization] != len(nodes) {
		t.Errorf("Status counts: sources %v, computed %v", st.Sources, st.Computed)
	}
	if n := testutil.CollectAndCount(reg, "seine_policy_controller_round_duration_seconds"); n != 1 {
		t.Errorf("round histogram: %d series", n)
	}

	// --- computed objects ---
	np := s.np(allowUID)
	if np == nil {
		t.Fatalf("computed allow-client missing; stored: %v", keys(s))
	}
	if got := spanOf(np.Labels, "n1", "n2", "n3"); !reflect.DeepEqual(got, []string{"n1", "n2"}) {
		t.Errorf("allow-client span %v, want n1 n2", got)
	}
	if np.Labels[v1alpha1.PolicyUIDLabel] != allowUID || np.Status.RuleCount != 1 || np.Status.SpanSize != 2 {
		t.Errorf("allow-client labels %v status %+v", np.Labels, np.Status)
	}
	if len(np.Spec.Rules) != 1 || len(np.Spec.Rules[0].AddressGroups) != 1 || np.Spec.Rules[0].Ports[0].Protocol != "TCP" {
		t.Fatalf("allow-client rules %+v", np.Spec.Rules)
	}
	atg := s.atg(np.Spec.AppliedToGroup, "n1")
	if atg == nil || len(atg.Spec.Members) != 1 || atg.Spec.Members[0].Name != "web-0" ||
		!reflect.DeepEqual(atg.Spec.Members[0].IPs, []string{"10.244.1.10"}) ||
		!reflect.DeepEqual(atg.Spec.Members[0].Ports, []v1alpha1.NamedPort{{Name: "http", Protocol: "TCP", Port: 8080}}) ||
		atg.Status.MemberCount != 1 {
		t.Errorf("AppliedToGroup of allow-client on n1: %+v", atg)
	}
	if s.atg(np.Spec.AppliedToGroup, "n3") != nil {
		t.Error("AppliedToGroup of allow-client on n3, which has no web Pod")
	}
	agKey := np.Spec.Rules[0].AddressGroups[0]
	ag, _ := s["AddressGroup/"+agKey+"-0"].(*v1alpha1.AddressGroup)
	if ag == nil || len(ag.Spec.Members) != 1 || ag.Spec.Members[0].Name != "client-0" || ag.Spec.Members[0].Namespace != "clients" {
		t.Fatalf("client AddressGroup: %+v", ag)
	}
	if got := spanOf(ag.Labels, "n1", "n2", "n3"); !reflect.DeepEqual(got, []string{"n1", "n2"}) {
		t.Errorf("AddressGroup span %v, want n1 n2 (where allow-client applies)", got)
	}
	if deny := s.np(denyUID); deny == nil || !reflect.DeepEqual(spanOf(deny.Labels, "n1", "n2", "n3"), []string{"n1", "n2", "n3"}) {
		t.Errorf("deny-all: %+v", deny)
	}
	for _, p := range []struct{ node, ns, name string }{{"n1", "web", "web-0"}, {"n1", "clients", "client-0"}, {"n3", "web", "db-0"}} {
		pr := s.pr(p.node)
		if pr == nil {
			t.Fatalf("PodRealization of %s missing", p.node)
		}
		live, err := e.kube.CoreV1().Pods(p.ns).Get(ctx, p.name, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		got := pr.Spec.Pods[realization.PodKey(p.ns, p.name, string(live.UID))]
		if want := agentDigest(s, p.node, p.ns, p.name); got != want {
			t.Errorf("digest of %s/%s: stored %q, agent would compute %q", p.ns, p.name, got, want)
		}
	}
	if got := s.pr("n1").Spec.Pods[realization.PodKey("clients", "client-0", podUID(t, e, "clients", "client-0"))]; got != realization.Digest(nil) {
		t.Errorf("client-0 (no policy) digest %q, want the empty digest", got)
	}

	// --- a Pod label change rewrites only the objects it must ---
	before := snapshot(t, e)
	web1, err := e.kube.CoreV1().Pods("web").Get(ctx, "web-1", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	web1.Labels = map[string]string{"app": "other"}
	if _, err := e.kube.CoreV1().Pods("web").Update(ctx, web1, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 20*time.Second, "AppliedToGroup of allow-client on n2 deleted", func() bool {
		return snapshot(t, e).atg(np.Spec.AppliedToGroup, "n2") == nil
	})
	waitIdle(t, a, 20*time.Second, 500*time.Millisecond)
	after := snapshot(t, e)
	var changed []string
	for k, o := range before {
		n, ok := after[k]
		switch {
		case !ok:
			changed = append(changed, "deleted "+k)
		case n.GetResourceVersion() != o.GetResourceVersion():
			changed = append(changed, "updated "+k)
		}
	}
	for k := range after {
		if _, ok := before[k]; !ok {
			changed = append(changed, "created "+k)
		}
	}
	sort.Strings(changed)
	want := []string{
		"deleted AppliedToGroup/" + np.Spec.AppliedToGroup + "-" + v1alpha1.NodeKey("n2"),
		"updated AddressGroup/" + agKey + "-0", // span loses n2
		"updated NetworkPolicy/np-" + allowUID, // span loses n2
		"updated PodRealization/" + v1alpha1.NodeKey("n2"),
	}
	sort.Strings(want)
	if !reflect.DeepEqual(changed, want) {
		t.Errorf("label change wrote\n%s\nwant\n%s", strings.Join(changed, "\n"), strings.Join(want, "\n"))
	}
	if v := metricValue(a.metrics.leader); v != 1 {
		t.Errorf("leader gauge %v", v)
	}

	// --- failover ---
	cfgB := cfg
	cfgB.Identity, cfgB.Registry = "cp-b", prometheus.NewRegistry()
	b, _ := startController(t, e, e.cp, cfgB)
	// b has tried once it has read the Lease's holder.
	waitFor(t, 20*time.Second, "b reads the Lease", func() bool { return b.ObservedLeader() != "" })
	if got := b.ObservedLeader(); got != "cp-a" {
		t.Errorf("b read the Lease's holder as %q, want cp-a", got)
	}
	if b.IsLeader() {
		t.Fatal("b leads while a holds the lease")
	}
	// Watch for deletions of any stored object from now on.
	var deletions atomic.Int64
	wctx, wcancel := context.WithCancel(ctx)
	defer wcancel()
	f := cpinformers.NewSharedInformerFactory(e.cp, 0)
	onDelete := cache.ResourceEventHandlerFuncs{DeleteFunc: func(any) { deletions.Add(1) }}
	cpv := f.Controlplane().V1alpha1()
	for _, inf := range []cache.SharedIndexInformer{cpv.AddressGroups().Informer(), cpv.AppliedToGroups().Informer(),
		cpv.NetworkPolicies().Informer(), cpv.PodRealizations().Informer()} {
		if _, err := inf.AddEventHandler(onDelete); err != nil {
			t.Fatal(err)
		}
	}
	f.Start(wctx.Done())
	f.WaitForCacheSync(wctx.Done())
	defer func() {
		wcancel() // Shutdown waits for the informers to stop
		f.Shutdown()
	}()

	t0 := time.Now()
	stopA()
	waitFor(t, cfg.LeaseDuration+2*time.Second, "b takes over", b.IsLeader)
	t.Logf("b leads %v after a stopped", time.Since(t0))
	if a.IsLeader() {
		t.Error("a still reports leading after stopping")
	}
	dbPolicy := &networkingv1.NetworkPolicy{
		ObjectMeta: metav1.ObjectMeta{Namespace: "web", Name: "db"},
		Spec:       networkingv1.NetworkPolicySpec{PodSelector: *match("app", "db")},
	}
	created, err := e.kube.NetworkingV1().NetworkPolicies("web").Create(ctx, dbPolicy, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	waitFor(t, 20*time.Second, "db policy computed by b", func() bool {
		s := snapshot(t, e)
		np := s.np(string(created.UID))
		return np != nil && s.atg(np.Spec.AppliedToGroup, "n3") != nil
	})
	waitIdle(t, b, 20*time.Second, 500*time.Millisecond)
	if n := deletions.Load(); n != 0 {
		t.Errorf("%d objects deleted during the handover", n)
	}
	// b carried on from what a stored: it created the new policy's
	// objects and rewrote only n3's PodRealization (db-0's digest).
	creates := metricValue(b.metrics.writes.WithLabelValues("NetworkPolicy", "create"))
	updates := 0.0
	for _, kind := range []string{"AddressGroup", "AppliedToGroup", "NetworkPolicy"} {
		updates += metricValue(b.metrics.writes.WithLabelValues(kind, "update"))
	}
	if creates != 1 || updates != 0 {
		t.Errorf("b after takeover: %v NetworkPolicy creates (want 1), %v group/policy updates (want 0)", creates, updates)
	}
	final := snapshot(t, e)
	if got, want := final.pr("n3").Spec.Pods[realization.PodKey("web", "db-0", podUID(t, e, "web", "db-0"))],
		agentDigest(final, "n3", "web", "db-0"); got != want {
		t.Errorf("db-0 digest after takeover %q, want %q", got, want)
	}

	// --- sliced PodRealizations, once the Node's agent reads them ---
	// n1 holds web-0 and client-0: more than 1 Pod per slice, so its agent
	// listing the capability splits its PodRealization in 2.
	nk := v1alpha1.NodeKey("n1")
	ai, err := ops.OpsV1alpha1().AgentInfos().Create(ctx, &opsv1alpha1.AgentInfo{ObjectMeta: metav1.ObjectMeta{Name: "n1"},
		Status: opsv1alpha1.AgentInfoStatus{Capabilities: []string{v1alpha1.PodRealizationSlicesCapability}}}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	slicesOf := func(s stored) []*v1alpha1.PodRealization {
		var out []*v1alpha1.PodRealization
		for _, o := range s {
			if pr, ok := o.(*v1alpha1.PodRealization); ok && pr.Spec.NodeName == "n1" {
				out = append(out, pr)
			}
		}
		sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
		return out
	}
	waitFor(t, 20*time.Second, "n1's PodRealization in 2 slices", func() bool { return len(slicesOf(snapshot(t, e))) == 2 })
	waitIdle(t, b, 20*time.Second, 500*time.Millisecond)
	sliced := snapshot(t, e)
	for i, pr := range slicesOf(sliced) {
		if pr.Name != v1alpha1.PodRealizationName(nk, i) || pr.Spec.Slice != int32(i) || pr.Spec.Slices != 2 ||
			pr.Labels[v1alpha1.SpanLabel("n1")] != "" || len(pr.Labels) != 1 {
			t.Errorf("slice %d: %s, spec slice %d of %d, labels %v", i, pr.Name, pr.Spec.Slice, pr.Spec.Slices, pr.Labels)
		}
	}
	for _, p := range []struct{ ns, name string }{{"web", "web-0"}, {"clients", "client-0"}} {
		pr := sliced["PodRealization/"+v1alpha1.PodRealizationName(nk, v1alpha1.PodRealizationSlice(p.ns, p.name, 2))]
		got, ok := "", false
		if pr != nil {
			got, ok = pr.(*v1alpha1.PodRealization).Spec.Pods[realization.PodKey(p.ns, p.name, podUID(t, e, p.ns, p.name))]
		}
		if want := agentDigest(sliced, "n1", p.ns, p.name); !ok || got != want {
			t.Errorf("%s/%s in its slice: %q (found %v), want %q", p.ns, p.name, got, ok, want)
		}
	}
	// A rollback: the agent's AgentInfo no longer lists the capability, so
	// n1 is back to one object holding both Pods.
	ai.Status.Capabilities = nil
	if _, err := ops.OpsV1alpha1().AgentInfos().Update(ctx, ai, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 20*time.Second, "n1's PodRealization in one object again", func() bool {
		prs := slicesOf(snapshot(t, e))
		return len(prs) == 1 && prs[0].Name == nk && prs[0].Spec.Slices == 0 && len(prs[0].Spec.Pods) == 2
	})
}

func podUID(t *testing.T, e *env, ns, name string) string {
	t.Helper()
	p, err := e.kube.CoreV1().Pods(ns).Get(context.Background(), name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return string(p.UID)
}

func keys(s stored) []string {
	var out []string
	for k := range s {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}

// metricValue reads one counter or gauge.
func metricValue(c prometheus.Collector) float64 {
	ch := make(chan prometheus.Metric, 1)
	c.Collect(ch)
	var d dto.Metric
	if err := (<-ch).Write(&d); err != nil {
		return -1
	}
	if d.Counter != nil {
		return d.Counter.GetValue()
	}
	return d.Gauge.GetValue()
}
