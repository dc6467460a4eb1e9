package proxy

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"slices"
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
// Like the NodePorts, the servers listen only on the Node's addresses
// inside proxy.nodePortAddresses (all addresses when a range is 0.0.0.0/0).
type healthChecks struct {
	log *zap.Logger
	// addrs returns the addresses to listen on; nil means every address.
	addrs func() ([]net.IP, error)
	// proxyHealthy reports whether the proxy keeps up (syncHealth): a
	// Node whose proxy lags answers 503 whatever its endpoints, as
	// kube-proxy's does.
	proxyHealthy func() bool

	mu      sync.Mutex
	servers map[int32]*healthServer // by port
	byKey   map[string]int32        // service key → port
}

type healthServer struct {
	srv          *http.Server
	proxyHealthy func() bool

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

// newHealthChecks returns health check servers that listen on the
// addresses addrs returns when a server starts, failing while proxyHealthy
// (nil: always) reports false.
func newHealthChecks(addrs func() ([]net.IP, error), proxyHealthy func() bool, log *zap.Logger) *healthChecks {
	if proxyHealthy == nil {
		proxyHealthy = func() bool { return true }
	}
	return &healthChecks{log: log, addrs: addrs, proxyHealthy: proxyHealthy,
		servers: map[int32]*healthServer{}, byKey: map[string]int32{}}
}

// localAddrsIn returns a function listing the local IPv4 addresses inside
// cidrs, or nil (every address) when one of them is 0.0.0.0/0. An error
// names the ranges when no local address is inside them.
func localAddrsIn(cidrs []*net.IPNet) func() ([]net.IP, error) {
	return func() ([]net.IP, error) {
		for _, c := range cidrs {
			if ones, _ := c.Mask.Size(); ones == 0 {
				return nil, nil
			}
		}
		ifAddrs, err := net.InterfaceAddrs()
		if err != nil {
			return nil, fmt.Errorf("listing local addresses: %w", err)
		}
		var out []net.IP
		for _, a := range ifAddrs {
			n, ok := a.(*net.IPNet)
			if !ok || n.IP.To4() == nil {
				continue
			}
			ip := n.IP.To4()
			for _, c := range cidrs {
				// An address may sit on two interfaces (a VIP on lo and
				// eth0): listen on it once.
				if c.Contains(ip) && !slices.ContainsFunc(out, ip.Equal) {
					out = append(out, ip)
					break
				}
			}
		}
		if len(out) == 0 {
			return nil, fmt.Errorf("no local address inside nodePortAddresses %v", cidrs)
		}
		return out, nil
	}
}

// listen opens the listeners of a health check port: one per address, or
// one on every address.
func (h *healthChecks) listen(port int32) ([]net.Listener, error) {
	var ips []net.IP
	if h.addrs != nil {
		var err error
		if ips, err = h.addrs(); err != nil {
			return nil, err
		}
	}
	if ips == nil {
		l, err := net.Listen("tcp4", ":"+strconv.Itoa(int(port)))
		if err != nil {
			return nil, err
		}
		return []net.Listener{l}, nil
	}
	var ls []net.Listener
	for _, ip := range ips {
		l, err := net.Listen("tcp4", net.JoinHostPort(ip.String(), strconv.Itoa(int(port))))
		if err != nil {
			for _, o := range ls {
				o.Close()
			}
			return nil, err
		}
		ls = append(ls, l)
	}
	return ls, nil
}

func (s *healthServer) ServeHTTP(w http.ResponseWriter, _ *http.Request) {
	s.mu.Lock()
	var b healthBody
	b.Service.Namespace, b.Service.Name, b.LocalEndpoints = s.namespace, s.name, s.local
	s.mu.Unlock()
	b.ServiceProxyHealthy = s.proxyHealthy()
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("X-Content-Type-Options", "nosniff")
	// The local endpoints, for load balancers that weigh Nodes by them
	// (kube-proxy sends it too).
	w.Header().Set("X-Load-Balancing-Endpoint-Weight", strconv.Itoa(b.LocalEndpoints))
	if b.LocalEndpoints == 0 || !b.ServiceProxyHealthy {
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
		s = &healthServer{namespace: ns, name: name, proxyHealthy: h.proxyHealthy}
		ls, err := h.listen(port)
		if err != nil {
			return fmt.Errorf("health check node port %d: %w", port, err)
		}
		s.srv = &http.Server{Handler: s, ReadHeaderTimeout: 5 * time.Second}
		addrs := make([]string, 0, len(ls))
		for _, l := range ls {
			addrs = append(addrs, l.Addr().String())
			go func() {
				if err := s.srv.Serve(l); err != nil && !errors.Is(err, http.ErrServerClosed) {
					h.log.Warn("health check server stopped", zap.Int32("port", port), zap.Error(err))
				}
			}()
		}
		h.servers[port] = s
		h.log.Info("serving health check node port", zap.String("service", key), zap.Int32("port", port),
			zap.Strings("addresses", addrs))
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
