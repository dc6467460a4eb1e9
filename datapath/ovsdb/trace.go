package ovsdb

import (
	"context"
	"time"
)

// PortTrace receives the phases of one EnsurePort call, for callers that
// break its latency down (the CNI ADD's per-step histogram). Each field is
// the time the phase ended; a phase that did not happen (nothing to
// change) stays zero.
type PortTrace struct {
	// Committed: ovsdb-server confirmed the transaction.
	Committed time.Time
	// Applied: ovs-vswitchd reported the configuration applied
	// (Open_vSwitch.cur_cfg caught up with the transaction's next_cfg).
	Applied time.Time
}

type portTraceKey struct{}

// WithPortTrace returns a context that makes EnsurePort record its phases
// in t (as net/http/httptrace does for requests).
func WithPortTrace(ctx context.Context, t *PortTrace) context.Context {
	return context.WithValue(ctx, portTraceKey{}, t)
}

func portTraceFrom(ctx context.Context) *PortTrace {
	t, _ := ctx.Value(portTraceKey{}).(*PortTrace)
	return t
}
