package compute

import (
	"runtime"
	"runtime/metrics"
	"sync"
	"sync/atomic"
	"testing"
	"time"

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
