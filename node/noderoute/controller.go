// Package noderoute connects this Node to its peers. For every other Node
// with a podCIDR it decides, from the traffic mode and whether the peer
// shares this Node's transport subnet, how its podCIDR is reached (Route):
// through the tunnel (OVS flows setting tun_dst to the peer's InternalIP,
// or its MAC with a kernel VXLAN device, and a host route for the podCIDR via the gateway interface), by a host
// route via the peer's Node IP (flows sending the podCIDR out of the
// gateway), or by the underlay's routing (flows only). It also keeps the
// peer's IP in the SNAT exemption set. All of it is removed when the Node
// goes away, and re-decided when the Node or this Node's transport
// addresses change. With OVS's userspace tunnel port it also keeps OVS's
// tunnel neighbor cache filled for every tunnelled peer (see tunnel.Neighbors), so
// no first packet is dropped.
package noderoute

import (
	"context"
	"errors"
	"fmt"
	"hash/fnv"
	"net"
	"sync"
	"syscall"
	"time"

	"github.com/vishvananda/netlink"
	"go.uber.org/zap"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/labels"
	utilruntime "k8s.io/apimachinery/pkg/util/runtime"
	"k8s.io/apimachinery/pkg/util/wait"
	coreinformers "k8s.io/client-go/informers/core/v1"
	corelisters "k8s.io/client-go/listers/core/v1"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/util/workqueue"

	of "github.com/seine-net/seine/datapath/openflow"
	"github.com/seine-net/seine/datapath/pipeline"
	"github.com/seine-net/seine/node/config"
)

// FlowSetter installs the flows of one owner (see datapath/flowsync).
type FlowSetter interface {
	Set(ctx context.Context, owner string, flows []of.Flow) error
}

// NodeIPSet is the SNAT exemption set of Node IPs (see node/snat).
type NodeIPSet interface {
	SetNodeIP(node string, ip net.IP)
	// Sync writes the recorded IPs; until Prune it keeps the IPs already
	// in the set (a previous run's).
	Sync(ctx context.Context) error
	// Prune makes the set exactly the recorded IPs, from now on. The
	// controller calls it once every Node known at its start is synced.
	Prune(ctx context.Context) error
}

// NeighborCache fills the userspace datapath's tunnel neighbor cache for a
// peer Node's IP (see tunnel.Neighbors).
type NeighborCache interface {
	Ensure(ctx context.Context, peer net.IP) error
}

// PeerTunnel keeps the per-peer state of a tunnel device that picks the
// remote end itself (tunnel.KernelVXLAN: a forwarding entry per peer).
// AddPeer runs before the peer's flows are installed, so no packet reaches
// the device before it knows the peer.
type PeerTunnel interface {
	AddPeer(nodeIP net.IP) error
	RemovePeer(nodeIP net.IP) error
	// Peers lists the Node IPs the device knows, so entries of peers
	// removed while the daemon was down can be found.
	Peers() ([]net.IP, error)
}

// neighborRefresh is how often every peer's tunnel neighbor entry is
// refreshed: well inside OVS's default 15-minute aging of idle entries.
const neighborRefresh = time.Minute

// neighborWorkers resolve tunnel neighbors apart from the peer worker, so
// a silent peer (each attempt waits for ARP) delays no other peer's flows
// and routes, and several silent peers no other resolution.
const neighborWorkers = 4

// neighborTimeout bounds one resolution (ARP included).
const neighborTimeout = 10 * time.Second

// RouteProtocol marks the host routes to peer podCIDRs (rtnetlink
// rtm_protocol; values above 4 are free for routing daemons, rtnetlink(7)),
// so that stale ones are found on any device after a mode change.
const RouteProtocol netlink.RouteProtocol = 0x5f

// addressRecheck is how often the transport's addresses are re-read in
// case an address notification was lost.
const addressRecheck = 30 * time.Second

