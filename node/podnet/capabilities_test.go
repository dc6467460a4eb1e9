package podnet

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/containernetworking/cni/pkg/types"
	"github.com/containernetworking/plugins/pkg/ns"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/vishvananda/netlink"
	"go.uber.org/zap/zaptest"

	"github.com/seine-net/seine/datapath/pipeline"
	cniserver "github.com/seine-net/seine/node/cni/server"
	"github.com/seine-net/seine/node/hostport"
)

// recordingMapper stands in for node/hostport's Mapper (tested against
// real nftables in its own package): it records what the Backend asks and
// fails Map (Unmap) when told to.
type recordingMapper struct {
	mu        sync.Mutex
	mapped    map[string][]hostport.Mapping
	fail      error
	failUnmap error
}

func (m *recordingMapper) Map(_ context.Context, owner string, _ net.IP, ms []hostport.Mapping) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.fail != nil {
		return m.fail
	}
	m.mapped[owner] = ms
	return nil
}

func (m *recordingMapper) Unmap(_ context.Context, owner string) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.failUnmap != nil {
		return m.failUnmap
	}
	delete(m.mapped, owner)
	return nil
}

func (m *recordingMapper) Owners() []string {
	m.mu.Lock()
	defer m.mu.Unlock()
	var out []string
	for o := range m.mapped {
		out = append(out, o)
	}
	return out
}

