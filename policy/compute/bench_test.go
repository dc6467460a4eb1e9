package compute

import (
	"runtime"
	"runtime/metrics"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/seine-net/seine/policy/compute/workloads"
)

// heapSampler records the peak of live heap objects while it runs, sampled
// every 2 ms through runtime/metrics (no stop-the-world).
type heapSampler struct {
	stop chan struct{}
	wg   sync.WaitGroup
	peak uint64
}

const heapMetric = "/memory/classes/heap/objects:bytes"

func heapNow() uint64 {
	s := []metrics.Sample{{Name: heapMetric}}
	metrics.Read(s)
	return s[0].Value.Uint64()
}

func startHeapSampler() *heapSampler {
	h := &heapSampler{stop: make(chan struct{}), peak: heapNow()}
	h.wg.Add(1)
	go func() {
		defer h.wg.Done()
		t := time.NewTicker(2 * time.Millisecond)
		defer t.Stop()
		for {
			select {
			case <-h.stop:
				return
			case <-t.C:
				if v := heapNow(); v > h.peak {
					h.peak = v
				}
			}
		}
	}()
	return h
}

func (h *heapSampler) Stop() uint64 {
	close(h.stop)
	h.wg.Wait()
	if v := heapNow(); v > h.peak {
		h.peak = v
	}
	return h.peak
}

// feed adds every object of w to a new model, as an informer's initial
// list would.
func feed(w workloads.Workload, sliceSize int) *Model {
	m := New(sliceSize)
	for _, n := range w.Nodes {
		m.UpsertNode(n)
	}
	for _, ns := range w.Namespaces {
		m.UpsertNamespace(ns)
	}
	for _, p := range w.Pods {
		m.UpsertPod(p)
	}
	for _, np := range w.Policies {
		m.UpsertNetworkPolicy(np)
	}
	return m
}

// BenchmarkColdStart measures workloads 1–4 at full size from an empty
// model to idle: every object added, then every desired object built once.
// Metrics: objects built, peak-MB (peak live heap, including the input
// objects, which an informer cache holds too), model-MB (peak minus the
// heap before feeding: what the model and the built objects added,
// including garbage not yet collected), live-MB (what the model retains at
// idle, after a GC).
func BenchmarkColdStart(b *testing.B) {
	for _, spec := range workloads.All(1) {
		b.Run(spec.Name, func(b *testing.B) {
			w := spec.Build()
			var objs int
			var peak, base, live uint64
			for b.Loop() {
				// Only feeding and building are timed: the collections
				// that set up and read the heap figures are not the
				// controller's work.
				b.StopTimer()
				runtime.GC()
				base = heapNow()
				h := startHeapSampler()
				b.StartTimer()
				m := feed(w, 0)
				objs = buildAll(m, m.TakeDirty())
				b.StopTimer()
				peak = max(peak, h.Stop())
				runtime.GC()
				live = heapNow() - base
				runtime.KeepAlive(m)
				b.StartTimer()
			}
			b.ReportMetric(float64(objs), "objects")
			b.ReportMetric(float64(peak)/(1<<20), "peak-MB")
			b.ReportMetric(float64(peak-base)/(1<<20), "model-MB")
			b.ReportMetric(float64(live)/(1<<20), "live-MB")
		})
	}
}

// buildAll builds every object of keys with one goroutine per CPU, as the
// controller's workers do (Desired may run in parallel), and returns how
// many exist.
func buildAll(m *Model, keys []Key) int {
	workers := runtime.GOMAXPROCS(0)
	var n atomic.Int64
	var wg sync.WaitGroup
	for w := 0; w < workers; w++ {
		wg.Add(1)
		go func(w int) {
			defer wg.Done()
			c := 0
			for i := w; i < len(keys); i += workers {
				if _, ok := m.Desired(keys[i]); ok {
					c++
				}
			}
			n.Add(int64(c))
		}(w)
	}
	wg.Wait()
	return int(n.Load())
}

// BenchmarkPodLabelChange measures one Pod relabel plus rebuilding the
// objects it dirtied, in workload 3 (every policy selects every Pod).
func BenchmarkPodLabelChange(b *testing.B) {
	w := workloads.SharedGroup(10000, 10000)
	m := feed(w, 0)
	for _, k := range m.TakeDirty() {
		m.Desired(k)
	}
	p := w.Pods[0].DeepCopy()
	i := 0
	for b.Loop() {
		i++
		p.Labels = map[string]string{"app": "web", "v": string(rune('a' + i%2))}
		m.UpsertPod(p)
		for _, k := range m.TakeDirty() {
			m.Desired(k)
		}
	}
}

