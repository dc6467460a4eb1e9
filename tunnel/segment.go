package tunnel

import (
	"errors"
	"fmt"
	"os"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/seine-net/seine/datapath/offload"
)

// SegmentPair is the veth pair through which, with userspace TSO, packets
// leave the bridge once to have the kernel segment them and complete their
// checksums: those bound for an OVS userspace tunnel port (geneve, gre;
// OVS 3.1 drops offloaded packets there, "Tunneling packets with HW offload
// flags is not supported", where OVS 3.3 segments in software itself), and
// NATed packets that leave the Node (pipeline.NATChecksumDetour).
//
// Only Port is an OVS port. It has no checksum or segmentation offload, so
// the kernel segments each large packet OVS writes to it and completes its
// checksums (validate_xmit_skb). The segments arrive on Hairpin, the peer
// left to the kernel, whose ingress sends every packet straight back out
// (tc u32 match-all, mirred egress redirect to itself), so they arrive on
// Port, from where OVS reads them: its AF_PACKET socket reads only what the
// device receives, never what it sends. One port rather than the pair:
// the userspace datapath reads every non-PMD port in each turn of its main
// loop, so each port lengthens the wait of every other (with the receive
// buffer datapath/rxbuf keeps, little; docs/benchmarks.md).
type SegmentPair struct {
	Port, Hairpin string
}

// DefaultSegmentPair names the pair's ends.
var DefaultSegmentPair = SegmentPair{Port: "seine-seg0", Hairpin: "seine-seg1"}

// hairpinPriority is the tc priority of the hairpin's filter.
const hairpinPriority = 1

// Ensure creates the pair if missing, sets both ends' MTU to mtu (bytes:
// the largest IPv4 packet, so the largest segment made of what OVS sends
// through Port; the agent passes its tunnel MTU, transport MTU - Overhead
// or the configured mtu), Port's transmit offloads off, IPv6 off on both
// (nothing of the host's should enter the bridge through them), Hairpin's
// redirect, and both up. It is idempotent. Errors name the step and the
// device; a kernel without the ingress qdisc, the u32 classifier or the
// mirred action (CONFIG_NET_SCH_INGRESS, CONFIG_NET_CLS_U32,
// CONFIG_NET_ACT_MIRRED) fails at the ingress qdisc or the redirect.
func (s SegmentPair) Ensure(mtu int) error {
	if _, err := netlink.LinkByName(s.Port); isNotFound(err) {
		_ = deleteLinkNamed(s.Hairpin)
		if err := netlink.LinkAdd(&netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: s.Port, MTU: mtu}, PeerName: s.Hairpin}); err != nil {
			return fmt.Errorf("creating segmentation veth pair %s/%s: %w", s.Port, s.Hairpin, err)
		}
	} else if err != nil {
		return fmt.Errorf("segmentation port %s: %w", s.Port, err)
	}
	for _, name := range []string{s.Port, s.Hairpin} {
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
	if err := offload.DisableTx(s.Port); err != nil {
		return err
	}
	if err := s.ensureHairpin(); err != nil {
		return err
	}
	for _, name := range []string{s.Port, s.Hairpin} {
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

// ensureHairpin gives Hairpin an ingress qdisc with one filter: every
// packet (u32 with no keys matches all) is redirected to Hairpin's own
// egress, back to Port (tc-mirred(8), "egress redirect").
func (s SegmentPair) ensureHairpin() error {
	link, err := netlink.LinkByName(s.Hairpin)
	if err != nil {
		return fmt.Errorf("segmentation hairpin %s: %w", s.Hairpin, err)
	}
	idx := link.Attrs().Index
	ingress := &netlink.Ingress{QdiscAttrs: netlink.QdiscAttrs{LinkIndex: idx,
		Handle: netlink.MakeHandle(0xffff, 0), Parent: netlink.HANDLE_INGRESS}}
	if err := netlink.QdiscAdd(ingress); err != nil && !errors.Is(err, unix.EEXIST) {
		return fmt.Errorf("ingress qdisc on %s: %w", s.Hairpin, err)
	}
	filters, err := netlink.FilterList(link, netlink.HANDLE_MIN_INGRESS)
	if err != nil {
		return fmt.Errorf("tc filters of %s: %w", s.Hairpin, err)
	}
	for _, f := range filters {
		if u, ok := f.(*netlink.U32); ok && u.Priority == hairpinPriority && hairpinsTo(u, idx) {
			return nil
		}
	}
	redirect := netlink.NewMirredAction(idx) // egress redirect, packet stolen
	filter := &netlink.U32{
		FilterAttrs: netlink.FilterAttrs{LinkIndex: idx, Parent: netlink.HANDLE_MIN_INGRESS,
			Priority: hairpinPriority, Protocol: unix.ETH_P_ALL},
		Sel:     &netlink.TcU32Sel{Flags: netlink.TC_U32_TERMINAL, Nkeys: 1, Keys: []netlink.TcU32Key{{}}},
		Actions: []netlink.Action{redirect},
	}
	if err := netlink.FilterReplace(filter); err != nil {
		return fmt.Errorf("hairpin filter on %s (tc u32 with mirred): %w", s.Hairpin, err)
	}
	return nil
}

// hairpinsTo reports whether a u32 filter redirects to ifindex's egress.
func hairpinsTo(u *netlink.U32, ifindex int) bool {
	for _, a := range u.Actions {
		if m, ok := a.(*netlink.MirredAction); ok && m.MirredAction == netlink.TCA_EGRESS_REDIR && m.Ifindex == ifindex {
			return true
		}
	}
	return false
}

// Remove deletes the pair; a missing pair is not an error.
func (s SegmentPair) Remove() error {
	return deleteLinkNamed(s.Port)
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
