// Package agent is the per-Node NetworkPolicy agent: it watches the
// computed policy objects of its Node (controlplane.seine.io v1alpha1
// NetworkPolicy, AppliedToGroup, AddressGroup, PodRealization, filtered by
// the Node's span label), translates them with policy/flows for the Pods
// attached to this Node's bridge, installs the flows through a
// flowsync.Syncer, tells the CNI backend when a Pod's policies are in
// place (WaitRealized), and tells the owner of the Pods' flows which Pods
// are isolated (Config.OnIsolation): the default deny of an isolated Pod
// is a register bit its own flows load (pipeline.Pod), dropped by one fixed
// flow per direction (pipeline.PolicyBaseFlows).
//
// Reconciliation is debounced and incremental: an event marks the policies
// it concerns dirty, and only those are translated again; flowsync sends
// only the flow entries that differ. The informers keep their cache when
// the API server goes away, so the agent keeps enforcing (and serving
// WaitRealized from) the last known state, and resume their watches from
// the last resourceVersion when it comes back.
package agent

import (
	"context"
	"errors"
	"fmt"
	"net"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"go.uber.org/zap"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/util/workqueue"

	"github.com/seine-net/seine/datapath/flowsync"
	of "github.com/seine-net/seine/datapath/openflow"
	"github.com/seine-net/seine/datapath/pipeline"
	"github.com/seine-net/seine/policy/apis/controlplane/v1alpha1"
	"github.com/seine-net/seine/policy/client/clientset/versioned"
	"github.com/seine-net/seine/policy/client/informers"
	"github.com/seine-net/seine/policy/flows"
	"github.com/seine-net/seine/policy/realization"
)

// Defaults of Config.
const (
	DefaultRealizeTimeout = 10 * time.Second
	DefaultDebounce       = 20 * time.Millisecond
	retryMin              = 200 * time.Millisecond
	retryMax              = 10 * time.Second
)

// Informer index names.
const (
	idxGroup  = "group"  // AppliedToGroup/AddressGroup → group key label
	idxMember = "member" // AppliedToGroup → "namespace/name" of members
	idxATG    = "atg"    // NetworkPolicy → its AppliedToGroup key
	idxAG     = "ag"     // NetworkPolicy → AddressGroup keys of its rules
)

// LocalPod is a Pod whose port exists on this Node's bridge.
type LocalPod struct {
	Namespace, Name string
	OFPort          uint32
	IP              net.IP
	// Restored marks a Pod found attached at start-up, whose flows may
	// carry the isolation of the previous run: its isolation is applied
	// at the first reconcile whatever it is.
	Restored bool
}

// Config configures an Agent.
type Config struct {
	// NodeName is this Node's name; the agent only sees objects labelled
	// v1alpha1.SpanLabel(NodeName).
	NodeName string
	// Bridge describes the integration bridge (round, gateway, Node IP)
	// for cookies and pipeline.PolicyBaseFlows.
	Bridge pipeline.Bridge
	// Flows installs the flows; the agent uses the owners "policy/...".
	Flows *flowsync.Syncer
	// RealizeTimeout bounds WaitRealized; default 10s.
	RealizeTimeout time.Duration
	// Debounce is how long the agent collects events before reconciling;
	// default 20ms.
	Debounce time.Duration
	// OnIsolation, when set, is told the isolation of an attached Pod
	// whenever it changes: ingress (egress) is true when some installed
	// policy selecting the Pod lists Ingress (Egress) in its policyTypes
	// (networking.k8s.io/v1). The owner of the Pod's flows applies it
	// (pipeline.Pod IngressIsolated / EgressIsolated). A freshly attached
	// Pod is taken to be isolated for neither direction, so it is called
	// for a Pod only once the Pod needs isolating.
	//
	// The agent calls it from its reconciler, concurrently for different
	// Pods (never twice at once for one Pod; at most isolationWorkers at
	// a time), after the flows of the policies that changed the isolation
	// are installed (a Pod is never isolated before its allow rules are in
	// place) and before WaitRealized reports the Pod realized. An error is
	// retried with backoff, and WaitRealized keeps failing for that Pod
	// meanwhile. ctx is the reconciler's. It must not call back into the
	// Agent.
	OnIsolation func(ctx context.Context, namespace, name string, ingress, egress bool) error
	// AfterChange, when set, runs after every reconcile that had work,
	// once its flows and isolation changes are installed; WaitRealized
	// reports no Pod realized until it has returned (the daemon purges
	// the switch's cached datapath flows here, see datapath/ovsctl). Its
	// error is logged, not retried.
	AfterChange func(ctx context.Context) error
	// QueueMetrics, when set, receives the metrics of the workqueue
	// (named "policy-agent"), and with them its stuck items (health.QueueMetrics).
	QueueMetrics workqueue.MetricsProvider
}

