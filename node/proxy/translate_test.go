package proxy

import (
	"fmt"
	"net"
	"testing"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"

	"github.com/seine-net/seine/datapath/pipeline"
)

func ptr[T any](v T) *T { return &v }

func service(ports ...corev1.ServicePort) *corev1.Service {
	return &corev1.Service{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "web"},
		Spec: corev1.ServiceSpec{ClusterIP: "10.96.0.10", ClusterIPs: []string{"10.96.0.10"}, Ports: ports}}
}

type ep struct {
	ip                          string
	node                        string
	ready, serving, terminating bool
}

func slice(name string, port int32, eps ...ep) *discoveryv1.EndpointSlice {
	s := &discoveryv1.EndpointSlice{AddressType: discoveryv1.AddressTypeIPv4,
		Ports: []discoveryv1.EndpointPort{{Name: ptr(name), Port: ptr(port), Protocol: ptr(corev1.ProtocolTCP)}}}
	for _, e := range eps {
		s.Endpoints = append(s.Endpoints, discoveryv1.Endpoint{Addresses: []string{e.ip}, NodeName: ptr(e.node),
			Conditions: discoveryv1.EndpointConditions{Ready: ptr(e.ready), Serving: ptr(e.serving), Terminating: ptr(e.terminating)}})
	}
	return s
}

func ips(eps []pipeline.ServiceEndpoint) string {
	s := ""
	for _, e := range eps {
		s += fmt.Sprintf("%s:%d ", e.IP, e.Port)
	}
	return s
}

func TestTranslateConditionsAndNamedPorts(t *testing.T) {
	svc := service(corev1.ServicePort{Name: "http", Port: 80, TargetPort: intstr.FromString("web")})
	got, err := Translate(svc, []*discoveryv1.EndpointSlice{
		slice("http", 8080, ep{"10.244.1.5", "n1", true, true, false}, ep{"10.244.2.5", "n2", false, true, true}),
		slice("http", 8080, ep{"10.244.0.5", "n1", true, true, false}, ep{"10.244.0.5", "n1", true, true, false}),
		slice("other", 9090, ep{"10.244.3.5", "n1", true, true, false}),
	}, "n1")
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != 1 || got[0].Key != "ns/web/http/TCP" {
		t.Fatalf("got %+v", got)
	}
	p := got[0].Port
	if p.Action != pipeline.ServiceBalance || ips(p.Endpoints) != "10.244.0.5:8080 10.244.1.5:8080 " {
		t.Errorf("ready endpoints: %s (action %d)", ips(p.Endpoints), p.Action)
	}
	if p.Protocol != 6 || p.Port != 80 || p.VIPs[0].String() != "10.96.0.10" {
		t.Errorf("port %+v", p)
	}
	// No ready endpoint: the serving terminating ones take over; neither:
	// reject.
	got, _ = Translate(svc, []*discoveryv1.EndpointSlice{slice("http", 8080,
		ep{"10.244.1.5", "n1", false, false, true}, ep{"10.244.2.5", "n2", false, true, true})}, "n1")
	if ips(got[0].Port.Endpoints) != "10.244.2.5:8080 " {
		t.Errorf("terminating fallback: %s", ips(got[0].Port.Endpoints))
	}
	got, _ = Translate(svc, []*discoveryv1.EndpointSlice{slice("http", 8080, ep{"10.244.1.5", "n1", false, false, true})}, "n1")
	if got[0].Port.Action != pipeline.ServiceReject {
		t.Errorf("no endpoints: action %d, want reject", got[0].Port.Action)
	}
}

