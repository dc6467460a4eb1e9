package flowsync

import (
	"context"
	"errors"
	"fmt"
	"net"
	"reflect"
	"sync"
	"testing"
	"time"

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

// Two owners want one entry with different actions (two Services with one
// external IP and port): when the owner whose version the switch holds
// lets go, the other owner's version is written back.
func TestSharedEntryKeepsARemainingOwnersVersion(t *testing.T) {
	r := &recorder{}
	s := New(r)
	ctx := context.Background()
	a, b := flow(50, "10.0.0.9", 4), flow(50, "10.0.0.9", 5)
	if err := s.Set(ctx, "svc-a", []of.Flow{a}); err != nil {
		t.Fatal(err)
	}
	if err := s.Set(ctx, "svc-b", []of.Flow{b}); err != nil {
		t.Fatal(err)
	}
	if err := s.Delete(ctx, "svc-b"); err != nil {
		t.Fatal(err)
	}
	last := r.batches[len(r.batches)-1]
	if len(last) != 1 || last[0].Op != of.OpAdd || !sameFlow(last[0].Flow, a) {
		t.Fatalf("after the second owner let go, sent %+v; want svc-a's version added back", last)
	}
	if err := s.Delete(ctx, "svc-a"); err != nil {
		t.Fatal(err)
	}
	if last := r.batches[len(r.batches)-1]; count(last, of.OpDelete) != 1 {
		t.Fatalf("last owner's delete: %+v", last)
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

// gate is a fake switch whose first Apply blocks until open is closed,
// and which rejects every bundle holding a flow that outputs to port 666.
type gate struct {
	mu      sync.Mutex
	batches [][]of.FlowMod
	entered chan struct{} // closed when the first Apply blocks
	open    chan struct{}
	first   bool
}

func newGate() *gate { return &gate{entered: make(chan struct{}), open: make(chan struct{})} }

func (g *gate) Apply(ctx context.Context, mods []of.FlowMod) error {
	g.mu.Lock()
	first := !g.first
	g.first = true
	g.mu.Unlock()
	if first {
		close(g.entered)
		<-g.open
	}
	for _, m := range mods {
		if out, ok := m.Flow.Actions[0].(of.Output); ok && out.Port == 666 {
			return errors.New("rejected flow to port 666")
		}
	}
	g.mu.Lock()
	g.batches = append(g.batches, mods)
	g.mu.Unlock()
	return nil
}

// queueBehind blocks a first bundle on a new gate, queues n changes
// behind it (change i outputs to port(i)), lets the first bundle through
// and returns the syncer, the gate and each change's error.
func queueBehind(t *testing.T, n int, port func(i int) uint32) (*Syncer, *gate, []error) {
	t.Helper()
	g := newGate()
	s := New(g)
	ctx := context.Background()
	first := make(chan error, 1)
	go func() { first <- s.Set(ctx, "first", []of.Flow{flow(70, "10.0.1.1", 1)}) }()
	<-g.entered
	errs := make([]error, n)
	var wg sync.WaitGroup
	for i := 0; i < n; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs[i] = s.Set(ctx, fmt.Sprintf("o%d", i), []of.Flow{flow(70, fmt.Sprintf("10.0.2.%d", i), port(i))})
		}()
	}
	for s.commits.Queued() != n {
		time.Sleep(time.Millisecond)
	}
	close(g.open)
	wg.Wait()
	if err := <-first; err != nil {
		t.Fatal(err)
	}
	return s, g, errs
}

// TestConcurrentSetsShareBundles queues 20 changes while a bundle is on its
// way: they travel in one more bundle, not 20, and a change the switch
// rejects fails its own caller only.
func TestConcurrentSetsShareBundles(t *testing.T) {
	const n = 20
	s, g, errs := queueBehind(t, n, func(i int) uint32 { return uint32(10 + i) })
	if err := errors.Join(errs...); err != nil {
		t.Fatal(err)
	}
	if got := s.bundles.Load(); got != 2 {
		t.Errorf("%d bundles for 1 + %d changes, want 2", got, n)
	}
	if len(g.batches) != 2 || len(g.batches[1]) != n {
		t.Errorf("bundles on the switch: %d, second with %d mods", len(g.batches), len(g.batches[1]))
	}

	s, _, errs = queueBehind(t, n, func(i int) uint32 {
		if i == 7 {
			return 666 // rejected
		}
		return uint32(10 + i)
	})
	for i, err := range errs {
		if (err != nil) != (i == 7) {
			t.Errorf("change %d: %v", i, err)
		}
	}
	// The first bundle, the shared one (rejected), then each change alone.
	if got := s.bundles.Load(); got != 2+n {
		t.Errorf("%d bundles sent, want %d", got, 2+n)
	}
	if s.Has("o7") || !s.Has("o8") || s.Count() != n {
		t.Errorf("state after the batch: has o7 %v, o8 %v, %d flows", s.Has("o7"), s.Has("o8"), s.Count())
	}
}

// TestQueuedSetGivesUp cancels changes while they wait behind a bundle:
// they fail with their context's error and the others, queued after them,
// are still sent.
func TestQueuedSetGivesUp(t *testing.T) {
	g := newGate()
	s := New(g)
	first := make(chan error, 1)
	go func() { first <- s.Set(context.Background(), "first", []of.Flow{flow(70, "10.0.1.1", 1)}) }()
	<-g.entered
	cctx, cancel := context.WithCancel(context.Background())
	gaveUp := make(chan error, 1)
	go func() { gaveUp <- s.Set(cctx, "cancelled", []of.Flow{flow(70, "10.0.3.1", 3)}) }()
	for s.commits.Queued() != 1 {
		time.Sleep(time.Millisecond)
	}
	later := make(chan error, 1)
	go func() { later <- s.Set(context.Background(), "later", []of.Flow{flow(70, "10.0.3.2", 4)}) }()
	cancel()
	if err := <-gaveUp; !errors.Is(err, context.Canceled) {
		t.Fatalf("cancelled change: %v", err)
	}
	close(g.open)
	if err := <-first; err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-later:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("a change queued behind a cancelled one was never sent")
	}
	if s.Has("cancelled") || !s.Has("later") {
		t.Errorf("cancelled recorded %v, later recorded %v", s.Has("cancelled"), s.Has("later"))
	}
}

