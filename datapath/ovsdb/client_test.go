package ovsdb

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"k8s.io/apimachinery/pkg/util/wait"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/vishvananda/netlink"
	"go.uber.org/zap/zaptest"

	"github.com/seine-net/seine/datapath/ovstest"
)

// uniq returns prefix plus a random suffix, short enough for a network
// device name (15 bytes), so parallel test runs in the same network
// namespace do not collide.
func uniq(t *testing.T, prefix string) string {
	t.Helper()
	b := make([]byte, 3)
	if _, err := rand.Read(b); err != nil {
		t.Fatal(err)
	}
	name := prefix + hex.EncodeToString(b)
	if len(name) > 15 {
		t.Fatalf("name %q longer than 15 bytes", name)
	}
	return name
}

// testCtx is a context bounded well below the test timeout.
func testCtx(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	t.Cleanup(cancel)
	return ctx
}

// setup starts a private OVS and a client connected to it.
func setup(t *testing.T) (*ovstest.OVS, *Client) {
	t.Helper()
	o := ovstest.Start(t)
	c, err := Dial(testCtx(t), o.DBSocket(), zaptest.NewLogger(t))
	if err != nil {
		t.Fatalf("Dial: %v", err)
	}
	t.Cleanup(c.Close)
	return o, c
}

// newBridge creates a netdev bridge and registers its deletion.
func newBridge(t *testing.T, c *Client, cfg BridgeConfig) string {
	t.Helper()
	if cfg.Name == "" {
		cfg.Name = uniq(t, "sbr")
	}
	cfg.DatapathType = DatapathNetdev
	if err := c.EnsureBridge(testCtx(t), cfg); err != nil {
		t.Fatalf("EnsureBridge(%s): %v", cfg.Name, err)
	}
	t.Cleanup(func() {
		if err := c.DeleteBridge(context.Background(), cfg.Name); err != nil {
			t.Errorf("DeleteBridge(%s): %v", cfg.Name, err)
		}
	})
	return cfg.Name
}

// vsctl runs ovs-vsctl and trims its output.
func vsctl(o *ovstest.OVS, args ...string) string {
	return strings.TrimSpace(o.Run("ovs-vsctl", args...))
}

func TestDialUnreachable(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	c, err := Dial(ctx, "unix:/nonexistent/seine-test/db.sock", zaptest.NewLogger(t))
	if err == nil {
		c.Close()
		t.Fatal("Dial to a missing socket succeeded")
	}
	if !strings.Contains(err.Error(), "/nonexistent/seine-test/db.sock") {
		t.Errorf("error %q does not name the endpoint", err)
	}
}

func TestEnsureBridge(t *testing.T) {
	o, c := setup(t)
	ctx := testCtx(t)
	name := newBridge(t, c, BridgeConfig{
		ExternalIDs: map[string]string{"owner": "seine", "version": "1"},
		TableNames:  map[uint8]string{0: "classifier", 10: "l2-forward"},
	})

	if got := vsctl(o, "get", "Bridge", name, "datapath_type"); got != "netdev" {
		t.Errorf("datapath_type = %s, want netdev", got)
	}
	if got := vsctl(o, "get", "Bridge", name, "fail_mode"); got != "secure" {
		t.Errorf("fail_mode = %s, want secure", got)
	}
	if got := vsctl(o, "get", "Bridge", name, "protocols"); got != "[OpenFlow10, OpenFlow13, OpenFlow15]" {
		t.Errorf("protocols = %s", got)
	}
	if got := vsctl(o, "list-ports", name); got != "" {
		t.Errorf("list-ports = %q, want none besides the bridge's own port", got)
	}
	if got := vsctl(o, "get", "Interface", name, "type"); got != "internal" {
		t.Errorf("bridge interface type = %s, want internal", got)
	}
	// EnsureBridge waited for ovs-vswitchd, so the OpenFlow side is ready.
	tables := o.Run("ovs-ofctl", "dump-tables", "unix:"+o.MgmtSocket(name))
	for _, want := range []string{`table 0 ("classifier")`, `table 10 ("l2-forward")`} {
		if !strings.Contains(tables, want) {
			t.Errorf("dump-tables lacks %s:\n%s", want, tables)
		}
	}

	// Second call: rename a table, add one, merge external_ids, no duplicates.
	err := c.EnsureBridge(ctx, BridgeConfig{
		Name:         name,
		DatapathType: DatapathNetdev,
		ExternalIDs:  map[string]string{"version": "2"},
		OtherConfig:  map[string]string{"hwaddr": "02:53:45:49:4e:45"},
		FailMode:     FailModeStandalone,
		TableNames:   map[uint8]string{10: "l2-lookup", 20: "output"},
	})
	if err != nil {
		t.Fatalf("EnsureBridge again: %v", err)
	}
	if got := vsctl(o, "get", "Bridge", name, "fail_mode"); got != "standalone" {
		t.Errorf("fail_mode = %s, want standalone", got)
	}
	if got := vsctl(o, "get", "Bridge", name, "other_config:hwaddr"); got != `"02:53:45:49:4e:45"` {
		t.Errorf("other_config:hwaddr = %s", got)
	}
	// ovs-vswitchd applied it to the bridge's own interface.
	if got := vsctl(o, "get", "Interface", name, "mac_in_use"); got != `"02:53:45:49:4e:45"` {
		t.Errorf("mac_in_use of %s = %s, want the hwaddr", name, got)
	}
	if n := vsctl(o, "--columns=name", "--bare", "find", "Bridge", "name="+name); n != name {
		t.Errorf("bridge rows named %s: %q", name, n)
	}
	names := vsctl(o, "--columns=name", "--bare", "list", "Flow_Table")
	for _, want := range []string{"classifier", "l2-lookup", "output"} {
		if !strings.Contains(names, want) {
			t.Errorf("Flow_Table names %q lack %s", names, want)
		}
	}
	if strings.Contains(names, "l2-forward") {
		t.Errorf("Flow_Table names %q still hold the old name l2-forward", names)
	}
	tables = o.Run("ovs-ofctl", "dump-tables", "unix:"+o.MgmtSocket(name))
	if !strings.Contains(tables, `table 20 ("output")`) {
		t.Errorf("dump-tables lacks table 20 (\"output\"):\n%s", tables)
	}
	ids, err := c.BridgeExternalIDs(ctx, name)
	if err != nil {
		t.Fatal(err)
	}
	if ids["owner"] != "seine" || ids["version"] != "2" || len(ids) != 2 {
		t.Errorf("external_ids = %v, want owner=seine version=2", ids)
	}

	// Idempotent: the same config again changes nothing.
	before := vsctl(o, "get", "Open_vSwitch", ".", "next_cfg")
	if err := c.EnsureBridge(ctx, BridgeConfig{Name: name, DatapathType: DatapathNetdev, FailMode: FailModeStandalone,
		ExternalIDs: map[string]string{"version": "2"}}); err != nil {
		t.Fatal(err)
	}
	if after := vsctl(o, "get", "Open_vSwitch", ".", "next_cfg"); after != before {
		t.Errorf("no-op EnsureBridge bumped next_cfg from %s to %s", before, after)
	}
}

func TestBridgeExternalIDs(t *testing.T) {
	o, c := setup(t)
	ctx := testCtx(t)
	name := newBridge(t, c, BridgeConfig{ExternalIDs: map[string]string{"a": "1"}})

	if err := c.SetBridgeExternalIDs(ctx, name, map[string]string{"b": "2", "a": "3"}); err != nil {
		t.Fatal(err)
	}
	ids, err := c.BridgeExternalIDs(ctx, name)
	if err != nil {
		t.Fatal(err)
	}
	if len(ids) != 2 || ids["a"] != "3" || ids["b"] != "2" {
		t.Errorf("BridgeExternalIDs = %v, want a=3 b=2", ids)
	}
	if got := vsctl(o, "get", "Bridge", name, "external_ids:b"); got != `"2"` {
		t.Errorf("ovs-vsctl sees external_ids:b = %s", got)
	}
	// Changes by another client show up in the cache.
	vsctl(o, "set", "Bridge", name, "external_ids:c=4")
	err = c.waitUntil(ctx, "external id c", func() (bool, error) {
		ids, err := c.BridgeExternalIDs(ctx, name)
		return ids["c"] == "4", err
	})
	if err != nil {
		t.Error(err)
	}

	if _, err := c.BridgeExternalIDs(ctx, "nosuchbr"); !errors.Is(err, ErrBridgeNotFound) {
		t.Errorf("BridgeExternalIDs(missing) error = %v, want ErrBridgeNotFound", err)
	}
	if err := c.SetBridgeExternalIDs(ctx, "nosuchbr", map[string]string{"x": "y"}); !errors.Is(err, ErrBridgeNotFound) {
		t.Errorf("SetBridgeExternalIDs(missing) error = %v, want ErrBridgeNotFound", err)
	}
}

