package tunnel

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"syscall"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
	"sigs.k8s.io/knftables"

	"github.com/seine-net/seine/datapath/nftables"
	"github.com/seine-net/seine/datapath/pipeline"
)

// VXLANPort is the IANA-assigned VXLAN UDP port (RFC 7348 section 5), the
// one OVS's vxlan ports use by default, so a kernel VXLAN device and an OVS
// vxlan port interoperate.
const VXLANPort = 4789

// KernelVXLAN is a kernel VXLAN device that the userspace datapath uses as
// an ordinary port (its Interface type is "", like a veth) instead of OVS's
// own vxlan port. Packets for a peer Node carry that peer's
// pipeline.PeerMAC as inner destination; the device's forwarding database
// maps each PeerMAC to the peer's Node IP (AddPeer), and the kernel
// encapsulates, routes the outer packet from the Node IP and, for large
// (TSO) packets, segments after encapsulating, which OVS 3.1's userspace
// tunnels cannot do. Received packets are decapsulated by the kernel (with
// GRO) and read by OVS from the device.
//
// The device uses VNI 0 and UDP port 4789, as OVS's flow-based vxlan port
// does with key=flow and no tun_id set, so Nodes using either can talk to
// each other (during a rolling upgrade).
type KernelVXLAN struct {
	// Name is the device name (the tunnel port's name).
	Name string
}

// Ensure creates the device, or brings an existing one to the desired
// state: VNI 0, destination port 4789, source address local, no learning
// (only the entries AddPeer writes), MTU mtu (bytes: the largest inner
// IPv4 packet; the agent passes its tunnel MTU, transport MTU - Overhead
// or the configured mtu), up, IPv6 off. An nftables netdev ingress chain
// (table netdev seine-tunnel) drops what the kernel itself would receive
// on it: OVS reads the device through AF_PACKET, which sees packets before
// that hook, and the inner packets are the bridge's alone.
//
// Errors: a device of that name that is not a VXLAN device, netlink or
// nftables failures.
func (k KernelVXLAN) Ensure(ctx context.Context, nft knftables.Interface, local net.IP, mtu int) error {
	want := &netlink.Vxlan{
		LinkAttrs: netlink.LinkAttrs{Name: k.Name, MTU: mtu},
		VxlanId:   0,
		SrcAddr:   local.To4(),
		Port:      VXLANPort,
		Learning:  false,
	}
	link, err := netlink.LinkByName(k.Name)
	if err == nil {
		vx, ok := link.(*netlink.Vxlan)
		if !ok {
			return fmt.Errorf("tunnel device %s exists and is a %s device, not vxlan", k.Name, link.Type())
		}
		if vx.VxlanId != 0 || vx.Port != VXLANPort || vx.Learning || !vx.SrcAddr.Equal(local) {
			// Fixed at creation: recreate it.
			if err := netlink.LinkDel(link); err != nil {
				return fmt.Errorf("replacing tunnel device %s: %w", k.Name, err)
			}
			link = nil
		}
	} else if !isNotFound(err) {
		return fmt.Errorf("tunnel device %s: %w", k.Name, err)
	} else {
		link = nil
	}
	if link == nil {
		if err := netlink.LinkAdd(want); err != nil {
			return fmt.Errorf("creating VXLAN device %s: %w", k.Name, err)
		}
		if link, err = netlink.LinkByName(k.Name); err != nil {
			return fmt.Errorf("tunnel device %s: %w", k.Name, err)
		}
	}
	if link.Attrs().MTU != mtu {
		if err := netlink.LinkSetMTU(link, mtu); err != nil {
			return fmt.Errorf("MTU of %s: %w", k.Name, err)
		}
	}
	if err := os.WriteFile("/proc/sys/net/ipv6/conf/"+k.Name+"/disable_ipv6", []byte("1"), 0o644); err != nil &&
		!errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("disabling IPv6 on %s: %w", k.Name, err)
	}
	if err := netlink.LinkSetUp(link); err != nil {
		return fmt.Errorf("bringing up %s: %w", k.Name, err)
	}
	return dropKernelIngress(ctx, nft, k.Name)
}

// AddPeer maps the peer's PeerMAC to its Node IP in the device's
// forwarding database (bridge fdb replace <mac> dev <name> dst <ip> self
// permanent); a peer whose IP changed gets its entry replaced.
func (k KernelVXLAN) AddPeer(nodeIP net.IP) error {
	link, err := netlink.LinkByName(k.Name)
	if err != nil {
		return fmt.Errorf("tunnel device %s: %w", k.Name, err)
	}
	if err := netlink.NeighSet(k.fdbEntry(link, nodeIP)); err != nil {
		return fmt.Errorf("forwarding entry of peer %s on %s: %w", nodeIP, k.Name, err)
	}
	return nil
}

// RemovePeer deletes the peer's forwarding entry; a missing entry or
// device is not an error.
func (k KernelVXLAN) RemovePeer(nodeIP net.IP) error {
	link, err := netlink.LinkByName(k.Name)
	if isNotFound(err) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("tunnel device %s: %w", k.Name, err)
	}
	if err := netlink.NeighDel(k.fdbEntry(link, nodeIP)); err != nil && !errors.Is(err, syscall.ENOENT) {
		return fmt.Errorf("removing forwarding entry of peer %s on %s: %w", nodeIP, k.Name, err)
	}
	return nil
}

// Peers lists the Node IPs of the device's peer entries (those whose MAC
// is the PeerMAC of their destination).
func (k KernelVXLAN) Peers() ([]net.IP, error) {
	link, err := netlink.LinkByName(k.Name)
	if err != nil {
		return nil, fmt.Errorf("tunnel device %s: %w", k.Name, err)
	}
	entries, err := netlink.NeighList(link.Attrs().Index, unix.AF_BRIDGE)
	if err != nil {
		return nil, fmt.Errorf("forwarding entries of %s: %w", k.Name, err)
	}
	var out []net.IP
	for _, e := range entries {
		if e.IP != nil && e.IP.To4() != nil && e.HardwareAddr.String() == pipeline.PeerMAC(e.IP).String() {
			out = append(out, e.IP.To4())
		}
	}
	return out, nil
}

func (k KernelVXLAN) fdbEntry(link netlink.Link, nodeIP net.IP) *netlink.Neigh {
	return &netlink.Neigh{
		LinkIndex:    link.Attrs().Index,
		Family:       unix.AF_BRIDGE,
		State:        netlink.NUD_PERMANENT | netlink.NUD_NOARP,
		Flags:        netlink.NTF_SELF,
		IP:           nodeIP.To4(),
		HardwareAddr: pipeline.PeerMAC(nodeIP),
	}
}

// Remove deletes the device and its nftables table; missing ones are not
// an error.
func (k KernelVXLAN) Remove(ctx context.Context, nft knftables.Interface) error {
	if link, err := netlink.LinkByName(k.Name); err == nil {
		if _, ok := link.(*netlink.Vxlan); ok {
			if err := netlink.LinkDel(link); err != nil {
				return fmt.Errorf("deleting tunnel device %s: %w", k.Name, err)
			}
		}
	} else if !isNotFound(err) {
		return fmt.Errorf("tunnel device %s: %w", k.Name, err)
	}
	if err := nftables.DeleteTable(ctx, nft); err != nil {
		return fmt.Errorf("deleting nftables table: %w", err)
	}
	return nil
}

func isNotFound(err error) bool {
	var nf netlink.LinkNotFoundError
	return err != nil && errors.As(err, &nf)
}
