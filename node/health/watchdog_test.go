package health

import (
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"k8s.io/client-go/util/workqueue"
	clocktesting "k8s.io/utils/clock/testing"
)

func TestWatchdogUnits(t *testing.T) {
	now := time.Unix(1000, 0)
	w := NewWatchdog(time.Minute)
	w.now = func() time.Time { return now }
	doneA := w.Start("cni ADD a")
	now = now.Add(30 * time.Second)
	doneB := w.Start("cni DEL b")
	if err := w.Check(); err != nil {
		t.Fatalf("30 s in: %v", err)
	}
	now = now.Add(40 * time.Second) // a at 70 s, b at 40 s
	err := w.Check()
	if err == nil || !strings.Contains(err.Error(), "1 unit(s)") || !strings.Contains(err.Error(), "cni ADD a for 1m10s") {
		t.Fatalf("a past the limit: %v", err)
	}
	now = now.Add(time.Minute) // a at 130 s, b at 100 s
	if err := w.Check(); err == nil || !strings.Contains(err.Error(), "2 unit(s)") || !strings.Contains(err.Error(), "cni ADD a") {
		t.Fatalf("both past the limit, a the oldest: %v", err)
	}
	doneA()
	doneA()
	if err := w.Check(); err == nil || !strings.Contains(err.Error(), "cni DEL b for 1m40s") {
		t.Fatalf("b still past the limit: %v", err)
	}
	var paused bool
	w.PauseWhile(func() bool { return paused })
	paused = true
	if err := w.Check(); err != nil {
		t.Fatalf("paused (OVS down): %v", err)
	}
	paused = false
	if err := w.Check(); err == nil {
		t.Fatal("b still past the limit once no longer paused: passed")
	}
	doneB()
	if err := w.Check(); err != nil {
		t.Fatalf("all done: %v", err)
	}
}

// A real workqueue with the provider: an item held past the limit fails
// the check (through the queue's own longest-running-processor tracking),
// and passes again once the worker is done with it.
func TestWatchdogWorkqueue(t *testing.T) {
	reg := prometheus.NewRegistry()
	w := NewWatchdog(time.Minute)
	clock := clocktesting.NewFakeClock(time.Unix(1000, 0))
	m := NewQueueMetrics(reg, w)
	q := workqueue.NewTypedWithConfig(workqueue.TypedQueueConfig[string]{Name: "routes",
		MetricsProvider: m, Clock: clock})
	longest := func() float64 { return testutil.ToFloat64(m.longest.WithLabelValues("routes")) }
	defer q.ShutDown()
	q.Add("n1")
	item, _ := q.Get()
	waitFor := func(what string, step time.Duration, cond func() bool) {
		t.Helper()
		deadline := time.Now().Add(10 * time.Second)
		for !cond() {
			if time.Now().After(deadline) {
				t.Fatalf("%s: not after 10 s; check: %v", what, w.Check())
			}
			// The queue reports on its ticker (500 ms), when the clock
			// steps.
			clock.Step(step)
			time.Sleep(time.Millisecond)
		}
	}
	// The queue's reporting goroutine sets up its ticker first.
	deadline := time.Now().Add(10 * time.Second)
	for !clock.HasWaiters() {
		if time.Now().After(deadline) {
			t.Fatal("the queue set up no ticker")
		}
		time.Sleep(time.Millisecond)
	}
	// 30 s in: below the limit.
	for i := 0; i < 30; i++ {
		clock.Step(time.Second)
	}
	waitFor("the queue reporting 30 s", 0, func() bool {
		return longest() >= 30
	})
	if err := w.Check(); err != nil {
		t.Fatalf("item held 30 s: %v", err)
	}
	clock.Step(time.Minute)
	waitFor("the check failing", 0, func() bool { return w.Check() != nil })
	if err := w.Check(); !strings.Contains(err.Error(), "an item of workqueue routes") {
		t.Fatalf("check: %v", err)
	}
	q.Done(item)
	waitFor("the check passing once the item is done", time.Second, func() bool { return w.Check() == nil })
	if got := longest(); got != 0 {
		t.Errorf("longest-running gauge %v after Done, want 0", got)
	}
	if n, err := testutil.GatherAndCount(reg, "seine_workqueue_adds_total"); err != nil || n != 1 {
		t.Errorf("adds series: %d, %v", n, err)
	}
}
