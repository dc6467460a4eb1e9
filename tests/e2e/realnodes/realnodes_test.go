package realnodes

import (
	"context"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/apimachinery/pkg/util/wait"

	"github.com/seine-net/seine/deploy"
	"github.com/seine-net/seine/tests/sandbox"
)

// agnhost is the e2e suite's test image, built by `make node-tools` and
// imported into every Node.
const agnhost = "registry.k8s.io/e2e-test-images/agnhost:2.63.0"

// createNamespace creates ns, deleted when the test ends.
func createNamespace(t testing.TB, ns string) {
	t.Helper()
	ctx := testCtx(t, time.Minute)
	_, err := cluster.Client().CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{})
	if err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = cluster.Client().CoreV1().Namespaces().Delete(context.Background(), ns, metav1.DeleteOptions{})
	})
	// The ServiceAccount controller must have created "default" before
	// Pods can be admitted.
	err = wait.PollUntilContextTimeout(ctx, 200*time.Millisecond, 30*time.Second, true, func(ctx context.Context) (bool, error) {
		_, err := cluster.Client().CoreV1().ServiceAccounts(ns).Get(ctx, "default", metav1.GetOptions{})
		return err == nil, nil
	})
	if err != nil {
		t.Fatalf("namespace %s has no default ServiceAccount: %v", ns, err)
	}
}

// deployAgnhost creates a Deployment of replicas agnhost Pods labelled
// labels, running args, spread over the Nodes, and returns its Pods once
// all are Running and Ready.
func deployAgnhost(t testing.TB, ns, name string, replicas int32, labels map[string]string, args ...string) []corev1.Pod {
	t.Helper()
	ctx := testCtx(t, 3*time.Minute)
	d := &appsv1.Deployment{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name},
		Spec: appsv1.DeploymentSpec{
			Replicas: &replicas,
			Selector: &metav1.LabelSelector{MatchLabels: labels},
			Template: corev1.PodTemplateSpec{
				ObjectMeta: metav1.ObjectMeta{Labels: labels},
				Spec: corev1.PodSpec{
					TerminationGracePeriodSeconds: ptr(int64(1)),
					TopologySpreadConstraints: []corev1.TopologySpreadConstraint{{
						MaxSkew: 1, TopologyKey: corev1.LabelHostname, WhenUnsatisfiable: corev1.DoNotSchedule,
						LabelSelector: &metav1.LabelSelector{MatchLabels: labels},
					}},
					Containers: []corev1.Container{{
						Name: "agnhost", Image: agnhost, ImagePullPolicy: corev1.PullNever, Args: args,
					}},
				},
			},
		},
	}
	if _, err := cluster.Client().AppsV1().Deployments(ns).Create(ctx, d, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	return waitPods(t, ctx, ns, labels, int(replicas))
}

// waitPods waits for n Running, Ready Pods matching labels.
func waitPods(t testing.TB, ctx context.Context, ns string, labels map[string]string, n int) []corev1.Pod {
	t.Helper()
	sel := metav1.FormatLabelSelector(&metav1.LabelSelector{MatchLabels: labels})
	var pods []corev1.Pod
	err := wait.PollUntilContextTimeout(ctx, 500*time.Millisecond, 2*time.Minute, true, func(ctx context.Context) (bool, error) {
		l, err := cluster.Client().CoreV1().Pods(ns).List(ctx, metav1.ListOptions{LabelSelector: sel})
		if err != nil {
			return false, nil
		}
		pods = pods[:0]
		for _, p := range l.Items {
			if p.DeletionTimestamp == nil && p.Status.Phase == corev1.PodRunning && podReady(p) && p.Status.PodIP != "" {
				pods = append(pods, p)
			}
		}
		return len(pods) == n, nil
	})
	if err != nil {
		out, _ := cluster.Kubectl(context.Background(), "get", "pods", "-o", "wide", "-n", ns)
		t.Fatalf("%d Running, Ready Pods %s in %s, want %d: %v\n%s", len(pods), sel, ns, n, err, out)
	}
	return pods
}

func podReady(p corev1.Pod) bool {
	for _, c := range p.Status.Conditions {
		if c.Type == corev1.PodReady {
			return c.Status == corev1.ConditionTrue
		}
	}
	return false
}

func ptr[T any](v T) *T { return &v }

// connect opens a TCP connection from Pod ns/from to addr with agnhost,
// inside the Pod (kubectl exec).
func connect(ctx context.Context, ns, from, addr string) error {
	_, err := cluster.Kubectl(ctx, "exec", "-n", ns, from, "--", "/agnhost", "connect", addr, "--timeout=2s")
	return err
}

// blocked reports whether a connection from the Pod to addr times out, as
// a NetworkPolicy's drop makes it: agnhost connect prints TIMEOUT then. Any
// other failure (refused, kubectl exec failing) is no proof of a policy
// and is returned as an error.
func blocked(ctx context.Context, ns, from, addr string) (bool, error) {
	err := connect(ctx, ns, from, addr)
	switch {
	case err == nil:
		return false, nil
	case strings.Contains(err.Error(), "TIMEOUT"):
		return true, nil
	default:
		return false, err
	}
}

