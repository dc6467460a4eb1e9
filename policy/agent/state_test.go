package agent

import (
	"context"
	"fmt"
	"maps"
	"net"
	"reflect"
	"runtime"
	"sort"
	"testing"

	"github.com/seine-net/seine/datapath/flowsync"
	of "github.com/seine-net/seine/datapath/openflow"
	"github.com/seine-net/seine/datapath/pipeline"
	"github.com/seine-net/seine/policy/apis/controlplane/v1alpha1"
	"github.com/seine-net/seine/policy/flows"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
)

// table is a fake switch for the pure tests: it applies flow mods to a map
// keyed like the switch keys entries.
type table struct {
	flows   map[string]of.Flow
	mods    int
	modsOf  map[string]int // by key; nil: not counted
	bundles int            // Apply calls that changed the table
	// reject, when set, refuses a bundle holding a flow with this
	// cookie (as the switch refuses one bad flow mod), leaving the table
	// as it was.
	reject uint64
}

func (t *table) Apply(_ context.Context, mods []of.FlowMod) error {
	for _, m := range mods {
		if t.reject != 0 && m.Flow.Cookie == t.reject {
			return fmt.Errorf("flow with cookie %#x rejected", t.reject)
		}
	}
	t.bundles++
	for _, m := range mods {
		t.mods++
		k := flowsync.Key(m.Flow)
		if t.modsOf != nil {
			t.modsOf[k]++
		}
		if m.Op == of.OpDelete {
			delete(t.flows, k)
		} else {
			t.flows[k] = m.Flow
		}
	}
	return nil
}

func testPolicy(name, atg string, peers string, p int32) *v1alpha1.NetworkPolicy {
	v := intstr.FromInt32(p)
	return &v1alpha1.NetworkPolicy{ObjectMeta: metav1.ObjectMeta{Name: name}, Spec: v1alpha1.NetworkPolicySpec{
		AppliedToGroup: atg, PolicyTypes: []string{"Ingress"},
		Rules: []v1alpha1.Rule{{Direction: v1alpha1.DirectionIn, AddressGroups: []string{peers},
			Ports: []v1alpha1.PolicyPort{{Protocol: "TCP", Port: &v}}}}}}
}

func testSource() *flows.MapSource {
	src := &flows.MapSource{Pods: map[string]flows.Pod{}, AppliedToGroups: map[string][]v1alpha1.GroupMember{},
		AddressGroups: map[string][]v1alpha1.GroupMember{}}
	for i := 0; i < 4; i++ {
		n := fmt.Sprintf("p%d", i)
		src.Pods["ns/"+n] = flows.Pod{Namespace: "ns", Name: n, OFPort: uint32(3 + i), IP: net.IPv4(10, 244, 1, byte(3+i))}
	}
	src.AppliedToGroups["t01"] = []v1alpha1.GroupMember{{Namespace: "ns", Name: "p0"}, {Namespace: "ns", Name: "p1"}}
	src.AppliedToGroups["t12"] = []v1alpha1.GroupMember{{Namespace: "ns", Name: "p1"}, {Namespace: "ns", Name: "p2"}}
	src.AppliedToGroups["t3"] = []v1alpha1.GroupMember{{Namespace: "ns", Name: "p3"}}
	src.AddressGroups["g1"] = []v1alpha1.GroupMember{{IPs: []string{"10.244.2.1"}}, {IPs: []string{"10.244.2.2"}}}
	src.AddressGroups["g2"] = []v1alpha1.GroupMember{{IPs: []string{"10.244.2.2"}}, {IPs: []string{"10.244.2.3"}}}
	return src
}