// isolation is the isolation of one Pod: the directions some policy
// selecting it isolates it for.
type isolation struct{ ingress, egress bool }

// appliedIsolation is what OnIsolation last applied for one attachment of
// a Pod (gen identifies the attachment, see Agent.gen).
type appliedIsolation struct {
	gen uint64
	iso isolation
	// unknown: a call meant for an earlier attachment may have reached
	// this one, so the next reconcile applies the isolation whatever it is.
	unknown bool
}

// installed is what the agent last installed for one policy.
type installed struct {
	digest  realization.Policy
	targets map[string]bool // "namespace/name" of the local target Pods
	conj    []flows.ConjKey
	iso     isolation // the directions the policy isolates its targets for
	// For operators (View): the source generation, the cookie and
	// conjunction IDs of the policy's flows, and their number.
	generation int64
	cookie     uint64
	conjIDs    []uint32
	flows      int
}

// Agent enforces the NetworkPolicies of one Node. Create it with New,
// start it with Run; PodAttached, PodDetached, WaitRealized and Synced are
// safe for concurrent use.
type Agent struct {
	cp  versioned.Interface
	cfg Config
	log *zap.Logger

	// queue holds one key, reconcileKey, while a reconcile is due:
	// events add it after Debounce (a burst becomes one reconcile), a
	// failed reconcile adds it back rate limited (retryMin doubling up
	// to retryMax).
	queue workqueue.TypedRateLimitingInterface[string]

	mu    sync.Mutex
	pods  map[string]flows.Pod // "namespace/name" → attached Pod
	dirty map[string]bool      // policy names to translate again
	// dirtySince is when each dirty policy first became dirty (the
	// realization latency metric runs from there).
	dirtySince map[string]time.Time
	done       map[string]*installed
	changed    chan struct{} // closed and replaced whenever done or PodRealization changes
	informed   bool          // informers are set up (the fields below are valid)
	lastErr    error
	// awaiting holds the policies whose translation waits for this
	// Node's part of their AppliedToGroup: the agent is not synced while
	// any does, since their flows are not in.
	awaiting map[string]awaitedGroup
	// purging is set while a reconcile's AfterChange has not run yet:
	// done already names its flows, but packets may still take datapath
	// flows cached before them, so no Pod counts as realized.
	purging bool

	// Isolation state. gen numbers each attachment of a Pod (from
	// attachSeq) so that a Pod detached and attached again starts from
	// "not isolated" whatever its earlier attachment had; applied is
	// what OnIsolation applied per Pod; pending holds the Pods whose
	// isolation change is being applied or failed (WaitRealized fails for
	// them).
	attachSeq uint64
	gen       map[string]uint64
	applied   map[string]appliedIsolation
	pending   map[string]bool
	// isoCheck makes the next reconcile compare every Pod's isolation
	// with its policies even when no policy is dirty: a Pod attached as
	// restored carries flows whose isolation nothing has checked yet.
	isoCheck bool

	npInf, atgInf, agInf, prInf cache.SharedIndexInformer

	// Reconciler-only state (one goroutine).
	state   *flowState
	conjIDs *flows.ConjIDs
	cookies *flows.Allocator[string]
	// isoRetry makes the next reconcile apply isolation changes even when
	// no policy is dirty (an OnIsolation call failed).
	isoRetry bool

	synced atomic.Bool
	// waitLogged: the reconciler said once that Synced waits for
	// AppliedToGroups.
	waitLogged bool
	metrics    *metrics
}

// awaitedGroup is the AppliedToGroup a policy waits for, and since when.
type awaitedGroup struct {
	group string
	since time.Time
}

