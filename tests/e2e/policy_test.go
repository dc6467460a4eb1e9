package e2e

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/seine-net/seine/tests/sandbox"
	"github.com/seine-net/seine/tests/sandbox/echo"
)

// leaseHolder returns the Node holding the policy controller's Lease.
func leaseHolder(t *testing.T, c *sandbox.Cluster) string {
	t.Helper()
	l, err := c.Client().CoordinationV1().Leases(sandbox.SeineNamespace).Get(testCtx(t, 10*time.Second), "seine-controller", metav1.GetOptions{})
	if err != nil || l.Spec.HolderIdentity == nil {
		return ""
	}
	return *l.Spec.HolderIdentity
}

func allowFrom(ns, name string, target, from map[string]string) *networkingv1.NetworkPolicy {
	return &networkingv1.NetworkPolicy{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name},
		Spec: networkingv1.NetworkPolicySpec{
			PodSelector: metav1.LabelSelector{MatchLabels: target},
			PolicyTypes: []networkingv1.PolicyType{networkingv1.PolicyTypeIngress},
			Ingress: []networkingv1.NetworkPolicyIngressRule{{
				From: []networkingv1.NetworkPolicyPeer{{PodSelector: &metav1.LabelSelector{MatchLabels: from}}},
			}},
		},
	}
}

// probeUntil probes until the outcome is want or the timeout passes.
func probeUntil(t *testing.T, c *sandbox.Cluster, from podRef, ip string, want echo.Outcome, timeout time.Duration) time.Duration {
	t.Helper()
	start := time.Now()
	for {
		r := c.Probe(context.Background(), from.ns, from.name, ip, tcpPort, corev1.ProtocolTCP, 300*time.Millisecond)
		if r.Outcome == echo.Failed {
			t.Fatalf("%s/%s -> %s: %v", from.ns, from.name, ip, r.Err)
		}
		if r.Outcome == want {
			return time.Since(start)
		}
		if time.Since(start) > timeout {
			t.Fatalf("%s/%s -> %s: still %s after %s, want %s", from.ns, from.name, ip, r, timeout, want)
		}
	}
}

