package agent

import (
	"context"
	"fmt"
	"net"
	"strconv"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/vishvananda/netlink"
	"go.uber.org/zap"
	"sigs.k8s.io/knftables"

	"github.com/seine-net/seine/datapath/ovsdb"
	"github.com/seine-net/seine/node/config"
	"github.com/seine-net/seine/node/noderoute"
	"github.com/seine-net/seine/tunnel"
)

// What each traffic mode sets up on the Node, beside what every mode has
// (bridge, gateway, pipeline, Pods, NetworkPolicy, Service proxy), and
// what a restart in another mode removes:
//
//	             tunnel port  transport bridge¹  gateway IP  IPAM  SNAT  peer routes
//	encap        yes          yes                yes         yes   yes   via the tunnel
//	hybrid       yes          yes                yes         yes   opt.  direct or tunnel
//	noEncap      no           no                 yes         yes   opt.  direct or underlay
//	policy only  no           no                 no          no    no    none (the primary's)
//
// ¹ with the netdev datapath only (tunnel.AttachNetdev), and only for
// OVS's userspace tunnel port: a kernel VXLAN device (tunnel.Choose) leaves
// the transport interface to the kernel.
//
// With the netdev datapath and userspace TSO, a mode may also have the
// segmentation pair (segmentPortNeeded): the tunnelling modes send
// tunnel-bound packets through it with OVS's userspace tunnel port, and
// every mode sends NATed packets that leave the Node through it where the
// kernel refuses the checksum seed program or natChecksum is detour.

// setupTransport finds the transport interface and, with the netdev
// datapath, hands it to the transport bridge when the mode tunnels through
// OVS's userspace tunnel port (kind tunnel.KindOVSPort), or takes it back
// from a bridge an earlier run left when it does not: without a tunnel, or
// with a kernel tunnel device, the interface stays the kernel's.
func setupTransport(ctx context.Context, cfg config.Config, kind tunnel.Kind, ovs *ovsdb.Client, nodeIP net.IP, log *zap.Logger) (tunnel.Transport, error) {
	if cfg.OVSDatapathType != config.DatapathNetdev {
		return tunnel.FindTransport(cfg.TransportInterface, nodeIP)
	}
	if netdevTransportBridge(cfg, kind) {
		return setupNetdevTransport(ctx, cfg, ovs, nodeIP, log)
	}
	nft, err := knftables.New(knftables.NetDevFamily, tunnel.TransportTable)
	if err != nil {
		return tunnel.Transport{}, fmt.Errorf("nftables: %w", err)
	}
	if err := tunnel.DetachNetdev(ctx, ovs, nft, cfg.TransportBridge, log); err != nil {
		return tunnel.Transport{}, err
	}
	return tunnel.FindTransport(cfg.TransportInterface, nodeIP)
}

// netdevTransportBridge reports whether the transport interface belongs
// to the transport bridge: the netdev datapath, tunnelling through OVS's
// userspace tunnel port, which sends and receives through a bridge.
func netdevTransportBridge(cfg config.Config, kind tunnel.Kind) bool {
	return cfg.OVSDatapathType == config.DatapathNetdev && cfg.TrafficEncapMode.UsesTunnel() && kind == tunnel.KindOVSPort
}

// mtus are the MTUs a Node's Pods and ports get, in bytes.
type mtus struct {
	// Pod is the MTU of Pod interfaces (both veth ends): what a Pod sends
	// to and receives from the Pods of its own Node.
	Pod int
	// Tunnel is the path MTU to everything reached through the gateway
	// (other Nodes' Pods, Services, the host, outside): the MTU of the
	// Pods' routes through the gateway, of the gateway and of the tunnel
	// and segmentation ports. Equal to Pod but where the mode tunnels.
	Tunnel int
}

// podMTUs derives the MTUs from the configuration and the transport. A
// configured mtu gives every interface and route that MTU, and a mode
// that does not tunnel (noEncap, networkPolicyOnly) the transport's.
// Where the mode tunnels (hybrid too: some peers are reached through the
// tunnel), Pod interfaces keep the transport's MTU and only the routes
// through the gateway carry it less the tunnel overhead: traffic between
// two Pods of one Node never enters a tunnel, and with the userspace
// datapath's TSO a smaller Pod MTU costs about a tenth of its throughput,
// because OVS 3.1 sizes the segments of each large packet by the MTU of
// the port it leaves through (docs/benchmarks.md, "The Pods' MTU"). The
// kernel honours a route's MTU for TCP's MSS, for fragmentation and for
// path MTU discovery (ip-route(8), "mtu"), which is what makes the split
// safe.
func podMTUs(cfg config.Config, transport tunnel.Transport) (mtus, error) {
	if cfg.MTU != 0 {
		return mtus{Pod: cfg.MTU, Tunnel: cfg.MTU}, nil
	}
	if !cfg.TrafficEncapMode.UsesTunnel() {
		return mtus{Pod: transport.MTU, Tunnel: transport.MTU}, nil
	}
	overhead, err := tunnel.Overhead(cfg.TunnelType)
	if err != nil {
		return mtus{}, err
	}
	return mtus{Pod: transport.MTU, Tunnel: transport.MTU - overhead}, nil
}

// clearGatewayAddresses removes every IPv4 address from the gateway: in
// networkPolicyOnly mode it has none (the Pods' addresses and gateway are
// the primary CNI's), so one an earlier run gave it must go.
func clearGatewayAddresses(name string) error {
	link, err := netlink.LinkByName(name)
	if err != nil {
		return fmt.Errorf("gateway interface %s: %w", name, err)
	}
	addrs, err := netlink.AddrList(link, netlink.FAMILY_V4)
	if err != nil {
		return fmt.Errorf("addresses of %s: %w", name, err)
	}
	for _, a := range addrs {
		if err := netlink.AddrDel(link, &a); err != nil {
			return fmt.Errorf("removing %s from %s: %w", a.IPNet, name, err)
		}
	}
	return nil
}

// registerModeMetrics exports the traffic mode in effect and the peers by
// route, so that operators (and seinectl) can read them:
//
//	seine_traffic_mode_info{mode="hybrid",snat="true"} 1
//	seine_peer_node_routes{route="direct"} 1
func registerModeMetrics(reg *prometheus.Registry, cfg config.Config, routes *noderoute.Controller) {
	reg.MustRegister(prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Name: "seine_traffic_mode_info",
		Help: "The traffic mode in effect (trafficEncapMode) and whether seine masquerades Pod traffic leaving the cluster; always 1.",
		ConstLabels: prometheus.Labels{"mode": string(cfg.TrafficEncapMode),
			"snat": strconv.FormatBool(cfg.SNATEnabled())},
	}, func() float64 { return 1 }))
	for _, r := range noderoute.Routes() {
		reg.MustRegister(prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name:        "seine_peer_node_routes",
			Help:        "Peer Nodes by how their podCIDR is reached: tunnel, direct (host route via the peer's Node IP), underlay (the network routes it), none (networkPolicyOnly).",
			ConstLabels: prometheus.Labels{"route": r.String()},
		}, func() float64 { return float64(routes.PeerRoutes()[r]) }))
	}
}
