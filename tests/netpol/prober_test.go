package netpol

import (
	"context"
	"errors"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	networkingv1 "k8s.io/api/networking/v1"
)

// A fake datapath (pure logic under test is the prober): it enforces the
// expected table only after enforceAfter probes, and counts concurrency.
func TestWaitForMatchConverges(t *testing.T) {
	s := testState()
	pols := []*networkingv1.NetworkPolicy{NewPolicy("x", "deny", Labels(), Ingress())}
	pp := PortProto{80, tcp}
	want, err := Expect(pols, s, pp, true)
	if err != nil {
		t.Fatal(err)
	}
	var probes, inFlight, maxInFlight atomic.Int64
	probe := func(ctx context.Context, from, to *Pod, p PortProto) (bool, error) {
		n := inFlight.Add(1)
		defer inFlight.Add(-1)
		for {
			m := maxInFlight.Load()
			if n <= m || maxInFlight.CompareAndSwap(m, n) {
				break
			}
		}
		time.Sleep(time.Millisecond)
		if probes.Add(1) <= 81 { // first round: nothing enforced yet
			return true, nil
		}
		return want.Get(want.Index(from.PodID), want.Index(to.PodID)), nil
	}
	rounds, _, err := WaitForMatch(context.Background(), s, []Expectation{{pp, want}},
		WaitOptions{Timeout: 5 * time.Second, Interval: time.Millisecond, Concurrency: 8}, probe)
	if err != nil {
		t.Fatal(err)
	}
	if rounds != 2 {
		t.Errorf("rounds %d, want 2", rounds)
	}
	if m := maxInFlight.Load(); m > 8 || m < 2 {
		t.Errorf("max probes in flight %d, want 2..8", m)
	}
}

func TestWaitForMatchReportsDiff(t *testing.T) {
	s := testState()
	pp := PortProto{80, tcp}
	want := NewMatrix(s.PodIDs(), true)
	probe := func(ctx context.Context, from, to *Pod, p PortProto) (bool, error) {
		return !(from.Name == "a" && to.Namespace == "z"), nil
	}
	_, last, err := WaitForMatch(context.Background(), s, []Expectation{{pp, want}},
		WaitOptions{Timeout: 50 * time.Millisecond, Interval: 10 * time.Millisecond}, probe)
	if !errors.Is(err, ErrMismatch) {
		t.Fatalf("error %v, want ErrMismatch", err)
	}
	if len(last) != 1 || last[0].Count() != 72 {
		t.Errorf("last observed table not returned: %v", last)
	}
	if !strings.Contains(err.Error(), "TCP/80: 9 of 81 cells differ") {
		t.Errorf("error lacks the diff summary:\n%v", err)
	}
}

func TestProbeConnectionsReportsErrors(t *testing.T) {
	s := testState()
	conns := []Connection{{&s.Pods[0], &s.Pods[1], PortProto{80, tcp}}, {&s.Pods[1], &s.Pods[2], PortProto{80, tcp}}}
	res, err := ProbeConnections(context.Background(), conns, 4, func(ctx context.Context, from, to *Pod, p PortProto) (bool, error) {
		if from == &s.Pods[1] {
			return false, errors.New("boom")
		}
		return true, nil
	})
	if err == nil || !strings.Contains(err.Error(), "boom") || !res[0] || res[1] {
		t.Errorf("got %v, %v", res, err)
	}
}
