package proxy

import (
	"context"
	"encoding/json"
	"errors"
	"net"
	"net/http"
	"sync"
	"time"

	"go.uber.org/zap"
	corev1 "k8s.io/api/core/v1"
)

// DefaultHealthTimeout is how long a change may wait to be programmed
// before the proxy reports itself unhealthy: kube-proxy's, twice its
// default sync period of 30 s.
const DefaultHealthTimeout = time.Minute

// TaintToBeDeleted is the taint the cluster autoscaler puts on a Node it
// is about to remove; a Node carrying it answers /healthz with 503 so that
// load balancers drain it first (KEP-3836).
const TaintToBeDeleted = "ToBeDeletedByClusterAutoscaler"

// syncHealth is whether the proxy keeps up with the changes it is given,
// as kube-proxy defines it for its health server (port 10256, probed by
// cloud load balancers for Services with externalTrafficPolicy Cluster,
// KEP-3836): unhealthy once a change has waited longer than timeout to be
// programmed; /healthz is also unhealthy while the Node is being deleted
// or carries TaintToBeDeleted, /livez ignores the Node. Safe for
// concurrent use.
type syncHealth struct {
	timeout time.Duration
	now     func() time.Time

	mu sync.Mutex
	// pendingSince is when the oldest change not yet programmed came in;
	// zero when none is waiting.
	pendingSince time.Time
	// lastQueued is when the latest change came in: one that came in
	// while a batch was being programmed waits even when the queue looks
	// empty (the queue holds it back until the batch is done).
	lastQueued   time.Time
	lastUpdated  time.Time
	nodeEligible bool
}

func newSyncHealth(timeout time.Duration) *syncHealth {
	if timeout <= 0 {
		timeout = DefaultHealthTimeout
	}
	return &syncHealth{timeout: timeout, now: time.Now, nodeEligible: true}
}

// queued records that a change came in.
func (h *syncHealth) queued() {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.lastQueued = h.now()
	if h.pendingSince.IsZero() {
		h.pendingSince = h.lastQueued
	}
}

// programmed records that a batch the worker took at start is programmed;
// more says changes are still waiting, which came in after start at the
// earliest (the worker takes all that wait, up to maxBatch). A batch in
// which every Service failed programmed nothing.
func (h *syncHealth) programmed(start time.Time, more bool) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.lastUpdated = h.now()
	h.pendingSince = time.Time{}
	if more || !h.lastQueued.Before(start) {
		h.pendingSince = start
	}
}

// setNode records whether the Node may still take load balancer traffic.
func (h *syncHealth) setNode(n *corev1.Node) {
	eligible := n != nil && n.DeletionTimestamp.IsZero()
	if n != nil {
		for _, t := range n.Spec.Taints {
			if t.Key == TaintToBeDeleted {
				eligible = false
			}
		}
	}
	h.mu.Lock()
	h.nodeEligible = eligible
	h.mu.Unlock()
}

// state returns whether the proxy keeps up, whether the Node is eligible,
// and the time of the last programmed batch.
func (h *syncHealth) state() (healthy, eligible bool, lastUpdated time.Time) {
	h.mu.Lock()
	defer h.mu.Unlock()
	healthy = h.pendingSince.IsZero() || h.now().Sub(h.pendingSince) < h.timeout
	return healthy, h.nodeEligible, h.lastUpdated
}

// healthy is the proxy's own health, the Node aside.
func (h *syncHealth) healthy() bool {
	ok, _, _ := h.state()
	return ok
}

// healthBody is the answer of /healthz and /livez, with kube-proxy's
// field names (NodeEligible only on /healthz).
type proxyHealthBody struct {
	LastUpdated  string `json:"lastUpdated"`
	CurrentTime  string `json:"currentTime"`
	NodeEligible *bool  `json:"nodeEligible,omitempty"`
}

// ServeHTTP answers /healthz and /livez: 200 when healthy, else 503.
func (h *syncHealth) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	healthy, eligible, last := h.state()
	now := h.now()
	b := proxyHealthBody{CurrentTime: now.String()}
	switch r.URL.Path {
	case "/healthz":
		healthy = healthy && eligible
		b.NodeEligible = &eligible
	case "/livez":
	default:
		http.NotFound(w, r)
		return
	}
	if healthy {
		// As kube-proxy: a healthy proxy is up to date now.
		last = now
	}
	b.LastUpdated = last.String()
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("X-Content-Type-Options", "nosniff")
	if !healthy {
		w.WriteHeader(http.StatusServiceUnavailable)
	}
	_ = json.NewEncoder(w).Encode(b)
}

// serveHealth serves h on addr until ctx ends, retrying every 5 s while
// the address cannot be bound (a kube-proxy still running on the Node
// holds it): the proxy works without it, so a failure is only logged.
func serveHealth(ctx context.Context, addr string, h http.Handler, log *zap.Logger) {
	for {
		var lc net.ListenConfig
		lis, err := lc.Listen(ctx, "tcp", addr)
		if err == nil {
			log.Info("serving the proxy health check", zap.String("address", addr))
			srv := &http.Server{Handler: h, ReadHeaderTimeout: 5 * time.Second, ReadTimeout: 10 * time.Second,
				WriteTimeout: 10 * time.Second, IdleTimeout: 90 * time.Second}
			stop := context.AfterFunc(ctx, func() { _ = srv.Close() })
			err = srv.Serve(lis)
			stop()
			if errors.Is(err, http.ErrServerClosed) || ctx.Err() != nil {
				return
			}
		}
		log.Warn("proxy health check not served; retrying in 5 s", zap.String("address", addr), zap.Error(err))
		select {
		case <-ctx.Done():
			return
		case <-time.After(5 * time.Second):
		}
	}
}