// TestPolicyControllerFailover kills (SIGKILL) the seine process holding
// the controller Lease: another instance must hold it within the lease
// duration plus one retry period (15 s + 2 s by default), and a policy
// created afterwards must be enforced; enforcement of existing policies
// never stops.
func TestPolicyControllerFailover(t *testing.T) {
	c := shared
	ns := "failover"
	pods := createPods(t, c, ns, 0, 1, 2, 1)
	pods, friend := pods[:3], pods[3]
	ctx := testCtx(t, 3*time.Minute)
	np := c.Client().NetworkingV1().NetworkPolicies(ns)
	if _, err := c.Client().CoreV1().Pods(ns).Patch(ctx, friend.name, "application/merge-patch+json",
		[]byte(`{"metadata":{"labels":{"role":"friend"}}}`), metav1.PatchOptions{}); err != nil {
		t.Fatal(err)
	}
	// Existing policy: only Pods labelled role=friend may reach p0.
	if _, err := np.Create(ctx, allowFrom(ns, "before", map[string]string{"e2e-target": "p0"}, map[string]string{"role": "friend"}), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Client().CoreV1().Pods(ns).Patch(ctx, pods[0].name, "application/merge-patch+json",
		[]byte(`{"metadata":{"labels":{"e2e-target":"p0"}}}`), metav1.PatchOptions{}); err != nil {
		t.Fatal(err)
	}
	probeUntil(t, c, pods[1], pods[0].ip, echo.TimedOut, 10*time.Second)
	probeUntil(t, c, friend, pods[0].ip, echo.Connected, 10*time.Second)

	holder := leaseHolder(t, c)
	if holder == "" {
		t.Fatal("no instance holds the controller Lease")
	}
	// The ControllerInfo names the leader (ops.seine.io), and follows the
	// failover below.
	if ci := checkControllerInfo(t, c); ci.Status.Leader != holder {
		t.Fatalf("ControllerInfo names %s, the Lease %s", ci.Status.Leader, holder)
	}
	n, err := c.Node(holder)
	if err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(filepath.Join(n.Dir, "seine.pid"))
	if err != nil {
		t.Fatal(err)
	}
	pid, err := strconv.Atoi(strings.TrimSpace(string(b)))
	if err != nil || pid <= 0 { // kill(2) of pid 0 would hit the test's whole process group
		t.Fatalf("seine.pid on %s holds no pid: %q (%v)", holder, b, err)
	}
	t.Cleanup(func() {
		if err := c.StartSeine(context.Background(), holder, nil); err != nil {
			t.Errorf("restarting seine on %s: %v", holder, err)
		}
	})
	if err := syscall.Kill(pid, syscall.SIGKILL); err != nil {
		t.Fatalf("killing seine on %s (pid %d): %v", holder, pid, err)
	}
	killed := time.Now()
	before, err := c.Client().CoordinationV1().Leases(sandbox.SeineNamespace).Get(ctx, "seine-controller", metav1.GetOptions{})
	if err != nil || before.Spec.RenewTime == nil || before.Spec.LeaseDurationSeconds == nil {
		t.Fatalf("reading the Lease: %v", err)
	}
	lastRenew := before.Spec.RenewTime.Time
	leaseDuration := time.Duration(*before.Spec.LeaseDurationSeconds) * time.Second
	var newHolder string
	eventually(t, 30*time.Second, "a new Lease holder", func() error {
		newHolder = leaseHolder(t, c)
		if newHolder == "" || newHolder == holder {
			return fmt.Errorf("holder is still %q", newHolder)
		}
		return nil
	})
	took := time.Since(killed)
	after, err := c.Client().CoordinationV1().Leases(sandbox.SeineNamespace).Get(ctx, "seine-controller", metav1.GetOptions{})
	if err != nil || after.Spec.AcquireTime == nil {
		t.Fatalf("reading the Lease: %v", err)
	}
	// How long the takeover took is logged, not asserted (timings belong
	// in benchmarks): a candidate counts the Lease's duration from when
	// it last saw the Lease change, up to one jittered retry period
	// (2.2 × 2 s) after the renewal, and tries again one such period
	// later, so about 15 + 8.8 s is expected on a busy machine; the wait
	// above bounds it at 30 s.
	gap := after.Spec.AcquireTime.Time.Sub(lastRenew)
	t.Logf("%s took over the Lease %s after %s was killed, %s after its last renewal (lease duration %s)",
		newHolder, took.Round(time.Millisecond), holder, gap.Round(time.Millisecond), leaseDuration)
	// The new leader claims the ControllerInfo, which fences the old one:
	// its credentials (still valid: the token is bound to its Node, not
	// its process) may no longer write the computed state.
	eventually(t, 10*time.Second, "the new leader's writes admitted", func() error { return writeComputedState(t, c, newHolder) })
	wantRefused(t, "the deposed leader writing an AddressGroup", writeComputedState(t, c, holder), "seine-leader-writes",
		"names "+newHolder, "Node "+holder)
	// The old policy is still enforced (by its Node's flows; no object vanished).
	if r := c.Probe(ctx, ns, pods[1].name, pods[0].ip, tcpPort, corev1.ProtocolTCP, time.Second); r.Outcome != echo.TimedOut {
		t.Fatalf("an existing policy stopped being enforced during the hand-over: %s (%v)", r, r.Err)
	}
	if r := c.Probe(ctx, ns, friend.name, pods[0].ip, tcpPort, corev1.ProtocolTCP, 2*time.Second); r.Outcome != echo.Connected {
		t.Fatalf("what an existing policy allows stopped during the hand-over: %s (%v)", r, r.Err)
	}
	// A policy created now is enforced: isolate p2 (on a Node whose daemon
	// is alive) too.
	target := pods[2]
	for _, p := range pods {
		if p.node != holder && p.name != pods[0].name {
			target = p
		}
	}
	if _, err := c.Client().CoreV1().Pods(ns).Patch(ctx, target.name, "application/merge-patch+json",
		[]byte(`{"metadata":{"labels":{"e2e-target":"after"}}}`), metav1.PatchOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := np.Create(ctx, allowFrom(ns, "after", map[string]string{"e2e-target": "after"}, map[string]string{"role": "friend"}), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	src := pods[0]
	if src.name == target.name {
		src = pods[1]
	}
	d := probeUntil(t, c, src, target.ip, echo.TimedOut, 10*time.Second)
	t.Logf("policy created after the failover enforced in %s", d.Round(time.Millisecond))
	probeUntil(t, c, friend, target.ip, echo.Connected, 10*time.Second)
	if ci := checkControllerInfo(t, c); ci.Status.Leader != newHolder {
		t.Errorf("after the failover the ControllerInfo names %s, the Lease %s", ci.Status.Leader, newHolder)
	}
	_ = np.DeleteCollection(context.Background(), metav1.DeleteOptions{}, metav1.ListOptions{})
}

// TestPolicyFollowsChurn: with a policy in place, a new Pod that it selects
// is isolated from its very first connection (the CNI ADD waited for its
// policies), a new client Pod with the allowed label gets in, a relabelled
// one is cut off, and a recreated Pod with the same name is handled.
func TestPolicyFollowsChurn(t *testing.T) {
	c := shared
	ns := "churn"
	ctx := testCtx(t, 3*time.Minute)
	nodes := c.Nodes()
	if _, err := c.Client().CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Client().CoreV1().Namespaces().Delete(context.Background(), ns, metav1.DeleteOptions{}) })
	if _, err := c.Client().NetworkingV1().NetworkPolicies(ns).Create(ctx,
		allowFrom(ns, "servers", map[string]string{"app": "server"}, map[string]string{"role": "client"}), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	mk := func(name string, labels map[string]string, node int) podRef {
		p, err := c.CreatePod(ctx, sandbox.PodSpec{Namespace: ns, Name: name, Node: nodes[node].Name, Labels: labels, Ports: demoPorts})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = c.DeletePod(context.Background(), ns, name) })
		return podRef{ns: ns, name: name, node: nodes[node].Name, ip: p.Status.PodIP}
	}
	stranger := mk("stranger", map[string]string{"role": "other"}, 0)
	// The server is created after the policy: its first connection attempt
	// from a stranger must already be refused.
	server := mk("server", map[string]string{"app": "server"}, 1)
	if r := c.Probe(ctx, ns, stranger.name, server.ip, tcpPort, corev1.ProtocolTCP, time.Second); r.Outcome != echo.TimedOut { // a policy drops: anything else is no proof
		t.Fatal("a new Pod selected by a policy accepted a connection the policy denies right after it became Ready")
	}
	client := mk("client", map[string]string{"role": "client"}, 2)
	probeUntil(t, c, client, server.ip, echo.Connected, 5*time.Second)
	// Relabel the client: cut off.
	if _, err := c.Client().CoreV1().Pods(ns).Patch(ctx, "client", "application/merge-patch+json",
		[]byte(`{"metadata":{"labels":{"role":"former"}}}`), metav1.PatchOptions{}); err != nil {
		t.Fatal(err)
	}
	d := probeUntil(t, c, client, server.ip, echo.TimedOut, 5*time.Second)
	t.Logf("relabelled client cut off after %s", d.Round(time.Millisecond))
	// Relabel the stranger: let in.
	if _, err := c.Client().CoreV1().Pods(ns).Patch(ctx, "stranger", "application/merge-patch+json",
		[]byte(`{"metadata":{"labels":{"role":"client"}}}`), metav1.PatchOptions{}); err != nil {
		t.Fatal(err)
	}
	d = probeUntil(t, c, stranger, server.ip, echo.Connected, 5*time.Second)
	t.Logf("relabelled stranger let in after %s", d.Round(time.Millisecond))
	// Recreate the server (same name, new Pod): still protected at once.
	if err := c.DeletePod(ctx, ns, "server"); err != nil {
		t.Fatal(err)
	}
	server = mk("server", map[string]string{"app": "server"}, 0)
	if r := c.Probe(ctx, ns, client.name, server.ip, tcpPort, corev1.ProtocolTCP, time.Second); r.Outcome != echo.TimedOut { // a policy drops: anything else is no proof
		t.Fatal("a recreated Pod accepted a denied connection right after it became Ready")
	}
	probeUntil(t, c, stranger, server.ip, echo.Connected, 5*time.Second)
}

