package bench

import (
	"context"
	"fmt"
	"net/http"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/client-go/kubernetes"

	"github.com/seine-net/seine/datapath/pipeline"
	"github.com/seine-net/seine/node/proxy"
	"github.com/seine-net/seine/tests/bench/stats"
	"github.com/seine-net/seine/tests/sandbox"
)

// Environment knobs of the Service benchmarks.
const (
	// envKubeProxyOnly, when non-empty, measures kube-proxy alone: without
	// it BenchmarkServiceProgramming skips when Seine has no Service proxy.
	envKubeProxyOnly = "SEINE_BENCH_KUBEPROXY_ONLY"
	// envServiceScales is a comma-separated list of Service counts,
	// ascending; default "100,1000,10000,30000".
	envServiceScales = "SEINE_BENCH_SERVICES"
)

// changeRepeats is how many one-Service changes are timed per scale (the
// median is reported); changeGap separates them, longer than
// kube-proxy's default minSyncPeriod (1 s) so that its rate limit never
// delays a measured change.
const (
	changeRepeats = 5
	changeGap     = 1500 * time.Millisecond
)

func serviceScales(b *testing.B) []int {
	b.Helper()
	s := os.Getenv(envServiceScales)
	if s == "" {
		return []int{100, 1000, 10000, 30000}
	}
	var out []int
	for _, f := range strings.Split(s, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(f))
		if err != nil || n < 2 || (len(out) > 0 && n <= out[len(out)-1]) {
			b.Fatalf("%s=%q: want ascending integers >= 2", envServiceScales, s)
		}
		out = append(out, n)
	}
	return out
}

func scaleLabel(n int) string {
	if n%1000 == 0 {
		return fmt.Sprintf("%dk", n/1000)
	}
	return strconv.Itoa(n)
}

func ms(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }

// seineShape is what Seine's proxy installs per Service, measured on the
// first two Services: total Service-category flows are about
// shared + perService*N.
type seineShape struct {
	shared, perService int
}

func (s seineShape) expect(n int) int { return s.shared + s.perService*n }

// waitSeineService waits up to timeout for Service-category flows matching
// the ClusterIP; false if none appear.
func waitSeineService(b *testing.B, of *seineOF, clusterIP string, timeout time.Duration) bool {
	b.Helper()
	deadline := time.Now().Add(timeout)
	for time.Now().Before(deadline) {
		fs, err := of.serviceFlows(clusterIP)
		if err != nil {
			b.Fatal(err)
		}
		if len(fs) > 0 {
			return true
		}
		time.Sleep(200 * time.Millisecond)
	}
	return false
}

