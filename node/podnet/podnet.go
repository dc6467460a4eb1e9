// Package podnet attaches Pods to the integration bridge: it is the
// daemon's CNI backend (node/cni/server.Backend). ADD allocates the Pod's
// IP, creates the veth pair, configures the Pod's end (address, default
// route, MTU), attaches the host end to OVS with external_ids naming the
// Pod, and installs the Pod's flows; every step is undone if a later one
// fails. DEL undoes all of it and succeeds when there is nothing to undo.
//
// The backend remembers the Pods it attached (and restored) so that
// SetIsolation can re-install a Pod's flows with its NetworkPolicy
// isolation (pipeline.Pod IngressIsolated / EgressIsolated).
package podnet

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"maps"
	"net"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"

	"github.com/containernetworking/cni/pkg/types"
	current "github.com/containernetworking/cni/pkg/types/100"
	"github.com/containernetworking/plugins/pkg/ns"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/vishvananda/netlink"
	"go.uber.org/zap"

	"github.com/seine-net/seine/datapath/offload"
	of "github.com/seine-net/seine/datapath/openflow"
	"github.com/seine-net/seine/datapath/ovsdb"
	"github.com/seine-net/seine/datapath/pipeline"
	"github.com/seine-net/seine/ipam"
	"github.com/seine-net/seine/node/bandwidth"
	cniserver "github.com/seine-net/seine/node/cni/server"
	"github.com/seine-net/seine/node/hostport"
)

// OVSDB external_ids keys on a Pod's Port and Interface rows.
const (
	ExtIDContainerID  = "seine.io/container-id"
	ExtIDIfName       = "seine.io/ifname"
	ExtIDPodName      = "seine.io/pod-name"
	ExtIDPodNamespace = "seine.io/pod-namespace"
	ExtIDIP           = "seine.io/ip"
	ExtIDMAC          = "seine.io/mac"
	// ExtIDNetwork records the CNI network name (the configuration's
	// "name") the attachment was made for: a GC collects only its own
	// network's attachments (CNI spec 1.1, "GC"). Ports made before it
	// was recorded have none, and count as any network's.
	ExtIDNetwork = "seine.io/network"
	// ExtIDIsolation records the Pod's NetworkPolicy isolation ("",
	// "ingress", "egress" or "ingress,egress"), so a restarted daemon
	// reinstalls the Pod's flows with it and never opens a window without
	// default deny.
	ExtIDIsolation = "seine.io/isolation"
	// ExtIDIngressBandwidth records the shaping of traffic into the Pod
	// ("<rate>/<burst>", bits/s and bits): ovs-vswitchd resets the root
	// qdisc of every port it adds, at its own start too, so the daemon
	// shapes the host veth again after either restart.
	ExtIDIngressBandwidth = "seine.io/ingress-bandwidth"
	// ExtIDEgressBandwidth records the limit of traffic out of the Pod
	// ("<rate>/<burst>", bits/s and bits), and ExtIDEgressMeter the id of
	// the OpenFlow meter behind it, which a restarted daemon puts back.
	ExtIDEgressBandwidth = "seine.io/egress-bandwidth"
	ExtIDEgressMeter     = "seine.io/egress-meter"
)

// Ports is the OVSDB part the backend needs.
type Ports interface {
	EnsurePort(ctx context.Context, bridge string, spec ovsdb.PortSpec) (ovsdb.Port, error)
	SetPortExternalIDs(ctx context.Context, name string, ids map[string]string) error
	GetPort(ctx context.Context, name string) (*ovsdb.Port, error)
	DeletePort(ctx context.Context, bridge, name string) error
	ListPorts(ctx context.Context, bridge string) ([]ovsdb.Port, error)
}

// Meters adds and removes the OpenFlow meters behind Pods' egress limits
// (datapath/openflow.Client).
type Meters interface {
	EnsureMeter(ctx context.Context, m of.MeterEntry) error
	DeleteMeter(ctx context.Context, id uint32) error
	MeterStats(ctx context.Context) ([]of.MeterStats, error)
}

// Flows is the flow store the backend needs (datapath/flowsync.Syncer).
type Flows interface {
	Set(ctx context.Context, owner string, flows []of.Flow) error
	Has(owner string) bool
}

// PolicyHook lets NetworkPolicy enforcement follow the Pods of this Node
// (implemented by an adapter over policy/agent). All methods must be safe
// for concurrent use.
type PolicyHook interface {
	// PodAttached reports a Pod's port, so the Pod's policies can match it;
	// restored marks a Pod found attached at start-up (or an earlier
	// attachment of the Pod that is current again). PodAttached and
	// PodDetached are called with the Backend's record lock held, in the
	// order the attachments change, and must not call back into it.
	PodAttached(namespace, name string, ofport uint32, ip net.IP, restored bool)
	// PodDetached reports that the Pod's port is gone.
	PodDetached(namespace, name string)
	// WaitRealized blocks until the Pod's policies are enforced, or fails
	// naming why not (uid may be empty when the runtime did not pass
	// K8S_POD_UID).
	WaitRealized(ctx context.Context, namespace, name, uid string) error
}

// Config describes this Node's bridge.
type Config struct {
	BridgeName string
	Bridge     pipeline.Bridge // gateway, podCIDR, round
	// MTU is the Pod interface's MTU in bytes (both veth ends).
	MTU int
	// RouteMTU, when set and below MTU, is the MTU in bytes of the Pod's
	// routes through the gateway: its default route and the one to the
	// gateway's own address. Packets for the Pods of the Node (the
	// podCIDR, on the interface) may use MTU; everything else may cross a
	// tunnel (see node/agent's podMTUs). A network configuration's mtu
	// overrides both.
	RouteMTU int
	// DisableTxChecksum turns off transmit checksum (and so segmentation)
	// offload on both veth ends. Set with the userspace datapath when
	// ovs-vswitchd runs without userspace TSO: it then reads Pod packets
	// through AF_PACKET without the virtio-net header that marks a partial
	// checksum, and forwards them uncompleted, so the receiver would drop
	// them (see datapath/offload).
	DisableTxChecksum bool
	// Policy, when set, is told about Pods, and an ADD returns only once
	// the Pod's NetworkPolicies are enforced.
	Policy PolicyHook
	// Chained (trafficEncapMode networkPolicyOnly): a primary CNI plugin
	// runs before seine and owns the Pod's address and interface; ADD
	// attaches that interface (see chained.go) and there is no IPAM.
	Chained bool
	// Gateway is the gateway interface, where chained Pods' host routes
	// move.
	Gateway string
	// NodeIP is the source address of those routes.
	NodeIP net.IP
	// Metrics, when set, receives seine_cni_add_step_duration_seconds
	// (see Steps) and seine_pod_egress_meter_dropped_packets_total (see
	// meterCollector).
	Metrics prometheus.Registerer
	// HostPorts, when set, serves the portMappings capability (the
	// Pods' hostPorts; see node/hostport). Without it, an ADD that
	// carries port mappings is refused.
	HostPorts HostPortMapper
	// Meters, when set, backs up each Pod's egress limit with an OpenFlow
	// meter on its port (see node/bandwidth and meters.go). Without it (a
	// datapath without meters, or chained) the Pod's own qdisc is the
	// only limit.
	Meters Meters
}

