package tunnel

import (
	"context"
	"errors"
	"fmt"
	"os"
	"syscall"

	"github.com/vishvananda/netlink"
	"go.uber.org/zap"
	"golang.org/x/sys/unix"
	"sigs.k8s.io/knftables"

	"github.com/seine-net/seine/datapath/offload"
	"github.com/seine-net/seine/datapath/ovsdb"
)

// TransportTable is the nftables table (netdev family) of the ingress
// drop on the transport device.
const TransportTable = "seine-transport"

// PortManager is the OVSDB part AttachNetdev needs.
type PortManager interface {
	EnsureBridge(ctx context.Context, cfg ovsdb.BridgeConfig) error
	EnsurePort(ctx context.Context, bridge string, spec ovsdb.PortSpec) (ovsdb.Port, error)
	ListPorts(ctx context.Context, bridge string) ([]ovsdb.Port, error)
}

// ResolveNetdevTransport returns the physical transport interface when a
// previous run already attached it to bridge: the Node IP then sits on the
// bridge's internal interface, and the transport is the bridge's only
// system port.
func ResolveNetdevTransport(ctx context.Context, pm PortManager, bridge string, t Transport) (string, error) {
	if t.Name != bridge {
		return t.Name, nil
	}
	ports, err := pm.ListPorts(ctx, bridge)
	if err != nil {
		return "", err
	}
	for _, p := range ports {
		if p.Type == "" && p.Name != bridge {
			return p.Name, nil
		}
	}
	return "", fmt.Errorf("the Node IP is on %s but it has no transport port; set transportInterface", bridge)
}

// AttachNetdev hands the transport interface to OVS for the userspace
// datapath. OVS's userspace tunnels route the outer packet with OVS's own
// routing table and send it out of the bridge whose internal interface owns
// the source address (ovs-vswitchd(8), "OVS native tunneling"), so:
//
//  1. bridge (datapath_type=netdev) is created and the transport device
//     added to it as a system port; the bridge forwards with the NORMAL
//     action (installed by the caller through OpenFlow);
//  2. the device's IPv4 addresses and routes move to the bridge's internal
//     interface, which takes the device's MTU and MAC (other_config:hwaddr;
//     OVS would otherwise pick a random one), so the Node's address keeps
//     its MAC and neighbours' ARP caches, filled before seine started,
//     stay valid;
//  3. an nftables netdev-family ingress chain drops everything the kernel
//     itself would receive on the device: OVS reads the device through
//     AF_PACKET, which sees packets before that hook, so only the kernel's
//     duplicate copy is discarded;
//  4. GRO is turned off on the device, so OVS reads frames as they arrived
//     (see below).
//
// It is idempotent. It returns the transport as seen afterwards (the
// bridge's interface, with the moved addresses).
func AttachNetdev(ctx context.Context, pm PortManager, nft knftables.Interface, bridge, device string, log *zap.Logger) (Transport, error) {
	dev, err := netlink.LinkByName(device)
	if err != nil {
		return Transport{}, fmt.Errorf("transport interface %q: %w", device, err)
	}
	if _, err := netlink.LinkByName(bridge); err == nil {
		// A bridge from a release that let OVS pick its MAC changes MAC
		// below while holding the Node's address: announce the new one
		// (gratuitous ARP on a MAC change, ip-sysctl arp_notify), or
		// neighbours keep the old one until their ARP entries expire.
		if err := os.WriteFile("/proc/sys/net/ipv4/conf/"+bridge+"/arp_notify", []byte("1"), 0o644); err != nil {
			log.Warn("arp_notify on the transport bridge", zap.String("bridge", bridge), zap.Error(err))
		}
	}
	// Standalone: right after ovs-vswitchd restarts, before seine has
	// reinstalled its flow, the bridge still switches the Node's own
	// traffic (NORMAL), so the Node keeps its address, and seine its way
	// to the API server.
	if err := pm.EnsureBridge(ctx, ovsdb.BridgeConfig{Name: bridge, DatapathType: "netdev",
		FailMode:    ovsdb.FailModeStandalone,
		ExternalIDs: map[string]string{"seine.io/role": "transport"},
		OtherConfig: map[string]string{"hwaddr": dev.Attrs().HardwareAddr.String()}}); err != nil {
		return Transport{}, fmt.Errorf("transport bridge %s: %w", bridge, err)
	}
	if _, err := pm.EnsurePort(ctx, bridge, ovsdb.PortSpec{Name: device,
		ExternalIDs: map[string]string{"seine.io/role": "transport"}}); err != nil {
		return Transport{}, fmt.Errorf("adding %s to %s: %w", device, bridge, err)
	}
	br, err := netlink.LinkByName(bridge)
	if err != nil {
		return Transport{}, fmt.Errorf("interface of bridge %s: %w", bridge, err)
	}
	if br.Attrs().MTU != dev.Attrs().MTU {
		if err := netlink.LinkSetMTU(br, dev.Attrs().MTU); err != nil {
			return Transport{}, fmt.Errorf("MTU of %s: %w", bridge, err)
		}
	}
	if err := netlink.LinkSetUp(br); err != nil {
		return Transport{}, fmt.Errorf("bringing up %s: %w", bridge, err)
	}
	if err := dropKernelIngress(ctx, nft, device); err != nil {
		return Transport{}, err
	}
	// OVS reads the device through AF_PACKET after GRO: OVS 3.1 with
	// userspace TSO passes GRO-aggregated frames on to the bridge's own
	// interface in a form the host's forwarding then mostly drops
	// (measured: NodePort traffic from outside fell from tens of Mbit/s to
	// hundreds of kbit/s), so the transport bridge gets frames as they
	// arrived.
	if err := offload.SetGRO(device, false); err != nil {
		return Transport{}, err
	}
	if err := moveAddresses(dev, br, log); err != nil {
		return Transport{}, err
	}
	return FindTransport(bridge, nil)
}