// New returns an agent that reads the computed policy objects with cp and
// installs flows through cfg.Flows.
func New(cp versioned.Interface, cfg Config, log *zap.Logger) *Agent {
	if cfg.RealizeTimeout <= 0 {
		cfg.RealizeTimeout = DefaultRealizeTimeout
	}
	if cfg.Debounce <= 0 {
		cfg.Debounce = DefaultDebounce
	}
	return &Agent{
		cp: cp, cfg: cfg, log: log.With(zap.String("node", cfg.NodeName)),
		queue: workqueue.NewTypedRateLimitingQueueWithConfig(
			workqueue.NewTypedItemExponentialFailureRateLimiter[string](retryMin, retryMax),
			workqueue.TypedRateLimitingQueueConfig[string]{Name: "policy-agent", MetricsProvider: cfg.QueueMetrics}),
		pods:  map[string]flows.Pod{},
		dirty: map[string]bool{},
		done:  map[string]*installed{},

		dirtySince: map[string]time.Time{},
		changed:    make(chan struct{}),
		gen:        map[string]uint64{},
		applied:    map[string]appliedIsolation{},
		pending:    map[string]bool{},
		awaiting:   map[string]awaitedGroup{},
		state:      newFlowState(cfg.Flows),
		conjIDs:    flows.NewConjIDs(pipeline.ConjBandSize, pipeline.ConjBands),
		cookies:    flows.NewAllocator[string](1<<32 - 1),
		metrics:    newMetrics(),
	}
}

// Synced reports whether the caches have synced and the policy state they
// held is installed: every policy translated, none waiting for its
// AppliedToGroup. At a restart the daemon removes the previous run's
// flows only then (or after its own deadline), so a policy whose group
// is still on its way keeps the allows it had.
func (a *Agent) Synced() bool { return a.synced.Load() }

// reconcileKey is the queue's only key: every reconcile covers all
// dirty policies.
const reconcileKey = "reconcile"

// signal schedules a reconcile after the debounce delay (the earliest
// pending one stands).
func (a *Agent) signal() { a.queue.AddAfter(reconcileKey, a.cfg.Debounce) }

// notifyLocked wakes WaitRealized callers; a.mu must be held.
func (a *Agent) notifyLocked() {
	close(a.changed)
	a.changed = make(chan struct{})
}

// PodAttached records a Pod whose port now exists on the bridge and
// schedules the policies that select it.
func (a *Agent) PodAttached(p LocalPod) {
	key := p.Namespace + "/" + p.Name
	a.mu.Lock()
	a.pods[key] = flows.Pod{Namespace: p.Namespace, Name: p.Name, OFPort: p.OFPort, IP: p.IP}
	a.attachSeq++
	a.gen[key] = a.attachSeq
	delete(a.applied, key)
	delete(a.pending, key)
	if p.Restored {
		a.applied[key] = appliedIsolation{gen: a.attachSeq, unknown: true}
		a.isoCheck = true
	}
	// A Pod attached again under the same name has none of its policies'
	// flows (nor its isolation) yet: until they are translated for the
	// new attachment, WaitRealized must not count them as installed.
	for n, d := range a.done {
		if d.targets[key] {
			delete(d.targets, key)
			a.markDirtyLocked(n)
		}
	}
	a.markPodLocked(key)
	a.mu.Unlock()
	a.signal()
}

// PodDetached forgets a Pod (and its isolation: OnIsolation is not called
// for it) and removes it from the flows of the policies that selected it.
func (a *Agent) PodDetached(namespace, name string) {
	key := namespace + "/" + name
	a.mu.Lock()
	delete(a.pods, key)
	delete(a.gen, key)
	delete(a.applied, key)
	delete(a.pending, key)
	a.markPodLocked(key)
	for n, d := range a.done {
		if d.targets[key] {
			a.markDirtyLocked(n)
		}
	}
	a.mu.Unlock()
	a.signal()
}

// markPodLocked marks dirty the policies whose AppliedToGroup lists the Pod.
func (a *Agent) markPodLocked(podKey string) {
	if !a.informed {
		return
	}
	objs, _ := a.atgInf.GetIndexer().ByIndex(idxMember, podKey)
	for _, o := range objs {
		a.markGroupLocked(idxATG, o)
	}
}