// BenchmarkServiceProgramming times how long Seine's OVS Service proxy and
// kube-proxy (nftables mode, run in the same sandbox Node) take to program
// N ClusterIP Services of one TCP port and 4 endpoints each, for N = 100,
// 1,000, 10,000 and 30,000 (SEINE_BENCH_SERVICES overrides): from a cold
// start (all objects in the API, the proxy process started) until every
// Service is programmed, and for one EndpointSlice change (one endpoint
// replaced; median of 5) from the update request until the Service's rules
// use the new endpoint and no longer the old one.
//
// The Services are selector-less with hand-written EndpointSlices, so no
// Pods are needed. At each scale Seine is measured first, then kube-proxy,
// with the other one stopped, so they never compete for the CPU; each has
// its own deadline (coldDeadline), and a proxy missing it is reported
// without ending the benchmark.
//
// "Programmed" is, for either proxy, the finishing time of its own sync
// (kube-proxy: kubeproxy_sync_proxy_rules_last_timestamp_seconds after its
// nftables table is seen to hold the expected rules; Seine:
// seine_proxy_sync_last_timestamp_seconds after ovs-ofctl shows Service
// flows of the new start round for every ClusterIP, as many as the first
// two Services predict), so listing large rule sets is not counted. For a
// change, Seine's figure is when ovs-ofctl first shows the flows sharing
// the cookie of the ClusterIP's flows, and their groups, naming the new
// endpoint and not the old: an upper bound by up to one poll.
//
// Metrics per scale L (100, 1k, 10k, 30k): seine-cold-L-ms,
// kubeproxy-cold-L-ms, seine-change-L-ms, kubeproxy-change-L-ms,
// cold-L-ratio and change-L-ratio (kube-proxy's time over Seine's),
// seine-flows-L, seine-groups-L, kubeproxy-nft-rules-L,
// kubeproxy-nft-chains-L, create-L-s (time to create the objects through
// the API), and kubeproxy-missed-L (1) when kube-proxy missed a
// deadline (coldDeadline, changeDeadline); the churn metrics of measureChurn at SEINE_BENCH_CHURN_AT.
//
// It skips when Seine has no Service proxy yet (no flow with cookie
// category pipeline.CategoryService for a new Service's ClusterIP), unless
// SEINE_BENCH_KUBEPROXY_ONLY is set, which measures kube-proxy alone.
func BenchmarkServiceProgramming(b *testing.B) {
	kubeProxyOnly := os.Getenv(envKubeProxyOnly) != ""
	scales := serviceScales(b)
	kubeProxyBinary(b) // fail early when it is not built
	c := up(b, "bsvc", 1, nil)
	node := c.Nodes()[0]
	cs := bulkClient(b, c)
	ctx, cancel := context.WithTimeout(context.Background(), 100*time.Minute)
	defer cancel()
	of := newSeineOF(node)

	// Two Services first: is Seine's proxy there, and what does it install
	// per Service?
	refs, err := createServices(ctx, cs, corev1.ProtocolTCP, 0, 1)
	if err != nil {
		b.Fatal(err)
	}
	seineOn := !kubeProxyOnly
	var shape seineShape
	if !waitSeineService(b, of, refs[0].ClusterIP, 20*time.Second) {
		if !kubeProxyOnly {
			b.Skipf("Seine's Service proxy is not there yet: no flow with cookie category %d (CategoryService) matches ip,nw_dst=%s on %s 20 s after the Service was created; set %s=1 to measure kube-proxy alone",
				pipeline.CategoryService, refs[0].ClusterIP, of.mgmt, envKubeProxyOnly)
		}
		b.Logf("Seine's Service proxy not found; measuring kube-proxy alone")
	} else if seineOn {
		t1, err := of.count(categoryFilter(pipeline.CategoryService))
		if err != nil {
			b.Fatal(err)
		}
		more, err := createServices(ctx, cs, corev1.ProtocolTCP, 1, 2)
		if err != nil {
			b.Fatal(err)
		}
		refs = append(refs, more...)
		if !waitSeineService(b, of, refs[1].ClusterIP, 20*time.Second) {
			b.Fatalf("Seine programmed %s but not %s within 20 s", refs[0].Name, refs[1].Name)
		}
		time.Sleep(time.Second) // let the second Service's flows settle
		t2, err := of.count(categoryFilter(pipeline.CategoryService))
		if err != nil {
			b.Fatal(err)
		}
		shape.perService = t2 - t1
		if shape.perService <= 0 {
			fs, _ := of.serviceFlows(refs[1].ClusterIP)
			shape.perService = len(fs)
		}
		shape.shared = t2 - 2*shape.perService
		b.Logf("seine: %d Service flows per Service, %d shared", shape.perService, shape.shared)
	}
	// Neither proxy runs while the objects are created.
	if err := c.StopSeine(node.Name); err != nil {
		b.Fatal(err)
	}
	kp := newKubeProxy(b, c, node)
	b.Logf("kube-proxy log: %s", kp.logPath)
	seineHTTP := netnsHTTPClient("/run/netns/" + node.NetNS)

	for si, n := range scales {
		label := scaleLabel(n)
		start := time.Now()
		more, err := createServices(ctx, cs, corev1.ProtocolTCP, len(refs), n)
		if err != nil {
			b.Fatal(err)
		}
		refs = append(refs, more...)
		b.ReportMetric(time.Since(start).Seconds(), "create-"+label+"-s")
		b.Logf("%s: created %d Services and EndpointSlices in %v", label, len(more), time.Since(start).Round(time.Millisecond))
		target := refs[n/2]
		deadline := coldDeadline(n)

		// Seine first, then kube-proxy, each within its own deadline: one
		// proxy missing it is reported and does not hide the other's
		// figure.
		var sCold, sChange time.Duration
		if seineOn {
			newIPs := changedIPs(si, 1)
			sCold, sChange, err = measureSeine(ctx, b, cs, c, node, of, seineHTTP, refs, shape, target, newIPs, deadline)
			if err != nil {
				b.Errorf("%s: seine: %v", label, err)
			} else {
				b.ReportMetric(ms(sCold), "seine-cold-"+label+"-ms")
				b.ReportMetric(ms(sChange), "seine-change-"+label+"-ms")
				if n == churnAt() {
					h, changes := measureChurn(ctx, b, cs, refs, 1, seineLatency(seineHTTP, node.IP), 5*time.Second)
					reportChurn(b, "seine", h, changes)
				}
				flows, err := of.count(categoryFilter(pipeline.CategoryService))
				if err != nil {
					b.Fatal(err)
				}
				groups, err := of.groups()
				if err != nil {
					b.Fatal(err)
				}
				b.ReportMetric(float64(flows), "seine-flows-"+label)
				b.ReportMetric(float64(groups), "seine-groups-"+label)
				b.Logf("%s: seine cold %v, change %v (median), %d Service flows, %d groups", label, sCold, sChange, flows, groups)
			}
			if err := c.StopSeine(node.Name); err != nil {
				b.Fatal(err)
			}
		}

		kpCold, kpChange, err := measureKubeProxy(ctx, b, cs, kp, refs, target, changedIPs(si, 0), deadline)
		if kpCold > 0 {
			b.ReportMetric(ms(kpCold), "kubeproxy-cold-"+label+"-ms")
			if sCold > 0 {
				b.ReportMetric(float64(kpCold)/float64(sCold), "cold-"+label+"-ratio")
			}
		}
		if err != nil {
			kp.stop()
			b.Logf("%s: kube-proxy cold %v; %v", label, kpCold, err)
			b.ReportMetric(1, "kubeproxy-missed-"+label)
			continue
		}
		b.ReportMetric(ms(kpChange), "kubeproxy-change-"+label+"-ms")
		if n == churnAt() {
			h, changes := measureChurn(ctx, b, cs, refs, 0, kubeProxyLatency(kp.http), 20*time.Second)
			reportChurn(b, "kubeproxy", h, changes)
		}
		rules, chains, err := kp.ruleCounts()
		if err != nil {
			b.Fatal(err)
		}
		b.ReportMetric(float64(rules), "kubeproxy-nft-rules-"+label)
		b.ReportMetric(float64(chains), "kubeproxy-nft-chains-"+label)
		kp.stop()
		b.Logf("%s: kube-proxy cold %v, change %v (median), %d rules in %d chains", label, kpCold, kpChange, rules, chains)
		if sChange > 0 {
			b.ReportMetric(float64(kpChange)/float64(sChange), "change-"+label+"-ratio")
		}
	}
}

