package sandbox

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/vishvananda/netlink"
	"go.uber.org/zap/zaptest"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/seine-net/seine/tests/sandbox/kubelet"
)

// sandboxBin is the sandbox CLI built by TestMain (it runs the kubelets).
var sandboxBin string

func TestMain(m *testing.M) {
	os.Exit(func() int {
		if os.Geteuid() != 0 {
			fmt.Println("sandbox tests need root; skipping")
			return 0
		}
		dir, err := os.MkdirTemp("", "sandbox-bin")
		if err != nil {
			fmt.Println(err)
			return 1
		}
		defer os.RemoveAll(dir)
		sandboxBin = filepath.Join(dir, "sandbox")
		cmd := exec.Command("go", "build", "-o", sandboxBin, "github.com/seine-net/seine/tests/cmd/sandbox")
		cmd.Stdout, cmd.Stderr = os.Stdout, os.Stderr
		if err := cmd.Run(); err != nil {
			fmt.Println("build sandbox CLI:", err)
			return 1
		}
		return m.Run()
	}())
}

func k8sBinDir(t *testing.T) string {
	d := os.Getenv("SEINE_K8S_BIN")
	if d == "" {
		d = "/root/.cache/seine/k8s-v1.36.3/bin"
	}
	if _, err := os.Stat(filepath.Join(d, "kube-apiserver")); err != nil {
		t.Skipf("control-plane binaries missing in %s (run `make control-plane`): %v", d, err)
	}
	return d
}

// up starts a bridge-mode sandbox and registers Down plus a cleanliness
// check with t.Cleanup.
func up(t *testing.T, name string, nodes int, hostLink bool) *Cluster {
	t.Helper()
	bin := k8sBinDir(t)
	_ = Down(name, "") // leftovers of an earlier interrupted run
	t.Cleanup(func() {
		if t.Failed() {
			dumpLogs(t, name)
		}
		if err := Down(name, ""); err != nil {
			t.Errorf("down: %v", err)
		}
		assertClean(t, name)
	})
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	c, err := Up(ctx, Options{
		Name: name, Nodes: nodes, CNIMode: CNIModeBridge, SandboxBinary: sandboxBin,
		K8sBinDir: bin, HostLink: hostLink, Log: zaptest.NewLogger(t),
	})
	if err != nil {
		t.Fatalf("up: %v", err)
	}
	return c
}

func dumpLogs(t *testing.T, name string) {
	dir := StateDir(name, "")
	files, _ := filepath.Glob(filepath.Join(dir, "n*", "kubelet.log"))
	for _, f := range files {
		t.Logf("%s:\n%s", f, tail(f, 40))
	}
}

// assertClean checks that nothing of sandbox name is left on the machine.
func assertClean(t *testing.T, name string) {
	t.Helper()
	dir := StateDir(name, "")
	if ns := listNetNS(name); len(ns) > 0 {
		t.Errorf("namespaces left: %v", ns)
	}
	entries, _ := os.ReadDir("/run/netns")
	for _, e := range entries {
		if strings.HasPrefix(e.Name(), "seine-"+name+"-") {
			t.Errorf("netns file left: %s", e.Name())
		}
	}
	for _, pid := range processesMentioning(dir) {
		if alive(pid) {
			t.Errorf("process left: %d %v", pid, cmdlineOf(pid))
		}
	}
	if _, err := netlink.LinkByName(hostLinkName(name)); err == nil {
		t.Errorf("host link %s left", hostLinkName(name))
	}
	if _, err := os.Stat(dir); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("state dir %s left (stat: %v)", dir, err)
	}
}

