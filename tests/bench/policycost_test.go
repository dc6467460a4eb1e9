package bench

import (
	"context"
	"github.com/seine-net/seine/tests/bench/stats"
	"os"
	"path/filepath"
	"strconv"
	"strings"
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
// falls on each alike. Throughput on the userspace datapath depends on how
// much CPU ovs-vswitchd gets, which the machine's other work decides; the
// CPU ovs-vswitchd spends per byte (both Nodes' together, over the iperf3
// run) depends on it less, so it is reported too. Last, what does not
// depend on scheduling at all: how ovs-vswitchd classified the run's
// packets (dpif-netdev/pmd-stats-show, all threads, the Nodes on the path):
// a packet that hits an exact-match cache costs the same whatever the
// OpenFlow tables hold; the tables cost only upcalls and megaflow lookups.
//
// Per path P (same, cross) it reports, as fractions:
//
//   - 1000np-P-Gbps-cost and 1000np-P-p50-cost: the median over rounds of
//     the round's ratio server/plain (throughput lost, latency added);
//   - control-P-Gbps-diff and control-P-p50-diff: the same for plain2
//     against plain, two Pods that differ in nothing: the spread of the
//     method, to read the cost against;
//   - 1000np-P-cpu-cost and control-P-cpu-diff: the same for
//     ovs-vswitchd's CPU time per byte received (cost added);
//   - ...-q1/-q3 of each: the quartiles of the per-round ratios;
//   - 1000np-P-exact-share and plain-P-exact-share: the share of datapath
//     passes (packets and their recirculations) that hit an exact-match
//     cache (simple match, EMC or SMC), medians over rounds;
//     ...-subtables-per-megaflow-hit and ...-upcalls-per-Mpass likewise.
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
			var costG, costL, costC, ctrlG, ctrlL, ctrlC []float64
			var exact, subtables, upcalls [2][]float64 // server, plain
			onPath := nodes[:1]
			if from.path == "cross" {
				onPath = nodes
			}
			for r := range rounds {
				var gbps, p50, cpuPerByte [3]float64
				for k := range 3 {
					j := (r + k) % 3
					for _, n := range onPath {
						appctl(b, n, "dpif-netdev/pmd-stats-clear")
					}
					before := vswitchdCPU(b, nodes[0].OVSRunDir, nodes[1].OVSRunDir)
					var bytes float64
					gbps[j], bytes = iperf3Transfer(b, servers[j].ns, from.client, servers[j].ip, 1)
					cpuPerByte[j] = float64(vswitchdCPU(b, nodes[0].OVSRunDir, nodes[1].OVSRunDir)-before) / bytes
					var cls classification
					for _, n := range onPath {
						cls.add(appctl(b, n, "dpif-netdev/pmd-stats-show"))
					}
					if j < 2 { // server, plain
						exact[j] = append(exact[j], cls.exact/cls.passes)
						subtables[j] = append(subtables[j], cls.subtableLookups/max(cls.megaflowHits, 1))
						upcalls[j] = append(upcalls[j], 1e6*cls.upcalls/cls.passes)
					}
					p50[j], _ = tcprrRun(b, rr, servers[j].ns, from.client, servers[j].ip)
				}
				costG = append(costG, 1-gbps[0]/gbps[1])
				costL = append(costL, p50[0]/p50[1]-1)
				costC = append(costC, cpuPerByte[0]/cpuPerByte[1]-1)
				ctrlG = append(ctrlG, 1-gbps[2]/gbps[1])
				ctrlL = append(ctrlL, p50[2]/p50[1]-1)
				ctrlC = append(ctrlC, cpuPerByte[2]/cpuPerByte[1]-1)
			}
			for _, m := range []struct {
				name string
				v    []float64
			}{
				{"1000np-" + from.path + "-Gbps-cost", costG}, {"1000np-" + from.path + "-p50-cost", costL},
				{"control-" + from.path + "-Gbps-diff", ctrlG}, {"control-" + from.path + "-p50-diff", ctrlL},
				{"1000np-" + from.path + "-cpu-cost", costC}, {"control-" + from.path + "-cpu-diff", ctrlC},
			} {
				q1, q2, q3 := quartiles(m.v)
				b.ReportMetric(q2, m.name)
				b.ReportMetric(q1, m.name+"-q1")
				b.ReportMetric(q3, m.name+"-q3")
			}
			for i, who := range []string{"1000np", "plain"} {
				b.ReportMetric(stats.Median(exact[i]), who+"-"+from.path+"-exact-share")
				b.ReportMetric(stats.Median(subtables[i]), who+"-"+from.path+"-subtables-per-megaflow-hit")
				b.ReportMetric(stats.Median(upcalls[i]), who+"-"+from.path+"-upcalls-per-Mpass")
			}
		}
		cancel()
	}
}

