package podnet

import (
	"crypto/rand"
	"errors"
	"fmt"
	"net"

	"github.com/containernetworking/plugins/pkg/ns"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
)

// createVeth creates a Pod's veth pair from the daemon's own network
// namespace: hostName (with hostMAC) stays here, its peer podIfName
// (with podMAC) is created directly in podNS, both with mtu. It returns
// the host end, still down.
//
// The host end is a bridge port and nothing more, so before it comes up
// it is made ready for ovs-vswitchd:
//   - It generates no IPv6 address (IFLA_INET6_ADDR_GEN_MODE none; ip-link
//     addrgenmode). Otherwise the kernel gives it a link-local address,
//     runs duplicate address detection from it into the bridge, and
//     announces the address about two seconds later. (Writing the
//     disable_ipv6 sysctl instead costs the kernel about 0.6 ms a Pod.)
//   - It is put in promiscuous mode, which OVS sets on every port it adds
//     anyway (dpif-netdev on the userspace datapath, the openvswitch
//     module's netdev vport on the kernel one).
//
// Both matter because ovs-vswitchd reconfigures every bridge, each port's
// state read back from the kernel, on any link or address notification
// in its namespace (vswitchd/bridge.c, bridge_run: if_notifier_changed).
// Done right after the creation, they reach it together with the
// creation's own notification instead of as later ones
// (docs/benchmarks.md: about three reconfigurations per serial ADD
// instead of four).
//
// The caller deletes hostName on a later failure; an error here leaves
// nothing behind, or says it could not delete the pair again. A podIfName that already exists in podNS fails with
// the kernel's EEXIST, wrapped.
func createVeth(podNS ns.NetNS, hostName string, hostMAC net.HardwareAddr, podIfName string, podMAC net.HardwareAddr, mtu int) (netlink.Link, error) {
	attrs := netlink.NewLinkAttrs()
	attrs.Name = hostName
	attrs.HardwareAddr = hostMAC
	attrs.MTU = mtu
	veth := &netlink.Veth{LinkAttrs: attrs, PeerName: podIfName,
		PeerHardwareAddr: podMAC, PeerNamespace: netlink.NsFd(podNS.Fd())}
	// LinkAdd looks the new link up for its index.
	if err := netlink.LinkAdd(veth); err != nil {
		return nil, fmt.Errorf("creating veth pair %s, %s in %s: %w", hostName, podIfName, podNS.Path(), err)
	}
	if err := prepareHostEnd(veth); err != nil {
		if derr := netlink.LinkDel(veth); derr != nil {
			err = errors.Join(err, fmt.Errorf("deleting it again: %w", derr))
		}
		return nil, fmt.Errorf("veth %s: %w", hostName, err)
	}
	return veth, nil
}

// prepareHostEnd keeps the host end of a Pod's veth from generating IPv6
// addresses and makes it promiscuous (see createVeth). A kernel without
// IPv6 refuses the address generation mode with EAFNOSUPPORT, which is
// fine.
func prepareHostEnd(host netlink.Link) error {
	if err := netlink.LinkSetIP6AddrGenMode(host, in6AddrGenModeNone); err != nil && !errors.Is(err, unix.EAFNOSUPPORT) {
		return fmt.Errorf("IPv6 address generation mode: %w", err)
	}
	if err := netlink.SetPromiscOn(host); err != nil {
		return fmt.Errorf("promiscuous mode: %w", err)
	}
	return nil
}

// in6AddrGenModeNone is IN6_ADDR_GEN_MODE_NONE (linux/if_link.h), which
// golang.org/x/sys/unix does not name.
const in6AddrGenModeNone = 1

// randomMAC returns a random unicast, locally administered MAC address
// (IEEE 802: bit 0 of the first octet clear, bit 1 set), as the kernel
// gives a veth end it is not told the address of.
func randomMAC() (net.HardwareAddr, error) {
	mac := make(net.HardwareAddr, 6)
	if _, err := rand.Read(mac); err != nil {
		return nil, err
	}
	mac[0] = mac[0]&^0x01 | 0x02
	return mac, nil
}
