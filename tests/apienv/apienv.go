// Package apienv starts a real Kubernetes control plane (etcd,
// kube-apiserver, kube-controller-manager, kube-scheduler, built by `make
// control-plane`) in a throwaway network namespace for package tests, with
// Seine's CRDs (deploy/crds) applied and served. Everything is removed at
// the test's cleanup, also when it fails.
package apienv

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"

	"go.uber.org/zap"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/yaml"

	"github.com/seine-net/seine/tests/sandbox/controlplane"
)

// BinDir is where the control-plane binaries are ($SEINE_K8S_BIN).
func BinDir() string {
	if d := os.Getenv("SEINE_K8S_BIN"); d != "" {
		return d
	}
	return "/root/.cache/seine/k8s-v1.36.3/bin"
}

// Env is a running control plane.
type Env struct {
	// Config reaches the API server from this process.
	Config *rest.Config
	// NetNS is the network namespace it runs in (198.18.0.1 there).
	NetNS string
	// ControlPlane is the control plane (AdminKubeconfig for kubectl run
	// inside NetNS).
	ControlPlane *controlplane.ControlPlane
}

// Start starts the control plane and applies every CRD of crdDir (the
// repository's deploy/crds, relative to the test's package directory),
// waiting until each is served. It skips the test without root or
// without the binaries.
func Start(tb testing.TB, crdDir string) *rest.Config { return StartEnv(tb, crdDir).Config }

// StartEnv is Start, returning the whole environment.
func StartEnv(tb testing.TB, crdDir string) *Env {
	tb.Helper()
	if os.Geteuid() != 0 {
		tb.Skip("needs root (network namespaces)")
	}
	if _, err := os.Stat(filepath.Join(BinDir(), "kube-apiserver")); err != nil {
		tb.Skipf("Kubernetes binaries not found in %s: %v", BinDir(), err)
	}
	b := make([]byte, 4)
	_, _ = rand.Read(b)
	ns := "seine-api-" + hex.EncodeToString(b)
	run(tb, "ip", "netns", "add", ns)
	tb.Cleanup(func() {
		if out, err := exec.Command("ip", "netns", "delete", ns).CombinedOutput(); err != nil {
			tb.Errorf("ip netns delete %s: %v: %s", ns, err, out)
		}
	})
	run(tb, "ip", "-n", ns, "link", "set", "lo", "up")
	run(tb, "ip", "-n", ns, "addr", "add", "198.18.0.1/32", "dev", "lo")
	stateDir := filepath.Join(tb.TempDir(), "cp")
	tb.Cleanup(func() {
		if err := controlplane.Stop(stateDir); err != nil {
			tb.Errorf("stop control plane: %v", err)
		}
	})
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	cpl, err := controlplane.Start(ctx, controlplane.Config{
		StateDir: stateDir, BinDir: BinDir(), NetNS: ns, AdvertiseAddress: "198.18.0.1",
	}, zap.NewNop())
	if err != nil {
		tb.Fatalf("start control plane: %v", err)
	}
	crds, err := filepath.Glob(filepath.Join(crdDir, "*.yaml"))
	if err != nil || len(crds) == 0 {
		tb.Fatalf("no CRD manifests in %s (%v)", crdDir, err)
	}
	if err := cpl.Apply(ctx, crds...); err != nil {
		tb.Fatalf("apply CRDs: %v", err)
	}
	rc, err := cpl.RESTConfig()
	if err != nil {
		tb.Fatal(err)
	}
	waitServed(tb, ctx, rc, crds)
	return &Env{Config: rc, NetNS: ns, ControlPlane: cpl}
}

// waitServed waits until the API server serves every CRD's resource.
func waitServed(tb testing.TB, ctx context.Context, rc *rest.Config, files []string) {
	tb.Helper()
	dyn, err := dynamic.NewForConfig(rc)
	if err != nil {
		tb.Fatal(err)
	}
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			tb.Fatal(err)
		}
		var crd struct {
			Spec struct {
				Group string `json:"group"`
				Names struct {
					Plural string `json:"plural"`
				} `json:"names"`
				Versions []struct {
					Name string `json:"name"`
				} `json:"versions"`
			} `json:"spec"`
		}
		if err := yaml.Unmarshal(b, &crd); err != nil || len(crd.Spec.Versions) == 0 {
			tb.Fatalf("%s: not a CRD (%v)", f, err)
		}
		gvr := schema.GroupVersionResource{Group: crd.Spec.Group, Version: crd.Spec.Versions[0].Name, Resource: crd.Spec.Names.Plural}
		for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(100 * time.Millisecond) {
			_, err = dyn.Resource(gvr).List(ctx, metav1.ListOptions{Limit: 1})
			if err == nil {
				break
			}
			if time.Now().After(deadline) {
				tb.Fatalf("%s not served after 30s: %v", gvr, err)
			}
		}
	}
}

func run(tb testing.TB, name string, args ...string) {
	tb.Helper()
	if out, err := exec.Command(name, args...).CombinedOutput(); err != nil {
		tb.Fatalf("%s %v: %v: %s", name, args, err, out)
	}
}
