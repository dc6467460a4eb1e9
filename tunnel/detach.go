package tunnel

import (
	"context"
	"errors"
	"fmt"
	"syscall"

	"github.com/vishvananda/netlink"
	"go.uber.org/zap"
	"sigs.k8s.io/knftables"

	"github.com/seine-net/seine/datapath/ovsdb"
)

// BridgeRemover is the OVSDB part DetachNetdev needs.
type BridgeRemover interface {
	ListPorts(ctx context.Context, bridge string) ([]ovsdb.Port, error)
	DeleteBridge(ctx context.Context, name string) error
}

// DetachNetdev undoes AttachNetdev for a Node that no longer tunnels
// (trafficEncapMode noEncap or networkPolicyOnly with the netdev
// datapath): the kernel takes the transport device back (the nftables
// ingress drop goes), the transport bridge is deleted, and the addresses
// and routes its internal interface held move back to the device. It
// returns the device's name, or "" when no transport bridge exists
// (nothing to do). Traffic of the Node pauses for the moment between the
// bridge's removal and the addresses' return.
func DetachNetdev(ctx context.Context, br BridgeRemover, nft knftables.Interface, bridge string, log *zap.Logger) (string, error) {
	ports, err := br.ListPorts(ctx, bridge)
	if errors.Is(err, ovsdb.ErrBridgeNotFound) {
		return "", nil
	}
	if err != nil {
		return "", fmt.Errorf("ports of transport bridge %s: %w", bridge, err)
	}
	device := ""
	for _, p := range ports {
		if p.Type == "" && p.Name != bridge {
			device = p.Name
		}
	}
	var addrs []netlink.Addr
	var routes []netlink.Route
	if brLink, err := netlink.LinkByName(bridge); err == nil {
		if addrs, err = netlink.AddrList(brLink, netlink.FAMILY_V4); err != nil {
			return "", fmt.Errorf("addresses of %s: %w", bridge, err)
		}
		routes, err = netlink.RouteListFiltered(netlink.FAMILY_V4,
			&netlink.Route{LinkIndex: brLink.Attrs().Index, Table: syscall.RT_TABLE_MAIN},
			netlink.RT_FILTER_OIF|netlink.RT_FILTER_TABLE)
		if err != nil {
			return "", fmt.Errorf("routes of %s: %w", bridge, err)
		}
	}
	tx := nft.NewTransaction()
	tx.Add(&knftables.Table{})
	tx.Delete(&knftables.Table{})
	if err := nft.Run(ctx, tx); err != nil {
		return "", fmt.Errorf("removing the nftables ingress drop of the transport: %w", err)
	}
	if err := br.DeleteBridge(ctx, bridge); err != nil {
		return "", fmt.Errorf("deleting transport bridge %s: %w", bridge, err)
	}
	log.Info("transport bridge removed", zap.String("bridge", bridge), zap.String("device", device))
	if device == "" {
		return "", fmt.Errorf("transport bridge %s had no transport device; its addresses %v are gone", bridge, addrs)
	}
	dev, err := netlink.LinkByName(device)
	if err != nil {
		return "", fmt.Errorf("transport interface %q: %w", device, err)
	}
	if err := netlink.LinkSetUp(dev); err != nil {
		return "", fmt.Errorf("bringing up %s: %w", device, err)
	}
	for _, a := range addrs {
		if err := netlink.AddrReplace(dev, &netlink.Addr{IPNet: a.IPNet, Broadcast: a.Broadcast}); err != nil {
			return "", fmt.Errorf("adding %s to %s: %w", a.IPNet, device, err)
		}
		log.Info("moved transport address back", zap.String("address", a.IPNet.String()), zap.String("to", device))
	}
	for _, r := range routes {
		if r.Protocol == syscall.RTPROT_KERNEL { // connected routes follow their address
			continue
		}
		nr := r
		nr.LinkIndex = dev.Attrs().Index
		nr.ILinkIndex = 0
		if err := netlink.RouteReplace(&nr); err != nil && !errors.Is(err, syscall.EEXIST) {
			return "", fmt.Errorf("moving route %s back to %s: %w", r.Dst, device, err)
		}
	}
	return device, nil
}
