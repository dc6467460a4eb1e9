package controller

import (
	"context"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"go.uber.org/zap"
	"go.uber.org/zap/zaptest"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

	"github.com/seine-net/seine/policy/client/clientset/versioned"
	"github.com/seine-net/seine/tests/apienv"
)

// env is a real control plane with the CRDs applied.
type env struct {
	rc   *rest.Config
	kube kubernetes.Interface
	cp   versioned.Interface
	// written counts request body bytes sent by clients made with
	// countingClients.
	bytes atomic.Int64
}

// startEnv starts etcd + kube-apiserver (+ controller-manager, scheduler)
// in a throwaway network namespace and applies deploy/crds; everything is
// removed at cleanup.
func startEnv(tb testing.TB) *env {
	tb.Helper()
	rc := apienv.Start(tb, "../../deploy/crds")
	rc.QPS, rc.Burst = 2000, 4000
	e := &env{rc: rc}
	e.kube = kubernetes.NewForConfigOrDie(rc)
	// The namespace of the controller's Lease, as the manifest creates it.
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if _, err := e.kube.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{
		ObjectMeta: metav1.ObjectMeta{Name: DefaultLeaseNamespace}}, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		tb.Fatalf("create namespace %s: %v", DefaultLeaseNamespace, err)
	}
	e.cp = versioned.NewForConfigOrDie(rc)
	return e
}

// countingCP returns a controlplane clientset whose request bodies are
// counted in e.bytes, rate-limited to qps requests per second with bursts
// of burst.
func (e *env) countingCP(qps float32, burst int) versioned.Interface {
	rc := rest.CopyConfig(e.rc)
	rc.QPS, rc.Burst = qps, burst
	rc.Wrap(func(rt http.RoundTripper) http.RoundTripper { return &countingRT{rt: rt, n: &e.bytes} })
	return versioned.NewForConfigOrDie(rc)
}

// createAll writes source objects in parallel: Nodes, Namespaces, Pods
// (then their status: phase Running and podIPs — there are no kubelets),
// NetworkPolicies.
func (e *env) createAll(tb testing.TB, ctx context.Context, nodes []*corev1.Node, nss []*corev1.Namespace,
	pods []*corev1.Pod, nps []*networkingv1.NetworkPolicy) {
	tb.Helper()
	par := func(n int, fn func(i int) error) {
		var wg sync.WaitGroup
		var next atomic.Int64
		errs := make(chan error, 1)
		for w := 0; w < 32; w++ {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for {
					i := int(next.Add(1)) - 1
					if i >= n {
						return
					}
					if err := fn(i); err != nil {
						select {
						case errs <- err:
						default:
						}
						return
					}
				}
			}()
		}
		wg.Wait()
		select {
		case err := <-errs:
			tb.Fatal(err)
		default:
		}
	}
	par(len(nodes), func(i int) error {
		_, err := e.kube.CoreV1().Nodes().Create(ctx, nodes[i], metav1.CreateOptions{})
		return wrap("create node", err)
	})
	par(len(nss), func(i int) error {
		_, err := e.kube.CoreV1().Namespaces().Create(ctx, nss[i], metav1.CreateOptions{})
		return wrap("create namespace", err)
	})
	par(len(pods), func(i int) error { return e.createPod(ctx, pods[i]) })
	par(len(nps), func(i int) error {
		_, err := e.kube.NetworkingV1().NetworkPolicies(nps[i].Namespace).Create(ctx, nps[i], metav1.CreateOptions{})
		return wrap("create networkpolicy", err)
	})
}

// createPod creates p and then sets its status; p gets the server's UID.
func (e *env) createPod(ctx context.Context, p *corev1.Pod) error {
	in := p.DeepCopy()
	in.UID = ""
	for i := range in.Spec.Containers {
		if in.Spec.Containers[i].Image == "" {
			in.Spec.Containers[i].Image = "none"
		}
	}
	var created *corev1.Pod
	var err error
	// A Pod needs its namespace's default ServiceAccount, which
	// kube-controller-manager creates shortly after the namespace.
	for deadline := time.Now().Add(time.Minute); ; time.Sleep(200 * time.Millisecond) {
		created, err = e.kube.CoreV1().Pods(p.Namespace).Create(ctx, in, metav1.CreateOptions{})
		if err == nil || !apierrors.IsForbidden(err) || !strings.Contains(err.Error(), "serviceaccount") || time.Now().After(deadline) {
			break
		}
	}
	if err != nil {
		return fmt.Errorf("create pod %s/%s: %w", p.Namespace, p.Name, err)
	}
	created.Status.Phase = p.Status.Phase
	created.Status.PodIPs = p.Status.PodIPs
	if len(p.Status.PodIPs) > 0 {
		created.Status.PodIP = p.Status.PodIPs[0].IP
	}
	_, err = e.kube.CoreV1().Pods(p.Namespace).UpdateStatus(ctx, created, metav1.UpdateOptions{})
	return wrap("update pod status", err)
}

func wrap(what string, err error) error {
	if err == nil {
		return nil
	}
	return fmt.Errorf("%s: %w", what, err)
}

// startController runs a controller until the test ends; stop cancels it
// and waits for Run to return.
func startController(tb testing.TB, e *env, cp versioned.Interface, cfg Config) (c *Controller, stop func()) {
	tb.Helper()
	var log *zap.Logger
	if t, ok := tb.(*testing.T); ok {
		log = zaptest.NewLogger(t, zaptest.Level(zap.InfoLevel))
	} else {
		log = zap.NewNop()
	}
	c, err := New(e.kube, cp, cfg, log)
	if err != nil {
		tb.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- c.Run(ctx) }()
	var once sync.Once
	stop = func() {
		once.Do(func() {
			cancel()
			select {
			case err := <-done:
				if err != nil {
					tb.Errorf("Run: %v", err)
				}
			case <-time.After(30 * time.Second):
				tb.Errorf("Run did not return 30s after cancel")
			}
		})
	}
	tb.Cleanup(stop)
	return c, stop
}

// waitFor polls cond every 50 ms until it is true or timeout passes.
func waitFor(tb testing.TB, timeout time.Duration, what string, cond func() bool) {
	tb.Helper()
	for deadline := time.Now().Add(timeout); time.Now().Before(deadline); time.Sleep(50 * time.Millisecond) {
		if cond() {
			return
		}
	}
	tb.Fatalf("timed out after %v waiting for %s", timeout, what)
}

// waitIdle waits until c has been idle for quiet without interruption.
func waitIdle(tb testing.TB, c *Controller, timeout, quiet time.Duration) {
	tb.Helper()
	var since time.Time
	for deadline := time.Now().Add(timeout); time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
		if !c.Idle() {
			since = time.Time{}
			continue
		}
		if since.IsZero() {
			since = time.Now()
		} else if time.Since(since) >= quiet {
			return
		}
	}
	tb.Fatalf("controller not idle within %v", timeout)
}

// countingRT adds each request's body length to n.
type countingRT struct {
	rt http.RoundTripper
	n  *atomic.Int64
}

func (c *countingRT) RoundTrip(r *http.Request) (*http.Response, error) {
	if r.ContentLength > 0 {
		c.n.Add(r.ContentLength)
	}
	return c.rt.RoundTrip(r)
}
