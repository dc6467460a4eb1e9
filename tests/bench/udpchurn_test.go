package bench

import (
	"context"
	"os"
	"strconv"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"

	"github.com/seine-net/seine/node/proxy"
)

// envUDPChurnServices is the number of UDP Services BenchmarkProxyUDPChurn
// churns over (default 1000).
const envUDPChurnServices = "SEINE_BENCH_UDP_SERVICES"

// BenchmarkProxyUDPChurn measures how often Seine's Service proxy purges
// the Node's cached datapath flows under steady UDP endpoint churn: N UDP
// ClusterIP Services (4 endpoints each, selector-less) on one sandbox
// Node, then one endpoint replaced every 1/churnRate s for churnDuration,
// as measureChurn does for TCP. Every replaced UDP endpoint calls for a
// conntrack flush, and flushes for a purge first, which the proxy spaces
// at least proxy.DefaultMinPurgeInterval apart (docs/design.md, "Service
// proxy"); BenchmarkDatapathPurge measures what a purge rate costs other
// traffic.
//
// Metrics, all over the churn (counters read from the daemon's /metrics
// before it and 5 s after its last change): changes/s made, batches/s
// (seine_proxy_sync_duration_seconds' count), batch-mean-ms,
// purges/s (seine_proxy_datapath_purges_total), and the network
// programming latency's mean, p50 and p99 (the upper bound of its
// bucket, kube-proxy's buckets).
func BenchmarkProxyUDPChurn(b *testing.B) {
	n := 1000
	if s := os.Getenv(envUDPChurnServices); s != "" {
		v, err := strconv.Atoi(s)
		if err != nil || v < 1 {
			b.Fatalf("%s=%q: want a positive number of Services", envUDPChurnServices, s)
		}
		n = v
	}
	c := up(b, "budp", 1, nil)
	node := c.Nodes()[0]
	cs := bulkClient(b, c)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Minute)
	defer cancel()
	of := newSeineOF(node)
	hc := netnsHTTPClient("/run/netns/" + node.NetNS)
	url := seineMetricsURL(node.IP)

	refs, err := createServices(ctx, cs, corev1.ProtocolUDP, 0, n)
	if err != nil {
		b.Fatal(err)
	}
	if !waitSeineService(b, of, refs[n-1].ClusterIP, 2*time.Minute) {
		b.Fatalf("Seine did not program %s (%s) within 2 minutes of its creation", refs[n-1].Name, refs[n-1].ClusterIP)
	}
	time.Sleep(3 * time.Second) // the last batches of the creation

	type reading struct {
		batches histogram
		purges  float64
		latency histogram
	}
	read := func() reading {
		b.Helper()
		var r reading
		var err error
		if r.batches, err = scrapeHistogram(hc, url, proxy.SyncDurationName); err != nil {
			b.Fatal(err)
		}
		if r.purges, err = scrapeCounter(hc, url, proxy.DatapathPurgesName); err != nil {
			b.Fatal(err)
		}
		if r.latency, err = scrapeHistogram(hc, url, proxy.ProgrammingLatencyName); err != nil {
			b.Fatal(err)
		}
		return r
	}
	before := read()
	changes := churn(ctx, b, cs, refs, 0)
	time.Sleep(5 * time.Second) // the last change's batch and its reflush
	after := read()

	secs := churnDuration.Seconds()
	batches := after.batches.sub(before.batches)
	purges := after.purges - before.purges
	latency := after.latency.sub(before.latency)
	b.Logf("%d UDP Services, %d changes in %v: %d batches (mean %.1f ms), %.0f purges; programming latency %s",
		n, changes, churnDuration, batches.count, 1000*batches.sum/max(float64(batches.count), 1), purges, latency)
	b.ReportMetric(float64(changes)/secs, "changes/s")
	b.ReportMetric(float64(batches.count)/secs, "batches/s")
	b.ReportMetric(1000*batches.sum/max(float64(batches.count), 1), "batch-mean-ms")
	b.ReportMetric(purges/secs, "purges/s")
	if latency.count > 0 {
		b.ReportMetric(1000*latency.sum/float64(latency.count), "latency-mean-ms")
		b.ReportMetric(latency.quantile(0.5), "latency-p50-le-s")
		b.ReportMetric(latency.quantile(0.99), "latency-p99-le-s")
	}
	if purges == 0 {
		b.Errorf("no purge over %d UDP endpoint changes: is %s exported, and are the flushes made?", changes, proxy.DatapathPurgesName)
	}
}
