package controller

import (
	"context"
	"fmt"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"go.uber.org/zap"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/util/workqueue"

	opsv1alpha1 "github.com/seine-net/seine/node/apis/ops/v1alpha1"
	opsinformers "github.com/seine-net/seine/node/client/informers"
	cpv1alpha1 "github.com/seine-net/seine/policy/apis/controlplane/v1alpha1"
	cpinformers "github.com/seine-net/seine/policy/client/informers"
	"github.com/seine-net/seine/policy/compute"
)

// leading is the state of one leadership term.
type leading struct {
	c   *Controller
	log *zap.Logger

	mu      sync.RWMutex // guards model and started; Desired runs under RLock
	model   *compute.Model
	started bool

	queue workqueue.TypedRateLimitingInterface[compute.Key]

	smu       sync.Mutex // guards scheduled, running, written, deleteAt, policyGone
	scheduled map[compute.Key]struct{}
	// running are the keys the workers reconcile right now.
	running map[compute.Key]struct{}
	// written holds the objects this term wrote until the informer shows
	// them (or something newer), so a quick second reconcile of the same
	// key does not work from a stale cache.
	written map[compute.Key]metav1.Object
	// deleteAt is when an object no longer desired may be deleted.
	deleteAt map[compute.Key]time.Time
	// policyGone is when each NetworkPolicy object waiting for its
	// deletion (see deleteDue) was first found undesired.
	policyGone map[compute.Key]time.Time

	inflight    atomic.Int64
	initialDone atomic.Bool

	kinds map[compute.Kind]reconciler
	// sources are the stores of the source informers, by kind.
	sources map[string]cache.Store

	// rmu guards the current round (see Round): when it started (zero
	// while idle) and how many objects it reconciled.
	rmu          sync.Mutex
	roundStart   time.Time
	roundObjects int
}

func (l *leading) idle() bool {
	if !l.initialDone.Load() || l.inflight.Load() != 0 {
		return false
	}
	return l.depth() == 0
}

func (l *leading) depth() int {
	l.smu.Lock()
	defer l.smu.Unlock()
	return len(l.scheduled)
}

// enqueue schedules k for reconciliation after delay.
func (l *leading) enqueue(k compute.Key, delay time.Duration) {
	l.rmu.Lock()
	if l.roundStart.IsZero() {
		l.roundStart = time.Now()
	}
	l.rmu.Unlock()
	l.smu.Lock()
	l.scheduled[k] = struct{}{}
	l.smu.Unlock()
	if delay <= 0 {
		l.queue.Add(k)
	} else {
		l.queue.AddAfter(k, delay)
	}
}

// apply runs one model update and schedules the objects it dirtied: at once
// when the controller was idle (a lone change is written without waiting),
// else after WriteDelay, so that the changes of a burst coalesce into one
// write per object (the queue holds a key once).
func (l *leading) apply(fn func(m *compute.Model)) {
	l.mu.Lock()
	start := time.Now()
	fn(l.model)
	var keys []compute.Key
	if l.started && l.model.DirtyLen() > 0 {
		keys = l.model.TakeDirty()
	}
	l.c.metrics.compute.Observe(time.Since(start).Seconds())
	l.mu.Unlock()
	if len(keys) == 0 {
		return
	}
	delay := l.c.cfg.WriteDelay
	if l.idle() {
		delay = 0
	}
	for _, k := range keys {
		l.enqueue(k, delay)
	}
}

// agentCapabilities keeps of an AgentInfo its name and capabilities, all
// the controller reads of it.
func agentCapabilities(obj any) (any, error) {
	ai, ok := obj.(*opsv1alpha1.AgentInfo)
	if !ok {
		return obj, nil
	}
	return &opsv1alpha1.AgentInfo{
		ObjectMeta: metav1.ObjectMeta{Name: ai.Name, UID: ai.UID, ResourceVersion: ai.ResourceVersion},
		Status:     opsv1alpha1.AgentInfoStatus{Capabilities: ai.Status.Capabilities},
	}, nil
}

// stripMeta drops managed fields and annotations of other source objects.
func stripMeta(obj any) (any, error) {
	if a, ok := obj.(metav1.Object); ok {
		a.SetManagedFields(nil)
		a.SetAnnotations(nil)
	}
	return obj, nil
}

