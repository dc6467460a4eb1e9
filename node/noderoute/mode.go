package noderoute

import (
	"net"

	"github.com/vishvananda/netlink"

	"github.com/seine-net/seine/node/config"
)

// Route says how this Node reaches one peer's podCIDR.
type Route int

// The routes a peer can get.
const (
	// RouteNone: seine does not connect the peer (networkPolicyOnly: the
	// primary CNI does).
	RouteNone Route = iota
	// RouteTunnel: encapsulated to the peer's Node IP; a host route sends
	// the podCIDR into the bridge via the peer's gateway IP.
	RouteTunnel
	// RouteDirect: the peer shares this Node's transport subnet; a host
	// route sends its podCIDR to the peer's Node IP, unencapsulated.
	RouteDirect
	// RouteUnderlay: no encapsulation and no route of ours; the underlay
	// routes the podCIDR (noEncap, peer in another subnet).
	RouteUnderlay
)

// String names the route as the metrics and logs do.
func (r Route) String() string {
	switch r {
	case RouteTunnel:
		return "tunnel"
	case RouteDirect:
		return "direct"
	case RouteUnderlay:
		return "underlay"
	}
	return "none"
}

// Routes lists every route kind, for metrics.
func Routes() []Route { return []Route{RouteNone, RouteTunnel, RouteDirect, RouteUnderlay} }

// RouteFor decides how a Node in mode m reaches a peer whose Node IP is
// peerIP, given the IPv4 networks of this Node's transport interface
// (address and prefix of each, see TransportNets): in one of them the
// peer is "in the same subnet".
func RouteFor(m config.TrafficEncapMode, local []*net.IPNet, peerIP net.IP) Route {
	switch m {
	case config.ModeEncap:
		return RouteTunnel
	case config.ModeNetworkPolicyOnly:
		return RouteNone
	}
	for _, n := range local {
		if n.Contains(peerIP) {
			return RouteDirect
		}
	}
	if m == config.ModeHybrid {
		return RouteTunnel
	}
	return RouteUnderlay
}

// TransportNets returns the IPv4 networks of the named interface's
// addresses (a /32 address contributes only itself).
func TransportNets(device string) ([]*net.IPNet, error) {
	link, err := netlink.LinkByName(device)
	if err != nil {
		return nil, err
	}
	addrs, err := netlink.AddrList(link, netlink.FAMILY_V4)
	if err != nil {
		return nil, err
	}
	var out []*net.IPNet
	for _, a := range addrs {
		out = append(out, &net.IPNet{IP: a.IP.Mask(a.Mask), Mask: a.Mask})
	}
	return out, nil
}

func sameNets(a, b []*net.IPNet) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i].String() != b[i].String() {
			return false
		}
	}
	return true
}
