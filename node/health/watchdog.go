package health

import (
	"fmt"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"k8s.io/client-go/util/workqueue"
)

// DefaultStuckAfter is how long one unit of work may run before the
// Watchdog takes its worker for stuck. Nothing the daemon does legitimately
// takes that long while Open vSwitch is up: a CNI request ends when the
// runtime gives up on it (the kubelet's --runtime-request-timeout, 2
// minutes by default), which cancels the request's context, and the
// workers' calls to OVS and the API server take seconds at most. Work
// waiting for an ovs-vswitchd that is down is not stuck (see PauseWhile).
const DefaultStuckAfter = 5 * time.Minute

// Watchdog is the liveness check over the daemon's workers: it fails when
// one unit of work (a CNI request, a workqueue item) has run longer than
// its limit, the sign of a worker blocked for good (a deadlock, a call
// that ignores its context) that only a restart clears. Idle workers do
// not count. Safe for concurrent use.
type Watchdog struct {
	limit time.Duration
	now   func() time.Time

	mu      sync.Mutex
	paused  func() bool
	next    uint64
	running map[uint64]unit
	// queues holds each workqueue's longest-running item's age in
	// seconds, as the queue last reported it (every 500 ms).
	queues map[string]float64
}

type unit struct {
	what  string
	since time.Time
}

// NewWatchdog returns a Watchdog failing past limit (DefaultStuckAfter
// when limit ≤ 0).
func NewWatchdog(limit time.Duration) *Watchdog {
	if limit <= 0 {
		limit = DefaultStuckAfter
	}
	return &Watchdog{limit: limit, now: time.Now, running: map[uint64]unit{}, queues: map[string]float64{}}
}

// Start records that the work named what (for the check's message, such as
// "cni ADD <container ID>") begins; the returned func records its end and
// may be called more than once.
func (w *Watchdog) Start(what string) (done func()) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.next++
	id := w.next
	w.running[id] = unit{what: what, since: w.now()}
	return func() {
		w.mu.Lock()
		delete(w.running, id)
		w.mu.Unlock()
	}
}

// PauseWhile makes Check pass while paused reports true: waiting on
// something outside the daemon (ovs-vswitchd restarting, say) is no reason
// to restart it. A worker still stuck once paused reports false fails the
// check again.
func (w *Watchdog) PauseWhile(paused func() bool) {
	w.mu.Lock()
	w.paused = paused
	w.mu.Unlock()
}