func deletedKey(obj any) (string, string) {
	k, err := cache.DeletionHandlingMetaNamespaceKeyFunc(obj)
	if err != nil {
		return "", ""
	}
	ns, name, _ := cache.SplitMetaNamespaceKey(k)
	return ns, name
}

// lead runs the controller for one term, begun at since, until ctx ends.
func (c *Controller) lead(ctx context.Context, since time.Time) error {
	ctx, cancel := context.WithCancel(ctx)
	l := &leading{
		c:     c,
		log:   c.log,
		model: compute.New(c.cfg.SliceSize, compute.WithPodRealizationSliceSize(c.cfg.PodRealizationSliceSize)),
		queue: workqueue.NewTypedRateLimitingQueueWithConfig(
			workqueue.NewTypedItemExponentialFailureRateLimiter[compute.Key](5*time.Millisecond, 10*time.Second),
			workqueue.TypedRateLimitingQueueConfig[compute.Key]{Name: "policy-controller", MetricsProvider: c.cfg.QueueMetrics}),
		scheduled:  make(map[compute.Key]struct{}),
		running:    make(map[compute.Key]struct{}),
		written:    make(map[compute.Key]metav1.Object),
		deleteAt:   make(map[compute.Key]time.Time),
		policyGone: make(map[compute.Key]time.Time),
	}
	kf := informers.NewSharedInformerFactory(c.kube, 0)
	cf := cpinformers.NewSharedInformerFactory(c.cp, 0)
	var of opsinformers.SharedInformerFactory // AgentInfos: which Nodes read sliced PodRealizations
	if c.cfg.Ops != nil {
		of = opsinformers.NewSharedInformerFactory(c.cfg.Ops, 0)
	}
	var workers sync.WaitGroup
	defer func() {
		cancel()
		l.queue.ShutDown()
		workers.Wait()
		kf.Shutdown()
		cf.Shutdown()
		if of != nil {
			of.Shutdown()
		}
		c.mu.Lock()
		if c.current == l {
			c.current = nil
		}
		c.mu.Unlock()
	}()

	podInf := kf.Core().V1().Pods().Informer()
	nsInf := kf.Core().V1().Namespaces().Informer()
	npInf := kf.Networking().V1().NetworkPolicies().Informer()
	nodeInf := kf.Core().V1().Nodes().Informer()
	if err := podInf.SetTransform(compactPod); err != nil {
		return fmt.Errorf("pod informer transform: %w", err)
	}
	for _, inf := range []cache.SharedIndexInformer{nsInf, npInf, nodeInf} {
		if err := inf.SetTransform(stripMeta); err != nil {
			return fmt.Errorf("informer transform: %w", err)
		}
	}
	type handlerSpec struct {
		inf    cache.SharedIndexInformer
		upsert func(m *compute.Model, o any)
		del    func(m *compute.Model, ns, name string)
	}
	l.sources = map[string]cache.Store{"pods": podInf.GetStore(), "namespaces": nsInf.GetStore(),
		"networkpolicies": npInf.GetStore(), "nodes": nodeInf.GetStore()}
	specs := []handlerSpec{
		{podInf, func(m *compute.Model, o any) { m.UpsertPodInfo(o.(*cachedPod).info) },
			func(m *compute.Model, ns, name string) { m.DeletePod(ns, name) }},
		{nsInf, func(m *compute.Model, o any) { m.UpsertNamespace(o.(*corev1.Namespace)) },
			func(m *compute.Model, _, name string) { m.DeleteNamespace(name) }},
		{npInf, func(m *compute.Model, o any) { m.UpsertNetworkPolicy(o.(*networkingv1.NetworkPolicy)) },
			func(m *compute.Model, ns, name string) { m.DeleteNetworkPolicy(ns, name) }},
		{nodeInf, func(m *compute.Model, o any) { m.UpsertNode(o.(*corev1.Node)) },
			func(m *compute.Model, _, name string) { m.DeleteNode(name) }},
	}
	if of != nil {
		agentInf := of.Ops().V1alpha1().AgentInfos().Informer()
		if err := agentInf.SetTransform(agentCapabilities); err != nil {
			return fmt.Errorf("agentinfo informer transform: %w", err)
		}
		l.sources["agentinfos"] = agentInf.GetStore()
		specs = append(specs, handlerSpec{agentInf,
			func(m *compute.Model, o any) {
				ai := o.(*opsv1alpha1.AgentInfo)
				m.SetPodRealizationSlicing(ai.Name, slices.Contains(ai.Status.Capabilities, cpv1alpha1.PodRealizationSlicesCapability))
			},
			func(m *compute.Model, _, name string) { m.SetPodRealizationSlicing(name, false) }})
	}
	// The model must have received every source object before the first
	// TakeDirty: a handler's own HasSynced says so (the informer's says
	// only that its store is filled).
	var handlersSynced []cache.InformerSynced
	for _, s := range specs {
		s := s
		reg, err := s.inf.AddEventHandler(cache.ResourceEventHandlerFuncs{
			AddFunc:    func(o any) { l.apply(func(m *compute.Model) { s.upsert(m, o) }) },
			UpdateFunc: func(_, o any) { l.apply(func(m *compute.Model) { s.upsert(m, o) }) },
			DeleteFunc: func(o any) {
				ns, name := deletedKey(o)
				l.apply(func(m *compute.Model) { s.del(m, ns, name) })
			},
		})
		if err != nil {
			return fmt.Errorf("add event handler: %w", err)
		}
		handlersSynced = append(handlersSynced, reg.HasSynced)
	}

	cpv := cf.Controlplane().V1alpha1()
	l.kinds = newReconcilers(c.cp, cpv)
	var synced []cache.InformerSynced
	for kind, r := range l.kinds {
		kind := kind
		inf := r.informer()
		if err := inf.SetTransform(stripManaged); err != nil {
			return fmt.Errorf("%s informer transform: %w", kind, err)
		}
		_, err := inf.AddEventHandler(cache.ResourceEventHandlerFuncs{
			AddFunc:    func(o any) { l.storedChanged(kind, o) },
			UpdateFunc: func(_, o any) { l.storedChanged(kind, o) },
			DeleteFunc: func(o any) {
				_, name := deletedKey(o)
				l.storedChanged(kind, name)
			},
		})
		if err != nil {
			return fmt.Errorf("add %s event handler: %w", kind, err)
		}
		synced = append(synced, inf.HasSynced)
	}
	synced = append(synced, handlersSynced...)

	c.mu.Lock()
	c.current = l
	c.mu.Unlock()

	start := time.Now()
	c.term.Store(&term{since: since})
	l.rmu.Lock()
	l.roundStart = start // the initial sync is the term's first round
	l.rmu.Unlock()
	for _, task := range c.leaderTasks {
		workers.Add(1)
		go func() {
			defer workers.Done()
			task(ctx)
		}()
	}
	kf.Start(ctx.Done())
	cf.Start(ctx.Done())
	if of != nil {
		of.Start(ctx.Done())
	}
	if !cache.WaitForCacheSync(ctx.Done(), synced...) {
		return fmt.Errorf("wait for informer caches: %w", ctx.Err())
	}
	// Every source object is in the model now, so its dirty set holds
	// every desired object; add everything stored, so stale objects get
	// deleted. Nothing is deleted and recreated: objects equal to what is
	// stored are left alone.
	l.mu.Lock()
	keys := l.model.TakeDirty()
	l.started = true
	l.mu.Unlock()
	seen := make(map[compute.Key]struct{}, len(keys))
	for _, k := range keys {
		seen[k] = struct{}{}
	}
	for kind, r := range l.kinds {
		for _, name := range r.storedNames() {
			k := compute.Key{Kind: kind, Name: name}
			if _, ok := seen[k]; !ok {
				keys = append(keys, k)
			}
		}
	}
	for _, k := range keys {
		l.enqueue(k, 0)
	}
	l.initialDone.Store(true)
	l.log.Info("policy controller synced", zap.Int("objects", len(keys)), zap.Duration("sync_duration", time.Since(start)))

	for i := 0; i < c.cfg.Workers; i++ {
		workers.Add(1)
		go func() {
			defer workers.Done()
			for l.work(ctx) {
			}
		}()
	}
	<-ctx.Done()
	return nil
}

