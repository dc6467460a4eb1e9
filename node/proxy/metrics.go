package proxy

import (
	"errors"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
)

// ProgrammingLatencyName is the network programming latency SLI
// (sig-scalability's "in-cluster network programming latency"), as
// kube-proxy exports it under kubeproxy_network_programming_duration_seconds
// (k8s.io/kubernetes pkg/proxy/metrics): same buckets, label and
// semantics, under Seine's prefix.
const ProgrammingLatencyName = "seine_proxy_network_programming_duration_seconds"

// LastSyncName is the Unix time, in seconds, at which the proxy last
// finished programming a batch of Services with at least one of them
// programmed: kube-proxy's kubeproxy_sync_proxy_rules_last_timestamp_seconds
// under Seine's prefix. It is 0 until the first batch.
const LastSyncName = "seine_proxy_sync_last_timestamp_seconds"

// SyncDurationName is how long the proxy took to program one batch of
// Services, in seconds, from taking the batch off its queue until it is
// programmed and its conntrack flushes made or, within
// DefaultMinPurgeInterval of the last ones, held for the next: kube-proxy's
// kubeproxy_sync_proxy_rules_duration_seconds (same buckets) under Seine's
// prefix. Its _count is the number of batches.
const SyncDurationName = "seine_proxy_sync_duration_seconds"

// DatapathPurgesName counts the purges of the Node's cached datapath
// flows that the proxy made before flushing stale UDP or SCTP conntrack
// entries (docs/design.md, "Service proxy"): each makes every flow on the
// Node miss its cache once.
const DatapathPurgesName = "seine_proxy_datapath_purges_total"

// programmingBuckets are kube-proxy's: 0.25 s and 0.5 s, every second to
// 59 s, every 5 s to 115 s, every 30 s to 5 min.
func programmingBuckets() []float64 {
	b := []float64{0.25, 0.5}
	for s := 1; s <= 59; s++ {
		b = append(b, float64(s))
	}
	for s := 60; s <= 115; s += 5 {
		b = append(b, float64(s))
	}
	for s := 120; s <= 300; s += 30 {
		b = append(b, float64(s))
	}
	return b
}

// metrics measures network programming latency (a nil *metrics measures
// nothing): for every EndpointSlice
// added or updated with the endpoints.kubernetes.io/last-change-trigger-time
// annotation (set by the EndpointSlice controller to when the Service or
// Pod changed), the time from that instant until the proxy has programmed
// the Service's new state into the switch. Like kube-proxy it skips
// deletions (their annotation tells when the slice last changed, not when
// it was deleted) and trigger times from before the proxy started.
type metrics struct {
	latency  *prometheus.HistogramVec
	lastSync prometheus.Gauge
	syncTime prometheus.Histogram
	purges   prometheus.Counter
	start    time.Time

	mu       sync.Mutex
	triggers map[string][]time.Time // Service key → trigger times not yet programmed
}

// newMetrics registers the proxy's metrics on reg (nil: not exported).
func newMetrics(reg prometheus.Registerer) *metrics {
	m := &metrics{
		latency: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    ProgrammingLatencyName,
			Help:    "In-cluster network programming latency: from an EndpointSlice's last-change-trigger-time to the Service programmed in the switch, in seconds.",
			Buckets: programmingBuckets(),
		}, []string{"ip_family"}),
		lastSync: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: LastSyncName,
			Help: "Unix time, in seconds, at which the proxy last finished programming a batch of Services (at least one programmed).",
		}),
		syncTime: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    SyncDurationName,
			Help:    "Time the proxy took to program one batch of Services, in seconds (its conntrack flushes included unless held for the next purge).",
			Buckets: prometheus.ExponentialBuckets(0.001, 2, 15),
		}),
		purges: prometheus.NewCounter(prometheus.CounterOpts{
			Name: DatapathPurgesName,
			Help: "Purges of the Node's cached datapath flows made before flushing stale UDP or SCTP conntrack entries.",
		}),
		start:    time.Now(),
		triggers: map[string][]time.Time{},
	}
	if reg != nil {
		m.latency = register(reg, m.latency)
		m.lastSync = register(reg, m.lastSync)
		m.syncTime = register(reg, m.syncTime)
		m.purges = register(reg, m.purges)
	}
	return m
}

// register registers c on reg and returns it, or the collector of the
// same description registered before (a proxy started again in the same
// process keeps its series).
func register[C prometheus.Collector](reg prometheus.Registerer, c C) C {
	if err := reg.Register(c); err != nil {
		var are prometheus.AlreadyRegisteredError
		if errors.As(err, &are) {
			if existing, ok := are.ExistingCollector.(C); ok {
				return existing
			}
		}
	}
	return c
}

// synced records that a batch finished with at least one Service
// programmed.
func (m *metrics) synced() {
	if m == nil {
		return
	}
	m.lastSync.SetToCurrentTime()
}

// batchDone records how long a batch took.
func (m *metrics) batchDone(d time.Duration) {
	if m == nil {
		return
	}
	m.syncTime.Observe(d.Seconds())
}

// purged records one purge of the datapath flows.
func (m *metrics) purged() {
	if m == nil {
		return
	}
	m.purges.Inc()
}

// triggered records the trigger time of an added or updated slice.
func (m *metrics) triggered(s *discoveryv1.EndpointSlice) {
	if m == nil {
		return
	}
	name := s.Labels[discoveryv1.LabelServiceName]
	v, ok := s.Annotations[corev1.EndpointsLastChangeTriggerTime]
	if name == "" || !ok {
		return
	}
	t, err := time.Parse(time.RFC3339Nano, v)
	if err != nil || !t.After(m.start) {
		return
	}
	key := s.Namespace + "/" + name
	m.mu.Lock()
	m.triggers[key] = append(m.triggers[key], t)
	m.mu.Unlock()
}

// checkout takes the trigger times of the Service key that the sync about
// to start will program.
func (m *metrics) checkout(key string) []time.Time {
	if m == nil {
		return nil
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	ts := m.triggers[key]
	delete(m.triggers, key)
	return ts
}

// putBack returns the trigger times of a sync that failed.
func (m *metrics) putBack(key string, ts []time.Time) {
	if m == nil || len(ts) == 0 {
		return
	}
	m.mu.Lock()
	m.triggers[key] = append(ts, m.triggers[key]...)
	m.mu.Unlock()
}

// programmed observes the latency of every trigger time a successful sync
// covered.
func (m *metrics) programmed(ts []time.Time) {
	if m == nil || len(ts) == 0 {
		return
	}
	now := time.Now()
	h := m.latency.WithLabelValues(string(corev1.IPv4Protocol))
	for _, t := range ts {
		h.Observe(now.Sub(t).Seconds())
	}
}
