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
type metrics struct {
	writes      *prometheus.CounterVec
	writeErrors *prometheus.CounterVec
	leader      prometheus.Gauge
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
	}
	if reg != nil {
		depth := prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: "seine_policy_controller_queue_depth",
			Help: "Objects waiting to be reconciled (including delayed ones).",
		}, func() float64 { return float64(c.queueDepth()) })
		reg.MustRegister(m.writes, m.writeErrors, m.leader, depth)
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