// nodesOf returns the set of Nodes the Pods run on.
func nodesOf(pods []corev1.Pod) map[string]bool {
	out := map[string]bool{}
	for _, p := range pods {
		out[p.Spec.NodeName] = true
	}
	return out
}

// allConnect checks that every Pod reaches every Pod on port.
func allConnect(t *testing.T, pods []corev1.Pod, port int) {
	t.Helper()
	ctx := testCtx(t, 3*time.Minute)
	for _, from := range pods {
		for _, to := range pods {
			addr := fmt.Sprintf("%s:%d", to.Status.PodIP, port)
			if err := connect(ctx, from.Namespace, from.Name, addr); err != nil {
				t.Errorf("%s (%s) -> %s (%s): %v", from.Name, from.Spec.NodeName, to.Name, to.Spec.NodeName, err)
			}
		}
	}
}

// TestInstalledByManifest checks what `kubectl apply -f` of the manifest
// put on every Node: both DaemonSets' Pods ready, the CNI plugin, the
// plugins it relies on and its conflist in the Node's own CNI directories,
// Open vSwitch healthy, every CRD served.
func TestInstalledByManifest(t *testing.T) {
	ctx := testCtx(t, 2*time.Minute)
	for _, name := range []string{"seine", "seine-ovs"} {
		ds, err := cluster.Client().AppsV1().DaemonSets(sandbox.SeineNamespace).Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if ds.Status.NumberReady != 2 || ds.Status.DesiredNumberScheduled != 2 {
			t.Errorf("DaemonSet %s status %+v, want 2 ready", name, ds.Status)
		}
	}
	for _, n := range cluster.Nodes() {
		out, err := cluster.NodeExec(ctx, n.Name, "ls", "/opt/cni/bin", "/etc/cni/net.d")
		if err != nil {
			t.Fatal(err)
		}
		// seine serves hostPorts and shaping itself: no portmap or
		// bandwidth in its conflist, and none installed for it.
		for _, f := range []string{"seine", "loopback", "10-seine.conflist"} {
			if !strings.Contains(string(out), f+"\n") {
				t.Errorf("node %s lacks %s:\n%s", n.Name, f, out)
			}
		}
		// The privileged container sets the Node's conntrack TCP
		// timeouts as kube-proxy would (proxy.conntrack defaults; the
		// Nodes share the machine's kernel, so its table size is not
		// theirs to raise).
		var last string
		err = wait.PollUntilContextTimeout(ctx, 200*time.Millisecond, 30*time.Second, true, func(ctx context.Context) (bool, error) {
			out, err := cluster.NodeExec(ctx, n.Name, "cat", "/proc/sys/net/netfilter/nf_conntrack_tcp_timeout_established",
				"/proc/sys/net/netfilter/nf_conntrack_tcp_timeout_close_wait")
			last = strings.Join(strings.Fields(string(out)), " ")
			return err == nil && last == "86400 3600", nil
		})
		if err != nil {
			t.Errorf("node %s: conntrack TCP established and CLOSE_WAIT timeouts %q, want 86400 3600", n.Name, last)
		}
	}
	for _, app := range []string{"seine", "seine-ovs"} {
		pods, err := cluster.Client().CoreV1().Pods(sandbox.SeineNamespace).List(ctx, metav1.ListOptions{LabelSelector: "app.kubernetes.io/name=" + app})
		if err != nil || len(pods.Items) != 2 {
			t.Fatalf("%s Pods: %v, %v", app, pods, err)
		}
		for _, p := range pods.Items {
			if app == "seine-ovs" {
				if out := kubectl(t, "exec", "-n", sandbox.SeineNamespace, p.Name, "-c", "openvswitch", "--",
					"seine", "ovs", "health", "--config=/etc/seine/seine.yaml"); strings.TrimSpace(out) != "ok" {
					t.Errorf("ovs health in %s: %q", p.Name, out)
				}
			}
			running := runningStatuses(p)
			if len(running) != 1 {
				t.Errorf("%s: containers %v running, want one", p.Name, running)
			}
			for _, cs := range running {
				if !cs.Ready || cs.RestartCount != 0 {
					t.Errorf("%s/%s: ready %v, %d restarts", p.Name, cs.Name, cs.Ready, cs.RestartCount)
				}
			}
		}
	}
	crds, _ := filepath.Glob(filepath.Join(repoRoot(), "deploy", "crds", "*.yaml"))
	out := kubectl(t, "get", "crd", "-o", "name")
	if got := strings.Count(out, ".seine.io"); got != len(crds) {
		t.Errorf("%d seine CRDs served, want %d:\n%s", got, len(crds), out)
	}
}

