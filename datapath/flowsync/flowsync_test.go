package flowsync

import (
	"context"
	"errors"
	"net"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	of "github.com/seine-net/seine/datapath/openflow"
)

// recorder is a fake switch: it records the mods of each Apply.
type recorder struct {
	batches [][]of.FlowMod
	fail    bool
}

func (r *recorder) Apply(_ context.Context, mods []of.FlowMod) error {
	if r.fail {
		return errors.New("rejected")
	}
	r.batches = append(r.batches, mods)
	return nil
}

func flow(table uint8, ip string, port uint32) of.Flow {
	_, n, _ := net.ParseCIDR(ip + "/32")
	return of.Flow{Table: table, Priority: 200, Match: of.Match{EthType: 0x0800, IPDst: n},
		Actions: []of.Action{of.Output{Port: port}}}
}

func count(mods []of.FlowMod, op of.Op) int {
	n := 0
	for _, m := range mods {
		if m.Op == op {
			n++
		}
	}
	return n
}

func TestSetSendsOnlyTheDifference(t *testing.T) {
	r := &recorder{}
	s := New(r)
	ctx := context.Background()
	a, b, c := flow(70, "10.0.0.1", 1), flow(70, "10.0.0.2", 2), flow(70, "10.0.0.3", 3)
	if err := s.Set(ctx, "o", []of.Flow{a, b}); err != nil {
		t.Fatal(err)
	}
	if len(r.batches) != 1 || count(r.batches[0], of.OpAdd) != 2 {
		t.Fatalf("first set: %+v", r.batches)
	}
	// Same flows: nothing sent.
	if err := s.Set(ctx, "o", []of.Flow{b, a}); err != nil || len(r.batches) != 1 {
		t.Fatalf("unchanged set sent %d batches, err %v", len(r.batches), err)
	}
	// Replace a by c, change b's action.
	b2 := flow(70, "10.0.0.2", 9)
	if err := s.Set(ctx, "o", []of.Flow{b2, c}); err != nil {
		t.Fatal(err)
	}
	last := r.batches[len(r.batches)-1]
	if count(last, of.OpDelete) != 1 || count(last, of.OpAdd) != 2 {
		t.Fatalf("update batch: %+v", last)
	}
	if got := s.Count(); got != 2 {
		t.Fatalf("Count = %d", got)
	}
}

func TestSharedFlowSurvivesOneOwner(t *testing.T) {
	r := &recorder{}
	s := New(r)
	ctx := context.Background()
	shared := flow(50, "10.0.0.9", 4)
	_ = s.Set(ctx, "p1", []of.Flow{shared})
	_ = s.Set(ctx, "p2", []of.Flow{shared})
	if err := s.Delete(ctx, "p1"); err != nil {
		t.Fatal(err)
	}
	for _, m := range r.batches[len(r.batches)-1] {
		if m.Op == of.OpDelete {
			t.Fatal("a flow another owner still wants was deleted")
		}
	}
	if err := s.Delete(ctx, "p2"); err != nil {
		t.Fatal(err)
	}
	if last := r.batches[len(r.batches)-1]; count(last, of.OpDelete) != 1 {
		t.Fatalf("last owner's delete: %+v", last)
	}
	if s.Has("p2") || s.Count() != 0 {
		t.Fatal("state left after deleting every owner")
	}
}

func TestFailedApplyRecordsNothing(t *testing.T) {
	r := &recorder{fail: true}
	s := New(r)
	if err := s.Set(context.Background(), "o", []of.Flow{flow(70, "10.0.0.1", 1)}); err == nil {
		t.Fatal("want error")
	}
	if s.Has("o") {
		t.Fatal("a rejected change was recorded")
	}
	r.fail = false
	if err := s.Set(context.Background(), "o", []of.Flow{flow(70, "10.0.0.1", 1)}); err != nil || len(r.batches) != 1 {
		t.Fatalf("retry: %v, %d batches", err, len(r.batches))
	}
}

func TestReplayResendsEverything(t *testing.T) {
	r := &recorder{}
	s := New(r)
	ctx := context.Background()
	_ = s.Set(ctx, "a", []of.Flow{flow(70, "10.0.0.1", 1)})
	_ = s.Set(ctx, "b", []of.Flow{flow(70, "10.0.0.2", 2), flow(70, "10.0.0.3", 3)})
	if err := s.Replay(ctx); err != nil {
		t.Fatal(err)
	}
	if last := r.batches[len(r.batches)-1]; count(last, of.OpAdd) != 3 {
		t.Fatalf("replay sent %+v", last)
	}
}

// CountByTable counts shared entries once; the metrics count every
// programmed change and mod.
func TestCountByTableAndMetrics(t *testing.T) {
	r := &recorder{}
	s := New(r)
	reg := prometheus.NewRegistry()
	if err := s.Register(reg); err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	shared := flow(70, "10.0.0.1", 1)
	if err := s.Set(ctx, "a", []of.Flow{shared, flow(80, "10.0.0.2", 2)}); err != nil {
		t.Fatal(err)
	}
	if err := s.Set(ctx, "b", []of.Flow{shared}); err != nil {
		t.Fatal(err)
	}
	if got := s.CountByTable(); got[70] != 1 || got[80] != 1 || len(got) != 2 {
		t.Fatalf("CountByTable = %v", got)
	}
	if err := s.Delete(ctx, "a"); err != nil {
		t.Fatal(err)
	}
	if n := testutil.CollectAndCount(reg, "seine_flow_programming_duration_seconds"); n != 1 {
		t.Fatalf("%d histogram series", n)
	}
	if adds := testutil.ToFloat64(s.mods.WithLabelValues("add")); adds != 3 {
		t.Errorf("adds = %v, want 3", adds)
	}
	if dels := testutil.ToFloat64(s.mods.WithLabelValues("delete")); dels != 1 {
		t.Errorf("deletes = %v, want 1 (the shared entry stays)", dels)
	}
}
