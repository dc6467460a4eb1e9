package controller

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"runtime/pprof"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/watch"

	opsv1alpha1 "github.com/seine-net/seine/node/apis/ops/v1alpha1"
	opsclient "github.com/seine-net/seine/node/client/clientset/versioned"
	"github.com/seine-net/seine/policy/apis/controlplane/v1alpha1"
	"github.com/seine-net/seine/policy/compute"
	"github.com/seine-net/seine/policy/compute/workloads"
)

// incrementalScale divides workload 1 for BenchmarkIncremental:
// $SEINE_BENCH_INCR_SCALE, default 1 (full size: 25,000 namespaces,
// 100,000 Pods, 75,000 policies).
func incrementalScale() int {
	if s, err := strconv.Atoi(os.Getenv("SEINE_BENCH_INCR_SCALE")); err == nil && s > 0 {
		return s
	}
	return 1
}

// createAgentInfos writes, for each Node, the AgentInfo its agent would:
// listing PodRealizationSlicesCapability unless $SEINE_BENCH_INCR_UNSLICED
// is set (agents of an earlier release: one PodRealization per Node). It
// returns the ops client and the layout's name.
func createAgentInfos(tb testing.TB, ctx context.Context, e *env, nodes []*corev1.Node) (opsclient.Interface, string) {
	ops := opsclient.NewForConfigOrDie(e.rc)
	if os.Getenv("SEINE_BENCH_INCR_UNSLICED") != "" {
		return ops, "one PodRealization per Node"
	}
	for _, n := range nodes {
		if _, err := ops.OpsV1alpha1().AgentInfos().Create(ctx, &opsv1alpha1.AgentInfo{ObjectMeta: metav1.ObjectMeta{Name: n.Name},
			Status: opsv1alpha1.AgentInfoStatus{Capabilities: []string{v1alpha1.PodRealizationSlicesCapability}}}, metav1.CreateOptions{}); err != nil {
			tb.Fatalf("AgentInfo %s: %v", n.Name, err)
		}
	}
	return ops, "PodRealizations in slices"
}

// writeCounts lists the controller's writes and failed writes so far by
// kind and verb.
func writeCounts(c *Controller) string {
	var out []string
	for _, kind := range compute.Kinds {
		for _, verb := range []string{"create", "update", "delete"} {
			if n := metricValue(c.metrics.writes.WithLabelValues(string(kind), verb)); n > 0 {
				out = append(out, fmt.Sprintf("%s %s %.0f", kind, verb, n))
			}
		}
		if n := metricValue(c.metrics.writeErrors.WithLabelValues(string(kind))); n > 0 {
			out = append(out, fmt.Sprintf("%s errors %.0f", kind, n))
		}
	}
	return strings.Join(out, ", ")
}

// startIncrementalProfile, when SEINE_BENCH_INCR_CPUPROFILE names a path
// prefix, profiles the process's CPU (the controller runs in it) into
// "<prefix>-<kind>.pprof" until the returned function is called: where a
// change kind's time goes at scale, without the creation and the cold
// start in the profile.
func startIncrementalProfile(tb testing.TB, kind string) func() {
	prefix := os.Getenv("SEINE_BENCH_INCR_CPUPROFILE")
	if prefix == "" {
		return func() {}
	}
	f, err := os.Create(prefix + "-" + kind + ".pprof")
	if err != nil {
		tb.Fatal(err)
	}
	if err := pprof.StartCPUProfile(f); err != nil {
		tb.Fatal(err)
	}
	return func() {
		pprof.StopCPUProfile()
		if err := f.Close(); err != nil {
			tb.Error(err)
		}
	}
}

// histTotals are a histogram's sample count and sum (seconds).
type histTotals struct {
	count uint64
	sum   float64
}

func (h histTotals) minus(o histTotals) histTotals {
	return histTotals{count: h.count - o.count, sum: h.sum - o.sum}
}

// meanMs is the mean sample in milliseconds (0 without samples).
func (h histTotals) meanMs() float64 {
	if h.count == 0 {
		return 0
	}
	return h.sum / float64(h.count) * 1000
}

// histogramTotals reads the unlabelled histogram name from reg.
func histogramTotals(tb testing.TB, reg *prometheus.Registry, name string) histTotals {
	tb.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		tb.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() == name && len(mf.GetMetric()) == 1 {
			h := mf.GetMetric()[0].GetHistogram()
			return histTotals{count: h.GetSampleCount(), sum: h.GetSampleSum()}
		}
	}
	tb.Fatalf("no histogram %s", name)
	return histTotals{}
}

// incrementalChanges is how many changes of each kind are timed.
const incrementalChanges = 100

// quietAfterChange ends the events of one change: none for this long.
const quietAfterChange = 400 * time.Millisecond

