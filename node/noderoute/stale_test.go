package noderoute

import (
	"errors"
	"fmt"
	"net"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/vishvananda/netlink"
	"go.uber.org/zap/zaptest"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes/fake"

	"github.com/seine-net/seine/node/config"
	"github.com/seine-net/seine/tests/netnstest"
)

// errInjected is the failure the flaky fakes return.
var errInjected = errors.New("injected failure")

// flakyRoutes is the kernel's route table with failures the kernel does
// not produce on demand: the next interrupt dumps return the first half of
// the real result with netlink.ErrDumpInterrupted, as a dump racing a
// change does, and the first delete of each destination in refuse fails.
type flakyRoutes struct {
	routeTable
	mu        sync.Mutex
	interrupt int
	dumps     int
	refuse    map[string]bool
}

func (f *flakyRoutes) list(filter *netlink.Route, mask uint64) ([]netlink.Route, error) {
	out, err := f.routeTable.list(filter, mask)
	f.mu.Lock()
	defer f.mu.Unlock()
	f.dumps++
	if err == nil && f.interrupt > 0 {
		f.interrupt--
		return out[:len(out)/2], netlink.ErrDumpInterrupted
	}
	return out, err
}

func (f *flakyRoutes) del(r *netlink.Route) error {
	f.mu.Lock()
	refused := f.refuse[r.Dst.String()]
	delete(f.refuse, r.Dst.String())
	f.mu.Unlock()
	if refused {
		return errInjected
	}
	return f.routeTable.del(r)
}

// flakyTunnel is tunnelRec whose Peers returns the errors in peersErrs
// first, one a call, and whose RemovePeer fails once for each IP in
// refuse.
type flakyTunnel struct {
	tunnelRec
	mu        sync.Mutex
	peersErrs []error
	refuse    map[string]bool
}

func (f *flakyTunnel) Peers() ([]net.IP, error) {
	f.mu.Lock()
	if len(f.peersErrs) > 0 {
		err := f.peersErrs[0]
		f.peersErrs = f.peersErrs[1:]
		f.mu.Unlock()
		return nil, err
	}
	f.mu.Unlock()
	return f.tunnelRec.Peers()
}

func (f *flakyTunnel) RemovePeer(ip net.IP) error {
	f.mu.Lock()
	refused := f.refuse[ip.String()]
	delete(f.refuse, ip.String())
	f.mu.Unlock()
	if refused {
		return errInjected
	}
	return f.tunnelRec.RemovePeer(ip)
}

// newBareController returns an encap controller of Node "self" over an
// informer that knows no Node (nothing installed: everything is stale).
func newBareController(t *testing.T, cfg Config) *Controller {
	t.Helper()
	cfg.NodeName, cfg.Mode, cfg.Flows, cfg.SNAT = "self", config.ModeEncap, flowRec{&journal{}}, snatRec{}
	f := informers.NewSharedInformerFactory(fake.NewSimpleClientset(), 0)
	c, err := New(f.Core().V1().Nodes(), cfg, zaptest.NewLogger(t))
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// TestRemoveStaleRoutesPersists: an interrupted route dump is started
// again rather than ending the removal, and a route the kernel refuses to
// delete leaves the others deleted, is reported, and goes on the next
// call.
func TestRemoveStaleRoutesPersists(t *testing.T) {
	netnstest.Run(t, func() {
		run(t, "ip", "link", "add", "gw0", "type", "veth", "peer", "name", "gw0p")
		run(t, "ip", "link", "set", "gw0", "up")
		run(t, "ip", "link", "set", "gw0p", "up")
		run(t, "ip", "addr", "add", "10.244.1.1/24", "dev", "gw0")
		for _, n := range []string{"7", "8", "9"} {
			run(t, "ip", "route", "add", "10.244."+n+".0/24", "via", "10.244."+n+".1", "dev", "gw0", "onlink", "proto", "95")
		}
		c := newBareController(t, Config{Gateway: "gw0"})
		flaky := &flakyRoutes{routeTable: c.routes, interrupt: dumpAttempts - 1, refuse: map[string]bool{"10.244.8.0/24": true}}
		c.routes = flaky

		err := c.removeStaleRoutes()
		if !errors.Is(err, errInjected) || !strings.Contains(err.Error(), "10.244.8.0/24") {
			t.Errorf("first removal: %v, want the refused delete of 10.244.8.0/24", err)
		}
		if flaky.dumps != dumpAttempts {
			t.Errorf("%d dumps, want %d (interrupted ones started again)", flaky.dumps, dumpAttempts)
		}
		const base = "10.244.1.0/24 dev gw0 proto kernel scope link src 10.244.1.1"
		if got, want := routes(t), base+"\n10.244.8.0/24 via 10.244.8.1 dev gw0 proto 95 onlink"; got != want {
			t.Errorf("after the first removal, routes\n%s\nwant\n%s", got, want)
		}
		if err := c.removeStaleRoutes(); err != nil {
			t.Errorf("second removal: %v", err)
		}
		if got := routes(t); got != base {
			t.Errorf("after the second removal, routes\n%s\nwant\n%s", got, base)
		}

		// A dump interrupted every time is an error naming the cause,
		// and nothing is deleted from its partial result.
		run(t, "ip", "route", "add", "10.244.9.0/24", "via", "10.244.9.1", "dev", "gw0", "onlink", "proto", "95")
		flaky.interrupt = dumpAttempts
		if err := c.removeStaleRoutes(); !errors.Is(err, netlink.ErrDumpInterrupted) {
			t.Errorf("removal over interrupted dumps: %v, want netlink.ErrDumpInterrupted", err)
		}
		if got := routes(t); !strings.Contains(got, "10.244.9.0/24") {
			t.Errorf("a route was deleted from an interrupted dump:\n%s", got)
		}
	})
}

// TestRemoveStaleTunnelPeersPersists: an interrupted listing of the
// tunnel's peers is started again, and an entry the device refuses to
// remove leaves the others removed, is reported, and goes on the next
// call.
func TestRemoveStaleTunnelPeersPersists(t *testing.T) {
	j := &journal{ips: []string{"198.19.240.98", "198.19.240.99"}}
	tun := &flakyTunnel{tunnelRec: tunnelRec{j},
		peersErrs: []error{fmt.Errorf("forwarding entries of seine-vxlan: %w", netlink.ErrDumpInterrupted)},
		refuse:    map[string]bool{"198.19.240.98": true}}
	c := newBareController(t, Config{Tunnel: tun})

	err := c.removeStaleTunnelPeers()
	if !errors.Is(err, errInjected) || !strings.Contains(err.Error(), "198.19.240.98") {
		t.Errorf("first removal: %v, want the refused removal of 198.19.240.98", err)
	}
	j.mu.Lock()
	left := slices.Clone(j.ips)
	j.mu.Unlock()
	if !slices.Equal(left, []string{"198.19.240.98"}) {
		t.Errorf("after the first removal the tunnel knows %v, want only the refused 198.19.240.98", left)
	}
	if err := c.removeStaleTunnelPeers(); err != nil {
		t.Errorf("second removal: %v", err)
	}
	j.mu.Lock()
	left = slices.Clone(j.ips)
	j.mu.Unlock()
	if len(left) != 0 {
		t.Errorf("after the second removal the tunnel knows %v, want none", left)
	}
}