// Config wires the controller to this Node's datapath.
type Config struct {
	NodeName string
	// Mode is the traffic mode; empty means encap.
	Mode config.TrafficEncapMode
	// Transport is the interface holding this Node's transport address;
	// with noEncap and hybrid, a peer whose Node IP is inside one of its
	// networks is routed directly.
	Transport string
	// Gateway is the name of the gateway interface; host routes to
	// tunnelled peers' podCIDRs point at it.
	Gateway string
	Bridge  pipeline.Bridge
	Flows   FlowSetter
	// SNAT is the masquerade exemption set; nil when seine masquerades
	// nothing (networkPolicyOnly).
	SNAT NodeIPSet
	// Neighbors, when set (userspace datapath), is told about every
	// tunnelled peer.
	Neighbors NeighborCache
	// Tunnel, when set, is told about every peer before its flows and
	// after their removal.
	Tunnel PeerTunnel
	// QueueMetrics, when set, receives the metrics of the workqueues
	// (named "noderoute" and "noderoute-neighbors"), and with them their
	// stuck items (health.QueueMetrics).
	QueueMetrics workqueue.MetricsProvider
}

type peer struct {
	podCIDR *net.IPNet
	nodeIP  net.IP
	route   Route
}

// Controller reconciles peer Nodes.
type Controller struct {
	cfg    Config
	routes routeTable
	lister corelisters.NodeLister
	synced cache.InformerSynced
	queue  workqueue.TypedRateLimitingInterface[string]
	// neighQueue holds the peers whose tunnel neighbor to resolve.
	neighQueue workqueue.TypedInterface[string]
	log        *zap.Logger

	mu    sync.Mutex
	peers map[string]peer // installed state by Node name
	// nets are the transport's networks the routes were decided with.
	nets []*net.IPNet
	// pending are the Nodes of the initial list not yet synced.
	pending map[string]bool
}

// New returns a controller fed by the Node informer.
func New(informer coreinformers.NodeInformer, cfg Config, log *zap.Logger) (*Controller, error) {
	c := &Controller{
		cfg:    cfg,
		routes: kernelRoutes{},
		lister: informer.Lister(),
		synced: informer.Informer().HasSynced,
		queue: workqueue.NewTypedRateLimitingQueueWithConfig(
			workqueue.DefaultTypedControllerRateLimiter[string](),
			workqueue.TypedRateLimitingQueueConfig[string]{Name: "noderoute", MetricsProvider: cfg.QueueMetrics}),
		neighQueue: workqueue.NewTypedWithConfig(workqueue.TypedQueueConfig[string]{Name: "noderoute-neighbors",
			MetricsProvider: cfg.QueueMetrics}),
		log:   log,
		peers: map[string]peer{},
	}
	if c.cfg.Mode == "" {
		c.cfg.Mode = config.ModeEncap
	}
	_, err := informer.Informer().AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    c.enqueue,
		UpdateFunc: func(_, obj any) { c.enqueue(obj) },
		DeleteFunc: c.enqueue,
	})
	if err != nil {
		return nil, fmt.Errorf("node informer: %w", err)
	}
	return c, nil
}

func (c *Controller) enqueue(obj any) {
	key, err := cache.DeletionHandlingMetaNamespaceKeyFunc(obj)
	if err != nil {
		utilruntime.HandleError(err)
		return
	}
	c.queue.Add(key)
}

// staleKey is the work item that removes what no peer wants any more (see
// removeStale). A Node's name is a DNS subdomain, which has no ':', so it
// never names a Node.
const staleKey = "seine:stale-peer-state"

