package podnet

import (
	"context"
	"encoding/json"
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	"go.uber.org/zap"

	of "github.com/seine-net/seine/datapath/openflow"
	"github.com/seine-net/seine/node/bandwidth"
	cniserver "github.com/seine-net/seine/node/cni/server"
)

// TestMeterTable: new meters get the smallest free id, ids claimed from a
// restore are kept apart, a claimed id cannot be claimed twice, and a
// released id is handed out again.
func TestMeterTable(t *testing.T) {
	tab := newMeterTable()
	l := bandwidth.Limits{EgressRate: 20_000_000}
	if err := tab.claim(of.MeterEntry{ID: 2, RateKbps: 5, BurstKbits: 5}); err != nil {
		t.Fatal(err)
	}
	var ids []uint32
	for range 3 {
		ids = append(ids, tab.allocate(l).ID)
	}
	if ids[0] != 1 || ids[1] != 3 || ids[2] != 4 {
		t.Fatalf("allocated %v around claimed 2, want [1 3 4]", ids)
	}
	if err := tab.claim(of.MeterEntry{ID: 3}); err == nil || !strings.Contains(err.Error(), "meter 3 is recorded for two ports") {
		t.Errorf("claiming a taken id: %v", err)
	}
	tab.release(3)
	if m := tab.allocate(l); m.ID != 3 || m.RateKbps != 22_000 || m.BurstKbits != 4_000 {
		t.Errorf("after releasing 3: %+v, want meter 3 at 22,000 kbps with 4,000 kbits", m)
	}
	var all []uint32
	for _, m := range tab.all() {
		all = append(all, m.ID)
	}
	if len(all) != 4 || all[0] != 1 || all[1] != 2 || all[2] != 3 || all[3] != 4 {
		t.Errorf("all: %v, want [1 2 3 4]", all)
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