// TestFlowStateMatchesMerge checks after every step that the switch holds
// exactly the merge of the policies' flows, that each entry has one owner,
// and that unrelated policies' entries are never touched.
func TestFlowStateMatchesMerge(t *testing.T) {
	ctx := context.Background()
	sw := &table{flows: map[string]of.Flow{}, modsOf: map[string]int{}}
	s := newFlowState(flowsync.New(sw))
	src := testSource()
	ids := flows.NewAllocator[flows.ConjKey](0)
	cur := map[string][]of.Flow{}
	others := map[string]bool{} // keys any policy but "unrelated" ever had
	step := func(name string, np *v1alpha1.NetworkPolicy) {
		t.Helper()
		var fl []of.Flow
		if np != nil {
			fl = flows.Translate(np, uint64(len(name)), src, ids).Flows
			cur[name] = fl
			if name != "unrelated" {
				for _, f := range fl {
					others[flowsync.Key(f)] = true
				}
			}
		} else {
			delete(cur, name)
		}
		if _, err := s.update(ctx, map[string][]of.Flow{name: fl}); err != nil {
			t.Fatal(err)
		}
		var sets [][]of.Flow
		for _, f := range cur {
			sets = append(sets, f)
		}
		want := map[string]of.Flow{}
		for _, f := range flows.MergeAll(sets...) {
			want[flowsync.Key(f)] = f
		}
		if len(want) != len(sw.flows) {
			t.Fatalf("after %s: switch has %d flows, want %d", name, len(sw.flows), len(want))
		}
		for k, f := range want {
			g, ok := sw.flows[k]
			if !ok || g.Cookie != f.Cookie || !reflect.DeepEqual(sortedConj(g.Actions), sortedConj(f.Actions)) {
				t.Fatalf("after %s: entry %s is %v, want %v", name, k, g.Actions, f.Actions)
			}
		}
		// Each entry has exactly one owner.
		owners := map[string]int{}
		for _, fs := range s.sync.Snapshot() {
			for _, f := range fs {
				owners[flowsync.Key(f)]++
			}
		}
		for k, n := range owners {
			if n != 1 {
				t.Fatalf("after %s: entry %s has %d owners", name, k, n)
			}
		}
	}
	step("a", testPolicy("a", "t01", "g1", 80))
	step("unrelated", testPolicy("unrelated", "t3", "g2", 9000))
	before := maps.Clone(sw.modsOf)
	step("b", testPolicy("b", "t12", "g1", 443)) // shares p1 and g1's peers with a
	step("b", testPolicy("b", "t12", "g2", 443)) // now shares 10.244.2.2 with a
	step("a", nil)
	step("a", testPolicy("a", "t01", "g1", 80))
	step("b", nil)
	// The entries only "unrelated" has (b's peers share some of its
	// address entries, whose conjunctions change) were never written again.
	exclusive := 0
	for _, f := range cur["unrelated"] {
		k := flowsync.Key(f)
		if others[k] {
			continue
		}
		exclusive++
		if sw.modsOf[k] != before[k] {
			t.Errorf("entry %s of the unrelated policy was written %d times while the others changed", k, sw.modsOf[k]-before[k])
		}
	}
	if exclusive == 0 {
		t.Fatal("the unrelated policy has no entry of its own: the check above checked nothing")
	}
	// Removing the last policies leaves nothing.
	step("a", nil)
	step("unrelated", nil)
	if len(sw.flows) != 0 {
		t.Fatalf("%d flows left", len(sw.flows))
	}
}

// TestFlowStateUpdateIsAtomic: an update that moves entries between a
// policy's own owner and the shared shards reaches the switch as one
// bundle, so no packet meets clauses of a conjunction half old and half
// new. When the switch refuses that bundle, the owners go one by one, so
// the flows of a policy updated beside the bad one still get installed.
func TestFlowStateUpdateIsAtomic(t *testing.T) {
	ctx := context.Background()
	sw := &table{flows: map[string]of.Flow{}}
	s := newFlowState(flowsync.New(sw))
	src := testSource()
	ids := flows.NewAllocator[flows.ConjKey](0)
	tr := func(np *v1alpha1.NetworkPolicy, cookie uint64) []of.Flow {
		return flows.Translate(np, cookie, src, ids).Flows
	}
	if _, err := s.update(ctx, map[string][]of.Flow{"a": tr(testPolicy("a", "t01", "g1", 80), 1)}); err != nil {
		t.Fatal(err)
	}
	// b shares p1's Pod clause and g1's peers with a: entries move from
	// a's own owner to the shards, and a shard's entries change.
	for i, np := range []*v1alpha1.NetworkPolicy{testPolicy("b", "t12", "g1", 443), testPolicy("b", "t12", "g2", 443), nil} {
		var fl []of.Flow
		if np != nil {
			fl = tr(np, 2)
		}
		before := sw.bundles
		if _, err := s.update(ctx, map[string][]of.Flow{"b": fl}); err != nil {
			t.Fatal(err)
		}
		if n := sw.bundles - before; n != 1 {
			t.Errorf("step %d: %d bundles, want 1", i, n)
		}
	}
	sw.reject = 3
	done, err := s.update(ctx, map[string][]of.Flow{"c": tr(testPolicy("c", "t3", "g2", 53), 3), "d": tr(testPolicy("d", "t3", "g1", 54), 4)})
	if err == nil || done["c"] {
		t.Errorf("a bundle with c's bad flow: done %v, err %v; want c not done and an error", done, err)
	}
	found := false
	for _, f := range sw.flows {
		if f.Cookie == 4 {
			found = true
		}
	}
	if !found {
		t.Error("d's flows are not on the switch")
	}
}