// TestRuntimeCapabilities adds Pods with the portMappings and bandwidth
// capabilities on a real bridge: the hostPorts reach the mapper under the
// attachment's owner and leave with DEL; the rates become tbf qdiscs on
// the host veth (into the Pod) and on the Pod's eth0 (out of it), and
// ReshapePods puts the host veth's back when it is gone; a
// mapping that fails, and a bad bandwidth, roll the ADD back completely,
// the latter with CNI error 7 naming the field.
func TestRuntimeCapabilities(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	mapper := &recordingMapper{mapped: map[string][]hostport.Mapping{}}
	h := newHarness(t, ctx, zaptest.NewLogger(t), func(c *Config) { c.HostPorts = mapper })
	h.be.cfg.Meters = h.of

	n0 := h.netns()
	req := h.request(0, n0.Path())
	req.PodNamespace, req.PodName = "ns", "shaped"
	req.NetConf.RuntimeConfig = map[string]json.RawMessage{
		"portMappings": json.RawMessage(`[{"hostPort":8080,"containerPort":80,"protocol":"tcp"}]`),
		"bandwidth":    json.RawMessage(`{"ingressRate":20000000,"ingressBurst":4294967295,"egressRate":10000000,"egressBurst":4294967295}`),
	}
	res, err := h.be.Add(ctx, req)
	if err != nil {
		t.Fatal(err)
	}
	key := owner(req.ContainerID, "eth0")
	if got := mapper.mapped[key]; len(got) != 1 || got[0].HostPort != 8080 || got[0].ContainerPort != 80 {
		t.Errorf("mapped for %s: %+v", key, mapper.mapped)
	}
	if rate := rootTBFRate(t, res.Interfaces[0].Name); rate != 20e6/8 {
		t.Errorf("host veth tbf rate %d bytes/s, want %d", rate, int(20e6/8))
	}
	var podRate uint64
	if err := n0.Do(func(ns.NetNS) error { podRate = rootTBFRate(t, "eth0"); return nil }); err != nil {
		t.Fatal(err)
	}
	if podRate != 10e6/8 {
		t.Errorf("Pod eth0 tbf rate %d bytes/s, want %d", podRate, int(10e6/8))
	}
	// An ovs-vswitchd restart resets the host veth's qdisc: ReshapePods
	// puts it back from the port's external_ids.
	port, err := h.db.GetPort(ctx, res.Interfaces[0].Name)
	if err != nil || port.ExternalIDs[ExtIDIngressBandwidth] != "20000000/4294967295" {
		t.Fatalf("port %s external_ids %v, %v", res.Interfaces[0].Name, port, err)
	}
	host, _ := netlink.LinkByName(res.Interfaces[0].Name)
	if err := netlink.QdiscDel(&netlink.Tbf{QdiscAttrs: netlink.QdiscAttrs{LinkIndex: host.Attrs().Index, Parent: netlink.HANDLE_ROOT}}); err != nil {
		t.Fatal(err)
	}
	if err := h.be.ReshapePods(ctx); err != nil {
		t.Fatal(err)
	}
	if rate := rootTBFRate(t, res.Interfaces[0].Name); rate != 20e6/8 {
		t.Errorf("after ReshapePods: host veth tbf rate %d bytes/s", rate)
	}

	// The egress limit's meter (10 Mbit/s: 11,000 kbps, twice the default
	// 125,000-byte bucket; the first id, 1) is on the Pod's port, before
	// anything else.
	if port.ExternalIDs[ExtIDEgressBandwidth] != "10000000/4294967295" || port.ExternalIDs[ExtIDEgressMeter] != "1" {
		t.Errorf("port external_ids %v: no egress bandwidth and meter 1", port.ExternalIDs)
	}
	const wantMeter = "meter=1 kbps burst stats bands=type=drop rate=11000 burst_size=2000"
	if ms := h.meters(); len(ms) != 1 || ms[0] != wantMeter {
		t.Errorf("meters %q, want [%s]", ms, wantMeter)
	}
	classifier := func() string {
		return h.ovs.Run("ovs-ofctl", "-O", "OpenFlow13", "--no-stats", "dump-flows", h.ovs.MgmtSocket("br-int"),
			fmt.Sprintf("table=%d,in_port=%d", pipeline.Classifier, port.OFPort))
	}
	if out := classifier(); !strings.Contains(out, "actions=meter:1,") {
		t.Errorf("the Pod's Classifier flow does not go through its meter:\n%s", out)
	}
	if a, ok := h.be.Attachment("ns", "shaped"); !ok || a.EgressMeter != 1 || !a.EgressLimited {
		t.Errorf("attachment %+v: want an egress limit with meter 1", a)
	}
	if n := unmeteredLimits(t, h.reg); n != 0 {
		t.Errorf("seine_pod_egress_limits_without_meter %v with the meter in place, want 0", n)
	}
	// Nothing sent, nothing dropped: the counter is there at 0.
	if err := testutil.GatherAndCompare(h.reg, strings.NewReader(`
# HELP seine_pod_egress_meter_dropped_packets_total Packets the OpenFlow meter behind a Pod's egress limit dropped: the Pod sent above its kubernetes.io/egress-bandwidth although its own qdisc should have held it there.
# TYPE seine_pod_egress_meter_dropped_packets_total counter
seine_pod_egress_meter_dropped_packets_total{namespace="ns",pod="shaped"} 0
`), "seine_pod_egress_meter_dropped_packets_total"); err != nil {
		t.Error(err)
	}
	// A restarted ovs-vswitchd has neither: the meter comes back first,
	// then the flows (what the daemon's reconnect does).
	h.ovs.Run("ovs-ofctl", "-O", "OpenFlow13", "del-meters", h.ovs.MgmtSocket("br-int"))
	if err := h.be.ReplayMeters(ctx); err != nil {
		t.Fatal(err)
	}
	if err := h.flows.Replay(ctx); err != nil {
		t.Fatal(err)
	}
	if ms := h.meters(); len(ms) != 1 || ms[0] != wantMeter {
		t.Errorf("after ReplayMeters: meters %q, want [%s]", ms, wantMeter)
	}
	if out := classifier(); !strings.Contains(out, "actions=meter:1,") {
		t.Errorf("after the replay, the Classifier flow does not go through the meter:\n%s", out)
	}
	if err := h.be.Del(ctx, req); err != nil {
		t.Fatal(err)
	}
	if len(mapper.mapped) != 0 {
		t.Errorf("mappings left after DEL: %+v", mapper.mapped)
	}

	// A failing mapping rolls everything back.
	mapper.fail = errors.New("host port taken")
	n1 := h.netns()
	req = h.request(1, n1.Path())
	req.NetConf.RuntimeConfig = map[string]json.RawMessage{"portMappings": json.RawMessage(`[{"hostPort":8080,"containerPort":80}]`),
		"bandwidth": json.RawMessage(`{"egressRate":10000000}`)}
	if _, err := h.be.Add(ctx, req); err == nil || !strings.Contains(err.Error(), "host port taken") {
		t.Errorf("ADD with a failing mapping: %v", err)
	}
	// A bad rate is refused before anything is set up.
	n2 := h.netns()
	req = h.request(2, n2.Path())
	req.NetConf.RuntimeConfig = map[string]json.RawMessage{"bandwidth": json.RawMessage(`{"egressRate":10}`)}
	_, err = h.be.Add(ctx, req)
	var cerr *cniserver.Error
	if !errors.As(err, &cerr) || cerr.Code != types.ErrInvalidNetworkConfig || !strings.Contains(err.Error(), "egressRate 10 bits/s") {
		t.Errorf("ADD with egressRate 10: %v", err)
	}
	if left := h.leftovers(ctx); len(left) != 0 {
		t.Errorf("failed ADDs left: %v", left)
	}

	// A DEL whose hostPort removal fails still removes everything else
	// (a runtime may never repeat it) and reports the failure; a repeated
	// DEL finishes the job.
	mapper.fail = nil
	n5 := h.netns()
	req = h.request(5, n5.Path())
	req.NetConf.RuntimeConfig = map[string]json.RawMessage{"portMappings": json.RawMessage(`[{"hostPort":8081,"containerPort":80}]`)}
	if _, err := h.be.Add(ctx, req); err != nil {
		t.Fatal(err)
	}
	mapper.failUnmap = errors.New("nftables busy")
	if err := h.be.Del(ctx, req); err == nil || !strings.Contains(err.Error(), "nftables busy") {
		t.Errorf("DEL with a failing hostPort removal: %v, want its error", err)
	}
	if left := h.leftovers(ctx); len(left) != 0 {
		t.Errorf("a DEL whose hostPort removal failed left: %v", left)
	}
	mapper.failUnmap = nil
	if err := h.be.Del(ctx, req); err != nil || len(mapper.mapped) != 0 {
		t.Errorf("repeated DEL: %v, mappings left %+v", err, mapper.mapped)
	}

	// Without meters (a datapath that has none), a Pod's egress limit
	// rests on its qdisc alone, and the gauge counts it until its DEL.
	h.be.cfg.Meters = nil
	n4 := h.netns()
	req = h.request(4, n4.Path())
	req.PodNamespace, req.PodName = "ns", "unmetered"
	req.NetConf.RuntimeConfig = map[string]json.RawMessage{"bandwidth": json.RawMessage(`{"egressRate":10000000,"egressBurst":4294967295}`)}
	if _, err := h.be.Add(ctx, req); err != nil {
		t.Fatal(err)
	}
	if a, ok := h.be.Attachment("ns", "unmetered"); !ok || a.EgressMeter != 0 || !a.EgressLimited {
		t.Errorf("attachment %+v: want an egress limit without a meter", a)
	}
	if n := unmeteredLimits(t, h.reg); n != 1 {
		t.Errorf("seine_pod_egress_limits_without_meter %v with one Pod shaped without a meter, want 1", n)
	}
	if err := h.be.Del(ctx, req); err != nil {
		t.Fatal(err)
	}
	if n := unmeteredLimits(t, h.reg); n != 0 {
		t.Errorf("seine_pod_egress_limits_without_meter %v after the DEL, want 0", n)
	}

	// Without a mapper, hostPorts are refused with a reason.
	h.be.cfg.HostPorts = nil
	n3 := h.netns()
	req = h.request(3, n3.Path())
	req.NetConf.RuntimeConfig = map[string]json.RawMessage{"portMappings": json.RawMessage(`[{"hostPort":8080,"containerPort":80}]`)}
	if _, err := h.be.Add(ctx, req); err == nil || !strings.Contains(err.Error(), "does not serve") {
		t.Errorf("ADD with hostPorts and no mapper: %v", err)
	}
}

// unmeteredLimits gathers reg's seine_pod_egress_limits_without_meter.
func unmeteredLimits(t *testing.T, reg *prometheus.Registry) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() == "seine_pod_egress_limits_without_meter" && len(mf.GetMetric()) == 1 {
			return mf.GetMetric()[0].GetGauge().GetValue()
		}
	}
	t.Fatal("seine_pod_egress_limits_without_meter not gathered")
	return 0
}

// rootTBFRate returns the rate, in bytes/s, of the root tbf of link name
// in the calling thread's namespace (0: none).
func rootTBFRate(t *testing.T, name string) uint64 {
	t.Helper()
	link, err := netlink.LinkByName(name)
	if err != nil {
		t.Fatal(err)
	}
	qs, err := netlink.QdiscList(link)
	if err != nil {
		t.Fatal(err)
	}
	for _, q := range qs {
		if q, ok := q.(*netlink.Tbf); ok && q.Parent == netlink.HANDLE_ROOT {
			return q.Rate
		}
	}
	return 0
}
