// Package proxy is Seine's Service proxy: it watches Services and
// EndpointSlices and programs each Service port into the integration
// bridge as a select group plus conntrack DNAT (see datapath/pipeline's
// service.go for the tables), so that no kube-proxy is needed for
// ClusterIP traffic from Pods. One Service change touches only the flows
// (flowsync owner per Service port) and groups of that Service.
package proxy

import (
	"context"
	"errors"
	"fmt"
	"net"
	"slices"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	corelisters "k8s.io/client-go/listers/core/v1"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/util/workqueue"

	"github.com/seine-net/seine/datapath/flowsync"
	of "github.com/seine-net/seine/datapath/openflow"
	"github.com/seine-net/seine/datapath/ovsctl"
	"github.com/seine-net/seine/datapath/pipeline"
)

// Flows is the part of flowsync.Syncer the proxy uses.
type Flows interface {
	Set(ctx context.Context, owner string, flows []of.Flow) error
	SetMany(ctx context.Context, updates []flowsync.Update) error
}

// Switch is the part of the OpenFlow client the proxy uses.
type Switch interface {
	ApplyGroups(ctx context.Context, mods []of.GroupMod) error
	DeleteMatching(ctx context.Context, cookie, mask uint64) error
	DumpFlows(ctx context.Context, table *uint8, cookie, cookieMask uint64) ([]of.FlowStats, error)
	GroupIDs(ctx context.Context) ([]uint32, error)
}

// Config configures a Proxier.
type Config struct {
	NodeName string
	Bridge   pipeline.Bridge
	// SkipServices lists "namespace/name" of Services to leave alone.
	SkipServices []string
	// ProxyAll also programs NodePorts, externalIPs and LoadBalancer
	// ingress IPs, and routes the ClusterIP range from the host into the
	// bridge, so that no kube-proxy is needed.
	ProxyAll bool
	// Gateway is the gateway interface (host routes, neighbour entry).
	Gateway string
	// ServiceCIDR is the ClusterIP range (routed to Gateway with ProxyAll).
	ServiceCIDR *net.IPNet
	// NodePortAddresses are the CIDRs of the local addresses that accept
	// NodePort traffic (ProxyAll only).
	NodePortAddresses []*net.IPNet
	// LocalVIPAliases is the range of the aliases of externalIPs and
	// LoadBalancer IPs that are local addresses of the Node (ProxyAll
	// only; pipeline.DefaultLocalVIPAliasCIDR when nil).
	LocalVIPAliases *net.IPNet
	// RouteSource, when set, is the preferred source address of the host
	// routes into the gateway (ProxyAll only): the Node IP when the
	// gateway has no address of its own (networkPolicyOnly).
	RouteSource net.IP
	// Registry, when set, receives the proxy's metrics (see metrics.go).
	Registry prometheus.Registerer
	// QueueMetrics, when set, receives the metrics of the workqueue
	// (named "proxy"), and with them its stuck items (health.QueueMetrics).
	QueueMetrics workqueue.MetricsProvider
	// HealthAddress, when set (ProxyAll only), serves kube-proxy's health
	// check there (host:port, kube-proxy's is 0.0.0.0:10256): /healthz
	// and /livez, see syncHealth.
	HealthAddress string
	// HealthTimeout is how long a change may wait to be programmed before
	// the health check fails; default DefaultHealthTimeout.
	HealthTimeout time.Duration
	// Conntrack, when set, removes the UDP and SCTP connections that a
	// change left pointing at an endpoint no longer behind their VIP (see
	// conntrack.go).
	Conntrack Conntrack
	// ReflushDelay, when positive, flushes what a batch flushed once more
	// that long after, where still stale (DefaultReflushDelay; 0: once).
	ReflushDelay time.Duration
	// MinPurgeInterval is the shortest time from the end of one purge of
	// the datapath flows (and the flushes behind it) to the next; flushes
	// that come sooner wait and share one purge (DefaultMinPurgeInterval;
	// 0: a batch's flushes wait only for a run under way).
	MinPurgeInterval time.Duration
}

// Conntrack is the part of ovsctl.Client the proxy uses.
type Conntrack interface {
	FlushConntrack(ctx context.Context, zone uint16, orig, reply ovsctl.CTTuple) error
	DumpConntrack(ctx context.Context, zone uint16) ([]ovsctl.CTEntry, error)
	PurgeDatapathFlows(ctx context.Context) error
}

