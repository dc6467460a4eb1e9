package flows

import (
	"encoding/binary"
	"fmt"
	"math/bits"
	"net"
	"sort"

	netutils "k8s.io/utils/net"

	of "github.com/seine-net/seine/datapath/openflow"
)

// prefix4 is an IPv4 prefix as (first address, prefix length).
type prefix4 struct {
	addr uint32
	len  int
}

func (p prefix4) last() uint32 {
	if p.len == 0 {
		return 0xffffffff
	}
	return p.addr | (1<<(32-p.len) - 1)
}

func (p prefix4) contains(q prefix4) bool {
	return q.len >= p.len && q.addr >= p.addr && q.last() <= p.last()
}

func (p prefix4) overlaps(q prefix4) bool {
	return p.addr <= q.last() && q.addr <= p.last()
}

func (p prefix4) ipNet() *net.IPNet {
	ip := make(net.IP, 4)
	binary.BigEndian.PutUint32(ip, p.addr)
	return &net.IPNet{IP: ip, Mask: net.CIDRMask(p.len, 32)}
}

// parsePrefix4 parses an IPv4 CIDR, normalising host bits away. ok is false
// for IPv6 prefixes (Seine's pipeline is IPv4-only); err for malformed ones.
// Leading zeros ("010.0.0.0/8") are read as decimal, as the API server
// admitted them before Kubernetes 1.33's strict validation: objects
// stored then keep them (k8s.io/utils/net ParseCIDRSloppy).
func parsePrefix4(s string) (p prefix4, ok bool, err error) {
	_, n, err := netutils.ParseCIDRSloppy(s)
	if err != nil {
		return prefix4{}, false, fmt.Errorf("parse CIDR %q: %w", s, err)
	}
	ip4 := n.IP.To4()
	ones, sz := n.Mask.Size()
	if ip4 == nil || sz != 32 {
		return prefix4{}, false, nil
	}
	return prefix4{addr: binary.BigEndian.Uint32(ip4), len: ones}, true, nil
}

// SubtractCIDRs returns the smallest set of IPv4 prefixes covering cidr
// minus every prefix of except (a NetworkPolicy ipBlock): the prefix is
// halved recursively until each half is either disjoint from every except
// (kept) or inside one (dropped). The result is sorted by address; an
// except outside cidr is ignored. IPv6 input yields no prefix (the
// pipeline only carries IPv4). Errors name a malformed CIDR.
func SubtractCIDRs(cidr string, except []string) ([]*net.IPNet, error) {
	base, ok, err := parsePrefix4(cidr)
	if err != nil || !ok {
		return nil, err
	}
	var ex []prefix4
	for _, e := range except {
		p, ok, err := parsePrefix4(e)
		if err != nil {
			return nil, err
		}
		if ok && base.overlaps(p) {
			ex = append(ex, p)
		}
	}
	var out []prefix4
	var split func(p prefix4)
	split = func(p prefix4) {
		overlap := false
		for _, e := range ex {
			if e.contains(p) {
				return
			}
			if e.overlaps(p) {
				overlap = true
			}
		}
		if !overlap {
			out = append(out, p)
			return
		}
		half := prefix4{addr: p.addr, len: p.len + 1}
		split(half)
		split(prefix4{addr: p.addr | 1<<(31-p.len), len: p.len + 1})
	}
	split(base)
	sort.Slice(out, func(i, j int) bool { return out[i].addr < out[j].addr })
	nets := make([]*net.IPNet, len(out))
	for i, p := range out {
		nets[i] = p.ipNet()
	}
	return nets, nil
}

// PortRange returns masked port matches covering exactly lo..hi (inclusive,
// lo <= hi): the fewest aligned power-of-two blocks, as ovs-fields(7)
// suggests for tp_dst ranges ("TCP/UDP port ranges as bitwise matches").
// A single port yields one exact match (mask 0xffff). The whole range
// 0..65535 yields nil: match the protocol without a port (a zero
// of.PortMatch mask would mean "exact", not "any").
func PortRange(lo, hi uint16) []of.PortMatch {
	if lo == 0 && hi == 0xffff {
		return nil
	}
	var out []of.PortMatch
	l, h := uint32(lo), uint32(hi)
	for l <= h {
		// Largest block aligned at l: its size is the lowest set bit of l
		// (any size for l == 0), shrunk until it ends at or before h.
		size := uint32(1) << 16
		if l != 0 {
			size = uint32(1) << bits.TrailingZeros32(l)
		}
		for l+size-1 > h {
			size >>= 1
		}
		out = append(out, of.PortMatch{Port: uint16(l), Mask: uint16(^(size - 1))})
		l += size
	}
	return out
}