// TestHostSysctlsUntouched: the kubelets run with protectKernelDefaults
// and read their values from files bind-mounted in their Node's mount
// namespace, so the machine's own settings are what they were.
func TestHostSysctlsUntouched(t *testing.T) {
	for k, before := range hostSysctls {
		b, err := os.ReadFile("/proc/sys/" + k)
		if err != nil {
			t.Fatal(err)
		}
		if now := strings.TrimSpace(string(b)); now != before {
			t.Errorf("host %s is %s, was %s before the real Nodes came up", k, now, before)
		}
	}
	// And each Node sees the kubelet's values.
	ctx := testCtx(t, time.Minute)
	for _, n := range cluster.Nodes() {
		out, err := cluster.NodeExec(ctx, n.Name, "cat", "/proc/sys/vm/overcommit_memory", "/proc/sys/kernel/panic")
		if err != nil || strings.Fields(string(out))[0] != "1" || strings.Fields(string(out))[1] != "10" {
			t.Errorf("node %s sees %q, %v", n.Name, out, err)
		}
	}
}

// TestPodsConnectAcrossNodes: a Deployment's Pods get addresses and reach
// each other on the same Node and across Nodes.
func TestPodsConnectAcrossNodes(t *testing.T) {
	createNamespace(t, "conn")
	labels := map[string]string{"app": "web"}
	pods := deployAgnhost(t, "conn", "web", 4, labels, "netexec", "--http-port=8080")
	if len(nodesOf(pods)) != 2 {
		t.Fatalf("Pods on %v, want both Nodes", nodesOf(pods))
	}
	allConnect(t, pods, 8080)
}

// TestServiceClusterIP: a ClusterIP Service spreads connections over its
// endpoints on both Nodes.
func TestServiceClusterIP(t *testing.T) {
	createNamespace(t, "svc")
	labels := map[string]string{"app": "web"}
	pods := deployAgnhost(t, "svc", "web", 2, labels, "netexec", "--http-port=8080")
	ctx := testCtx(t, 2*time.Minute)
	svc, err := cluster.Client().CoreV1().Services("svc").Create(ctx, &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Name: "web"},
		Spec: corev1.ServiceSpec{Selector: labels, Ports: []corev1.ServicePort{{
			Port: 80, TargetPort: intstr.FromInt32(8080), Protocol: corev1.ProtocolTCP}}},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]bool{}
	for _, p := range pods {
		want[p.Name] = true
	}
	seen := map[string]bool{}
	err = wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, time.Minute, true, func(ctx context.Context) (bool, error) {
		out, err := cluster.Kubectl(ctx, "exec", "-n", "svc", pods[0].Name, "--", "curl", "-s", "-m", "2",
			"http://"+svc.Spec.ClusterIP+"/hostname")
		if err != nil {
			return false, nil
		}
		name := strings.TrimSpace(out)
		if !want[name] {
			return false, fmt.Errorf("answer %q from no endpoint", name)
		}
		seen[name] = true
		return len(seen) == len(want), nil
	})
	if err != nil {
		t.Fatalf("endpoints answering through %s: %v, want %v: %v", svc.Spec.ClusterIP, seen, want, err)
	}
	// By name: the cluster DNS (CoreDNS behind kube-dns, a UDP Service
	// Seine balances) resolves it.
	out, err := cluster.Kubectl(ctx, "exec", "-n", "svc", pods[0].Name, "--", "curl", "-s", "-m", "5",
		"http://web.svc.svc.cluster.local/hostname")
	if err != nil || !want[strings.TrimSpace(out)] {
		t.Errorf("http://web.svc.svc.cluster.local: %q, %v", out, err)
	}
}