// HostPortMapper maps host ports to Pods (node/hostport's Mapper). Owners
// are the attachments' flow owners ("pod/<containerID>/<ifName>").
type HostPortMapper interface {
	// Map adds owner's mappings to the Pod at podIP.
	Map(ctx context.Context, owner string, podIP net.IP, mappings []hostport.Mapping) error
	// Unmap removes owner's mappings; an owner without any costs nothing.
	Unmap(ctx context.Context, owner string) error
	// Owners lists the owners that have mappings.
	Owners() []string
}

// Backend implements the CNI commands on this Node.
type Backend struct {
	cfg      Config
	ipam     *ipam.Allocator
	ports    Ports
	flows    Flows
	log      *zap.Logger
	steps    *prometheus.HistogramVec
	ofports  *ofportPool
	meterTab *meterTable

	mu    sync.Mutex
	ready bool

	// podMu guards pods; it is never held across a call to OVS.
	podMu sync.Mutex
	pods  map[string][]podRecord // "namespace/name" → attachments, see remember
}

func isolationValue(p pipeline.Pod) string {
	switch {
	case p.IngressIsolated && p.EgressIsolated:
		return "ingress,egress"
	case p.IngressIsolated:
		return "ingress"
	case p.EgressIsolated:
		return "egress"
	}
	return ""
}

// New returns the backend. It is not ready (STATUS fails, ADD refuses)
// until MarkReady. alloc is nil with cfg.Chained.
func New(cfg Config, alloc *ipam.Allocator, ports Ports, flows Flows, log *zap.Logger) *Backend {
	b := &Backend{cfg: cfg, ipam: alloc, ports: ports, flows: flows, log: log, pods: map[string][]podRecord{},
		steps: newStepHistogram(cfg.Metrics), ofports: newOFPortPool(), meterTab: newMeterTable()}
	if cfg.Metrics != nil {
		// A second backend on one registry (tests) keeps the first's.
		_ = cfg.Metrics.Register(newMeterCollector(b))
	}
	return b
}

// SetIsolation applies a Pod's NetworkPolicy isolation (the directions some
// policy selecting it isolates it for, as policy/agent computes them) by
// re-installing its flows: only its Classifier and L2Forwarding flows
// change (pipeline.PodFlows), and flowsync sends only those. A Pod this
// backend has no attachment of is ignored (it was detached meanwhile, or
// its name was not known). It fails only when the switch rejects the
// flows of a Pod still attached, naming the Pod. Calls for different Pods may run concurrently
// (and share bundles); calls for one Pod must not overlap.
//
// No lock is held while the flows travel: if a DEL (or a new attachment)
// takes the record away meanwhile, the flows just installed for the old
// attachment are removed again, so nothing outlives a DEL.
func (b *Backend) SetIsolation(ctx context.Context, namespace, name string, ingress, egress bool) error {
	key := namespace + "/" + name
	r, ok := b.current(key)
	if !ok {
		b.log.Debug("isolation for a Pod not attached here ignored", zap.String("pod", key))
		return nil
	}
	if r.pod.IngressIsolated == ingress && r.pod.EgressIsolated == egress {
		return nil
	}
	p := r.pod
	p.IngressIsolated, p.EgressIsolated = ingress, egress
	err := b.flows.Set(ctx, r.owner, pipeline.PodFlows(b.cfg.Bridge, p))
	if err == nil && b.updatePod(key, r.owner, p) {
		if r.port != "" {
			if err := b.ports.SetPortExternalIDs(ctx, r.port, map[string]string{ExtIDIsolation: isolationValue(p)}); err != nil {
				b.log.Warn("recording isolation in OVSDB", zap.String("pod", key), zap.Error(err))
			}
		}
		b.log.Info("Pod isolation changed", zap.String("pod", key), zap.Bool("ingress", ingress), zap.Bool("egress", egress))
		return nil
	}
	if err != nil && b.recorded(key, r.owner) {
		return fmt.Errorf("isolation of pod %s: %w", key, err)
	}
	// Detached while the flows travelled: its DEL may have removed the
	// flows before this call put them back, or removed the egress meter
	// they go through, so that the switch refused them. Either way the
	// Pod is gone and nothing of it may stay.
	if err := b.flows.Set(context.WithoutCancel(ctx), r.owner, nil); err != nil {
		return fmt.Errorf("removing the flows of pod %s, detached meanwhile: %w", key, err)
	}
	b.log.Debug("isolation for a Pod detached meanwhile dropped", zap.String("pod", key))
	return nil
}

// MarkReady lets ADDs in; the daemon calls it once the bridge, pipeline and
// existing Pods are programmed.
func (b *Backend) MarkReady() {
	b.mu.Lock()
	b.ready = true
	b.mu.Unlock()
}

func (b *Backend) isReady() bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.ready
}

// HostVethName is the name of the host end of an attachment's veth: "sv"
// and 13 hex digits of SHA-256(containerID/ifName), 15 bytes (IFNAMSIZ-1).
func HostVethName(containerID, ifName string) string {
	h := sha256.Sum256([]byte(containerID + "/" + ifName))
	return "sv" + hex.EncodeToString(h[:])[:13]
}

func owner(containerID, ifName string) string { return "pod/" + containerID + "/" + ifName }

// Status reports readiness (CNI spec 1.1, STATUS).
func (b *Backend) Status(context.Context) error {
	if !b.isReady() {
		return cniserver.Errorf(types.ErrPluginNotAvailable, "seine daemon is starting: bridge not programmed yet")
	}
	return nil
}

