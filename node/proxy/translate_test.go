package proxy

import (
	"fmt"
	"net"
	"slices"
	"strings"
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
	}, Scope{NodeName: "n1"})
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
		ep{"10.244.1.5", "n1", false, false, true}, ep{"10.244.2.5", "n2", false, true, true})}, Scope{NodeName: "n1"})
	if ips(got[0].Port.Endpoints) != "10.244.2.5:8080 " {
		t.Errorf("terminating fallback: %s", ips(got[0].Port.Endpoints))
	}
	got, _ = Translate(svc, []*discoveryv1.EndpointSlice{slice("http", 8080, ep{"10.244.1.5", "n1", false, false, true})}, Scope{NodeName: "n1"})
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
	got, _ := Translate(svc, []*discoveryv1.EndpointSlice{s}, Scope{NodeName: "n1"})
	p := got[0].Port
	if ips(p.Endpoints) != "10.244.1.5:5353 " || !p.Endpoints[0].Local || p.AffinitySeconds != 7 || p.Protocol != 17 {
		t.Errorf("local+affinity: %s %+v", ips(p.Endpoints), p)
	}
	got, _ = Translate(svc, []*discoveryv1.EndpointSlice{s}, Scope{NodeName: "n3"})
	if got[0].Port.Action != pipeline.ServiceDrop {
		t.Errorf("no local endpoint: action %d, want drop", got[0].Port.Action)
	}
}