// markGroupLocked marks dirty the policies referencing the group of obj
// (an AppliedToGroup or AddressGroup) through the policy index idx.
func (a *Agent) markGroupLocked(idx string, obj any) {
	m, err := meta(obj)
	if err != nil {
		return
	}
	g := m.GetLabels()[v1alpha1.GroupLabel]
	if g == "" {
		return
	}
	nps, _ := a.npInf.GetIndexer().ByIndex(idx, g)
	for _, o := range nps {
		if np, ok := o.(*v1alpha1.NetworkPolicy); ok {
			a.markDirtyLocked(np.Name)
		}
	}
}

func meta(obj any) (metav1.Object, error) {
	if d, ok := obj.(cache.DeletedFinalStateUnknown); ok {
		obj = d.Obj
	}
	m, ok := obj.(metav1.Object)
	if !ok {
		return nil, fmt.Errorf("unexpected object %T", obj)
	}
	return m, nil
}

func handler(fn func(obj any)) cache.ResourceEventHandlerFuncs {
	return cache.ResourceEventHandlerFuncs{
		AddFunc:    fn,
		UpdateFunc: func(old, obj any) { fn(old); fn(obj) },
		DeleteFunc: fn,
	}
}

func groupIndex(obj any) ([]string, error) {
	m, err := meta(obj)
	if err != nil {
		return nil, err
	}
	if g := m.GetLabels()[v1alpha1.GroupLabel]; g != "" {
		return []string{g}, nil
	}
	return nil, nil
}

// Run watches the Node's policy objects and keeps the flows in line with
// them until ctx ends. It installs pipeline.PolicyBaseFlows first and
// returns an error only when that fails, when the informers cannot be set
// up, or when ctx ends before the caches sync.
// Reconciles come from a rate-limited workqueue (client-go's
// util/workqueue) holding the single key reconcileKey; it is shut down
// when Run returns.
func (a *Agent) Run(ctx context.Context) error {
	defer a.queue.ShutDown()
	if err := a.cfg.Flows.Set(ctx, ownerBase, pipeline.PolicyBaseFlows(a.cfg.Bridge)); err != nil {
		return fmt.Errorf("installing the policy base flows: %w", err)
	}
	sel := v1alpha1.SpanLabel(a.cfg.NodeName)
	f := informers.NewSharedInformerFactoryWithOptions(a.cp, 0,
		informers.WithTweakListOptions(func(o *metav1.ListOptions) { o.LabelSelector = sel }))
	cpi := f.Controlplane().V1alpha1()
	npInf := cpi.NetworkPolicies().Informer()
	atgInf := cpi.AppliedToGroups().Informer()
	agInf := cpi.AddressGroups().Informer()
	prInf := cpi.PodRealizations().Informer()
	errs := []error{
		npInf.AddIndexers(cache.Indexers{
			idxATG: func(obj any) ([]string, error) {
				return []string{obj.(*v1alpha1.NetworkPolicy).Spec.AppliedToGroup}, nil
			},
			idxAG: func(obj any) ([]string, error) {
				var out []string
				for _, r := range obj.(*v1alpha1.NetworkPolicy).Spec.Rules {
					out = append(out, r.AddressGroups...)
				}
				return out, nil
			},
		}),
		atgInf.AddIndexers(cache.Indexers{
			idxGroup: groupIndex,
			idxMember: func(obj any) ([]string, error) {
				var out []string
				for _, m := range obj.(*v1alpha1.AppliedToGroup).Spec.Members {
					out = append(out, m.Namespace+"/"+m.Name)
				}
				return out, nil
			},
		}),
		agInf.AddIndexers(cache.Indexers{idxGroup: groupIndex}),
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("informer indexers: %w", err)
	}
	a.mu.Lock()
	a.npInf, a.atgInf, a.agInf, a.prInf = npInf, atgInf, agInf, prInf
	a.informed = true
	a.mu.Unlock()

	mark := func(fn func(obj any)) cache.ResourceEventHandlerFuncs {
		return handler(func(obj any) {
			a.mu.Lock()
			fn(obj)
			a.mu.Unlock()
			a.signal()
		})
	}
	_, e1 := npInf.AddEventHandler(mark(func(obj any) {
		if m, err := meta(obj); err == nil {
			a.markDirtyLocked(m.GetName())
		}
	}))
	_, e2 := atgInf.AddEventHandler(mark(func(obj any) { a.markGroupLocked(idxATG, obj) }))
	_, e3 := agInf.AddEventHandler(mark(func(obj any) { a.markGroupLocked(idxAG, obj) }))
	_, e4 := prInf.AddEventHandler(handler(func(any) {
		a.mu.Lock()
		a.notifyLocked()
		a.mu.Unlock()
	}))
	if err := errors.Join(e1, e2, e3, e4); err != nil {
		return fmt.Errorf("informer handlers: %w", err)
	}
	f.Start(ctx.Done())
	defer f.Shutdown()
	for typ, ok := range f.WaitForCacheSync(ctx.Done()) {
		if !ok {
			return fmt.Errorf("waiting for the %v cache: %w", typ, ctx.Err())
		}
	}
	a.log.Info("policy caches synced", zap.Int("policies", len(npInf.GetStore().ListKeys())))
	a.mu.Lock()
	for _, k := range npInf.GetStore().ListKeys() {
		a.markDirtyLocked(k)
	}
	a.mu.Unlock()

	go func() { <-ctx.Done(); a.queue.ShutDown() }()
	a.queue.Add(reconcileKey)
	for a.processNext(ctx) {
	}
	return nil
}