// moveAddresses moves from's IPv4 addresses, and its routes in the main
// table, to the link to. Every step is one the kernel lets both links
// share, so a failure or a crash at any point leaves the Node's address
// and routes on from or on to (or on both), and a later call finishes the
// move:
//
//  1. each address is added to to (AddrReplace): the same address on two
//     links is allowed, and the kernel adds to's own connected (prefix
//     and local) routes beside from's, appended rather than replacing
//     them;
//  2. each route through from, other than the kernel's connected ones
//     (proto kernel), is replaced by the same route through to: the
//     kernel's IPv4 replace (NLM_F_REPLACE, rtnetlink(7)) matches a route
//     on table, destination, TOS and metric, whatever its device, so the
//     route leaves from in the same step; its gateway is already
//     reachable on to through step 1's prefix route;
//  3. only then are the addresses removed from from: when its last one
//     goes the kernel flushes the routes still through from (its
//     connected ones only by now).
//
// from, not to, is read for what to move, so once step 3 completed a
// call has nothing left to do. to must be up (the kernel adds no prefix
// route on a link that is down). Errors name the step, the address or
// route, and the link.
func moveAddresses(from, to netlink.Link, log *zap.Logger) error {
	addrs, err := netlink.AddrList(from, netlink.FAMILY_V4)
	if err != nil {
		return fmt.Errorf("addresses of %s: %w", from.Attrs().Name, err)
	}
	if len(addrs) == 0 {
		return nil
	}
	routes, err := netlink.RouteListFiltered(netlink.FAMILY_V4,
		&netlink.Route{LinkIndex: from.Attrs().Index, Table: syscall.RT_TABLE_MAIN},
		netlink.RT_FILTER_OIF|netlink.RT_FILTER_TABLE)
	if err != nil {
		return fmt.Errorf("routes of %s: %w", from.Attrs().Name, err)
	}
	for _, a := range addrs {
		na := &netlink.Addr{IPNet: a.IPNet, Broadcast: a.Broadcast}
		if err := netlink.AddrReplace(to, na); err != nil {
			return fmt.Errorf("adding %s to %s: %w", a.IPNet, to.Attrs().Name, err)
		}
	}
	for _, r := range routes {
		if r.Protocol == syscall.RTPROT_KERNEL { // connected routes follow their address
			continue
		}
		nr := r
		nr.LinkIndex = to.Attrs().Index
		nr.ILinkIndex = 0
		// The kernel lists the routes of a link without carrier flagged
		// linkdown (dead, once the link is down) and refuses either flag
		// in a new route (EINVAL): they are state, not configuration.
		nr.Flags &^= unix.RTNH_F_LINKDOWN | unix.RTNH_F_DEAD
		if err := netlink.RouteReplace(&nr); err != nil && !errors.Is(err, syscall.EEXIST) {
			return fmt.Errorf("moving route %s to %s: %w", r.Dst, to.Attrs().Name, err)
		}
	}
	for _, a := range addrs {
		// Removing a primary address removes its secondaries with it
		// (ip-sysctl promote_secondaries off): those are gone already.
		if err := netlink.AddrDel(from, &a); err != nil && !errors.Is(err, syscall.EADDRNOTAVAIL) {
			return fmt.Errorf("removing %s from %s: %w", a.IPNet, from.Attrs().Name, err)
		}
		log.Info("moved transport address", zap.String("address", a.IPNet.String()),
			zap.String("from", from.Attrs().Name), zap.String("to", to.Attrs().Name))
	}
	return nil
}

// dropKernelIngress installs, in nft's table (netdev family), a filter
// chain on the device's ingress hook whose policy is drop.
func dropKernelIngress(ctx context.Context, nft knftables.Interface, device string) error {
	tx := nft.NewTransaction()
	tx.Add(&knftables.Table{Comment: knftables.PtrTo("seine: transport device owned by OVS")})
	tx.Add(&knftables.Chain{
		Name:     "ingress",
		Type:     knftables.PtrTo(knftables.FilterType),
		Hook:     knftables.PtrTo(knftables.IngressHook),
		Device:   knftables.PtrTo(device),
		Priority: knftables.PtrTo(knftables.FilterPriority),
		Policy:   knftables.PtrTo(knftables.DropPolicy),
	})
	if err := nft.Run(ctx, tx); err != nil {
		return fmt.Errorf("nftables ingress drop on %s: %w", device, err)
	}
	return nil
}