// ClientIP affinity is the Service port's: each of its frontends (here
// eight: internal, external, nodeport and loadbalancer with their "/node"
// twins, and loadbalancer-pods) names the
// port's internal frontend, of its own port, in AffinityOf; without
// affinity none does.
func TestTranslateAffinitySharedByFrontends(t *testing.T) {
	svc := service(corev1.ServicePort{Name: "http", Port: 80, NodePort: 30080}, corev1.ServicePort{Name: "https", Port: 443, NodePort: 30443})
	svc.Spec.Type = corev1.ServiceTypeLoadBalancer
	svc.Spec.ExternalTrafficPolicy = corev1.ServiceExternalTrafficPolicyLocal
	svc.Spec.ExternalIPs = []string{"198.18.100.1"}
	svc.Spec.LoadBalancerSourceRanges = []string{"198.18.0.0/16"}
	svc.Status.LoadBalancer.Ingress = []corev1.LoadBalancerIngress{{IP: "198.18.100.2"}}
	svc.Spec.SessionAffinity = corev1.ServiceAffinityClientIP
	sl := slice("http", 8080, ep{"10.244.1.5", "n1", true, true, false})
	sl.Ports = append(sl.Ports, discoveryv1.EndpointPort{Name: ptr("https"), Port: ptr(int32(8443)), Protocol: ptr(corev1.ProtocolTCP)})
	scope := Scope{NodeName: "n1", ProxyAll: true, HostIPs: []net.IP{net.ParseIP("198.18.0.11").To4()}}
	got, err := Translate(svc, []*discoveryv1.EndpointSlice{sl}, scope)
	if err != nil {
		t.Fatal(err)
	}
	perPort := map[string]int{}
	for _, ps := range got {
		port := strings.Join(strings.SplitN(ps.Key, "/", 5)[:4], "/")
		perPort[port]++
		if ps.AffinityOf != port || int32(ps.Port.AffinitySeconds) != corev1.DefaultClientIPServiceAffinitySeconds {
			t.Errorf("%s: AffinityOf %q, AffinitySeconds %d; want %q, %d", ps.Key, ps.AffinityOf, ps.Port.AffinitySeconds, port, corev1.DefaultClientIPServiceAffinitySeconds)
		}
	}
	if perPort["ns/web/http/TCP"] != 8 || perPort["ns/web/https/TCP"] != 8 {
		t.Errorf("frontends per port %v, want 8 each", perPort)
	}
	svc.Spec.SessionAffinity = corev1.ServiceAffinityNone
	got, _ = Translate(svc, []*discoveryv1.EndpointSlice{sl}, Scope{NodeName: "n1"})
	for _, ps := range got {
		if ps.AffinityOf != "" {
			t.Errorf("%s without affinity: AffinityOf %q", ps.Key, ps.AffinityOf)
		}
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
			ports, err := Translate(s, slices[i], Scope{NodeName: "n1"})
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

// With proxyAll, a LoadBalancer Service gets a NodePort frontend on
// NodePortVIP and an external frontend on its externalIPs and ingress IPs
// (not those with ipMode Proxy); externalTrafficPolicy decides SNAT and
// local endpoints, and a Node without local endpoint drops.
func TestTranslateExternalFrontends(t *testing.T) {
	svc := service(corev1.ServicePort{Name: "http", Port: 80, NodePort: 30080})
	svc.Spec.Type = corev1.ServiceTypeLoadBalancer
	svc.Spec.ExternalIPs = []string{"198.18.100.1", "2001:db8::1"}
	svc.Status.LoadBalancer.Ingress = []corev1.LoadBalancerIngress{{IP: "198.18.100.2"},
		{IP: "198.18.100.3", IPMode: ptr(corev1.LoadBalancerIPModeProxy)}}
	slices := []*discoveryv1.EndpointSlice{slice("http", 8080,
		ep{"10.244.1.5", "n1", true, true, false}, ep{"10.244.2.5", "n2", true, true, false})}

	got, err := Translate(svc, slices, Scope{NodeName: "n1"})
	if err != nil || len(got) != 1 {
		t.Fatalf("without proxyAll: %+v, %v; want only the internal frontend", got, err)
	}
	if v := fmt.Sprint(got[0].Port.VIPs); v != "[10.96.0.10 198.18.100.1 198.18.100.2]" {
		t.Errorf("internal VIPs %s, want the ClusterIP, externalIP and ingress IP", v)
	}

	got, err = Translate(svc, slices, Scope{NodeName: "n1", ProxyAll: true})
	if err != nil || len(got) != 3 {
		t.Fatalf("got %+v, %v; want 3 frontends", got, err)
	}
	byKey := map[string]pipeline.ServicePort{}
	for _, ps := range got {
		byKey[ps.Key] = ps.Port
	}
	np, ok := byKey["ns/web/http/TCP/nodeport"]
	if !ok || !np.External || !np.SNAT || np.Port != 30080 || !np.VIPs[0].Equal(pipeline.NodePortVIP) || len(np.Endpoints) != 2 {
		t.Errorf("nodeport frontend %+v", np)
	}
	ext, ok := byKey["ns/web/http/TCP/external"]
	if !ok || !ext.External || ext.Port != 80 || fmt.Sprint(ext.VIPs) != "[198.18.100.1 198.18.100.2]" {
		t.Errorf("external frontend %+v", ext)
	}

	svc.Spec.ExternalTrafficPolicy = corev1.ServiceExternalTrafficPolicyLocal
	host := []net.IP{net.ParseIP("198.18.0.11").To4(), net.ParseIP("10.244.1.1").To4()}
	got, _ = Translate(svc, slices, Scope{NodeName: "n1", ProxyAll: true, HostIPs: host})
	if len(got) != 5 {
		t.Fatalf("externalTrafficPolicy Local: %d frontends, want 5 (internal, nodeport, external, and each of the last two for the Node's own connections)", len(got))
	}
	for _, ps := range got {
		switch {
		case strings.HasSuffix(ps.Key, "/node"):
			// The Node's own connections, and its Pods', go to every
			// endpoint, unSNATed.
			if !ps.Port.External || ps.Port.SNAT || fmt.Sprint(ps.Port.Sources) != "[198.18.0.11/32 10.244.1.1/32]" || !ps.Port.LocalPods || len(ps.Port.Endpoints) != 2 {
				t.Errorf("%s: %+v", ps.Key, ps.Port)
			}
		case ps.Port.External && (ps.Port.SNAT || ips(ps.Port.Endpoints) != "10.244.1.5:8080 "):
			t.Errorf("%s with externalTrafficPolicy Local: SNAT %v, endpoints %s; want no SNAT, the local one", ps.Key, ps.Port.SNAT, ips(ps.Port.Endpoints))
		case !ps.Port.External && len(ps.Port.Endpoints) != 2:
			t.Errorf("internal frontend must keep every endpoint, got %s", ips(ps.Port.Endpoints))
		}
	}
	got, _ = Translate(svc, slices, Scope{NodeName: "n3", ProxyAll: true})
	for _, ps := range got {
		if ps.Port.Kind() == pipeline.FrontendSourced {
			// Without host addresses, the Node's Pods alone.
			if len(ps.Port.Sources) > 0 || !ps.Port.LocalPods || len(ps.Port.Endpoints) != 2 {
				t.Errorf("%s on a Node without addresses: %+v, want its Pods to every endpoint", ps.Key, ps.Port)
			}
			continue
		}
		if ps.Port.External && ps.Port.Action != pipeline.ServiceDrop {
			t.Errorf("%s on a Node without local endpoint: action %v, want drop", ps.Key, ps.Port.Action)
		}
	}
	got, _ = Translate(svc, nil, Scope{NodeName: "n1", ProxyAll: true})
	for _, ps := range got {
		if ps.Port.Action != pipeline.ServiceReject {
			t.Errorf("%s without endpoints: action %v, want reject", ps.Key, ps.Port.Action)
		}
	}
	// A ClusterIP Service has no NodePort frontend even with a stale nodePort.
	svc.Spec.Type = corev1.ServiceTypeClusterIP
	svc.Spec.ExternalIPs, svc.Status.LoadBalancer.Ingress = nil, nil
	if got, _ = Translate(svc, slices, Scope{NodeName: "n1", ProxyAll: true}); len(got) != 1 {
		t.Errorf("ClusterIP Service: %d frontends, want 1", len(got))
	}
}

func TestHostNeeds(t *testing.T) {
	els, routes := hostNeeds(pipeline.ServicePort{VIPs: []net.IP{pipeline.NodePortVIP}, Protocol: 17, Port: 30053,
		External: true, Action: pipeline.ServiceReject}, nil, nil)
	if len(routes) != 0 || len(els) != 2 || els[0].id() != "no-endpoints 169.254.100.2 . 17 . 30053" || els[1].id() != "nodeports 17 . 30053" {
		t.Errorf("nodeport without endpoints: %v %v", els, routes)
	}
	els, routes = hostNeeds(pipeline.ServicePort{VIPs: []net.IP{net.ParseIP("198.18.100.1")}, Protocol: 6, Port: 80, External: true}, nil, nil)
	if len(els) != 0 || len(routes) != 1 || routes[0].String() != "198.18.100.1" {
		t.Errorf("external IP: %v %v", els, routes)
	}
	// With an alias (listed among the VIPs): the IP's route, port and
	// alias map element; nothing of the alias's own.
	alias := net.ParseIP("169.254.192.1").To4()
	els, routes = hostNeeds(pipeline.ServicePort{VIPs: []net.IP{net.ParseIP("198.18.100.1"), alias}, Protocol: 6, Port: 80,
		External: true, Action: pipeline.ServiceReject}, nil, map[string]net.IP{"198.18.100.1": alias})
	var ids []string
	for _, e := range els {
		ids = append(ids, e.id())
	}
	want := []string{"no-endpoints 198.18.100.1 . 6 . 80", "no-endpoints 169.254.192.1 . 6 . 80",
		"external-ports 198.18.100.1 . 6 . 80", "local-vip-aliases 198.18.100.1"}
	if !slices.Equal(ids, want) || len(routes) != 1 || routes[0].String() != "198.18.100.1" || els[3].value[0] != alias.String() {
		t.Errorf("external IP with an alias: %v %v, want %v and a route to 198.18.100.1", ids, routes, want)
	}
	els, routes = hostNeeds(pipeline.ServicePort{VIPs: []net.IP{net.ParseIP("10.96.0.10"), net.ParseIP("198.18.100.1")}, Protocol: 6, Port: 80},
		[]net.IP{net.ParseIP("10.96.0.10")}, nil)
	if len(routes) != 0 || len(els) != 2 || els[0].id() != "cluster-ips 10.96.0.10" || els[1].id() != "service-ports 10.96.0.10 . 6 . 80" {
		t.Errorf("internal frontend: %v %v", els, routes)
	}
}

// A ClusterIP outside the serviceCIDR route (a range added with a
// ServiceCIDR object) gets a route of its own to the gateway, with
// proxyAll only.
func TestHostNeedsRoutesOtherServiceCIDRs(t *testing.T) {
	_, cidr, _ := net.ParseCIDR("10.96.0.0/17")
	ips := []net.IP{net.ParseIP("10.96.0.10"), net.ParseIP("10.96.200.10")}
	sp := pipeline.ServicePort{VIPs: ips, Protocol: 6, Port: 80}
	p := &Proxier{cfg: Config{ProxyAll: true, ServiceCIDR: cidr}}
	if _, routes := p.hostNeedsWithClusterRoutes(sp, ips, nil); len(routes) != 1 || routes[0].String() != "10.96.200.10" {
		t.Errorf("proxyAll: routes %v, want 10.96.200.10 alone", routes)
	}
	p.cfg.ProxyAll = false
	if _, routes := p.hostNeedsWithClusterRoutes(sp, ips, nil); len(routes) != 0 {
		t.Errorf("without proxyAll: routes %v, want none", routes)
	}
}

func TestCanonicalKey(t *testing.T) {
	got := element{set: SetNoEndpoints, key: canonicalKey([]string{"10.96.0.1", "udp", "53"})}
	if want := rejectElement(net.ParseIP("10.96.0.1"), 17, 53); got.id() != want.id() {
		t.Errorf("listed element %q does not match written %q", got.id(), want.id())
	}
}

// The only UDP port of a Service takes the fragments sent to its
// ClusterIPs (not to its externalIPs, which other Services may share);
// with two UDP ports neither does, and TCP never does.
func TestTranslateFragmentVIPs(t *testing.T) {
	dns := corev1.ServicePort{Name: "dns", Port: 53, Protocol: corev1.ProtocolUDP}
	web := corev1.ServicePort{Name: "http", Port: 80, Protocol: corev1.ProtocolTCP}
	syslog := corev1.ServicePort{Name: "syslog", Port: 514, Protocol: corev1.ProtocolUDP}
	frags := func(svc *corev1.Service) map[string]string {
		got, err := Translate(svc, nil, Scope{NodeName: "n1", ProxyAll: true})
		if err != nil {
			t.Fatal(err)
		}
		m := map[string]string{}
		for _, ps := range got {
			var s []string
			for _, ip := range ps.Port.FragmentVIPs {
				s = append(s, ip.String())
			}
			m[ps.Key] = strings.Join(s, ",")
		}
		return m
	}
	one := service(dns, web)
	one.Spec.ExternalIPs = []string{"198.18.100.1"}
	got := frags(one)
	if got["ns/web/dns/UDP"] != "10.96.0.10" || got["ns/web/http/TCP"] != "" || got["ns/web/dns/UDP/external"] != "" {
		t.Errorf("one UDP port: fragment VIPs %v, want the ClusterIP on the UDP port's internal frontend only", got)
	}
	if got := frags(service(dns, syslog)); got["ns/web/dns/UDP"] != "" || got["ns/web/syslog/UDP"] != "" {
		t.Errorf("two UDP ports: fragment VIPs %v, want none", got)
	}
}

// loadBalancerSourceRanges: the LoadBalancer IPs get frontends of their
// own, for Pods and (with proxyAll) from outside, that admit the ranges
// only (trimmed, IPv4), also where the LoadBalancer IP is an externalIP
// too; the ClusterIP and the other externalIPs stay open. A range
// of every address, or no IPv4 range, admits all, as none does. A range
// holding a Node address admits the LoadBalancer IPs as sources too, and
// under externalTrafficPolicy Local the Node's own connections keep their
// frontend only from the addresses the ranges admit.
func TestTranslateLoadBalancerSourceRanges(t *testing.T) {
	svc := service(corev1.ServicePort{Name: "http", Port: 80, NodePort: 30080})
	svc.Spec.Type = corev1.ServiceTypeLoadBalancer
	// The LoadBalancer IP is an externalIP too: the ranges apply to it.
	svc.Spec.ExternalIPs = []string{"198.18.100.1", "198.18.100.2"}
	svc.Status.LoadBalancer.Ingress = []corev1.LoadBalancerIngress{{IP: "198.18.100.2"}}
	svc.Spec.LoadBalancerSourceRanges = []string{" 198.19.5.0/24", "2001:db8::/64"}
	eps := []*discoveryv1.EndpointSlice{slice("http", 8080,
		ep{"10.244.1.5", "n1", true, true, false}, ep{"10.244.2.5", "n2", true, true, false})}
	byKey := func(scope Scope) map[string]pipeline.ServicePort {
		t.Helper()
		got, err := Translate(svc, eps, scope)
		if err != nil {
			t.Fatal(err)
		}
		m := map[string]pipeline.ServicePort{}
		for _, ps := range got {
			m[ps.Key] = ps.Port
		}
		return m
	}
	m := byKey(Scope{NodeName: "n1", ProxyAll: true, HostIPs: []net.IP{net.ParseIP("198.18.0.11").To4()}})
	want := map[string]string{
		"ns/web/http/TCP":                   "[10.96.0.10 198.18.100.1] []",
		"ns/web/http/TCP/loadbalancer-pods": "[198.18.100.2] [198.19.5.0/24]",
		"ns/web/http/TCP/nodeport":          fmt.Sprint([]net.IP{pipeline.NodePortVIP}) + " []",
		"ns/web/http/TCP/external":          "[198.18.100.1] []",
		"ns/web/http/TCP/loadbalancer":      "[198.18.100.2] [198.19.5.0/24]",
	}
	if len(m) != len(want) {
		t.Errorf("frontends %v, want %d", m, len(want))
	}
	for k, w := range want {
		sp, ok := m[k]
		if got := fmt.Sprint(sp.VIPs, sp.SourceRanges); !ok || got != w {
			t.Errorf("%s: VIPs and ranges %s (present %v), want %s", k, got, ok, w)
		}
	}
	if lb := m["ns/web/http/TCP/loadbalancer"]; !lb.External || lb.Port != 80 || len(lb.Endpoints) != 2 {
		t.Errorf("external LoadBalancer frontend %+v", lb)
	}
	if lb := m["ns/web/http/TCP/loadbalancer-pods"]; lb.External || len(lb.Endpoints) != 2 {
		t.Errorf("LoadBalancer frontend for Pods %+v", lb)
	}

	// A range holding the Node's address admits the LoadBalancer IP too;
	// externalTrafficPolicy Local: the Node's own connections only from
	// the admitted addresses.
	svc.Spec.LoadBalancerSourceRanges = []string{"198.18.0.0/24"}
	svc.Spec.ExternalTrafficPolicy = corev1.ServiceExternalTrafficPolicyLocal
	m = byKey(Scope{NodeName: "n1", ProxyAll: true, HostIPs: []net.IP{net.ParseIP("198.18.0.11").To4(), net.ParseIP("10.244.1.1").To4()}})
	if r := fmt.Sprint(m["ns/web/http/TCP/loadbalancer"].SourceRanges); r != "[198.18.0.0/24 198.18.100.2/32]" {
		t.Errorf("ranges %s, want the range and the LoadBalancer IP", r)
	}
	if n, ok := m["ns/web/http/TCP/loadbalancer/node"]; !ok || fmt.Sprint(n.Sources) != "[198.18.0.11/32]" || n.LocalPods || n.SNAT {
		t.Errorf("the Node's own frontend on the LoadBalancer IP: %+v (present %v), want from 198.18.0.11 only", n, ok)
	}

	svc.Spec.ExternalIPs = []string{"198.18.100.1"}
	for _, open := range [][]string{{"0.0.0.0/0"}, {"2001:db8::/64"}, nil} {
		svc.Spec.LoadBalancerSourceRanges = open
		for k, sp := range byKey(Scope{NodeName: "n1", ProxyAll: true}) {
			if len(sp.SourceRanges) > 0 || strings.Contains(k, "loadbalancer") {
				t.Errorf("ranges %q: frontend %s with ranges %v, want the LoadBalancer IP open", open, k, sp.SourceRanges)
			}
		}
	}
}

// hinted gives the endpoints of s zone hints (zones[i] for endpoint i,
// "" for none) and Node hints (nodes[i]).
func hinted(s *discoveryv1.EndpointSlice, zones, nodes []string) *discoveryv1.EndpointSlice {
	for i := range s.Endpoints {
		h := &discoveryv1.EndpointHints{}
		if i < len(zones) && zones[i] != "" {
			h.ForZones = []discoveryv1.ForZone{{Name: zones[i]}}
		}
		if i < len(nodes) && nodes[i] != "" {
			h.ForNodes = []discoveryv1.ForNode{{Name: nodes[i]}}
		}
		s.Endpoints[i].Hints = h
	}
	return s
}

func TestTranslateTopologyHints(t *testing.T) {
	eps := func() *discoveryv1.EndpointSlice {
		return slice("http", 8080, ep{"10.244.1.5", "n1", true, true, false},
			ep{"10.244.2.5", "n2", true, true, false}, ep{"10.244.3.5", "n3", true, true, false})
	}
	all := "10.244.1.5:8080 10.244.2.5:8080 10.244.3.5:8080 "
	for _, tc := range []struct {
		name         string
		zones, nodes []string
		zone         string // the Node's (n1)
		mutate       func(*discoveryv1.EndpointSlice)
		want         string
	}{
		{name: "no hints", zone: "a", want: all},
		{name: "zone hints", zones: []string{"a", "b", "a"}, zone: "a", want: "10.244.1.5:8080 10.244.3.5:8080 "},
		{name: "zone hints, none for this zone", zones: []string{"b", "b", "c"}, zone: "a", want: all},
		{name: "zone hints, Node without zone", zones: []string{"a", "b", "a"}, want: all},
		{name: "zone hints on some endpoints only", zones: []string{"a", "", "a"}, zone: "a", want: all},
		{name: "node hints first", zones: []string{"a", "a", "b"}, nodes: []string{"n1", "n2", "n3"}, zone: "a",
			want: "10.244.1.5:8080 "},
		{name: "node hints, none for this Node: zone hints", zones: []string{"b", "a", "a"}, nodes: []string{"n2", "n2", "n3"},
			zone: "a", want: "10.244.2.5:8080 10.244.3.5:8080 "},
		{name: "node hints on some endpoints only: zone hints", zones: []string{"a", "b", "b"}, nodes: []string{"n1", "", "n3"},
			zone: "a", want: "10.244.1.5:8080 "},
		{name: "hints of endpoints not ready do not count", zones: []string{"b", "a", "a"}, zone: "a",
			mutate: func(s *discoveryv1.EndpointSlice) { s.Endpoints[0].Conditions.Ready = ptr(false) },
			want:   "10.244.2.5:8080 10.244.3.5:8080 "},
		{name: "only terminating endpoints: no filtering", zones: []string{"a", "b", "b"}, zone: "a",
			mutate: func(s *discoveryv1.EndpointSlice) {
				for i := range s.Endpoints {
					s.Endpoints[i].Conditions.Ready, s.Endpoints[i].Conditions.Terminating = ptr(false), ptr(true)
				}
			},
			want: all},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := hinted(eps(), tc.zones, tc.nodes)
			if tc.mutate != nil {
				tc.mutate(s)
			}
			svc := service(corev1.ServicePort{Name: "http", Port: 80})
			got, err := Translate(svc, []*discoveryv1.EndpointSlice{s}, Scope{NodeName: "n1", Zone: tc.zone})
			if err != nil {
				t.Fatal(err)
			}
			if len(got) != 1 {
				t.Fatalf("got %d ports, want 1", len(got))
			}
			if g := ips(got[0].Port.Endpoints); g != tc.want {
				t.Errorf("endpoints %q, want %q", g, tc.want)
			}
		})
	}
}

