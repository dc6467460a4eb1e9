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
// from the transport device itself, tunnel.Choose): the Node's IPv4 addresses and routes
// move from the bridge's internal interface back to the transport device,
// the nftables ingress drop on the device is removed, GRO is turned back
// on, and the bridge is deleted, so the kernel owns the device again.
//
// Without it the Node would lose its own address with ovs-vswitchd: the
// bridge's tap keeps the address but nothing forwards for it, and the
// kubelet, cut off from the API server, could not even start the Pod that
// would bring OVS back. A bridge that is not there is not an error. The
// next AttachNetdev (seine starting again) attaches the device anew.
func DetachNetdev(ctx context.Context, pm BridgeRemover, nft knftables.Interface, bridge string, log *zap.Logger) error {
	ports, err := pm.ListPorts(ctx, bridge)
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
		br, brErr := netlink.LinkByName(bridge)
		dev, devErr := netlink.LinkByName(device)
		switch {
		case brErr != nil || devErr != nil:
			errs = append(errs, fmt.Errorf("interfaces %s, %s: %w", bridge, device, errors.Join(brErr, devErr)))
		default:
			if err := netlink.LinkSetUp(dev); err != nil {
				errs = append(errs, fmt.Errorf("bringing up %s: %w", device, err))
			}
			// GRO back on, as a NIC's driver has it (AttachNetdev turned it off).
			if err := offload.SetGRO(device, true); err != nil {
				errs = append(errs, err)
			}
			if err := moveAddresses(br, dev, log); err != nil {
				errs = append(errs, err)
			}
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
