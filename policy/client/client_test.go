package client_test

import (
	"context"
	"os/exec"
	"slices"
	"strings"
	"testing"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/client-go/tools/cache"

	cpv1 "github.com/seine-net/seine/policy/apis/controlplane/v1alpha1"
	"github.com/seine-net/seine/policy/client/clientset/versioned"
	"github.com/seine-net/seine/policy/client/informers"
	"github.com/seine-net/seine/tests/apienv"
)

// Node names longer than a label name may be (63), as Node names can be.
const (
	nodeA = "node-a-with-a-name-that-is-much-longer-than-sixty-three-characters.example.internal"
	nodeB = "node-b-with-a-name-that-is-much-longer-than-sixty-three-characters.example.internal"
)

func run(t *testing.T, name string, args ...string) string {
	t.Helper()
	out, err := exec.Command(name, args...).CombinedOutput()
	if err != nil {
		t.Fatalf("%s %v: %v: %s", name, args, err, out)
	}
	return string(out)
}

func spanLabels(nodes ...string) map[string]string {
	l := map[string]string{}
	for _, n := range nodes {
		l[cpv1.SpanLabel(n)] = ""
	}
	return l
}

func TestGeneratedClients(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	t0 := time.Now()
	env := apienv.StartEnv(t, "../../deploy/crds")
	cp, ns, rc := env.ControlPlane, env.NetNS, env.Config
	cs, err := versioned.NewForConfig(rc)
	if err != nil {
		t.Fatalf("clientset: %v", err)
	}
	t.Logf("control plane up and CRDs served after %v", time.Since(t0))
	c := cs.ControlplaneV1alpha1()

	t.Run("NetworkPolicy", func(t *testing.T) {
		port := intstr.FromString("http")
		np := &cpv1.NetworkPolicy{
			ObjectMeta: metav1.ObjectMeta{Name: "np-uid-1", Labels: spanLabels(nodeA)},
			Spec: cpv1.NetworkPolicySpec{
				Source:         cpv1.PolicyReference{Namespace: "prod", Name: "web", UID: "uid-1"},
				AppliedToGroup: "atg-1",
				PolicyTypes:    []string{"Ingress"},
				Rules: []cpv1.Rule{
					{Direction: cpv1.DirectionIn, AddressGroups: []string{"ag-1"}, Ports: []cpv1.PolicyPort{{Protocol: "TCP", Port: &port}}},
					{Direction: cpv1.DirectionIn, IPBlocks: []cpv1.IPBlock{{CIDR: "10.0.0.0/8", Except: []string{"10.1.0.0/16"}}}},
				},
			},
			// No status subresource: create and update carry the status.
			Status: cpv1.NetworkPolicyStatus{RuleCount: 2, SpanSize: 1},
		}
		got, err := c.NetworkPolicies().Create(ctx, np, metav1.CreateOptions{})
		if err != nil {
			t.Fatalf("create: %v", err)
		}
		if got.Status != np.Status {
			t.Errorf("create stored status %+v, want %+v", got.Status, np.Status)
		}
		got.Spec.PolicyTypes = []string{"Ingress", "Egress"}
		got.Status.SpanSize = 3
		if _, err = c.NetworkPolicies().Update(ctx, got, metav1.UpdateOptions{}); err != nil {
			t.Fatalf("update: %v", err)
		}
		got, err = c.NetworkPolicies().Get(ctx, "np-uid-1", metav1.GetOptions{})
		if err != nil {
			t.Fatalf("get: %v", err)
		}
		if got.Status != (cpv1.NetworkPolicyStatus{RuleCount: 2, SpanSize: 3}) || !slices.Equal(got.Spec.PolicyTypes, []string{"Ingress", "Egress"}) {
			t.Errorf("after update: status %+v policyTypes %v", got.Status, got.Spec.PolicyTypes)
		}
		if p := got.Spec.Rules[0].Ports[0].Port; p == nil || p.Type != intstr.String || p.StrVal != "http" {
			t.Errorf("named port round trip: %v", p)
		}
		if b := got.Spec.Rules[1].IPBlocks; len(b) != 1 || b[0].Except[0] != "10.1.0.0/16" {
			t.Errorf("ipBlocks round trip: %+v", b)
		}
		// spec.policyTypes is required and has no omitempty: a nil slice
		// is sent as null, pruned, and the object rejected.
		bad := &cpv1.NetworkPolicy{ObjectMeta: metav1.ObjectMeta{Name: "np-bad"},
			Spec: cpv1.NetworkPolicySpec{Source: cpv1.PolicyReference{Name: "x"}, AppliedToGroup: "g"}}
		if _, err := c.NetworkPolicies().Create(ctx, bad, metav1.CreateOptions{}); !apierrors.IsInvalid(err) {
			t.Errorf("create with nil policyTypes: %v, want Invalid", err)
		} else {
			t.Logf("create with nil policyTypes: %v", err)
		}
		list, err := c.NetworkPolicies().List(ctx, metav1.ListOptions{})
		if err != nil || len(list.Items) != 1 || list.Items[0].Name != "np-uid-1" {
			t.Fatalf("list: %v %v", list, err)
		}

		// kubectl shows the printer columns.
		out := run(t, "ip", "netns", "exec", ns, "kubectl", "--kubeconfig", cp.AdminKubeconfig(),
			"--cache-dir", t.TempDir(), "get", "networkpolicies.controlplane.seine.io")
		t.Logf("kubectl get networkpolicies.controlplane.seine.io:\n%s", out)
		lines := strings.Split(strings.TrimSpace(out), "\n")
		if len(lines) != 2 {
			t.Fatalf("kubectl get networkpolicies: %q", out)
		}
		if h := strings.Fields(lines[0]); !slices.Equal(h, []string{"NAME", "SOURCE", "NAMESPACE", "RULES", "NODES", "AGE"}) {
			t.Errorf("kubectl header %q", lines[0])
		}
		if f := strings.Fields(lines[1]); len(f) != 6 || !slices.Equal(f[:5], []string{"np-uid-1", "web", "prod", "2", "3"}) {
			t.Errorf("kubectl row %q", lines[1])
		}
	})

	t.Run("AppliedToGroup", func(t *testing.T) {
		atg := &cpv1.AppliedToGroup{
			ObjectMeta: metav1.ObjectMeta{Name: "atg-1-" + cpv1.NodeKey(nodeA),
				Labels: map[string]string{cpv1.GroupLabel: "atg-1", cpv1.SpanLabel(nodeA): ""}},
			Spec: cpv1.AppliedToGroupSpec{
				Selector: cpv1.GroupSelector{Namespace: "prod", PodSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"app": "web"}}},
				NodeName: nodeA,
				Members:  []cpv1.GroupMember{{Namespace: "prod", Name: "web-0", IPs: []string{"10.244.1.5"}, Ports: []cpv1.NamedPort{{Name: "http", Protocol: "TCP", Port: 8080}}}},
			},
		}
		atg.Status.MemberCount = 1
		got, err := c.AppliedToGroups().Create(ctx, atg, metav1.CreateOptions{})
		if err != nil {
			t.Fatalf("create: %v", err)
		}
		got.Spec.Members = append(got.Spec.Members, cpv1.GroupMember{Namespace: "prod", Name: "web-1"})
		got.Status.MemberCount = 2
		if got, err = c.AppliedToGroups().Update(ctx, got, metav1.UpdateOptions{}); err != nil {
			t.Fatalf("update: %v", err)
		}
		if len(got.Spec.Members) != 2 || got.Status.MemberCount != 2 ||
			got.Spec.Members[0].Ports[0].Port != 8080 || got.Spec.Selector.PodSelector.MatchLabels["app"] != "web" {
			t.Errorf("after update: %+v", got)
		}
		list, err := c.AppliedToGroups().List(ctx, metav1.ListOptions{LabelSelector: cpv1.GroupLabel + "=atg-1"})
		if err != nil || len(list.Items) != 1 {
			t.Fatalf("list by group label: %v %v", list, err)
		}
	})

	t.Run("PodRealization", func(t *testing.T) {
		pr := &cpv1.PodRealization{
			ObjectMeta: metav1.ObjectMeta{Name: cpv1.NodeKey(nodeB), Labels: spanLabels(nodeB)},
			Spec:       cpv1.PodRealizationSpec{NodeName: nodeB, Pods: map[string]string{"prod/web-0/u1": "d1"}},
		}
		got, err := c.PodRealizations().Create(ctx, pr, metav1.CreateOptions{})
		if err != nil {
			t.Fatalf("create: %v", err)
		}
		got.Spec.Pods["prod/web-1/u2"] = "d2"
		got.Status.PodCount = 2
		if _, err = c.PodRealizations().Update(ctx, got, metav1.UpdateOptions{}); err != nil {
			t.Fatalf("update: %v", err)
		}
		got, err = c.PodRealizations().Get(ctx, pr.Name, metav1.GetOptions{})
		if err != nil || len(got.Spec.Pods) != 2 || got.Status.PodCount != 2 {
			t.Fatalf("get: %+v %v", got, err)
		}
		// The Pods map is atomic for field management: the managed fields
		// name spec.pods once, never a Pod's key (a Node's 1,000 keys made
		// each write 2.5 times slower).
		var fields []string
		for _, mf := range got.ManagedFields {
			if mf.FieldsV1 != nil {
				fields = append(fields, string(mf.FieldsV1.Raw))
			}
		}
		if all := strings.Join(fields, " "); !strings.Contains(all, `"f:pods":{}`) || strings.Contains(all, "web-0") {
			t.Errorf("managed fields track the Pods map per key: %s", all)
		}
		list, err := c.PodRealizations().List(ctx, metav1.ListOptions{LabelSelector: cpv1.SpanLabel(nodeA)})
		if err != nil || len(list.Items) != 0 {
			t.Fatalf("list with other node's span: %v %v", list, err)
		}
	})

	t.Run("AddressGroupSpanSelectorAndInformer", func(t *testing.T) {
		ag := func(name string, labels map[string]string) *cpv1.AddressGroup {
			labels[cpv1.GroupLabel] = "ag-1"
			return &cpv1.AddressGroup{
				ObjectMeta: metav1.ObjectMeta{Name: name, Labels: labels},
				Spec:       cpv1.AddressGroupSpec{Selector: cpv1.GroupSelector{NamespaceSelector: &metav1.LabelSelector{}}, Slice: 0},
			}
		}
		for _, o := range []*cpv1.AddressGroup{
			ag("ag-1-0", spanLabels(nodeA)),
			ag("ag-1-1", spanLabels(nodeA, nodeB)),
			ag("ag-1-2", spanLabels(nodeB)),
		} {
			if _, err := c.AddressGroups().Create(ctx, o, metav1.CreateOptions{}); err != nil {
				t.Fatalf("create %s: %v", o.Name, err)
			}
		}
		sel := cpv1.SpanLabel(nodeA) // exists
		list, err := c.AddressGroups().List(ctx, metav1.ListOptions{LabelSelector: sel})
		if err != nil {
			t.Fatalf("list with span selector: %v", err)
		}
		var names []string
		for _, o := range list.Items {
			names = append(names, o.Name)
		}
		slices.Sort(names)
		if !slices.Equal(names, []string{"ag-1-0", "ag-1-1"}) {
			t.Fatalf("list with span selector of node A: %v, want [ag-1-0 ag-1-1]", names)
		}

		// kubectl shows the group label as a column.
		out := run(t, "ip", "netns", "exec", ns, "kubectl", "--kubeconfig", cp.AdminKubeconfig(),
			"--cache-dir", t.TempDir(), "get", "sag", "ag-1-0")
		t.Logf("kubectl get sag ag-1-0:\n%s", out)
		if lines := strings.Split(strings.TrimSpace(out), "\n"); len(lines) != 2 ||
			!slices.Equal(strings.Fields(lines[0]), []string{"NAME", "GROUP", "MEMBERS", "AGE"}) ||
			!slices.Equal(strings.Fields(lines[1])[:2], []string{"ag-1-0", "ag-1"}) {
			t.Errorf("kubectl get sag: %q", out)
		}

		// An informer with node A's span selector.
		events := make(chan string, 32)
		factory := informers.NewSharedInformerFactoryWithOptions(cs, 0,
			informers.WithTweakListOptions(func(o *metav1.ListOptions) { o.LabelSelector = sel }))
		inf := factory.Controlplane().V1alpha1().AddressGroups()
		_, err = inf.Informer().AddEventHandler(cache.ResourceEventHandlerFuncs{
			AddFunc: func(obj any) { events <- "add " + obj.(*cpv1.AddressGroup).Name },
			UpdateFunc: func(_, obj any) {
				events <- "update " + obj.(*cpv1.AddressGroup).Name
			},
			DeleteFunc: func(obj any) {
				if d, ok := obj.(cache.DeletedFinalStateUnknown); ok {
					obj = d.Obj
				}
				events <- "delete " + obj.(*cpv1.AddressGroup).Name
			},
		})
		if err != nil {
			t.Fatal(err)
		}
		stop := make(chan struct{})
		factory.Start(stop)
		t.Cleanup(func() { close(stop); factory.Shutdown() })
		for typ, ok := range factory.WaitForCacheSync(ctx.Done()) {
			if !ok {
				t.Fatalf("informer %v did not sync", typ)
			}
		}
		expect := func(want ...string) {
			t.Helper()
			var got []string
			timeout := time.After(10 * time.Second)
			for len(got) < len(want) {
				select {
				case e := <-events:
					got = append(got, e)
				case <-timeout:
					t.Fatalf("events %v, want %v", got, want)
				}
			}
			slices.Sort(got)
			w := slices.Clone(want)
			slices.Sort(w)
			if !slices.Equal(got, w) {
				t.Fatalf("events %v, want %v", got, want)
			}
		}
		expect("add ag-1-0", "add ag-1-1")

		// Update a member list: an update event.
		o, err := c.AddressGroups().Get(ctx, "ag-1-0", metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		o.Spec.Members = []cpv1.GroupMember{{Namespace: "prod", Name: "db-0", IPs: []string{"10.244.2.7", "fd00::7"}}}
		if o, err = c.AddressGroups().Update(ctx, o, metav1.UpdateOptions{}); err != nil {
			t.Fatalf("update: %v", err)
		}
		expect("update ag-1-0")
		o.Status.MemberCount = 1
		if _, err = c.AddressGroups().Update(ctx, o, metav1.UpdateOptions{}); err != nil {
			t.Fatalf("update status: %v", err)
		}
		expect("update ag-1-0")

		// The span of ag-1-2 grows to node A: an add; ag-1-1 leaves node
		// A's span: a delete, as the watch only sends matching objects.
		o2, err := c.AddressGroups().Get(ctx, "ag-1-2", metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		o2.Labels[cpv1.SpanLabel(nodeA)] = ""
		if _, err = c.AddressGroups().Update(ctx, o2, metav1.UpdateOptions{}); err != nil {
			t.Fatalf("add span label: %v", err)
		}
		expect("add ag-1-2")
		o1, err := c.AddressGroups().Get(ctx, "ag-1-1", metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		delete(o1.Labels, cpv1.SpanLabel(nodeA))
		if _, err = c.AddressGroups().Update(ctx, o1, metav1.UpdateOptions{}); err != nil {
			t.Fatalf("remove span label: %v", err)
		}
		expect("delete ag-1-1")

		if err := c.AddressGroups().Delete(ctx, "ag-1-0", metav1.DeleteOptions{}); err != nil {
			t.Fatalf("delete: %v", err)
		}
		expect("delete ag-1-0")
		if _, err := c.AddressGroups().Get(ctx, "ag-1-0", metav1.GetOptions{}); !apierrors.IsNotFound(err) {
			t.Errorf("get after delete: %v, want NotFound", err)
		}

		// The lister holds exactly node A's span.
		cached, err := inf.Lister().List(labels.Everything())
		if err != nil || len(cached) != 1 || cached[0].Name != "ag-1-2" || cached[0].Status.MemberCount != 0 {
			t.Errorf("lister: %v %v, want [ag-1-2]", cached, err)
		}
		if g, err := inf.Lister().Get("ag-1-2"); err != nil || g.Labels[cpv1.GroupLabel] != "ag-1" {
			t.Errorf("lister get: %v %v", g, err)
		}
		select {
		case e := <-events:
			t.Errorf("unexpected event %q", e)
		default:
		}
	})
}