func TestDeleteBridge(t *testing.T) {
	o, c := setup(t)
	ctx := testCtx(t)
	name := uniq(t, "sbr")
	if err := c.EnsureBridge(ctx, BridgeConfig{Name: name, DatapathType: DatapathNetdev}); err != nil {
		t.Fatal(err)
	}
	if _, err := c.EnsurePort(ctx, name, PortSpec{Name: uniq(t, "sin"), Type: TypeInternal}); err != nil {
		t.Fatal(err)
	}
	for i := 0; i < 2; i++ {
		if err := c.DeleteBridge(ctx, name); err != nil {
			t.Fatalf("DeleteBridge #%d: %v", i+1, err)
		}
	}
	if got := vsctl(o, "list-br"); got != "" {
		t.Errorf("list-br = %q after delete", got)
	}
	// Ports and interfaces were garbage-collected with the bridge.
	if got := vsctl(o, "--columns=name", "--bare", "list", "Interface"); got != "" {
		t.Errorf("Interface rows left: %q", got)
	}
}

func TestInternalPort(t *testing.T) {
	o, c := setup(t)
	ctx := testCtx(t)
	br := newBridge(t, c, BridgeConfig{})
	name := uniq(t, "sin")

	p, err := c.EnsurePort(ctx, br, PortSpec{
		Name:          name,
		Type:          TypeInternal,
		ExternalIDs:   map[string]string{"seine-role": "gateway"},
		MTURequest:    1400,
		OFPortRequest: 7,
	})
	if err != nil {
		t.Fatalf("EnsurePort: %v", err)
	}
	if p.OFPort != 7 {
		t.Errorf("OFPort = %d, want the requested 7", p.OFPort)
	}
	if len(p.MAC) != len("aa:bb:cc:dd:ee:ff") {
		t.Errorf("MAC = %q, want one from mac_in_use", p.MAC)
	}
	if p.Name != name || p.Type != TypeInternal || p.ExternalIDs["seine-role"] != "gateway" {
		t.Errorf("EnsurePort returned %+v", p)
	}
	if got := vsctl(o, "get", "Interface", name, "mtu_request"); got != "1400" {
		t.Errorf("mtu_request = %s, want 1400", got)
	}
	if got := vsctl(o, "get", "Interface", name, "ofport"); got != "7" {
		t.Errorf("ovs-vsctl sees ofport %s, want 7", got)
	}
	// The netdev datapath made a tap device for it in this namespace.
	link, err := netlink.LinkByName(name)
	if err != nil {
		t.Fatalf("no device for internal port: %v", err)
	}
	if link.Attrs().HardwareAddr.String() != p.MAC {
		t.Errorf("device MAC %s != mac_in_use %s", link.Attrs().HardwareAddr, p.MAC)
	}

	// Ensuring it again returns the same port without reconfiguring.
	before := vsctl(o, "get", "Open_vSwitch", ".", "next_cfg")
	p2, err := c.EnsurePort(ctx, br, PortSpec{Name: name, Type: TypeInternal, ExternalIDs: map[string]string{"seine-role": "gateway"}})
	if err != nil {
		t.Fatal(err)
	}
	if p2.OFPort != 7 || p2.MAC != p.MAC {
		t.Errorf("second EnsurePort = %+v, first %+v", p2, p)
	}
	if after := vsctl(o, "get", "Open_vSwitch", ".", "next_cfg"); after != before {
		t.Errorf("no-op EnsurePort bumped next_cfg from %s to %s", before, after)
	}
}

