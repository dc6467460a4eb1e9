package podnet

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"maps"
	"net"
	"os"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/containernetworking/plugins/pkg/ns"
	"github.com/containernetworking/plugins/pkg/testutils"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/vishvananda/netlink"
	"go.uber.org/zap"

	"github.com/seine-net/seine/datapath/flowsync"
	of "github.com/seine-net/seine/datapath/openflow"
	"github.com/seine-net/seine/datapath/ovsdb"
	"github.com/seine-net/seine/datapath/ovstest"
	"github.com/seine-net/seine/datapath/pipeline"
	"github.com/seine-net/seine/ipam"
	cniserver "github.com/seine-net/seine/node/cni/server"
)

// harness is a Backend on a real switch (private ovsdb-server and
// ovs-vswitchd, userspace datapath, bridge br-int), with a fresh IPAM
// directory: what the daemon runs, minus the API server.
type harness struct {
	t     testing.TB
	ovs   *ovstest.OVS
	db    *ovsdb.Client
	flows *flowsync.Syncer
	of    *of.Client
	ipam  *ipam.Allocator
	be    *Backend
	reg   *prometheus.Registry
	// prefix starts every container ID of this harness.
	prefix string
	mu     sync.Mutex
	ids    []string // container IDs requested
}

// newHarness starts the harness's OVS and backend; without root it skips
// the test (ovstest.Start).
func newHarness(t testing.TB, ctx context.Context, log *zap.Logger, opts ...func(*Config)) *harness {
	t.Helper()
	o := ovstest.Start(t)
	o.Run("ovs-vsctl", "add-br", "br-int", "--", "set", "bridge", "br-int", "datapath_type=netdev", "fail_mode=secure")
	db, err := ovsdb.Dial(ctx, o.DBSocket(), log.Named("ovsdb"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(db.Close)
	ofc, err := of.Dial(ctx, o.MgmtSocket("br-int"), log.Named("of"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ofc.Close() })
	_, podCIDR, _ := net.ParseCIDR("10.244.0.0/22")
	alloc, _, err := ipam.Open(t.TempDir(), podCIDR)
	if err != nil {
		t.Fatal(err)
	}
	gwMAC, _ := net.ParseMAC("0a:00:00:00:00:01")
	reg := prometheus.NewRegistry()
	syncer := flowsync.New(ofc)
	cfg := Config{BridgeName: "br-int", MTU: 1450, DisableTxChecksum: true, Metrics: reg,
		Bridge: pipeline.Bridge{Round: 1, GatewayPort: 2, GatewayMAC: gwMAC,
			GatewayIP: net.ParseIP("10.244.0.1"), PodCIDR: podCIDR}}
	h := &harness{t: t, ovs: o, db: db, flows: syncer, of: ofc, ipam: alloc, reg: reg}
	for _, o := range opts {
		o(&cfg)
	}

	be := New(cfg, alloc, db, syncer, log.Named("podnet"))
	be.MarkReady()
	b := make([]byte, 4)
	_, _ = rand.Read(b)
	h.be, h.prefix = be, "c"+hex.EncodeToString(b)
	return h
}

// addPort makes link a port of the harness's bridge with ovs-vsctl (args
// follow "--" in the same transaction) and waits until the backend's
// OVSDB cache has it with its ofport: ovs-vsctl returns once
// ovs-vswitchd has it, which may be before the cache's update arrives.
func (h *harness) addPort(ctx context.Context, link string, args ...string) {
	h.t.Helper()
	h.ovs.Run("ovs-vsctl", append([]string{"add-port", "br-int", link, "--"}, args...)...)
	for {
		if p, err := h.db.GetPort(ctx, link); err == nil && p != nil && p.OFPort > 0 {
			return
		}
		select {
		case <-ctx.Done():
			h.t.Fatalf("port %s never reached the OVSDB cache: %v", link, ctx.Err())
		case <-time.After(10 * time.Millisecond):
		}
	}
}

// podPort makes a Pod port as a restarted daemon finds one: a veth named
// as an ADD names the host end of container cid's eth0 (peer names its
// other end, which stands for the Pod's), a port of the bridge whose
// external_ids record the container, eth0 and ids. The veth goes with the
// test; it returns the port's name.
func (h *harness) podPort(ctx context.Context, cid, peer string, ids map[string]string) string {
	h.t.Helper()
	h.ids = append(h.ids, cid)
	link := HostVethName(cid, "eth0")
	if err := netlink.LinkAdd(&netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: link}, PeerName: peer}); err != nil {
		h.t.Fatalf("creating %s: %v", link, err)
	}
	h.t.Cleanup(func() { _ = deleteLink(link) })
	args := []string{"set", "port", link, "external_ids:" + ExtIDContainerID + "=" + cid, "external_ids:" + ExtIDIfName + "=eth0"}
	for _, k := range slices.Sorted(maps.Keys(ids)) {
		args = append(args, "external_ids:"+k+"="+ids[k])
	}
	h.addPort(ctx, link, args...)
	return link
}

