package netpol

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"time"
)

// ProbeFunc checks one connection from Pod from to Pod to on pp and
// reports whether it got through. An error means the check itself failed
// (not that the connection was denied).
type ProbeFunc func(ctx context.Context, from, to *Pod, pp PortProto) (bool, error)

// Connection is one probe of a batch.
type Connection struct {
	From, To *Pod
	PP       PortProto
}

// ProbeConnections runs probe on every connection with at most concurrency
// probes in flight (values < 1 mean 1) and returns the outcomes in input
// order. The first probe error is returned with the outcomes (the failed
// connection counts as not connected).
func ProbeConnections(ctx context.Context, conns []Connection, concurrency int, probe ProbeFunc) ([]bool, error) {
	if concurrency < 1 {
		concurrency = 1
	}
	out := make([]bool, len(conns))
	var (
		wg    sync.WaitGroup
		mu    sync.Mutex
		first error
	)
	sem := make(chan struct{}, concurrency)
	for i := range conns {
		if ctx.Err() != nil {
			break
		}
		sem <- struct{}{}
		wg.Add(1)
		go func(i int) {
			defer func() { <-sem; wg.Done() }()
			c := conns[i]
			ok, err := probe(ctx, c.From, c.To, c.PP)
			out[i] = ok
			if err != nil {
				mu.Lock()
				if first == nil {
					first = fmt.Errorf("probe %s -> %s on %s: %w", c.From.PodID, c.To.PodID, c.PP, err)
				}
				mu.Unlock()
			}
		}(i)
	}
	wg.Wait()
	if first == nil && ctx.Err() != nil {
		first = fmt.Errorf("probing: %w", ctx.Err())
	}
	return out, first
}

// ProbeMatrices probes every ordered pair of s's Pods (self pairs too) on
// each of pps in one parallel batch and returns one Matrix per entry of
// pps.
func ProbeMatrices(ctx context.Context, s *State, pps []PortProto, concurrency int, probe ProbeFunc) ([]*Matrix, error) {
	n := len(s.Pods)
	conns := make([]Connection, 0, n*n*len(pps))
	for _, pp := range pps {
		for i := range s.Pods {
			for j := range s.Pods {
				conns = append(conns, Connection{From: &s.Pods[i], To: &s.Pods[j], PP: pp})
			}
		}
	}
	res, err := ProbeConnections(ctx, conns, concurrency, probe)
	ms := make([]*Matrix, len(pps))
	k := 0
	for p := range pps {
		ms[p] = NewMatrix(s.PodIDs(), false)
		for i := 0; i < n; i++ {
			for j := 0; j < n; j++ {
				ms[p].Set(i, j, res[k])
				k++
			}
		}
	}
	return ms, err
}

// Expectation is the truth table wanted for one port and protocol.
type Expectation struct {
	PP   PortProto
	Want *Matrix
}

// WaitOptions tune WaitForMatch.
type WaitOptions struct {
	// Timeout bounds the whole wait (default 20 s).
	Timeout time.Duration
	// Interval is the pause between two rounds (default 250 ms).
	Interval time.Duration
	// Concurrency is the number of probes in flight (default 64).
	Concurrency int
	// Settle is a pause before the first round, so a round is not spent
	// before the datapath could have reacted (default 0).
	Settle time.Duration
	// Logf, when set, is told of every round that did not match.
	Logf func(format string, args ...any)
}

// ErrMismatch is wrapped by WaitForMatch's error when the tables still
// differ at the deadline.
var ErrMismatch = errors.New("connectivity does not match the expected truth tables")

// WaitForMatch probes all expectations' tables in rounds until every one
// matches or the timeout passes. It returns the number of rounds, the
// last round's observed tables (in exps order) and, on failure, an error
// wrapping ErrMismatch whose text holds the last round's diffs.
func WaitForMatch(ctx context.Context, s *State, exps []Expectation, o WaitOptions, probe ProbeFunc) (int, []*Matrix, error) {
	if o.Timeout <= 0 {
		o.Timeout = 20 * time.Second
	}
	if o.Interval <= 0 {
		o.Interval = 250 * time.Millisecond
	}
	if o.Concurrency <= 0 {
		o.Concurrency = 64
	}
	deadline := time.Now().Add(o.Timeout)
	if o.Settle > 0 {
		select {
		case <-ctx.Done():
			return 0, nil, fmt.Errorf("waiting for enforcement: %w", ctx.Err())
		case <-time.After(o.Settle):
		}
	}
	pps := make([]PortProto, len(exps))
	for i, e := range exps {
		pps[i] = e.PP
	}
	for round := 1; ; round++ {
		got, err := ProbeMatrices(ctx, s, pps, o.Concurrency, probe)
		if err != nil {
			return round, got, err
		}
		var diffs []string
		for i, e := range exps {
			if d := Diff(e.PP.String(), e.Want, got[i]); d != "" {
				diffs = append(diffs, d)
			}
		}
		if len(diffs) == 0 {
			return round, got, nil
		}
		if o.Logf != nil {
			o.Logf("round %d: %d of %d tables differ", round, len(diffs), len(exps))
		}
		if time.Now().Add(o.Interval).After(deadline) {
			return round, got, fmt.Errorf("%w after %d rounds in %s:\n%s", ErrMismatch, round, o.Timeout, strings.Join(diffs, "\n"))
		}
		select {
		case <-ctx.Done():
			return round, got, fmt.Errorf("waiting for enforcement: %w", ctx.Err())
		case <-time.After(o.Interval):
		}
	}
}
