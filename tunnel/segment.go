package tunnel

import (
	"errors"
	"fmt"
	"os"

	"github.com/vishvananda/netlink"

	"github.com/seine-net/seine/datapath/offload"
)

// SegmentPair is the veth pair through which, with userspace TSO, packets
// bound for an OVS userspace tunnel port (geneve, gre) leave the bridge
// once before being encapsulated: Out has no checksum or segmentation
// offload, so the kernel segments each large packet OVS writes to it and
// completes its checksums (validate_xmit_skb), and the segments arrive on
// In, from which OVS reads them back (pipeline.TunnelSegmented). OVS 3.1
// drops offloaded packets at a userspace tunnel port instead
// ("Tunneling packets with HW offload flags is not supported"); OVS 3.3
// segments in software itself.
type SegmentPair struct {
	Out, In string
}

// DefaultSegmentPair names the pair's ends.
var DefaultSegmentPair = SegmentPair{Out: "seine-seg0", In: "seine-seg1"}

// Ensure creates the pair if missing and sets both ends' MTU (the Pod MTU:
// the largest inner frame), Out's transmit offloads off, IPv6 off on both
// (nothing of the host's should enter the bridge through them), and both
// up. It is idempotent.
func (s SegmentPair) Ensure(mtu int) error {
	if _, err := netlink.LinkByName(s.Out); isNotFound(err) {
		_ = deleteLinkNamed(s.In)
		if err := netlink.LinkAdd(&netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: s.Out, MTU: mtu}, PeerName: s.In}); err != nil {
			return fmt.Errorf("creating segmentation veth pair %s/%s: %w", s.Out, s.In, err)
		}
	} else if err != nil {
		return fmt.Errorf("segmentation port %s: %w", s.Out, err)
	}
	for _, name := range []string{s.Out, s.In} {
		link, err := netlink.LinkByName(name)
		if err != nil {
			return fmt.Errorf("segmentation port %s: %w", name, err)
		}
		if link.Attrs().MTU != mtu {
			if err := netlink.LinkSetMTU(link, mtu); err != nil {
				return fmt.Errorf("MTU of %s: %w", name, err)
			}
		}
		if err := os.WriteFile("/proc/sys/net/ipv6/conf/"+name+"/disable_ipv6", []byte("1"), 0o644); err != nil &&
			!errors.Is(err, os.ErrNotExist) {
			return fmt.Errorf("disabling IPv6 on %s: %w", name, err)
		}
	}
	if err := offload.DisableTx(s.Out); err != nil {
		return err
	}
	for _, name := range []string{s.Out, s.In} {
		link, err := netlink.LinkByName(name)
		if err != nil {
			return fmt.Errorf("segmentation port %s: %w", name, err)
		}
		if err := netlink.LinkSetUp(link); err != nil {
			return fmt.Errorf("bringing up %s: %w", name, err)
		}
	}
	return nil
}

// Remove deletes the pair; a missing pair is not an error.
func (s SegmentPair) Remove() error {
	return deleteLinkNamed(s.Out)
}

func deleteLinkNamed(name string) error {
	link, err := netlink.LinkByName(name)
	if isNotFound(err) {
		return nil
	}
	if err != nil {
		return err
	}
	if err := netlink.LinkDel(link); err != nil {
		return fmt.Errorf("deleting %s: %w", name, err)
	}
	return nil
}