// Run processes Node changes until ctx ends. Once every Node known at
// start has been synced it removes what earlier runs left for peers that
// are gone or now reached another way (see removeStale), retrying with
// the queue's backoff until that succeeds or ctx ends.
//
// One worker runs the queue, so the peers' syncs and the stale-state
// removal run one at a time, which removeStale relies on.
func (c *Controller) Run(ctx context.Context) error {
	defer c.queue.ShutDown()
	defer c.neighQueue.ShutDown()
	if c.cfg.Mode.RoutesDirectly() {
		if err := c.watchTransport(ctx); err != nil {
			return err
		}
	}
	if !cache.WaitForCacheSync(ctx.Done(), c.synced) {
		return fmt.Errorf("waiting for the Node informer: %w", ctx.Err())
	}
	nodes, err := c.lister.List(labels.Everything())
	if err != nil {
		return err
	}
	c.mu.Lock()
	c.pending = map[string]bool{}
	for _, n := range nodes {
		c.pending[n.Name] = true
	}
	c.mu.Unlock()
	for _, n := range nodes {
		c.queue.Add(n.Name)
	}
	if len(nodes) == 0 {
		c.queue.Add(staleKey)
	}
	// Run returns only once its goroutines have: a sync or the stale-state
	// removal in flight finishes before the caller closes what they use.
	var wg sync.WaitGroup
	wg.Go(func() { wait.UntilWithContext(ctx, c.worker, time.Second) })
	if c.cfg.Neighbors != nil {
		for i := 0; i < neighborWorkers; i++ {
			wg.Go(func() { c.neighborWorker(ctx) })
		}
		wg.Go(func() { wait.UntilWithContext(ctx, c.refreshNeighbors, neighborRefresh) })
	}
	<-ctx.Done()
	c.queue.ShutDown()
	c.neighQueue.ShutDown()
	wg.Wait()
	return nil
}

// InitialSyncDone reports whether every Node listed at start has been
// synced successfully once.
func (c *Controller) InitialSyncDone() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.pending != nil && len(c.pending) == 0
}

// watchTransport reads the transport's networks, then follows its address
// changes (and re-reads them every addressRecheck), re-deciding every
// peer's route when they change.
func (c *Controller) watchTransport(ctx context.Context) error {
	nets, err := TransportNets(c.cfg.Transport)
	if err != nil {
		return fmt.Errorf("addresses of transport interface %s: %w", c.cfg.Transport, err)
	}
	c.mu.Lock()
	c.nets = nets
	c.mu.Unlock()
	c.log.Info("transport subnets", zap.String("interface", c.cfg.Transport), zap.Stringers("subnets", nets))
	updates := make(chan netlink.AddrUpdate, 64)
	if err := netlink.AddrSubscribeWithOptions(updates, ctx.Done(), netlink.AddrSubscribeOptions{
		ErrorCallback: func(err error) { c.log.Warn("address notifications", zap.Error(err)) },
	}); err != nil {
		return fmt.Errorf("subscribing to address changes: %w", err)
	}
	go func() {
		tick := time.NewTicker(addressRecheck)
		defer tick.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case _, ok := <-updates:
				if !ok {
					updates = nil // recheck on the ticker only
					continue
				}
			case <-tick.C:
			}
			c.recheckTransport()
		}
	}()
	return nil
}

// recheckTransport re-reads the transport's networks and, when they
// changed, queues every Node.
func (c *Controller) recheckTransport() {
	nets, err := TransportNets(c.cfg.Transport)
	if err != nil {
		c.log.Warn("reading transport addresses", zap.String("interface", c.cfg.Transport), zap.Error(err))
		return
	}
	c.mu.Lock()
	changed := !sameNets(nets, c.nets)
	c.nets = nets
	c.mu.Unlock()
	if !changed {
		return
	}
	c.log.Info("transport subnets changed: re-deciding peer routes", zap.Stringers("subnets", nets))
	nodes, err := c.lister.List(labels.Everything())
	if err != nil {
		return
	}
	for _, n := range nodes {
		c.queue.Add(n.Name)
	}
}

func (c *Controller) worker(ctx context.Context) {
	for c.processNext(ctx) {
	}
}