// stripManaged drops managed fields of stored objects.
func stripManaged(obj any) (any, error) {
	if a, ok := obj.(metav1.Object); ok {
		a.SetManagedFields(nil)
	}
	return obj, nil
}

// storedChanged handles an informer event of a stored object: echoes of
// this term's own writes are ignored, anything else (an edit or deletion
// by someone else) is reconciled.
func (l *leading) storedChanged(kind compute.Kind, o any) {
	l.mu.RLock()
	started := l.started
	l.mu.RUnlock()
	if !started {
		return
	}
	var name string
	var obj metav1.Object
	switch v := o.(type) {
	case string:
		name = v
	case metav1.Object:
		name, obj = v.GetName(), v
	default:
		return
	}
	k := compute.Key{Kind: kind, Name: name}
	if obj != nil {
		l.smu.Lock()
		w := l.written[k]
		if w != nil {
			cmp := compareRV(obj.GetResourceVersion(), w.GetResourceVersion())
			if cmp <= 0 {
				if cmp == 0 {
					delete(l.written, k)
				}
				l.smu.Unlock()
				return // our own write, or older
			}
			delete(l.written, k)
		}
		l.smu.Unlock()
	}
	l.enqueue(k, l.c.cfg.WriteDelay)
}

// compareRV orders resource versions numerically (etcd revisions); it
// returns 1 when they cannot be parsed, so the event is not ignored.
func compareRV(a, b string) int {
	x, err1 := strconv.ParseUint(a, 10, 64)
	y, err2 := strconv.ParseUint(b, 10, 64)
	switch {
	case err1 != nil || err2 != nil:
		return 1
	case x < y:
		return -1
	case x > y:
		return 1
	}
	return 0
}