// Check is the liveness check: an error naming the oldest unit of work
// past the limit, and how many are, else nil.
func (w *Watchdog) Check() error {
	w.mu.Lock()
	paused := w.paused
	w.mu.Unlock()
	if paused != nil && paused() {
		return nil
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	now := w.now()
	var oldest string
	var age time.Duration
	stuck := 0
	for _, u := range w.running {
		if d := now.Sub(u.since); d > w.limit {
			stuck++
			if d > age {
				oldest, age = u.what, d
			}
		}
	}
	for name, secs := range w.queues {
		if d := time.Duration(secs * float64(time.Second)); d > w.limit {
			stuck++
			if d > age {
				oldest, age = "an item of workqueue "+name, d
			}
		}
	}
	if stuck == 0 {
		return nil
	}
	return fmt.Errorf("%d unit(s) of work running longer than %s, the oldest %s for %s", stuck, w.limit,
		oldest, age.Truncate(time.Second))
}

// setQueue records the age of a workqueue's longest-running item.
func (w *Watchdog) setQueue(name string, secs float64) {
	w.mu.Lock()
	w.queues[name] = secs
	w.mu.Unlock()
}

// QueueMetrics is a workqueue.MetricsProvider (client-go util/workqueue):
// it exports the metrics of every named queue given it, labelled by the
// queue's name, under the names Kubernetes components use with a seine_
// prefix (seine_workqueue_depth, _adds_total, _queue_duration_seconds,
// _work_duration_seconds, _unfinished_work_seconds,
// _longest_running_processor_seconds, _retries_total), and reports each
// queue's longest-running item to a Watchdog. A queue reports only when it
// has a name (TypedQueueConfig.Name).
type QueueMetrics struct {
	w                   *Watchdog
	depth               *prometheus.GaugeVec
	adds, retries       *prometheus.CounterVec
	latency, work       *prometheus.HistogramVec
	unfinished, longest *prometheus.GaugeVec
}

// NewQueueMetrics returns a provider registering its metrics in reg (not
// registered when reg is nil) and reporting to w (nil for none).
func NewQueueMetrics(reg prometheus.Registerer, w *Watchdog) *QueueMetrics {
	label := []string{"name"}
	// Queue waits and work run from microseconds (a route) to seconds (a
	// large policy batch).
	buckets := prometheus.ExponentialBuckets(1e-6, 10, 8)
	m := &QueueMetrics{
		w: w,
		depth: prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "seine_workqueue_depth",
			Help: "Items waiting in the workqueue."}, label),
		adds: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "seine_workqueue_adds_total",
			Help: "Items added to the workqueue."}, label),
		latency: prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: "seine_workqueue_queue_duration_seconds",
			Help: "Seconds an item waits in the workqueue before a worker takes it.", Buckets: buckets}, label),
		work: prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: "seine_workqueue_work_duration_seconds",
			Help: "Seconds a worker takes over one item.", Buckets: buckets}, label),
		unfinished: prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "seine_workqueue_unfinished_work_seconds",
			Help: "Seconds of work in progress not yet observed in work_duration (sum over the items being processed)."}, label),
		longest: prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "seine_workqueue_longest_running_processor_seconds",
			Help: "Seconds the longest-running item of the workqueue has been processed."}, label),
		retries: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "seine_workqueue_retries_total",
			Help: "Items requeued with a rate-limited delay (retries)."}, label),
	}
	if reg != nil {
		reg.MustRegister(m.depth, m.adds, m.latency, m.work, m.unfinished, m.longest, m.retries)
	}
	return m
}

var _ workqueue.MetricsProvider = (*QueueMetrics)(nil)

// NewDepthMetric gives the queue's depth.
func (m *QueueMetrics) NewDepthMetric(name string) workqueue.GaugeMetric {
	return m.depth.WithLabelValues(name)
}

// NewAddsMetric gives the queue's adds.
func (m *QueueMetrics) NewAddsMetric(name string) workqueue.CounterMetric {
	return m.adds.WithLabelValues(name)
}

// NewLatencyMetric gives the queue's waits.
func (m *QueueMetrics) NewLatencyMetric(name string) workqueue.HistogramMetric {
	return m.latency.WithLabelValues(name)
}

// NewWorkDurationMetric gives the queue's work durations.
func (m *QueueMetrics) NewWorkDurationMetric(name string) workqueue.HistogramMetric {
	return m.work.WithLabelValues(name)
}

// NewUnfinishedWorkSecondsMetric gives the queue's work in progress.
func (m *QueueMetrics) NewUnfinishedWorkSecondsMetric(name string) workqueue.SettableGaugeMetric {
	return m.unfinished.WithLabelValues(name)
}

// NewLongestRunningProcessorSecondsMetric gives the queue's longest-running item, which also goes to the watchdog.
func (m *QueueMetrics) NewLongestRunningProcessorSecondsMetric(name string) workqueue.SettableGaugeMetric {
	return longestGauge{g: m.longest.WithLabelValues(name), w: m.w, name: name}
}

// NewRetriesMetric gives the queue's retries.
func (m *QueueMetrics) NewRetriesMetric(name string) workqueue.CounterMetric {
	return m.retries.WithLabelValues(name)
}

// longestGauge is the longest-running-processor gauge that also tells the
// watchdog.
type longestGauge struct {
	g    prometheus.Gauge
	w    *Watchdog
	name string
}

// Set records v seconds.
func (l longestGauge) Set(v float64) {
	l.g.Set(v)
	if l.w != nil {
		l.w.setQueue(l.name, v)
	}
}
