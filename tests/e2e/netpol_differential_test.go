package e2e

import (
	"errors"
	"fmt"
	"os"
	"strconv"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"

	"github.com/seine-net/seine/tests/netpol"
	"github.com/seine-net/seine/tests/netpol/reference"
)

// TestNetpolDifferential applies random policy sets (seeded; the seed is
// logged and SEINE_NETPOL_SEED repeats it; SEINE_NETPOL_SETS sets the
// count, default 10) and compares the connectivity the datapath enforces
// on TCP 80, TCP 81 and UDP 80 with the verdicts of an independent
// evaluator (cyclonus' policy model, tests/netpol/reference). Seine's own
// evaluator must agree with it too.
func TestNetpolDifferential(t *testing.T) {
	e := netpolSetup(t)
	seed, err := netpol.Seed()
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("seed %d (%s=%d repeats this run)", seed, netpol.SeedEnv, seed)
	sets := 10
	if v := os.Getenv("SEINE_NETPOL_SETS"); v != "" {
		if sets, err = strconv.Atoi(v); err != nil || sets < 1 {
			t.Fatalf("SEINE_NETPOL_SETS=%q: want a positive integer", v)
		}
	}
	g := &netpol.Generator{R: netpol.NewRand(seed), S: e.base}
	// All sets are drawn first, so -run on one set sees the same policies.
	all := make([][]*networkingv1.NetworkPolicy, sets)
	for i := range all {
		all[i] = g.Policies(4)
	}
	pps := []netpol.PortProto{{Port: 80, Protocol: corev1.ProtocolTCP}, {Port: 81, Protocol: corev1.ProtocolTCP}, {Port: 80, Protocol: corev1.ProtocolUDP}}
	absent := 0
	for i, pols := range all {
		t.Run(fmt.Sprintf("set-%02d", i), func(t *testing.T) {
			if absent >= 3 {
				t.Skip("skipped: the previous sets saw no NetworkPolicy enforcement at all")
			}
			t.Logf("policies:\n%s", reference.Dump(pols))
			var exps []netpol.Expectation
			t.Cleanup(func() { e.resetPolicies(t, e.base, exps, e.socketProbe) })
			ctx := testCtx(t, e.deadline+time.Minute)
			stored, err := e.applyPolicies(ctx, pols)
			if err != nil {
				t.Fatal(err)
			}
			s, err := e.readState(ctx)
			if err != nil {
				t.Fatal(err)
			}
			ref, err := reference.New(stored, s)
			if err != nil {
				t.Fatal(err)
			}
			for _, pp := range pps {
				want := ref.Expect(pp, true)
				own, err := netpol.Expect(stored, s, pp, true)
				if err != nil {
					t.Fatal(err)
				}
				if d := netpol.Diff(pp.String()+" (expected = cyclonus, observed = netpol.Evaluate)", want, own); d != "" {
					t.Errorf("evaluators disagree:\n%s", d)
				}
				exps = append(exps, netpol.Expectation{PP: pp, Want: want})
			}
			rounds, got, err := netpol.WaitForMatch(ctx, s, exps, netpol.WaitOptions{
				Timeout: e.deadline, Concurrency: netpolConcurrency, Settle: netpolSettle}, e.socketProbe)
			if err != nil {
				if errors.Is(err, netpol.ErrMismatch) && noEnforcement(exps, got) {
					absent++
				} else {
					absent = 0
				}
				t.Fatal(err)
			}
			absent = 0
			t.Logf("enforced tables match after %d round(s)", rounds)
		})
	}
}
