package controller

import (
	"context"
	"os"
	"strconv"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/seine-net/seine/policy/compute/workloads"
)

// benchScale divides the workload sizes: $SEINE_BENCH_SCALE, default 20
// (the full-size workloads need 100,000 Pods created in the API server,
// which takes longer than the benchmark is worth on 2 cores).
func benchScale() int {
	if s, err := strconv.Atoi(os.Getenv("SEINE_BENCH_SCALE")); err == nil && s > 0 {
		return s
	}
	return 20
}

// benchWorkers is $SEINE_BENCH_WORKERS, default 0 (DefaultWorkers).
func benchWorkers() int {
	n, _ := strconv.Atoi(os.Getenv("SEINE_BENCH_WORKERS"))
	return n
}

// BenchmarkWorkloadsIntoAPIServer runs workloads 1–4 (scaled down by
// benchScale) against a real API server: each in a fresh control plane,
// the source objects are created first (not timed), then a controller
// starts and the time until every computed object is stored (controller
// idle) is measured. Metrics: objects stored, writes, bytes written
// (request bodies of the controller's controlplane client).
// Run with -benchtime=1x: every iteration starts a control plane.
func BenchmarkWorkloadsIntoAPIServer(b *testing.B) {
	scale := benchScale()
	b.Logf("workloads scaled down by %d", scale)
	for _, spec := range workloads.All(scale) {
		b.Run(spec.Name, func(b *testing.B) {
			var objects, writes, bytes float64
			for i := 0; i < b.N; i++ {
				b.StopTimer()
				w := spec.Build()
				e := startEnv(b)
				ctx, cancel := context.WithTimeout(context.Background(), 20*time.Minute)
				t0 := time.Now()
				e.createAll(b, ctx, w.Nodes, w.Namespaces, w.Pods, w.Policies)
				b.Logf("%s: %d pods, %d policies created in %v", spec.Name, len(w.Pods), len(w.Policies), time.Since(t0))
				reg := prometheus.NewRegistry()
				cfg := Config{Identity: "bench", Registry: reg, Workers: benchWorkers(),
					LeaseDuration: 5 * time.Second, RenewDeadline: 4 * time.Second, RetryPeriod: 500 * time.Millisecond}
				b.StartTimer()
				// The daemon's default rate limit for the controller's
				// client (networkPolicy.controllerQPS/controllerBurst).
				c, stop := startController(b, e, e.countingCP(500, 1000), cfg)
				waitFor(b, 15*time.Minute, "leader", c.IsLeader)
				waitIdle(b, c, 15*time.Minute, 200*time.Millisecond)
				b.StopTimer()
				stop()
				objects = float64(countStored(b, e))
				writes = 0
				for _, kind := range []string{"AddressGroup", "AppliedToGroup", "NetworkPolicy", "PodRealization"} {
					for _, verb := range []string{"create", "update", "delete"} {
						writes += metricValue(c.metrics.writes.WithLabelValues(kind, verb))
					}
				}
				bytes = float64(e.bytes.Load())
				cancel()
			}
			b.ReportMetric(objects, "objects")
			b.ReportMetric(writes, "writes")
			b.ReportMetric(bytes/(1<<20), "MB-written")
		})
	}
}

func countStored(tb testing.TB, e *env) int {
	ctx := context.Background()
	c := e.cp.ControlplaneV1alpha1()
	n := 0
	ag, err1 := c.AddressGroups().List(ctx, metav1ListAll)
	atg, err2 := c.AppliedToGroups().List(ctx, metav1ListAll)
	np, err3 := c.NetworkPolicies().List(ctx, metav1ListAll)
	pr, err4 := c.PodRealizations().List(ctx, metav1ListAll)
	for _, err := range []error{err1, err2, err3, err4} {
		if err != nil {
			tb.Fatal(err)
		}
	}
	n += len(ag.Items) + len(atg.Items) + len(np.Items) + len(pr.Items)
	return n
}

var metav1ListAll = metav1.ListOptions{}
