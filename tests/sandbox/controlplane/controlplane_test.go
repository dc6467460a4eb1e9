package controlplane

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"go.uber.org/zap/zaptest"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
)

// binDir returns where the Kubernetes binaries are expected: $SEINE_K8S_BIN
// or the cache the tools module builds into.
func binDir() string {
	if d := os.Getenv("SEINE_K8S_BIN"); d != "" {
		return d
	}
	return "/root/.cache/seine/k8s-v1.36.3/bin"
}

func run(t *testing.T, name string, args ...string) {
	t.Helper()
	if out, err := exec.Command(name, args...).CombinedOutput(); err != nil {
		t.Fatalf("%s %v: %v: %s", name, args, err, out)
	}
}

// newNetNS creates a network namespace with lo up and 198.18.0.1/32 on lo,
// deleted at cleanup.
func newNetNS(t *testing.T) string {
	t.Helper()
	b := make([]byte, 4)
	_, _ = rand.Read(b)
	name := "seine-cp-" + hex.EncodeToString(b)
	run(t, "ip", "netns", "add", name)
	t.Cleanup(func() {
		if out, err := exec.Command("ip", "netns", "delete", name).CombinedOutput(); err != nil {
			t.Errorf("ip netns delete %s: %v: %s", name, err, out)
		}
	})
	run(t, "ip", "-n", name, "link", "set", "lo", "up")
	run(t, "ip", "-n", name, "addr", "add", "198.18.0.1/32", "dev", "lo")
	return name
}

const rbacManifest = `
apiVersion: v1
kind: Namespace
metadata:
  name: seine-apply-test
---
apiVersion: v1
kind: ConfigMap
metadata:
  name: cm
  namespace: seine-apply-test
data:
  k: v
---
# empty document below is skipped
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRole
metadata:
  name: seine-test-secret-reader
rules:
- apiGroups: [""]
  resources: ["secrets"]
  verbs: ["get", "list", "watch"]
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRoleBinding
metadata:
  name: seine-test-secret-reader
roleRef:
  apiGroup: rbac.authorization.k8s.io
  kind: ClusterRole
  name: seine-test-secret-reader
subjects:
- kind: ServiceAccount
  name: agent
  namespace: seine-test
`