// work reconciles one key; false when the queue is shut down.
func (l *leading) work(ctx context.Context) bool {
	k, shutdown := l.queue.Get()
	if shutdown {
		return false
	}
	l.inflight.Add(1)
	l.smu.Lock()
	delete(l.scheduled, k)
	l.running[k] = struct{}{}
	l.smu.Unlock()
	defer func() {
		l.smu.Lock()
		delete(l.running, k)
		// Postponed (a deletion waiting, see deleteDue) or failed and
		// retried: scheduled again, and counted when it is done.
		_, again := l.scheduled[k]
		l.smu.Unlock()
		l.queue.Done(k)
		l.inflight.Add(-1)
		l.roundDone(!again)
	}()
	r := l.kinds[k.Kind]
	if r == nil {
		l.queue.Forget(k)
		return true
	}
	l.mu.RLock()
	desired, ok := l.model.Desired(k)
	l.mu.RUnlock()
	if err := r.reconcile(ctx, l, k, desired, ok); err != nil {
		if ctx.Err() != nil {
			return true
		}
		l.c.metrics.writeErrors.WithLabelValues(string(k.Kind)).Inc()
		if apierrors.IsForbidden(err) {
			// RBAC, or the manifest's admission policy (credentials
			// bound to no Node): retrying will not help until an
			// operator fixes it, so say so above Debug.
			l.log.Warn("write refused; retrying", zap.String("kind", string(k.Kind)),
				zap.String("name", k.Name), zap.Error(err))
		} else {
			l.log.Debug("reconcile failed; retrying", zap.String("kind", string(k.Kind)),
				zap.String("name", k.Name), zap.Error(err))
		}
		l.smu.Lock()
		l.scheduled[k] = struct{}{}
		l.smu.Unlock()
		l.queue.AddRateLimited(k)
		return true
	}
	l.queue.Forget(k)
	return true
}

// wrote records an object this term wrote.
func (l *leading) wrote(k compute.Key, o metav1.Object) {
	l.smu.Lock()
	l.written[k] = o
	l.smu.Unlock()
}

// deleted marks, in leading.written, an object this term deleted; rv is
// the resourceVersion it had.
type deleted struct {
	metav1.Object
	rv string
}

// wroteDelete records that this term deleted k at resourceVersion rv.
func (l *leading) wroteDelete(k compute.Key, rv string) {
	l.smu.Lock()
	l.written[k] = deleted{Object: &metav1.ObjectMeta{ResourceVersion: rv}, rv: rv}
	l.smu.Unlock()
}

