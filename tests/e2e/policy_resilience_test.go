package e2e

import (
	"context"
	"fmt"
	"os"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/seine-net/seine/tests/sandbox"
	"github.com/seine-net/seine/tests/sandbox/echo"
)

// policyNamespace creates ns with a policy letting only role=client into
// app=server Pods, and returns a Pod constructor whose Pods are deleted
// with the test.
func policyNamespace(t *testing.T, c *sandbox.Cluster, ns string) func(name string, labels map[string]string, node int) podRef {
	t.Helper()
	ctx := testCtx(t, time.Minute)
	if _, err := c.Client().CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Client().CoreV1().Namespaces().Delete(context.Background(), ns, metav1.DeleteOptions{}) })
	if _, err := c.Client().NetworkingV1().NetworkPolicies(ns).Create(ctx,
		allowFrom(ns, "servers", map[string]string{"app": "server"}, map[string]string{"role": "client"}), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	nodes := c.Nodes()
	return func(name string, labels map[string]string, node int) podRef {
		t.Helper()
		p, err := c.CreatePod(testCtx(t, time.Minute), sandbox.PodSpec{Namespace: ns, Name: name, Node: nodes[node].Name, Labels: labels, Ports: demoPorts})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = c.DeletePod(context.Background(), ns, name) })
		return podRef{ns: ns, name: name, node: nodes[node].Name, ip: p.Status.PodIP}
	}
}

// A Pod created right after its Node's daemon restarted is protected by
// the policies selecting it from its first packet: the CNI ADD waits for
// the restarted agent to realize them.
func TestPolicyInPlaceRightAfterRestart(t *testing.T) {
	c := shared
	mk := policyNamespace(t, c, "pol-restart")
	client := mk("client", map[string]string{"role": "client"}, 1)
	stranger := mk("stranger", map[string]string{"role": "other"}, 2)
	node := c.Nodes()[0]
	stopSeine(t, c, node.Name)
	if err := c.StartSeine(testCtx(t, time.Minute), node.Name, nil); err != nil {
		t.Fatal(err)
	}
	server := mk("server", map[string]string{"app": "server"}, 0)
	if r := c.Probe(testCtx(t, 10*time.Second), stranger.ns, stranger.name, server.ip, tcpPort, corev1.ProtocolTCP, time.Second); r.Outcome != echo.TimedOut { // a policy drops: anything else is no proof
		t.Fatal("a Pod created right after a daemon restart accepted a connection its policy denies")
	}
	d := probeUntil(t, c, client, server.ip, echo.Connected, 5*time.Second)
	t.Logf("allowed client connected %s after the Pod was Ready", d.Round(time.Millisecond))
}

// apiserverPid finds the sandbox's kube-apiserver process.
func apiserverPid(t *testing.T, c *sandbox.Cluster) int {
	t.Helper()
	entries, _ := os.ReadDir("/proc")
	dir := c.ControlPlane().StateDir()
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		b, err := os.ReadFile("/proc/" + e.Name() + "/cmdline")
		if err != nil {
			continue
		}
		argv := strings.Split(string(b), "\x00")
		if strings.HasSuffix(argv[0], "kube-apiserver") && strings.Contains(string(b), dir) {
			return pid
		}
	}
	t.Fatalf("no kube-apiserver process of %s", dir)
	return 0
}

// With the API server frozen (SIGSTOP: connections hang, as in a network
// partition), every Node keeps enforcing what it has; once it is back, the
// agents resume their watches and follow a change.
func TestPolicySurvivesAPIServerOutage(t *testing.T) {
	c := shared
	mk := policyNamespace(t, c, "pol-outage")
	server := mk("server", map[string]string{"app": "server"}, 0)
	client := mk("client", map[string]string{"role": "client"}, 1)
	stranger := mk("stranger", map[string]string{"role": "other"}, 2)
	probeUntil(t, c, client, server.ip, echo.Connected, 5*time.Second)
	probeUntil(t, c, stranger, server.ip, echo.TimedOut, 5*time.Second)

	pid := apiserverPid(t, c)
	if err := syscall.Kill(pid, syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	resumed := false
	resume := func() {
		if !resumed {
			resumed = true
			_ = syscall.Kill(pid, syscall.SIGCONT)
		}
	}
	t.Cleanup(resume)
	for i := 0; i < 5; i++ {
		time.Sleep(time.Second)
		ctx := testCtx(t, 10*time.Second)
		if r := c.Probe(ctx, client.ns, client.name, server.ip, tcpPort, corev1.ProtocolTCP, time.Second); r.Outcome != echo.Connected {
			t.Errorf("API server down %ds: allowed client got %s", i+1, r)
		}
		if r := c.Probe(ctx, stranger.ns, stranger.name, server.ip, tcpPort, corev1.ProtocolTCP, time.Second); r.Outcome != echo.TimedOut { // a policy drops: anything else is no proof
			t.Errorf("API server down %ds: denied stranger connected", i+1)
		}
	}
	resume()
	resumedAt := time.Now()
	ctx := testCtx(t, time.Minute)
	var err error
	for i := 0; i < 60; i++ { // the API server needs a moment to answer again
		if _, err = c.Client().CoreV1().Pods(stranger.ns).Patch(ctx, stranger.name, "application/merge-patch+json",
			[]byte(`{"metadata":{"labels":{"role":"client"}}}`), metav1.PatchOptions{}); err == nil {
			break
		}
		time.Sleep(500 * time.Millisecond)
	}
	if err != nil {
		t.Fatal(err)
	}
	d := probeUntil(t, c, stranger, server.ip, echo.Connected, 30*time.Second)
	t.Logf("after the outage, a relabel was enforced in %s", d.Round(time.Millisecond))
	// Leave a healthy controller behind: its Lease renewed after the
	// outage (a renewal sent while the API server was frozen lands late
	// with an old renewTime, which would skew the next test's timings).
	eventually(t, 30*time.Second, "the controller Lease renewed after the outage", func() error {
		l, err := c.Client().CoordinationV1().Leases(sandbox.SeineNamespace).Get(testCtx(t, 5*time.Second), "seine-controller", metav1.GetOptions{})
		if err != nil {
			return err
		}
		if l.Spec.RenewTime == nil || !l.Spec.RenewTime.Time.After(resumedAt.Add(time.Second)) {
			return fmt.Errorf("last renewal %v, resumed at %v", l.Spec.RenewTime, resumedAt)
		}
		return nil
	})
}