// A UDP flow that a policy denies stays denied however many datagrams it
// sends from one socket, through a Service, whose tables commit the flow's
// connection before the policy judges it (and OVS's userspace connection
// tracker, by its source, calls later datagrams established without any
// answer: the policy checks every datagram; this run did not show that
// check to be needed, it guards the property). Both directions: the
// server's ingress (client on the same Node, where the Service commit
// happens) and the client's egress (to a server nothing else protects).
func TestPolicyDeniesRepeatedUDP(t *testing.T) {
	c := shared
	ns := "pol-udp"
	svcPods(t, c, ns, "udpsrv", 1)
	svcPods(t, c, ns, "udpopen", 1)
	near := svcPods(t, c, ns, "near", 1)[0]
	far := svcPods(t, c, ns, "far", 0)[0]
	guarded := createService(t, c, ns, "udpsrv", "udpsrv", nil)
	open := createService(t, c, ns, "udpopen", "udpopen", nil)
	ctx := testCtx(t, time.Minute)
	policies := []*networkingv1.NetworkPolicy{
		// udpsrv admits only Pods labelled friend (none here).
		allowFrom(ns, "server-ingress", map[string]string{"app": "udpsrv"}, map[string]string{"app": "friend"}),
		// far may send nowhere.
		{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "far-egress"},
			Spec: networkingv1.NetworkPolicySpec{PodSelector: metav1.LabelSelector{MatchLabels: map[string]string{"app": "far"}},
				PolicyTypes: []networkingv1.PolicyType{networkingv1.PolicyTypeEgress}}},
	}
	for _, p := range policies {
		if _, err := c.Client().NetworkingV1().NetworkPolicies(ns).Create(ctx, p, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() {
			_ = c.Client().NetworkingV1().NetworkPolicies(ns).Delete(context.Background(), p.Name, metav1.DeleteOptions{})
		})
	}
	// One flow of datagrams from one socket; answered reports whether any
	// of n got an answer.
	answered := func(from podRef, svc *corev1.Service, n int) bool {
		t.Helper()
		conn, err := c.DialNetFrom(ctx, ns, from.name, "udp", svc.Spec.ClusterIP+":53")
		if err != nil {
			t.Fatal(err)
		}
		defer conn.Close()
		buf := make([]byte, 512)
		got := false
		for i := 0; i < n; i++ {
			_ = conn.SetDeadline(time.Now().Add(500 * time.Millisecond))
			if _, err := conn.Write([]byte("probe\n")); err != nil {
				continue // an ICMP error of an earlier datagram
			}
			if _, err := conn.Read(buf); err == nil {
				got = true
			}
		}
		return got
	}
	// The probe works: near reaches the open server's Service.
	eventually(t, 20*time.Second, "near to the open Service", func() error {
		if !answered(near, open, 3) {
			return fmt.Errorf("no answer")
		}
		return nil
	})
	for _, c := range []struct {
		from podRef
		svc  *corev1.Service
	}{{near, guarded}, {far, open}} {
		// The policies are in place once a fresh datagram goes unanswered.
		eventually(t, 20*time.Second, c.from.name+" denied "+c.svc.Name, func() error {
			if answered(c.from, c.svc, 1) {
				return fmt.Errorf("answered")
			}
			return nil
		})
		if answered(c.from, c.svc, 8) {
			t.Errorf("%s to %s: a datagram of one denied flow got through", c.from.name, c.svc.Name)
		}
	}
}