// classification sums how ovs-vswitchd's userspace datapath classified
// packets, over the threads of one or more dpif-netdev/pmd-stats-show
// outputs (ovs-vswitchd(8), "DPIF-NETDEV COMMANDS").
type classification struct {
	// passes is packets received plus their recirculations: each is one
	// trip through the classifier.
	passes float64
	// exact is the passes that hit an exact-match cache: simple match,
	// EMC or SMC.
	exact float64
	// megaflowHits is the passes that hit a megaflow, and
	// subtableLookups the subtables searched for them.
	megaflowHits, subtableLookups float64
	// upcalls is the passes that missed everything and went to the
	// OpenFlow tables.
	upcalls float64
}

// add parses one pmd-stats-show output ("  emc hits: 12" lines under each
// thread's heading) into c.
func (c *classification) add(stats string) {
	var mfHits float64
	for line := range strings.Lines(stats) {
		k, v, ok := strings.Cut(strings.TrimSpace(line), ":")
		if !ok {
			continue
		}
		f, err := strconv.ParseFloat(strings.TrimSpace(v), 64)
		if err != nil {
			continue
		}
		switch k {
		case "packets received", "packet recirculations":
			c.passes += f
		case "simple match hits", "emc hits", "smc hits":
			c.exact += f
		case "megaflow hits":
			mfHits = f
			c.megaflowHits += f
		case "avg. subtable lookups per megaflow hit":
			c.subtableLookups += f * mfHits // follows "megaflow hits"
		case "miss with success upcall", "miss with failed upcall":
			c.upcalls += f
		}
	}
}

// vswitchdCPU returns the CPU time so far of the ovs-vswitchd of each OVS
// run directory, summed.
func vswitchdCPU(b *testing.B, runDirs ...string) time.Duration {
	b.Helper()
	var sum time.Duration
	for _, dir := range runDirs {
		d, err := processCPU(filepath.Join(dir, "ovs-vswitchd.pid"))
		if err != nil {
			b.Fatal(err)
		}
		sum += d
	}
	return sum
}

// quartiles returns the first quartile, the median and the third quartile
// of v (nearest rank).
func quartiles(v []float64) (q1, q2, q3 float64) {
	return stats.Quantile(v, 0.25), stats.Quantile(v, 0.5), stats.Quantile(v, 0.75)
}

func TestClassificationAdd(t *testing.T) {
	const stats = `pmd thread numa_id 0 core_id 1:
  packets received: 100
  packet recirculations: 100
  avg. datapath passes per packet: 2.00
  simple match hits: 10
  emc hits: 150
  smc hits: 0
  megaflow hits: 30
  avg. subtable lookups per megaflow hit: 2.50
  miss with success upcall: 9
  miss with failed upcall: 1
main thread:
  packets received: 10
  packet recirculations: 0
  emc hits: 5
  megaflow hits: 5
  avg. subtable lookups per megaflow hit: 1.00
  miss with success upcall: 0
  miss with failed upcall: 0
`
	var c classification
	c.add(stats)
	want := classification{passes: 210, exact: 165, megaflowHits: 35, subtableLookups: 80, upcalls: 10}
	if c != want {
		t.Errorf("classification = %+v, want %+v", c, want)
	}
}
