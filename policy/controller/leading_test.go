package controller

import (
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

// TestDeleteDue: an undesired NetworkPolicy object may be deleted at once
// (its deletion revokes access); a group waits DeleteDelay (here an hour)
// and is scheduled for then.
func TestDeleteDue(t *testing.T) {
	c := &Controller{cfg: Config{DeleteDelay: time.Hour}}
	l := &leading{c: c, queue: workqueue.NewTypedRateLimitingQueue(workqueue.DefaultTypedControllerRateLimiter[compute.Key]()),
		scheduled: map[compute.Key]struct{}{}, deleteAt: map[compute.Key]time.Time{}}
	defer l.queue.ShutDown()
	if !l.deleteDue(compute.Key{Kind: compute.KindNetworkPolicy, Name: "np-1"}) {
		t.Error("a NetworkPolicy object waits for DeleteDelay")
	}
	for _, kind := range []compute.Kind{compute.KindAddressGroup, compute.KindAppliedToGroup, compute.KindPodRealization} {
		k := compute.Key{Kind: kind, Name: "x"}
		if l.deleteDue(k) {
			t.Errorf("%s deleted without waiting for DeleteDelay", kind)
		}
		if _, ok := l.scheduled[k]; !ok {
			t.Errorf("%s not scheduled for its deletion", kind)
		}
	}
	if l.depth() != 3 || l.queue.Len() != 0 {
		t.Errorf("%d keys scheduled, %d ready; want the 3 groups scheduled an hour out", l.depth(), l.queue.Len())
	}
}