// TestNodePortToHostNetworkEndpoints: a NodePort Service whose endpoints
// run on the Nodes' host network answers on every Node, from the external
// host and from a Pod, with each endpoint (the one on the same Node as the
// NodePort the client used, and the one on the other Node); and each Node
// itself reaches both through the ClusterIP.
func TestNodePortToHostNetworkEndpoints(t *testing.T) {
	createNamespace(t, "hostnet")
	labels := map[string]string{"app": "hostnet"}
	ctx := testCtx(t, 3*time.Minute)
	for _, n := range cluster.Nodes() {
		pod := &corev1.Pod{
			ObjectMeta: metav1.ObjectMeta{Name: "hn-" + n.Name, Labels: labels},
			Spec: corev1.PodSpec{NodeName: n.Name, HostNetwork: true, TerminationGracePeriodSeconds: ptr(int64(1)),
				Containers: []corev1.Container{{Name: "agnhost", Image: agnhost, ImagePullPolicy: corev1.PullNever,
					Args: []string{"netexec", "--http-port=18083", "--udp-port=-1"}}}},
		}
		if _, err := cluster.Client().CoreV1().Pods("hostnet").Create(ctx, pod, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	waitPods(t, ctx, "hostnet", labels, 2)
	client := deployAgnhost(t, "hostnet", "client", 1, map[string]string{"app": "client"}, "pause")[0]
	svc, err := cluster.Client().CoreV1().Services("hostnet").Create(ctx, &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Name: "hn"},
		Spec: corev1.ServiceSpec{Type: corev1.ServiceTypeNodePort, Selector: labels, Ports: []corev1.ServicePort{{
			Port: 80, TargetPort: intstr.FromInt32(18083), Protocol: corev1.ProtocolTCP}}},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	np := svc.Spec.Ports[0].NodePort
	for _, n := range cluster.Nodes() {
		url := fmt.Sprintf("http://%s:%d/hostname", n.IP, np)
		for _, from := range []string{"external host", "Pod " + client.Name} {
			seen := map[string]bool{}
			err := wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, time.Minute, true, func(ctx context.Context) (bool, error) {
				var out string
				var err error
				if from == "external host" {
					var b []byte
					b, err = cluster.ExternalExec(ctx, "curl", "-s", "-m", "2", url)
					out = string(b)
				} else {
					out, err = cluster.Kubectl(ctx, "exec", "-n", "hostnet", client.Name, "--", "curl", "-s", "-m", "2", url)
				}
				if err == nil {
					seen[strings.TrimSpace(out)] = true
				}
				return len(seen) == 2, nil
			})
			if err != nil {
				t.Errorf("%s to %s: answered by %v, want both Nodes' host-network endpoints", from, url, seen)
			}
		}
		seen := map[string]bool{}
		url = "http://" + svc.Spec.ClusterIP + "/hostname"
		err := wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, time.Minute, true, func(ctx context.Context) (bool, error) {
			if out, err := cluster.NodeExec(ctx, n.Name, "curl", "-s", "-m", "2", url); err == nil {
				seen[strings.TrimSpace(string(out))] = true
			}
			return len(seen) == 2, nil
		})
		if err != nil {
			t.Errorf("%s itself to %s: answered by %v, want both Nodes' host-network endpoints", n.Name, url, seen)
		}
	}
}

// TestHostPortAndBandwidth: containerd passes a Pod's hostPort and its
// bandwidth annotations to seine (the conflist declares both
// capabilities, no portmap or bandwidth plugin runs): the hostPort answers
// on the Node's address from outside the cluster and from a Pod, the
// Pod's traffic gets a 10 Mbit/s token bucket each way (the host veth,
// and the Pod's eth0), and the egress limit its OpenFlow meter, whose
// drops the daemon exports.
func TestHostPortAndBandwidth(t *testing.T) {
	createNamespace(t, "hostport")
	ctx := testCtx(t, 3*time.Minute)
	n := cluster.Nodes()[0]
	labels := map[string]string{"app": "hostport"}
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "hp", Labels: labels,
			Annotations: map[string]string{"kubernetes.io/ingress-bandwidth": "10M", "kubernetes.io/egress-bandwidth": "10M"}},
		Spec: corev1.PodSpec{NodeName: n.Name, TerminationGracePeriodSeconds: ptr(int64(1)),
			Containers: []corev1.Container{{Name: "agnhost", Image: agnhost, ImagePullPolicy: corev1.PullNever,
				Args:  []string{"netexec", "--http-port=8080", "--udp-port=-1"},
				Ports: []corev1.ContainerPort{{ContainerPort: 8080, HostPort: 30880, Protocol: corev1.ProtocolTCP}}}}},
	}
	if _, err := cluster.Client().CoreV1().Pods("hostport").Create(ctx, pod, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	waitPods(t, ctx, "hostport", labels, 1)
	client := deployAgnhost(t, "hostport", "client", 1, map[string]string{"app": "client"}, "pause")[0]
	url := fmt.Sprintf("http://%s:30880/hostname", n.IP)
	for _, from := range []string{"external host", "Pod " + client.Name} {
		var last string
		err := wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, time.Minute, true, func(ctx context.Context) (bool, error) {
			var out []byte
			var err error
			if from == "external host" {
				out, err = cluster.ExternalExec(ctx, "curl", "-s", "-m", "2", url)
			} else {
				var s string
				s, err = cluster.Kubectl(ctx, "exec", "-n", "hostport", client.Name, "--", "curl", "-s", "-m", "2", url)
				out = []byte(s)
			}
			last = fmt.Sprintf("%q, %v", out, err)
			return err == nil && strings.TrimSpace(string(out)) == "hp", nil
		})
		if err != nil {
			t.Errorf("%s to %s: last answer %s, want hp", from, url, last)
		}
	}
	// Traffic into the Pod: a tbf on its host veth; out of it: one on its
	// eth0, in the Pod's network namespace (containerd's, under
	// /var/run/netns).
	out, err := cluster.NodeExec(ctx, n.Name, "sh", "-c",
		"tc qdisc show; for ns in $(ip netns list | cut -d' ' -f1); do ip netns exec $ns tc qdisc show dev eth0 2>/dev/null; done")
	if err != nil {
		t.Fatalf("tc on %s: %v\n%s", n.Name, err, out)
	}
	if got := strings.Count(string(out), "rate 10Mbit"); got != 2 {
		t.Errorf("%d qdiscs at 10 Mbit/s on %s, want 2 (host veth, Pod eth0):\n%s", got, n.Name, out)
	}
	metrics, err := cluster.NodeExec(ctx, n.Name, "curl", "-s", "-m", "5", fmt.Sprintf("http://%s:9345/metrics", n.IP))
	const meter = `seine_pod_egress_meter_dropped_packets_total{namespace="hostport",pod="hp"} 0`
	if err != nil || !strings.Contains(string(metrics), meter+"\n") {
		t.Errorf("metrics of %s (%v): no %s", n.Name, err, meter)
	}
}

