package bench

import (
	"context"
	"fmt"
	"io"
	"math"
	"net"
	"net/http"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/seine-net/seine/node/proxy"
)

// Churn of the network programming latency comparison: every
// churnInterval one EndpointSlice changes (one endpoint replaced, its
// endpoints.kubernetes.io/last-change-trigger-time set to the time of the
// change, as the EndpointSlice controller does), for churnDuration.
const (
	churnRate     = 100 // changes per second
	churnDuration = 60 * time.Second
	// envChurnAt is the Service count at which BenchmarkServiceProgramming
	// runs the churn; default 10000, "0" skips it.
	envChurnAt = "SEINE_BENCH_CHURN_AT"
)

func churnAt() int {
	if s := os.Getenv(envChurnAt); s != "" {
		n, _ := strconv.Atoi(s)
		return n
	}
	return 10000
}

// histogram is one scrape of a network programming latency histogram.
type histogram struct {
	count  uint64
	sum    float64
	bounds []float64
	cum    []uint64 // cumulative counts per bound
}

// sub is h minus an earlier scrape of the same histogram.
func (h histogram) sub(before histogram) histogram {
	out := histogram{count: h.count - before.count, sum: h.sum - before.sum, bounds: h.bounds}
	for i, c := range h.cum {
		var b uint64
		if i < len(before.cum) {
			b = before.cum[i]
		}
		out.cum = append(out.cum, c-b)
	}
	return out
}

// quantile is the upper bound of the bucket holding quantile q (+Inf when
// past the last bound).
func (h histogram) quantile(q float64) float64 {
	want := uint64(math.Ceil(q * float64(h.count)))
	for i, c := range h.cum {
		if c >= want {
			return h.bounds[i]
		}
	}
	return math.Inf(1)
}

// within is the fraction of observations at or below bound (a bucket
// bound).
func (h histogram) within(bound float64) float64 {
	if h.count == 0 {
		return 0
	}
	for i, b := range h.bounds {
		if b == bound {
			return float64(h.cum[i]) / float64(h.count)
		}
	}
	return math.NaN()
}

func (h histogram) String() string {
	var b strings.Builder
	fmt.Fprintf(&b, "%d observations, mean %.3f s;", h.count, h.sum/math.Max(float64(h.count), 1))
	prev := uint64(0)
	for i, c := range h.cum {
		if c != prev {
			fmt.Fprintf(&b, " le %gs: %d;", h.bounds[i], c)
		}
		prev = c
		if c == h.count {
			break
		}
	}
	return b.String()
}

// scrapeHistogram reads the histogram name (labels ignored: one series)
// from a /metrics endpoint.
func scrapeHistogram(c *http.Client, url, name string) (histogram, error) {
	mf, err := scrapeFamily(c, url, name)
	if err != nil || mf == nil || len(mf.GetMetric()) == 0 {
		return histogram{}, err // nothing observed yet
	}
	return toHistogram(mf.GetMetric()[0].GetHistogram()), nil
}

// scrapeCounter reads the counter name (one series) from a /metrics
// endpoint: 0 when it is not there.
func scrapeCounter(c *http.Client, url, name string) (float64, error) {
	mf, err := scrapeFamily(c, url, name)
	if err != nil || mf == nil || len(mf.GetMetric()) == 0 {
		return 0, err
	}
	return mf.GetMetric()[0].GetCounter().GetValue(), nil
}

// scrapeFamily reads the metric family name from a /metrics endpoint (nil
// when it has none).
func scrapeFamily(c *http.Client, url, name string) (*dto.MetricFamily, error) {
	resp, err := c.Get(url)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		return nil, err
	}
	p := expfmt.NewTextParser(model.UTF8Validation)
	mfs, err := p.TextToMetricFamilies(strings.NewReader(string(body)))
	if err != nil {
		return nil, err
	}
	return mfs[name], nil
}

func toHistogram(h *dto.Histogram) histogram {
	out := histogram{count: h.GetSampleCount(), sum: h.GetSampleSum()}
	for _, b := range h.GetBucket() {
		out.bounds = append(out.bounds, b.GetUpperBound())
		out.cum = append(out.cum, b.GetCumulativeCount())
	}
	return out
}