func sortedConj(acts []of.Action) []string {
	var s []string
	for _, a := range acts {
		s = append(s, fmt.Sprintf("%#v", a))
	}
	sort.Strings(s)
	return s
}

// BenchmarkThousandPolicies translates and installs 1,000 policies on one
// Node (50 local Pods; each policy selects 5 of them and admits a 20-Pod
// peer group, 10 groups in all, on 2 ports) into a flowsync.Syncer over a
// fake switch, and reports flows per policy and the heap the agent's state
// holds.
func BenchmarkThousandPolicies(b *testing.B) {
	src := &flows.MapSource{Pods: map[string]flows.Pod{}, AppliedToGroups: map[string][]v1alpha1.GroupMember{},
		AddressGroups: map[string][]v1alpha1.GroupMember{}}
	for i := 0; i < 50; i++ {
		n := fmt.Sprintf("p%d", i)
		src.Pods["ns/"+n] = flows.Pod{Namespace: "ns", Name: n, OFPort: uint32(3 + i), IP: net.IPv4(10, 244, 1, byte(3+i))}
	}
	for g := 0; g < 10; g++ {
		for i := 0; i < 20; i++ {
			src.AddressGroups[fmt.Sprintf("g%d", g)] = append(src.AddressGroups[fmt.Sprintf("g%d", g)],
				v1alpha1.GroupMember{IPs: []string{fmt.Sprintf("10.245.%d.%d", g, i+1)}})
		}
	}
	const n = 1000
	var nps []*v1alpha1.NetworkPolicy
	for i := 0; i < n; i++ {
		atg := fmt.Sprintf("t%d", i)
		for j := 0; j < 5; j++ {
			src.AppliedToGroups[atg] = append(src.AppliedToGroups[atg], v1alpha1.GroupMember{Namespace: "ns", Name: fmt.Sprintf("p%d", (i+j*7)%50)})
		}
		np := testPolicy(fmt.Sprintf("np-%d", i), atg, fmt.Sprintf("g%d", i%10), int32(1000+i))
		v := intstr.FromInt32(int32(20000 + i))
		np.Spec.Rules[0].Ports = append(np.Spec.Rules[0].Ports, v1alpha1.PolicyPort{Protocol: "UDP", Port: &v})
		nps = append(nps, np)
	}
	b.ResetTimer()
	for it := 0; it < b.N; it++ {
		runtime.GC()
		var m0, m1 runtime.MemStats
		runtime.ReadMemStats(&m0)
		sw := &table{flows: map[string]of.Flow{}}
		s := newFlowState(flowsync.New(sw))
		ids := flows.NewAllocator[flows.ConjKey](0)
		own := 0
		want := map[string][]of.Flow{}
		for i, np := range nps {
			tr := flows.Translate(np, pipeline.Cookie(1, pipeline.CategoryPolicy, uint64(i+1)), src, ids)
			own += len(tr.Flows)
			want[np.Name] = tr.Flows
		}
		if _, err := s.update(context.Background(), want); err != nil {
			b.Fatal(err)
		}
		runtime.GC()
		runtime.ReadMemStats(&m1)
		b.ReportMetric(float64(own)/n, "flows/policy")
		b.ReportMetric(float64(len(sw.flows))/n, "switchflows/policy")
		b.ReportMetric(float64(m1.HeapAlloc-m0.HeapAlloc)/(1<<20), "heapMiB")
		runtime.KeepAlive(s)
		runtime.KeepAlive(sw)
	}
}
