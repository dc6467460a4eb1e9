package controller

import (
	"context"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/util/workqueue"

	"github.com/seine-net/seine/policy/compute"
)

// TestApplySchedules: a change that finds the controller idle is queued
// for its workers at once; one that finds it busy waits for WriteDelay
// (here an hour, so it is still waiting when the test looks).
func TestApplySchedules(t *testing.T) {
	c := &Controller{cfg: Config{WriteDelay: time.Hour}}
	c.metrics = newMetrics(prometheus.NewRegistry(), c)
	l := &leading{c: c, model: compute.New(0), started: true,
		queue:     workqueue.NewTypedRateLimitingQueue(workqueue.DefaultTypedControllerRateLimiter[compute.Key]()),
		scheduled: map[compute.Key]struct{}{}}
	defer l.queue.ShutDown()
	l.initialDone.Store(true)
	l.apply(func(m *compute.Model) {
		m.UpsertNode(node("n1"))
		m.UpsertNamespace(&corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "web"}})
		m.UpsertPod(pod("web", "web-0", "n1", "10.244.1.10", map[string]string{"app": "web"}))
		m.UpsertNetworkPolicy(&networkingv1.NetworkPolicy{ObjectMeta: metav1.ObjectMeta{Namespace: "web", Name: "deny"},
			Spec: networkingv1.NetworkPolicySpec{PodSelector: *match("app", "web")}})
	})
	idleKeys := l.queue.Len()
	if idleKeys == 0 || idleKeys != l.depth() {
		t.Fatalf("a change while idle: %d keys ready for the workers, %d scheduled; want all of them ready", idleKeys, l.depth())
	}
	// Nothing has been processed, so the controller is busy now. A Pod on
	// another Node dirties objects of that Node.
	l.apply(func(m *compute.Model) {
		m.UpsertNode(node("n2"))
		m.UpsertPod(pod("web", "web-1", "n2", "10.244.2.10", map[string]string{"app": "web"}))
	})
	if l.depth() <= idleKeys {
		t.Fatalf("the second change scheduled nothing (%d keys scheduled)", l.depth())
	}
	if got := l.queue.Len(); got != idleKeys {
		t.Errorf("a change while busy: %d keys ready for the workers, want the %d of the first change (the rest wait for WriteDelay)", got, idleKeys)
	}
}