// processNext runs one reconcile when the queue hands out its key; false
// once the queue has shut down (ctx ended).
func (a *Agent) processNext(ctx context.Context) bool {
	key, quit := a.queue.Get()
	if quit {
		return false
	}
	defer a.queue.Done(key)
	if err := a.reconcile(ctx); err != nil {
		if ctx.Err() != nil {
			return false
		}
		a.queue.AddRateLimited(key)
		a.log.Warn("installing policy flows failed; retrying", zap.Error(err),
			zap.Int("attempt", a.queue.NumRequeues(key)))
		return true
	}
	a.queue.Forget(key)
	if !a.synced.Load() {
		a.mu.Lock()
		waiting := len(a.awaiting)
		a.mu.Unlock()
		if waiting > 0 {
			// The group's arrival marks its policy dirty, and the
			// reconcile it brings lands here again.
			if !a.waitLogged {
				a.waitLogged = true
				a.log.Info("policy flows installed; not synced while policies wait for their AppliedToGroups",
					zap.Int("waiting", waiting))
			}
			return true
		}
		a.synced.Store(true)
		a.log.Info("policy flows synced", zap.Int("flows", a.state.count()))
	}
	return true
}

// source is the flows.Source over the informer caches and attached Pods.
type source struct {
	node     string
	atg, ag  cache.Indexer
	pods     map[string]flows.Pod
	agSlices map[string]int // group key → slices seen, filled by AddressGroup
}

func (s *source) AppliedTo(g string) []v1alpha1.GroupMember {
	objs, _ := s.atg.ByIndex(idxGroup, g)
	var out []v1alpha1.GroupMember
	for _, o := range objs {
		atg := o.(*v1alpha1.AppliedToGroup)
		if atg.Spec.NodeName == s.node {
			out = append(out, atg.Spec.Members...)
		}
	}
	return out
}

// hasAppliedTo reports whether this Node's part of the target group g
// has arrived.
func (s *source) hasAppliedTo(g string) bool {
	objs, _ := s.atg.ByIndex(idxGroup, g)
	for _, o := range objs {
		if o.(*v1alpha1.AppliedToGroup).Spec.NodeName == s.node {
			return true
		}
	}
	return false
}

func (s *source) AddressGroup(g string) []v1alpha1.GroupMember {
	objs, _ := s.ag.ByIndex(idxGroup, g)
	var out []v1alpha1.GroupMember
	for _, o := range objs {
		out = append(out, o.(*v1alpha1.AddressGroup).Spec.Members...)
	}
	return out
}

func (s *source) slices(g string) int {
	objs, _ := s.ag.ByIndex(idxGroup, g)
	return len(objs)
}

func (s *source) LocalPod(ns, name string) (flows.Pod, bool) {
	p, ok := s.pods[ns+"/"+name]
	return p, ok
}