func TestControlPlane(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root (network namespaces)")
	}
	for _, n := range []string{"kube-apiserver", "kube-controller-manager", "kube-scheduler"} {
		if _, err := os.Stat(filepath.Join(binDir(), n)); err != nil {
			t.Skipf("Kubernetes binaries not found in %s (build them with the tests/tools module or set SEINE_K8S_BIN): %v", binDir(), err)
		}
	}
	if _, err := findBinary(binDir(), "etcd", "v3", "server"); err != nil {
		t.Skipf("etcd binary not found: %v", err)
	}
	ns := newNetNS(t)
	stateDir := filepath.Join(t.TempDir(), "cp")
	t.Cleanup(func() {
		if err := Stop(stateDir); err != nil {
			t.Errorf("Stop at cleanup: %v", err)
		}
	})

	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	t0 := time.Now()
	cp, err := Start(ctx, Config{
		StateDir:         stateDir,
		BinDir:           binDir(),
		NetNS:            ns,
		AdvertiseAddress: "198.18.0.1",
		ExtraSANs:        []string{"198.18.255.2"},
		ClusterCIDR:      "10.244.0.0/16",
		ServiceCIDR:      "10.96.0.0/16",
	}, zaptest.NewLogger(t))
	if err != nil {
		t.Fatalf("Start: %v", err)
	}
	t.Logf("control plane ready after %v", time.Since(t0))

	// Load finds the same control plane.
	loaded, err := Load(stateDir)
	if err != nil {
		t.Fatalf("Load: %v", err)
	}
	if loaded.Server() != "https://198.18.0.1:6443" || loaded.Config().NetNS != ns {
		t.Fatalf("Load: server %q netns %q", loaded.Server(), loaded.Config().NetNS)
	}
	cp = loaded

	rc, err := cp.RESTConfig()
	if err != nil {
		t.Fatal(err)
	}
	admin := kubernetes.NewForConfigOrDie(rc)

	// The "kubernetes" Service got the first address of the service CIDR.
	svc, err := admin.CoreV1().Services("default").Get(ctx, "kubernetes", metav1.GetOptions{})
	if err != nil {
		t.Fatalf("get service kubernetes: %v", err)
	}
	if svc.Spec.ClusterIP != "10.96.0.1" {
		t.Errorf("kubernetes service ClusterIP = %s, want 10.96.0.1", svc.Spec.ClusterIP)
	}

	// kube-controller-manager allocates a /24 podCIDR inside ClusterCIDR.
	node := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "node-a"}}
	if _, err := admin.CoreV1().Nodes().Create(ctx, node, metav1.CreateOptions{}); err != nil {
		t.Fatalf("create node: %v", err)
	}
	var podCIDR string
	for deadline := time.Now().Add(30 * time.Second); time.Now().Before(deadline); time.Sleep(250 * time.Millisecond) {
		n, err := admin.CoreV1().Nodes().Get(ctx, "node-a", metav1.GetOptions{})
		if err != nil {
			t.Fatalf("get node: %v", err)
		}
		if podCIDR = n.Spec.PodCIDR; podCIDR != "" {
			break
		}
	}
	if podCIDR == "" {
		t.Fatalf("node-a got no podCIDR within 30s; kube-controller-manager log:\n%s", logTail(cp.LogFile("kube-controller-manager"), 30))
	}
	ip, ipnet, err := net.ParseCIDR(podCIDR)
	_, cluster, _ := net.ParseCIDR("10.244.0.0/16")
	if ones, _ := ipnet.Mask.Size(); err != nil || !cluster.Contains(ip) || ones != 24 {
		t.Fatalf("podCIDR %q is not a /24 inside 10.244.0.0/16 (err %v)", podCIDR, err)
	}
	t.Logf("node-a podCIDR %s", podCIDR)

	// A ServiceAccount kubeconfig only has the SA's RBAC rights.
	saKubeconfig := filepath.Join(t.TempDir(), "agent.kubeconfig")
	if err := cp.ServiceAccountKubeconfig(ctx, "seine-test", "agent", "", saKubeconfig); err != nil {
		t.Fatalf("ServiceAccountKubeconfig: %v", err)
	}
	saRC, err := cp.ConfigFromKubeconfig(saKubeconfig)
	if err != nil {
		t.Fatal(err)
	}
	if saRC.BearerToken == "" || saRC.Host != "https://198.18.0.1:6443" {
		t.Fatalf("service account kubeconfig: host %q, token set %v", saRC.Host, saRC.BearerToken != "")
	}
	sa := kubernetes.NewForConfigOrDie(saRC)
	_, err = sa.CoreV1().Secrets("kube-system").List(ctx, metav1.ListOptions{})
	if !apierrors.IsForbidden(err) {
		t.Fatalf("listing secrets as the service account before RBAC: err = %v, want Forbidden", err)
	}

	manifest := filepath.Join(t.TempDir(), "rbac.yaml")
	if err := os.WriteFile(manifest, []byte(rbacManifest), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := cp.Apply(ctx, manifest); err != nil {
		t.Fatalf("Apply: %v", err)
	}
	// Applying again updates in place.
	if err := cp.Apply(ctx, manifest); err != nil {
		t.Fatalf("second Apply: %v", err)
	}
	cm, err := admin.CoreV1().ConfigMaps("seine-apply-test").Get(ctx, "cm", metav1.GetOptions{})
	if err != nil || cm.Data["k"] != "v" {
		t.Fatalf("applied ConfigMap: %v %v", cm, err)
	}
	var listErr error
	for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(200 * time.Millisecond) {
		if _, listErr = sa.CoreV1().Secrets("kube-system").List(ctx, metav1.ListOptions{}); listErr == nil {
			break
		}
	}
	if listErr != nil {
		t.Fatalf("listing secrets as the service account after RBAC: %v", listErr)
	}

	// An invalid object fails fast with an error naming it.
	bad := filepath.Join(t.TempDir(), "bad.yaml")
	_ = os.WriteFile(bad, []byte("apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: Bad_Name\n"), 0o644)
	if err := cp.Apply(ctx, bad); err == nil {
		t.Errorf("Apply of an invalid object succeeded")
	}

	// An admin kubeconfig for another server address that is in the
	// serving certificate works.
	alt := filepath.Join(t.TempDir(), "local.kubeconfig")
	if err := cp.WriteAdminKubeconfig(alt, "https://127.0.0.1:6443"); err != nil {
		t.Fatal(err)
	}
	altRC, err := cp.ConfigFromKubeconfig(alt)
	if err != nil {
		t.Fatal(err)
	}
	if body, err := kubernetes.NewForConfigOrDie(altRC).Discovery().RESTClient().Get().AbsPath("/readyz").DoRaw(ctx); err != nil || string(body) != "ok" {
		t.Fatalf("readyz via 127.0.0.1 kubeconfig: %q %v", body, err)
	}

	// Stop leaves no process and no state behind; a second Stop is a no-op.
	pids := pidfilePIDs(stateDir)
	if len(pids) != 4 {
		t.Fatalf("pidfiles: %v, want 4", pids)
	}
	// Simulate a crashed run with a lost pidfile: Stop must still find
	// kube-scheduler through /proc.
	if err := os.Remove(filepath.Join(stateDir, "run", "kube-scheduler.pid")); err != nil {
		t.Fatal(err)
	}
	tStop := time.Now()
	if err := Stop(stateDir); err != nil {
		t.Fatalf("Stop: %v", err)
	}
	t.Logf("Stop took %v", time.Since(tStop))
	for _, pid := range pids {
		if isAlive(pid) {
			t.Errorf("pid %d still alive after Stop", pid)
		}
	}
	if left := scanProc(stateDir); len(left) > 0 {
		t.Errorf("processes %v still mention %s after Stop", left, stateDir)
	}
	if _, err := os.Stat(stateDir); !os.IsNotExist(err) {
		t.Errorf("state dir still present after Stop: %v", err)
	}
	if err := Stop(stateDir); err != nil {
		t.Errorf("second Stop: %v", err)
	}
}