// Proxier programs Services. Create with New, then Run.
type Proxier struct {
	cfg     Config
	skip    map[string]bool
	flows   Flows
	sw      Switch
	log     *zap.Logger
	factory informers.SharedInformerFactory
	// nodeFactory watches this Node alone: its zone label, and whether it
	// is on its way out (the health check).
	nodeFactory informers.SharedInformerFactory
	nodes       corelisters.NodeLister
	svcs        corelisters.ServiceLister
	slices      cache.Indexer // EndpointSlices, indexed by Service (byService)
	queue       workqueue.TypedRateLimitingInterface[string]
	host        *host
	health      *healthChecks // nil without ProxyAll
	sync        *syncHealth
	synced      []cache.InformerSynced
	metrics     *metrics
	// initial holds the Services known at start not yet synced; nil once
	// all were (the worker's own).
	initial map[string]bool

	// flushMu guards the conntrack flushes held for the next purge of the
	// datapath flows (scheduleFlushes); never taken with p.mu held.
	flushMu     sync.Mutex
	lastPurge   time.Time   // when the last run of flushes (and its purge) ended
	flushing    bool        // a run of flushes is under way
	flushTimer  *time.Timer // calls flushHeldOnTimer; nil when not set
	heldFlushes []ctFlush

	mu        sync.Mutex
	installed map[string]map[string]*portInstall // service key → port key → state
	book      *groupBook                         // the groups of installed, for ReplayGroups
	ids       *idAllocator
	// prior maps frontendKey to the port ID an earlier run of the daemon
	// gave it (read from the switch at start), so that a restart keeps
	// IDs, and with them the groups the old flows point to.
	prior map[string]uint32
	// noAlias are the external IPs left without an alias (the range is
	// full), logged once each.
	noAlias map[string]bool
	// existing holds the IDs of groups on the switch at start that no
	// installed port has claimed yet: installing one modifies it.
	existing map[uint32]bool
	// ctDirty are the VIPs and ports whose UDP or SCTP connections may
	// have gone stale in the batch being programmed, with their state
	// before it (see conntrack.go).
	ctDirty map[ctKey]*ctBefore
	// ctPorts indexes the programmed UDP and SCTP frontends by ctKey
	// (setPortLocked keeps it), so that a batch's bookkeeping reads the
	// frontends of the keys it changed, not every installed one.
	ctPorts map[ctKey]map[*portInstall]struct{}
	ready   bool
}

type portInstall struct {
	id uint32
	// port is what the switch was last programmed with (zero before the
	// first time): what the connections in conntrack were balanced by;
	// serving, the endpoints then serving the Service port
	// (PortState.Serving).
	port    pipeline.ServicePort
	serving []pipeline.ServiceEndpoint
	// groups are the installed groups by ID, second-level ones included.
	groups   map[uint32]of.GroupEntry
	elements []element // host nftables elements
	routes   []net.IP  // host routes to the gateway
}