// reconcile translates the dirty policies, installs the result, then
// applies the isolation changes it causes (applyIsolation).
func (a *Agent) reconcile(ctx context.Context) error {
	a.mu.Lock()
	dirty := a.dirty
	a.dirty = map[string]bool{}
	since := make(map[string]time.Time, len(dirty))
	for name := range dirty {
		since[name] = a.dirtySince[name]
		delete(a.dirtySince, name)
	}
	pods := make(map[string]flows.Pod, len(a.pods))
	gens := make(map[string]uint64, len(a.pods))
	for k, p := range a.pods {
		pods[k] = p
		gens[k] = a.gen[k]
	}
	isoCheck := a.isoCheck
	a.isoCheck = false
	a.mu.Unlock()
	if len(dirty) == 0 && !a.isoRetry && !isoCheck {
		return nil
	}
	src := &source{node: a.cfg.NodeName, atg: a.atgInf.GetIndexer(), ag: a.agInf.GetIndexer(), pods: pods}
	waits := map[string]string{} // dirty policies skipped for their group
	want := map[string][]of.Flow{}
	next := map[string]*installed{}
	for name := range dirty {
		obj, exists, err := a.npInf.GetStore().GetByKey(name)
		if err != nil || !exists {
			want[name] = nil
			next[name] = nil
			continue
		}
		np := obj.(*v1alpha1.NetworkPolicy)
		if !src.hasAppliedTo(np.Spec.AppliedToGroup) {
			waits[name] = np.Spec.AppliedToGroup
			// A policy spans the Nodes where its target group has
			// members, so this Node's part of the group exists; it
			// has not arrived yet (the controller writes the two
			// concurrently, e.g. after a podSelector edit). Until it
			// does, the policy keeps what is installed: read as an
			// empty group, it would release its Pods' isolation in
			// between. The group's arrival marks the policy dirty.
			a.log.Debug("policy waits for its AppliedToGroup", zap.String("policy", name),
				zap.String("group", np.Spec.AppliedToGroup))
			continue
		}
		id, ok := a.cookies.Get(name)
		if !ok {
			a.log.Error("no cookie ID left for policy", zap.String("policy", name))
			continue
		}
		cookie := pipeline.Cookie(a.cfg.Bridge.Round, pipeline.CategoryPolicy, uint64(id))
		tr := flows.Translate(np, cookie, src, a.conjIDs)
		for _, w := range tr.Warnings {
			a.log.Warn("policy rule partly ignored", zap.String("policy", name), zap.String("reason", w))
		}
		want[name] = tr.Flows
		inst := &installed{targets: map[string]bool{}, conj: tr.Conj, iso: isolation{ingress: tr.Ingress, egress: tr.Egress},
			digest:     realization.Policy{Name: np.Name, SpecHash: realization.SpecHash(np.Spec), AddressGroupSlices: map[string]int{}},
			generation: np.Spec.Source.Generation, cookie: cookie, flows: len(tr.Flows)}
		for _, k := range tr.Conj {
			if id, ok := a.conjIDs.Lookup(k); ok {
				inst.conjIDs = append(inst.conjIDs, id)
			}
		}
		for _, t := range tr.Targets {
			inst.targets[t.Key()] = true
		}
		for _, r := range np.Spec.Rules {
			for _, g := range r.AddressGroups {
				inst.digest.AddressGroupSlices[g] = src.slices(g)
			}
		}
		next[name] = inst
	}
	ok, err := a.state.update(ctx, want)
	a.mu.Lock()
	waitStart := time.Now()
	for name := range dirty {
		g, w := waits[name]
		switch was, waited := a.awaiting[name]; {
		case !w:
			delete(a.awaiting, name)
		case !waited || was.group != g:
			a.awaiting[name] = awaitedGroup{group: g, since: waitStart}
		}
	}
	var realized []time.Time
	for name, inst := range next {
		if !ok[name] {
			a.markDirtyAtLocked(name, since[name])
			continue
		}
		if t := since[name]; !t.IsZero() {
			realized = append(realized, t)
		}
		if inst == nil {
			delete(a.done, name)
			a.cookies.Release(name)
		} else {
			// A target attached again (or detached) since the snapshot
			// is not covered by these flows; the event made the policy
			// dirty, and the next round covers it.
			for k := range inst.targets {
				if a.gen[k] != gens[k] {
					delete(inst.targets, k)
					a.markDirtyLocked(name)
				}
			}
			a.done[name] = inst
		}
		// Conjunction IDs no longer used are freed once their flows are
		// gone from the switch: the old translation's, and those of a
		// translation whose update failed and never came back.
		var keep []flows.ConjKey
		if inst != nil {
			keep = inst.conj
		}
		a.conjIDs.Keep(name, keep)
	}
	changes := a.isolationChangesLocked()
	a.lastErr = err
	a.purging = a.cfg.AfterChange != nil
	a.mu.Unlock()
	// Pods whose isolation changes are pending in WaitRealized until
	// applyIsolation is done with them.
	isoErr := a.applyIsolation(ctx, changes)
	if a.cfg.AfterChange != nil {
		if perr := a.cfg.AfterChange(ctx); perr != nil {
			a.log.Warn("after-change hook failed", zap.Error(perr))
		}
	}
	a.mu.Lock()
	a.purging = false
	if isoErr != nil {
		a.lastErr = errors.Join(err, isoErr)
	}
	a.notifyLocked()
	a.mu.Unlock()
	now := time.Now()
	for _, t := range realized {
		a.metrics.realization.Observe(now.Sub(t).Seconds())
	}
	if err := errors.Join(err, isoErr); err != nil {
		return err
	}
	a.log.Debug("policy flows installed", zap.Int("policies", len(next)), zap.Int("flows", a.state.count()))
	return nil
}