func TestTunnelPorts(t *testing.T) {
	o, c := setup(t)
	ctx := testCtx(t)
	br := newBridge(t, c, BridgeConfig{})
	for _, typ := range []string{TypeGeneve, TypeVXLAN} {
		name := uniq(t, "s"+typ[:3])
		opts := map[string]string{"remote_ip": "flow", "key": "flow", "csum": "true"}
		p, err := c.EnsurePort(ctx, br, PortSpec{Name: name, Type: typ, Options: opts})
		if err != nil {
			t.Fatalf("EnsurePort(%s): %v", typ, err)
		}
		if p.OFPort <= 0 || p.Type != typ {
			t.Errorf("%s port = %+v, want an ofport", typ, p)
		}
		got := vsctl(o, "get", "Interface", name, "options")
		if got != `{csum="true", key=flow, remote_ip=flow}` {
			t.Errorf("%s options = %s", typ, got)
		}
		// Options are replaced as a whole on update.
		delete(opts, "csum")
		if _, err := c.EnsurePort(ctx, br, PortSpec{Name: name, Type: typ, Options: opts}); err != nil {
			t.Fatal(err)
		}
		if got := vsctl(o, "get", "Interface", name, "options"); got != `{key=flow, remote_ip=flow}` {
			t.Errorf("%s options after update = %s", typ, got)
		}
	}
}

// newVeth creates a veth pair in the current namespace, deleted at cleanup.
func newVeth(t *testing.T) (string, string) {
	t.Helper()
	a, b := uniq(t, "sva"), uniq(t, "svb")
	veth := &netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: a}, PeerName: b}
	if err := netlink.LinkAdd(veth); err != nil {
		t.Fatalf("create veth %s/%s: %v", a, b, err)
	}
	t.Cleanup(func() {
		if l, err := netlink.LinkByName(a); err == nil {
			if err := netlink.LinkDel(l); err != nil {
				t.Errorf("delete veth %s: %v", a, err)
			}
		}
	})
	for _, n := range []string{a, b} {
		l, err := netlink.LinkByName(n)
		if err != nil {
			t.Fatal(err)
		}
		if err := netlink.LinkSetUp(l); err != nil {
			t.Fatalf("set %s up: %v", n, err)
		}
	}
	return a, b
}

func TestSystemPortVeth(t *testing.T) {
	o, c := setup(t)
	ctx := testCtx(t)
	br := newBridge(t, c, BridgeConfig{})
	host, _ := newVeth(t)

	p, err := c.EnsurePort(ctx, br, PortSpec{
		Name:        host,
		ExternalIDs: map[string]string{"pod": "default/web-0", "iface-id": "c0ffee"},
	})
	if err != nil {
		t.Fatalf("EnsurePort(veth): %v", err)
	}
	if p.OFPort <= 0 {
		t.Errorf("OFPort = %d", p.OFPort)
	}
	link, err := netlink.LinkByName(host)
	if err != nil {
		t.Fatal(err)
	}
	if p.MAC != link.Attrs().HardwareAddr.String() {
		t.Errorf("mac_in_use %s != veth MAC %s", p.MAC, link.Attrs().HardwareAddr)
	}
	for _, table := range []string{"Port", "Interface"} {
		if got := vsctl(o, "get", table, host, "external_ids:pod"); got != `"default/web-0"` {
			t.Errorf("%s external_ids:pod = %s", table, got)
		}
	}
	if got := vsctl(o, "list-ports", br); got != host {
		t.Errorf("list-ports = %q, want %q", got, host)
	}

	// External ids merge: new keys are added, others stay.
	if _, err := c.EnsurePort(ctx, br, PortSpec{Name: host, ExternalIDs: map[string]string{"iface-id": "beef"}}); err != nil {
		t.Fatal(err)
	}
	got, err := c.GetPort(ctx, host)
	if err != nil || got == nil {
		t.Fatalf("GetPort = %v, %v", got, err)
	}
	if got.ExternalIDs["iface-id"] != "beef" || got.ExternalIDs["pod"] != "default/web-0" || got.OFPort != p.OFPort {
		t.Errorf("after merge GetPort = %+v", got)
	}
	if v := vsctl(o, "get", "Interface", host, "external_ids:iface-id"); v != "beef" {
		t.Errorf("Interface external_ids:iface-id = %s", v)
	}
}

