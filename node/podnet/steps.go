package podnet

import (
	"errors"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/seine-net/seine/datapath/ovsdb"
)

// Steps of a CNI ADD: the values of the "step" label of
// seine_cni_add_step_duration_seconds, in the order an ADD runs them.
const (
	// StepIPAM is reserving the Pod's address (in memory; its write to
	// disk starts then).
	StepIPAM = "ipam"
	// StepVeth is creating the veth pair (the Pod's end is configured
	// while the later steps run: StepPodInterface).
	StepVeth = "veth"
	// StepOVSDB is the OVSDB transaction that adds the port, until
	// ovsdb-server confirms it.
	StepOVSDB = "ovsdb_transaction"
	// StepApply is waiting for ovs-vswitchd to apply the new configuration
	// (Open_vSwitch.cur_cfg).
	StepApply = "vswitchd_apply"
	// StepOFPort is waiting, after that, for the port's OpenFlow number.
	StepOFPort = "ofport"
	// StepFlows is installing the Pod's flows (one OpenFlow bundle).
	StepFlows = "flows"
	// StepIPAMSync is what is left, after the flows, of waiting for the
	// address to be on disk (fsync).
	StepIPAMSync = "ipam_sync"
	// StepPolicy is waiting for the Pod's NetworkPolicies to be realized.
	StepPolicy = "policy"
	// StepPodInterface is what is left, after the policy, of configuring
	// the Pod's end of the veth (address, routes, checksum offload,
	// egress shaping) and bringing both ends up, which runs from
	// StepOVSDB on.
	StepPodInterface = "pod_interface"
	// StepHostPorts is mapping the Pod's hostPorts (one nftables
	// transaction; only Pods that have hostPorts).
	StepHostPorts = "hostports"
)

// Steps lists the step labels in order.
var Steps = []string{StepIPAM, StepVeth, StepOVSDB, StepApply, StepOFPort, StepFlows, StepIPAMSync, StepPolicy, StepPodInterface, StepHostPorts}

// newStepHistogram returns seine_cni_add_step_duration_seconds, registered
// on reg when reg is not nil (an already registered one is reused).
func newStepHistogram(reg prometheus.Registerer) *prometheus.HistogramVec {
	h := prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Name:    "seine_cni_add_step_duration_seconds",
		Help:    "Time one CNI ADD spent in each step (ipam, veth, ovsdb_transaction, vswitchd_apply, ofport, flows, ipam_sync, policy, pod_interface, hostports), successful ADDs only.",
		Buckets: []float64{.0005, .001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10},
	}, []string{"step"})
	if reg == nil {
		return h
	}
	if err := reg.Register(h); err != nil {
		var are prometheus.AlreadyRegisteredError
		if errors.As(err, &are) {
			if existing, ok := are.ExistingCollector.(*prometheus.HistogramVec); ok {
				return existing
			}
		}
	}
	return h
}

// stepTimes records when each step of one ADD ended.
type stepTimes struct {
	last  time.Time
	spent map[string]time.Duration
	port  ovsdb.PortTrace
}

func newStepTimes() *stepTimes {
	return &stepTimes{last: time.Now(), spent: make(map[string]time.Duration, len(Steps))}
}

// done ends step now.
func (s *stepTimes) done(step string) { s.doneAt(step, time.Now()) }

// doneAt ends step at t; a zero t (the phase did not happen) leaves the
// step out.
func (s *stepTimes) doneAt(step string, t time.Time) {
	if t.IsZero() {
		return
	}
	s.spent[step] += t.Sub(s.last)
	s.last = t
}

// portDone splits the OVSDB part of an ADD into its phases.
func (s *stepTimes) portDone() {
	s.doneAt(StepOVSDB, s.port.Committed)
	s.doneAt(StepApply, s.port.Applied)
	s.done(StepOFPort)
}

// observe adds the steps of a successful ADD to h.
func (s *stepTimes) observe(h *prometheus.HistogramVec) {
	for step, d := range s.spent {
		h.WithLabelValues(step).Observe(d.Seconds())
	}
}