// processNext handles one work item: a Node's name (sync) or staleKey
// (removeStale). A failed item is queued again with backoff. The Node
// that completes the initial sync queues staleKey.
func (c *Controller) processNext(ctx context.Context) bool {
	key, quit := c.queue.Get()
	if quit {
		return false
	}
	defer c.queue.Done(key)
	if key == staleKey {
		if err := c.removeStale(ctx); err != nil {
			c.log.Warn("removing stale peer state; will retry", zap.Int("retries", c.queue.NumRequeues(key)), zap.Error(err))
			c.queue.AddRateLimited(key)
			return true
		}
		c.queue.Forget(key)
		return true
	}
	if err := c.sync(ctx, key); err != nil {
		c.log.Warn("syncing peer Node", zap.String("node", key), zap.Error(err))
		c.queue.AddRateLimited(key)
		return true
	}
	c.queue.Forget(key)
	c.mu.Lock()
	last := c.pending[key] && len(c.pending) == 1
	delete(c.pending, key)
	c.mu.Unlock()
	if last {
		c.queue.Add(staleKey)
	}
	return true
}

func (c *Controller) sync(ctx context.Context, name string) error {
	node, err := c.lister.Get(name)
	if apierrors.IsNotFound(err) {
		return c.removePeer(ctx, name)
	}
	if err != nil {
		return err
	}
	nodeIP := InternalIP(node)
	if name == c.cfg.NodeName {
		return c.syncSNAT(ctx, name, nodeIP)
	}
	_, podCIDR, err := net.ParseCIDR(node.Spec.PodCIDR)
	if err != nil || nodeIP == nil || podCIDR.IP.To4() == nil {
		// Not ready to be a peer (no podCIDR or address yet): remove
		// anything installed for an older version of it.
		return c.removePeer(ctx, name)
	}
	c.mu.Lock()
	route := RouteFor(c.cfg.Mode, c.nets, nodeIP)
	old, had := c.peers[name]
	c.mu.Unlock()
	gw := FirstIP(podCIDR)
	if c.cfg.Tunnel != nil && route == RouteTunnel {
		// The tunnel knows the peer before any flow sends to it.
		if err := c.cfg.Tunnel.AddPeer(nodeIP); err != nil {
			return err
		}
	}
	pn := pipeline.PeerNode{ID: peerID(name), PodCIDR: podCIDR, NodeIP: nodeIP, GatewayIP: gw}
	var flows []of.Flow
	switch route {
	case RouteTunnel:
		flows = pipeline.PeerNodeFlows(c.cfg.Bridge, pn)
	case RouteDirect, RouteUnderlay:
		flows = pipeline.RoutedPeerNodeFlows(c.cfg.Bridge, pn)
	}
	if err := c.cfg.Flows.Set(ctx, owner(name), flows); err != nil {
		return err
	}
	if had && old.route == RouteTunnel && (route != RouteTunnel || !old.nodeIP.Equal(nodeIP)) {
		if err := c.removeTunnelPeer(name, old.nodeIP); err != nil {
			return err
		}
	}
	if had && (old.podCIDR.String() != podCIDR.String() || old.route != route) {
		if err := c.removeRoute(name, old.podCIDR); err != nil {
			return err
		}
	}
	switch route {
	case RouteTunnel:
		err = c.ensureTunnelRoute(podCIDR, gw)
	case RouteDirect:
		err = c.ensureDirectRoute(podCIDR, nodeIP)
	}
	if err != nil {
		return err
	}
	c.mu.Lock()
	c.peers[name] = peer{podCIDR: podCIDR, nodeIP: nodeIP, route: route}
	c.mu.Unlock()
	if c.cfg.Neighbors != nil && route == RouteTunnel && (!had || !old.nodeIP.Equal(nodeIP) || old.route != route) {
		// Queued now: a retry of this sync finds the peer already known.
		c.neighQueue.Add(name)
	}
	if err := c.syncSNAT(ctx, name, nodeIP); err != nil {
		return err
	}
	if !had || old.route != route {
		c.log.Info("peer Node connected", zap.String("node", name), zap.String("route", route.String()),
			zap.String("pod_cidr", podCIDR.String()), zap.String("node_ip", nodeIP.String()))
	}
	return nil
}

// syncSNAT records a Node's IP (nil: forgets it) in the SNAT exemption
// set, if seine masquerades at all.
func (c *Controller) syncSNAT(ctx context.Context, name string, ip net.IP) error {
	if c.cfg.SNAT == nil {
		return nil
	}
	c.cfg.SNAT.SetNodeIP(name, ip)
	return c.cfg.SNAT.Sync(ctx)
}