// TestNetworkPolicyEnforced: a policy admits only the client role; lifting
// it admits everyone again.
func TestNetworkPolicyEnforced(t *testing.T) {
	createNamespace(t, "np")
	server := deployAgnhost(t, "np", "server", 1, map[string]string{"app": "server"}, "netexec", "--http-port=8080")[0]
	client := deployAgnhost(t, "np", "client", 1, map[string]string{"role": "client"}, "pause")[0]
	other := deployAgnhost(t, "np", "other", 1, map[string]string{"role": "other"}, "pause")[0]
	ctx := testCtx(t, 2*time.Minute)
	addr := server.Status.PodIP + ":8080"
	port := intstr.FromInt32(8080)
	np := &networkingv1.NetworkPolicy{
		ObjectMeta: metav1.ObjectMeta{Name: "clients-only"},
		Spec: networkingv1.NetworkPolicySpec{
			PodSelector: metav1.LabelSelector{MatchLabels: map[string]string{"app": "server"}},
			PolicyTypes: []networkingv1.PolicyType{networkingv1.PolicyTypeIngress},
			Ingress: []networkingv1.NetworkPolicyIngressRule{{
				From:  []networkingv1.NetworkPolicyPeer{{PodSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"role": "client"}}}},
				Ports: []networkingv1.NetworkPolicyPort{{Port: &port}},
			}},
		},
	}
	if _, err := cluster.Client().NetworkingV1().NetworkPolicies("np").Create(ctx, np, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	// Enforced within seconds: other is refused, client still admitted.
	var last error
	err := wait.PollUntilContextTimeout(ctx, 200*time.Millisecond, 30*time.Second, true, func(ctx context.Context) (bool, error) {
		ok, err := blocked(ctx, "np", other.Name, addr)
		last = err
		return ok, nil
	})
	if err != nil {
		t.Fatalf("%s still reaches %s under the policy (last probe: %v)", other.Name, addr, last)
	}
	if err := connect(ctx, "np", client.Name, addr); err != nil {
		t.Errorf("the admitted client is refused: %v", err)
	}
	if err := cluster.Client().NetworkingV1().NetworkPolicies("np").Delete(ctx, np.Name, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	err = wait.PollUntilContextTimeout(ctx, 200*time.Millisecond, 30*time.Second, true, func(ctx context.Context) (bool, error) {
		return connect(ctx, "np", other.Name, addr) == nil, nil
	})
	if err != nil {
		t.Errorf("%s is still refused after the policy was deleted", other.Name)
	}
}

// restarts sums the restart counts of the Pods' long-running containers.
func restarts(pods []corev1.Pod) map[string]int32 {
	out := map[string]int32{}
	for _, p := range pods {
		for _, cs := range runningStatuses(p) {
			out[p.Name] += cs.RestartCount
		}
	}
	return out
}

// runningStatuses returns the statuses of the Pod's long-running
// containers: its containers and its sidecars (init containers with
// restartPolicy Always), not the init containers that
// ran to completion.
func runningStatuses(p corev1.Pod) []corev1.ContainerStatus {
	sidecar := map[string]bool{}
	for _, c := range p.Spec.InitContainers {
		sidecar[c.Name] = c.RestartPolicy != nil && *c.RestartPolicy == corev1.ContainerRestartPolicyAlways
	}
	out := append([]corev1.ContainerStatus{}, p.Status.ContainerStatuses...)
	for _, cs := range p.Status.InitContainerStatuses {
		if sidecar[cs.Name] {
			out = append(out, cs)
		}
	}
	return out
}

// samePods checks that the Pods are still there, with the same addresses
// and no restarts.
func samePods(t *testing.T, before, after []corev1.Pod) {
	t.Helper()
	ips := map[string]string{}
	for _, p := range after {
		ips[p.Name] = p.Status.PodIP
	}
	ra := restarts(after)
	for name, r := range restarts(before) {
		if ra[name] != r {
			t.Errorf("Pod %s restarted (%d -> %d)", name, r, ra[name])
		}
	}
	for _, p := range before {
		if ips[p.Name] != p.Status.PodIP {
			t.Errorf("Pod %s: address %s, was %s", p.Name, ips[p.Name], p.Status.PodIP)
		}
	}
}

// TestReinstallKeepsPodsConnected: `kubectl delete -f` removes Seine (the
// Nodes keep their own addresses: the seine-ovs Pod's container hands the
// transport device back to the kernel) and a new `kubectl apply -f`
// brings it back; the Pods that ran all along, with their addresses, are
// connected again.
func TestReinstallKeepsPodsConnected(t *testing.T) {
	createNamespace(t, "reinst")
	labels := map[string]string{"app": "web"}
	before := deployAgnhost(t, "reinst", "web", 2, labels, "netexec", "--http-port=8080")
	ctx := testCtx(t, 5*time.Minute)
	kubectl(t, "delete", "-f", cluster.Manifest(), "--wait=true", "--timeout=3m")
	for _, n := range cluster.Nodes() {
		out, err := cluster.NodeExec(ctx, n.Name, "ip", "-4", "-o", "addr", "show", "dev", "eth0")
		if err != nil || !strings.Contains(string(out), n.IP+"/") {
			t.Errorf("node %s does not hold its address on eth0 without Seine: %v\n%s", n.Name, err, out)
		}
	}
	kubectl(t, "apply", "-f", cluster.Manifest())
	if err := cluster.WaitSeineDaemonSet(ctx, 3*time.Minute); err != nil {
		t.Fatal(err)
	}
	after := waitPods(t, ctx, "reinst", labels, 2)
	samePods(t, before, after)
	allConnect(t, after, 8080)
}

// streamPair starts, in namespace ns, an echo Pod on serverNode (HTTP on
// port 8080; a line echo server, busybox nc, on 9000) and on clientNode a
// Pod "stream" that sends a line every 200 ms over one TCP connection to
// it and keeps what comes back. It returns once lines flow, with the echo
// Pod and a count of the lines echoed so far (-1 when it cannot be read).
func streamPair(t *testing.T, ctx context.Context, ns, serverNode, clientNode string) (corev1.Pod, func() int) {
	t.Helper()
	echo := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "echo", Labels: map[string]string{"app": "echo"}},
		Spec: corev1.PodSpec{
			NodeName: serverNode, TerminationGracePeriodSeconds: ptr(int64(1)),
			Containers: []corev1.Container{
				{Name: "http", Image: agnhost, ImagePullPolicy: corev1.PullNever, Args: []string{"netexec", "--http-port=8080"}},
				{Name: "lines", Image: agnhost, ImagePullPolicy: corev1.PullNever,
					Command: []string{"/bin/busybox", "nc", "-ll", "-p", "9000", "-e", "/bin/cat"}},
			},
		},
	}
	if _, err := cluster.Client().CoreV1().Pods(ns).Create(ctx, echo, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	server := waitPods(t, ctx, ns, map[string]string{"app": "echo"}, 1)[0]
	stream := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "stream", Labels: map[string]string{"app": "stream"}},
		Spec: corev1.PodSpec{
			NodeName: clientNode, TerminationGracePeriodSeconds: ptr(int64(1)), RestartPolicy: corev1.RestartPolicyNever,
			Containers: []corev1.Container{{Name: "stream", Image: agnhost, ImagePullPolicy: corev1.PullNever,
				Command: []string{"/bin/sh", "-c", "until /agnhost connect " + server.Status.PodIP + ":9000 --timeout=1s; do sleep 0.2; done; " +
					"i=0; while true; do i=$((i+1)); echo $i; sleep 0.2; done | " +
					"/bin/busybox nc " + server.Status.PodIP + " 9000 > /tmp/echoed"}}},
		},
	}
	if _, err := cluster.Client().CoreV1().Pods(ns).Create(ctx, stream, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	waitPods(t, ctx, ns, map[string]string{"app": "stream"}, 1)
	echoed := func() int {
		out, err := cluster.Kubectl(ctx, "exec", "-n", ns, "stream", "--", "wc", "-l", "/tmp/echoed")
		if err != nil {
			return -1
		}
		n, _ := strconv.Atoi(strings.Fields(out + " x")[0])
		return n
	}
	if err := wait.PollUntilContextTimeout(ctx, 200*time.Millisecond, 30*time.Second, true, func(context.Context) (bool, error) {
		return echoed() > 3, nil
	}); err != nil {
		t.Fatalf("the stream does not flow (%d lines)", echoed())
	}
	return server, echoed
}

