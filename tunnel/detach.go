package tunnel

import (
	"context"
	"errors"
	"fmt"

	"github.com/vishvananda/netlink"
	"go.uber.org/zap"
	"sigs.k8s.io/knftables"

	"github.com/seine-net/seine/datapath/nftables"
	"github.com/seine-net/seine/datapath/offload"
	"github.com/seine-net/seine/datapath/ovsdb"
)

// BridgeRemover is the OVSDB part DetachNetdev needs.
type BridgeRemover interface {
	PortManager
	DeleteBridge(ctx context.Context, name string) error
}

// DetachNetdev undoes AttachNetdev before the userspace datapath goes away
// (the openvswitch container stops), or when the Node's tunnel no longer
// goes through OVS's userspace tunnelling (a kernel VXLAN device sends
// from the transport device itself, tunnel.Choose): the Node's IPv4
// addresses and routes move from the bridge's internal interface back to
// the transport device (the bridge's only system port), and, only once
// the bridge's interface holds no IPv4 address, GRO is turned back on, the
// nftables ingress drop on the device is removed and the bridge deleted,
// so the kernel owns the device again. (When ovs-vswitchd exits next, the
// caller removes the drop even after an error: see node/cmd's
// releaseTransport.)
//
// Without it the Node would lose its own address with ovs-vswitchd: the
// bridge's tap keeps the address but nothing forwards for it, and the
// kubelet, cut off from the API server, could not even start the Pod that
// would bring OVS back. A bridge that is not there is not an error. The
// next AttachNetdev (seine starting again) attaches the device anew.
//
// Errors: listing the bridge's ports; looking up the device (a bridge
// without its interface holds no address: its device is given back as it
// is); moving the addresses back; the bridge's interface still
// holding IPv4 addresses (also when the bridge has no transport port to
// move them to). Each of these returns before the drop table and the
// bridge are touched, since deleting the bridge destroys its interface
// with the Node's address on it; the device then stays the bridge's and a
// later call can finish. Removing the table or the bridge, or turning GRO
// back on, can fail too (all such errors joined).
func DetachNetdev(ctx context.Context, pm BridgeRemover, nft knftables.Interface, bridge string, log *zap.Logger) error {
	ports, err := pm.ListPorts(ctx, bridge)
	exists := err == nil
	if errors.Is(err, ovsdb.ErrBridgeNotFound) {
		ports = nil
	} else if err != nil {
		return fmt.Errorf("ports of %s: %w", bridge, err)
	}
	device := ""
	for _, p := range ports {
		if p.Type == "" && p.Name != bridge {
			device = p.Name
		}
	}
	var errs []error
	if device != "" {
		br, err := netlink.LinkByName(bridge)
		if isNotFound(err) {
			// ovs-vswitchd has not (yet, or any more) made the bridge's
			// tap: no address is on it to lose, and the device is given
			// back as it is.
			log.Warn("the transport bridge has no interface; nothing to move back", zap.String("bridge", bridge), zap.String("device", device))
		} else if err != nil {
			return fmt.Errorf("interface of bridge %s: %w", bridge, err)
		}
		dev, err := netlink.LinkByName(device)
		if err != nil {
			return fmt.Errorf("transport interface %s of bridge %s: %w", device, bridge, err)
		}
		if err := netlink.LinkSetUp(dev); err != nil {
			return fmt.Errorf("bringing up %s: %w", device, err)
		}
		if br != nil {
			if err := moveAddresses(br, dev, log); err != nil {
				return err
			}
		}
	}
	// Without a bridge in OVSDB a link of that name is not OVS's, and
	// DeleteBridge leaves it alone.
	if exists {
		if err := bridgeHoldsNoAddress(bridge); err != nil {
			if device == "" {
				err = fmt.Errorf("no transport port on bridge %s to move its addresses to: %w", bridge, err)
			}
			return err
		}
	}
	if device != "" {
		// GRO back on, as a NIC's driver has it (AttachNetdev turned it
		// off), only now: a device that stays the bridge's needs it off.
		if err := offload.SetGRO(device, true); err != nil {
			errs = append(errs, err)
		}
	}
	if err := nftables.DeleteTable(ctx, nft); err != nil {
		errs = append(errs, fmt.Errorf("removing the nftables ingress drop: %w", err))
	}
	if err := pm.DeleteBridge(ctx, bridge); err != nil {
		errs = append(errs, fmt.Errorf("deleting bridge %s: %w", bridge, err))
	}
	if err := errors.Join(errs...); err != nil {
		return err
	}
	if device != "" {
		log.Info("transport device handed back to the kernel", zap.String("device", device), zap.String("bridge", bridge))
	}
	return nil
}

// bridgeHoldsNoAddress returns an error when the interface of bridge
// exists and holds IPv4 addresses, or cannot be read. A missing interface
// holds none.
func bridgeHoldsNoAddress(bridge string) error {
	br, err := netlink.LinkByName(bridge)
	if isNotFound(err) {
		return nil
	} else if err != nil {
		return fmt.Errorf("interface of bridge %s: %w", bridge, err)
	}
	addrs, err := netlink.AddrList(br, netlink.FAMILY_V4)
	if err != nil {
		return fmt.Errorf("addresses of %s: %w", bridge, err)
	}
	if len(addrs) > 0 {
		held := make([]string, 0, len(addrs))
		for _, a := range addrs {
			held = append(held, a.IPNet.String())
		}
		return fmt.Errorf("interface of bridge %s still holds IPv4 addresses %v: keeping the bridge, whose deletion would destroy them", bridge, held)
	}
	return nil
}
