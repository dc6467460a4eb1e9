package tunnel

import (
	"context"
	"errors"
	"net"
	"os/exec"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/vishvananda/netlink"
	"go.uber.org/zap/zaptest"
	"sigs.k8s.io/knftables"

	"github.com/seine-net/seine/datapath/ovsdb"
	"github.com/seine-net/seine/datapath/ovstest"
	"github.com/seine-net/seine/tests/netnstest"
)

// addrsOf returns the IPv4 addresses of a link as CIDR strings.
func addrsOf(t *testing.T, name string) []string {
	t.Helper()
	l, err := netlink.LinkByName(name)
	if err != nil {
		return nil
	}
	as, err := netlink.AddrList(l, netlink.FAMILY_V4)
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, a := range as {
		out = append(out, a.IPNet.String())
	}
	return out
}

// routeDev returns the device of the route to dst.
func routeDev(t *testing.T, dst string) string {
	t.Helper()
	rs, err := netlink.RouteGet(net.ParseIP(dst))
	if err != nil || len(rs) == 0 {
		return ""
	}
	l, err := netlink.LinkByIndex(rs[0].LinkIndex)
	if err != nil {
		return ""
	}
	return l.Attrs().Name
}

// TestAttachDetachNetdev hands a device to a real userspace switch and
// back, in a fresh network namespace: attached, the address and the
// gateway route are on the bridge and the kernel's ingress on the device
// is dropped; detached, they are on the device again, the drop is gone,
// and so is the bridge. Attaching again works.
func TestAttachDetachNetdev(t *testing.T) {
	netnstest.Run(t, func() {
		ipCmd(t, "link", "add", "tp0", "type", "veth", "peer", "name", "tp1")
		ipCmd(t, "link", "set", "tp1", "up")
		ipCmd(t, "link", "set", "tp0", "up")
		ipCmd(t, "addr", "add", "198.18.77.2/24", "dev", "tp0")
		ipCmd(t, "route", "add", "198.18.78.0/24", "via", "198.18.77.1")
		o := ovstest.Start(t)
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		log := zaptest.NewLogger(t)
		c, err := ovsdb.Dial(ctx, o.DBSocket(), log)
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		nft, err := knftables.New(knftables.NetDevFamily, TransportTable)
		if err != nil {
			t.Fatal(err)
		}
		nftTables := func() string {
			out, _ := exec.Command("nft", "list", "tables").CombinedOutput()
			return string(out)
		}
		for round := 1; round <= 2; round++ {
			if _, err := AttachNetdev(ctx, c, nft, "br-tp", "tp0", log); err != nil {
				t.Fatalf("round %d: attach: %v", round, err)
			}
			if got := addrsOf(t, "br-tp"); len(got) != 1 || got[0] != "198.18.77.2/24" {
				t.Errorf("round %d: bridge addresses %v", round, got)
			}
			if got := addrsOf(t, "tp0"); len(got) != 0 {
				t.Errorf("round %d: device keeps addresses %v", round, got)
			}
			if dev := routeDev(t, "198.18.78.9"); dev != "br-tp" {
				t.Errorf("round %d: route via %q, want br-tp", round, dev)
			}
			if !strings.Contains(nftTables(), "netdev seine-transport") {
				t.Errorf("round %d: no ingress drop table: %s", round, nftTables())
			}
			if err := DetachNetdev(ctx, c, nft, "br-tp", log); err != nil {
				t.Fatalf("round %d: detach: %v", round, err)
			}
			if got := addrsOf(t, "tp0"); len(got) != 1 || got[0] != "198.18.77.2/24" {
				t.Errorf("round %d: device addresses after detach %v", round, got)
			}
			if dev := routeDev(t, "198.18.78.9"); dev != "tp0" {
				t.Errorf("round %d: route after detach via %q, want tp0", round, dev)
			}
			if strings.Contains(nftTables(), "seine-transport") {
				t.Errorf("round %d: ingress drop table left: %s", round, nftTables())
			}
			if out, _ := o.TryRun("ovs-vsctl", "list-br"); strings.Contains(out, "br-tp") {
				t.Errorf("round %d: bridge left: %s", round, out)
			}
		}
		// Nothing to detach is fine.
		if err := DetachNetdev(ctx, c, nft, "br-tp", log); err != nil {
			t.Errorf("detach without a bridge: %v", err)
		}
	})
}

