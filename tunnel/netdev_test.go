package tunnel

import (
	"errors"
	"fmt"
	"slices"
	"syscall"
	"testing"

	"github.com/vishvananda/netlink"
	"go.uber.org/zap/zaptest"

	"github.com/seine-net/seine/tests/netnstest"
)

// vethUp creates a veth pair with both ends up (so name has carrier) and
// returns name's link.
func vethUp(t *testing.T, name, peer string) netlink.Link {
	t.Helper()
	ipCmd(t, "link", "add", name, "type", "veth", "peer", "name", peer)
	ipCmd(t, "link", "set", peer, "up")
	ipCmd(t, "link", "set", name, "up")
	l, err := netlink.LinkByName(name)
	if err != nil {
		t.Fatal(err)
	}
	return l
}

// mainRoutes returns the destinations of the routes in the main table
// through the link named name that the kernel did not add itself, with
// their metric and preferred source when set.
func mainRoutes(t *testing.T, name string) []string {
	t.Helper()
	l, err := netlink.LinkByName(name)
	if err != nil {
		t.Fatal(err)
	}
	rs, err := netlink.RouteListFiltered(netlink.FAMILY_V4,
		&netlink.Route{LinkIndex: l.Attrs().Index, Table: syscall.RT_TABLE_MAIN},
		netlink.RT_FILTER_OIF|netlink.RT_FILTER_TABLE)
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, r := range rs {
		if r.Protocol == syscall.RTPROT_KERNEL {
			continue
		}
		dst := "default"
		if r.Dst != nil && r.Dst.IP != nil && !r.Dst.IP.IsUnspecified() {
			dst = r.Dst.String()
		}
		if r.Priority != 0 {
			dst += fmt.Sprintf(" metric %d", r.Priority)
		}
		if r.Src != nil {
			dst += " src " + r.Src.String()
		}
		out = append(out, dst)
	}
	slices.Sort(out)
	return out
}

// TestMoveAddressesTargetGone moves a Node's address and default route to
// a link deleted in the meantime, in a fresh network namespace: the move
// fails at its first step, with ENODEV, and the source keeps both, so
// the Node keeps its address and a later run can still move them.
func TestMoveAddressesTargetGone(t *testing.T) {
	netnstest.Run(t, func() {
		from := vethUp(t, "tp0", "tp1")
		ipCmd(t, "addr", "add", "198.18.77.2/24", "dev", "tp0")
		ipCmd(t, "route", "add", "default", "via", "198.18.77.1", "dev", "tp0")
		gone := vethUp(t, "gone0", "gone1")
		ipCmd(t, "link", "del", "gone0")

		err := moveAddresses(from, gone, zaptest.NewLogger(t))
		if !errors.Is(err, syscall.ENODEV) {
			t.Fatalf("move to a deleted link: %v, want ENODEV", err)
		}
		if got := addrsOf(t, "tp0"); !slices.Equal(got, []string{"198.18.77.2/24"}) {
			t.Errorf("source addresses %v, want [198.18.77.2/24]", got)
		}
		if got := mainRoutes(t, "tp0"); !slices.Equal(got, []string{"default"}) {
			t.Errorf("source routes %v, want [default]", got)
		}
		if dev := routeDev(t, "198.19.200.9"); dev != "tp0" {
			t.Errorf("default route via %q, want tp0", dev)
		}
	})
}

// TestMoveAddresses moves a primary and a secondary address, the default
// route and a route with a metric and a preferred source from one link to
// another, in fresh network namespaces: from the start, and from the
// states a crash between the steps leaves (the addresses on both links;
// then the routes moved as well). Every run ends with all of it on the
// target and nothing on the source, and a further run changes nothing.
func TestMoveAddresses(t *testing.T) {
	for _, tc := range []struct {
		name string
		// done are the `ip` commands of the steps an earlier run did.
		done [][]string
	}{
		{name: "fresh"},
		{name: "addresses added", done: [][]string{
			{"addr", "add", "198.18.77.2/24", "dev", "br0"},
			{"addr", "add", "198.18.77.3/24", "dev", "br0"},
		}},
		{name: "routes moved", done: [][]string{
			{"addr", "add", "198.18.77.2/24", "dev", "br0"},
			{"addr", "add", "198.18.77.3/24", "dev", "br0"},
			{"route", "replace", "default", "via", "198.18.77.1", "dev", "br0"},
			{"route", "replace", "198.18.78.0/24", "via", "198.18.77.1", "src", "198.18.77.2", "metric", "50", "dev", "br0"},
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			netnstest.Run(t, func() {
				from := vethUp(t, "tp0", "tp1")
				to := vethUp(t, "br0", "br1")
				ipCmd(t, "addr", "add", "198.18.77.2/24", "dev", "tp0")
				ipCmd(t, "addr", "add", "198.18.77.3/24", "dev", "tp0")
				ipCmd(t, "route", "add", "default", "via", "198.18.77.1", "dev", "tp0")
				ipCmd(t, "route", "add", "198.18.78.0/24", "via", "198.18.77.1", "src", "198.18.77.2", "metric", "50", "dev", "tp0")
				for _, c := range tc.done {
					ipCmd(t, c...)
				}
				log := zaptest.NewLogger(t)
				for run := 1; run <= 2; run++ {
					if err := moveAddresses(from, to, log); err != nil {
						t.Fatalf("run %d: %v", run, err)
					}
					if got := addrsOf(t, "br0"); !slices.Equal(got, []string{"198.18.77.2/24", "198.18.77.3/24"}) {
						t.Errorf("run %d: target addresses %v", run, got)
					}
					if got := addrsOf(t, "tp0"); len(got) != 0 {
						t.Errorf("run %d: source keeps addresses %v", run, got)
					}
					if got := mainRoutes(t, "br0"); !slices.Equal(got, []string{"198.18.78.0/24 metric 50 src 198.18.77.2", "default"}) {
						t.Errorf("run %d: target routes %v", run, got)
					}
					if got := mainRoutes(t, "tp0"); len(got) != 0 {
						t.Errorf("run %d: source keeps routes %v", run, got)
					}
					if dev := routeDev(t, "198.18.78.9"); dev != "br0" {
						t.Errorf("run %d: 198.18.78.0/24 via %q, want br0", run, dev)
					}
				}
			})
		})
	}
}

// TestMoveAddressesNoCarrier moves the address and routes of a link
// without carrier (its veth peer down), whose routes the kernel lists
// flagged linkdown, in a fresh network namespace: they move all the same.
func TestMoveAddressesNoCarrier(t *testing.T) {
	netnstest.Run(t, func() {
		ipCmd(t, "link", "add", "tp0", "type", "veth", "peer", "name", "tp1")
		ipCmd(t, "link", "set", "tp0", "up")
		from, err := netlink.LinkByName("tp0")
		if err != nil {
			t.Fatal(err)
		}
		to := vethUp(t, "br0", "br1")
		ipCmd(t, "addr", "add", "198.18.77.2/24", "dev", "tp0")
		ipCmd(t, "route", "add", "default", "via", "198.18.77.1", "dev", "tp0")
		if err := moveAddresses(from, to, zaptest.NewLogger(t)); err != nil {
			t.Fatal(err)
		}
		if got := addrsOf(t, "br0"); !slices.Equal(got, []string{"198.18.77.2/24"}) {
			t.Errorf("target addresses %v", got)
		}
		if got := mainRoutes(t, "br0"); !slices.Equal(got, []string{"default"}) {
			t.Errorf("target routes %v", got)
		}
	})
}