// New returns a Proxier watching kube with its own informers.
func New(kube kubernetes.Interface, flows Flows, sw Switch, cfg Config, log *zap.Logger) (*Proxier, error) {
	hs, err := newHost(hostConfig{proxyAll: cfg.ProxyAll, gateway: cfg.Gateway, services: cfg.ServiceCIDR,
		nodePortAddresses: cfg.NodePortAddresses, routeSrc: cfg.RouteSource, nodeSource: cfg.Bridge.NodeIP.To4(),
		aliases: cfg.LocalVIPAliases})
	if err != nil {
		return nil, err
	}
	// As kube-proxy does: Services another proxy implements, and
	// EndpointSlices marked headless, are not watched at all (a slice that
	// gains the label leaves the cache like a deleted one).
	f := informers.NewSharedInformerFactoryWithOptions(kube, 0, informers.WithTweakListOptions(func(o *metav1.ListOptions) {
		o.LabelSelector = "!" + LabelServiceProxyName + ",!" + corev1.IsHeadlessService
	}))
	p := &Proxier{
		cfg: cfg, skip: map[string]bool{}, flows: flows, sw: sw, log: log, factory: f,
		svcs: f.Core().V1().Services().Lister(),
		queue: workqueue.NewTypedRateLimitingQueueWithConfig(workqueue.DefaultTypedControllerRateLimiter[string](),
			workqueue.TypedRateLimitingQueueConfig[string]{Name: "proxy", MetricsProvider: cfg.QueueMetrics}),
		host:      hs,
		installed: map[string]map[string]*portInstall{},
		book:      newGroupBook(),
		ids:       newIDAllocator(pipeline.MaxServicePortID),
		metrics:   newMetrics(cfg.Registry),
		sync:      newSyncHealth(cfg.HealthTimeout),
	}
	for _, s := range cfg.SkipServices {
		p.skip[s] = true
	}
	if cfg.ProxyAll {
		p.health = newHealthChecks(localAddrsIn(cfg.NodePortAddresses), p.sync.healthy, log)
	}
	svcInf := f.Core().V1().Services().Informer()
	sliceInf := f.Discovery().V1().EndpointSlices().Informer()
	// Listing a Service's slices by label selector scans every slice of
	// the namespace: quadratic at cold start with thousands of Services
	// in one namespace. An index keyed by "namespace/service" is not.
	if err := sliceInf.AddIndexers(cache.Indexers{byService: sliceService}); err != nil {
		return nil, err
	}
	p.slices = sliceInf.GetIndexer()
	enqueue := func(obj any) {
		if t, ok := obj.(cache.DeletedFinalStateUnknown); ok {
			obj = t.Obj
		}
		switch o := obj.(type) {
		case *corev1.Service:
			p.sync.queued()
			p.queue.Add(o.Namespace + "/" + o.Name)
		case *discoveryv1.EndpointSlice:
			if name := o.Labels[discoveryv1.LabelServiceName]; name != "" {
				p.sync.queued()
				p.queue.Add(o.Namespace + "/" + name)
			}
		}
	}
	// A slice added or updated carries the trigger time of its change,
	// recorded before the Service is queued (network programming latency).
	changed := func(obj any) {
		if s, ok := obj.(*discoveryv1.EndpointSlice); ok {
			p.metrics.triggered(s)
		}
		enqueue(obj)
	}
	h := cache.ResourceEventHandlerFuncs{AddFunc: changed, DeleteFunc: enqueue,
		UpdateFunc: func(_, n any) { changed(n) }}
	if _, err := svcInf.AddEventHandler(h); err != nil {
		return nil, err
	}
	if _, err := sliceInf.AddEventHandler(h); err != nil {
		return nil, err
	}
	// The Node's zone picks the endpoints under zone hints: a change of
	// its label requeues every Service.
	p.nodeFactory = informers.NewSharedInformerFactoryWithOptions(kube, 0, informers.WithTweakListOptions(func(o *metav1.ListOptions) {
		o.FieldSelector = fields.OneTermEqualSelector("metadata.name", cfg.NodeName).String()
	}))
	nodeInf := p.nodeFactory.Core().V1().Nodes().Informer()
	p.nodes = p.nodeFactory.Core().V1().Nodes().Lister()
	zoneChanged := func(old, cur any) {
		o, _ := old.(*corev1.Node)
		n, _ := cur.(*corev1.Node)
		p.sync.setNode(n)
		if o == nil || n == nil || o.Labels[corev1.LabelTopologyZone] != n.Labels[corev1.LabelTopologyZone] {
			p.requeueAll()
		}
	}
	if _, err := nodeInf.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    func(obj any) { zoneChanged(nil, obj) },
		UpdateFunc: zoneChanged,
		DeleteFunc: func(obj any) { zoneChanged(obj, nil) },
	}); err != nil {
		return nil, err
	}
	p.synced = []cache.InformerSynced{svcInf.HasSynced, sliceInf.HasSynced, nodeInf.HasSynced}
	return p, nil
}

// requeueAll queues every Service known (after a change of the Node's
// zone).
func (p *Proxier) requeueAll() {
	svcs, err := p.svcs.List(labels.Everything())
	if err != nil {
		return
	}
	if len(svcs) > 0 {
		p.sync.queued()
	}
	for _, svc := range svcs {
		p.queue.Add(svc.Namespace + "/" + svc.Name)
	}
}

// zone returns the Node's topology.kubernetes.io/zone label, "" when the
// Node or the label is missing.
func (p *Proxier) zone() string {
	n, err := p.nodes.Get(p.cfg.NodeName)
	if err != nil {
		return ""
	}
	return n.Labels[corev1.LabelTopologyZone]
}

// byService is the EndpointSlice index by owning Service.
const byService = "service"

// sliceService indexes an EndpointSlice under "namespace/service" (its
// kubernetes.io/service-name label).
func sliceService(obj any) ([]string, error) {
	s, ok := obj.(*discoveryv1.EndpointSlice)
	if !ok {
		return nil, nil
	}
	name := s.Labels[discoveryv1.LabelServiceName]
	if name == "" {
		return nil, nil
	}
	return []string{s.Namespace + "/" + name}, nil
}

// Synced reports whether every Service known at start has been programmed.
func (p *Proxier) Synced() bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.ready
}