func TestMissingDeviceReportsError(t *testing.T) {
	_, c := setup(t)
	ctx := testCtx(t)
	br := newBridge(t, c, BridgeConfig{})
	name := uniq(t, "sno")
	_, err := c.EnsurePort(ctx, br, PortSpec{Name: name})
	if err == nil {
		t.Fatal("EnsurePort of a missing system device succeeded")
	}
	if !strings.Contains(err.Error(), name) || ctx.Err() != nil {
		t.Errorf("error %q should name %s and come before the deadline", err, name)
	}
	t.Logf("error for missing device: %v", err)

	// Once the device exists, ensuring the port again brings it up.
	veth := &netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: name}, PeerName: uniq(t, "snp")}
	if err := netlink.LinkAdd(veth); err != nil {
		t.Fatalf("create veth %s: %v", name, err)
	}
	t.Cleanup(func() {
		if l, err := netlink.LinkByName(name); err == nil {
			_ = netlink.LinkDel(l)
		}
	})
	p, err := c.EnsurePort(ctx, br, PortSpec{Name: name})
	if err != nil {
		t.Fatalf("EnsurePort after creating the device: %v", err)
	}
	if p.OFPort <= 0 {
		t.Errorf("OFPort = %d after creating the device", p.OFPort)
	}
}

func TestDeletePortListGet(t *testing.T) {
	o, c := setup(t)
	ctx := testCtx(t)
	br := newBridge(t, c, BridgeConfig{})
	a, b := uniq(t, "sia"), uniq(t, "sib")
	for _, n := range []string{b, a} {
		if _, err := c.EnsurePort(ctx, br, PortSpec{Name: n, Type: TypeInternal}); err != nil {
			t.Fatal(err)
		}
	}
	ports, err := c.ListPorts(ctx, br)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, p := range ports {
		names = append(names, p.Name)
		if p.OFPort == 0 || p.Type != TypeInternal {
			t.Errorf("listed port %+v", p)
		}
	}
	want := []string{br, a, b}
	sort.Strings(want)
	if fmt.Sprint(names) != fmt.Sprint(want) {
		t.Errorf("ListPorts names = %v, want %v", names, want)
	}

	for i := 0; i < 2; i++ {
		if err := c.DeletePort(ctx, br, a); err != nil {
			t.Fatalf("DeletePort #%d: %v", i+1, err)
		}
	}
	if err := c.DeletePort(ctx, br, "neverexisted"); err != nil {
		t.Errorf("DeletePort(never existed): %v", err)
	}
	if p, err := c.GetPort(ctx, a); err != nil || p != nil {
		t.Errorf("GetPort(deleted) = %+v, %v; want nil, nil", p, err)
	}
	if got := vsctl(o, "list-ports", br); got != b {
		t.Errorf("list-ports = %q, want %q", got, b)
	}
	if p, err := c.GetPort(ctx, b); err != nil || p == nil || p.Name != b {
		t.Errorf("GetPort(%s) = %+v, %v", b, p, err)
	}
	if _, err := c.ListPorts(ctx, "nosuchbr"); !errors.Is(err, ErrBridgeNotFound) {
		t.Errorf("ListPorts(missing) error = %v", err)
	}
	if _, err := c.EnsurePort(ctx, "nosuchbr", PortSpec{Name: a}); !errors.Is(err, ErrBridgeNotFound) {
		t.Errorf("EnsurePort on missing bridge error = %v", err)
	}
}

func TestPortMovesBetweenBridges(t *testing.T) {
	o, c := setup(t)
	ctx := testCtx(t)
	br1, br2 := newBridge(t, c, BridgeConfig{}), newBridge(t, c, BridgeConfig{})
	name := uniq(t, "smv")
	if _, err := c.EnsurePort(ctx, br1, PortSpec{Name: name, Type: TypeInternal}); err != nil {
		t.Fatal(err)
	}
	if err := c.DeletePort(ctx, br2, name); err == nil {
		t.Error("DeletePort from the wrong bridge succeeded")
	}
	if _, err := c.EnsurePort(ctx, br2, PortSpec{Name: name, Type: TypeInternal}); err != nil {
		t.Fatal(err)
	}
	if got := vsctl(o, "port-to-br", name); got != br2 {
		t.Errorf("port-to-br = %s, want %s", got, br2)
	}
	if got := vsctl(o, "list-ports", br1); got != "" {
		t.Errorf("old bridge still lists %q", got)
	}
}