// Add attaches a Pod (CNI spec, "ADD").
func (b *Backend) Add(ctx context.Context, req *cniserver.Request) (_ *current.Result, retErr error) {
	if !b.isReady() {
		return nil, cniserver.Errorf(types.ErrTryAgainLater, "seine daemon is starting: bridge not programmed yet")
	}
	if req.IfName == "" || len(req.IfName) > 15 {
		return nil, cniserver.Errorf(types.ErrInvalidEnvironmentVariables, "CNI_IFNAME %q is not a valid interface name", req.IfName)
	}
	if err := b.refuseAttached(ctx, req); err != nil {
		return nil, err
	}
	if b.cfg.Chained {
		return b.addChained(ctx, req)
	}
	mappings, limits, err := b.runtimeConfig(req)
	if err != nil {
		return nil, err
	}
	var prev *current.Result
	if req.NetConf != nil && req.NetConf.PrevResult != nil {
		if prev, err = current.NewResultFromResult(req.NetConf.PrevResult); err != nil {
			return nil, cniserver.Errorf(types.ErrInvalidNetworkConfig, "prevResult: %w", err)
		}
	}
	podNS, err := ns.GetNS(req.Netns)
	if err != nil {
		return nil, cniserver.Errorf(types.ErrInvalidEnvironmentVariables, "CNI_NETNS %q: %w", req.Netns, err)
	}
	defer podNS.Close()

	st := newStepTimes()
	var undo rollback
	defer func() {
		if retErr != nil {
			undo.run()
		}
	}()

	// The address is held at once; its write to disk runs while the
	// interface and the port are set up, and the ADD waits for it before
	// anything learns the address.
	podIP, durable, err := b.ipam.Reserve(ipam.Owner{ContainerID: req.ContainerID, IfName: req.IfName,
		Network: req.NetConf.Name, Namespace: req.PodNamespace, Pod: req.PodName})
	if err != nil {
		if errors.Is(err, ipam.ErrExhausted) {
			return nil, cniserver.Errorf(cniserver.ErrCodeIPAMExhausted, "allocating an IP for %s/%s: %w", req.PodNamespace, req.PodName, err)
		}
		return nil, cniserver.Errorf(cniserver.ErrCodeInternal, "allocating an IP: %w", err)
	}
	undo.add(func() {
		if undo.flowsStuck {
			b.log.Warn("rollback: keeping the IP while the Pod's flows remain", zap.String("container_id", req.ContainerID),
				zap.Stringer("ip", podIP))
			return
		}
		if err := b.ipam.Release(req.ContainerID, req.IfName); err != nil {
			b.log.Error("rollback: releasing IP", zap.String("container_id", req.ContainerID), zap.Error(err))
		}
	})
	st.done(StepIPAM)

	br := b.cfg.Bridge
	ones, _ := br.PodCIDR.Mask.Size()
	podAddr := &net.IPNet{IP: podIP, Mask: net.CIDRMask(ones, 32)}
	hostName := HostVethName(req.ContainerID, req.IfName)
	mtu, routeMTU := b.cfg.MTU, b.cfg.RouteMTU
	if req.NetConf != nil && req.NetConf.MTU > 0 {
		mtu, routeMTU = req.NetConf.MTU, 0
	}
	if routeMTU >= mtu {
		routeMTU = 0
	}
	routes := gatewayRoutes(br.GatewayIP, routeMTU)

	// The MACs are chosen here, so that the port's flows and external_ids
	// need not wait for the Pod's end to be configured, nor the result
	// for a lookup.
	podMAC, err := randomMAC()
	hostMAC, err2 := randomMAC()
	if err = errors.Join(err, err2); err != nil {
		return nil, cniserver.Errorf(cniserver.ErrCodeInternal, "choosing the veth's MACs: %w", err)
	}
	host, err := createVeth(podNS, hostName, hostMAC, req.IfName, podMAC, mtu)
	if errors.Is(err, syscall.EEXIST) {
		// Perhaps the host end of an attempt that died before its
		// rollback (its Pod end goes with it): remove it and try once
		// more. A clash in the Pod's namespace alone fails again.
		if derr := deleteLink(hostName); derr == nil {
			host, err = createVeth(podNS, hostName, hostMAC, req.IfName, podMAC, mtu)
		}
	}
	if err != nil {
		return nil, cniserver.Errorf(cniserver.ErrCodeDatapath, "configuring the Pod interface: %w", err)
	}
	undo.add(func() {
		if err := deleteLink(hostName); err != nil {
			b.log.Error("rollback: deleting veth", zap.String("veth", hostName), zap.Error(err))
		}
	})
	// Before the host end is a port: ovs-vswitchd may read its offloads
	// when it opens it.
	if b.cfg.DisableTxChecksum {
		if err := offload.DisableTx(hostName); err != nil {
			return nil, cniserver.Errorf(cniserver.ErrCodeDatapath, "%w", err)
		}
	}
	st.done(StepVeth)

	// The Pod's end is configured while the host end becomes a port:
	// ovs-vswitchd can open a port that is still down.
	podEnd := make(chan error, 1)
	go func() {
		podEnd <- b.configurePodEnd(podNS, req.IfName, podAddr, routes, limits.EgressRate, limits.EgressBurst, host)
	}()
	extra := map[string]string{}
	if limits.IngressRate > 0 {
		extra[ExtIDIngressBandwidth] = fmt.Sprintf("%d/%d", limits.IngressRate, limits.IngressBurst)
	}
	if limits.EgressRate > 0 {
		extra[ExtIDEgressBandwidth] = fmt.Sprintf("%d/%d", limits.EgressRate, limits.EgressBurst)
	}
	port, err := b.attach(ctx, req, hostName, podIP, podMAC, limits, extra, &undo, st, durable)
	// Waited for in any case: the rollback must not race it. attach's
	// error comes first: its code may tell the runtime to try again.
	perr := <-podEnd
	if err != nil {
		return nil, err
	}
	if perr != nil {
		return nil, cniserver.Errorf(cniserver.ErrCodeDatapath, "configuring the Pod interface: %w", perr)
	}
	st.done(StepPodInterface)
	// ovs-vswitchd resets the root qdisc of a port it adds: the host
	// end is shaped once it is a port.
	if limits.IngressRate > 0 {
		if err := bandwidth.Shape(hostName, limits.IngressRate, limits.IngressBurst); err != nil {
			return nil, cniserver.Errorf(cniserver.ErrCodeDatapath, "%w", err)
		}
	}
	if len(mappings) > 0 {
		key := owner(req.ContainerID, req.IfName)
		// The last step: a failed Map leaves nothing to undo.
		if err := b.cfg.HostPorts.Map(ctx, key, podIP, mappings); err != nil {
			return nil, cniserver.Errorf(cniserver.ErrCodeDatapath, "%w", err)
		}
		st.done(StepHostPorts)
	}
	st.observe(b.steps)

	b.log.Info("Pod attached", zap.String("pod", req.PodNamespace+"/"+req.PodName),
		zap.String("container_id", req.ContainerID), zap.String("ip", podIP.String()),
		zap.String("port", hostName), zap.Int32("ofport", port.OFPort))

	idx := 1
	return withPrevResult(prev, &current.Result{
		CNIVersion: current.ImplementedSpecVersion,
		Interfaces: []*current.Interface{
			{Name: hostName, Mac: hostMAC.String()},
			{Name: req.IfName, Mac: podMAC.String(), Sandbox: req.Netns},
		},
		IPs:    []*current.IPConfig{{Address: *podAddr, Gateway: br.GatewayIP, Interface: &idx}},
		Routes: routes,
	}), nil
}