// Run programs the fixed Service flows and then Services until ctx ends.
func (p *Proxier) Run(ctx context.Context) error {
	defer p.queue.ShutDown()
	if p.health != nil {
		defer p.health.close()
	}
	p.mu.Lock()
	err := p.host.reset(ctx)
	p.mu.Unlock()
	if err != nil {
		return err
	}
	if err := p.readPriorIDs(ctx); err != nil {
		return err
	}
	if err := p.readExistingGroups(ctx); err != nil {
		return err
	}
	if err := p.flows.Set(ctx, "service-base", pipeline.ServiceBaseFlows(p.cfg.Bridge)); err != nil {
		return fmt.Errorf("service base flows: %w", err)
	}
	if p.cfg.ProxyAll && p.cfg.HealthAddress != "" {
		go serveHealth(ctx, p.cfg.HealthAddress, p.sync, p.log)
	}
	p.factory.Start(ctx.Done())
	p.nodeFactory.Start(ctx.Done())
	if !cache.WaitForCacheSync(ctx.Done(), p.synced...) {
		return fmt.Errorf("service informers did not sync: %w", ctx.Err())
	}
	// Synced once every Service known now has been through a sync
	// (programmed, or failed and requeued): not when the queue is empty,
	// which it is while the last batch is still being programmed.
	svcs, err := p.svcs.List(labels.Everything())
	if err != nil {
		return err
	}
	p.initial = make(map[string]bool, len(svcs))
	for _, svc := range svcs {
		p.initial[svc.Namespace+"/"+svc.Name] = true
	}
	p.log.Info("service proxy running", zap.Int("services", len(svcs)))
	p.markSynced(ctx, nil)
	go func() { <-ctx.Done(); p.queue.ShutDown() }()
	for p.processNext(ctx) {
	}
	return nil
}

// markSynced notes that keys went through a sync; once every Service of
// the initial backlog has, the proxier is ready and removes what an
// earlier run left behind. Only the worker calls it.
func (p *Proxier) markSynced(ctx context.Context, keys []string) {
	if p.initial == nil {
		return
	}
	for _, k := range keys {
		delete(p.initial, k)
	}
	if len(p.initial) > 0 {
		return
	}
	p.initial = nil
	p.mu.Lock()
	p.ready = true
	err := errors.Join(p.host.prune(ctx), p.pruneGroups(ctx))
	p.prior = nil
	p.mu.Unlock()
	if err != nil {
		p.log.Warn("removing stale host rules failed", zap.Error(err))
	}
	p.deleteHostConntrack()
	p.reconcileConntrack(ctx)
}

// deleteHostConntrack deletes the host's conntrack entries NATed to the
// aliases given up and to the ports no longer served through one (see
// host.staleCT), without holding p.mu across the pass over the table. A
// failure is logged and tried again after the next batch.
func (p *Proxier) deleteHostConntrack() {
	p.mu.Lock()
	g := p.host.takeStaleConntrack()
	p.mu.Unlock()
	if g.empty() {
		return
	}
	n, err := p.host.deleteConntrack(g)
	p.mu.Lock()
	p.host.conntrackDeleted(g, err)
	p.mu.Unlock()
	if err != nil {
		p.log.Warn("deleting the host's conntrack entries of given-up local VIP aliases failed; tried again after the next batch",
			zap.Int("aliases", len(g.aliases)), zap.Int("ports", len(g.ports)), zap.Error(err))
		return
	}
	if n > 0 {
		p.log.Info("deleted the host's conntrack entries of given-up local VIP aliases", zap.Uint("entries", n))
	}
}

// processNext takes the next Service from the queue, and with it every
// other Service queued (up to maxBatch), and programs them together.
func (p *Proxier) processNext(ctx context.Context) bool {
	key, quit := p.queue.Get()
	if quit {
		return false
	}
	keys := []string{key}
	// The worker is the queue's only consumer: Get does not block while
	// Len is positive.
	for len(keys) < maxBatch && p.queue.Len() > 0 {
		k, quit := p.queue.Get()
		if quit {
			break
		}
		keys = append(keys, k)
	}
	defer func() {
		for _, k := range keys {
			p.queue.Done(k)
		}
	}()
	start := time.Now()
	errs := p.SyncServices(ctx, keys)
	if ctx.Err() != nil {
		return false
	}
	p.metrics.batchDone(time.Since(start))
	// A Service whose only error is its health check node port is
	// programmed all the same.
	for _, k := range keys {
		if e := errs[k]; e == nil || onlyHealthCheck(e) {
			p.sync.programmed(start, p.queue.Len() > 0)
			break
		}
	}
	for _, k := range keys {
		if err := errs[k]; err != nil {
			p.log.Warn("programming service failed; retrying", zap.String("service", k), zap.Error(err))
			p.queue.AddRateLimited(k)
			continue
		}
		p.queue.Forget(k)
	}
	p.markSynced(ctx, keys)
	p.log.Debug("services programmed", zap.Int("services", len(keys)), zap.Int("failed", len(errs)),
		zap.Duration("took", time.Since(start)))
	return true
}