func TestConcurrentEnsurePort(t *testing.T) {
	_, c := setup(t)
	ctx := testCtx(t)
	br := newBridge(t, c, BridgeConfig{})
	const distinct = 6
	names := make([]string, distinct)
	for i := range names {
		names[i] = uniq(t, "scc")
	}
	// Every name is ensured by two goroutines at once.
	var wg sync.WaitGroup
	results := make([]Port, 2*distinct)
	errs := make([]error, 2*distinct)
	for i := range results {
		wg.Add(1)
		go func() {
			defer wg.Done()
			results[i], errs[i] = c.EnsurePort(ctx, br, PortSpec{
				Name: names[i%distinct], Type: TypeInternal,
				ExternalIDs: map[string]string{fmt.Sprintf("caller-%d", i/distinct): "yes"},
			})
		}()
	}
	wg.Wait()
	seen := map[int32]string{}
	for i, err := range errs {
		if err != nil {
			t.Fatalf("EnsurePort #%d: %v", i, err)
		}
		p := results[i]
		if prev, ok := seen[p.OFPort]; ok && prev != p.Name {
			t.Errorf("ofport %d given to both %s and %s", p.OFPort, prev, p.Name)
		}
		seen[p.OFPort] = p.Name
		if other := results[(i+distinct)%(2*distinct)]; other.OFPort != p.OFPort {
			t.Errorf("callers of %s saw ofports %d and %d", p.Name, p.OFPort, other.OFPort)
		}
	}
	ports, err := c.ListPorts(ctx, br)
	if err != nil {
		t.Fatal(err)
	}
	if len(ports) != distinct+1 {
		t.Errorf("ListPorts has %d ports, want %d", len(ports), distinct+1)
	}
	// Both callers' external ids were merged, none lost.
	for _, n := range names {
		p, err := c.GetPort(ctx, n)
		if err != nil || p == nil {
			t.Fatalf("GetPort(%s) = %v, %v", n, p, err)
		}
		if p.ExternalIDs["caller-0"] != "yes" || p.ExternalIDs["caller-1"] != "yes" {
			t.Errorf("port %s external_ids = %v, want both callers' keys", n, p.ExternalIDs)
		}
	}
}

// TestSystemOtherConfig: other_config of the Open_vSwitch row is merged
// (other keys kept), read back from the cache, and a key set by another
// client shows up.
func TestSystemOtherConfig(t *testing.T) {
	o, c := setup(t)
	ctx := testCtx(t)
	vsctl(o, "set", "Open_vSwitch", ".", "other_config:keep=1")
	if err := c.SetSystemOtherConfig(ctx, map[string]string{"userspace-tso-enable": "true"}); err != nil {
		t.Fatal(err)
	}
	if got := vsctl(o, "get", "Open_vSwitch", ".", "other_config:userspace-tso-enable"); got != `"true"` {
		t.Errorf("ovs-vsctl sees userspace-tso-enable = %s", got)
	}
	err := c.waitUntil(ctx, "other_config in the cache", func() (bool, error) {
		oc, err := c.SystemOtherConfig(ctx)
		return oc["userspace-tso-enable"] == "true" && oc["keep"] == "1", err
	})
	if err != nil {
		t.Fatal(err)
	}
	if err := c.SetSystemOtherConfig(ctx, map[string]string{"userspace-tso-enable": "false"}); err != nil {
		t.Fatal(err)
	}
	if got := vsctl(o, "get", "Open_vSwitch", ".", "other_config:keep"); got != `"1"` {
		t.Errorf("other key lost: keep = %s", got)
	}
}

