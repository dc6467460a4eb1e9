// Package health serves the daemon's probes and metrics over HTTP:
// /healthz (liveness), /readyz (readiness) and /metrics (Prometheus).
//
// Probes follow the Kubernetes components' convention: 200 and "ok" when
// every check passes, 503 and one "[-]name failed: reason" line per failing
// check otherwise; "?verbose" lists every check ("[+]name ok").
//
//   - /healthz is the liveness probe: it fails only when the daemon is
//     stuck in a way a restart fixes. It passes while the daemon starts
//     (waiting for its podCIDR or for OVS is not a reason to restart it).
//     Its check, workers-progressing, fails when a CNI request or a
//     workqueue item has been in progress for longer than
//     DefaultStuckAfter (see Watchdog).
//   - /readyz is the readiness probe: shutdown (fails from the moment
//     the daemon begins to stop, as kube-apiserver's check of that name
//     does: `seine ovs run` reads it to tell a stopping daemon from one
//     that stays), ovs-connected (OVSDB and OpenFlow),
//     pipeline-installed (the bridge's flows of this run installed and the
//     previous run's removed), pods-restored (the Pods already attached at
//     start-up programmed again), policies-realized (every NetworkPolicy
//     object the agent holds installed as flows, none waiting longer
//     than the agent's RealizeTimeout for its AppliedToGroup), cni-serving (the CNI
//     server accepts requests).
package health

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
)

// CheckWorkers is the liveness check of the Watchdog.
const CheckWorkers = "workers-progressing"

// Readiness check names.
const (
	CheckShutdown         = "shutdown"
	CheckOVSConnected     = "ovs-connected"
	CheckPipeline         = "pipeline-installed"
	CheckPodsRestored     = "pods-restored"
	CheckPoliciesRealized = "policies-realized"
	CheckCNIServing       = "cni-serving"
	// CheckCNIChained: in networkPolicyOnly mode, seine is in the primary
	// CNI's conflist (without it the runtime never calls seine, and no
	// Pod of the Node is under its NetworkPolicies).
	CheckCNIChained = "cni-chained"
)

// Checks is an ordered set of named checks. It is safe for concurrent
// use; checks may be added while it serves.
type Checks struct {
	mu     sync.Mutex
	names  []string
	checks map[string]func() error
}

// Add registers (or replaces) the check name.
func (c *Checks) Add(name string, fn func() error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.checks == nil {
		c.checks = map[string]func() error{}
	}
	if _, ok := c.checks[name]; !ok {
		c.names = append(c.names, name)
	}
	c.checks[name] = fn
}

// Result is one check's outcome.
type Result struct {
	Name string `json:"name"`
	// Error is empty when the check passed.
	Error string `json:"error,omitempty"`
}

// Run runs every check in the order they were added.
func (c *Checks) Run() []Result {
	c.mu.Lock()
	names := append([]string(nil), c.names...)
	fns := make([]func() error, len(names))
	for i, n := range names {
		fns[i] = c.checks[n]
	}
	c.mu.Unlock()
	out := make([]Result, len(names))
	for i, fn := range fns {
		out[i] = Result{Name: names[i]}
		if err := fn(); err != nil {
			out[i].Error = err.Error()
		}
	}
	return out
}

// Err is nil when every check passes, else an error naming the failures.
func (c *Checks) Err() error {
	var errs []error
	for _, r := range c.Run() {
		if r.Error != "" {
			errs = append(errs, fmt.Errorf("%s: %s", r.Name, r.Error))
		}
	}
	return errors.Join(errs...)
}

// ServeHTTP writes the probe answer.
func (c *Checks) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	results := c.Run()
	_, verbose := r.URL.Query()["verbose"]
	var b strings.Builder
	failed := false
	for _, res := range results {
		if res.Error != "" {
			failed = true
			fmt.Fprintf(&b, "[-]%s failed: %s\n", res.Name, res.Error)
		} else if verbose {
			fmt.Fprintf(&b, "[+]%s ok\n", res.Name)
		}
	}
	w.Header().Set("Content-Type", "text/plain; charset=utf-8")
	w.Header().Set("X-Content-Type-Options", "nosniff")
	if failed {
		w.WriteHeader(http.StatusServiceUnavailable)
		fmt.Fprintf(&b, "%s check failed\n", strings.TrimPrefix(r.URL.Path, "/"))
		_, _ = w.Write([]byte(b.String()))
		return
	}
	if verbose {
		fmt.Fprintf(&b, "%s check passed\n", strings.TrimPrefix(r.URL.Path, "/"))
		_, _ = w.Write([]byte(b.String()))
		return
	}
	_, _ = w.Write([]byte("ok\n"))
}