// SyncService makes the datapath state of the Service key ("ns/name")
// match the informers' view: new ports get an ID, groups and flows; changed
// ports are updated in place; vanished ports are removed.
func (p *Proxier) SyncService(ctx context.Context, key string) error {
	return p.SyncServices(ctx, []string{key})[key]
}

// healthCheckError is a health check node port that cannot listen: its
// Service is programmed all the same, and retried for the port.
type healthCheckError struct{ error }

func (e healthCheckError) Unwrap() error { return e.error }

// onlyHealthCheck reports whether err holds nothing but health check
// errors (alone or joined).
func onlyHealthCheck(err error) bool {
	if j, ok := err.(interface{ Unwrap() []error }); ok {
		for _, e := range j.Unwrap() {
			if !onlyHealthCheck(e) {
				return false
			}
		}
		return true
	}
	_, ok := err.(healthCheckError)
	return ok
}

// SyncServices is SyncService for several Services at once, sharing
// OpenFlow bundles between them (see applyBatch). It returns the errors by
// Service key; Services without an entry are programmed.
func (p *Proxier) SyncServices(ctx context.Context, keys []string) map[string]error {
	errs := map[string]error{}
	wants := make(map[string][]PortState, len(keys))
	triggers := make(map[string][]time.Time, len(keys))
	for _, key := range keys {
		triggers[key] = p.metrics.checkout(key)
		want, hcErr, err := p.desired(key)
		if err != nil {
			errs[key] = err
			continue
		}
		if hcErr != nil {
			errs[key] = healthCheckError{hcErr}
		}
		wants[key] = want
	}
	for key, err := range p.applyBatch(ctx, wants) {
		errs[key] = errors.Join(err, errs[key])
	}
	p.flushConntrack(ctx)
	p.deleteHostConntrack()
	for key, ts := range triggers {
		if errs[key] != nil {
			p.metrics.putBack(key, ts)
		} else {
			p.metrics.programmed(ts)
		}
	}
	if len(errs) < len(keys) {
		p.metrics.synced()
	}
	return errs
}

// desired returns the ports the Service key should have now, and sets up
// its health check node port; hcErr is a health check that cannot listen
// (the Service is programmed anyway).
func (p *Proxier) desired(key string) (want []PortState, hcErr, err error) {
	ns, name, err := cache.SplitMetaNamespaceKey(key)
	if err != nil {
		return nil, nil, err
	}
	var hcPort int32
	var hcLocal int
	svc, err := p.svcs.Services(ns).Get(name)
	switch {
	case apierrors.IsNotFound(err):
	case err != nil:
		return nil, nil, err
	default:
		if why := Ignored(svc, p.skip); why != "" {
			p.log.Debug("service ignored", zap.String("service", key), zap.String("reason", why))
			break
		}
		objs, err := p.slices.ByIndex(byService, key)
		if err != nil {
			return nil, nil, err
		}
		slices := make([]*discoveryv1.EndpointSlice, 0, len(objs))
		for _, o := range objs {
			if s, ok := o.(*discoveryv1.EndpointSlice); ok {
				slices = append(slices, s)
			}
		}
		want, err = Translate(svc, slices, Scope{NodeName: p.cfg.NodeName, ProxyAll: p.cfg.ProxyAll,
			HostIPs: hostIPs(p.cfg.Bridge), Zone: p.zone()})
		if err != nil {
			return nil, nil, err
		}
		hcPort, hcLocal = healthCheckPort(svc), localReady(slices, p.cfg.NodeName)
	}
	if p.health != nil {
		// A health check that cannot listen must not hold the datapath up:
		// the Service is programmed anyway, and the error requeues it, so
		// the port is tried again (with backoff).
		if hcErr = p.health.set(key, hcPort, hcLocal); hcErr != nil {
			p.log.Warn("health check node port not served", zap.String("service", key), zap.Error(hcErr))
		}
	}
	return want, hcErr, nil
}

// apply installs want for the Service key and removes its other ports.
func (p *Proxier) apply(ctx context.Context, key string, want []PortState) error {
	return p.applyBatch(ctx, map[string][]PortState{key: want})[key]
}

