package bench

import (
	"context"
	"fmt"
	"os"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/seine-net/seine/datapath/ovsctl"
	"github.com/seine-net/seine/tests/bench/stats"
	"github.com/seine-net/seine/tests/sandbox"
)

// envPurgeRounds overrides purgeRounds.
const envPurgeRounds = "SEINE_BENCH_PURGE_ROUNDS"

// purgeRounds is how many rounds BenchmarkDatapathPurge takes per path.
const purgeRounds = 5

// purgeRates are the purges per second BenchmarkDatapathPurge measures
// traffic under. 0 comes twice: the second is the control, the spread of
// the method. The Service proxy purges once per batch that changed a UDP
// or SCTP frontend (node/proxy, flushConntrack), so under steady UDP
// endpoint churn it purges at about its batch rate.
var purgeRates = []int{0, 0, 2, 10, 50}

// BenchmarkDatapathPurge measures what ovs-vswitchd's revalidator/purge
// (every cached datapath flow dropped, so the next packets upcall) costs
// traffic that has nothing to do with the change, when it comes at a
// steady rate: a 2-Node sandbox, a server Pod on the first Node, clients on
// the same Node and on the other. Each round measures every rate of
// purgeRates in an order that rotates from round to round: one-stream
// iperf3 throughput, then tcprr's p50, while a goroutine purges every Node
// on the path at that rate through the control socket, as the proxy does
// (datapath/ovsctl).
//
// Per path P (same, cross) and rate R it reports, as fractions of the
// round's unpurged figures (medians over rounds, with quartiles):
// purge-R-P-Gbps-cost (throughput lost) and purge-R-P-p50-cost (latency
// added); control-P-Gbps-diff and control-P-p50-diff are the same for the
// second unpurged run. purge-ms is the median time one purge call took.
//
// SEINE_BENCH_PURGE_ROUNDS sets the number of rounds (default 5).
func BenchmarkDatapathPurge(b *testing.B) {
	if os.Geteuid() != 0 {
		b.Skip("needs root")
	}
	rounds := purgeRounds
	if v, err := strconv.Atoi(os.Getenv(envPurgeRounds)); err == nil && v > 0 {
		rounds = v
	}
	rr := buildTCPRR(b)
	for i := 0; i < b.N; i++ {
		c := up(b, "bdp", 2, nil)
		nodes := c.Nodes()
		ctx, cancel := context.WithTimeout(context.Background(), 60*time.Minute)
		serverNS, serverIP := perfPod(ctx, b, c, "server", nodes[0].Name, "server")
		localNS, _ := perfPod(ctx, b, c, "local", nodes[0].Name, "client")
		remoteNS, _ := perfPod(ctx, b, c, "remote", nodes[1].Name, "client")
		var purgeTimes []float64
		for _, from := range []struct{ path, client string }{{"same", localNS}, {"cross", remoteNS}} {
			waitReachable(ctx, b, c, from.client, serverIP)
			onPath := nodes[:1]
			if from.path == "cross" {
				onPath = nodes
			}
			costG := make([][]float64, len(purgeRates))
			costL := make([][]float64, len(purgeRates))
			for r := range rounds {
				gbps := make([]float64, len(purgeRates))
				p50 := make([]float64, len(purgeRates))
				for k := range purgeRates {
					j := (r + k) % len(purgeRates)
					stop := startPurging(ctx, onPath, purgeRates[j])
					gbps[j], _ = iperf3Transfer(b, serverNS, from.client, serverIP, 1)
					p50[j], _ = tcprrRun(b, rr, serverNS, from.client, serverIP)
					times, err := stop()
					if err != nil {
						b.Fatal(err)
					}
					purgeTimes = append(purgeTimes, times...)
				}
				for j := range purgeRates {
					costG[j] = append(costG[j], 1-gbps[j]/gbps[0])
					costL[j] = append(costL[j], p50[j]/p50[0]-1)
				}
			}
			for j, rate := range purgeRates {
				if j == 0 {
					continue
				}
				name := fmt.Sprintf("purge-%d-%s", rate, from.path)
				gName, lName := name+"-Gbps-cost", name+"-p50-cost"
				if j == 1 {
					gName, lName = "control-"+from.path+"-Gbps-diff", "control-"+from.path+"-p50-diff"
				}
				for _, m := range []struct {
					name string
					v    []float64
				}{{gName, costG[j]}, {lName, costL[j]}} {
					q1, q2, q3 := quartiles(m.v)
					b.ReportMetric(q2, m.name)
					b.ReportMetric(q1, m.name+"-q1")
					b.ReportMetric(q3, m.name+"-q3")
				}
			}
		}
		b.ReportMetric(stats.Median(purgeTimes), "purge-ms")
		cancel()
	}
}

// startPurging purges the datapath flows of every Node in nodes rate times
// a second (none for 0) until the returned function is called; that
// returns how long each purge took, in ms, and the first error.
func startPurging(ctx context.Context, nodes []sandbox.Node, rate int) func() ([]float64, error) {
	if rate == 0 {
		return func() ([]float64, error) { return nil, nil }
	}
	ctx, cancel := context.WithCancel(ctx)
	var (
		wg    sync.WaitGroup
		mu    sync.Mutex
		times []float64
		first error
	)
	for _, n := range nodes {
		ovs := ovsctl.New(n.OVSRunDir)
		wg.Add(1)
		go func() {
			defer wg.Done()
			t := time.NewTicker(time.Second / time.Duration(rate))
			defer t.Stop()
			for {
				select {
				case <-ctx.Done():
					return
				case <-t.C:
				}
				start := time.Now()
				err := ovs.PurgeDatapathFlows(ctx)
				mu.Lock()
				if err != nil && ctx.Err() == nil && first == nil {
					first = fmt.Errorf("purging on %s: %w", n.Name, err)
				}
				times = append(times, float64(time.Since(start).Microseconds())/1000)
				mu.Unlock()
			}
		}()
	}
	return func() ([]float64, error) {
		cancel()
		wg.Wait()
		return times, first
	}
}
