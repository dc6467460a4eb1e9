package agent

import (
	"context"
	"errors"
	"fmt"
	"net"
	"strconv"
	"time"

	"github.com/vishvananda/netlink"
	"go.uber.org/zap"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"sigs.k8s.io/knftables"

	"github.com/seine-net/seine/datapath/offload"
	"github.com/seine-net/seine/datapath/ovsdb"
	"github.com/seine-net/seine/datapath/pipeline"
	"github.com/seine-net/seine/datapath/rxbuf"
	opsv1alpha1 "github.com/seine-net/seine/node/apis/ops/v1alpha1"
	opsclient "github.com/seine-net/seine/node/client/clientset/versioned"
	"github.com/seine-net/seine/node/config"
	"github.com/seine-net/seine/node/info"
	"github.com/seine-net/seine/node/noderoute"
	"github.com/seine-net/seine/tunnel"
)

// nftTunnelTable is the nftables table (netdev family) whose ingress drop
// keeps the kernel VXLAN device's packets OVS's alone (tunnel.KernelVXLAN).
const nftTunnelTable = "seine-tunnel"

// userspaceDatapath reports whether cfg runs OVS's netdev datapath.
func userspaceDatapath(cfg config.Config) bool { return cfg.OVSDatapathType == config.DatapathNetdev }

// setUserspaceTSO records the desired userspace TSO setting in OVSDB (read
// by ovs-vswitchd at its next start).
func setUserspaceTSO(ctx context.Context, cfg config.Config, ovs *ovsdb.Client, log *zap.Logger) error {
	want := strconv.FormatBool(cfg.UserspaceTSOEnabled())
	oc, err := ovs.SystemOtherConfig(ctx)
	if err != nil {
		return err
	}
	if oc[offload.OtherConfigUserspaceTSO] == want {
		return nil
	}
	if err := ovs.SetSystemOtherConfig(ctx, map[string]string{offload.OtherConfigUserspaceTSO: want}); err != nil {
		return fmt.Errorf("setting other_config:%s: %w", offload.OtherConfigUserspaceTSO, err)
	}
	log.Info("userspace TSO setting written; ovs-vswitchd applies it when it next starts",
		zap.String(offload.OtherConfigUserspaceTSO, want))
	return nil
}

// EnsureNetdevReceiveBuffer raises the host's net.core.rmem_default to
// cfg's netdevReceiveBuffer with the netdev datapath (datapath/rxbuf says
// why). A failure is logged, not returned: it costs throughput, not
// correctness, and a daemon in a network namespace other than the host's
// (the sandbox's Nodes) cannot write the setting, which its host keeps.
func EnsureNetdevReceiveBuffer(cfg config.Config, log *zap.Logger) {
	min := cfg.NetdevReceiveBufferMin()
	if min == 0 {
		return
	}
	before, raised, err := rxbuf.Ensure(min)
	switch {
	case err != nil:
		log.Warn("net.core.rmem_default stays below netdevReceiveBuffer: ovs-vswitchd's port sockets drop packets under load (TCP retransmits); raise it on the host",
			zap.Int("rmem_default", before), zap.Int("netdev_receive_buffer", min), zap.Error(err))
	case raised:
		log.Info("raised net.core.rmem_default for ovs-vswitchd's port sockets; ports it opened before keep their buffer until it restarts",
			zap.Int("rmem_default_before", before), zap.Int("rmem_default", min))
	}
}