// applyLocked is apply one port at a time, each with its own bundles: the
// way applyBatch retries a batch that failed, so that each Service gets
// its own error. p.mu must be held.
func (p *Proxier) applyLocked(ctx context.Context, key string, want []PortState) error {
	have := p.installed[key]
	if have == nil {
		have = map[string]*portInstall{}
	}
	keep := map[string]bool{}
	var errs []error
	// Every frontend its ID first: one frontend's flows may name
	// another's (AffinityOf).
	for _, ps := range want {
		keep[ps.Key] = true
		if have[ps.Key] == nil {
			id, err := p.ids.get(ps.Key, p.prior[frontendKeyOf(ps.Port)])
			if err != nil {
				errs = append(errs, err)
				continue
			}
			have[ps.Key] = &portInstall{id: id, groups: map[uint32]of.GroupEntry{}}
		}
	}
	for _, ps := range want {
		pi := have[ps.Key]
		if pi == nil {
			continue
		}
		if err := p.installPort(ctx, pi, ps, affinityID(have, ps)); err != nil {
			errs = append(errs, fmt.Errorf("port %s: %w", ps.Key, err))
		}
	}
	// Frontends to remove in reverse key order: a Service port's internal
	// frontend (its key a prefix of the others') goes last, so that no
	// frontend of the port still learns affinity flows under its ID
	// (cookie) once they have been deleted with it.
	var gone []string
	for k := range have {
		if !keep[k] {
			gone = append(gone, k)
		}
	}
	slices.Sort(gone)
	slices.Reverse(gone)
	for _, k := range gone {
		pi := have[k]
		if err := p.removePort(ctx, pi); err != nil {
			errs = append(errs, fmt.Errorf("removing port %s: %w", k, err))
			continue
		}
		p.ids.release(k)
		delete(have, k)
	}
	if len(have) == 0 {
		delete(p.installed, key)
	} else {
		p.installed[key] = have
	}
	return errors.Join(errs...)
}

// installPort programs one frontend; affinity is its AffinityID (see
// affinityID).
func (p *Proxier) installPort(ctx context.Context, pi *portInstall, ps PortState, affinity uint32) error {
	ps = p.withAliases(ps)
	sp := ps.Port
	sp.ID, sp.AffinityID = pi.id, affinity
	flows, groups, err := pipeline.ServicePortFlows(p.cfg.Bridge, sp)
	if err != nil {
		return err
	}
	// Second-level groups before the top group that names them, groups
	// before the flows that name them.
	wantGroups := map[uint32]bool{}
	for i := len(groups) - 1; i >= 0; i-- {
		g := groups[i]
		wantGroups[g.ID] = true
		_, known := pi.groups[g.ID]
		if err := p.putGroup(ctx, g, known || p.existing[g.ID]); err != nil {
			return err
		}
		p.keepGroup(pi, g)
		delete(p.existing, g.ID)
	}
	if err := p.flows.Set(ctx, pipeline.ServiceOwner(pi.id), flows); err != nil {
		return err
	}
	p.setPortLocked(pi, sp, ps.Serving)
	var stale []of.GroupMod
	for id := range pi.groups {
		if !wantGroups[id] {
			stale = append(stale, of.GroupMod{Op: of.GroupOpDelete, Group: of.GroupEntry{ID: id}})
		}
	}
	if err := p.sw.ApplyGroups(ctx, stale); err != nil {
		return fmt.Errorf("deleting unused groups: %w", err)
	}
	for _, g := range stale {
		p.dropGroup(pi, g.Group.ID)
	}
	els, routes := p.hostNeedsWithClusterRoutes(sp, ps.ClusterIPs, ps.Aliases)
	// Recorded even when the update fails: its counts took the change.
	err = p.host.update(ctx, els, pi.elements, routes, pi.routes)
	pi.elements, pi.routes = els, routes
	return err
}

// hostNeedsWithClusterRoutes is hostNeeds plus, with proxyAll, a route to the
// gateway for each ClusterIP outside the serviceCIDR route: ranges added
// with ServiceCIDR objects (KEP-1880), which the host would otherwise send
// out of the Node.
func (p *Proxier) hostNeedsWithClusterRoutes(sp pipeline.ServicePort, clusterIPs []net.IP, aliases map[string]net.IP) ([]element, []net.IP) {
	els, routes := hostNeeds(sp, clusterIPs, aliases)
	if p.cfg.ProxyAll {
		for _, ip := range clusterIPs {
			if p.cfg.ServiceCIDR == nil || !p.cfg.ServiceCIDR.Contains(ip) {
				routes = append(routes, ip)
			}
		}
	}
	return els, routes
}