// BenchmarkIncremental measures, at workload 1's scale in a real API
// server, how long one source change takes to reach the stored computed
// objects once the controller is idle: a Pod label change (a Pod moves
// from one policy's groups to another's), a Namespace label change (a
// Namespace enters or leaves the namespaceSelector of a peer), and a
// NetworkPolicy change (a rule's peer selector switches to another
// group). Workload 1 has no namespaceSelector, so one policy with one is
// added to it.
//
// A change is timed from just before its API request to the last watch
// event on the computed objects (AddressGroups, AppliedToGroups,
// NetworkPolicies, PodRealizations) it causes, events ending when none
// arrives for 400 ms. Metrics per change kind K (pod, namespace, policy):
// K-p50-ms and K-p99-ms for creations and updates; K-all-p50-ms and
// K-all-p99-ms including deletions of objects no longer needed, which the
// controller delays on purpose (Config.DeleteDelay) so that no policy
// refers to a group that is gone. K-apiserver-p50-ms and K-apiserver-p99-ms
// time the request to the watch event of the changed object itself (what
// the controller's informer waits for); K-controller-p50-ms and
// K-controller-p99-ms the rest, from that event to the last computed
// object's (the controller's work and its writes' round trips), of which
// K-compute-mean-ms is the model's update per source change and
// K-round-mean-ms the controller's round (first change received to every
// affected object written), both from the controller's histograms.
// SEINE_BENCH_INCR_CPUPROFILE=<prefix> writes a CPU profile per kind.
// Every Node's agent reads PodRealization slices (its AgentInfo says so);
// SEINE_BENCH_INCR_UNSLICED=1 measures one PodRealization per Node, as
// with agents of an earlier release.
func BenchmarkIncremental(b *testing.B) {
	scale := incrementalScale()
	w := workloads.SmallNamespaces(25000 / scale)
	// One policy with a namespaceSelector: peers are the Pods of
	// namespaces labelled team=blue.
	first, last := w.Namespaces[0].Name, w.Namespaces[len(w.Namespaces)-1].Name
	w.Policies = append(w.Policies, &networkingv1.NetworkPolicy{
		ObjectMeta: metav1.ObjectMeta{Namespace: first, Name: "from-blue", UID: types.UID("np-blue")},
		Spec: networkingv1.NetworkPolicySpec{
			PodSelector: metav1.LabelSelector{},
			Ingress: []networkingv1.NetworkPolicyIngressRule{{From: []networkingv1.NetworkPolicyPeer{{
				NamespaceSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"team": "blue"}}}}}},
			PolicyTypes: []networkingv1.PolicyType{networkingv1.PolicyTypeIngress},
		},
	})
	e := startEnv(b)
	ctx, cancel := context.WithTimeout(context.Background(), 80*time.Minute)
	defer cancel()
	t0 := time.Now()
	e.createAll(b, ctx, w.Nodes, w.Namespaces, w.Pods, w.Policies)
	b.Logf("workload 1 / %d: %d namespaces, %d pods, %d policies created in %v", scale,
		len(w.Namespaces), len(w.Pods), len(w.Policies), time.Since(t0).Round(time.Second))
	ops, layout := createAgentInfos(b, ctx, e, w.Nodes)
	reg := prometheus.NewRegistry()
	cfg := Config{Identity: "bench", Registry: reg, Ops: ops,
		LeaseDuration: 15 * time.Second, RenewDeadline: 10 * time.Second, RetryPeriod: 2 * time.Second}
	t0 = time.Now()
	c, _ := startController(b, e, e.countingCP(500, 1000), cfg)
	waitFor(b, 60*time.Minute, "leader", c.IsLeader)
	waitIdle(b, c, 60*time.Minute, time.Second)
	b.Logf("controller cold start (%s): %v, %d objects stored (%d PodRealizations); writes: %s", layout,
		time.Since(t0).Round(time.Second), countStored(b, e), c.Status().Computed[compute.KindPodRealization], writeCounts(c))

	events := e.watchComputed(b, ctx)
	pod := w.Pods[0] // app=a in workload 1
	labels := []map[string]string{{"app": "b"}, {"app": "a"}}
	// The watch event of each changed source object, as the controller's
	// informer receives it, splits a change's time in two: the API server
	// (request to source event) and the controller (source event to the
	// last computed object's event).
	byName := func(name string) metav1.ListOptions {
		return metav1.ListOptions{FieldSelector: "metadata.name=" + name}
	}
	sources := map[string]<-chan stamped{
		"pod": e.watchSource(b, ctx, func(o metav1.ListOptions) (watch.Interface, error) {
			return e.kube.CoreV1().Pods(pod.Namespace).Watch(ctx, o)
		}, byName(pod.Name)),
		"namespace": e.watchSource(b, ctx, func(o metav1.ListOptions) (watch.Interface, error) {
			return e.kube.CoreV1().Namespaces().Watch(ctx, o)
		}, byName(last)),
		"policy": e.watchSource(b, ctx, func(o metav1.ListOptions) (watch.Interface, error) {
			return e.kube.NetworkingV1().NetworkPolicies(first).Watch(ctx, o)
		}, byName("allow-a")),
	}
	changes := []struct {
		kind  string
		apply func(i int) error
	}{
		{"pod", func(i int) error {
			return e.patchLabels(ctx, "pods", pod.Namespace, pod.Name, labels[i%2], nil)
		}},
		{"namespace", func(i int) error {
			on := map[string]string{"team": "blue"}
			if i%2 == 0 {
				return e.patchLabels(ctx, "namespaces", "", last, on, nil)
			}
			return e.patchLabels(ctx, "namespaces", "", last, nil, on)
		}},
		{"policy", func(i int) error {
			// allow-a allows app=b; it switches to app=a and back.
			np, err := e.kube.NetworkingV1().NetworkPolicies(first).Get(ctx, "allow-a", metav1.GetOptions{})
			if err != nil {
				return err
			}
			np.Spec.Ingress[0].From[0].PodSelector.MatchLabels = labels[(i+1)%2]
			_, err = e.kube.NetworkingV1().NetworkPolicies(first).Update(ctx, np, metav1.UpdateOptions{})
			return err
		}},
	}
	b.ResetTimer()
	for range b.N {
		for _, ch := range changes {
			var upd, all, src, ctl []time.Duration
			stopProfile := startIncrementalProfile(b, ch.kind)
			compute0, round0 := histogramTotals(b, reg, "seine_policy_controller_compute_duration_seconds"),
				histogramTotals(b, reg, "seine_policy_controller_round_duration_seconds")
			for i := 0; i < incrementalChanges; i++ {
				drain(events)
				drain(sources[ch.kind])
				start := time.Now()
				if err := ch.apply(i); err != nil {
					b.Fatalf("%s change %d: %v", ch.kind, i, err)
				}
				lastUpd, lastAny, n := collect(events, quietAfterChange, 30*time.Second)
				if lastUpd.IsZero() {
					b.Fatalf("%s change %d: no computed object created or updated (%d events)", ch.kind, i, n)
				}
				select {
				case ev := <-sources[ch.kind]:
					src = append(src, ev.at.Sub(start))
					ctl = append(ctl, lastUpd.Sub(ev.at))
				default:
					b.Fatalf("%s change %d: no watch event of the changed object", ch.kind, i)
				}
				upd = append(upd, lastUpd.Sub(start))
				all = append(all, lastAny.Sub(start))
			}
			stopProfile()
			// The controller's own share, from its histograms: the model's
			// update per source change, and the round from the first change
			// to every affected object written (the API server's answers
			// included, the watch events around it not).
			compute := histogramTotals(b, reg, "seine_policy_controller_compute_duration_seconds").minus(compute0)
			round := histogramTotals(b, reg, "seine_policy_controller_round_duration_seconds").minus(round0)
			b.ReportMetric(compute.meanMs(), ch.kind+"-compute-mean-ms")
			b.ReportMetric(round.meanMs(), ch.kind+"-round-mean-ms")
			b.ReportMetric(pct(upd, 0.5), ch.kind+"-p50-ms")
			b.ReportMetric(pct(upd, 0.99), ch.kind+"-p99-ms")
			b.ReportMetric(pct(src, 0.5), ch.kind+"-apiserver-p50-ms")
			b.ReportMetric(pct(src, 0.99), ch.kind+"-apiserver-p99-ms")
			b.ReportMetric(pct(ctl, 0.5), ch.kind+"-controller-p50-ms")
			b.ReportMetric(pct(ctl, 0.99), ch.kind+"-controller-p99-ms")
			b.ReportMetric(pct(all, 0.5), ch.kind+"-all-p50-ms")
			b.ReportMetric(pct(all, 0.99), ch.kind+"-all-p99-ms")
		}
	}
}

