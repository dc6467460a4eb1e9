package realnodes

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"golang.org/x/sync/errgroup"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"

	"github.com/seine-net/seine/tests/bench/stats"
	"github.com/seine-net/seine/tests/sandbox"
)

// BenchmarkPolicySettle measures, on the package's two real Nodes (kubelet,
// containerd, Seine installed by its manifest), how long a NetworkPolicy
// change takes to hold in the data plane, end to end: from the API call
// that creates a policy admitting a client Pod to a server Pod isolated by
// a default deny, to the first new TCP connection from the client, on the
// other Node, that gets through ("allow"); and from the call that deletes
// it to the first new connection that is dropped ("revoke"). p50 and p99
// over 30 of each. Probes are TCP connects from the client's network
// namespace, one started every 5 ms, each given 100 ms (a dropped SYN
// shows as that timeout): a latency is when the earliest probe that saw
// the change started, good to those 5 ms.
//
// It measures twice: alone (metrics allow-p50-ms, allow-p99-ms,
// revoke-p50-ms, revoke-p99-ms), then with a background of B more
// policies applied to the server, each admitting its own (empty) set of
// Pods on its own port, so that the server's Node holds B more policies
// and B more address groups (metrics bgB-allow-p50-ms and so on; B from
// SEINE_BENCH_SETTLE_BACKGROUND, default 1000, 0 skips it).
//
//	go test -run '^$' -bench BenchmarkPolicySettle -benchtime 1x ./tests/e2e/realnodes/
//
// (with SEINE_K8S_BIN and SEINE_NODE_BIN as for the package's tests).
func BenchmarkPolicySettle(b *testing.B) {
	background := 1000
	if v := os.Getenv("SEINE_BENCH_SETTLE_BACKGROUND"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 0 {
			b.Fatalf("SEINE_BENCH_SETTLE_BACKGROUND=%q: want a number of policies", v)
		}
		background = n
	}
	const ns = "bench-settle"
	createNamespace(b, ns)
	servers := deployAgnhost(b, ns, "server", 2, map[string]string{"app": "server"}, "netexec", "--http-port=8080")
	clients := deployAgnhost(b, ns, "client", 2, map[string]string{"role": "client"}, "pause")
	server, client := servers[0], clients[0]
	if client.Spec.NodeName == server.Spec.NodeName {
		client = clients[1]
	}
	if client.Spec.NodeName == server.Spec.NodeName {
		b.Fatalf("the client Pods and the server share Node %s", server.Spec.NodeName)
	}
	netns, err := cluster.RealPodNetNS(&client)
	if err != nil {
		b.Fatal(err)
	}
	addr := net.JoinHostPort(server.Status.PodIP, "8080")
	ctx := testCtx(b, 10*time.Minute)
	// connects reports whether a new connection gets through (false: it
	// timed out, as a dropped SYN does; any other failure is an error),
	// and when its probe started.
	connects := func() (bool, time.Time, error) {
		start := time.Now()
		pctx, cancel := context.WithTimeout(ctx, 100*time.Millisecond)
		defer cancel()
		conn, err := sandbox.DialIn(pctx, netns, "tcp", addr)
		var nerr net.Error
		switch {
		case ctx.Err() != nil:
			return false, start, fmt.Errorf("probing %s: %w", addr, ctx.Err())
		case err == nil:
			conn.Close()
			return true, start, nil
		case errors.Is(err, context.DeadlineExceeded) || errors.As(err, &nerr) && nerr.Timeout():
			return false, start, nil
		}
		return false, start, fmt.Errorf("probing %s from %s: %w", addr, client.Name, err)
	}
	// until starts a probe every probeEvery until one says want, lets the
	// probes still in flight finish, and returns how long after since the
	// earliest probe that said want started. A probe's SYN leaves as it
	// starts, and a dropped one is not sent again within its 100 ms, so the
	// earliest such start is the moment the data plane changed, give or
	// take probeEvery.
	const probeEvery = 5 * time.Millisecond
	until := func(want bool, since time.Time, what string) time.Duration {
		type result struct {
			ok  bool
			at  time.Time
			err error
		}
		results := make(chan result, 64)
		var wg sync.WaitGroup
		var first time.Time
		tick := time.NewTicker(probeEvery)
		defer tick.Stop()
		probe := func() {
			wg.Add(1)
			go func() {
				defer wg.Done()
				ok, at, err := connects()
				results <- result{ok, at, err}
			}()
		}
		probe()
		for seen := false; !seen; {
			select {
			case r := <-results:
				if r.err != nil {
					b.Fatal(r.err)
				}
				if r.ok == want {
					first, seen = r.at, true
				}
			case <-tick.C:
				if time.Since(since) > 30*time.Second {
					b.Fatalf("%s: not seen after 30 s", what)
				}
				probe()
			}
		}
		go func() { wg.Wait(); close(results) }()
		for r := range results {
			if r.err != nil {
				b.Fatal(r.err)
			}
			if r.ok == want && r.at.Before(first) {
				first = r.at
			}
		}
		return first.Sub(since)
	}
	if ok, _, err := connects(); !ok || err != nil {
		b.Fatalf("the client %s does not reach the server %s before any policy (%v)", client.Name, addr, err)
	}
	nps := cluster.Client().NetworkingV1().NetworkPolicies(ns)
	deny := &networkingv1.NetworkPolicy{ObjectMeta: metav1.ObjectMeta{Name: "deny"},
		Spec: networkingv1.NetworkPolicySpec{PodSelector: metav1.LabelSelector{MatchLabels: map[string]string{"app": "server"}},
			PolicyTypes: []networkingv1.PolicyType{networkingv1.PolicyTypeIngress}}}
	start := time.Now()
	if _, err := nps.Create(ctx, deny, metav1.CreateOptions{}); err != nil {
		b.Fatal(err)
	}
	b.Logf("default deny held after %s", until(false, start, "the default deny").Round(time.Millisecond))
	allow := &networkingv1.NetworkPolicy{ObjectMeta: metav1.ObjectMeta{Name: "allow"},
		Spec: networkingv1.NetworkPolicySpec{PodSelector: metav1.LabelSelector{MatchLabels: map[string]string{"app": "server"}},
			Ingress: []networkingv1.NetworkPolicyIngressRule{{From: []networkingv1.NetworkPolicyPeer{{
				PodSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"role": "client"}}}}}}}}
	// settle times 30 rounds of allow and revoke and reports them under
	// prefix.
	settle := func(prefix string) {
		var allowed, revoked []time.Duration
		for i := 0; i < 30; i++ {
			start := time.Now()
			if _, err := nps.Create(ctx, allow, metav1.CreateOptions{}); err != nil {
				b.Fatal(err)
			}
			allowed = append(allowed, until(true, start, fmt.Sprintf("%sallow %d", prefix, i)))
			start = time.Now()
			if err := nps.Delete(ctx, allow.Name, metav1.DeleteOptions{}); err != nil {
				b.Fatal(err)
			}
			revoked = append(revoked, until(false, start, fmt.Sprintf("%srevoke %d", prefix, i)))
		}
		b.Logf("%sallow p50 %v p99 %v, revoke p50 %v p99 %v", prefix,
			stats.Quantile(allowed, 0.5), stats.Quantile(allowed, 0.99), stats.Quantile(revoked, 0.5), stats.Quantile(revoked, 0.99))
		b.ReportMetric(ms(stats.Quantile(allowed, 0.5)), prefix+"allow-p50-ms")
		b.ReportMetric(ms(stats.Quantile(allowed, 0.99)), prefix+"allow-p99-ms")
		b.ReportMetric(ms(stats.Quantile(revoked, 0.5)), prefix+"revoke-p50-ms")
		b.ReportMetric(ms(stats.Quantile(revoked, 0.99)), prefix+"revoke-p99-ms")
	}
	b.ResetTimer()
	for it := 0; it < b.N; it++ {
		settle("")
		if background == 0 {
			continue
		}
		b.StopTimer()
		start := time.Now()
		createBackground(b, ctx, ns, background)
		// Installed on the server's Node: the default deny and the
		// background (the agent's seine_policy_agent_policies).
		for want := float64(background + 1); ; {
			m, err := cluster.NodeMetrics(ctx, server.Spec.NodeName)
			if err != nil {
				b.Fatal(err)
			}
			if got := metricValue(m, "seine_policy_agent_policies"); got >= want {
				break
			}
			if time.Since(start) > 5*time.Minute {
				b.Fatalf("%d background policies not installed on %s after 5 minutes (seine_policy_agent_policies %v)",
					background, server.Spec.NodeName, metricValue(m, "seine_policy_agent_policies"))
			}
			time.Sleep(500 * time.Millisecond)
		}
		b.Logf("%d background policies created and installed on %s in %v", background, server.Spec.NodeName, time.Since(start).Round(time.Millisecond))
		if ok, _, err := connects(); ok || err != nil {
			b.Fatalf("the server admits the client with only the default deny and the background (%v)", err)
		}
		b.StartTimer()
		settle(fmt.Sprintf("bg%d-", background))
	}
}

