package bench

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/seine-net/seine/node/info"
	"github.com/seine-net/seine/tests/bench/stats"
	"github.com/seine-net/seine/tests/sandbox"
	"github.com/seine-net/seine/tests/sandbox/echo"
)

// BenchmarkPolicyRealization measures, on a 3-Node sandbox with 100 Pods
// under a default-deny policy, the time from creating an allow policy to
// the first probe that gets through (the policy enforced on both the
// client's and the server's Node), p50 and p99 over 50 policies; and the
// time from creating a Pod selected by a policy to the Pod being Ready
// (its CNI ADD returns only once its policies are enforced), over 20 Pods.
func BenchmarkPolicyRealization(b *testing.B) {
	c := up(b, "bpol", 3, nil)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Minute)
	defer cancel()
	const ns, n = "rl", 100
	nodes := c.Nodes()
	ips := make([]string, n)
	var wg sync.WaitGroup
	errs := make(chan error, n)
	sem := make(chan struct{}, 8)
	for i := 0; i < n; i++ {
		wg.Add(1)
		go func(i int) {
			defer wg.Done()
			sem <- struct{}{}
			defer func() { <-sem }()
			p, err := c.CreatePod(ctx, sandbox.PodSpec{Namespace: ns, Name: fmt.Sprintf("p%03d", i), Node: nodes[i%len(nodes)].Name,
				Labels: map[string]string{"idx": fmt.Sprint(i)}, Ports: []sandbox.Port{{Name: "http", Port: 8080, Protocol: corev1.ProtocolTCP}}})
			if err != nil {
				errs <- err
				return
			}
			ips[i] = p.Status.PodIP
		}(i)
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		b.Fatal(err)
	}
	nps := c.Client().NetworkingV1().NetworkPolicies(ns)
	deny := &networkingv1.NetworkPolicy{ObjectMeta: metav1.ObjectMeta{Name: "deny"},
		Spec: networkingv1.NetworkPolicySpec{PolicyTypes: []networkingv1.PolicyType{networkingv1.PolicyTypeIngress}}}
	if _, err := nps.Create(ctx, deny, metav1.CreateOptions{}); err != nil {
		b.Fatal(err)
	}
	// Every Node of the deny policy's span has realized it: the first
	// probe of each allow below starts from a denied connection.
	for {
		np, err := nps.Get(ctx, "deny", metav1.GetOptions{})
		if err != nil {
			b.Fatal(err)
		}
		done, span, ok := strings.Cut(np.Annotations[info.AnnotationRealizedNodes], "/")
		if ok && done == span && span != "0" && np.Annotations[info.AnnotationRealizedGeneration] == strconv.FormatInt(np.Generation, 10) {
			break
		}
		if ctx.Err() != nil {
			b.Fatalf("the deny policy was not realized: %v", np.Annotations)
		}
		time.Sleep(100 * time.Millisecond)
	}
	b.ResetTimer()
	for it := 0; it < b.N; it++ {
		var lat []time.Duration
		for i := 0; i < 50; i++ {
			server, client := (2*i)%n, (2*i+1)%n // different Nodes (3 Nodes, consecutive indexes)
			np := &networkingv1.NetworkPolicy{ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("allow-%d", i)},
				Spec: networkingv1.NetworkPolicySpec{
					PodSelector: metav1.LabelSelector{MatchLabels: map[string]string{"idx": fmt.Sprint(server)}},
					Ingress: []networkingv1.NetworkPolicyIngressRule{{From: []networkingv1.NetworkPolicyPeer{{
						PodSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"idx": fmt.Sprint(client)}}}}}},
				}}
			start := time.Now()
			if _, err := nps.Create(ctx, np, metav1.CreateOptions{}); err != nil {
				b.Fatal(err)
			}
			for {
				r := c.Probe(ctx, ns, fmt.Sprintf("p%03d", client), ips[server], 8080, corev1.ProtocolTCP, 100*time.Millisecond)
				if r.Outcome == echo.Connected {
					break
				}
				if time.Since(start) > 30*time.Second {
					b.Fatalf("policy %d not enforced after 30 s", i)
				}
			}
			lat = append(lat, time.Since(start))
			_ = nps.Delete(ctx, np.Name, metav1.DeleteOptions{})
		}
		b.ReportMetric(float64(stats.Quantile(lat, 0.5).Microseconds())/1000, "policy-p50-ms")
		b.ReportMetric(float64(stats.Quantile(lat, 0.99).Microseconds())/1000, "policy-p99-ms")

		// Pod creation under a policy to Ready.
		var podLat []time.Duration
		for i := 0; i < 20; i++ {
			name := fmt.Sprintf("new%02d-%d", i, it)
			start := time.Now()
			if _, err := c.CreatePod(ctx, sandbox.PodSpec{Namespace: ns, Name: name, Node: nodes[i%len(nodes)].Name,
				Labels: map[string]string{"idx": "new"}}); err != nil {
				b.Fatal(err)
			}
			podLat = append(podLat, time.Since(start))
			_ = c.DeletePod(ctx, ns, name)
		}
		b.ReportMetric(float64(stats.Quantile(podLat, 0.5).Microseconds())/1000, "pod-ready-p50-ms")
		b.ReportMetric(float64(stats.Quantile(podLat, 0.99).Microseconds())/1000, "pod-ready-p99-ms")
	}
}