// streamGoesOn checks that the stream Pod's connection still carries data:
// five more lines echoed within 30 s.
func streamGoesOn(t *testing.T, ctx context.Context, ns string, echoed func() int, after string) {
	t.Helper()
	before := echoed()
	if before < 0 {
		t.Fatal("reading the stream's echoed lines failed")
	}
	if err := wait.PollUntilContextTimeout(ctx, 200*time.Millisecond, 30*time.Second, true, func(context.Context) (bool, error) {
		return echoed() >= before+5, nil
	}); err != nil {
		t.Errorf("the connection opened before %s no longer carries data: %d lines, then %d", after, before, echoed())
	}
	p, err := cluster.Client().CoreV1().Pods(ns).Get(ctx, "stream", metav1.GetOptions{})
	if err != nil || p.Status.Phase != corev1.PodRunning {
		t.Errorf("stream Pod: %v, %v", p.Status.Phase, err)
	}
}

// outage is what probing saw: probes made and failed, the longest run of
// failures, and the failures the data plane caused (agnhost's TIMEOUT or
// REFUSED; a failing kubectl exec says nothing of the data plane).
type outage struct {
	probes, failures int
	longest          time.Duration
	dropped          []string
}

func (o outage) String() string {
	return fmt.Sprintf("%d of %d probes failed (%d in the data plane), longest outage ~%s",
		o.failures, o.probes, len(o.dropped), o.longest.Round(100*time.Millisecond))
}