// stamped is a watch event with the time it arrived.
type stamped struct {
	typ watch.EventType
	at  time.Time
}

// watchComputed watches the four computed kinds from now on and merges
// their events.
func (e *env) watchComputed(tb testing.TB, ctx context.Context) <-chan stamped {
	tb.Helper()
	c := e.cp.ControlplaneV1alpha1()
	one := metav1.ListOptions{Limit: 1}
	type lister func() (string, func(string) (watch.Interface, error), error)
	kinds := []lister{
		func() (string, func(string) (watch.Interface, error), error) {
			l, err := c.AddressGroups().List(ctx, one)
			if err != nil {
				return "", nil, err
			}
			return l.ResourceVersion, func(rv string) (watch.Interface, error) {
				return c.AddressGroups().Watch(ctx, metav1.ListOptions{ResourceVersion: rv})
			}, nil
		},
		func() (string, func(string) (watch.Interface, error), error) {
			l, err := c.AppliedToGroups().List(ctx, one)
			if err != nil {
				return "", nil, err
			}
			return l.ResourceVersion, func(rv string) (watch.Interface, error) {
				return c.AppliedToGroups().Watch(ctx, metav1.ListOptions{ResourceVersion: rv})
			}, nil
		},
		func() (string, func(string) (watch.Interface, error), error) {
			l, err := c.NetworkPolicies().List(ctx, one)
			if err != nil {
				return "", nil, err
			}
			return l.ResourceVersion, func(rv string) (watch.Interface, error) {
				return c.NetworkPolicies().Watch(ctx, metav1.ListOptions{ResourceVersion: rv})
			}, nil
		},
		func() (string, func(string) (watch.Interface, error), error) {
			l, err := c.PodRealizations().List(ctx, one)
			if err != nil {
				return "", nil, err
			}
			return l.ResourceVersion, func(rv string) (watch.Interface, error) {
				return c.PodRealizations().Watch(ctx, metav1.ListOptions{ResourceVersion: rv})
			}, nil
		},
	}
	out := make(chan stamped, 1024)
	for _, k := range kinds {
		rv, start, err := k()
		if err != nil {
			tb.Fatal(err)
		}
		w, err := start(rv)
		if err != nil {
			tb.Fatal(err)
		}
		tb.Cleanup(w.Stop)
		go func() {
			for ev := range w.ResultChan() {
				out <- stamped{typ: ev.Type, at: time.Now()}
			}
		}()
	}
	return out
}