// tunnelPort creates the tunnel port on the integration bridge when the
// mode tunnels: OVS's flow-based tunnel port, or a kernel VXLAN device
// attached as an ordinary port. Switching kinds keeps the port's name and
// ofport; a kernel device left by the other kind is deleted once the OVS
// port replaced it. When the mode does not tunnel, it removes both and
// returns ofport 0. The kernel device, when it is the port, is returned
// for the route controller (its peers).
func tunnelPort(ctx context.Context, cfg config.Config, kind tunnel.Kind, ovs *ovsdb.Client, nodeIP net.IP, mtu int) (uint32, *tunnel.KernelVXLAN, error) {
	kernel := tunnel.KernelVXLAN{Name: cfg.TunnelName}
	var nft knftables.Interface
	if userspaceDatapath(cfg) {
		var err error
		if nft, err = knftables.New(knftables.NetDevFamily, nftTunnelTable); err != nil {
			return 0, nil, fmt.Errorf("nftables: %w", err)
		}
	}
	if !cfg.TrafficEncapMode.UsesTunnel() {
		if err := ovs.DeletePort(ctx, cfg.BridgeName, cfg.TunnelName); err != nil {
			return 0, nil, fmt.Errorf("removing tunnel port %s: %w", cfg.TunnelName, err)
		}
		if nft != nil {
			if err := kernel.Remove(ctx, nft); err != nil {
				return 0, nil, err
			}
		}
		return 0, nil, nil
	}
	// A port changing kind is removed and added again: ovs-vswitchd 3.1
	// changes an interface's type in place, but keeps state of the old
	// netdev (its sends to a kernel VXLAN device that replaced a userspace
	// GRE port of the same name failed with EMSGSIZE).
	wantType := cfg.TunnelType
	if kind == tunnel.KindKernelDevice {
		wantType = ovsdb.TypeSystem
	}
	if old, err := ovs.GetPort(ctx, cfg.TunnelName); err != nil {
		return 0, nil, err
	} else if old != nil && old.Type != wantType {
		if err := ovs.DeletePort(ctx, cfg.BridgeName, cfg.TunnelName); err != nil {
			return 0, nil, fmt.Errorf("replacing tunnel port: %w", err)
		}
	}
	if kind == tunnel.KindKernelDevice {
		if err := kernel.Ensure(ctx, nft, nodeIP, mtu); err != nil {
			return 0, nil, err
		}
		p, err := ovs.EnsurePort(ctx, cfg.BridgeName, ovsdb.PortSpec{
			Name: cfg.TunnelName, Type: ovsdb.TypeSystem, Options: map[string]string{}, OFPortRequest: TunnelOFPort,
		})
		if err != nil {
			return 0, nil, fmt.Errorf("tunnel port: %w", err)
		}
		return uint32(p.OFPort), &kernel, nil
	}
	opts, err := tunnel.PortOptions(cfg.TunnelType)
	if err != nil {
		return 0, nil, err
	}
	p, err := ovs.EnsurePort(ctx, cfg.BridgeName, ovsdb.PortSpec{
		Name: cfg.TunnelName, Type: cfg.TunnelType, Options: opts, OFPortRequest: TunnelOFPort,
	})
	if err != nil {
		return 0, nil, fmt.Errorf("tunnel port: %w", err)
	}
	if nft != nil {
		if err := kernel.Remove(ctx, nft); err != nil {
			return 0, nil, err
		}
	}
	return uint32(p.OFPort), nil, nil
}

// tunnelEgress decides how packets reach the tunnel port (b.Tunnel): by
// the peer's MAC through the kernel VXLAN device; by tun_dst through OVS's
// userspace tunnel port, and with userspace TSO through the segmentation
// port first (OVS 3.1 cannot encapsulate offloaded packets).
func tunnelEgress(cfg config.Config, kind tunnel.Kind, tso bool, b *pipeline.Bridge) {
	switch {
	case kind == tunnel.KindKernelDevice:
		b.Tunnel = pipeline.TunnelByMAC
	case userspaceDatapath(cfg) && tso:
		b.Tunnel = pipeline.TunnelSegmented
	default:
		b.Tunnel = pipeline.TunnelByTunDst
	}
}

// segmentPortNeeded reports whether b needs the segmentation port
// (tunnel.SegmentPair). Only the userspace datapath with userspace TSO
// ever does: for tunnel-bound packets with an OVS tunnel port
// (TunnelSegmented), and for NATed packets that leave the Node unless a
// tc program rewrites their partial checksums (b.PartialChecksumsRewritten;
// otherwise pipeline.NATChecksumDetour). Anywhere else it would be an idle
// port, which ovs-vswitchd still reads in every turn of its loop: on the
// default configuration (a kernel VXLAN device, the rewrite) the port
// cost Pod-to-Pod request/response latency on one Node about a tenth
// (docs/benchmarks.md, "The idle segmentation port").
func segmentPortNeeded(cfg config.Config, tso bool, b pipeline.Bridge) bool {
	if !userspaceDatapath(cfg) || !tso {
		return false
	}
	return tunnelSegments(b) || !b.PartialChecksumsRewritten
}