func TestBridgeSandbox(t *testing.T) {
	const name = "gtbridge"
	c := up(t, name, 2, false)
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	cs := c.Client()

	// Nodes: Ready, distinct podCIDRs inside the cluster range, InternalIP.
	nodes := c.Nodes()
	if len(nodes) != 2 {
		t.Fatalf("want 2 nodes, got %d", len(nodes))
	}
	cidrs := map[string]bool{}
	for _, n := range nodes {
		obj, err := cs.CoreV1().Nodes().Get(ctx, n.Name, metav1.GetOptions{})
		if err != nil {
			t.Fatalf("get node %s: %v", n.Name, err)
		}
		if !nodeReady(obj) {
			t.Errorf("node %s not Ready", n.Name)
		}
		if !strings.HasPrefix(obj.Spec.PodCIDR, "10.244.") || cidrs[obj.Spec.PodCIDR] {
			t.Errorf("node %s podCIDR %q: want a distinct 10.244.x.0/24", n.Name, obj.Spec.PodCIDR)
		}
		cidrs[obj.Spec.PodCIDR] = true
		if len(obj.Status.Addresses) == 0 || obj.Status.Addresses[0].Address != n.IP {
			t.Errorf("node %s addresses %v: want InternalIP %s", n.Name, obj.Status.Addresses, n.IP)
		}
		if _, err := cs.CoordinationV1().Leases(corev1.NamespaceNodeLease).Get(ctx, n.Name, metav1.GetOptions{}); err != nil {
			t.Errorf("lease of %s: %v", n.Name, err)
		}
	}

	ports := []Port{{Name: "http", Port: 80, Protocol: corev1.ProtocolTCP}, {Port: 53, Protocol: corev1.ProtocolUDP}}
	a, err := c.CreatePod(ctx, PodSpec{Namespace: "gt", Name: "a", Node: nodes[0].Name, Ports: ports, Labels: map[string]string{"app": "a"}})
	if err != nil {
		t.Fatalf("create a: %v", err)
	}
	if _, err := c.CreatePod(ctx, PodSpec{Namespace: "gt", Name: "b", Node: "1", Ports: ports}); err != nil {
		t.Fatalf("create b: %v", err)
	}
	// Scheduled by kube-scheduler.
	s, err := c.CreatePod(ctx, PodSpec{Namespace: "gt", Name: "sched", Ports: ports})
	if err != nil {
		t.Fatalf("create sched: %v", err)
	}
	if s.Spec.NodeName == "" || s.Status.HostIP == "" {
		t.Errorf("scheduled pod: node %q hostIP %q", s.Spec.NodeName, s.Status.HostIP)
	}
	d, err := c.CreatePod(ctx, PodSpec{Namespace: "gt", Name: "d", Node: nodes[1].Name, Ports: ports})
	if err != nil {
		t.Fatalf("create d: %v", err)
	}
	if a.Status.HostIP != nodes[0].IP || d.Status.HostIP != nodes[1].IP {
		t.Errorf("hostIPs %s, %s: want %s, %s", a.Status.HostIP, d.Status.HostIP, nodes[0].IP, nodes[1].IP)
	}

	// CNI ADD failure: without a network configuration the kubelet
	// records a FailedCreatePodSandBox Event and a False
	// PodReadyToStartContainers condition, and retries until it works.
	conf := filepath.Join(nodes[1].CNIConfDir, "10-sandbox-bridge.conflist")
	if err := os.Rename(conf, conf+".off"); err != nil {
		t.Fatal(err)
	}
	type created struct {
		pod *corev1.Pod
		err error
	}
	done := make(chan created, 1)
	go func() {
		p, err := c.CreatePod(ctx, PodSpec{Namespace: "gt", Name: "late", Node: "2", Ports: ports})
		done <- created{p, err}
	}()
	err = waitFor(ctx, 30*time.Second, 200*time.Millisecond, "setup failure recorded", func(ctx context.Context) (bool, error) {
		evs, err := cs.CoreV1().Events("gt").List(ctx, metav1.ListOptions{FieldSelector: "involvedObject.name=late"})
		if err != nil {
			return false, err
		}
		p, err := cs.CoreV1().Pods("gt").Get(ctx, "late", metav1.GetOptions{})
		if err != nil {
			return false, err
		}
		evOK, condOK := false, false
		for _, e := range evs.Items {
			evOK = evOK || (e.Reason == "FailedCreatePodSandBox" && e.Type == corev1.EventTypeWarning)
		}
		for _, cond := range p.Status.Conditions {
			condOK = condOK || (cond.Type == corev1.PodReadyToStartContainers && cond.Status == corev1.ConditionFalse)
		}
		return evOK && condOK, nil
	})
	if err != nil {
		t.Error(err)
	}
	if err := os.Rename(conf+".off", conf); err != nil {
		t.Fatal(err)
	}
	if res := <-done; res.err != nil {
		t.Errorf("pod late after restoring the CNI config: %v", res.err)
	}
	if left := listNetNS(name); len(left) != 3+2+5 {
		t.Errorf("namespaces %v: want underlay, cp, ext, 2 nodes and 5 pods", left)
	}

	// Same-Node probes from b to a.
	aIP := a.Status.PodIP
	if r := c.Probe(ctx, "gt", "b", aIP, 80, corev1.ProtocolTCP, 2*time.Second); r.Outcome != Connected || r.Reply != "a" {
		t.Errorf("b→a TCP 80: %+v, want connected a", r)
	}
	if r := c.Probe(ctx, "gt", "b", aIP, 53, corev1.ProtocolUDP, 2*time.Second); r.Outcome != Connected || r.Reply != "a" {
		t.Errorf("b→a UDP 53: %+v, want connected a", r)
	}
	if r := c.Probe(ctx, "gt", "b", aIP, 81, corev1.ProtocolTCP, 2*time.Second); r.Outcome != Refused {
		t.Errorf("b→a TCP 81: %+v, want refused", r)
	}
	if r := c.Probe(ctx, "gt", "b", aIP, 54, corev1.ProtocolUDP, 2*time.Second); r.Outcome != Refused {
		t.Errorf("b→a UDP 54: %+v, want refused", r)
	}

	// Exec runs inside the Pod's namespace: its eth0 carries the Pod IP.
	out, err := c.Exec(ctx, "gt", "a", "ip", "-4", "-o", "addr", "show", "dev", "eth0")
	if err != nil || !strings.Contains(string(out), aIP+"/") {
		t.Errorf("exec in a: %q, %v; want address %s", out, err, aIP)
	}
	out, err = c.NodeExec(ctx, nodes[1].Name, "ip", "-4", "-o", "addr", "show", "dev", "eth0")
	if err != nil || !strings.Contains(string(out), nodes[1].IP+"/24") {
		t.Errorf("exec on node 2: %q, %v", out, err)
	}

	// The external host answers Nodes (underlay routing) but has no route
	// back to Pod addresses, which bridge mode does not SNAT.
	extNS, extIP := c.ExternalHost()
	srv, err := c.Serve(extNS, "internet", []Port{{Port: 8080, Protocol: corev1.ProtocolTCP}})
	if err != nil {
		t.Fatalf("serve on external host: %v", err)
	}
	defer srv.Close()
	if r := c.ProbeFrom(ctx, nodes[1].NetNS, extIP, 8080, corev1.ProtocolTCP, 2*time.Second); r.Outcome != Connected || r.Reply != "internet" {
		t.Errorf("node 2→external: %+v, want connected internet", r)
	}
	if r := c.ProbeFrom(ctx, extNS, nodes[0].IP, 9, corev1.ProtocolTCP, 2*time.Second); r.Outcome != Refused {
		t.Errorf("external→node 1 closed port: %+v, want refused", r)
	}
	if r := c.Probe(ctx, "gt", "a", extIP, 8080, corev1.ProtocolTCP, time.Second); r.Outcome != TimedOut {
		t.Errorf("pod a→external without SNAT: %+v, want timed out", r)
	}

	// Kubelet restart: a Pod deleted while its kubelet is down is torn down
	// when the kubelet comes back; the surviving Pod gets its servers back.
	n1 := nodes[0]
	bState, err := c.PodState("gt", "b")
	if err != nil {
		t.Fatal(err)
	}
	kpid := readPid(filepath.Join(n1.Dir, "kubelet.pid"))
	if kpid <= 0 { // kill(2) of pid 0 would hit the test's whole process group
		t.Fatalf("no kubelet pid in %s", filepath.Join(n1.Dir, "kubelet.pid"))
	}
	if err := syscall.Kill(kpid, syscall.SIGKILL); err != nil {
		t.Fatalf("kill kubelet: %v", err)
	}
	if err := waitFor(ctx, 10*time.Second, 50*time.Millisecond, "kubelet exit", func(context.Context) (bool, error) { return !alive(kpid), nil }); err != nil {
		t.Fatal(err)
	}
	if r := c.ProbeFrom(ctx, n1.NetNS, aIP, 80, corev1.ProtocolTCP, time.Second); r.Outcome != Refused {
		t.Errorf("a's server with its kubelet dead: %+v, want refused", r)
	}
	if err := cs.CoreV1().Pods("gt").Delete(ctx, "b", metav1.DeleteOptions{}); err != nil {
		t.Fatalf("delete b: %v", err)
	}
	if err := c.startKubelet(&n1); err != nil {
		t.Fatalf("restart kubelet: %v", err)
	}
	err = waitFor(ctx, 60*time.Second, 200*time.Millisecond, "b torn down", func(ctx context.Context) (bool, error) {
		_, err := cs.CoreV1().Pods("gt").Get(ctx, "b", metav1.GetOptions{})
		if !apierrors.IsNotFound(err) {
			return false, fmt.Errorf("pod b: %v", err)
		}
		_, err = os.Stat(netnsPath(bState.NetNS))
		return errors.Is(err, os.ErrNotExist), nil
	})
	if err != nil {
		t.Error(err)
	}
	if _, err := c.PodState("gt", "b"); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("state file of b: %v, want not exist", err)
	}
	err = waitFor(ctx, 30*time.Second, 200*time.Millisecond, "a served again", func(ctx context.Context) (bool, error) {
		r := c.ProbeFrom(ctx, n1.NetNS, aIP, 80, corev1.ProtocolTCP, time.Second)
		return r.Outcome == Connected && r.Reply == "a", nil
	})
	if err != nil {
		t.Error(err)
	}

	// DeletePod removes the object, the namespace and the state file.
	aState, err := c.PodState("gt", "a")
	if err != nil {
		t.Fatal(err)
	}
	if aState.NetNS != kubelet.PodNetNSName(name, string(a.UID)) {
		t.Errorf("a's netns %q, want %q", aState.NetNS, kubelet.PodNetNSName(name, string(a.UID)))
	}
	if err := c.DeletePod(ctx, "gt", "a"); err != nil {
		t.Fatalf("delete a: %v", err)
	}
	if _, err := os.Stat(netnsPath(aState.NetNS)); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("netns of a after DeletePod: %v", err)
	}
	if _, err := c.PodState("gt", "a"); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("state file of a: %v, want not exist", err)
	}

	// Load sees the same sandbox.
	l, err := Load(name, "")
	if err != nil {
		t.Fatalf("load: %v", err)
	}
	if len(l.Nodes()) != 2 || l.Kubeconfig() != c.Kubeconfig() {
		t.Errorf("loaded sandbox differs: %+v", l.Nodes())
	}
	if _, err := l.Client().CoreV1().Pods("gt").Get(ctx, "d", metav1.GetOptions{}); err != nil {
		t.Errorf("loaded client: %v", err)
	}

	// Down, then the cleanup's checks: nothing left.
	if err := Down(name, ""); err != nil {
		t.Fatalf("down: %v", err)
	}
	assertClean(t, name)
}

