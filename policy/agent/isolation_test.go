package agent

import (
	"context"
	"errors"
	"fmt"
	"reflect"
	"sort"
	"sync"
	"testing"

	"go.uber.org/zap/zaptest"
)

// isoHarness drives the agent's isolation bookkeeping directly: installed
// policies are set by hand, and OnIsolation records its calls (which run
// concurrently: round sorts them).
type isoHarness struct {
	a     *Agent
	mu    sync.Mutex
	calls []string
	fail  map[string]bool
	// during runs inside OnIsolation (e.g. to re-attach a Pod mid-call).
	during func(name string)
}

func newIsoHarness(t *testing.T) *isoHarness {
	h := &isoHarness{fail: map[string]bool{}}
	h.a = New(nil, Config{NodeName: "n", OnIsolation: func(_ context.Context, ns, name string, in, eg bool) error {
		h.mu.Lock()
		defer h.mu.Unlock()
		h.calls = append(h.calls, fmt.Sprintf("%s %v %v", name, in, eg))
		if h.during != nil {
			h.during(name)
		}
		if h.fail[name] {
			return errors.New("switch said no")
		}
		return nil
	}}, zaptest.NewLogger(t))
	t.Cleanup(h.a.queue.ShutDown) // Run would; the harness never calls it
	return h
}

func (h *isoHarness) attach(names ...string) {
	for _, n := range names {
		h.a.PodAttached(LocalPod{Namespace: "ns", Name: n, OFPort: 7})
	}
}

func (h *isoHarness) install(policy string, ingress, egress bool, targets ...string) {
	inst := &installed{targets: map[string]bool{}, iso: isolation{ingress: ingress, egress: egress}}
	for _, t := range targets {
		inst.targets["ns/"+t] = true
	}
	h.a.mu.Lock()
	if len(targets) == 0 && !ingress && !egress {
		delete(h.a.done, policy)
	} else {
		h.a.done[policy] = inst
	}
	h.a.mu.Unlock()
}

// round does the isolation part of one reconcile and returns the calls.
func (h *isoHarness) round(t *testing.T) ([]string, error) {
	t.Helper()
	h.calls = nil
	h.a.mu.Lock()
	changes := h.a.isolationChangesLocked()
	h.a.mu.Unlock()
	err := h.a.applyIsolation(context.Background(), changes)
	sort.Strings(h.calls)
	return h.calls, err
}

// ok is round for a round that must succeed.
func (h *isoHarness) ok(t *testing.T) []string {
	t.Helper()
	calls, err := h.round(t)
	if err != nil {
		t.Fatalf("round failed: %v (calls %v)", err, calls)
	}
	return calls
}

func (h *isoHarness) pending(name string) bool {
	h.a.mu.Lock()
	defer h.a.mu.Unlock()
	return h.a.pending["ns/"+name]
}

func TestIsolationUnionAndChanges(t *testing.T) {
	h := newIsoHarness(t)
	h.attach("a", "b", "c")
	h.install("p-in", true, false, "a", "b")
	h.install("p-out", false, true, "b", "gone") // "gone" is not attached
	calls, err := h.round(t)
	if err != nil || !reflect.DeepEqual(calls, []string{"a true false", "b true true"}) {
		t.Fatalf("first round: %v, %v", calls, err)
	}
	// Nothing changed: no call.
	if calls := h.ok(t); len(calls) != 0 {
		t.Errorf("unchanged isolation called %v", calls)
	}
	// p-in goes away: a is released, b keeps egress.
	h.install("p-in", false, false)
	calls = h.ok(t)
	if !reflect.DeepEqual(calls, []string{"a false false", "b false true"}) {
		t.Errorf("after removing p-in: %v", calls)
	}
	// A policy that isolates for nothing (no policy type) changes nothing.
	h.install("p-none", false, false, "c")
	if calls := h.ok(t); len(calls) != 0 {
		t.Errorf("a policy isolating nothing called %v", calls)
	}
}

func TestIsolationFailureIsPendingAndRetried(t *testing.T) {
	h := newIsoHarness(t)
	h.attach("a")
	h.install("p", true, false, "a")
	h.fail["a"] = true
	if _, err := h.round(t); err == nil {
		t.Fatal("failed OnIsolation not reported")
	}
	if !h.pending("a") || !h.a.isoRetry {
		t.Fatalf("after a failure: pending %v, retry %v", h.pending("a"), h.a.isoRetry)
	}
	h.fail["a"] = false
	calls, err := h.round(t)
	if err != nil || !reflect.DeepEqual(calls, []string{"a true false"}) || h.pending("a") || h.a.isoRetry {
		t.Errorf("retry: %v, %v, pending %v", calls, err, h.pending("a"))
	}
	// A failed change that is no longer wanted is no longer pending.
	h.install("p", false, false)
	h.fail["a"] = true
	if _, err := h.round(t); err == nil {
		t.Fatal("failed OnIsolation of an unwanted change not reported")
	}
	h.install("p", true, false, "a")
	if calls := h.ok(t); len(calls) != 0 || h.pending("a") {
		t.Errorf("isolation back to the applied one: calls %v, pending %v", calls, h.pending("a"))
	}
}

func TestIsolationFollowsAttachments(t *testing.T) {
	h := newIsoHarness(t)
	h.attach("a")
	h.install("p", true, true, "a")
	if calls := h.ok(t); len(calls) != 1 {
		t.Fatalf("calls %v", calls)
	}
	// Detached: forgotten, no call. Attached again: a fresh attachment is
	// not isolated, so it is isolated again.
	h.a.PodDetached("ns", "a")
	if calls := h.ok(t); len(calls) != 0 {
		t.Errorf("detached Pod called %v", calls)
	}
	h.attach("a")
	h.install("p", true, true, "a")
	if calls := h.ok(t); !reflect.DeepEqual(calls, []string{"a true true"}) {
		t.Errorf("re-attached Pod: %v", calls)
	}
	// Attached again while a call for the earlier attachment runs: the
	// new attachment's state is unknown, so the next round applies the
	// isolation even though it equals "not isolated".
	h.install("p", false, false)
	h.during = func(name string) { h.attach(name); h.during = nil }
	if calls := h.ok(t); !reflect.DeepEqual(calls, []string{"a false false"}) {
		t.Fatalf("calls %v", calls)
	}
	if !h.a.isoRetry {
		t.Error("no retry scheduled for the unknown attachment")
	}
	if calls := h.ok(t); !reflect.DeepEqual(calls, []string{"a false false"}) {
		t.Errorf("unknown attachment: %v, want the isolation applied again", calls)
	}
	if calls := h.ok(t); len(calls) != 0 {
		t.Errorf("then nothing: %v", calls)
	}
}

func TestPodAttachedAgainIsNotRealized(t *testing.T) {
	h := newIsoHarness(t)
	h.attach("a")
	h.install("p", true, false, "a")
	h.a.PodAttached(LocalPod{Namespace: "ns", Name: "a", OFPort: 9})
	h.a.mu.Lock()
	defer h.a.mu.Unlock()
	if h.a.done["p"].targets["ns/a"] || !h.a.dirty["p"] {
		t.Error("a policy installed for the earlier attachment still counts for the new one")
	}
	if _, names := h.a.installedDigestLocked("ns/a"); len(names) != 0 {
		t.Errorf("installed policies of the new attachment %v, want none until reconciled", names)
	}
}
