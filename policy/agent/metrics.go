package agent

import "github.com/prometheus/client_golang/prometheus"

// metrics of one Agent:
//
//	seine_policy_realization_duration_seconds  histogram; from the first
//	    change of a policy's objects the agent received (a NetworkPolicy,
//	    AppliedToGroup or AddressGroup event, or a local Pod attached or
//	    detached) to its flows and isolation installed
//	seine_policy_agent_pending_policies        gauge; policies waiting to be translated
//	seine_policy_agent_policies                gauge; computed policies installed
type metrics struct {
	realization prometheus.Histogram
}

func newMetrics() *metrics {
	return &metrics{realization: prometheus.NewHistogram(prometheus.HistogramOpts{
		Name:    "seine_policy_realization_duration_seconds",
		Help:    "Time from a change of a NetworkPolicy's computed objects reaching this Node's agent to its flows being installed.",
		Buckets: []float64{.005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 30},
	})}
}

// Register adds the agent's metrics to reg.
func (a *Agent) Register(reg prometheus.Registerer) error {
	count := func(name, help string, fn func() int) prometheus.Collector {
		return prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: name, Help: help}, func() float64 { return float64(fn()) })
	}
	for _, c := range []prometheus.Collector{
		a.metrics.realization,
		count("seine_policy_agent_pending_policies", "Computed NetworkPolicies waiting to be translated and installed.", func() int {
			a.mu.Lock()
			defer a.mu.Unlock()
			return len(a.dirty)
		}),
		count("seine_policy_agent_policies", "Computed NetworkPolicies whose flows are installed on this Node.", func() int {
			a.mu.Lock()
			defer a.mu.Unlock()
			return len(a.done)
		}),
	} {
		if err := reg.Register(c); err != nil {
			return err
		}
	}
	return nil
}
