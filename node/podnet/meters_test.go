package podnet

import (
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"os"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"go.uber.org/zap"
	"go.uber.org/zap/zaptest"

	of "github.com/seine-net/seine/datapath/openflow"
	"github.com/seine-net/seine/datapath/pipeline"
	"github.com/seine-net/seine/node/bandwidth"
	cniserver "github.com/seine-net/seine/node/cni/server"
)

// TestMeterTable: new meters get the smallest free id, ids claimed from a
// restore are kept apart, an id held by one attachment cannot be claimed
// by another, an attachment keeps its id when asked again, and only the
// holder releases an id, which is then handed out again.
func TestMeterTable(t *testing.T) {
	tab := newMeterTable()
	l := bandwidth.Limits{EgressRate: 20_000_000}
	if err := tab.claim("pod/r/eth0", of.MeterEntry{ID: 2, RateKbps: 5, BurstKbits: 5}); err != nil {
		t.Fatal(err)
	}
	var ids []uint32
	for _, o := range []string{"pod/a/eth0", "pod/b/eth0", "pod/c/eth0"} {
		ids = append(ids, tab.allocate(o, l).ID)
	}
	if ids[0] != 1 || ids[1] != 3 || ids[2] != 4 {
		t.Fatalf("allocated %v around claimed 2, want [1 3 4]", ids)
	}
	if m := tab.allocate("pod/b/eth0", l); m.ID != 3 {
		t.Errorf("pod/b asked again: meter %d, want its 3", m.ID)
	}
	if err := tab.claim("pod/x/eth0", of.MeterEntry{ID: 3}); err == nil || !strings.Contains(err.Error(), "meter 3 is recorded for two Pods, pod/b/eth0 and pod/x/eth0") {
		t.Errorf("claiming a taken id: %v", err)
	}
	if err := tab.claim("pod/b/eth0", of.MeterEntry{ID: 7}); err == nil || !strings.Contains(err.Error(), "pod/b/eth0 holds meter 3, not 7") {
		t.Errorf("claiming a second id: %v", err)
	}
	tab.release("pod/x/eth0") // holds nothing: frees nothing
	if tab.held("pod/b/eth0") != 3 {
		t.Fatal("releasing another attachment freed pod/b's meter")
	}
	tab.release("pod/b/eth0")
	if tab.held("pod/b/eth0") != 0 {
		t.Fatal("pod/b still holds a meter after its release")
	}
	if m := tab.allocate("pod/d/eth0", l); m.ID != 3 || m.RateKbps != 22_000 || m.BurstKbits != 4_000 {
		t.Errorf("after releasing 3: %+v, want meter 3 at 22,000 kbps with 4,000 kbits", m)
	}
	if got := tab.ids(); !slices.Equal(got, []uint32{1, 2, 3, 4}) {
		t.Errorf("ids: %v, want [1 2 3 4]", got)
	}
}

