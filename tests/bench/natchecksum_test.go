package bench

import (
	"context"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/seine-net/seine/datapath/csumseed"
	"github.com/seine-net/seine/node/config"
	"github.com/seine-net/seine/tests/bench/stats"
	"github.com/seine-net/seine/tests/sandbox"
)

// natChecksumRounds is how many times each configuration takes its turn.
const natChecksumRounds = 4

// BenchmarkNATChecksum compares the two ways a NATed packet with a partial
// checksum is made right before it leaves the Node (natChecksum,
// docs/configuration.md "NAT of offloaded packets"): "rewrite", the tc
// program on the leaving devices (datapath/csumseed), and "detour", the
// pipeline's pass through the segmentation port. On a 2-Node sandbox in
// its default configuration (VXLAN), a client on one Node reaches a server
// on the other through the server's ClusterIP (NATed on the client's Node,
// leaving through the tunnel) and by Pod IP (not NATed: the reference).
// Each round restarts seine on both Nodes with one configuration, then the
// other (the order alternating between rounds), and measures one iperf3
// stream (dpSeconds) to each destination and tcprr's latency through the
// ClusterIP. It reports medians over the rounds.
func BenchmarkNATChecksum(b *testing.B) {
	rr := buildTCPRR(b)
	for i := 0; i < b.N; i++ {
		c := up(b, "bnc", 2, nil)
		nodes := c.Nodes()
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Minute)
		srvNS, srvIP := perfPod(ctx, b, c, "server", nodes[0].Name, "server")
		cliNS, _ := perfPod(ctx, b, c, "client", nodes[1].Name, "client")
		vip := createPerfService(ctx, b, c)
		waitReachable(ctx, b, c, cliNS, vip)

		modes := []string{config.NATChecksumRewrite, config.NATChecksumDetour}
		svc, pod, p50 := map[string][]float64{}, map[string][]float64{}, map[string][]float64{}
		for round := range natChecksumRounds {
			order := slices.Clone(modes)
			if round%2 == 1 {
				slices.Reverse(order)
			}
			for _, m := range order {
				for _, n := range nodes {
					if err := c.StopSeine(n.Name); err != nil {
						b.Fatal(err)
					}
					if err := c.StartSeine(ctx, n.Name, map[string]string{"natChecksum": m}); err != nil {
						b.Fatal(err)
					}
					checkSeedFilter(ctx, b, c, n, m == config.NATChecksumRewrite)
				}
				waitReachable(ctx, b, c, cliNS, vip)
				svc[m] = append(svc[m], iperf3Run(b, srvNS, cliNS, vip, 1))
				pod[m] = append(pod[m], iperf3Run(b, srvNS, cliNS, srvIP, 1))
				lat, _ := tcprrRun(b, rr, srvNS, cliNS, vip)
				p50[m] = append(p50[m], lat)
			}
		}
		cancel()
		for _, m := range modes {
			b.ReportMetric(stats.Median(svc[m]), "svc-cross-"+m+"-Gbps")
			b.ReportMetric(stats.Median(pod[m]), "pod-cross-"+m+"-Gbps")
			b.ReportMetric(stats.Median(p50[m]), "svc-cross-"+m+"-p50-us")
			b.Logf("%-8s ClusterIP across Nodes %v Gbit/s, p50 %v µs; Pod IP across Nodes %v Gbit/s",
				m, svc[m], p50[m], pod[m])
		}
		r, d := config.NATChecksumRewrite, config.NATChecksumDetour
		b.ReportMetric(stats.Median(svc[r])/stats.Median(svc[d]), "svc-cross-rewrite/detour-Gbps")
		b.ReportMetric(stats.Median(svc[r])/stats.Median(pod[r]), "svc/pod-cross-rewrite-Gbps")
	}
}

// checkSeedFilter fails the benchmark unless n's gateway has the checksum
// seed filter exactly when want: a configuration that did not take would
// measure the other one.
func checkSeedFilter(ctx context.Context, b *testing.B, c *sandbox.Cluster, n sandbox.Node, want bool) {
	b.Helper()
	out, err := c.NodeExec(ctx, n.Name, "tc", "filter", "show", "dev", "seine-gw0", "ingress")
	if err != nil {
		b.Fatalf("tc filters of %s's gateway: %v\n%s", n.Name, err, out)
	}
	if got := strings.Contains(string(out), csumseed.ProgramName); got != want {
		b.Fatalf("%s: checksum seed filter on the gateway %v, want %v:\n%s", n.Name, got, want, out)
	}
}