// TestManyConcurrentSets changes 50 owners from 50 goroutines, three times
// each: the state ends as the last change of each, and the switch holds
// exactly those flows.
func TestManyConcurrentSets(t *testing.T) {
	sw := &tracking{flows: map[string]of.Flow{}}
	s := New(sw)
	var wg sync.WaitGroup
	for i := 0; i < 50; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for round := 0; round < 3; round++ {
				fl := []of.Flow{flow(70, fmt.Sprintf("10.1.%d.%d", i, round), uint32(round+1)), flow(20, "10.9.9.9", 7)}
				if err := s.Set(context.Background(), fmt.Sprintf("o%d", i), fl); err != nil {
					t.Error(err)
				}
			}
		}()
	}
	wg.Wait()
	if got := s.Count(); got != 51 || len(sw.flows) != 51 {
		t.Fatalf("desired %d flows, switch holds %d; want 51", got, len(sw.flows))
	}
	for i := 0; i < 50; i++ {
		if _, ok := sw.flows[Key(flow(70, fmt.Sprintf("10.1.%d.2", i), 3))]; !ok {
			t.Fatalf("owner %d's last flow is missing", i)
		}
	}
	for i := 0; i < 50; i++ {
		_ = s.Delete(context.Background(), fmt.Sprintf("o%d", i))
	}
	if len(sw.flows) != 0 || s.Count() != 0 {
		t.Fatalf("after deleting every owner: switch %d, desired %d", len(sw.flows), s.Count())
	}
}

// tracking is a fake switch that keeps the flow table bundles leave.
type tracking struct {
	mu    sync.Mutex
	flows map[string]of.Flow
}

func (sw *tracking) Apply(_ context.Context, mods []of.FlowMod) error {
	sw.mu.Lock()
	defer sw.mu.Unlock()
	for _, m := range mods {
		if m.Op == of.OpDelete {
			delete(sw.flows, Key(m.Flow))
		} else {
			sw.flows[Key(m.Flow)] = m.Flow
		}
	}
	return nil
}