// BenchmarkAddShaped measures what the egress meter adds to an ADD: Pods
// with an egress limit added one at a time into a real switch, in process,
// with meters and without (the Pod's tbf alone), taking turns round by
// round on one switch. It reports each side's p50 and p99 and the
// difference of the p50s.
func BenchmarkAddShaped(b *testing.B) {
	if os.Geteuid() != 0 {
		b.Skip("needs root (links, OVS)")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	h := newHarness(b, ctx, zap.NewNop())
	const perRound, rounds = 50, 4
	lat := map[bool][]time.Duration{}
	n := 0
	for i := 0; i < b.N; i++ {
		for r := range 2 * rounds {
			metered := r%2 == 0
			if r/2%2 == 1 {
				metered = !metered // each side goes first equally often
			}
			h.be.cfg.Meters = nil
			if metered {
				h.be.cfg.Meters = h.of
			}
			reqs := make([]*cniserver.Request, perRound)
			for j := range reqs {
				reqs[j] = h.request(n, h.netns().Path())
				reqs[j].NetConf.RuntimeConfig = map[string]json.RawMessage{"bandwidth": json.RawMessage(`{"egressRate":100000000}`)}
				n++
			}
			l, _, err := runAdds(ctx, h.be, reqs, 1)
			if err != nil {
				b.Fatal(err)
			}
			lat[metered] = append(lat[metered], l...)
			for _, req := range reqs {
				del := *req
				if err := h.be.Del(ctx, &del); err != nil {
					b.Fatal(err)
				}
			}
		}
	}
	p := func(s []time.Duration, q float64) float64 {
		s = slices.Clone(s)
		slices.Sort(s)
		return float64(s[min(len(s)-1, int(q*float64(len(s))))].Microseconds()) / 1000
	}
	b.ReportMetric(p(lat[true], 0.5), "metered-p50-ms")
	b.ReportMetric(p(lat[true], 0.99), "metered-p99-ms")
	b.ReportMetric(p(lat[false], 0.5), "tbf-only-p50-ms")
	b.ReportMetric(p(lat[false], 0.99), "tbf-only-p99-ms")
	b.ReportMetric(p(lat[true], 0.5)-p(lat[false], 0.5), "meter-cost-p50-ms")
}

// TestDelKeepsAnotherPodsMeter: a port whose external_ids name a meter
// another attachment holds (a DEL retried after its meter was freed and
// given away, a restore whose meter failed) is released without deleting
// that meter, which would take the other Pod's Classifier flow with it.
func TestDelKeepsAnotherPodsMeter(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	h := newHarness(t, ctx, zaptest.NewLogger(t))
	h.be.cfg.Meters = h.of
	n0 := h.netns()
	req := h.request(0, n0.Path())
	req.NetConf.RuntimeConfig = map[string]json.RawMessage{"bandwidth": json.RawMessage(`{"egressRate":10000000}`)}
	res, err := h.be.Add(ctx, req)
	if err != nil {
		t.Fatal(err)
	}
	port, err := h.db.GetPort(ctx, res.Interfaces[0].Name)
	if err != nil || port.ExternalIDs[ExtIDEgressMeter] != "1" {
		t.Fatalf("port %v, %v: want meter 1", port, err)
	}

	// The other port records meter 1 too.
	other := h.prefix + "-other"
	h.podPort(ctx, other, "mtp"+h.prefix[1:9], map[string]string{ExtIDEgressBandwidth: "10000000/0", ExtIDEgressMeter: "1"})
	if err := h.be.Del(ctx, &cniserver.Request{ContainerID: other, IfName: "eth0"}); err != nil {
		t.Fatal(err)
	}
	if ms := h.meters(); len(ms) != 1 || !strings.HasPrefix(ms[0], "meter=1 ") {
		t.Fatalf("after the other port's DEL: meters %q, want meter 1", ms)
	}
	classifier := h.ovs.Run("ovs-ofctl", "-O", "OpenFlow13", "--no-stats", "dump-flows", h.ovs.MgmtSocket("br-int"),
		fmt.Sprintf("table=%d,in_port=%d", pipeline.Classifier, port.OFPort))
	if !strings.Contains(classifier, "actions=meter:1,") {
		t.Fatalf("the Pod's Classifier flow went with the other port's DEL:\n%s", classifier)
	}
	if err := h.be.Del(ctx, req); err != nil {
		t.Fatal(err)
	}
	if left := h.leftovers(ctx); len(left) != 0 {
		t.Errorf("left behind: %v", left)
	}
}

// TestRestoreRefusedMeter restores a Pod port whose recorded meter cannot
// be put back (id 0xffff0001, above OFPM_MAX, the last id a meter may
// have; OpenFlow 1.3.5 section 7.3.4.4; the openflow client refuses it as
// the switch would): the Pod is restored with its flows, without a meter
// (its qdisc alone limits it), and the gauge of egress limits without a
// meter counts it until its DEL.
func TestRestoreRefusedMeter(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	h := newHarness(t, ctx, zaptest.NewLogger(t))
	h.be.cfg.Meters = h.of
	cid := h.prefix + "-refused"
	h.podPort(ctx, cid, "mrp"+h.prefix[1:9], map[string]string{
		ExtIDPodNamespace: "ns", ExtIDPodName: "refused", ExtIDIP: "10.244.1.9", ExtIDMAC: "0a:58:0a:f4:01:09",
		ExtIDEgressBandwidth: "1000000/0", ExtIDEgressMeter: strconv.FormatUint(0xffff0001, 10)})
	if n, err := h.be.RestorePods(ctx); err != nil || n != 1 {
		t.Fatalf("RestorePods = %d, %v; want 1 Pod", n, err)
	}
	a, ok := h.be.Attachment("ns", "refused")
	if !ok || a.EgressMeter != 0 || !a.EgressLimited {
		t.Fatalf("attachment %+v: want an egress limit without a meter", a)
	}
	if ms := h.meters(); len(ms) != 0 {
		t.Errorf("meters %q, want none", ms)
	}
	classifier := h.ovs.Run("ovs-ofctl", "-O", "OpenFlow13", "--no-stats", "dump-flows", h.ovs.MgmtSocket("br-int"),
		fmt.Sprintf("table=%d,in_port=%d", pipeline.Classifier, a.OFPort))
	if !strings.Contains(classifier, "in_port=") || strings.Contains(classifier, "meter:") {
		t.Errorf("the restored Pod's Classifier flow is missing or goes through a meter:\n%s", classifier)
	}
	if n := unmeteredLimits(t, h.reg); n != 1 {
		t.Errorf("seine_pod_egress_limits_without_meter %v, want 1", n)
	}
	if err := h.be.Del(ctx, &cniserver.Request{ContainerID: cid, IfName: "eth0"}); err != nil {
		t.Fatal(err)
	}
	if n := unmeteredLimits(t, h.reg); n != 0 {
		t.Errorf("seine_pod_egress_limits_without_meter %v after the DEL, want 0", n)
	}
	if left := h.leftovers(ctx); len(left) != 0 {
		t.Errorf("left behind: %v", left)
	}
}

// TestRestoreGivesMeter restores Pod ports with egress limits, one with
// its meter on record and three without: "era", attached by the release
// that used ofports as meter ids (its meter, id = its ofport, is on the
// switch), "bare", attached while the datapath had no meters, and
// "clash", whose ofport the recorded meter's id holds. Era and bare get
// their ofport as their id (era's meter is reused, not doubled), clash the
// smallest free id; each is on the switch with the Pod's rate, in the
// Pod's Classifier flow and recorded in its port's external_ids, so no
// limit is left to the qdisc alone. The DELs remove every meter.
func TestRestoreGivesMeter(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	h := newHarness(t, ctx, zaptest.NewLogger(t))
	h.be.cfg.Meters = h.of
	kbps, kbits := bandwidth.EgressMeter(1_000_000, 0)
	ofport := func(port string) uint32 {
		t.Helper()
		p, err := h.db.GetPort(ctx, port)
		if err != nil || p.OFPort <= 0 {
			t.Fatalf("port %s: %+v, %v", port, p, err)
		}
		return uint32(p.OFPort)
	}
	pod := func(name string, n int, extra map[string]string) (cid, port string) {
		cid = h.prefix + "-" + name
		ids := map[string]string{ExtIDPodNamespace: "ns", ExtIDPodName: name,
			ExtIDIP: fmt.Sprintf("10.244.1.%d", 20+n), ExtIDMAC: fmt.Sprintf("0a:58:0a:f4:01:%02x", 20+n),
			ExtIDEgressBandwidth: "1000000/0"}
		maps.Copy(ids, extra)
		maps.DeleteFunc(ids, func(_, v string) bool { return v == "" })
		return cid, h.podPort(ctx, cid, fmt.Sprintf("mg%d%s", n, h.prefix[1:9]), ids)
	}
	clashCID, clashPort := pod("clash", 0, nil)
	recCID, _ := pod("recorded", 1, map[string]string{ExtIDEgressMeter: strconv.FormatUint(uint64(ofport(clashPort)), 10)})
	bareCID, barePort := pod("bare", 2, nil)
	// A Pod without a limit before era, so that era's ofport is not the
	// id the allocation would hand it anyway.
	plainCID, _ := pod("plain", 4, map[string]string{ExtIDEgressBandwidth: ""})
	eraCID, eraPort := pod("era", 3, nil)
	h.ovs.Run("ovs-ofctl", "-O", "OpenFlow13", "add-meter", h.ovs.MgmtSocket("br-int"),
		fmt.Sprintf("meter=%d,kbps,burst,band=type=drop,rate=%d,burst_size=%d", ofport(eraPort), kbps, kbits))

	if n, err := h.be.RestorePods(ctx); err != nil || n != 5 {
		t.Fatalf("RestorePods = %d, %v; want 5 Pods", n, err)
	}
	taken := map[uint32]bool{ofport(clashPort): true, ofport(barePort): true, ofport(eraPort): true}
	var free uint32 = 1
	for taken[free] {
		free++
	}
	want := map[string]uint32{"recorded": ofport(clashPort), "bare": ofport(barePort), "era": ofport(eraPort), "clash": free}
	var wantMeters []string
	for name, id := range want {
		a, ok := h.be.Attachment("ns", name)
		if !ok || a.EgressMeter != id {
			t.Errorf("attachment %s %+v: want meter %d", name, a, id)
			continue
		}
		classifier := h.ovs.Run("ovs-ofctl", "-O", "OpenFlow13", "--no-stats", "dump-flows", h.ovs.MgmtSocket("br-int"),
			fmt.Sprintf("table=%d,in_port=%d", pipeline.Classifier, a.OFPort))
		if !strings.Contains(classifier, fmt.Sprintf("actions=meter:%d,", id)) {
			t.Errorf("%s's Classifier flow does not go through meter %d:\n%s", name, id, classifier)
		}
		if p, err := h.db.GetPort(ctx, a.HostVeth); err != nil || p.ExternalIDs[ExtIDEgressMeter] != strconv.FormatUint(uint64(id), 10) {
			t.Errorf("%s's port external_ids %v, %v: want %s=%d", name, p.ExternalIDs, err, ExtIDEgressMeter, id)
		}
		wantMeters = append(wantMeters, fmt.Sprintf("meter=%d kbps burst stats bands=type=drop rate=%d burst_size=%d", id, kbps, kbits))
	}
	slices.Sort(wantMeters)
	if got := slices.Sorted(slices.Values(h.meters())); !slices.Equal(got, wantMeters) {
		t.Errorf("meters\n%q\nwant\n%q", got, wantMeters)
	}
	if n := unmeteredLimits(t, h.reg); n != 0 {
		t.Errorf("seine_pod_egress_limits_without_meter %v, want 0", n)
	}
	for _, cid := range []string{clashCID, recCID, bareCID, plainCID, eraCID} {
		if err := h.be.Del(ctx, &cniserver.Request{ContainerID: cid, IfName: "eth0"}); err != nil {
			t.Fatal(err)
		}
	}
	if ms := h.meters(); len(ms) != 0 {
		t.Errorf("meters %q after the DELs, want none", ms)
	}
	if left := h.leftovers(ctx); len(left) != 0 {
		t.Errorf("left behind: %v", left)
	}
}
