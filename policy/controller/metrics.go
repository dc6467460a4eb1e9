package controller

import (
	"github.com/prometheus/client_golang/prometheus"
)

// metrics of one Controller. Names (all prefixed seine_policy_controller_):
//
//	writes_total{kind,verb}   counter; verb create|update|delete
//	write_errors_total{kind}  counter; failed writes (retried)
//	queue_depth               gauge; objects waiting to be reconciled
//	leader                    gauge; 1 while this instance leads
//	compute_duration_seconds  histogram; model update for one source change
//	round_duration_seconds    histogram; a round (see Round)
type metrics struct {
	writes      *prometheus.CounterVec
	writeErrors *prometheus.CounterVec
	leader      prometheus.Gauge
	compute     prometheus.Histogram
	round       prometheus.Histogram
}

func newMetrics(reg *prometheus.Registry, c *Controller) *metrics {
	m := &metrics{
		writes: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "seine_policy_controller_writes_total",
			Help: "Writes of controlplane.seine.io objects to the API server, by kind and verb.",
		}, []string{"kind", "verb"}),
		writeErrors: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "seine_policy_controller_write_errors_total",
			Help: "Failed writes of controlplane.seine.io objects (retried), by kind.",
		}, []string{"kind"}),
		leader: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "seine_policy_controller_leader",
			Help: "1 while this instance holds the policy controller Lease.",
		}),
		compute: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "seine_policy_controller_compute_duration_seconds",
			Help:    "Time the policy model took to take in one change of a Pod, Namespace, NetworkPolicy or Node (groups, spans, dirty objects).",
			Buckets: []float64{.00001, .0001, .0005, .001, .005, .01, .05, .1, .5, 1},
		}),
		round: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "seine_policy_controller_round_duration_seconds",
			Help:    "Time from the first change the idle controller received until every object it affected was written and the queue was empty again.",
			Buckets: []float64{.01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 30, 60, 120},
		}),
	}
	if reg != nil {
		depth := prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: "seine_policy_controller_queue_depth",
			Help: "Objects waiting to be reconciled (including delayed ones).",
		}, func() float64 { return float64(c.queueDepth()) })
		reg.MustRegister(m.writes, m.writeErrors, m.leader, depth, m.compute, m.round)
	}
	return m
}

func (c *Controller) queueDepth() int {
	c.mu.Lock()
	l := c.current
	c.mu.Unlock()
	if l == nil {
		return 0
	}
	return l.depth()
}