// withPrevResult returns ours after what an earlier plugin of the chain
// reported (prev; ours alone when nil): CNI spec, "ADD" and "ADD Success":
// a plugin given a prevResult passes it through with its own changes
// added, so that the runtime's result still lists every
// interface, address and route of the attachment. ours's interface
// indices shift by prev's interfaces; prev's DNS is kept, ours has none.
func withPrevResult(prev, ours *current.Result) *current.Result {
	if prev == nil {
		return ours
	}
	out := &current.Result{CNIVersion: ours.CNIVersion, DNS: prev.DNS}
	out.Interfaces = append(slices.Clone(prev.Interfaces), ours.Interfaces...)
	out.IPs = slices.Clone(prev.IPs)
	for _, c := range ours.IPs {
		c := *c
		if c.Interface != nil {
			i := *c.Interface + len(prev.Interfaces)
			c.Interface = &i
		}
		out.IPs = append(out.IPs, &c)
	}
	out.Routes = append(slices.Clone(prev.Routes), ours.Routes...)
	return out
}

// refuseAttached fails with CNI error 4 when the container's interface is
// attached already: its Pod port is on the bridge. CNI spec, "ADD": a
// runtime should not add the same (CNI_CONTAINERID, CNI_IFNAME) twice
// without a DEL between, and a plugin must fail when the interface exists
// in the container. Refused before anything is touched, so that the
// failed ADD's rollback cannot take the live attachment's address, port,
// veth or flows with it. An address held without a port (kept by a
// rollback that could not remove its flows) is no attachment: the ADD
// goes on and uses it.
func (b *Backend) refuseAttached(ctx context.Context, req *cniserver.Request) error {
	var port *ovsdb.Port
	var err error
	if b.cfg.Chained {
		port, err = b.chainedPort(ctx, req.ContainerID, req.IfName)
	} else {
		port, err = b.ports.GetPort(ctx, HostVethName(req.ContainerID, req.IfName))
	}
	if err != nil {
		return cniserver.Errorf(cniserver.ErrCodeDatapath, "looking for an attachment of %s/%s on %s: %w",
			req.ContainerID, req.IfName, b.cfg.BridgeName, err)
	}
	if port == nil {
		return nil
	}
	return cniserver.Errorf(types.ErrInvalidEnvironmentVariables,
		"CNI_CONTAINERID %s already has interface %s (CNI_IFNAME) attached, port %s with IP %s: a second ADD needs a DEL first",
		req.ContainerID, req.IfName, port.Name, port.ExternalIDs[ExtIDIP])
}

// configurePodEnd configures the Pod's end of a new veth pair inside
// podNS (address, routes, checksum offload, egress shaping at rate/burst,
// bits/s and bits, when rate is set) and brings it up, then brings host,
// the host end, up: last, so that it comes up with its carrier, its peer
// being up already.
func (b *Backend) configurePodEnd(podNS ns.NetNS, ifName string, addr *net.IPNet, routes []*types.Route,
	rate, burst uint64, host netlink.Link) error {
	err := podNS.Do(func(ns.NetNS) error {
		link, err := netlink.LinkByName(ifName)
		if err != nil {
			return err
		}
		if err := netlink.AddrAdd(link, &netlink.Addr{IPNet: addr}); err != nil {
			return fmt.Errorf("adding %s to %s: %w", addr, ifName, err)
		}
		if err := netlink.LinkSetUp(link); err != nil {
			return fmt.Errorf("bringing up %s: %w", ifName, err)
		}
		for _, r := range routes {
			nr := &netlink.Route{LinkIndex: link.Attrs().Index, Dst: &r.Dst, Gw: r.GW, MTU: r.MTU}
			if r.Scope != nil {
				nr.Scope = netlink.Scope(*r.Scope)
			}
			if err := netlink.RouteAdd(nr); err != nil {
				return fmt.Errorf("route %s: %w", r, err)
			}
		}
		if b.cfg.DisableTxChecksum {
			if err := offload.DisableTx(ifName); err != nil {
				return err
			}
		}
		if rate > 0 {
			return bandwidth.Shape(ifName, rate, burst)
		}
		return nil
	})
	if err != nil {
		return err
	}
	if err := netlink.LinkSetUp(host); err != nil {
		return fmt.Errorf("bringing up %s: %w", host.Attrs().Name, err)
	}
	return nil
}

// flowsRefused is a restore's failure to install a Pod's flows: the one
// failure that, for every Pod, means the switch itself refuses.
type flowsRefused struct{ err error }

func (e *flowsRefused) Error() string { return "installing its flows: " + e.err.Error() }
func (e *flowsRefused) Unwrap() error { return e.err }

// runtimeConfig returns the port mappings and bandwidth limits the runtime
// passed (CNI conventions: the portMappings and bandwidth capabilities),
// or a CNI error (code 7, invalid network configuration) naming what is
// wrong with them.
func (b *Backend) runtimeConfig(req *cniserver.Request) ([]hostport.Mapping, bandwidth.Limits, error) {
	if req.NetConf == nil {
		return nil, bandwidth.Limits{}, nil
	}
	rc := req.NetConf.RuntimeConfig
	mappings, err := hostport.Parse(rc["portMappings"])
	if err != nil {
		return nil, bandwidth.Limits{}, cniserver.Errorf(types.ErrInvalidNetworkConfig, "%w", err)
	}
	if len(mappings) > 0 && b.cfg.HostPorts == nil {
		return nil, bandwidth.Limits{}, cniserver.Errorf(types.ErrInvalidNetworkConfig,
			"the Pod has hostPorts, which this seine daemon does not serve (chain the portmap plugin)")
	}
	limits, err := bandwidth.Parse(rc["bandwidth"])
	if err != nil {
		return nil, bandwidth.Limits{}, cniserver.Errorf(types.ErrInvalidNetworkConfig, "%w", err)
	}
	return mappings, limits, nil
}