// coldDeadline is how long either proxy may take to program n Services
// from a cold start before the benchmark reports it missed: 5 min plus
// 20 s per 1,000 Services (15 min at 30,000).
func coldDeadline(n int) time.Duration {
	return 5*time.Minute + time.Duration(n/1000)*20*time.Second
}

// changedIPs are the replacement addresses of scale si's one-change steps
// for proxy 0 (kube-proxy) or 1 (Seine): distinct for every step of a
// run, so that a change is never a no-op.
func changedIPs(si, proxy int) []string {
	ips := make([]string, changeRepeats)
	for r := range ips {
		ips[r] = changedIP((si*2+proxy)*changeRepeats + r)
	}
	return ips
}

// measureKubeProxy starts kube-proxy on an empty nftables table and times
// its first full sync, then times changeRepeats endpoint replacements on
// target; it returns the cold-start time and the median change time.
func measureKubeProxy(ctx context.Context, b *testing.B, cs kubernetes.Interface, kp *kubeProxy, refs []svcRef, target svcRef, newIPs []string, deadline time.Duration) (cold, change time.Duration, err error) {
	b.Helper()
	kp.deleteTables()
	t0 := time.Now()
	if err := kp.start(); err != nil {
		b.Fatal(err)
	}
	wctx, cancel := context.WithTimeout(ctx, deadline)
	ts, err := kp.waitProgrammed(wctx, t0, 50*time.Millisecond, func() bool {
		return kp.hasServices(refs)
	})
	cancel()
	if err != nil {
		return 0, 0, fmt.Errorf("cold start of %d Services not programmed within %v: %w", len(refs), deadline, err)
	}
	cold = ts.Sub(t0)
	var lat []time.Duration
	for _, ip := range newIPs {
		time.Sleep(changeGap)
		old, t0, err := replaceEndpoint(ctx, cs, target, ip)
		if err != nil {
			b.Fatal(err)
		}
		wctx, cancel := context.WithTimeout(ctx, changeDeadline(len(refs)))
		ts, err := kp.waitProgrammed(wctx, t0, 5*time.Millisecond, func() bool { return kp.hasEndpoint(target, ip, old) })
		cancel()
		if err != nil {
			// The cold start stands; the changes are reported missing.
			return cold, 0, fmt.Errorf("change %s -> %s on %s not programmed within %v: %w", old, ip, target.Name, changeDeadline(len(refs)), err)
		}
		lat = append(lat, ts.Sub(t0))
	}
	b.Logf("kube-proxy changes: %v", lat)
	return cold, stats.Quantile(lat, 0.5), nil
}