// TestDeleteDue: a group or PodRealization no longer desired waits
// DeleteDelay (here an hour) and is scheduled for then. A NetworkPolicy
// object goes at once, unless a policy or group is still to be written
// (a replacement and its groups go first), but never later than
// DeleteDelay; a PodRealization to write, another policy or a group
// waiting to be deleted hold nothing back.
func TestDeleteDue(t *testing.T) {
	newLeading := func(deleteDelay time.Duration) *leading {
		l := &leading{c: &Controller{cfg: Config{DeleteDelay: deleteDelay}},
			queue:     workqueue.NewTypedRateLimitingQueue(workqueue.DefaultTypedControllerRateLimiter[compute.Key]()),
			scheduled: map[compute.Key]struct{}{}, running: map[compute.Key]struct{}{},
			deleteAt: map[compute.Key]time.Time{}, policyGone: map[compute.Key]time.Time{}}
		t.Cleanup(l.queue.ShutDown)
		return l
	}
	np := func(name string) compute.Key { return compute.Key{Kind: compute.KindNetworkPolicy, Name: name} }
	l := newLeading(time.Hour)
	groups := []compute.Key{{Kind: compute.KindAddressGroup, Name: "ag"}, {Kind: compute.KindAppliedToGroup, Name: "atg"},
		{Kind: compute.KindPodRealization, Name: "pr"}}
	for _, k := range groups {
		if l.deleteDue(k) {
			t.Errorf("%s deleted without waiting for DeleteDelay", k)
		}
		if _, ok := l.scheduled[k]; !ok {
			t.Errorf("%s not scheduled for its deletion", k)
		}
	}
	if l.depth() != 3 || l.queue.Len() != 0 {
		t.Errorf("%d keys scheduled, %d ready; want the 3 scheduled an hour out", l.depth(), l.queue.Len())
	}
	// Those three are waiting deletions, and a PodRealization write is
	// no policy's: nothing holds the policy back.
	l.running[compute.Key{Kind: compute.KindPodRealization, Name: "pr-2"}] = struct{}{}
	if !l.deleteDue(np("a")) {
		t.Error("a NetworkPolicy object waits with no policy or group to write")
	}
	// A replacement policy's AppliedToGroup is still to be written, then
	// being written: the old policy waits for it.
	atg := compute.Key{Kind: compute.KindAppliedToGroup, Name: "atg-b"}
	l.scheduled[atg] = struct{}{}
	if l.deleteDue(np("b")) {
		t.Error("a NetworkPolicy object deleted before a scheduled AppliedToGroup was written")
	}
	delete(l.scheduled, atg)
	l.running[atg] = struct{}{}
	if l.deleteDue(np("b")) {
		t.Error("a NetworkPolicy object deleted while an AppliedToGroup is being written")
	}
	delete(l.running, atg)
	delete(l.scheduled, np("b")) // a worker has taken its recheck
	if !l.deleteDue(np("b")) {
		t.Error("a NetworkPolicy object still waits once the writes are done")
	}
	// Two policies going together do not wait for each other.
	l.scheduled[np("c")] = struct{}{}
	if l.deleteDue(np("d")) {
		t.Error("a policy deleted while another, not yet looked at, might be a write")
	}
	l.scheduled[np("d")] = struct{}{}
	delete(l.scheduled, np("c"))
	if !l.deleteDue(np("c")) {
		t.Error("a policy waits for another policy's deletion")
	}
	// A controller that never runs out of writes holds a revocation back
	// for DeleteDelay at most.
	l = newLeading(10 * time.Millisecond)
	l.scheduled[compute.Key{Kind: compute.KindAddressGroup, Name: "busy"}] = struct{}{}
	if l.deleteDue(np("e")) {
		t.Fatal("a policy deleted with a group write pending")
	}
	time.Sleep(20 * time.Millisecond)
	if !l.deleteDue(np("e")) {
		t.Error("a policy still waits after DeleteDelay")
	}
}

// postponing is a reconciler that puts every object off once (as a
// deletion waiting for DeleteDelay does) and then reconciles it.
type postponing struct {
	reconciler
	seen map[compute.Key]bool
}

func (p *postponing) reconcile(_ context.Context, l *leading, k compute.Key, _ metav1.Object, _ bool) error {
	if !p.seen[k] {
		p.seen[k] = true
		l.enqueue(k, 0)
	}
	return nil
}

// TestRoundCountsEachObjectOnce: an object put off and reconciled later
// counts once in its round's Objects, when it is done.
func TestRoundCountsEachObjectOnce(t *testing.T) {
	c := &Controller{cfg: Config{}}
	c.metrics = newMetrics(prometheus.NewRegistry(), c)
	c.term.Store(&term{})
	kind := compute.KindAddressGroup
	l := &leading{c: c, model: compute.New(0),
		queue:     workqueue.NewTypedRateLimitingQueue(workqueue.DefaultTypedControllerRateLimiter[compute.Key]()),
		scheduled: map[compute.Key]struct{}{}, running: map[compute.Key]struct{}{},
		kinds: map[compute.Kind]reconciler{kind: &postponing{seen: map[compute.Key]bool{}}}}
	defer l.queue.ShutDown()
	l.initialDone.Store(true)
	for _, name := range []string{"a", "b"} {
		l.enqueue(compute.Key{Kind: kind, Name: name}, 0)
	}
	for i := 0; i < 4; i++ {
		l.work(context.Background())
	}
	if l.depth() != 0 {
		t.Fatalf("%d objects still scheduled after four passes", l.depth())
	}
	last := c.term.Load().last
	if last == nil || last.Objects != 2 {
		t.Errorf("round %+v, want one round of 2 objects (each put off once)", last)
	}
}