// gatewayRoutes are the routes a Pod gets beside its podCIDR's (which the
// kernel adds with the address): the default route via the gateway and,
// when routeMTU is set, a link route to the gateway's own address, both
// with routeMTU (0: the interface's). The gateway's address is in the
// podCIDR, whose route keeps the interface's larger MTU, hence its own
// route. Returned in the order they are added, as the CNI result lists
// them (CNI spec 1.1, "Routes": mtu).
func gatewayRoutes(gw net.IP, routeMTU int) []*types.Route {
	def := &types.Route{Dst: net.IPNet{IP: net.IPv4zero.To4(), Mask: net.CIDRMask(0, 32)}, GW: gw, MTU: routeMTU}
	if routeMTU == 0 {
		return []*types.Route{def}
	}
	scope := int(netlink.SCOPE_LINK)
	return []*types.Route{{Dst: net.IPNet{IP: gw.To4(), Mask: net.CIDRMask(32, 32)}, MTU: routeMTU, Scope: &scope}, def}
}

// rollback collects the undo steps of an ADD, run in reverse order when it
// fails.
// rollback holds the undo steps of an ADD, run last first.
type rollback struct {
	steps []func()
	// flowsStuck: the Pod's flows could not be removed, so its IP and
	// ofport stay held (no new Pod may get them while stale flows name
	// them); a DEL, or the next daemon start, releases them.
	flowsStuck bool
}

func (r *rollback) add(f func()) { r.steps = append(r.steps, f) }

func (r *rollback) run() {
	for i := len(r.steps) - 1; i >= 0; i-- {
		r.steps[i]()
	}
}

// attach makes hostName a port of the bridge, its external_ids naming the
// Pod (plus extra), installs the Pod's flows, waits for durable (the IP
// allocation on disk; nil when there is none), and hands the Pod to the
// policy hook, waiting until its NetworkPolicies are enforced. Each step
// adds its undo to undo, and its duration to st.
//
// The port gets an OpenFlow number chosen here (ofport_request), so its
// flows are installed while ovs-vswitchd adds the port; a port that ends
// up with another number gets its flows again.
func (b *Backend) attach(ctx context.Context, req *cniserver.Request, hostName string, podIP net.IP, podMAC net.HardwareAddr,
	limits bandwidth.Limits, extra map[string]string, undo *rollback, st *stepTimes, durable func() error) (ovsdb.Port, error) {
	var port ovsdb.Port
	ofport, err := b.ofports.get()
	if err != nil {
		return port, cniserver.Errorf(cniserver.ErrCodeDatapath, "attaching %s: %w", hostName, err)
	}
	held := ofport // the number this attachment holds in b.ofports
	undo.add(func() {
		if !undo.flowsStuck {
			b.ofports.release(held)
		}
	})
	// A new attachment starts isolated for neither direction; the policy
	// agent isolates it (SetIsolation) before WaitRealized returns.
	pod := pipeline.Pod{OFPort: ofport, IP: podIP, MAC: podMAC}
	// The meter comes before the flows that use it, and goes after them
	// (the undo runs backwards). Both travel while the port is made.
	key := owner(req.ContainerID, req.IfName)
	meter := b.planMeter(ctx, key, limits, undo)
	if meter.ID != 0 {
		pod.EgressMeter = meter.ID
		extra[ExtIDEgressMeter] = strconv.FormatUint(uint64(meter.ID), 10)
	}
	flowsDone := make(chan error, 1)
	go func() {
		if meter.ID != 0 {
			if err := b.cfg.Meters.EnsureMeter(ctx, meter); err != nil {
				flowsDone <- fmt.Errorf("adding the egress meter: %w", err)
				return
			}
		}
		flowsDone <- b.flows.Set(ctx, key, pipeline.PodFlows(b.cfg.Bridge, pod))
	}()
	undo.add(func() {
		if err := b.flows.Set(context.WithoutCancel(ctx), key, nil); err != nil {
			undo.flowsStuck = true
			b.log.Error("rollback: removing flows", zap.String("container_id", req.ContainerID), zap.Error(err))
		}
	})
	ids := map[string]string{
		ExtIDContainerID:  req.ContainerID,
		ExtIDIfName:       req.IfName,
		ExtIDPodName:      req.PodName,
		ExtIDPodNamespace: req.PodNamespace,
		ExtIDIP:           podIP.String(),
		ExtIDMAC:          podMAC.String(),
		ExtIDNetwork:      req.NetConf.Name,
	}
	maps.Copy(ids, extra)
	port, err = b.ports.EnsurePort(ovsdb.WithPortTrace(ctx, &st.port), b.cfg.BridgeName,
		ovsdb.PortSpec{Name: hostName, OFPortRequest: int32(ofport), ExternalIDs: ids})
	flowsErr := <-flowsDone // the undo above must not race the first Set
	undo.add(func() {
		if err := b.ports.DeletePort(context.WithoutCancel(ctx), b.cfg.BridgeName, hostName); err != nil {
			b.log.Error("rollback: deleting OVS port", zap.String("port", hostName), zap.Error(err))
		}
	})
	if err != nil {
		return port, cniserver.Errorf(cniserver.ErrCodeDatapath, "attaching %s to %s: %w", hostName, b.cfg.BridgeName, err)
	}
	st.portDone()
	if flowsErr != nil {
		return port, cniserver.Errorf(cniserver.ErrCodeDatapath, "installing Pod flows: %w", flowsErr)
	}
	if got := uint32(port.OFPort); got != ofport {
		b.log.Warn("Pod port got another OpenFlow number than requested; installing its flows again",
			zap.String("port", hostName), zap.Uint32("requested", ofport), zap.Uint32("ofport", got))
		// The number requested stays marked: a port seine does not know
		// of holds it, or ovs-vswitchd would have given it.
		b.ofports.mark(got)
		held = got
		pod.OFPort = got
		if err := b.flows.Set(ctx, key, pipeline.PodFlows(b.cfg.Bridge, pod)); err != nil {
			return port, cniserver.Errorf(cniserver.ErrCodeDatapath, "installing Pod flows: %w", err)
		}
	}
	st.done(StepFlows)
	if durable != nil {
		if err := durable(); err != nil {
			return port, cniserver.Errorf(cniserver.ErrCodeInternal, "persisting the IP allocation: %w", err)
		}
		st.done(StepIPAMSync)
	}
	b.remember(req.PodNamespace, req.PodName, podRecord{owner: key, port: hostName, pod: pod, egressLimited: limits.EgressRate > 0}, false)
	undo.add(func() { b.forget(key) })
	if p := b.cfg.Policy; p != nil && req.PodName != "" {
		if err := p.WaitRealized(ctx, req.PodNamespace, req.PodName, req.PodUID); err != nil {
			return port, cniserver.Errorf(types.ErrTryAgainLater, "NetworkPolicies of %s/%s are not in place yet: %w", req.PodNamespace, req.PodName, err)
		}
		st.done(StepPolicy)
	}
	return port, nil
}