// changeDeadline is how long either proxy may take to program one
// endpoint change among n Services: 1 min plus 10 s per 1,000 Services
// (kube-proxy's syncs took about a minute at 30,000).
func changeDeadline(n int) time.Duration {
	return time.Minute + time.Duration(n/1000)*10*time.Second
}

// measureSeine restarts Seine and times until its Service flows of the new
// start round cover every Service, then times changeRepeats endpoint
// replacements on target; it returns the cold-start time and the median
// change time, or an error when the cold start took longer than deadline.
//
// The cold start ends when the proxy finished the batch that completed
// it, by its own clock (seine_proxy_sync_last_timestamp_seconds, read from
// metrics once the flows are seen to cover every Service), as kube-proxy's
// is read from its kubeproxy_sync_proxy_rules_last_timestamp_seconds: so
// neither figure includes polling or listing the rules.
func measureSeine(ctx context.Context, b *testing.B, cs kubernetes.Interface, c *sandbox.Cluster, node sandbox.Node, of *seineOF, metrics *http.Client,
	refs []svcRef, shape seineShape, target svcRef, newIPs []string, deadline time.Duration) (cold, change time.Duration, err error) {
	b.Helper()
	oldRound, oldErr := of.round()
	want := shape.expect(len(refs))
	t0 := time.Now()
	// StartSeine returns once the daemon serves CNI, which it does after
	// its proxy has programmed every Service it listed at start.
	if err := c.StartSeine(ctx, node.Name, nil); err != nil {
		b.Fatal(err)
	}
	var (
		newRound     uint16
		haveRound    bool
		lastCount    = -1
		lastChangeAt time.Time
		done         time.Time
	)
	for done.IsZero() {
		if time.Since(t0) > deadline {
			return 0, 0, fmt.Errorf("cold start: %d Service flows of round %d, want %d, after %v", lastCount, newRound, want, deadline)
		}
		time.Sleep(50 * time.Millisecond)
		if !haveRound {
			r, err := of.round()
			if err != nil || (oldErr == nil && r == oldRound) {
				continue
			}
			newRound, haveRound = r, true
		}
		n, err := of.count(roundCategoryFilter(newRound, pipeline.CategoryService))
		if err != nil {
			continue
		}
		now := time.Now()
		if n != lastCount {
			lastCount, lastChangeAt = n, now
		}
		switch {
		case n >= want:
			if seineCovers(b, of, newRound, refs) {
				done = now
			}
		case n > 0 && now.Sub(lastChangeAt) > 3*time.Second:
			// The two-Service estimate was off; accept a stable count that
			// covers every Service, timed at its last change.
			if seineCovers(b, of, newRound, refs) {
				b.Logf("seine: %d Service flows, estimate was %d", n, want)
				done = lastChangeAt
			}
		}
	}
	at, err := scrapeTimestamp(ctx, metrics, seineMetricsURL(node.IP), proxy.LastSyncName, "")
	switch {
	case err != nil:
		b.Fatalf("seine: %s: %v", proxy.LastSyncName, err)
	case at.IsZero():
		b.Fatalf("seine: %s is 0 after its flows covered every Service", proxy.LastSyncName)
	case at.After(t0) && !at.After(done):
		done = at
	default:
		b.Logf("seine: last sync at %v is outside the cold start (%v to %v); timing by the flows seen", at, t0, done)
	}
	cold = done.Sub(t0)

	before, cookies, err := of.serviceState(target.ClusterIP)
	if err != nil {
		b.Fatal(err)
	}
	var lat []time.Duration
	for _, ip := range newIPs {
		time.Sleep(changeGap)
		old, t0, err := replaceEndpoint(ctx, cs, target, ip)
		if err != nil {
			b.Fatal(err)
		}
		if !mentionsIP(before, old) {
			b.Fatalf("seine: the flows and groups of %s (%s) do not name its endpoint %s; cannot tell when a change is programmed:\n%s",
				target.Name, target.ClusterIP, old, before)
		}
		deadline := time.Now().Add(time.Minute)
		for i := 1; ; i++ {
			var txt string
			if i%20 != 0 {
				txt, err = of.cookieText(cookies)
			} else { // the Service port may have been renumbered
				txt, cookies, err = of.serviceState(target.ClusterIP)
			}
			if err == nil && mentionsIP(txt, ip) && !mentionsIP(txt, old) {
				lat = append(lat, time.Since(t0))
				before = txt
				break
			}
			if time.Now().After(deadline) {
				b.Fatalf("seine: change %s -> %s on %s not programmed after 1 min (%v):\n%s", old, ip, target.Name, err, txt)
			}
			time.Sleep(2 * time.Millisecond)
		}
	}
	b.Logf("seine changes: %v", lat)
	return cold, stats.Quantile(lat, 0.5), nil
}