// tunnelSegments reports whether b's tunnel-bound packets pass through the
// segmentation port (an OVS tunnel port with userspace TSO), which it then
// needs whatever becomes of NATed packets.
func tunnelSegments(b pipeline.Bridge) bool {
	return b.TunnelPort != 0 && b.Tunnel == pipeline.TunnelSegmented
}

// addSegmentPort makes the segmentation veth pair and adds its port to the
// bridge (idempotent), and sets b.SegmentPort.
func addSegmentPort(ctx context.Context, cfg config.Config, ovs *ovsdb.Client, mtu int, b *pipeline.Bridge) error {
	seg := tunnel.DefaultSegmentPair
	// A pair of another MTU (another tunnel type before) is made anew, for
	// the same reason as a tunnel port that changes kind (tunnelPort).
	if l, err := netlink.LinkByName(seg.Port); err == nil && l.Attrs().MTU != mtu {
		if err := ovs.DeletePort(ctx, cfg.BridgeName, seg.Port); err != nil {
			return fmt.Errorf("replacing the segmentation port: %w", err)
		}
		if err := seg.Remove(); err != nil {
			return err
		}
	}
	// The hairpin end was an OVS port before it hairpinned in the kernel:
	// an upgraded Node drops it from the bridge first, so OVS does not
	// read the segments twice.
	if err := ovs.DeletePort(ctx, cfg.BridgeName, seg.Hairpin); err != nil {
		return fmt.Errorf("removing the old segmentation port %s: %w", seg.Hairpin, err)
	}
	if err := seg.Ensure(mtu); err != nil {
		return err
	}
	p, err := ovs.EnsurePort(ctx, cfg.BridgeName, ovsdb.PortSpec{Name: seg.Port, OFPortRequest: SegmentPortOFPort,
		ExternalIDs: map[string]string{"seine.io/role": "segmentation"}})
	if err != nil {
		return fmt.Errorf("segmentation port: %w", err)
	}
	b.SegmentPort = uint32(p.OFPort)
	return nil
}

// removeSegmentPort removes the segmentation port (and the hairpin end,
// an OVS port in older releases) from the bridge and deletes the pair; it
// is a no-op where there is none. A Node that no longer needs the port
// calls it only once no flow of an earlier round is left: those may send
// packets through it.
func removeSegmentPort(ctx context.Context, cfg config.Config, ovs *ovsdb.Client) error {
	seg := tunnel.DefaultSegmentPair
	var errs []error
	for _, name := range []string{seg.Port, seg.Hairpin} {
		errs = append(errs, ovs.DeletePort(ctx, cfg.BridgeName, name))
	}
	errs = append(errs, seg.Remove())
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("removing the segmentation ports: %w", err)
	}
	return nil
}

// peerTunnel adapts a kernel tunnel device to the route controller (nil
// interface when there is none).
func peerTunnel(k *tunnel.KernelVXLAN) noderoute.PeerTunnel {
	if k == nil {
		return nil
	}
	return k
}