// Del detaches a Pod (CNI spec, "DEL"): flows, OVS port, veth and IP are
// released; whatever is already gone is skipped.
func (b *Backend) Del(ctx context.Context, req *cniserver.Request) error {
	if b.cfg.Chained {
		return b.releaseChained(ctx, req.ContainerID, req.IfName)
	}
	return b.release(ctx, req.ContainerID, req.IfName)
}

// release undoes an attachment as far as it can (CNI spec, "DEL": "to
// the fullest extent possible"): a step that fails does not hold back the
// ones that do not depend on it, since a runtime may never repeat a DEL
// (containerd drops a failed DEL of a sandbox whose ADD failed). Only
// while the Pod's flows could not be removed are its IP and ofport kept,
// so that no new Pod gets them while stale flows still name them; a
// repeated DEL, or the next daemon start, releases them.
func (b *Backend) release(ctx context.Context, containerID, ifName string) error {
	hostName := HostVethName(containerID, ifName)
	key := owner(containerID, ifName)
	var dpErrs []error
	if hp := b.cfg.HostPorts; hp != nil {
		if err := hp.Unmap(ctx, key); err != nil {
			dpErrs = append(dpErrs, err)
		}
	}
	b.forget(key)
	flowsErr := b.flows.Set(ctx, key, nil)
	if flowsErr != nil {
		dpErrs = append(dpErrs, fmt.Errorf("removing Pod flows: %w", flowsErr))
	}
	var ofport uint32
	if p, err := b.ports.GetPort(ctx, hostName); err == nil && p != nil && p.OFPort > 0 {
		ofport = uint32(p.OFPort)
	}
	if flowsErr == nil { // after the flows that used it
		if err := b.deleteMeter(ctx, key); err != nil {
			dpErrs = append(dpErrs, fmt.Errorf("%s: %w", hostName, err))
		}
	}
	if err := b.ports.DeletePort(ctx, b.cfg.BridgeName, hostName); err != nil {
		dpErrs = append(dpErrs, fmt.Errorf("removing OVS port %s: %w", hostName, err))
	} else if ofport != 0 && flowsErr == nil {
		b.ofports.release(ofport)
	}
	if err := deleteLink(hostName); err != nil {
		dpErrs = append(dpErrs, fmt.Errorf("removing veth %s: %w", hostName, err))
	}
	var ipErr error
	if b.ipam != nil && flowsErr == nil {
		if err := b.ipam.Release(containerID, ifName); err != nil {
			ipErr = fmt.Errorf("releasing IP: %w", err)
		}
	}
	if len(dpErrs) > 0 {
		return cniserver.Errorf(cniserver.ErrCodeDatapath, "%w", errors.Join(append(dpErrs, ipErr)...))
	}
	if ipErr != nil {
		return cniserver.Errorf(cniserver.ErrCodeInternal, "%w", ipErr)
	}
	b.log.Info("Pod detached", zap.String("container_id", containerID), zap.String("port", hostName))
	return nil
}

// Check verifies an attachment against prevResult (CNI spec, "CHECK"): the
// Pod interface exists in the netns with the recorded address, and the host
// end exists, is a port of the bridge that ovs-vswitchd opened, and has
// its flows installed.
func (b *Backend) Check(ctx context.Context, req *cniserver.Request, prev *current.Result) error {
	if b.cfg.Chained {
		return b.checkChained(ctx, req, prev)
	}
	if prev == nil {
		return cniserver.Errorf(types.ErrInvalidNetworkConfig, "CHECK needs a prevResult")
	}
	ipAddr, ok := b.ipam.Lookup(req.ContainerID, req.IfName)
	if !ok {
		return cniserver.Errorf(types.ErrUnknownContainer, "container %s has no IP allocated", req.ContainerID)
	}
	found := false
	for _, c := range prev.IPs {
		if c.Address.IP.Equal(ipAddr) {
			found = true
		}
	}
	if !found {
		return cniserver.Errorf(types.ErrInvalidNetworkConfig, "prevResult does not hold the allocated IP %s", ipAddr)
	}
	podNS, err := ns.GetNS(req.Netns)
	if err != nil {
		return cniserver.Errorf(types.ErrInvalidEnvironmentVariables, "CNI_NETNS %q: %w", req.Netns, err)
	}
	defer podNS.Close()
	err = podNS.Do(func(ns.NetNS) error {
		link, err := netlink.LinkByName(req.IfName)
		if err != nil {
			return fmt.Errorf("interface %s: %w", req.IfName, err)
		}
		addrs, err := netlink.AddrList(link, netlink.FAMILY_V4)
		if err != nil {
			return err
		}
		for _, a := range addrs {
			if a.IP.Equal(ipAddr) {
				return nil
			}
		}
		return fmt.Errorf("interface %s lacks %s", req.IfName, ipAddr)
	})
	if err != nil {
		return cniserver.Errorf(cniserver.ErrCodeDatapath, "checking the Pod interface: %w", err)
	}
	hostName := HostVethName(req.ContainerID, req.IfName)
	if _, err := netlink.LinkByName(hostName); err != nil {
		return cniserver.Errorf(cniserver.ErrCodeDatapath, "host veth %s: %w", hostName, err)
	}
	if err := b.checkPort(ctx, hostName); err != nil {
		return err
	}
	if !b.flows.Has(owner(req.ContainerID, req.IfName)) {
		return cniserver.Errorf(cniserver.ErrCodeDatapath, "no flows installed for container %s", req.ContainerID)
	}
	return nil
}