// withAliases returns ps with the aliases of an external frontend's
// externalIPs and LoadBalancer IPs (with proxyAll) in ps.Aliases and
// after its VIPs: the frontend also balances what the host DNATs to them
// (an IP that is a local address of the Node). Other frontends are
// returned as they are. An IP left without an alias (every one taken) is
// logged, and served only while it is not a local address of the Node.
func (p *Proxier) withAliases(ps PortState) PortState {
	if p.host == nil || !p.cfg.ProxyAll || !ps.Port.External {
		return ps
	}
	ps.Aliases = map[string]net.IP{}
	vips := slices.Clone(ps.Port.VIPs)
	for _, vip := range ps.Port.VIPs {
		if vip.Equal(pipeline.NodePortVIP) {
			continue
		}
		a, ok := p.host.aliasOf(vip)
		if !ok {
			if !p.noAlias[vip.String()] { // once per IP, not at every sync
				p.log.Warn("no alias left for an external IP: not served while it is a local address of the Node",
					zap.Stringer("vip", vip), zap.Stringer("aliases", p.host.cfg.aliases))
				if p.noAlias == nil {
					p.noAlias = map[string]bool{}
				}
				p.noAlias[vip.String()] = true
			}
			continue
		}
		delete(p.noAlias, vip.String())
		ps.Aliases[vip.String()] = a
		vips = append(vips, a)
	}
	ps.Port.VIPs = vips
	return ps
}

// hostNeeds returns the host nftables elements and routes a frontend
// needs: a reject element per VIP without endpoints; for an internal
// frontend, the element of each of the Service's clusterIPs and of each
// ClusterIP with the frontend's port (the host rejects connections to the
// other ports); the NodePort element of a NodePort frontend; a route to
// the gateway per external IP and, for each with an alias (aliases, by
// VIP; the aliases themselves are among sp.VIPs), its SetExternalPorts
// element and its MapLocalVIPAliases element.
func hostNeeds(sp pipeline.ServicePort, clusterIPs []net.IP, aliases map[string]net.IP) ([]element, []net.IP) {
	var els []element
	var routes []net.IP
	for _, ip := range clusterIPs {
		els = append(els, clusterIPElement(ip), element{set: SetServicePorts, key: rejectElement(ip, sp.Protocol, sp.Port).key})
	}
	if sp.Action == pipeline.ServiceReject {
		for _, vip := range sp.VIPs {
			els = append(els, rejectElement(vip, sp.Protocol, sp.Port))
		}
	}
	if !sp.External {
		return els, routes
	}
	isAlias := map[string]bool{}
	for _, a := range aliases {
		isAlias[a.String()] = true
	}
	for _, vip := range sp.VIPs {
		switch {
		case vip.Equal(pipeline.NodePortVIP):
			els = append(els, nodePortElement(sp.Protocol, sp.Port))
		case isAlias[vip.String()]:
			// routed by the aliases' range route
		default:
			routes = append(routes, vip)
			if a, ok := aliases[vip.String()]; ok {
				els = append(els, externalPortElement(vip, sp.Protocol, sp.Port), aliasElement(vip, a))
			}
		}
	}
	return els, routes
}

// putGroup adds a group, or modifies it when it already exists (known to
// us, or left by an earlier run of the daemon).
func (p *Proxier) putGroup(ctx context.Context, g of.GroupEntry, known bool) error {
	if !known {
		if err := p.sw.ApplyGroups(ctx, []of.GroupMod{{Op: of.GroupOpAdd, Group: g}}); err == nil {
			return nil
		}
	}
	if err := p.sw.ApplyGroups(ctx, []of.GroupMod{{Op: of.GroupOpModify, Group: g}}); err != nil {
		return fmt.Errorf("group %d: %w", g.ID, err)
	}
	return nil
}

// affinityID returns the ID under which ps's frontend remembers ClientIP
// affinity: that of the frontend named by ps.AffinityOf among the
// Service's frontends have, 0 (the frontend's own) when there is none.
func affinityID(have map[string]*portInstall, ps PortState) uint32 {
	if pi := have[ps.AffinityOf]; ps.AffinityOf != "" && pi != nil {
		return pi.id
	}
	return 0
}

func (p *Proxier) removePort(ctx context.Context, pi *portInstall) error {
	if err := p.flows.Set(ctx, pipeline.ServiceOwner(pi.id), nil); err != nil {
		return err
	}
	p.setPortLocked(pi, pipeline.ServicePort{}, nil)
	// The affinity flows learned under this frontend's ID (a Service
	// port's internal frontend: see affinityID) carry its cookie.
	ck := pipeline.Cookie(p.cfg.Bridge.Round, pipeline.CategoryService, uint64(pi.id))
	if err := p.sw.DeleteMatching(ctx, ck, ^uint64(0)); err != nil {
		return fmt.Errorf("deleting learned flows: %w", err)
	}
	var mods []of.GroupMod
	for id := range pi.groups {
		mods = append(mods, of.GroupMod{Op: of.GroupOpDelete, Group: of.GroupEntry{ID: id}})
	}
	if err := p.sw.ApplyGroups(ctx, mods); err != nil {
		return err
	}
	for id := range pi.groups {
		p.dropGroup(pi, id)
	}
	err := p.host.update(ctx, nil, pi.elements, nil, pi.routes)
	pi.elements, pi.routes = nil, nil // the counts took the change
	return err
}

