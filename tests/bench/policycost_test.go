package bench

import (
	"context"
	"os"
	"slices"
	"strconv"
	"testing"
	"time"
)

// envPolicyRounds overrides policyCostRounds.
const envPolicyRounds = "SEINE_BENCH_POLICY_ROUNDS"

// policyCostRounds is how many rounds BenchmarkPolicyCost takes per path.
const policyCostRounds = 15

// BenchmarkPolicyCost measures what 1,000 NetworkPolicies selecting a Pod
// cost its traffic, against the noise of the measurement itself, on a
// 2-Node sandbox in its default configuration. On the server's Node run
// three servers: "server", which every policy selects, and "plain" and
// "plain2", which none selects; clients sit on the same Node and on the
// other one. Each round measures all three servers from one client, one
// after another (a one-stream iperf3 run, then tcprr's p50), in an order
// that rotates from round to round, so drift of the machine's background
// falls on each alike.
//
// Per path P (same, cross) it reports, as fractions:
//
//   - 1000np-P-Gbps-cost and 1000np-P-p50-cost: the median over rounds of
//     the round's ratio server/plain (throughput lost, latency added);
//   - control-P-Gbps-diff and control-P-p50-diff: the same for plain2
//     against plain, two Pods that differ in nothing: the spread of the
//     method, to read the cost against;
//   - 1000np-P-Gbps-cost-q1/-q3 (and control-...-q1/-q3): the quartiles of
//     the per-round ratios.
//
// SEINE_BENCH_POLICY_ROUNDS sets the number of rounds (default 15).
func BenchmarkPolicyCost(b *testing.B) {
	if os.Geteuid() != 0 {
		b.Skip("needs root")
	}
	rounds := policyCostRounds
	if v, err := strconv.Atoi(os.Getenv(envPolicyRounds)); err == nil && v > 0 {
		rounds = v
	}
	rr := buildTCPRR(b)
	for i := 0; i < b.N; i++ {
		c := up(b, "bpc", 2, nil)
		nodes := c.Nodes()
		ctx, cancel := context.WithTimeout(context.Background(), 60*time.Minute)
		mk := func(name, node, role string) (netnsName, ip string) { return perfPod(ctx, b, c, name, node, role) }
		type server struct{ ns, ip string }
		var servers [3]server // server, plain, plain2
		servers[0].ns, servers[0].ip = mk("server", nodes[0].Name, "server")
		servers[1].ns, servers[1].ip = mk("plain", nodes[0].Name, "plain")
		servers[2].ns, servers[2].ip = mk("plain2", nodes[0].Name, "plain")
		localNS, _ := mk("local", nodes[0].Name, "client")
		remoteNS, _ := mk("remote", nodes[1].Name, "client")
		createPerfPolicies(ctx, b, c, nodes[0])
		for _, from := range []struct{ path, client string }{{"same", localNS}, {"cross", remoteNS}} {
			for _, s := range servers {
				waitReachable(ctx, b, c, from.client, s.ip)
			}
			var costG, costL, ctrlG, ctrlL []float64
			for r := range rounds {
				var gbps, p50 [3]float64
				for k := range 3 {
					j := (r + k) % 3
					gbps[j] = iperf3Run(b, servers[j].ns, from.client, servers[j].ip, 1)
					p50[j], _ = tcprrRun(b, rr, servers[j].ns, from.client, servers[j].ip)
				}
				costG = append(costG, 1-gbps[0]/gbps[1])
				costL = append(costL, p50[0]/p50[1]-1)
				ctrlG = append(ctrlG, 1-gbps[2]/gbps[1])
				ctrlL = append(ctrlL, p50[2]/p50[1]-1)
			}
			for _, m := range []struct {
				name string
				v    []float64
			}{
				{"1000np-" + from.path + "-Gbps-cost", costG}, {"1000np-" + from.path + "-p50-cost", costL},
				{"control-" + from.path + "-Gbps-diff", ctrlG}, {"control-" + from.path + "-p50-diff", ctrlL},
			} {
				q1, q2, q3 := quartiles(m.v)
				b.ReportMetric(q2, m.name)
				b.ReportMetric(q1, m.name+"-q1")
				b.ReportMetric(q3, m.name+"-q3")
			}
		}
		cancel()
	}
}

// quartiles returns the first quartile, the median and the third quartile
// of v (nearest rank).
func quartiles(v []float64) (q1, q2, q3 float64) {
	s := slices.Clone(v)
	slices.Sort(s)
	at := func(p float64) float64 { return s[int(p*float64(len(s)-1)+0.5)] }
	return at(0.25), at(0.5), at(0.75)
}
