package noderoute

import "github.com/vishvananda/netlink"

// routeTable is the part of rtnetlink the controller changes host routes
// with. The controller uses kernelRoutes; tests wrap it to inject what the
// kernel does not produce on demand (an interrupted dump, a refused
// delete).
type routeTable interface {
	// list dumps the IPv4 routes matching filter's fields selected by
	// mask (netlink.RT_FILTER_*).
	list(filter *netlink.Route, mask uint64) ([]netlink.Route, error)
	replace(r *netlink.Route) error
	del(r *netlink.Route) error
}

// kernelRoutes is the routeTable of the calling thread's network
// namespace.
type kernelRoutes struct{}

func (kernelRoutes) list(filter *netlink.Route, mask uint64) ([]netlink.Route, error) {
	return netlink.RouteListFiltered(netlink.FAMILY_V4, filter, mask)
}

func (kernelRoutes) replace(r *netlink.Route) error { return netlink.RouteReplace(r) }

func (kernelRoutes) del(r *netlink.Route) error { return netlink.RouteDel(r) }