// watchSource watches one source object (opts selects it by name) from now
// on and stamps each of its events.
func (e *env) watchSource(tb testing.TB, ctx context.Context, watchFn func(metav1.ListOptions) (watch.Interface, error),
	opts metav1.ListOptions) <-chan stamped {
	tb.Helper()
	w, err := watchFn(opts)
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(w.Stop)
	out := make(chan stamped, 1024)
	go func() {
		for ev := range w.ResultChan() {
			if ev.Type == watch.Modified {
				out <- stamped{typ: ev.Type, at: time.Now()}
			}
		}
	}()
	return out
}

// drain discards events already received.
func drain(ch <-chan stamped) {
	for {
		select {
		case <-ch:
		default:
			return
		}
	}
}

// collect waits up to max for the first event, then reads events until
// none arrives for quiet (or max passes), and returns the arrival of the
// last creation or update, of the last event of any kind, and how many
// there were. The quiet period starts only once events flow: a change
// whose first write comes late is timed, not taken for one that wrote
// nothing.
func collect(ch <-chan stamped, quiet, max time.Duration) (lastUpd, lastAny time.Time, n int) {
	deadline := time.After(max)
	var silence <-chan time.Time // nil until the first event
	for {
		select {
		case ev := <-ch:
			n++
			lastAny = ev.at
			if ev.typ == watch.Added || ev.typ == watch.Modified {
				lastUpd = ev.at
			}
			silence = time.After(quiet)
		case <-silence:
			return lastUpd, lastAny, n
		case <-deadline:
			return lastUpd, lastAny, n
		}
	}
}

func pct(d []time.Duration, p float64) float64 {
	s := append([]time.Duration(nil), d...)
	sort.Slice(s, func(i, j int) bool { return s[i] < s[j] })
	i := min(len(s)-1, max(0, int(p*float64(len(s))+0.5)-1))
	return float64(s[i].Microseconds()) / 1000
}

// patchLabels sets the labels of set and removes those of del on a Pod
// (resource "pods") or Namespace (resource "namespaces", namespace "").
func (e *env) patchLabels(ctx context.Context, resource, namespace, name string, set, del map[string]string) error {
	labels := map[string]any{}
	for k, v := range set {
		labels[k] = v
	}
	for k := range del {
		if _, ok := set[k]; !ok {
			labels[k] = nil
		}
	}
	patch := fmt.Appendf(nil, `{"metadata":{"labels":%s}}`, mustJSON(labels))
	var err error
	switch resource {
	case "pods":
		_, err = e.kube.CoreV1().Pods(namespace).Patch(ctx, name, types.MergePatchType, patch, metav1.PatchOptions{})
	case "namespaces":
		_, err = e.kube.CoreV1().Namespaces().Patch(ctx, name, types.MergePatchType, patch, metav1.PatchOptions{})
	default:
		err = fmt.Errorf("unknown resource %s", resource)
	}
	return err
}

func mustJSON(v any) []byte {
	b, err := json.Marshal(v)
	if err != nil {
		panic(err)
	}
	return b
}