// checkPort returns a CNI error unless hostName is a port of the bridge
// that ovs-vswitchd opened: Interface.ofport is -1 when it could not
// (ovs-vswitchd.conf.db(5), "Interface TABLE").
func (b *Backend) checkPort(ctx context.Context, hostName string) error {
	ports, err := b.ports.ListPorts(ctx, b.cfg.BridgeName)
	if err != nil {
		return cniserver.Errorf(cniserver.ErrCodeDatapath, "listing the ports of %s: %w", b.cfg.BridgeName, err)
	}
	i := slices.IndexFunc(ports, func(p ovsdb.Port) bool { return p.Name == hostName })
	switch {
	case i < 0:
		return cniserver.Errorf(cniserver.ErrCodeDatapath, "host veth %s is not a port of %s", hostName, b.cfg.BridgeName)
	case ports[i].OFPort <= 0:
		return cniserver.Errorf(cniserver.ErrCodeDatapath, "port %s of %s has no OpenFlow port number (ofport %d)",
			hostName, b.cfg.BridgeName, ports[i].OFPort)
	}
	return nil
}

// GC releases every attachment of the request's network that is not in
// valid (CNI spec 1.1, "GC": the valid list names only this network's
// attachments, so another network's are left alone, such as a second
// network of type seine under Multus). Attachments recorded before their
// network was (no ExtIDNetwork, no ipam Owner.Network) count as this
// network's.
func (b *Backend) GC(ctx context.Context, req *cniserver.Request, valid []types.GCAttachment) error {
	network := ""
	if req != nil && req.NetConf != nil {
		network = req.NetConf.Name
	}
	ours := func(recorded string) bool { return recorded == "" || network == "" || recorded == network }
	keep := map[string]bool{}
	for _, a := range valid {
		keep[a.ContainerID+"/"+a.IfName] = true
	}
	var errs []error
	seen := map[string]bool{}
	ports, err := b.ports.ListPorts(ctx, b.cfg.BridgeName)
	if err != nil {
		return cniserver.Errorf(cniserver.ErrCodeDatapath, "listing ports: %w", err)
	}
	for _, p := range ports {
		cid, ifn := p.ExternalIDs[ExtIDContainerID], p.ExternalIDs[ExtIDIfName]
		if cid == "" || keep[cid+"/"+ifn] {
			continue
		}
		if !ours(p.ExternalIDs[ExtIDNetwork]) {
			seen[cid+"/"+ifn] = true // its allocation is not ours either
			continue
		}
		seen[cid+"/"+ifn] = true
		if p.ExternalIDs[ExtIDAttachment] == AttachmentChained {
			errs = append(errs, b.releaseChained(ctx, cid, ifn))
			continue
		}
		errs = append(errs, b.release(ctx, cid, ifn))
	}
	for _, a := range b.allocations() {
		k := a.Owner.ContainerID + "/" + a.Owner.IfName
		if keep[k] || seen[k] {
			continue
		}
		seen[k] = true
		if !ours(a.Owner.Network) {
			continue
		}
		errs = append(errs, b.release(ctx, a.Owner.ContainerID, a.Owner.IfName))
	}
	if hp := b.cfg.HostPorts; hp != nil {
		for _, o := range hp.Owners() {
			if k := strings.TrimPrefix(o, "pod/"); !keep[k] && !seen[k] {
				errs = append(errs, hp.Unmap(ctx, o))
			}
		}
	}
	if err := errors.Join(errs...); err != nil {
		return cniserver.Errorf(cniserver.ErrCodeDatapath, "GC: %w", err)
	}
	return nil
}