// Gate is a check that fails with its message until Open is called.
type Gate struct {
	open atomic.Bool
	msg  string
}

// NewGate returns a closed gate failing with msg.
func NewGate(msg string) *Gate { return &Gate{msg: msg} }

// Open makes the gate pass from now on.
func (g *Gate) Open() { g.open.Store(true) }

// Check is the gate as a check.
func (g *Gate) Check() error {
	if g.open.Load() {
		return nil
	}
	return errors.New(g.msg)
}

// Probes are the daemon's liveness and readiness checks.
type Probes struct {
	Live, Ready Checks
}

// Handler serves /healthz, /livez (the same), /readyz and, with reg,
// /metrics.
func (p *Probes) Handler(reg *prometheus.Registry) http.Handler {
	mux := http.NewServeMux()
	mux.Handle("/healthz", &p.Live)
	mux.Handle("/livez", &p.Live)
	mux.Handle("/readyz", &p.Ready)
	if reg != nil {
		mux.Handle("/metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{Registry: reg}))
	}
	return mux
}

// Timeouts bound each connection of the metrics and health server, so
// that slow or silent clients do not hold connections open.
type Timeouts struct {
	// ReadHeader bounds reading a request's header, Read the whole
	// request (probes and scrapes send no body).
	ReadHeader, Read time.Duration
	// Write bounds answering a request, from its header read to the last
	// byte written: /metrics of a large Node takes a while to gather and
	// send.
	Write time.Duration
	// Idle closes a kept-alive connection whose next request does not
	// come in time.
	Idle time.Duration
}

// DefaultTimeouts are the daemon's. Kubelet probes open a connection
// each and give up after a few seconds; Prometheus, scraping every minute
// or more often, finds its connection still open (Idle), and its scrape
// timeout, never longer than its interval, fits in Write.
func DefaultTimeouts() Timeouts {
	return Timeouts{ReadHeader: 5 * time.Second, Read: 10 * time.Second, Write: 2 * time.Minute, Idle: 90 * time.Second}
}

// Serve serves h on addr (host:port) with timeouts t until ctx ends.
func Serve(ctx context.Context, addr string, h http.Handler, t Timeouts) error {
	var lc net.ListenConfig
	lis, err := lc.Listen(ctx, "tcp", addr)
	if err != nil {
		return fmt.Errorf("metrics and health server: %w", err)
	}
	if err := serve(ctx, lis, h, t); err != nil {
		return fmt.Errorf("metrics and health server on %s: %w", addr, err)
	}
	return nil
}

// serve serves h on lis with timeouts t until ctx ends.
func serve(ctx context.Context, lis net.Listener, h http.Handler, t Timeouts) error {
	srv := &http.Server{Handler: h, ReadHeaderTimeout: t.ReadHeader, ReadTimeout: t.Read,
		WriteTimeout: t.Write, IdleTimeout: t.Idle}
	go func() { <-ctx.Done(); _ = srv.Close() }()
	if err := srv.Serve(lis); err != nil && !errors.Is(err, http.ErrServerClosed) {
		return err
	}
	return nil
}

// ResolveAddress fills an empty host of addr (":9345") with the Node's
// address; "" stays "" (disabled).
func ResolveAddress(addr string, nodeIP net.IP) (string, error) {
	if addr == "" {
		return "", nil
	}
	host, port, err := net.SplitHostPort(addr)
	if err != nil {
		return "", fmt.Errorf("metricsAddress %q: %w", addr, err)
	}
	if host == "" {
		host = nodeIP.String()
	}
	return net.JoinHostPort(host, port), nil
}

// Names returns the check names, sorted (for tests and docs).
func (c *Checks) Names() []string {
	c.mu.Lock()
	defer c.mu.Unlock()
	out := append([]string(nil), c.names...)
	sort.Strings(out)
	return out
}