// probeUntil opens new connections from Pod ns/from to addr, one after the
// other, until done delivers and then until one succeeds (at most a
// minute more). done's error is returned.
func probeUntil(ctx context.Context, ns, from, addr string, done <-chan error) (outage, error) {
	var o outage
	var current time.Duration
	var doneErr error
	var settle time.Time // when done delivered
	for {
		if settle.IsZero() {
			select {
			case doneErr = <-done:
				settle = time.Now()
				if doneErr != nil {
					return o, doneErr
				}
			default:
			}
		}
		t0 := time.Now()
		o.probes++
		err := connect(ctx, ns, from, addr)
		if err == nil {
			current = 0
			if !settle.IsZero() {
				return o, nil
			}
			continue
		}
		o.failures++
		if msg := err.Error(); strings.Contains(msg, "TIMEOUT") || strings.Contains(msg, "REFUSED") {
			o.dropped = append(o.dropped, time.Now().Format("15:04:05.000")+" "+msg)
		}
		current += time.Since(t0)
		o.longest = max(o.longest, current)
		if (!settle.IsZero() && time.Since(settle) > time.Minute) || ctx.Err() != nil {
			return o, nil
		}
	}
}

// seinePods returns the Pods of one of Seine's DaemonSets (app: seine or
// seine-ovs) by Node, each as "<name> uid <uid>, <n> restarts".
func seinePods(t *testing.T, ctx context.Context, app string) map[string]string {
	t.Helper()
	pods, err := cluster.Client().CoreV1().Pods(sandbox.SeineNamespace).List(ctx, metav1.ListOptions{LabelSelector: "app.kubernetes.io/name=" + app})
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]string{}
	for _, p := range pods.Items {
		if p.DeletionTimestamp != nil {
			continue // an old Pod still terminating
		}
		out[p.Spec.NodeName] = fmt.Sprintf("%s uid %s, %d restarts", p.Name, p.UID, restarts([]corev1.Pod{p})[p.Name])
	}
	return out
}

// TestRollingUpdateKeepsPodsConnected: a new image tag rolls the seine
// DaemonSet over the Nodes one by one while Open vSwitch (DaemonSet
// seine-ovs, OnDelete) keeps running and forwarding, on the userspace
// datapath too: new connections between Pods on different Nodes succeed
// throughout, a TCP connection opened before the update is still carrying
// data after it, every seine Pod runs the new image, and no seine-ovs Pod
// was replaced.
func TestRollingUpdateKeepsPodsConnected(t *testing.T) {
	createNamespace(t, "roll")
	ctx := testCtx(t, 6*time.Minute)
	nodes := cluster.Nodes()
	server, echoed := streamPair(t, ctx, "roll", nodes[0].Name, nodes[1].Name)
	ovsBefore := seinePods(t, ctx, "seine-ovs")

	image := deploy.ImageRepository + ":" + deploy.ImageTag + "-next"
	for _, n := range cluster.Nodes() {
		if out, err := cluster.NodeCtr(ctx, n.Name, "images", "tag", "--force", deploy.DefaultValues().Image, image); err != nil {
			t.Fatalf("tag the image on %s: %v\n%s", n.Name, err, out)
		}
	}
	kubectl(t, "-n", sandbox.SeineNamespace, "set", "image", "daemonset/seine", "*="+image)
	done := make(chan error, 1)
	go func() {
		_, err := cluster.Kubectl(ctx, "-n", sandbox.SeineNamespace, "rollout", "status", "daemonset/seine", "--timeout=4m")
		done <- err
	}()
	o, err := probeUntil(ctx, "roll", "stream", server.Status.PodIP+":8080", done)
	if err != nil {
		t.Fatalf("rollout: %v", err)
	}
	t.Logf("during the rolling update: %s", o)
	if len(o.dropped) > 0 {
		t.Errorf("%d new connections failed in the data plane during the update:\n%s", len(o.dropped), strings.Join(o.dropped, "\n"))
	}
	if err := cluster.WaitSeineDaemonSet(ctx, 3*time.Minute); err != nil {
		t.Fatal(err)
	}
	streamGoesOn(t, ctx, "roll", echoed, "the update")
	// Every seine Pod runs the new image, and a new connection crosses
	// the Nodes.
	seine, err := cluster.Client().CoreV1().Pods(sandbox.SeineNamespace).List(ctx, metav1.ListOptions{LabelSelector: "app.kubernetes.io/name=seine"})
	if err != nil {
		t.Fatal(err)
	}
	running := 0
	for _, sp := range seine.Items {
		if sp.DeletionTimestamp != nil {
			continue // an old Pod still terminating
		}
		running++
		for _, ctr := range append(sp.Spec.InitContainers, sp.Spec.Containers...) {
			if ctr.Image != image {
				t.Errorf("%s container %s runs %s, want %s", sp.Name, ctr.Name, ctr.Image, image)
			}
		}
	}
	if running != len(nodes) {
		t.Errorf("%d seine Pods after the update, want one per Node (%d)", running, len(nodes))
	}
	if after := seinePods(t, ctx, "seine-ovs"); !maps.Equal(after, ovsBefore) {
		t.Errorf("seine-ovs Pods %v before the update, %v after: Open vSwitch was replaced", ovsBefore, after)
	}
	var lastErr error
	if err := wait.PollUntilContextTimeout(ctx, 500*time.Millisecond, 15*time.Second, true, func(ctx context.Context) (bool, error) {
		lastErr = connect(ctx, "roll", "stream", server.Status.PodIP+":8080")
		return lastErr == nil, nil
	}); err != nil {
		t.Errorf("stream (%s) -> echo (%s) after the update: %v", nodes[1].Name, nodes[0].Name, lastErr)
	}
}

