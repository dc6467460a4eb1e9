package controller

import (
	"context"
	"fmt"
	"strconv"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/uuid"
	"k8s.io/apimachinery/pkg/watch"

	"github.com/seine-net/seine/policy/apis/controlplane/v1alpha1"
	"github.com/seine-net/seine/policy/realization"
)

// BenchmarkPodRealizationWrite measures what one change to a Node's
// PodRealization costs at the sizes the scale workloads give it: a real
// API server holds one PodRealization of N Pods (N = 50, 200, 1,000:
// workload 1 spreads its 100,000 Pods over 100 Nodes, 1,000 each), and 50
// Updates each change one Pod's digest. Metrics per size: pr-N-update-p50-ms
// (the Update request, as the controller's writer waits for it) and
// pr-N-event-p50-ms (request to the watch event, as an agent or the
// controller's own informer receives it), with pr-N-bytes the object's
// JSON size. Every policy change, Pod label change and Namespace label change
// that alters a Pod's digest rewrites the PodRealization holding that Pod
// (BenchmarkIncremental): its Node's whole one when the Node's agent does
// not read slices, else a slice of 64 to 128 Pods. So this is the floor of
// each change at that size.
func BenchmarkPodRealizationWrite(b *testing.B) {
	e := startEnv(b)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	prs := e.cp.ControlplaneV1alpha1().PodRealizations()
	b.ResetTimer()
	for range b.N {
		for _, n := range []int{50, 200, 1000} {
			name := fmt.Sprintf("node-%d", n)
			pr := &v1alpha1.PodRealization{ObjectMeta: metav1.ObjectMeta{Name: name},
				Spec: v1alpha1.PodRealizationSpec{NodeName: name, Pods: map[string]string{}}}
			keys := make([]string, n)
			for i := range n {
				keys[i] = realization.PodKey("ns-"+strconv.Itoa(i/4), "pod-"+strconv.Itoa(i%4), string(uuid.NewUUID()))
				pr.Spec.Pods[keys[i]] = realization.Digest([]realization.Policy{{Name: strconv.Itoa(i)}})
			}
			pr.Status.PodCount = int32(n)
			stored, err := prs.Create(ctx, pr, metav1.CreateOptions{})
			if err != nil {
				b.Fatal(err)
			}
			w, err := prs.Watch(ctx, metav1.ListOptions{FieldSelector: "metadata.name=" + name,
				ResourceVersion: stored.ResourceVersion})
			if err != nil {
				b.Fatal(err)
			}
			var upd, ev []time.Duration
			for i := range 50 {
				stored.Spec.Pods[keys[i%n]] = realization.Digest([]realization.Policy{{Name: "v" + strconv.Itoa(i)}})
				start := time.Now()
				stored, err = prs.Update(ctx, stored, metav1.UpdateOptions{})
				if err != nil {
					b.Fatal(err)
				}
				upd = append(upd, time.Since(start))
				if !awaitVersion(w, stored.ResourceVersion) {
					b.Fatalf("the watch of %s ended before the event of update %d", name, i)
				}
				ev = append(ev, time.Since(start))
			}
			w.Stop()
			raw, err := e.cp.ControlplaneV1alpha1().RESTClient().Get().Resource("podrealizations").Name(name).DoRaw(ctx)
			if err != nil {
				b.Fatal(err)
			}
			b.ReportMetric(pct(upd, 0.5), fmt.Sprintf("pr-%d-update-p50-ms", n))
			b.ReportMetric(pct(ev, 0.5), fmt.Sprintf("pr-%d-event-p50-ms", n))
			b.ReportMetric(float64(len(raw)), fmt.Sprintf("pr-%d-bytes", n))
		}
	}
}

// awaitVersion reads w until the Modified event of resource version rv
// and reports whether it came before the watch ended.
func awaitVersion(w watch.Interface, rv string) bool {
	for ev := range w.ResultChan() {
		if pr, ok := ev.Object.(*v1alpha1.PodRealization); ok && ev.Type == watch.Modified && pr.ResourceVersion == rv {
			return true
		}
	}
	return false
}