// seineCovers reports whether every Service's ClusterIP appears in the
// Service flows of the given round.
func seineCovers(b *testing.B, of *seineOF, round uint16, refs []svcRef) bool {
	b.Helper()
	fs, err := of.flows(roundCategoryFilter(round, pipeline.CategoryService))
	if err != nil {
		return false
	}
	seen := make(map[string]bool, len(refs))
	for _, f := range fs {
		if i := strings.Index(f.Text, "nw_dst="); i >= 0 {
			rest := f.Text[i+len("nw_dst="):]
			if j := strings.IndexAny(rest, ", "); j >= 0 {
				rest = rest[:j]
			}
			seen[rest] = true
		}
	}
	for _, r := range refs {
		if !seen[r.ClusterIP] {
			return false
		}
	}
	return true
}

// BenchmarkServiceLatency compares the request latency of a TCP exchange
// (connect, one reply line, close) from a client Pod to an echo Pod
// through a ClusterIP Service with the same exchange straight to the
// Pod IP from a second client Pod, 500 of each interleaved, all on one
// Node. Metrics: clusterip-p50-us,
// podip-p50-us, clusterip-p99-us, podip-p99-us and p50-ratio (ClusterIP
// over Pod IP). It skips when Seine has no Service proxy yet.
func BenchmarkServiceLatency(b *testing.B) {
	c := up(b, "bsvl", 1, nil)
	node := c.Nodes()[0]
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	const ns = "svclat"
	srv, err := c.CreatePod(ctx, sandbox.PodSpec{Namespace: ns, Name: "echo", Node: node.Name,
		Labels: map[string]string{"app": "echo"}, Ports: []sandbox.Port{{Name: "tcp", Port: svcTargetPort}}})
	if err != nil {
		b.Fatal(err)
	}
	// One client per path: a connection straight to the Pod from a source
	// port that a closed ClusterIP connection used moments before would
	// meet that connection's conntrack entry (same reply tuple) and is
	// not what this benchmark is about.
	for _, name := range []string{"client-vip", "client-pod"} {
		if _, err := c.CreatePod(ctx, sandbox.PodSpec{Namespace: ns, Name: name, Node: node.Name}); err != nil {
			b.Fatal(err)
		}
	}
	svc, err := c.Client().CoreV1().Services(ns).Create(ctx, &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Name: "echo", Namespace: ns},
		Spec: corev1.ServiceSpec{
			Selector: map[string]string{"app": "echo"},
			Ports:    []corev1.ServicePort{{Name: "tcp", Protocol: corev1.ProtocolTCP, Port: svcPort, TargetPort: intstr.FromInt32(svcTargetPort)}},
		},
	}, metav1.CreateOptions{})
	if err != nil {
		b.Fatal(err)
	}
	vip := svc.Spec.ClusterIP
	if !waitSeineService(b, newSeineOF(node), vip, 20*time.Second) {
		b.Skipf("Seine's Service proxy is not there yet: no flow with cookie category %d (CategoryService) matches ip,nw_dst=%s", pipeline.CategoryService, vip)
	}
	probe := func(client, host string, port int) (time.Duration, error) {
		t0 := time.Now()
		r := c.Probe(ctx, ns, client, host, port, corev1.ProtocolTCP, 2*time.Second)
		d := time.Since(t0)
		if r.Outcome != sandbox.Connected || r.Reply != "echo" {
			return d, fmt.Errorf("probe %s:%d: %v (%v)", host, port, r, r.Err)
		}
		return d, nil
	}
	// The Service works once the endpoint is programmed too.
	deadline := time.Now().Add(30 * time.Second)
	for {
		if _, err := probe("client-vip", vip, svcPort); err == nil {
			break
		} else if time.Now().After(deadline) {
			b.Fatalf("ClusterIP %s never answered: %v", vip, err)
		}
		time.Sleep(200 * time.Millisecond)
	}
	const probes, warmup = 500, 20
	var viaVIP, direct []time.Duration
	for i := 0; i < probes+warmup; i++ {
		dv, err := probe("client-vip", vip, svcPort)
		if err != nil {
			b.Fatal(err)
		}
		dd, err := probe("client-pod", srv.Status.PodIP, svcTargetPort)
		if err != nil {
			b.Fatal(err)
		}
		if i >= warmup {
			viaVIP, direct = append(viaVIP, dv), append(direct, dd)
		}
	}
	us := func(d time.Duration) float64 { return float64(d.Nanoseconds()) / 1000 }
	b.ReportMetric(us(stats.Quantile(viaVIP, 0.5)), "clusterip-p50-us")
	b.ReportMetric(us(stats.Quantile(direct, 0.5)), "podip-p50-us")
	b.ReportMetric(us(stats.Quantile(viaVIP, 0.99)), "clusterip-p99-us")
	b.ReportMetric(us(stats.Quantile(direct, 0.99)), "podip-p99-us")
	b.ReportMetric(float64(stats.Quantile(viaVIP, 0.5))/float64(stats.Quantile(direct, 0.5)), "p50-ratio")
}
