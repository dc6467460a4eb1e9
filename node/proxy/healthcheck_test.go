package proxy

import (
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"

	"go.uber.org/zap/zaptest"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
)

func freePort(t *testing.T) int32 {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return int32(l.Addr().(*net.TCPAddr).Port)
}

func check(t *testing.T, port int32) (int, healthBody, error) {
	t.Helper()
	return checkAt(t, "127.0.0.1", port)
}

func checkAt(t *testing.T, ip string, port int32) (int, healthBody, error) {
	t.Helper()
	resp, err := http.Get(fmt.Sprintf("http://%s:%d/healthz", ip, port))
	if err != nil {
		return 0, healthBody{}, err
	}
	defer resp.Body.Close()
	var b healthBody
	err = json.NewDecoder(resp.Body).Decode(&b)
	if w := resp.Header.Get("X-Load-Balancing-Endpoint-Weight"); err == nil && w != strconv.Itoa(b.LocalEndpoints) {
		err = fmt.Errorf("X-Load-Balancing-Endpoint-Weight %q, want %d", w, b.LocalEndpoints)
	}
	return resp.StatusCode, b, err
}

// The health check node port answers 503 without a local endpoint, 200
// with one, names its Service, refuses a second Service on the same port,
// and stops when the Service no longer needs it.
func TestHealthCheckNodePort(t *testing.T) {
	var lagging atomic.Bool
	h := newHealthChecks(nil, func() bool { return !lagging.Load() }, zaptest.NewLogger(t))
	defer h.close()
	port := freePort(t)
	if err := h.set("ns/lb", port, 0); err != nil {
		t.Fatal(err)
	}
	if code, b, err := check(t, port); err != nil || code != http.StatusServiceUnavailable || b.LocalEndpoints != 0 ||
		b.Service.Namespace != "ns" || b.Service.Name != "lb" {
		t.Errorf("no local endpoint: %d %+v %v", code, b, err)
	}
	if err := h.set("ns/lb", port, 2); err != nil {
		t.Fatal(err)
	}
	if code, b, err := check(t, port); err != nil || code != http.StatusOK || b.LocalEndpoints != 2 {
		t.Errorf("two local endpoints: %d %+v %v", code, b, err)
	}
	// A proxy that lags fails the check whatever the endpoints.
	lagging.Store(true)
	if code, b, err := check(t, port); err != nil || code != http.StatusServiceUnavailable || b.ServiceProxyHealthy {
		t.Errorf("proxy lagging: %d %+v %v", code, b, err)
	}
	lagging.Store(false)
	if err := h.set("ns/other", port, 1); err == nil {
		t.Error("a second Service took the same health check port")
	}
	if err := h.set("ns/lb", 0, 0); err != nil {
		t.Fatal(err)
	}
	if _, _, err := check(t, port); err == nil {
		t.Error("the health check port still answers after its Service dropped it")
	}
}

// With nodePortAddresses set, the health check listens only on the local
// addresses inside them: 127.0.0.1 answers, 127.0.0.2 (also local, on lo)
// does not; with 0.0.0.0/0 both answer.
func TestHealthCheckListensOnNodePortAddresses(t *testing.T) {
	mustCIDR := func(s string) *net.IPNet {
		_, n, err := net.ParseCIDR(s)
		if err != nil {
			t.Fatal(err)
		}
		return n
	}
	h := newHealthChecks(localAddrsIn([]*net.IPNet{mustCIDR("127.0.0.1/32")}), nil, zaptest.NewLogger(t))
	defer h.close()
	port := freePort(t)
	if err := h.set("ns/lb", port, 1); err != nil {
		t.Fatal(err)
	}
	if code, _, err := checkAt(t, "127.0.0.1", port); err != nil || code != http.StatusOK {
		t.Errorf("127.0.0.1 inside nodePortAddresses: %d %v", code, err)
	}
	if _, _, err := checkAt(t, "127.0.0.2", port); err == nil {
		t.Error("127.0.0.2 is outside nodePortAddresses but answers")
	}

	all := newHealthChecks(localAddrsIn([]*net.IPNet{mustCIDR("0.0.0.0/0")}), nil, zaptest.NewLogger(t))
	defer all.close()
	port2 := freePort(t)
	if err := all.set("ns/lb", port2, 1); err != nil {
		t.Fatal(err)
	}
	if code, _, err := checkAt(t, "127.0.0.2", port2); err != nil || code != http.StatusOK {
		t.Errorf("0.0.0.0/0: 127.0.0.2 does not answer: %d %v", code, err)
	}

	none := newHealthChecks(localAddrsIn([]*net.IPNet{mustCIDR("198.19.255.0/24")}), nil, zaptest.NewLogger(t))
	defer none.close()
	if err := none.set("ns/lb", freePort(t), 1); err == nil || !strings.Contains(err.Error(), "no local address inside nodePortAddresses") {
		t.Errorf("no local address in range: %v", err)
	}
}

func TestHealthCheckPortAndLocalReady(t *testing.T) {
	svc := &corev1.Service{Spec: corev1.ServiceSpec{Type: corev1.ServiceTypeLoadBalancer,
		ExternalTrafficPolicy: corev1.ServiceExternalTrafficPolicyLocal, HealthCheckNodePort: 32000}}
	if got := healthCheckPort(svc); got != 32000 {
		t.Errorf("LoadBalancer with Local: %d", got)
	}
	svc.Spec.ExternalTrafficPolicy = corev1.ServiceExternalTrafficPolicyCluster
	if got := healthCheckPort(svc); got != 0 {
		t.Errorf("Cluster policy: %d, want none", got)
	}
	s := slice("http", 8080, ep{"10.244.1.5", "n1", true, true, false}, ep{"10.244.1.6", "n1", false, true, true},
		ep{"10.244.2.5", "n2", true, true, false})
	s2 := slice("dns", 53, ep{"10.244.1.5", "n1", true, true, false})
	if got := localReady([]*discoveryv1.EndpointSlice{s, s2}, "n1"); got != 1 {
		t.Errorf("local ready endpoints on n1: %d, want 1", got)
	}
}