// refreshNeighbors queues every peer for tunnel neighbor resolution.
func (c *Controller) refreshNeighbors(context.Context) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for name := range c.peers {
		c.neighQueue.Add(name)
	}
}

// neighborWorker resolves queued peers' tunnel neighbors. A failure is not
// retried here: the tunnel works without the entry, at the price of the
// first packet, and the periodic refresh tries again.
func (c *Controller) neighborWorker(ctx context.Context) {
	for {
		name, quit := c.neighQueue.Get()
		if quit {
			return
		}
		c.mu.Lock()
		p, ok := c.peers[name]
		c.mu.Unlock()
		if ok && p.route == RouteTunnel {
			// Bounded: a hung ovs-vswitchd must not hold a worker forever.
			ectx, cancel := context.WithTimeout(ctx, neighborTimeout)
			err := c.cfg.Neighbors.Ensure(ectx, p.nodeIP)
			cancel()
			if err != nil && ctx.Err() == nil {
				c.log.Warn("tunnel neighbor of peer Node not resolved", zap.String("node", name),
					zap.String("node_ip", p.nodeIP.String()), zap.Error(err))
			}
		}
		c.neighQueue.Done(name)
	}
}

func (c *Controller) removePeer(ctx context.Context, name string) error {
	if err := c.cfg.Flows.Set(ctx, owner(name), nil); err != nil {
		return err
	}
	c.mu.Lock()
	old, had := c.peers[name]
	c.mu.Unlock()
	if had {
		if err := c.removeRoute(name, old.podCIDR); err != nil {
			return err
		}
		if old.route == RouteTunnel {
			if err := c.removeTunnelPeer(name, old.nodeIP); err != nil {
				return err
			}
		}
		c.log.Info("peer Node removed", zap.String("node", name), zap.String("pod_cidr", old.podCIDR.String()))
	}
	c.mu.Lock()
	delete(c.peers, name)
	c.mu.Unlock()
	return c.syncSNAT(ctx, name, nil)
}

// removeRoute deletes the route to podCIDR that peer name no longer
// needs, unless another recorded peer routes the same podCIDR: a Node
// that got the podCIDR of a deleted Node (or of one whose podCIDR
// changed) and was synced first has its route there already, and a
// route is known by its destination alone.
func (c *Controller) removeRoute(name string, podCIDR *net.IPNet) error {
	other := c.otherPeer(name, func(p peer) bool {
		return (p.route == RouteTunnel || p.route == RouteDirect) && p.podCIDR.String() == podCIDR.String()
	})
	if other != "" {
		c.log.Info("route kept: another peer Node routes the podCIDR", zap.String("node", name),
			zap.String("other_node", other), zap.String("pod_cidr", podCIDR.String()))
		return nil
	}
	return c.deleteRoute(podCIDR)
}

// removeTunnelPeer removes the tunnel's entry of nodeIP that peer name no
// longer needs, unless another recorded tunnelled peer has that Node IP:
// the entry is known by the IP alone, so a Node that got the IP of a
// deleted Node (or of one whose IP changed) and was synced first uses it.
func (c *Controller) removeTunnelPeer(name string, nodeIP net.IP) error {
	if c.cfg.Tunnel == nil {
		return nil
	}
	other := c.otherPeer(name, func(p peer) bool { return p.route == RouteTunnel && p.nodeIP.Equal(nodeIP) })
	if other != "" {
		c.log.Info("tunnel entry kept: another peer Node has the Node IP", zap.String("node", name),
			zap.String("other_node", other), zap.String("node_ip", nodeIP.String()))
		return nil
	}
	return c.cfg.Tunnel.RemovePeer(nodeIP)
}

// otherPeer returns a recorded peer other than name for which uses holds,
// or "".
func (c *Controller) otherPeer(name string, uses func(peer) bool) string {
	c.mu.Lock()
	defer c.mu.Unlock()
	for n, p := range c.peers {
		if n != name && uses(p) {
			return n
		}
	}
	return ""
}