func TestTranslateLocalPolicyAndAffinity(t *testing.T) {
	svc := service(corev1.ServicePort{Name: "dns", Port: 53, Protocol: corev1.ProtocolUDP})
	svc.Spec.InternalTrafficPolicy = ptr(corev1.ServiceInternalTrafficPolicyLocal)
	svc.Spec.SessionAffinity = corev1.ServiceAffinityClientIP
	svc.Spec.SessionAffinityConfig = &corev1.SessionAffinityConfig{ClientIP: &corev1.ClientIPConfig{TimeoutSeconds: ptr(int32(7))}}
	s := slice("dns", 5353, ep{"10.244.1.5", "n1", true, true, false}, ep{"10.244.2.5", "n2", true, true, false})
	s.Ports[0].Protocol = ptr(corev1.ProtocolUDP)
	got, _ := Translate(svc, []*discoveryv1.EndpointSlice{s}, "n1")
	p := got[0].Port
	if ips(p.Endpoints) != "10.244.1.5:5353 " || !p.Endpoints[0].Local || p.AffinitySeconds != 7 || p.Protocol != 17 {
		t.Errorf("local+affinity: %s %+v", ips(p.Endpoints), p)
	}
	got, _ = Translate(svc, []*discoveryv1.EndpointSlice{s}, "n3")
	if got[0].Port.Action != pipeline.ServiceDrop {
		t.Errorf("no local endpoint: action %d, want drop", got[0].Port.Action)
	}
}

func TestIgnored(t *testing.T) {
	skip := map[string]bool{"ns/skipped": true}
	headless := service()
	headless.Spec.ClusterIP = corev1.ClusterIPNone
	other := service()
	other.Labels = map[string]string{LabelServiceProxyName: "foo"}
	skipped := service()
	skipped.Name = "skipped"
	for _, c := range []struct {
		svc  *corev1.Service
		want bool
	}{{service(), false}, {headless, true}, {other, true}, {skipped, true}} {
		if got := Ignored(c.svc, skip) != ""; got != c.want {
			t.Errorf("Ignored(%s %v) = %v, want %v", c.svc.Name, c.svc.Labels, got, c.want)
		}
	}
}

var benchBridge = pipeline.Bridge{Round: 1, GatewayPort: 2, GatewayMAC: net.HardwareAddr{2, 0, 0, 0, 0, 1},
	GatewayIP: net.IPv4(10, 244, 0, 1), PodCIDR: &net.IPNet{IP: net.IPv4(10, 244, 0, 0).To4(), Mask: net.CIDRMask(24, 32)}}

// Translating n Services of 2 ports and 3 endpoints each into flows and
// groups (the pure part of a full resync).
func benchmarkTranslate(b *testing.B, n int) {
	svcs := make([]*corev1.Service, n)
	slices := make([][]*discoveryv1.EndpointSlice, n)
	for i := range svcs {
		s := service(corev1.ServicePort{Name: "http", Port: 80}, corev1.ServicePort{Name: "https", Port: 443})
		s.Spec.ClusterIPs = []string{fmt.Sprintf("10.96.%d.%d", i/250, i%250+1)}
		svcs[i] = s
		sl := slice("http", 8080, ep{"10.244.1.5", "n1", true, true, false}, ep{"10.244.2.5", "n2", true, true, false},
			ep{fmt.Sprintf("10.244.3.%d", i%250+1), "n3", true, true, false})
		sl2 := sl.DeepCopy()
		sl2.Ports[0].Name = ptr("https")
		slices[i] = []*discoveryv1.EndpointSlice{sl, sl2}
	}
	b.ResetTimer()
	for b.Loop() {
		for i, s := range svcs {
			ports, err := Translate(s, slices[i], "n1")
			if err != nil {
				b.Fatal(err)
			}
			for j, p := range ports {
				p.Port.ID = uint32(2*i + j + 1)
				if _, _, err := pipeline.ServicePortFlows(benchBridge, p.Port); err != nil {
					b.Fatal(err)
				}
			}
		}
	}
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N)/float64(n), "ns/service")
}

func BenchmarkTranslate1000Services(b *testing.B)  { benchmarkTranslate(b, 1000) }
func BenchmarkTranslate10000Services(b *testing.B) { benchmarkTranslate(b, 10000) }