// latest returns the newer of the cached object and the one this term
// last wrote.
func latest[T metav1.Object](l *leading, k compute.Key, cached T, found bool) (T, bool) {
	l.smu.Lock()
	w := l.written[k]
	l.smu.Unlock()
	if w == nil {
		return cached, found
	}
	if d, ok := w.(deleted); ok {
		// This term deleted the object: a cache that has not seen the
		// deletion yet must not make it look present.
		if !found || compareRV(cached.GetResourceVersion(), d.rv) <= 0 {
			var zero T
			return zero, false
		}
		return cached, found
	}
	wt, ok := w.(T)
	if !ok {
		return cached, found
	}
	if !found || compareRV(wt.GetResourceVersion(), cached.GetResourceVersion()) > 0 {
		return wt, true
	}
	return cached, found
}

// policyDeleteRecheck is how often a NetworkPolicy object's deletion
// looks again for writes it must let go first (see deleteDue).
const policyDeleteRecheck = 5 * time.Millisecond

// deleteDue reports whether an undesired object may be deleted now; if
// not, it schedules k for when it may.
//
// A group or PodRealization waits DeleteDelay, so that the policies still
// naming it are updated first. A NetworkPolicy object is named by nothing,
// and its deletion is what revokes the access it granted (its Kubernetes
// NetworkPolicy deleted, or left with no Pod to apply to), so it waits
// only for the writes of policies and groups already under way or
// scheduled: a policy replacing it (a rename, a new UID) and that one's
// groups are then stored before it goes, so no Pod it isolated is left
// unisolated in between; and never longer than DeleteDelay, so a busy
// controller cannot hold a revocation back for good.
func (l *leading) deleteDue(k compute.Key) bool {
	now := time.Now()
	if k.Kind == compute.KindNetworkPolicy {
		l.smu.Lock()
		first, ok := l.policyGone[k]
		if !ok {
			first = now
			l.policyGone[k] = now
		}
		wait := now.Before(first.Add(l.c.cfg.DeleteDelay)) && l.writesPendingLocked(k)
		if !wait {
			delete(l.policyGone, k)
		}
		l.smu.Unlock()
		if wait {
			l.enqueue(k, policyDeleteRecheck)
		}
		return !wait
	}
	l.smu.Lock()
	at, ok := l.deleteAt[k]
	if !ok {
		at = now.Add(l.c.cfg.DeleteDelay)
		l.deleteAt[k] = at
	}
	l.smu.Unlock()
	if now.Before(at) {
		l.enqueue(k, at.Sub(now))
		return false
	}
	l.smu.Lock()
	delete(l.deleteAt, k)
	l.smu.Unlock()
	return true
}

// writesPendingLocked reports whether a policy or group other than k is
// scheduled or being reconciled and is not itself waiting to be deleted
// (PodRealizations do not count: they decide no packet's fate). l.smu must
// be held.
func (l *leading) writesPendingLocked(k compute.Key) bool {
	pending := func(o compute.Key) bool {
		if o == k || o.Kind == compute.KindPodRealization {
			return false
		}
		_, deleting := l.deleteAt[o]
		_, gone := l.policyGone[o]
		return !deleting && !gone
	}
	for o := range l.scheduled {
		if pending(o) {
			return true
		}
	}
	for o := range l.running {
		if pending(o) {
			return true
		}
	}
	return false
}

// keepNow cancels a pending deletion of k (it is desired again).
func (l *leading) keepNow(k compute.Key) {
	l.smu.Lock()
	delete(l.deleteAt, k)
	delete(l.policyGone, k)
	l.smu.Unlock()
}

// roundDone ends the current round if the controller is idle now; done
// counts the object just worked on as reconciled.
func (l *leading) roundDone(done bool) {
	l.rmu.Lock()
	defer l.rmu.Unlock()
	if l.roundStart.IsZero() {
		return
	}
	if done {
		l.roundObjects++
	}
	if !l.idle() {
		return
	}
	now := time.Now()
	r := Round{FinishedAt: now, Duration: now.Sub(l.roundStart), Objects: l.roundObjects}
	l.roundStart, l.roundObjects = time.Time{}, 0
	l.c.metrics.round.Observe(r.Duration.Seconds())
	cur := l.c.term.Load()
	if cur == nil {
		return
	}
	t := *cur
	if t.initialSync == 0 {
		t.initialSync = r.Duration
	}
	t.last = &r
	l.c.term.Store(&t)
}