// ensureTunnelRoute installs "podCIDR via gw dev <gateway> onlink": the
// gateway IP is answered by the bridge's ARP responder with the virtual
// MAC, and the bridge's L3 forwarding sends the packet through the tunnel.
func (c *Controller) ensureTunnelRoute(podCIDR *net.IPNet, gw net.IP) error {
	link, err := netlink.LinkByName(c.cfg.Gateway)
	if err != nil {
		return fmt.Errorf("gateway interface %s: %w", c.cfg.Gateway, err)
	}
	r := &netlink.Route{LinkIndex: link.Attrs().Index, Dst: podCIDR, Gw: gw, Flags: int(netlink.FLAG_ONLINK),
		Protocol: RouteProtocol}
	if err := c.routes.replace(r); err != nil {
		return fmt.Errorf("route %s via %s: %w", podCIDR, gw, err)
	}
	return nil
}

// ensureDirectRoute installs "podCIDR via <peer Node IP>": the kernel finds
// the transport interface, the peer being in its subnet.
func (c *Controller) ensureDirectRoute(podCIDR *net.IPNet, nodeIP net.IP) error {
	r := &netlink.Route{Dst: podCIDR, Gw: nodeIP, Protocol: RouteProtocol}
	if err := c.routes.replace(r); err != nil {
		return fmt.Errorf("route %s via %s: %w", podCIDR, nodeIP, err)
	}
	return nil
}

// deleteRoute removes this controller's route to podCIDR, whichever
// device it uses.
func (c *Controller) deleteRoute(podCIDR *net.IPNet) error {
	routes, err := redump(func() ([]netlink.Route, error) {
		return c.routes.list(&netlink.Route{Dst: podCIDR, Table: syscall.RT_TABLE_MAIN},
			netlink.RT_FILTER_DST|netlink.RT_FILTER_TABLE)
	})
	if err != nil {
		return fmt.Errorf("listing routes to %s: %w", podCIDR, err)
	}
	for _, r := range routes {
		if !c.ours(r) {
			continue
		}
		if err := c.routes.del(&r); err != nil && !errors.Is(err, syscall.ESRCH) {
			return fmt.Errorf("deleting route %s: %w", podCIDR, err)
		}
	}
	return nil
}

// ours reports whether r is a peer route of this controller: marked with
// RouteProtocol, or (left by a release that did not mark them) a route
// with a next hop through the gateway other than the Service proxy's.
func (c *Controller) ours(r netlink.Route) bool {
	if r.Dst == nil {
		return false
	}
	if r.Protocol == RouteProtocol {
		return true
	}
	link, err := netlink.LinkByName(c.cfg.Gateway)
	return err == nil && r.LinkIndex == link.Attrs().Index && r.Gw != nil && !r.Gw.Equal(pipeline.NodePortVIP)
}

// removeStale removes the host routes, tunnel entries and SNAT exemptions
// that no Node wants: those of Nodes deleted while the daemon was down,
// or of a traffic mode it ran in before. It must not run during a sync: a
// sync adds a peer's tunnel entry and route before it records the peer,
// and a removal reading the device and the records in between would take
// them for stale. Run's single worker, which runs both, sees to that.
func (c *Controller) removeStale(ctx context.Context) error {
	errs := []error{c.removeStaleRoutes(), c.removeStaleTunnelPeers()}
	if c.cfg.SNAT != nil {
		if err := c.cfg.SNAT.Prune(ctx); err != nil {
			errs = append(errs, fmt.Errorf("pruning the SNAT exemptions: %w", err))
		}
	}
	return errors.Join(errs...)
}