// TestDesiredInParallel builds every object of small versions of the
// workloads from several goroutines (run with -race) and checks the result
// equals a sequential build.
func TestDesiredInParallel(t *testing.T) {
	for _, spec := range workloads.All(100) {
		m := feed(spec.Build(), 7)
		keys := m.TakeDirty()
		want := 0
		for _, k := range keys {
			if _, ok := m.Desired(k); ok {
				want++
			}
		}
		if want == 0 {
			t.Fatalf("%s: no objects", spec.Name)
		}
		if got := buildAll(m, keys); got != want {
			t.Errorf("%s: parallel build made %d objects, sequential %d", spec.Name, got, want)
		}
	}
}

// BenchmarkIncrementalCompute times, in the model alone (no API server), the
// three changes BenchmarkIncremental (policy/controller) makes at workload
// 1's full scale: one Pod relabelled, one Namespace entering or leaving a
// namespaceSelector, one policy's peer selector changed. Each change is
// timed from the model update to every object it dirtied built again (what
// the controller does before its writes), 100 times. Metrics: <kind>-p50-ms,
// <kind>-p99-ms and <kind>-objects (objects rebuilt per change).
func BenchmarkIncrementalCompute(b *testing.B) {
	w := workloads.SmallNamespaces(25000)
	first, last := w.Namespaces[0].Name, w.Namespaces[len(w.Namespaces)-1].Name
	w.Policies = append(w.Policies, &networkingv1.NetworkPolicy{
		ObjectMeta: metav1.ObjectMeta{Namespace: first, Name: "from-blue", UID: "np-blue"},
		Spec: networkingv1.NetworkPolicySpec{
			Ingress: []networkingv1.NetworkPolicyIngressRule{{From: []networkingv1.NetworkPolicyPeer{{
				NamespaceSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"team": "blue"}}}}}},
			PolicyTypes: []networkingv1.PolicyType{networkingv1.PolicyTypeIngress},
		},
	})
	m := feed(w, 0)
	buildAll(m, m.TakeDirty())
	pod := w.Pods[0].DeepCopy()
	var ns *corev1.Namespace
	for _, n := range w.Namespaces {
		if n.Name == last {
			ns = n.DeepCopy()
		}
	}
	var np *networkingv1.NetworkPolicy
	for _, p := range w.Policies {
		if p.Namespace == first && p.Name == "allow-a" {
			np = p.DeepCopy()
		}
	}
	labels := []map[string]string{{"app": "b"}, {"app": "a"}}
	changes := []struct {
		kind  string
		apply func(i int)
	}{
		// Each change is a new object, as an informer delivers it: the
		// model may keep what it was given.
		{"pod", func(i int) {
			p := pod.DeepCopy()
			p.Labels = labels[i%2]
			m.UpsertPod(p)
		}},
		{"namespace", func(i int) {
			n := ns.DeepCopy()
			if i%2 == 0 {
				n.Labels["team"] = "blue"
			}
			m.UpsertNamespace(n)
		}},
		{"policy", func(i int) {
			p := np.DeepCopy()
			p.Spec.Ingress[0].From[0].PodSelector = &metav1.LabelSelector{MatchLabels: labels[(i+1)%2]}
			m.UpsertNetworkPolicy(p)
		}},
	}
	for b.Loop() {
		for _, ch := range changes {
			var d []time.Duration
			objs := 0
			for i := range 100 {
				start := time.Now()
				ch.apply(i)
				keys := m.TakeDirty()
				for _, k := range keys {
					m.Desired(k)
				}
				d = append(d, time.Since(start))
				objs += len(keys)
			}
			slices.Sort(d)
			b.ReportMetric(float64(d[len(d)/2].Microseconds())/1000, ch.kind+"-p50-ms")
			b.ReportMetric(float64(d[len(d)*99/100].Microseconds())/1000, ch.kind+"-p99-ms")
			b.ReportMetric(float64(objs)/100, ch.kind+"-objects")
		}
	}
}
