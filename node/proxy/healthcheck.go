package proxy

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"strconv"
	"sync"
	"time"

	"go.uber.org/zap"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	"k8s.io/client-go/tools/cache"
)

// healthChecks serves the health check node ports of LoadBalancer Services
// with externalTrafficPolicy Local, as kube-proxy does: an HTTP GET on
// spec.healthCheckNodePort answers 200 while the Node has a local ready
// endpoint of the Service and 503 otherwise, so a cloud load balancer
// sends traffic only to Nodes that can serve it (KEP-3836 describes the
// contract; the body names the Service and counts the local endpoints).
type healthChecks struct {
	log *zap.Logger

	mu      sync.Mutex
	servers map[int32]*healthServer // by port
	byKey   map[string]int32        // service key → port
}

type healthServer struct {
	srv *http.Server

	mu        sync.Mutex
	namespace string
	name      string
	local     int
}

// healthBody is the JSON answer of a health check.
type healthBody struct {
	Service struct {
		Namespace string `json:"namespace"`
		Name      string `json:"name"`
	} `json:"service"`
	LocalEndpoints      int  `json:"localEndpoints"`
	ServiceProxyHealthy bool `json:"serviceProxyHealthy"`
}

func newHealthChecks(log *zap.Logger) *healthChecks {
	return &healthChecks{log: log, servers: map[int32]*healthServer{}, byKey: map[string]int32{}}
}

func (s *healthServer) ServeHTTP(w http.ResponseWriter, _ *http.Request) {
	s.mu.Lock()
	var b healthBody
	b.Service.Namespace, b.Service.Name, b.LocalEndpoints, b.ServiceProxyHealthy = s.namespace, s.name, s.local, true
	s.mu.Unlock()
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("X-Content-Type-Options", "nosniff")
	if b.LocalEndpoints == 0 {
		w.WriteHeader(http.StatusServiceUnavailable)
	}
	_ = json.NewEncoder(w).Encode(b)
}

// healthCheckPort returns the health check node port svc needs, 0 for none.
func healthCheckPort(svc *corev1.Service) int32 {
	if svc == nil || svc.Spec.Type != corev1.ServiceTypeLoadBalancer ||
		svc.Spec.ExternalTrafficPolicy != corev1.ServiceExternalTrafficPolicyLocal {
		return 0
	}
	return svc.Spec.HealthCheckNodePort
}

// localReady counts the distinct ready endpoint addresses on nodeName.
func localReady(slices []*discoveryv1.EndpointSlice, nodeName string) int {
	seen := map[string]bool{}
	for _, s := range slices {
		for _, e := range s.Endpoints {
			if e.NodeName == nil || *e.NodeName != nodeName || (e.Conditions.Ready != nil && !*e.Conditions.Ready) {
				continue
			}
			for _, a := range e.Addresses {
				seen[a] = true
			}
		}
	}
	return len(seen)
}

// set makes the Service key answer on port (0: no health check) with
// local endpoints. A port another Service holds is an error.
func (h *healthChecks) set(key string, port int32, local int) error {
	h.mu.Lock()
	defer h.mu.Unlock()
	if old, ok := h.byKey[key]; ok && old != port {
		h.stopLocked(old)
		delete(h.byKey, key)
	}
	if port == 0 {
		return nil
	}
	ns, name, _ := cache.SplitMetaNamespaceKey(key)
	s := h.servers[port]
	if s == nil {
		s = &healthServer{namespace: ns, name: name}
		l, err := net.Listen("tcp", ":"+strconv.Itoa(int(port)))
		if err != nil {
			return fmt.Errorf("health check node port %d: %w", port, err)
		}
		s.srv = &http.Server{Handler: s, ReadHeaderTimeout: 5 * time.Second}
		go func() {
			if err := s.srv.Serve(l); err != nil && !errors.Is(err, http.ErrServerClosed) {
				h.log.Warn("health check server stopped", zap.Int32("port", port), zap.Error(err))
			}
		}()
		h.servers[port] = s
		h.log.Info("serving health check node port", zap.String("service", key), zap.Int32("port", port))
	} else if s.namespace+"/"+s.name != key {
		return fmt.Errorf("health check node port %d is already served for %s/%s", port, s.namespace, s.name)
	}
	h.byKey[key] = port
	s.mu.Lock()
	s.local = local
	s.mu.Unlock()
	return nil
}

func (h *healthChecks) stopLocked(port int32) {
	if s := h.servers[port]; s != nil {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		_ = s.srv.Shutdown(ctx)
		cancel()
		delete(h.servers, port)
	}
}

// close stops every server.
func (h *healthChecks) close() {
	h.mu.Lock()
	defer h.mu.Unlock()
	for port := range h.servers {
		h.stopLocked(port)
	}
	h.byKey = map[string]int32{}
}