// TestOVSReplacedUnderSeine: deleting a Node's seine-ovs Pod, the way to
// upgrade Open vSwitch (docs/install.md), gives the Node a new Open
// vSwitch under its running seine daemon. The old Pod's container sees
// that the daemon stays (no wait for it to stop), the seine Pods are
// neither replaced nor restarted, the Node keeps its own address, the TCP
// connection opened before carries data after, and new connections
// across the Nodes succeed again. On the userspace datapath the Node's
// Pods pause meanwhile: the test reports the outage, and fails only if
// connections never come back.
func TestOVSReplacedUnderSeine(t *testing.T) {
	createNamespace(t, "ovsup")
	ctx := testCtx(t, 6*time.Minute)
	nodes := cluster.Nodes()
	server, echoed := streamPair(t, ctx, "ovsup", nodes[0].Name, nodes[1].Name)
	seineBefore, ovsBefore := seinePods(t, ctx, "seine"), seinePods(t, ctx, "seine-ovs")
	old := strings.Fields(ovsBefore[nodes[0].Name] + " x")[0]
	if old == "x" {
		t.Fatalf("no seine-ovs Pod on %s: %v", nodes[0].Name, ovsBefore)
	}
	// The old container's log, to its end: the Pod is gone afterwards.
	logs := make(chan string, 1)
	go func() {
		out, _ := cluster.Kubectl(ctx, "-n", sandbox.SeineNamespace, "logs", "-f", old, "-c", "openvswitch", "--since=1s")
		logs <- out
	}()
	time.Sleep(time.Second) // kubectl logs -f attached
	done := make(chan error, 1)
	go func() {
		if _, err := cluster.Kubectl(ctx, "-n", sandbox.SeineNamespace, "delete", "pod", old, "--wait=true", "--timeout=3m"); err != nil {
			done <- fmt.Errorf("delete pod %s: %w", old, err)
			return
		}
		done <- cluster.WaitSeineDaemonSet(ctx, 3*time.Minute)
	}()
	o, err := probeUntil(ctx, "ovsup", "stream", server.Status.PodIP+":8080", done)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("Open vSwitch replaced on %s: %s", nodes[0].Name, o)
	if out := <-logs; !strings.Contains(out, "the seine daemon keeps running") {
		t.Errorf("the old openvswitch container did not see the seine daemon stay; its log:\n%s", out)
	}
	ovsAfter := seinePods(t, ctx, "seine-ovs")
	if ovsAfter[nodes[0].Name] == ovsBefore[nodes[0].Name] || ovsAfter[nodes[1].Name] != ovsBefore[nodes[1].Name] {
		t.Errorf("seine-ovs Pods %v before, %v after: want only %s's replaced", ovsBefore, ovsAfter, nodes[0].Name)
	}
	if after := seinePods(t, ctx, "seine"); !maps.Equal(after, seineBefore) {
		t.Errorf("seine Pods %v before, %v after: want them untouched", seineBefore, after)
	}
	out, err := cluster.NodeExec(ctx, nodes[0].Name, "ip", "-4", "-o", "addr", "show")
	if err != nil || !strings.Contains(string(out), " "+nodes[0].IP+"/") {
		t.Errorf("node %s lost its address: %v\n%s", nodes[0].Name, err, out)
	}
	streamGoesOn(t, ctx, "ovsup", echoed, "Open vSwitch was replaced")
	var lastErr error
	if err := wait.PollUntilContextTimeout(ctx, 500*time.Millisecond, 30*time.Second, true, func(ctx context.Context) (bool, error) {
		lastErr = connect(ctx, "ovsup", "stream", server.Status.PodIP+":8080")
		return lastErr == nil, nil
	}); err != nil {
		t.Errorf("stream (%s) -> echo (%s) after Open vSwitch was replaced: %v", nodes[1].Name, nodes[0].Name, lastErr)
	}
}