// TestPolicyHairpinSelf: a Pod that a policy without rules isolates both
// ways still reaches itself through a Service it backs, as it reaches its
// own IP (which never leaves its network namespace), while another Pod of
// the same Node is refused through the same Service.
func TestPolicyHairpinSelf(t *testing.T) {
	c := shared
	ns := "pol-hairpin"
	self := svcPods(t, c, ns, "hp", 0)[0]
	other := svcPods(t, c, ns, "other", 0)[0]
	svc := createService(t, c, ns, "self", "hp", nil)
	ctx := testCtx(t, 30*time.Second)
	api := c.Client().NetworkingV1().NetworkPolicies(ns)
	if _, err := api.Create(ctx, &networkingv1.NetworkPolicy{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "isolate"},
		Spec: networkingv1.NetworkPolicySpec{PodSelector: metav1.LabelSelector{MatchLabels: map[string]string{"app": "hp"}},
			PolicyTypes: []networkingv1.PolicyType{networkingv1.PolicyTypeIngress, networkingv1.PolicyTypeEgress}}},
		metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = api.Delete(context.Background(), "isolate", metav1.DeleteOptions{}) })
	probeUntil(t, c, other, self.ip, echo.TimedOut, 15*time.Second)
	if r := probeSvc(t, c, other, svc.Spec.ClusterIP, 80, corev1.ProtocolTCP, time.Second); r.Outcome != echo.TimedOut {
		t.Errorf("another Pod through the Service: %s, want timed out", r)
	}
	for _, pp := range []struct {
		port  int
		proto corev1.Protocol
	}{{80, corev1.ProtocolTCP}, {53, corev1.ProtocolUDP}} {
		if r := probeSvc(t, c, self, svc.Spec.ClusterIP, pp.port, pp.proto, 2*time.Second); r.Outcome != echo.Connected || r.Reply != self.name {
			t.Errorf("the isolated Pod reaching itself through its Service (%s %d): %s", pp.proto, pp.port, r)
		}
	}
}