// removeStaleRoutes deletes this controller's routes (see ours) that no
// installed peer wants as they are: to no peer's podCIDR, or to a peer
// whose route is now another kind. A route it fails to delete does not
// stop it: it deletes the others and returns every failure joined.
func (c *Controller) removeStaleRoutes() error {
	routes, err := redump(func() ([]netlink.Route, error) {
		return c.routes.list(&netlink.Route{Table: syscall.RT_TABLE_MAIN}, netlink.RT_FILTER_TABLE)
	})
	if err != nil {
		return fmt.Errorf("listing routes: %w", err)
	}
	gw, err := netlink.LinkByName(c.cfg.Gateway)
	if err != nil {
		return fmt.Errorf("gateway interface %s: %w", c.cfg.Gateway, err)
	}
	c.mu.Lock()
	want := map[string]peer{}
	for _, p := range c.peers {
		want[p.podCIDR.String()] = p
	}
	c.mu.Unlock()
	var errs []error
	for _, r := range routes {
		if !c.ours(r) {
			continue
		}
		p, ok := want[r.Dst.String()]
		if ok && (p.route == RouteTunnel && r.LinkIndex == gw.Attrs().Index ||
			p.route == RouteDirect && r.Gw.Equal(p.nodeIP)) {
			continue
		}
		if err := c.routes.del(&r); err != nil && !errors.Is(err, syscall.ESRCH) {
			errs = append(errs, fmt.Errorf("deleting stale route %s via %s: %w", r.Dst, r.Gw, err))
			continue
		}
		c.log.Info("removed stale route", zap.String("dst", r.Dst.String()), zap.Stringer("via", r.Gw))
	}
	return errors.Join(errs...)
}

// removeStaleTunnelPeers removes the tunnel device's entries of Node IPs
// that are no peer's. An entry it fails to remove does not stop it: it
// removes the others and returns every failure joined.
func (c *Controller) removeStaleTunnelPeers() error {
	if c.cfg.Tunnel == nil {
		return nil
	}
	ips, err := redump(c.cfg.Tunnel.Peers)
	if err != nil {
		return fmt.Errorf("listing tunnel peers: %w", err)
	}
	c.mu.Lock()
	want := map[string]bool{}
	for _, p := range c.peers {
		if p.route == RouteTunnel {
			want[p.nodeIP.String()] = true
		}
	}
	c.mu.Unlock()
	var errs []error
	for _, ip := range ips {
		if want[ip.String()] {
			continue
		}
		if err := c.cfg.Tunnel.RemovePeer(ip); err != nil {
			errs = append(errs, fmt.Errorf("removing stale tunnel peer %s: %w", ip, err))
			continue
		}
		c.log.Info("removed stale tunnel peer", zap.String("node_ip", ip.String()))
	}
	return errors.Join(errs...)
}

// Peers returns the installed peers: Node name → podCIDR.
func (c *Controller) Peers() map[string]string {
	c.mu.Lock()
	defer c.mu.Unlock()
	out := make(map[string]string, len(c.peers))
	for n, p := range c.peers {
		out[n] = p.podCIDR.String()
	}
	return out
}

// PeerRoutes counts the installed peers by route.
func (c *Controller) PeerRoutes() map[Route]int {
	c.mu.Lock()
	defer c.mu.Unlock()
	out := map[Route]int{}
	for _, p := range c.peers {
		out[p.route]++
	}
	return out
}

func owner(node string) string { return "node/" + node }

// peerID derives the 40-bit cookie ID of a peer from its name (FNV-1a).
func peerID(name string) uint64 {
	h := fnv.New64a()
	h.Write([]byte(name))
	return h.Sum64() & (1<<40 - 1)
}

// InternalIP returns the Node's first IPv4 InternalIP address, or nil.
func InternalIP(n *corev1.Node) net.IP {
	for _, a := range n.Status.Addresses {
		if a.Type == corev1.NodeInternalIP {
			if ip := net.ParseIP(a.Address).To4(); ip != nil {
				return ip
			}
		}
	}
	return nil
}

// FirstIP returns the first host address of an IPv4 network (the gateway).
func FirstIP(n *net.IPNet) net.IP {
	ip := make(net.IP, 4)
	copy(ip, n.IP.To4())
	ip[3]++
	return ip
}