func TestCrashThenDown(t *testing.T) {
	const name = "gtcrash"
	// The host link uses fixed addresses: only test it when no other
	// sandbox holds them.
	hostLink := true
	if addrs, err := netlink.AddrList(nil, netlink.FAMILY_V4); err == nil {
		for _, a := range addrs {
			if a.IP.String() == "198.18.255.1" {
				hostLink = false
			}
		}
	}
	c := up(t, name, 1, hostLink)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	if hostLink {
		rc, err := clientcmd.BuildConfigFromFlags("", c.Kubeconfig())
		if err != nil {
			t.Fatal(err)
		}
		hc, err := kubernetes.NewForConfig(rc)
		if err != nil {
			t.Fatal(err)
		}
		nl, err := hc.CoreV1().Nodes().List(ctx, metav1.ListOptions{})
		if err != nil || len(nl.Items) != 1 {
			t.Errorf("host kubeconfig over the host link: %v, %v", nl, err)
		}
	}
	if _, err := c.CreatePod(ctx, PodSpec{Namespace: "default", Name: "p", Ports: []Port{{Port: 80}}}); err != nil {
		t.Fatalf("create pod: %v", err)
	}

	// Crash: SIGKILL every process of the sandbox, leave all else behind.
	var pids []int
	for _, ns := range listNetNS(name) {
		pids = append(pids, netnsPids(ctx, ns)...)
	}
	pids = append(pids, processesMentioning(c.StateDir())...)
	if len(pids) < 5 {
		t.Fatalf("found only %d sandbox processes: %v", len(pids), pids)
	}
	self := protected() // never this test process or its parents
	for _, pid := range pids {
		if !self[pid] {
			_ = syscall.Kill(pid, syscall.SIGKILL)
		}
	}
	if err := waitFor(ctx, 10*time.Second, 50*time.Millisecond, "killed processes", func(context.Context) (bool, error) {
		for _, pid := range pids {
			if !self[pid] && alive(pid) {
				return false, nil
			}
		}
		return true, nil
	}); err != nil {
		t.Fatal(err)
	}
	if len(listNetNS(name)) < 5 {
		t.Fatalf("expected namespaces to survive the crash, have %v", listNetNS(name))
	}
	if err := Down(name, ""); err != nil {
		t.Fatalf("down after crash: %v", err)
	}
	assertClean(t, name)
}