// isoChange is an isolation to apply to one attachment of a Pod.
type isoChange struct {
	key, namespace, name string
	gen                  uint64
	iso                  isolation
}

// isolationChangesLocked computes, from the installed policies, every
// attached Pod's isolation and returns those that differ from what
// OnIsolation last applied to the Pod's current attachment (a new
// attachment counts as not isolated), marking them pending. a.mu must be
// held.
func (a *Agent) isolationChangesLocked() []isoChange {
	if a.cfg.OnIsolation == nil {
		return nil
	}
	want := map[string]isolation{}
	for _, d := range a.done {
		if !d.iso.ingress && !d.iso.egress {
			continue
		}
		for k := range d.targets {
			if _, attached := a.pods[k]; !attached {
				continue
			}
			w := want[k]
			w.ingress = w.ingress || d.iso.ingress
			w.egress = w.egress || d.iso.egress
			want[k] = w
		}
	}
	var out []isoChange
	for k, p := range a.pods {
		gen := a.gen[k]
		have, unknown := isolation{}, false
		if ap, ok := a.applied[k]; ok && ap.gen == gen {
			have, unknown = ap.iso, ap.unknown
		}
		if want[k] == have && !unknown {
			a.applied[k] = appliedIsolation{gen: gen, iso: have}
			delete(a.pending, k)
			continue
		}
		a.pending[k] = true
		out = append(out, isoChange{key: k, namespace: p.Namespace, name: p.Name, gen: gen, iso: want[k]})
	}
	sort.Slice(out, func(i, j int) bool { return out[i].key < out[j].key })
	return out
}

// isolationWorkers bounds the OnIsolation calls in flight: enough for a
// burst of Pods to share the switch round trips of their flow changes.
const isolationWorkers = 64

// applyIsolation calls OnIsolation for each change, concurrently and
// without a.mu held, and records the results for the attachments that are
// still current. A failure leaves the Pod pending and makes the next
// reconcile try again.
func (a *Agent) applyIsolation(ctx context.Context, changes []isoChange) error {
	a.isoRetry = false
	results := make([]error, len(changes))
	sem := make(chan struct{}, isolationWorkers)
	var wg sync.WaitGroup
	for i, c := range changes {
		wg.Add(1)
		sem <- struct{}{}
		go func() {
			defer wg.Done()
			defer func() { <-sem }()
			results[i] = a.cfg.OnIsolation(ctx, c.namespace, c.name, c.iso.ingress, c.iso.egress)
		}()
	}
	wg.Wait()
	var errs []error
	for i, c := range changes {
		err := results[i]
		a.mu.Lock()
		current := a.gen[c.key] == c.gen
		switch {
		case err != nil:
			a.isoRetry = true
			errs = append(errs, fmt.Errorf("isolating pod %s (ingress %v, egress %v): %w", c.key, c.iso.ingress, c.iso.egress, err))
		case current:
			a.applied[c.key] = appliedIsolation{gen: c.gen, iso: c.iso}
			delete(a.pending, c.key)
		default:
			// The Pod was attached again during the call, which the
			// backend may have applied to the new attachment.
			if gen, ok := a.gen[c.key]; ok {
				a.applied[c.key] = appliedIsolation{gen: gen, unknown: true}
				a.isoRetry = true
				a.signal()
			}
		}
		a.mu.Unlock()
		if err == nil {
			a.log.Debug("pod isolation applied", zap.String("pod", c.key),
				zap.Bool("ingress", c.iso.ingress), zap.Bool("egress", c.iso.egress))
		}
	}
	return errors.Join(errs...)
}