// TestStartFailureNamesComponent checks that a component failing at
// startup yields an error naming it with its log, and leaves no process.
func TestStartFailureNamesComponent(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root (network namespaces)")
	}
	if _, err := findBinary(binDir(), "etcd", "v3", "server"); err != nil {
		t.Skipf("Kubernetes binaries not found in %s: %v", binDir(), err)
	}
	ns := newNetNS(t)
	stateDir := filepath.Join(t.TempDir(), "cp")
	t.Cleanup(func() {
		if err := Stop(stateDir); err != nil {
			t.Errorf("Stop at cleanup: %v", err)
		}
	})
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	// Occupy the apiserver port inside the namespace so kube-apiserver
	// cannot bind it.
	var blocker net.Listener
	if err := inNetNS(ns, func() (err error) {
		blocker, err = net.Listen("tcp", "0.0.0.0:6443")
		return err
	}); err != nil {
		t.Fatalf("occupy port 6443: %v", err)
	}
	defer blocker.Close()
	_, err := Start(ctx, Config{StateDir: stateDir, BinDir: binDir(), NetNS: ns,
		AdvertiseAddress: "198.18.0.1"}, zaptest.NewLogger(t))
	if err == nil {
		t.Fatal("Start with port 6443 taken succeeded")
	}
	msg := err.Error()
	if !strings.Contains(msg, "kube-apiserver") || !strings.Contains(msg, "last lines of") {
		t.Fatalf("error does not name kube-apiserver with its log: %v", err)
	}
	t.Logf("Start error: %.400s", msg)
	if left := scanProc(stateDir); len(left) > 0 {
		t.Errorf("processes %v survive a failed Start", left)
	}
	// A second Start on the same state dir is refused until Stop.
	if _, err := Start(ctx, Config{StateDir: stateDir, BinDir: binDir(), NetNS: ns,
		AdvertiseAddress: "198.18.0.1"}, zaptest.NewLogger(t)); err == nil || !strings.Contains(err.Error(), "Stop it first") {
		t.Errorf("second Start: %v, want refusal", err)
	}
}

func TestFirstServiceIP(t *testing.T) {
	for cidr, want := range map[string]string{"10.96.0.0/16": "10.96.0.1", "10.0.0.0/8": "10.0.0.1", "fd00::/108": "fd00::1"} {
		ip, err := firstServiceIP(cidr)
		if err != nil || ip.String() != want {
			t.Errorf("firstServiceIP(%s) = %v, %v; want %s", cidr, ip, err, want)
		}
	}
}

func TestBinaryOf(t *testing.T) {
	cases := []struct {
		argv []string
		want string
		etcd bool
	}{
		{[]string{"/bin/kube-apiserver", "--x"}, "kube-apiserver", false},
		{[]string{"ip", "netns", "exec", "ns1", "/b/v3", "--data-dir=/s/etcd"}, "v3", true},
		{[]string{"/usr/bin/etcd"}, "etcd", true},
		{nil, "", false},
	}
	for _, c := range cases {
		if got := binaryOf(c.argv); got != c.want || isEtcd(c.argv) != c.etcd {
			t.Errorf("binaryOf(%v) = %q etcd=%v, want %q etcd=%v", c.argv, got, isEtcd(c.argv), c.want, c.etcd)
		}
	}
}