// fakeBridges is an OVSDB with one bridge whose ports are ports (or none,
// listErr), recording the bridges DetachNetdev deletes.
type fakeBridges struct {
	ports   []ovsdb.Port
	listErr error
	deleted []string
}

func (f *fakeBridges) EnsureBridge(context.Context, ovsdb.BridgeConfig) error {
	return errors.New("fakeBridges: EnsureBridge not expected")
}

func (f *fakeBridges) EnsurePort(context.Context, string, ovsdb.PortSpec) (ovsdb.Port, error) {
	return ovsdb.Port{}, errors.New("fakeBridges: EnsurePort not expected")
}

func (f *fakeBridges) ListPorts(context.Context, string) ([]ovsdb.Port, error) {
	return f.ports, f.listErr
}

func (f *fakeBridges) DeleteBridge(_ context.Context, name string) error {
	f.deleted = append(f.deleted, name)
	return nil
}

// TestDetachNetdevKeepsBridge runs DetachNetdev against a fake OVSDB and
// nftables in fresh network namespaces: whenever the Node's address could
// still be on the bridge's interface (the transport port it lists is not
// there, or the bridge lists none and its interface holds an address),
// it fails and leaves the drop table and the bridge alone. When the
// address moves back, or the bridge is not in OVSDB at all (a link of its
// name is then not OVS's), both are removed.
func TestDetachNetdevKeepsBridge(t *testing.T) {
	bridgePort := ovsdb.Port{Name: "br-tp", Type: "internal"}
	for _, tc := range []struct {
		name string
		// links are the veths made (both ends up), the Node IP on the
		// first one, with a default route.
		links   []string
		pm      fakeBridges
		wantErr bool
		// addrOn is the link expected to hold the Node IP afterwards.
		addrOn string
	}{
		{name: "bridge interface and transport port missing", pm: fakeBridges{ports: []ovsdb.Port{bridgePort, {Name: "tp0"}}},
			wantErr: true},
		{name: "transport port missing, Node IP on the bridge", links: []string{"br-tp"},
			pm: fakeBridges{ports: []ovsdb.Port{bridgePort, {Name: "tp0"}}}, wantErr: true, addrOn: "br-tp"},
		{name: "no transport port, Node IP on the bridge", links: []string{"br-tp", "tp0"},
			pm: fakeBridges{ports: []ovsdb.Port{bridgePort}}, wantErr: true, addrOn: "br-tp"},
		{name: "moved back", links: []string{"br-tp", "tp0"},
			pm: fakeBridges{ports: []ovsdb.Port{bridgePort, {Name: "tp0"}}}, addrOn: "tp0"},
		{name: "bridge not in OVSDB", links: []string{"br-tp"},
			pm: fakeBridges{listErr: ovsdb.ErrBridgeNotFound}, addrOn: "br-tp"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			netnstest.Run(t, func() {
				for i, l := range tc.links {
					vethUp(t, l, l+"p")
					if i == 0 {
						ipCmd(t, "addr", "add", "198.18.77.2/24", "dev", l)
						ipCmd(t, "route", "add", "default", "via", "198.18.77.1", "dev", l)
					}
				}
				ctx := context.Background()
				nft := knftables.NewFake(knftables.NetDevFamily, TransportTable)
				if err := dropKernelIngress(ctx, nft, "tp0"); err != nil {
					t.Fatal(err)
				}
				pm := tc.pm
				err := DetachNetdev(ctx, &pm, nft, "br-tp", zaptest.NewLogger(t))
				if tc.wantErr {
					if err == nil {
						t.Fatal("no error")
					}
					t.Logf("error: %v", err)
					if len(pm.deleted) != 0 {
						t.Errorf("bridges deleted: %v", pm.deleted)
					}
					if nft.Table == nil {
						t.Error("drop table removed")
					}
				} else {
					if err != nil {
						t.Fatal(err)
					}
					if !slices.Equal(pm.deleted, []string{"br-tp"}) {
						t.Errorf("bridges deleted: %v, want [br-tp]", pm.deleted)
					}
					if nft.Table != nil {
						t.Error("drop table left")
					}
				}
				if tc.addrOn != "" {
					if got := addrsOf(t, tc.addrOn); !slices.Equal(got, []string{"198.18.77.2/24"}) {
						t.Errorf("addresses of %s: %v", tc.addrOn, got)
					}
					if dev := routeDev(t, "198.19.200.9"); dev != tc.addrOn {
						t.Errorf("default route via %q, want %s", dev, tc.addrOn)
					}
				}
			})
		})
	}
}