// installedDigestLocked computes the digest of the policy state installed
// for a Pod and names the policies in it.
func (a *Agent) installedDigestLocked(podKey string) (string, []string) {
	var ps []realization.Policy
	var names []string
	for _, d := range a.done {
		if d.targets[podKey] {
			ps = append(ps, d.digest)
			names = append(names, d.digest.Name)
		}
	}
	sort.Strings(names)
	return realization.Digest(ps), names
}

// recordedDigest returns the digest the controller recorded for recKey in
// prs, this Node's PodRealizations (one object, or slices of it). While
// the controller moves Pods between slices a Pod may be in none of them,
// or in two; two that disagree are an error until the move is done.
func recordedDigest(prs []any, recKey string) (string, error) {
	want, where := "", ""
	for _, o := range prs {
		pr := o.(*v1alpha1.PodRealization)
		d, ok := pr.Spec.Pods[recKey]
		switch {
		case !ok:
		case where == "":
			want, where = d, pr.Name
		case d != want:
			return "", fmt.Errorf("PodRealizations %s and %s record different digests for pod %s (the controller is moving it between slices)",
				where, pr.Name, recKey)
		}
	}
	if where == "" {
		return "", fmt.Errorf("the controller has not recorded pod %s in a PodRealization of this Node (%d stored)", recKey, len(prs))
	}
	return want, nil
}

// WaitRealized blocks until the flows of the Pod's current policy state are
// installed: the digest of the installed policies selecting the Pod
// (realization.Digest) equals the one the controller recorded for
// realization.PodKey(namespace, name, uid) in this Node's PodRealization
// (or in one of its slices: see v1alpha1.PodRealization). It returns an
// error naming the cause when ctx ends or RealizeTimeout passes first.
func (a *Agent) WaitRealized(ctx context.Context, namespace, name, uid string) error {
	ctx, cancel := context.WithTimeout(ctx, a.cfg.RealizeTimeout)
	defer cancel()
	podKey := namespace + "/" + name
	recKey := realization.PodKey(namespace, name, uid)
	for {
		a.mu.Lock()
		ch := a.changed
		var cause error
		if !a.informed {
			cause = errors.New("the policy agent has not started watching yet")
		} else {
			want, recErr := recordedDigest(a.prInf.GetStore().List(), recKey)
			have, names := a.installedDigestLocked(podKey)
			switch {
			case recErr != nil:
				cause = recErr
			case want == have && a.pending[podKey]:
				cause = fmt.Errorf("the isolation of pod %s is not applied yet", podKey)
				if a.lastErr != nil {
					cause = fmt.Errorf("%w; last error: %w", cause, a.lastErr)
				}
			case want == have && a.purging:
				cause = errors.New("the switch's cached datapath flows are not purged yet")
			case want == have:
				a.mu.Unlock()
				return nil
			default:
				cause = fmt.Errorf("installed policy state %s (policies [%s]) differs from the controller's %s",
					have, strings.Join(names, " "), want)
				if a.lastErr != nil {
					cause = fmt.Errorf("%w; last flow installation failed: %w", cause, a.lastErr)
				}
			}
		}
		a.mu.Unlock()
		select {
		case <-ch:
		case <-ctx.Done():
			return fmt.Errorf("policies of pod %s not realized: %w (%w)", podKey, cause, ctx.Err())
		}
	}
}