// meters returns the meters on the harness's bridge, one line each
// ("meter=7 kbps burst stats bands=type=drop rate=... burst_size=...").
func (h *harness) meters() []string {
	h.t.Helper()
	out := h.ovs.Run("ovs-ofctl", "-O", "OpenFlow13", "dump-meters", h.ovs.MgmtSocket("br-int"))
	var ms []string
	for _, l := range strings.Split(out, "\n") {
		switch l = strings.TrimSpace(l); {
		case strings.HasPrefix(l, "meter="):
			ms = append(ms, l)
		case strings.HasPrefix(l, "type=") && len(ms) > 0:
			ms[len(ms)-1] += l
		}
	}
	return ms
}

// netns creates a Pod network namespace, removed at cleanup.
func (h *harness) netns() ns.NetNS {
	h.t.Helper()
	n, err := testutils.NewNS()
	if err != nil {
		h.t.Fatal(err)
	}
	h.t.Cleanup(func() {
		_ = n.Close()
		_ = testutils.UnmountNS(n)
	})
	return n
}

// request is the ADD (or DEL) of container i in netns path.
func (h *harness) request(i int, netns string) *cniserver.Request {
	id := fmt.Sprintf("%s-%04d", h.prefix, i)
	h.mu.Lock()
	h.ids = append(h.ids, id)
	h.mu.Unlock()
	return &cniserver.Request{Command: cniserver.CmdAdd, ContainerID: id,
		Netns: netns, IfName: "eth0", NetConf: &cniserver.NetConf{}}
}

// leftovers lists what the harness's Pods left behind: IP allocations,
// OVS ports, desired flows beyond the base count and flows of the Pod
// cookie category on the switch, host veths.
func (h *harness) leftovers(ctx context.Context) []string {
	h.t.Helper()
	var out []string
	for _, a := range h.ipam.List() {
		out = append(out, "IP "+a.IP.String()+" of "+a.Owner.ContainerID)
	}
	ports, err := h.db.ListPorts(ctx, "br-int")
	if err != nil {
		h.t.Fatal(err)
	}
	for _, p := range ports {
		if p.Name != "br-int" {
			out = append(out, "OVS port "+p.Name)
		}
	}
	if n := h.flows.Count(); n != 0 {
		out = append(out, fmt.Sprintf("%d desired flows", n))
	}
	dump := h.ovs.Run("ovs-ofctl", "-O", "OpenFlow13", "--no-stats", "dump-flows", h.ovs.MgmtSocket("br-int"),
		fmt.Sprintf("cookie=%#x/%#x", uint64(pipeline.CategoryPod)<<pipeline.CookieCategoryShift, pipeline.CookieCategoryMask))
	for _, l := range strings.Split(strings.TrimSpace(dump), "\n") {
		if strings.Contains(l, "cookie=") {
			out = append(out, "flow "+strings.TrimSpace(l))
		}
	}
	for _, m := range h.meters() {
		out = append(out, m)
	}
	for _, id := range h.ids {
		if _, err := os.Stat("/sys/class/net/" + HostVethName(id, "eth0")); err == nil {
			out = append(out, "veth "+HostVethName(id, "eth0")+" of "+id)
		}
	}
	return out
}