// The Local traffic policies ignore hints; the other frontends of the
// same Service follow them, and the Node's own connections under
// externalTrafficPolicy Local take the hinted endpoints too, as
// kube-proxy sends them to its cluster-wide set.
func TestTranslateTopologyHintsAndLocalPolicies(t *testing.T) {
	s := hinted(slice("http", 8080, ep{"10.244.1.5", "n1", true, true, false},
		ep{"10.244.2.5", "n2", true, true, false}, ep{"10.244.3.5", "n1", true, true, false}),
		[]string{"b", "a", "b"}, nil)
	svc := service(corev1.ServicePort{Name: "http", Port: 80, NodePort: 30080})
	svc.Spec.Type = corev1.ServiceTypeNodePort
	svc.Spec.InternalTrafficPolicy = ptr(corev1.ServiceInternalTrafficPolicyLocal)
	got, err := Translate(svc, []*discoveryv1.EndpointSlice{s}, Scope{NodeName: "n1", Zone: "a", ProxyAll: true,
		HostIPs: []net.IP{net.ParseIP("198.18.0.1")}})
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]string{
		"ns/web/http/TCP":          "10.244.1.5:8080 10.244.3.5:8080 ", // internal Local: this Node's
		"ns/web/http/TCP/nodeport": "10.244.2.5:8080 ",                 // external Cluster: zone a's
	}
	if len(got) != len(want) {
		t.Errorf("got %d ports, want %d", len(got), len(want))
	}
	for _, ps := range got {
		if w, ok := want[ps.Key]; !ok || ips(ps.Port.Endpoints) != w {
			t.Errorf("%s: endpoints %q, want %q", ps.Key, ips(ps.Port.Endpoints), w)
		}
	}
	svc.Spec.InternalTrafficPolicy = nil
	svc.Spec.ExternalTrafficPolicy = corev1.ServiceExternalTrafficPolicyLocal
	got, err = Translate(svc, []*discoveryv1.EndpointSlice{s}, Scope{NodeName: "n1", Zone: "a", ProxyAll: true,
		HostIPs: []net.IP{net.ParseIP("198.18.0.1")}})
	if err != nil {
		t.Fatal(err)
	}
	want = map[string]string{
		"ns/web/http/TCP":               "10.244.2.5:8080 ",
		"ns/web/http/TCP/nodeport":      "10.244.1.5:8080 10.244.3.5:8080 ",
		"ns/web/http/TCP/nodeport/node": "10.244.2.5:8080 ",
	}
	if len(got) != len(want) {
		t.Errorf("got %d ports, want %d", len(got), len(want))
	}
	for _, ps := range got {
		if w, ok := want[ps.Key]; !ok || ips(ps.Port.Endpoints) != w {
			t.Errorf("%s: endpoints %q, want %q", ps.Key, ips(ps.Port.Endpoints), w)
		}
	}
}