// Every field of a match is part of the key: two flows that differ in any
// one of them are two entries to OVS, and must be two to the syncer. A
// field added to of.Match without a sample here fails the test.
func TestKeyCoversEveryMatchField(t *testing.T) {
	zone, conj := uint16(7), uint32(9)
	samples := map[reflect.Type]any{
		reflect.TypeFor[uint8]():            uint8(6),
		reflect.TypeFor[uint16]():           uint16(0x800),
		reflect.TypeFor[uint32]():           uint32(3),
		reflect.TypeFor[net.HardwareAddr](): net.HardwareAddr{0xaa, 0xbb, 0xcc, 0, 0, 1},
		reflect.TypeFor[net.IP]():           net.IPv4(10, 244, 0, 5).To4(),
		reflect.TypeFor[*net.IPNet]():       &net.IPNet{IP: net.IPv4(10, 244, 0, 0).To4(), Mask: net.CIDRMask(24, 32)},
		reflect.TypeFor[*of.PortMatch]():    &of.PortMatch{Port: 80, Mask: 0xffff},
		reflect.TypeFor[*of.FragMatch]():    &of.FragMatch{Value: 1, Mask: 1},
		reflect.TypeFor[*of.Masked64]():     &of.Masked64{Value: 5, Mask: 0xff},
		reflect.TypeFor[*of.Masked32]():     &of.Masked32{Value: 5, Mask: 0xff},
		reflect.TypeFor[[]of.RegMatch]():    []of.RegMatch{{Reg: 1, Value: 2, Mask: 3}},
		reflect.TypeFor[*of.CtStateMatch](): &of.CtStateMatch{Set: 1, Clear: 2},
		reflect.TypeFor[*uint16]():          &zone,
		reflect.TypeFor[*uint32]():          &conj,
	}
	base := of.Flow{Table: 10, Priority: 100}
	seen := map[string]string{Key(base): "(none)"}
	mt := reflect.TypeFor[of.Match]()
	for i := range mt.NumField() {
		f := mt.Field(i)
		v, ok := samples[f.Type]
		if !ok {
			t.Fatalf("of.Match.%s has type %s, which this test has no sample for: add one", f.Name, f.Type)
		}
		fl := base
		reflect.ValueOf(&fl.Match).Elem().Field(i).Set(reflect.ValueOf(v))
		k := Key(fl)
		if other, dup := seen[k]; dup {
			t.Errorf("setting %s gives the key %q, as %s does", f.Name, k, other)
		}
		seen[k] = f.Name
	}
}

// Two matches OVS reads as one entry have one key: a zero mask is exact,
// as all ones is, and bits outside a mask do not count.
func TestKeyNormalisesMasks(t *testing.T) {
	base := of.Flow{Table: 10, Priority: 100}
	for _, tc := range []struct {
		name string
		a, b of.Match
	}{
		{"reg, zero mask and all ones", of.Match{Regs: []of.RegMatch{{Reg: 1, Value: 5}}},
			of.Match{Regs: []of.RegMatch{{Reg: 1, Value: 5, Mask: 0xffffffff}}}},
		{"reg, bits outside the mask", of.Match{Regs: []of.RegMatch{{Reg: 1, Value: 0x15, Mask: 0x0f}}},
			of.Match{Regs: []of.RegMatch{{Reg: 1, Value: 0x05, Mask: 0x0f}}}},
		{"tp_dst", of.Match{L4Dst: &of.PortMatch{Port: 0x1f50, Mask: 0xff00}},
			of.Match{L4Dst: &of.PortMatch{Port: 0x1f00, Mask: 0xff00}}},
		{"eth_dst under a mask", of.Match{EthDst: net.HardwareAddr{1, 2, 3, 4, 5, 6}, EthDstMask: net.HardwareAddr{0xff, 0, 0, 0, 0, 0}},
			of.Match{EthDst: net.HardwareAddr{1, 9, 9, 9, 9, 9}, EthDstMask: net.HardwareAddr{0xff, 0, 0, 0, 0, 0}}},
	} {
		fa, fb := base, base
		fa.Match, fb.Match = tc.a, tc.b
		if Key(fa) != Key(fb) {
			t.Errorf("%s: keys %q and %q, want one", tc.name, Key(fa), Key(fb))
		}
	}
}
