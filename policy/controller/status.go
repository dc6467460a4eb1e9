package controller

import (
	"time"

	"github.com/seine-net/seine/policy/compute"
)

// Round is one round of the leader's work: it starts with the first change
// the idle controller receives (or with the term) and ends when every
// object the round dirtied was reconciled and the queue is empty again.
type Round struct {
	FinishedAt time.Time
	Duration   time.Duration
	// Objects is the number of objects reconciled (written, deleted or
	// found equal); an object postponed or retried counts once, when done.
	Objects int
}

// Status is what the controller instance knows of its leadership.
type Status struct {
	// Leading is true while this instance holds the Lease.
	Leading bool
	// Observed is the Lease holder as this instance last read it
	// (Controller.ObservedLeader): its own from the start of a term,
	// another's as soon as a renewal finds the Lease taken, while Leading
	// may still be true (client-go ends the term only when its renew
	// deadline passes).
	Observed string
	// Since is when the current term started.
	Since time.Time
	// Sources counts the source objects by resource ("pods", "namespaces",
	// "networkpolicies", "nodes").
	Sources map[string]int
	// Computed counts the stored computed objects by kind.
	Computed map[compute.Kind]int
	// QueueDepth is the number of objects waiting to be reconciled.
	QueueDepth int
	// InitialSync is how long the term's first round took (0 until done).
	InitialSync time.Duration
	// LastRound is the latest finished round (nil before the first).
	LastRound *Round
}

// Status reports the current term; Leading is false (and the rest empty)
// when this instance does not lead.
func (c *Controller) Status() Status {
	c.mu.Lock()
	l := c.current
	c.mu.Unlock()
	if l == nil || !c.IsLeader() {
		return Status{}
	}
	st := Status{Leading: true, Observed: c.ObservedLeader(), Sources: map[string]int{}, Computed: map[compute.Kind]int{}, QueueDepth: l.depth()}
	if t := c.term.Load(); t != nil {
		st.Since, st.InitialSync, st.LastRound = t.since, t.initialSync, t.last
	}
	for name, s := range l.sources {
		st.Sources[name] = len(s.ListKeys())
	}
	for kind, r := range l.kinds {
		st.Computed[kind] = len(r.informer().GetStore().ListKeys())
	}
	return st
}