// TestClearFlowRestoreWait removes the key and keeps the rest of
// other_config; a second call finds nothing to do.
func TestClearFlowRestoreWait(t *testing.T) {
	o, c := setup(t)
	ctx := testCtx(t)
	vsctl(o, "set", "Open_vSwitch", ".", "other_config:flow-restore-wait=true", "other_config:seine-test=1")
	t.Cleanup(func() { vsctl(o, "remove", "Open_vSwitch", ".", "other_config", "seine-test") })
	err := wait.PollUntilContextTimeout(ctx, 20*time.Millisecond, 5*time.Second, true, func(ctx context.Context) (bool, error) {
		root, err := c.root(ctx)
		return err == nil && root.OtherConfig[FlowRestoreWait] == "true", nil
	})
	if err != nil {
		t.Fatal("the cache never saw flow-restore-wait")
	}
	for i := 0; i < 2; i++ {
		if err := c.ClearFlowRestoreWait(ctx); err != nil {
			t.Fatal(err)
		}
	}
	if got := vsctl(o, "get", "Open_vSwitch", ".", "other_config"); strings.Contains(got, "flow-restore-wait") || !strings.Contains(got, "seine-test") {
		t.Errorf("other_config = %s", got)
	}
}

// TestEnsurePortsShareTransactions ensures 40 ports at once, plus one on a
// bridge that does not exist: the 40 share a few transactions (group
// commit) and all get distinct ofports; the bad one fails alone.
func TestEnsurePortsShareTransactions(t *testing.T) {
	_, c := setup(t)
	ctx := testCtx(t)
	br := newBridge(t, c, BridgeConfig{})
	const n = 40
	names := make([]string, n)
	for i := range names {
		names[i] = uniq(t, "sgc")
	}
	before := c.commits.Commits()
	var wg sync.WaitGroup
	ports := make([]Port, n)
	errs := make([]error, n)
	start := make(chan struct{})
	for i := range names {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			ports[i], errs[i] = c.EnsurePort(ctx, br, PortSpec{Name: names[i], Type: TypeInternal})
		}()
	}
	var badErr error
	wg.Add(1)
	go func() {
		defer wg.Done()
		<-start
		_, badErr = c.EnsurePort(ctx, uniq(t, "snone"), PortSpec{Name: uniq(t, "sgx"), Type: TypeInternal})
	}()
	close(start)
	wg.Wait()
	if !errors.Is(badErr, ErrBridgeNotFound) {
		t.Errorf("port on a missing bridge: %v", badErr)
	}
	seen := map[int32]bool{}
	for i, err := range errs {
		if err != nil {
			t.Fatalf("EnsurePort %s: %v", names[i], err)
		}
		if ports[i].OFPort <= 0 || seen[ports[i].OFPort] {
			t.Errorf("%s: ofport %d (duplicate or unset)", names[i], ports[i].OFPort)
		}
		seen[ports[i].OFPort] = true
	}
	commits := c.commits.Commits() - before
	if commits >= n {
		t.Errorf("%d ports took %d commits, want them shared", n, commits)
	}
	t.Logf("%d concurrent EnsurePort calls, %d commits", n+1, commits)
}

// TestSetPortExternalIDs merges keys into an existing port's and
// interface's external_ids, and leaves a missing port missing.
func TestSetPortExternalIDs(t *testing.T) {
	o, c := setup(t)
	ctx := testCtx(t)
	br := newBridge(t, c, BridgeConfig{})
	name := uniq(t, "sxi")
	if _, err := c.EnsurePort(ctx, br, PortSpec{Name: name, Type: TypeInternal, ExternalIDs: map[string]string{"a": "1"}}); err != nil {
		t.Fatal(err)
	}
	if err := c.SetPortExternalIDs(ctx, name, map[string]string{"b": "2", "a": "3"}); err != nil {
		t.Fatal(err)
	}
	for _, table := range []string{"Port", "Interface"} {
		got := vsctl(o, "get", table, name, "external_ids")
		if got != `{a="3", b="2"}` {
			t.Errorf("%s external_ids = %s", table, got)
		}
	}
	missing := uniq(t, "sxm")
	if err := c.SetPortExternalIDs(ctx, missing, map[string]string{"a": "1"}); err != nil {
		t.Fatalf("missing port: %v", err)
	}
	if p, err := c.GetPort(ctx, missing); err != nil || p != nil {
		t.Fatalf("a missing port was created: %v %v", p, err)
	}
}
