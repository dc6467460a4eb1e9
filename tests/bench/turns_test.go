package bench

import (
	"testing"

	"github.com/seine-net/seine/tests/bench/stats"
)

// takeTurns measures the Pods of p in each of states, taking turns: rounds
// rounds, the order of the states rotating from one round to the next, so
// that each state sees the same drift of the machine's background. A turn
// calls set(state), then measures one tcprr run and one one-stream iperf3
// run from p's local client ("one-node") and from its remote one
// ("cross") to the server, then calls after(state) (nil: nothing). It
// reports, per path and state, the medians <path>-<state>-p50-us and
// <path>-<state>-Gbps, logs every turn's figures, and reports each other
// state's ratio to base: <path>-<state>/<base>-p50 and -Gbps.
func takeTurns(b *testing.B, rr string, p perfEnds, rounds int, states []string, base string, set, after func(state string)) {
	b.Helper()
	paths := []struct{ name, client string }{{"one-node", p.localNS}, {"cross", p.remoteNS}}
	res := map[string]*turns{}
	for _, pp := range paths {
		for _, s := range states {
			res[pp.name+"-"+s] = &turns{}
		}
	}
	for r := range rounds {
		for k := range states {
			s := states[(r+k)%len(states)]
			set(s)
			for _, pp := range paths {
				t := res[pp.name+"-"+s]
				p50, _ := tcprrRun(b, rr, p.srvNS, pp.client, p.srvIP)
				t.P50 = append(t.P50, p50)
				t.Gbps = append(t.Gbps, iperf3Run(b, p.srvNS, pp.client, p.srvIP, 1))
			}
			if after != nil {
				after(s)
			}
		}
	}
	for _, pp := range paths {
		for _, s := range states {
			t := res[pp.name+"-"+s]
			b.ReportMetric(stats.Median(t.P50), pp.name+"-"+s+"-p50-us")
			b.ReportMetric(stats.Median(t.Gbps), pp.name+"-"+s+"-Gbps")
			b.Logf("%-8s %-11s p50 µs %v, Gbit/s %v", pp.name, s, t.P50, t.Gbps)
		}
		for _, s := range states {
			if s == base {
				continue
			}
			b.ReportMetric(stats.Median(res[pp.name+"-"+s].P50)/stats.Median(res[pp.name+"-"+base].P50), pp.name+"-"+s+"/"+base+"-p50")
			b.ReportMetric(stats.Median(res[pp.name+"-"+s].Gbps)/stats.Median(res[pp.name+"-"+base].Gbps), pp.name+"-"+s+"/"+base+"-Gbps")
		}
	}
}
