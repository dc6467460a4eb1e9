// Package noderoute connects this Node to its peers: for every other Node
// with a podCIDR it installs the OVS flows that send traffic for that
// podCIDR through the tunnel to the peer's InternalIP, a host route for the
// podCIDR via the gateway interface, and the peer's IP in the SNAT
// exemption set; all three are removed when the Node goes away. With the
// userspace datapath it also keeps OVS's tunnel neighbor cache filled for
// every peer (see tunnel.Neighbors), so no first packet is dropped.
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
)

// FlowSetter installs the flows of one owner (see datapath/flowsync).
type FlowSetter interface {
	Set(ctx context.Context, owner string, flows []of.Flow) error
}

// NodeIPSet is the SNAT exemption set of Node IPs (see node/snat).
type NodeIPSet interface {
	SetNodeIP(node string, ip net.IP)
	Sync(ctx context.Context) error
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

// Config wires the controller to this Node's datapath.
type Config struct {
	NodeName string
	// Gateway is the name of the gateway interface; host routes to peer
	// podCIDRs point at it.
	Gateway string
	Bridge  pipeline.Bridge
	Flows   FlowSetter
	SNAT    NodeIPSet
	// Neighbors, when set (userspace datapath), is told about every peer.
	Neighbors NeighborCache
	// Tunnel, when set, is told about every peer before its flows and
	// after their removal.
	Tunnel PeerTunnel
}

type peer struct {
	podCIDR *net.IPNet
	nodeIP  net.IP
}

// Controller reconciles peer Nodes.
type Controller struct {
	cfg    Config
	lister corelisters.NodeLister
	synced cache.InformerSynced
	queue  workqueue.TypedRateLimitingInterface[string]
	// neighQueue holds the peers whose tunnel neighbor to resolve.
	neighQueue workqueue.TypedInterface[string]
	log        *zap.Logger

	mu    sync.Mutex
	peers map[string]peer // installed state by Node name
}

// New returns a controller fed by the Node informer.
func New(informer coreinformers.NodeInformer, cfg Config, log *zap.Logger) (*Controller, error) {
	c := &Controller{
		cfg:    cfg,
		lister: informer.Lister(),
		synced: informer.Informer().HasSynced,
		queue: workqueue.NewTypedRateLimitingQueueWithConfig(
			workqueue.DefaultTypedControllerRateLimiter[string](),
			workqueue.TypedRateLimitingQueueConfig[string]{Name: "noderoute"}),
		neighQueue: workqueue.NewTypedWithConfig(workqueue.TypedQueueConfig[string]{Name: "noderoute-neighbors"}),
		log:        log,
		peers:      map[string]peer{},
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

// Run processes Node changes until ctx ends. After the informer has synced
// it removes host routes through the gateway that belong to no Node (left
// by an earlier run).
func (c *Controller) Run(ctx context.Context) error {
	defer c.queue.ShutDown()
	defer c.neighQueue.ShutDown()
	if !cache.WaitForCacheSync(ctx.Done(), c.synced) {
		return fmt.Errorf("waiting for the Node informer: %w", ctx.Err())
	}
	nodes, err := c.lister.List(labels.Everything())
	if err != nil {
		return err
	}
	for _, n := range nodes {
		c.queue.Add(n.Name)
	}
	go wait.UntilWithContext(ctx, c.worker, time.Second)
	if c.cfg.Neighbors != nil {
		for i := 0; i < neighborWorkers; i++ {
			go c.neighborWorker(ctx)
		}
		go wait.UntilWithContext(ctx, c.refreshNeighbors, neighborRefresh)
	}
	// Give the initial sync a moment to install every known peer, then drop
	// stale routes.
	go func() {
		if err := wait.PollUntilContextCancel(ctx, 200*time.Millisecond, true, func(context.Context) (bool, error) {
			return c.queue.Len() == 0, nil
		}); err == nil {
			if err := c.removeStaleRoutes(); err != nil {
				c.log.Warn("removing stale routes", zap.Error(err))
			}
			if err := c.removeStaleTunnelPeers(); err != nil {
				c.log.Warn("removing stale tunnel peers", zap.Error(err))
			}
		}
	}()
	<-ctx.Done()
	return nil
}

func (c *Controller) worker(ctx context.Context) {
	for c.processNext(ctx) {
	}
}

func (c *Controller) processNext(ctx context.Context) bool {
	name, quit := c.queue.Get()
	if quit {
		return false
	}
	defer c.queue.Done(name)
	if err := c.sync(ctx, name); err != nil {
		c.log.Warn("syncing peer Node", zap.String("node", name), zap.Error(err))
		c.queue.AddRateLimited(name)
		return true
	}
	c.queue.Forget(name)
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
		c.cfg.SNAT.SetNodeIP(name, nodeIP)
		return c.cfg.SNAT.Sync(ctx)
	}
	_, podCIDR, err := net.ParseCIDR(node.Spec.PodCIDR)
	if err != nil || nodeIP == nil || podCIDR.IP.To4() == nil {
		// Not ready to be a peer (no podCIDR or address yet): remove
		// anything installed for an older version of it.
		return c.removePeer(ctx, name)
	}
	gw := FirstIP(podCIDR)
	c.mu.Lock()
	old, had := c.peers[name]
	c.mu.Unlock()
	if c.cfg.Tunnel != nil {
		if err := c.cfg.Tunnel.AddPeer(nodeIP); err != nil {
			return err
		}
	}
	flows := pipeline.PeerNodeFlows(c.cfg.Bridge, pipeline.PeerNode{
		ID: peerID(name), PodCIDR: podCIDR, NodeIP: nodeIP, GatewayIP: gw,
	})
	if err := c.cfg.Flows.Set(ctx, owner(name), flows); err != nil {
		return err
	}
	if had && c.cfg.Tunnel != nil && !old.nodeIP.Equal(nodeIP) {
		if err := c.cfg.Tunnel.RemovePeer(old.nodeIP); err != nil {
			return err
		}
	}
	if had && old.podCIDR.String() != podCIDR.String() {
		if err := c.deleteRoute(old.podCIDR); err != nil {
			return err
		}
	}
	if err := c.ensureRoute(podCIDR, gw); err != nil {
		return err
	}
	c.mu.Lock()
	c.peers[name] = peer{podCIDR: podCIDR, nodeIP: nodeIP}
	c.mu.Unlock()
	if c.cfg.Neighbors != nil && (!had || !old.nodeIP.Equal(nodeIP)) {
		// Queued now: a retry of this sync finds the peer already known.
		c.neighQueue.Add(name)
	}
	c.cfg.SNAT.SetNodeIP(name, nodeIP)
	if err := c.cfg.SNAT.Sync(ctx); err != nil {
		return err
	}
	if !had {
		c.log.Info("peer Node connected", zap.String("node", name),
			zap.String("pod_cidr", podCIDR.String()), zap.String("node_ip", nodeIP.String()))
	}
	return nil
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
		if ok {
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
		if err := c.deleteRoute(old.podCIDR); err != nil {
			return err
		}
		if c.cfg.Tunnel != nil {
			if err := c.cfg.Tunnel.RemovePeer(old.nodeIP); err != nil {
				return err
			}
		}
		c.log.Info("peer Node removed", zap.String("node", name), zap.String("pod_cidr", old.podCIDR.String()))
	}
	c.mu.Lock()
	delete(c.peers, name)
	c.mu.Unlock()
	c.cfg.SNAT.SetNodeIP(name, nil)
	return c.cfg.SNAT.Sync(ctx)
}

// ensureRoute installs "podCIDR via gw dev <gateway> onlink": the gateway
// IP is answered by the bridge's ARP responder with the virtual MAC, and the
// bridge's L3 forwarding sends the packet through the tunnel.
func (c *Controller) ensureRoute(podCIDR *net.IPNet, gw net.IP) error {
	link, err := netlink.LinkByName(c.cfg.Gateway)
	if err != nil {
		return fmt.Errorf("gateway interface %s: %w", c.cfg.Gateway, err)
	}
	r := &netlink.Route{LinkIndex: link.Attrs().Index, Dst: podCIDR, Gw: gw, Flags: int(netlink.FLAG_ONLINK)}
	if err := netlink.RouteReplace(r); err != nil {
		return fmt.Errorf("route %s via %s: %w", podCIDR, gw, err)
	}
	return nil
}

func (c *Controller) deleteRoute(podCIDR *net.IPNet) error {
	link, err := netlink.LinkByName(c.cfg.Gateway)
	if err != nil {
		return fmt.Errorf("gateway interface %s: %w", c.cfg.Gateway, err)
	}
	err = netlink.RouteDel(&netlink.Route{LinkIndex: link.Attrs().Index, Dst: podCIDR})
	if err != nil && !errors.Is(err, syscall.ESRCH) {
		return fmt.Errorf("deleting route %s: %w", podCIDR, err)
	}
	return nil
}

// removeStaleRoutes deletes gateway routes (with a next hop) to networks
// that are no peer's podCIDR, leaving the Service proxy's routes (next hop
// pipeline.NodePortVIP) alone.
func (c *Controller) removeStaleRoutes() error {
	link, err := netlink.LinkByName(c.cfg.Gateway)
	if err != nil {
		return err
	}
	routes, err := netlink.RouteList(link, netlink.FAMILY_V4)
	if err != nil {
		return err
	}
	c.mu.Lock()
	want := map[string]bool{}
	for _, p := range c.peers {
		want[p.podCIDR.String()] = true
	}
	c.mu.Unlock()
	for _, r := range routes {
		if r.Dst == nil || r.Gw == nil || want[r.Dst.String()] || r.Gw.Equal(pipeline.NodePortVIP) {
			continue
		}
		if err := netlink.RouteDel(&r); err != nil && !errors.Is(err, syscall.ESRCH) {
			return err
		}
		c.log.Info("removed stale route", zap.String("dst", r.Dst.String()))
	}
	return nil
}

// removeStaleTunnelPeers removes the tunnel device's entries of Node IPs
// that are no peer's.
func (c *Controller) removeStaleTunnelPeers() error {
	if c.cfg.Tunnel == nil {
		return nil
	}
	ips, err := c.cfg.Tunnel.Peers()
	if err != nil {
		return err
	}
	c.mu.Lock()
	want := map[string]bool{}
	for _, p := range c.peers {
		want[p.nodeIP.String()] = true
	}
	c.mu.Unlock()
	for _, ip := range ips {
		if want[ip.String()] {
			continue
		}
		if err := c.cfg.Tunnel.RemovePeer(ip); err != nil {
			return err
		}
		c.log.Info("removed stale tunnel peer", zap.String("node_ip", ip.String()))
	}
	return nil
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