// frontendKey identifies a frontend by its first VIP, protocol, port and
// kind, as its ServiceLB flows show it.
func frontendKey(vip net.IP, proto uint8, port uint16, kind pipeline.FrontendKind) string {
	return fmt.Sprintf("%s/%d/%d/%d", vip, proto, port, kind)
}

// frontendKeyOf is sp's frontendKey.
func frontendKeyOf(sp pipeline.ServicePort) string {
	return frontendKey(sp.VIPs[0], sp.Protocol, sp.Port, sp.Kind())
}

// readPriorIDs learns the port IDs of the frontends an earlier run
// installed, from the cookies of their ServiceLB flows.
func (p *Proxier) readPriorIDs(ctx context.Context) error {
	table := uint8(pipeline.ServiceLB)
	flows, err := p.sw.DumpFlows(ctx, &table, uint64(pipeline.CategoryService)<<pipeline.CookieCategoryShift, pipeline.CookieCategoryMask)
	if err != nil {
		return fmt.Errorf("reading installed service flows: %w", err)
	}
	prior := map[string]uint32{}
	for _, f := range flows {
		id := uint32(f.Cookie & (1<<pipeline.CookieCategoryShift - 1))
		if id == 0 || id > pipeline.MaxServicePortID || f.Match.IPDst == nil || f.Match.L4Dst == nil {
			continue
		}
		prior[frontendKey(f.Match.IPDst.IP, f.Match.IPProto, f.Match.L4Dst.Port, pipeline.FrontendKindOf(f.Priority))] = id
	}
	p.mu.Lock()
	p.prior = prior
	p.mu.Unlock()
	if len(prior) > 0 {
		p.log.Info("reusing service port IDs of the previous run", zap.Int("frontends", len(prior)))
	}
	return nil
}

// pruneGroups deletes the groups no installed Service port uses (left by
// Services deleted while the daemon was down). Call with p.mu held.
func (p *Proxier) pruneGroups(ctx context.Context) error {
	ids, err := p.sw.GroupIDs(ctx)
	if err != nil {
		return err
	}
	used := map[uint32]bool{}
	for _, ports := range p.installed {
		for _, pi := range ports {
			for id := range pi.groups {
				used[id] = true
			}
		}
	}
	var mods []of.GroupMod
	for _, id := range ids {
		if !used[id] {
			mods = append(mods, of.GroupMod{Op: of.GroupOpDelete, Group: of.GroupEntry{ID: id}})
		}
	}
	if len(mods) > 0 {
		p.log.Info("removing stale service groups", zap.Int("groups", len(mods)))
	}
	return p.sw.ApplyGroups(ctx, mods)
}

// idAllocator hands out small IDs per key, preferring a hinted ID and
// reusing released ones.
type idAllocator struct {
	max  uint32
	next uint32
	free []uint32
	byKy map[string]uint32
	used map[uint32]bool
}

func newIDAllocator(max uint32) *idAllocator {
	return &idAllocator{max: max, next: 1, byKy: map[string]uint32{}, used: map[uint32]bool{}}
}

// get returns key's ID, allocating one (hint if free and non-zero).
func (a *idAllocator) get(key string, hint uint32) (uint32, error) {
	if id, ok := a.byKy[key]; ok {
		return id, nil
	}
	id := uint32(0)
	if hint != 0 && hint <= a.max && !a.used[hint] {
		id = hint
	}
	for id == 0 && len(a.free) > 0 {
		c := a.free[len(a.free)-1]
		a.free = a.free[:len(a.free)-1]
		if !a.used[c] {
			id = c
		}
	}
	for id == 0 && a.next <= a.max {
		if !a.used[a.next] {
			id = a.next
		}
		a.next++
	}
	if id == 0 {
		return 0, fmt.Errorf("no free service port id (all %d in use)", a.max)
	}
	a.byKy[key] = id
	a.used[id] = true
	return id, nil
}

func (a *idAllocator) release(key string) {
	if id, ok := a.byKy[key]; ok {
		delete(a.byKy, key)
		delete(a.used, id)
		a.free = append(a.free, id)
	}
}

// hostIPs are the addresses the Node's own connections to a Service come
// from: its InternalIP and its gateway IP.
func hostIPs(b pipeline.Bridge) []net.IP {
	var out []net.IP
	for _, ip := range []net.IP{b.NodeIP, b.GatewayIP} {
		if ip.To4() != nil {
			out = append(out, ip.To4())
		}
	}
	return out
}