// RestorePods reinstalls the flows of every Pod port already on the bridge
// (after a daemon restart the flows of the previous round are still there,
// so traffic keeps flowing while this runs) and releases IPs whose port is
// gone. It returns the number of Pods restored. A Pod that cannot be
// restored is logged (error "Pod not restored", naming its port) and
// skipped; a live Pod whose port has no OpenFlow number keeps its veth,
// port, address and hostPorts until its DEL (a chained one too: it is not
// handed back to its primary CNI's routing, outside its NetworkPolicies).
// The error is ctx's, the bridge's, or, when the
// switch refused the flows of every Pod it tried, those refusals joined.
func (b *Backend) RestorePods(ctx context.Context) (int, error) {
	ports, err := b.ports.ListPorts(ctx, b.cfg.BridgeName)
	if err != nil {
		return 0, err
	}
	for _, p := range ports {
		if p.OFPort > 0 {
			b.ofports.mark(uint32(p.OFPort))
		}
		// Every recorded meter first, those of stale ports too: releasing
		// one deletes its meter only if it holds it.
		if cid := p.ExternalIDs[ExtIDContainerID]; cid != "" {
			b.claimMeter(owner(cid, p.ExternalIDs[ExtIDIfName]), p)
		}
	}
	// Then, where it is free, the ofport for a limit without a recorded
	// meter: the id of the meter the release that used ofports left.
	for _, p := range ports {
		if cid := p.ExternalIDs[ExtIDContainerID]; cid != "" {
			b.claimOFPortMeter(owner(cid, p.ExternalIDs[ExtIDIfName]), p)
		}
	}
	attached := map[string]bool{}
	n := 0
	var failed, flowErrs []error
	fail := func(p ovsdb.Port, cid string, err error) {
		b.log.Error("Pod not restored", zap.String("port", p.Name), zap.String("container_id", cid), zap.Error(err))
		failed = append(failed, fmt.Errorf("port %s: %w", p.Name, err))
	}
	for _, p := range ports {
		cid, ifn := p.ExternalIDs[ExtIDContainerID], p.ExternalIDs[ExtIDIfName]
		if cid == "" {
			continue
		}
		if p.ExternalIDs[ExtIDAttachment] == AttachmentChained {
			ok, err := b.restoreChained(ctx, p)
			switch {
			case err != nil:
				fail(p, cid, err)
				if errors.As(err, new(*flowsRefused)) {
					flowErrs = append(flowErrs, err)
				}
			case ok:
				n++
			}
			continue
		}
		podIP := net.ParseIP(p.ExternalIDs[ExtIDIP]).To4()
		mac, merr := net.ParseMAC(p.ExternalIDs[ExtIDMAC])
		_, lerr := netlink.LinkByName(p.Name)
		if lerr != nil || podIP == nil || merr != nil {
			// The veth is gone (Pod netns deleted while we were down) or the
			// record is unusable: release everything of it.
			b.log.Info("releasing stale Pod port", zap.String("port", p.Name), zap.String("container_id", cid))
			if err := b.release(ctx, cid, ifn); err != nil {
				fail(p, cid, err)
			}
			continue
		}
		if b.ipam != nil {
			if _, ok := b.ipam.Lookup(cid, ifn); !ok {
				// Its ADD stopped before the allocation reached the disk:
				// hold the address again, so it is not handed out twice.
				owner := ipam.Owner{ContainerID: cid, IfName: ifn, Network: p.ExternalIDs[ExtIDNetwork],
					Namespace: p.ExternalIDs[ExtIDPodNamespace], Pod: p.ExternalIDs[ExtIDPodName]}
				if err := b.ipam.Claim(owner, podIP); err != nil {
					b.log.Warn("Pod port without IP allocation", zap.String("port", p.Name), zap.String("ip", podIP.String()), zap.Error(err))
				} else {
					b.log.Info("IP allocation of an attached Pod recorded again", zap.String("port", p.Name), zap.String("ip", podIP.String()))
				}
			}
		}
		if p.OFPort <= 0 {
			// A live Pod whose port ovs-vswitchd has not opened (yet):
			// everything of it stays, for its DEL or the next start.
			attached[cid+"/"+ifn] = true
			fail(p, cid, fmt.Errorf("ovs-vswitchd gives its port no OpenFlow number (ofport %d); its veth, address and hostPorts are kept", p.OFPort))
			continue
		}
		attached[cid+"/"+ifn] = true
		b.reshape(p)
		iso := p.ExternalIDs[ExtIDIsolation]
		pod := pipeline.Pod{OFPort: uint32(p.OFPort), IP: podIP, MAC: mac,
			IngressIsolated: strings.Contains(iso, "ingress"), EgressIsolated: strings.Contains(iso, "egress")}
		// A meter that cannot be put back leaves the Pod's own qdisc as
		// its only limit, rather than the Pod without flows.
		pod.EgressMeter = b.restoreMeter(ctx, owner(cid, ifn), p.Name)
		if pod.EgressMeter == 0 {
			pod.EgressMeter = b.meterUnrecorded(ctx, owner(cid, ifn), p)
		}
		if pod.EgressMeter != 0 && p.ExternalIDs[ExtIDEgressMeter] == "" {
			b.recordMeter(ctx, p.Name, pod.EgressMeter)
		}
		flows := pipeline.PodFlows(b.cfg.Bridge, pod)
		if err := b.flows.Set(ctx, owner(cid, ifn), flows); err != nil {
			err = &flowsRefused{err}
			fail(p, cid, err)
			flowErrs = append(flowErrs, err)
			continue
		}
		b.remember(p.ExternalIDs[ExtIDPodNamespace], p.ExternalIDs[ExtIDPodName],
			podRecord{owner: owner(cid, ifn), port: p.Name, pod: pod, egressLimited: p.ExternalIDs[ExtIDEgressBandwidth] != ""}, true)
		n++
	}
	if hp := b.cfg.HostPorts; hp != nil {
		for _, o := range hp.Owners() {
			if !attached[strings.TrimPrefix(o, "pod/")] {
				b.log.Info("removing hostPorts of a Pod that is no longer attached", zap.String("owner", o))
				if err := hp.Unmap(ctx, o); err != nil {
					b.log.Error("hostPorts of a Pod no longer attached not removed", zap.String("owner", o), zap.Error(err))
					failed = append(failed, err)
				}
			}
		}
	}
	for _, a := range b.allocations() {
		if !attached[a.Owner.ContainerID+"/"+a.Owner.IfName] {
			b.log.Info("releasing IP of a Pod that is no longer attached", zap.String("ip", a.IP.String()),
				zap.String("container_id", a.Owner.ContainerID))
			if err := b.ipam.Release(a.Owner.ContainerID, a.Owner.IfName); err != nil {
				b.log.Error("IP of a Pod no longer attached not released", zap.String("ip", a.IP.String()), zap.Error(err))
				failed = append(failed, err)
			}
		}
	}
	// A failure every Pod shares (the switch refusing every Pod's flows,
	// the start cancelled) fails the start, to be tried again; failures
	// of single Pods are logged above and do not keep the Node's other
	// Pods from being served.
	if err := ctx.Err(); err != nil {
		return n, err
	}
	if len(flowErrs) > 0 && n == 0 {
		return n, fmt.Errorf("the flows of no Pod could be installed: %w", errors.Join(flowErrs...))
	}
	if len(failed) > 0 {
		b.log.Error("some attached Pods were not restored; see the errors above", zap.Int("failed", len(failed)), zap.Int("restored", n))
	}
	return n, nil
}

// ReshapePods shapes again the traffic into every Pod that has an ingress
// rate: run it after ovs-vswitchd restarts, which resets the root qdisc of
// each port it adds.
func (b *Backend) ReshapePods(ctx context.Context) error {
	ports, err := b.ports.ListPorts(ctx, b.cfg.BridgeName)
	if err != nil {
		return fmt.Errorf("listing ports to shape: %w", err)
	}
	for _, p := range ports {
		b.reshape(p)
	}
	return nil
}

// reshape puts back the ingress shaping p's external_ids record; a
// failure is logged, as the Pod's traffic flows anyway.
func (b *Backend) reshape(p ovsdb.Port) {
	v := p.ExternalIDs[ExtIDIngressBandwidth]
	if v == "" {
		return
	}
	var rate, burst uint64
	if _, err := fmt.Sscanf(v, "%d/%d", &rate, &burst); err != nil || rate == 0 {
		b.log.Warn("unreadable ingress bandwidth on a Pod port", zap.String("port", p.Name), zap.String("value", v))
		return
	}
	if err := bandwidth.Shape(p.Name, rate, burst); err != nil {
		b.log.Error("shaping traffic into a Pod again", zap.String("port", p.Name), zap.Error(err))
	}
}

// allocations lists the IPAM allocations (none without IPAM).
func (b *Backend) allocations() []ipam.Allocation {
	if b.ipam == nil {
		return nil
	}
	return b.ipam.List()
}

func deleteLink(name string) error {
	link, err := netlink.LinkByName(name)
	if err != nil {
		var nf netlink.LinkNotFoundError
		if errors.As(err, &nf) {
			return nil
		}
		return err
	}
	return netlink.LinkDel(link)
}