// createBackground creates n NetworkPolicies in ns applied to the server
// Pods (app=server), each admitting Pods labelled peer=bg-<i>, which none
// is, on TCP port 10000+i: n policies and n empty address groups for the
// server's Node. 16 at a time, on a client allowed 500 requests a second.
func createBackground(b *testing.B, ctx context.Context, ns string, n int) {
	b.Helper()
	cs, err := cluster.BulkClient(500)
	if err != nil {
		b.Fatal(err)
	}
	nps := cs.NetworkingV1().NetworkPolicies(ns)
	g, gctx := errgroup.WithContext(ctx)
	g.SetLimit(16)
	for i := 0; i < n; i++ {
		g.Go(func() error {
			port := intstr.FromInt32(int32(10000 + i))
			np := &networkingv1.NetworkPolicy{ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("bg-%05d", i)},
				Spec: networkingv1.NetworkPolicySpec{PodSelector: metav1.LabelSelector{MatchLabels: map[string]string{"app": "server"}},
					Ingress: []networkingv1.NetworkPolicyIngressRule{{
						Ports: []networkingv1.NetworkPolicyPort{{Port: &port}},
						From: []networkingv1.NetworkPolicyPeer{{
							PodSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"peer": fmt.Sprintf("bg-%d", i)}}}}}}}}
			if _, err := nps.Create(gctx, np, metav1.CreateOptions{}); err != nil {
				return fmt.Errorf("create background policy %s: %w", np.Name, err)
			}
			return nil
		})
	}
	if err := g.Wait(); err != nil {
		b.Fatal(err)
	}
}

// metricValue is the value of the unlabelled series name in a /metrics
// page, or -1 when there is none.
func metricValue(page, name string) float64 {
	for _, line := range strings.Split(page, "\n") {
		if rest, ok := strings.CutPrefix(line, name+" "); ok {
			if v, err := strconv.ParseFloat(strings.TrimSpace(rest), 64); err == nil {
				return v
			}
		}
	}
	return -1
}

func ms(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }
