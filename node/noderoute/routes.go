package noderoute

import (
	"errors"
	"fmt"

	"github.com/vishvananda/netlink"
)

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

// dumpAttempts is how many times redump starts a dump the kernel keeps
// interrupting before it gives up.
const dumpAttempts = 5

// redump runs dump again, at once, while the kernel reports it interrupted:
// a multi-part netlink dump that raced a change of the table it lists
// (NLM_F_DUMP_INTR, which vishvananda/netlink since v1.2.1 returns as
// netlink.ErrDumpInterrupted along with a partial result). An interrupted
// result may lack entries or hold ones already gone, so it is never
// returned: after dumpAttempts interrupted dumps the error, wrapping
// netlink.ErrDumpInterrupted, is, and the caller retries later.
//
// containernetworking's netlinksafe retries the same way but, after its
// last attempt, returns the partial result as a success; a cleanup that
// needs every entry cannot use that.
func redump[T any](dump func() (T, error)) (T, error) {
	var err error
	for range dumpAttempts {
		var out T
		if out, err = dump(); !errors.Is(err, netlink.ErrDumpInterrupted) {
			return out, err
		}
	}
	var none T
	return none, fmt.Errorf("dump interrupted %d times: %w", dumpAttempts, err)
}