// churn replaces one endpoint of one Service every 1/churnRate s for
// churnDuration, round-robin over refs, stamping each EndpointSlice with
// the trigger time of its change. It returns how many changes it made.
func churn(ctx context.Context, b *testing.B, cs kubernetes.Interface, refs []svcRef, round int) int {
	b.Helper()
	slices := cs.DiscoveryV1().EndpointSlices(svcNamespace)
	jobs := make(chan int, churnRate)
	var done atomic.Int64
	var firstErr atomic.Value
	var wg sync.WaitGroup
	for w := 0; w < 16; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for k := range jobs {
				ref := refs[k%len(refs)]
				err := retryAPI(ctx, func() error {
					s, err := slices.Get(ctx, ref.Slice, metav1.GetOptions{})
					if err != nil {
						return err
					}
					s.Endpoints[0].Addresses = []string{churnIP(k + round)}
					if s.Annotations == nil {
						s.Annotations = map[string]string{}
					}
					s.Annotations[corev1.EndpointsLastChangeTriggerTime] = time.Now().UTC().Format(time.RFC3339Nano)
					_, err = slices.Update(ctx, s, metav1.UpdateOptions{})
					return err
				})
				if err != nil {
					firstErr.CompareAndSwap(nil, err)
					continue
				}
				done.Add(1)
			}
		}()
	}
	tick := time.NewTicker(time.Second / churnRate)
	end := time.After(churnDuration)
	k := 0
loop:
	for {
		select {
		case <-tick.C:
			select {
			case jobs <- k:
				k++
			default: // the API server is behind: skip rather than burst
			}
		case <-end:
			break loop
		}
	}
	tick.Stop()
	close(jobs)
	wg.Wait()
	if err, _ := firstErr.Load().(error); err != nil {
		b.Fatalf("churn: %v", err)
	}
	return int(done.Load())
}

// churnIP is the replacement address of the k-th change: 10.244.251.0
// upwards (above the Services' own endpoints).
func churnIP(k int) string {
	k %= 1024
	return fmt.Sprintf("10.244.%d.%d", 251+k/256, k%256)
}

// measureChurn runs the churn against whichever proxy is running and
// returns the increase of its latency histogram over it, waiting settle
// after the last change so that its programming is counted.
func measureChurn(ctx context.Context, b *testing.B, cs kubernetes.Interface, refs []svcRef, round int,
	scrape func() (histogram, error), settle time.Duration) (histogram, int) {
	b.Helper()
	before, err := scrape()
	if err != nil {
		b.Fatal(err)
	}
	n := churn(ctx, b, cs, refs, round)
	time.Sleep(settle)
	after, err := scrape()
	if err != nil {
		b.Fatal(err)
	}
	return after.sub(before), n
}

// reportChurn reports one proxy's histogram of the churn.
func reportChurn(b *testing.B, who string, h histogram, changes int) {
	b.Logf("%s network programming latency over %d changes: %s", who, changes, h)
	b.ReportMetric(float64(changes)/churnDuration.Seconds(), who+"-churn-changes/s")
	b.ReportMetric(float64(h.count), who+"-churn-observations")
	if h.count == 0 {
		return
	}
	b.ReportMetric(h.sum/float64(h.count)*1000, who+"-churn-mean-ms")
	b.ReportMetric(h.quantile(0.5), who+"-churn-p50-le-s")
	b.ReportMetric(h.quantile(0.99), who+"-churn-p99-le-s")
	b.ReportMetric(h.within(0.25), who+"-churn-within-250ms")
	b.ReportMetric(h.within(1), who+"-churn-within-1s")
}

// seineLatency scrapes Seine's network programming latency histogram from
// the daemon on nodeIP (its metrics address, port 9345).
func seineLatency(c *http.Client, nodeIP string) func() (histogram, error) {
	return func() (histogram, error) {
		return scrapeHistogram(c, seineMetricsURL(nodeIP), proxy.ProgrammingLatencyName)
	}
}

// seineMetricsURL is the metrics endpoint of the daemon on nodeIP.
func seineMetricsURL(nodeIP string) string {
	return "http://" + net.JoinHostPort(nodeIP, "9345") + "/metrics"
}

// kubeProxyLatency scrapes kube-proxy's.
func kubeProxyLatency(c *http.Client) func() (histogram, error) {
	return func() (histogram, error) {
		return scrapeHistogram(c, "http://"+kubeProxyMetrics+"/metrics", "kubeproxy_network_programming_duration_seconds")
	}
}