// Under internalTrafficPolicy Local, the ClusterIPs alone keep to the
// Node's endpoints: from Pods, externalIPs and LoadBalancer IPs (ranged or
// not) go to the endpoints cluster-wide, as kube-proxy sends them.
func TestTranslateInternalLocalSparesExternalIPs(t *testing.T) {
	s := slice("http", 8080, ep{"10.244.1.5", "n1", true, true, false}, ep{"10.244.2.5", "n2", true, true, false})
	svc := service(corev1.ServicePort{Name: "http", Port: 80})
	svc.Spec.Type = corev1.ServiceTypeLoadBalancer
	svc.Spec.InternalTrafficPolicy = ptr(corev1.ServiceInternalTrafficPolicyLocal)
	svc.Spec.ExternalIPs = []string{"198.18.5.5"}
	svc.Status.LoadBalancer.Ingress = []corev1.LoadBalancerIngress{{IP: "198.18.5.6"}}
	check := func(want map[string]string) {
		t.Helper()
		got, err := Translate(svc, []*discoveryv1.EndpointSlice{s}, Scope{NodeName: "n1"})
		if err != nil {
			t.Fatal(err)
		}
		if len(got) != len(want) {
			t.Errorf("got %d frontends, want %d: %+v", len(got), len(want), got)
		}
		for _, ps := range got {
			var vips []string
			for _, v := range ps.Port.VIPs {
				vips = append(vips, v.String())
			}
			g := strings.Join(vips, ",") + " → " + ips(ps.Port.Endpoints)
			if want[ps.Key] != g {
				t.Errorf("%s: %q, want %q", ps.Key, g, want[ps.Key])
			}
		}
	}
	both := "10.244.1.5:8080 10.244.2.5:8080 "
	check(map[string]string{
		"ns/web/http/TCP":               "10.96.0.10 → 10.244.1.5:8080 ",
		"ns/web/http/TCP/external-pods": "198.18.5.5,198.18.5.6 → " + both,
	})
	svc.Spec.LoadBalancerSourceRanges = []string{"198.18.0.0/24"}
	check(map[string]string{
		"ns/web/http/TCP":                   "10.96.0.10 → 10.244.1.5:8080 ",
		"ns/web/http/TCP/external-pods":     "198.18.5.5 → " + both,
		"ns/web/http/TCP/loadbalancer-pods": "198.18.5.6 → " + both,
	})
	svc.Spec.InternalTrafficPolicy = nil
	check(map[string]string{
		"ns/web/http/TCP":                   "10.96.0.10,198.18.5.5 → " + both,
		"ns/web/http/TCP/loadbalancer-pods": "198.18.5.6 → " + both,
	})
}