// chooseTunnelType returns the tunnel type this Node runs with
// (tunnel.PickType): cfg's, else the type of the tunnel port its previous
// run left on the bridge, else what its own and the other Nodes'
// AgentInfos report, else the datapath's default. When nothing on the Node
// decides and the mode tunnels, it waits for the AgentInfos until ctx
// ends, as the wait for the Node does: guessing could split the cluster
// into Nodes that cannot decapsulate each other's packets. Otherwise it
// reads them once, to warn about peers of another type.
func chooseTunnelType(ctx context.Context, cfg config.Config, ovs *ovsdb.Client, ops opsclient.Interface, log *zap.Logger) (string, error) {
	ev := tunnel.TypeEvidence{Configured: cfg.TunnelType, UserspaceDatapath: userspaceDatapath(cfg)}
	p, err := ovs.GetPort(ctx, cfg.TunnelName)
	if err != nil {
		return "", fmt.Errorf("choosing the tunnel type: tunnel port %s: %w", cfg.TunnelName, err)
	}
	if p != nil {
		ev.Bridge = p.Type
		if p.Type == ovsdb.TypeSystem { // the kernel VXLAN device (tunnelPort)
			ev.Bridge = tunnel.VXLAN
		}
	}
	mustList := ev.Configured == "" && !tunnel.Known(ev.Bridge) && cfg.TrafficEncapMode.UsesTunnel()
	list, err := listAgentInfos(ctx, ops, mustList, log)
	if err != nil {
		if mustList {
			return "", fmt.Errorf("choosing the tunnel type: %w", err)
		}
		log.Warn("could not read the AgentInfos: the other Nodes' tunnel types are unknown", zap.Error(err))
	}
	ev.Reported, ev.Peers = tunnelVotes(list, cfg.NodeName, time.Now(), staleAgentInfo)
	typ, from := tunnel.PickType(ev)
	log.Info("tunnel type chosen", zap.String("tunnel_type", typ), zap.String("tunnel_type_source", string(from)),
		zap.String("bridge_tunnel_type", ev.Bridge), zap.String("reported_tunnel_type", ev.Reported),
		zap.Any("peer_tunnel_types", ev.Peers))
	if !cfg.TrafficEncapMode.UsesTunnel() {
		return typ, nil
	}
	others := 0
	for t, n := range ev.Peers {
		if tunnel.Known(t) && t != typ {
			others += n
		}
	}
	if others > 0 {
		log.Warn("other Nodes report another tunnel type: Pods on Nodes of different types cannot reach each other; set tunnelType alike on every Node",
			zap.String("tunnel_type", typ), zap.Any("peer_tunnel_types", ev.Peers))
	}
	if from != tunnel.FromConfig { // a configured type was warned about at start (config.Warnings)
		cfg.TunnelType = typ
		if w := cfg.TunnelWarning(); w != "" {
			log.Warn("configuration", zap.String("warning", w))
		}
	}
	return typ, nil
}

// staleAgentInfo is how long an AgentInfo may go unwritten before its Node
// no longer counts in a joining Node's choice of tunnel type: three
// heartbeats (a daemon writes its AgentInfo at least every
// info.DefaultHeartbeat).
const staleAgentInfo = 3 * info.DefaultHeartbeat

// tunnelVotes returns the tunnel type self's own AgentInfo in list
// reports ("" when it has none) and the other Nodes counted by the type
// they report. A Node whose daemon has not written its AgentInfo for
// staleAfter before now (LastHeartbeatTime) is down or gone: its type is
// not what the running cluster speaks, so it does not count. When no live
// peer reports a type (the whole cluster starting again, an API server
// that was unreachable for a while, live peers not yet past their start)
// every peer counts, as stale evidence still beats the datapath's default.
// The heartbeats are the writers' clocks, read against this Node's.
func tunnelVotes(list []opsv1alpha1.AgentInfo, self string, now time.Time, staleAfter time.Duration) (string, map[string]int) {
	var reported string
	live, all := map[string]int{}, map[string]int{}
	liveKnown := 0
	for _, a := range list {
		if a.Name == self {
			reported = a.Status.TunnelType
			continue
		}
		all[a.Status.TunnelType]++
		if now.Sub(a.Status.LastHeartbeatTime.Time) <= staleAfter {
			live[a.Status.TunnelType]++
			if tunnel.Known(a.Status.TunnelType) {
				liveKnown++
			}
		}
	}
	if liveKnown > 0 {
		return reported, live
	}
	return reported, all
}

// listAgentInfos lists the AgentInfos: once (with a short deadline), or,
// with untilListed, until it succeeds or ctx ends.
func listAgentInfos(ctx context.Context, ops opsclient.Interface, untilListed bool, log *zap.Logger) ([]opsv1alpha1.AgentInfo, error) {
	if !untilListed {
		ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		defer cancel()
		l, err := ops.OpsV1alpha1().AgentInfos().List(ctx, metav1.ListOptions{})
		if err != nil {
			return nil, fmt.Errorf("listing AgentInfos: %w", err)
		}
		return l.Items, nil
	}
	var items []opsv1alpha1.AgentInfo
	last := time.Time{}
	err := wait.PollUntilContextCancel(ctx, time.Second, true, func(ctx context.Context) (bool, error) {
		l, err := ops.OpsV1alpha1().AgentInfos().List(ctx, metav1.ListOptions{})
		if err != nil {
			if time.Since(last) > 10*time.Second {
				last = time.Now()
				log.Warn("waiting to read the Nodes' AgentInfos to choose the tunnel type (or set tunnelType)", zap.Error(err))
			}
			return false, nil
		}
		items = l.Items
		return true, nil
	})
	if err != nil {
		return nil, fmt.Errorf("listing AgentInfos: %w", err)
	}
	return items, nil
}
