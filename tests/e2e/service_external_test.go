package e2e

import (
	"context"
	"fmt"
	"net"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/util/retry"

	"github.com/seine-net/seine/datapath/pipeline"
	"github.com/seine-net/seine/node/config"
	"github.com/seine-net/seine/tests/sandbox"
	"github.com/seine-net/seine/tests/sandbox/echo"
)

// probeFromNS probes from a network namespace by name n times and counts
// the answering Pods (failures as "!outcome"); it returns one connected
// result.
func probeFromNS(t *testing.T, c *sandbox.Cluster, netns, ip string, port int, proto corev1.Protocol, n int) (map[string]int, echo.Result) {
	t.Helper()
	got := map[string]int{}
	var last echo.Result
	for i := 0; i < n; i++ {
		r := c.ProbeFrom(testCtx(t, 10*time.Second), netns, ip, port, proto, 2*time.Second)
		if r.Outcome != echo.Connected {
			got["!"+string(r.Outcome)]++
			continue
		}
		got[r.Reply]++
		last = r
	}
	return got, last
}

func nodePortOf(t *testing.T, svc *corev1.Service, name string) int {
	t.Helper()
	for _, p := range svc.Spec.Ports {
		if p.Name == name && p.NodePort > 0 {
			return int(p.NodePort)
		}
	}
	t.Fatalf("service %s/%s has no nodePort for %q", svc.Namespace, svc.Name, name)
	return 0
}

// NodePort (externalTrafficPolicy Cluster) from the external host on every
// Node address, TCP and UDP: every Node serves, also one without a local
// endpoint; connections spread over the endpoints of all Nodes; the
// source is SNATed so replies come back. The same NodePort works from a
// Pod, and from a Node's host to its own address; the host also reaches
// the ClusterIP.
func TestServiceNodePort(t *testing.T) {
	c := shared
	ns := "svc-nodeport"
	pods := svcPods(t, c, ns, "np", 0, 1)
	svc := createService(t, c, ns, "np", "np", func(s *corev1.Service) { s.Spec.Type = corev1.ServiceTypeNodePort })
	extNS, extIP := c.ExternalHost()
	tcpNP, udpNP := nodePortOf(t, svc, "http"), nodePortOf(t, svc, "dns")
	all := names(pods)
	for _, n := range c.Nodes() {
		eventually(t, 20*time.Second, fmt.Sprintf("external host to %s:%d reaches every endpoint", n.IP, tcpNP), func() error {
			got, r := probeFromNS(t, c, extNS, n.IP, tcpNP, corev1.ProtocolTCP, 16)
			if keys(got) != all {
				return fmt.Errorf("answered by %v, want each of %s", got, all)
			}
			// SNATed to a Node's gateway address, or (an endpoint the
			// Node reaches through its host: routed peers) to a Node IP.
			if host, _, _ := net.SplitHostPort(r.Client); host == extIP || !strings.HasPrefix(host, "10.244.") && !isNodeIP(c, host) {
				return fmt.Errorf("server saw client %s, want a Node's gateway address or Node IP (SNAT)", r.Client)
			}
			return nil
		})
		eventually(t, 10*time.Second, fmt.Sprintf("external host to %s:%d/UDP", n.IP, udpNP), func() error {
			if r := c.ProbeFrom(testCtx(t, 10*time.Second), extNS, n.IP, udpNP, corev1.ProtocolUDP, 2*time.Second); r.Outcome != echo.Connected {
				return fmt.Errorf("got %s", r)
			}
			return nil
		})
	}
	nodes := c.Nodes()
	client := svcPods(t, c, ns, "client", 2)[0]
	eventually(t, 10*time.Second, "Pod to a Node's NodePort", func() error {
		if r := probeSvc(t, c, client, nodes[0].IP, tcpNP, corev1.ProtocolTCP, 2*time.Second); r.Outcome != echo.Connected {
			return fmt.Errorf("got %s", r)
		}
		return nil
	})
	eventually(t, 10*time.Second, "host to its own NodePort and to the ClusterIP", func() error {
		for _, dst := range []struct {
			ip   string
			port int
		}{{nodes[2].IP, tcpNP}, {svc.Spec.ClusterIP, 80}} {
			if r := c.ProbeFrom(testCtx(t, 10*time.Second), nodes[2].NetNS, dst.ip, dst.port, corev1.ProtocolTCP, 2*time.Second); r.Outcome != echo.Connected {
				return fmt.Errorf("%s:%d: got %s", dst.ip, dst.port, r)
			}
		}
		return nil
	})
}

// isNodeIP reports whether ip is a sandbox Node's address.
func isNodeIP(c *sandbox.Cluster, ip string) bool {
	for _, n := range c.Nodes() {
		if n.IP == ip {
			return true
		}
	}
	return false
}

// externalTrafficPolicy Local: only Nodes with a local endpoint serve the
// NodePort, and the endpoint sees the external host's own address; the
// Node's own connections and its Pods' go to every endpoint.
func TestServiceExternalTrafficPolicyLocal(t *testing.T) {
	c := shared
	ns := "svc-etp"
	pods := svcPods(t, c, ns, "etp", 1)
	svc := createService(t, c, ns, "etp", "etp", func(s *corev1.Service) {
		s.Spec.Type = corev1.ServiceTypeNodePort
		s.Spec.ExternalTrafficPolicy = corev1.ServiceExternalTrafficPolicyLocal
	})
	extNS, extIP := c.ExternalHost()
	np := nodePortOf(t, svc, "http")
	nodes := c.Nodes()
	eventually(t, 20*time.Second, "the Node with the endpoint serves", func() error {
		got, r := probeFromNS(t, c, extNS, nodes[1].IP, np, corev1.ProtocolTCP, 4)
		if keys(got) != pods[0].name {
			return fmt.Errorf("answered by %v", got)
		}
		if !strings.HasPrefix(r.Client, extIP+":") {
			return fmt.Errorf("server saw client %s, want the external host %s", r.Client, extIP)
		}
		return nil
	})
	for _, n := range []sandbox.Node{nodes[0], nodes[2]} {
		if r := c.ProbeFrom(testCtx(t, 10*time.Second), extNS, n.IP, np, corev1.ProtocolTCP, time.Second); r.Outcome != echo.TimedOut {
			t.Errorf("%s without a local endpoint: %s, want the connection dropped", n.Name, r)
		}
	}
	// The Node's own connections are not external: a Node without a local
	// endpoint reaches the Service on its own NodePort, and the endpoint
	// sees the Node's address (as kube-proxy's short-circuit does).
	eventually(t, 20*time.Second, nodes[0].Name+" to its own NodePort", func() error {
		got, r := probeFromNS(t, c, nodes[0].NetNS, nodes[0].IP, np, corev1.ProtocolTCP, 2)
		if keys(got) != pods[0].name {
			return fmt.Errorf("answered by %v", got)
		}
		if !strings.HasPrefix(r.Client, nodes[0].IP+":") {
			return fmt.Errorf("server saw client %s, want the Node %s", r.Client, nodes[0].IP)
		}
		return nil
	})
	// Nor are its Pods' connections to its NodePort: they too reach the
	// endpoint on another Node, with their own address, or the Node's
	// where the hosts route between Nodes (the endpoint's answer must pass
	// this Node's host, which undoes its DNAT: host SNAT). In
	// networkPolicyOnly mode the bridge tells its Pods by their addresses,
	// having no Pod range of its own. A Pod on the endpoint's Node reaches
	// it with its own address in every mode.
	clients := svcPods(t, c, ns, "client", 0, 1)
	for i, client := range clients {
		node := nodes[i]
		eventually(t, 20*time.Second, "a Pod to its own Node's NodePort on "+node.Name, func() error {
			r := probeSvc(t, c, client, node.IP, np, corev1.ProtocolTCP, 2*time.Second)
			if r.Outcome != echo.Connected || r.Reply != pods[0].name {
				return fmt.Errorf("got %s", r)
			}
			routedByHosts := e2eMode != config.ModeEncap && client.node != pods[0].node && strings.HasPrefix(r.Client, node.IP+":")
			if !strings.HasPrefix(r.Client, client.ip+":") && !routedByHosts {
				return fmt.Errorf("server saw client %s, want the Pod %s (or, routed by the hosts, its Node %s)", r.Client, client.ip, node.IP)
			}
			return nil
		})
	}
}

// servedLocally probes TCP port 80 of ip from the network namespace extNS
// (whose address is extIP) and wants every answer from the Pod local, with
// the client's address kept: the shape of externalTrafficPolicy Local.
func servedLocally(t *testing.T, c *sandbox.Cluster, extNS, extIP, ip, local string) func() error {
	return func() error {
		got, r := probeFromNS(t, c, extNS, ip, 80, corev1.ProtocolTCP, 6)
		if keys(got) != local {
			return fmt.Errorf("answered by %v, want only the local %s", got, local)
		}
		if !strings.HasPrefix(r.Client, extIP+":") {
			return fmt.Errorf("server saw client %s, want %s", r.Client, extIP)
		}
		return nil
	}
}

// ClientIP affinity is the Service port's across its frontends: a client
// outside the cluster keeps its endpoint whether it connects to the
// Service's externalIP or to its NodePort on the same Node, as under
// kube-proxy (before, each frontend remembered clients on its own).
func TestServiceSessionAffinityAcrossFrontends(t *testing.T) {
	c := shared
	ns := "svc-affinity-ext"
	pods := svcPods(t, c, ns, "affx", 0, 1, 2)
	const extIPAddr = "198.18.100.33"
	svc := createService(t, c, ns, "sticky", "affx", func(s *corev1.Service) {
		s.Spec.Type = corev1.ServiceTypeNodePort
		s.Spec.ExternalIPs = []string{extIPAddr}
		s.Spec.SessionAffinity = corev1.ServiceAffinityClientIP
		s.Spec.SessionAffinityConfig = &corev1.SessionAffinityConfig{ClientIP: &corev1.ClientIPConfig{TimeoutSeconds: ptrTo(int32(600))}}
	})
	node := c.Nodes()[0]
	undo, err := c.RouteToNode(testCtx(t, 30*time.Second), extIPAddr+"/32", node.Name)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(undo)
	extNS, extIP := c.ExternalHost()
	np := nodePortOf(t, svc, "http")
	eventually(t, 20*time.Second, "the Service through "+node.Name, func() error {
		if got, _ := probeFromNS(t, c, extNS, extIPAddr, 80, corev1.ProtocolTCP, 1); len(got) != 1 || strings.HasPrefix(keys(got), "!") {
			return fmt.Errorf("answered by %v", got)
		}
		return nil
	})
	// Each round the NodePort picks the externalIP's endpoint by chance
	// once in three: three rounds, once in 27.
	for round := 0; round < 3; round++ {
		got, _ := probeFromNS(t, c, extNS, extIPAddr, 80, corev1.ProtocolTCP, 4)
		if len(got) != 1 || strings.HasPrefix(keys(got), "!") {
			t.Fatalf("round %d: the externalIP answered by %v, want one of %s", round, got, names(pods))
		}
		if at, _ := probeFromNS(t, c, extNS, node.IP, np, corev1.ProtocolTCP, 4); keys(at) != keys(got) {
			t.Fatalf("round %d: the NodePort answered by %v, the externalIP by %v: the affinity is not the Service port's", round, at, got)
		}
		// Forget the client (its learned flow, then the datapath flows
		// cached from it) so that the next round chooses afresh.
		ovs(t, node, "ovs-ofctl", "del-flows", brInt(node), fmt.Sprintf("table=%d,ip,nw_src=%s", pipeline.SessionAffinity, extIP))
		ovs(t, node, "ovs-appctl", "revalidator/wait")
		ovs(t, node, "ovs-appctl", "revalidator/wait")
	}
}

// everyProbeAnswered probes TCP port 80 of ip four times from the network
// namespace netns and wants every probe answered, by any endpoint.
func everyProbeAnswered(t *testing.T, c *sandbox.Cluster, netns, ip string) func() error {
	return func() error {
		got, _ := probeFromNS(t, c, netns, ip, 80, corev1.ProtocolTCP, 4)
		for k := range got {
			if strings.HasPrefix(k, "!") {
				return fmt.Errorf("got %v, want every probe answered", got)
			}
		}
		return nil
	}
}

// externalIPs and LoadBalancer ingress IPs, routed by the underlay router
// to one Node, reach the Service from the external host; a LoadBalancer
// Service with externalTrafficPolicy Local keeps the client address.
func TestServiceExternalIPsAndLoadBalancer(t *testing.T) {
	c := shared
	ns := "svc-lb"
	pods := svcPods(t, c, ns, "lb", 0, 2)
	const extIPAddr, lbIP = "198.18.100.10", "198.18.100.11"
	eip := createService(t, c, ns, "eip", "lb", func(s *corev1.Service) { s.Spec.ExternalIPs = []string{extIPAddr} })
	lb := createService(t, c, ns, "lb", "lb", func(s *corev1.Service) {
		s.Spec.Type = corev1.ServiceTypeLoadBalancer
		s.Spec.ExternalTrafficPolicy = corev1.ServiceExternalTrafficPolicyLocal
	})
	ctx := testCtx(t, time.Minute)
	lb.Status.LoadBalancer.Ingress = []corev1.LoadBalancerIngress{{IP: lbIP}}
	if _, err := c.Client().CoreV1().Services(ns).UpdateStatus(ctx, lb, metav1.UpdateOptions{}); err != nil {
		t.Fatalf("setting LoadBalancer ingress: %v", err)
	}
	nodes := c.Nodes()
	for _, r := range []struct{ dst, node string }{{extIPAddr + "/32", nodes[1].Name}, {lbIP + "/32", nodes[2].Name}} {
		undo, err := c.RouteToNode(ctx, r.dst, r.node)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(undo)
	}
	extNS, extIP := c.ExternalHost()
	all := names(pods)
	eventually(t, 20*time.Second, "externalIP through "+nodes[1].Name, func() error {
		if got, _ := probeFromNS(t, c, extNS, extIPAddr, 80, corev1.ProtocolTCP, 16); keys(got) != all {
			return fmt.Errorf("answered by %v, want each of %s", got, all)
		}
		return nil
	})
	eventually(t, 20*time.Second, "LoadBalancer IP through "+nodes[2].Name, servedLocally(t, c, extNS, extIP, lbIP, pods[1].name))
	// The health check node port tells a load balancer which Nodes have a
	// local endpoint: 200 on the Nodes of the two endpoints, 503 elsewhere.
	lbNow, err := c.Client().CoreV1().Services(ns).Get(ctx, lb.Name, metav1.GetOptions{})
	if err != nil || lbNow.Spec.HealthCheckNodePort == 0 {
		t.Fatalf("LoadBalancer Service without healthCheckNodePort: %v", err)
	}
	for i, want := range []string{"200", "503", "200"} {
		url := fmt.Sprintf("http://%s:%d/healthz", nodes[i].IP, lbNow.Spec.HealthCheckNodePort)
		eventually(t, 10*time.Second, "health check "+url, func() error {
			out, err := c.ExternalExec(testCtx(t, 10*time.Second), "curl", "-s", "-o", "/dev/null", "-w", "%{http_code}", "--max-time", "2", url)
			if got := strings.TrimSpace(string(out)); got != want {
				return fmt.Errorf("got %q (%v), want %s", got, err, want)
			}
			return nil
		})
	}
	// From a Pod, the externalIP is served like the ClusterIP.
	eventually(t, 10*time.Second, "Pod to externalIP", func() error {
		if r := probeSvc(t, c, pods[0], extIPAddr, 80, corev1.ProtocolTCP, 2*time.Second); r.Outcome != echo.Connected {
			return fmt.Errorf("got %s", r)
		}
		return nil
	})
	// Deleting the Service removes its host route.
	if err := c.Client().CoreV1().Services(ns).Delete(ctx, eip.Name, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	eventually(t, 10*time.Second, "externalIP route removed", func() error {
		out, err := c.NodeExec(ctx, nodes[1].Name, "ip", "route", "show", extIPAddr)
		if err != nil {
			return err
		}
		if strings.TrimSpace(string(out)) != "" {
			return fmt.Errorf("route left: %s", out)
		}
		return nil
	})
}

// localVIP routes ip to node from the underlay router and makes it a
// local address of the Node on the interface holding its InternalIP, as
// kube-vip or keepalived would. The returned function removes the address
// (the route stays until the test ends); the test's end removes both.
func localVIP(t *testing.T, c *sandbox.Cluster, node sandbox.Node, ip string) (remove func()) {
	t.Helper()
	ctx := testCtx(t, 20*time.Second)
	undo, err := c.RouteToNode(ctx, ip+"/32", node.Name)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(undo)
	out, err := c.NodeExec(ctx, node.Name, "ip", "-o", "-4", "addr", "show", "to", node.IP+"/32")
	f := strings.Fields(string(out))
	if err != nil || len(f) < 2 {
		t.Fatalf("finding %s's interface: %q, %v", node.IP, out, err)
	}
	dev := f[1]
	if out, err := c.NodeExec(ctx, node.Name, "ip", "addr", "add", ip+"/32", "dev", dev); err != nil {
		t.Fatalf("adding %s to %s on %s: %v: %s", ip, dev, node.Name, err, out)
	}
	var once sync.Once
	remove = func() {
		once.Do(func() {
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			if out, err := c.NodeExec(ctx, node.Name, "ip", "addr", "del", ip+"/32", "dev", dev); err != nil {
				t.Errorf("removing %s from %s on %s: %v: %s", ip, dev, node.Name, err, out)
			}
		})
	}
	t.Cleanup(remove)
	return remove
}

// An externalIP or LoadBalancer IP that is also a local address of the
// Node it is routed to (kube-vip or keepalived put it there; here the test
// does) is served on its Service's ports as kube-proxy serves it, though
// the host's local routing table claims the address: TCP and UDP through
// an externalIP (externalTrafficPolicy Cluster), the client address kept
// through a LoadBalancer IP (Local), and the Node's own connections to
// it, cluster-wide under Local as kube-proxy's short-circuit sends them.
// The address's other ports stay the host's (the proxy's health check on
// 10256), and when the address leaves the Node, the route to it serves
// again.
func TestServiceLocalVIP(t *testing.T) {
	c := shared
	ns := "svc-localvip"
	pods := svcPods(t, c, ns, "lv", 0, 2)
	const extIPAddr, lbIP, lbIP2 = "198.18.100.20", "198.18.100.21", "198.18.100.22"
	createService(t, c, ns, "eip", "lv", func(s *corev1.Service) { s.Spec.ExternalIPs = []string{extIPAddr} })
	lb := createService(t, c, ns, "lb", "lv", func(s *corev1.Service) {
		s.Spec.Type = corev1.ServiceTypeLoadBalancer
		s.Spec.ExternalTrafficPolicy = corev1.ServiceExternalTrafficPolicyLocal
	})
	ctx := testCtx(t, 2*time.Minute)
	lb.Status.LoadBalancer.Ingress = []corev1.LoadBalancerIngress{{IP: lbIP}, {IP: lbIP2}}
	if _, err := c.Client().CoreV1().Services(ns).UpdateStatus(ctx, lb, metav1.UpdateOptions{}); err != nil {
		t.Fatalf("setting LoadBalancer ingress: %v", err)
	}
	node, noEndpoint := c.Nodes()[2], c.Nodes()[1]
	removeExtIP := localVIP(t, c, node, extIPAddr)
	localVIP(t, c, node, lbIP)
	localVIP(t, c, noEndpoint, lbIP2)
	extNS, extIP := c.ExternalHost()
	all := names(pods)
	servedByAll := func(proto corev1.Protocol, port int) func() error {
		return func() error {
			if got, _ := probeFromNS(t, c, extNS, extIPAddr, port, proto, 16); keys(got) != all {
				return fmt.Errorf("answered by %v, want each of %s", got, all)
			}
			return nil
		}
	}
	eventually(t, 20*time.Second, "local externalIP, TCP", servedByAll(corev1.ProtocolTCP, 80))
	eventually(t, 20*time.Second, "local externalIP, UDP", servedByAll(corev1.ProtocolUDP, 53))
	eventually(t, 20*time.Second, "local LoadBalancer IP", servedLocally(t, c, extNS, extIP, lbIP, pods[1].name))
	eventually(t, 20*time.Second, "the Node to its own externalIP", everyProbeAnswered(t, c, node.NetNS, extIPAddr))
	// A Node without a local endpoint drops what comes from outside to
	// its local LoadBalancer IP (externalTrafficPolicy Local), but its
	// own connections there are the Node's, sent cluster-wide.
	eventually(t, 20*time.Second, "the Node without an endpoint, to its own LoadBalancer IP", func() error {
		got, _ := probeFromNS(t, c, noEndpoint.NetNS, lbIP2, 80, corev1.ProtocolTCP, 8)
		if keys(got) != all {
			return fmt.Errorf("answered by %v, want each of %s", got, all)
		}
		return nil
	})
	if r := c.ProbeFrom(testCtx(t, 10*time.Second), extNS, lbIP2, 80, corev1.ProtocolTCP, time.Second); r.Outcome != echo.TimedOut {
		t.Errorf("from outside to %s on %s, without a local endpoint: %s, want the connection dropped", lbIP2, noEndpoint.Name, r)
	}
	// A LoadBalancer IP whose source ranges hold the Node's address only:
	// the Node's own connections to it, local, are admitted; the external
	// host's are not.
	const rangedIP = "198.18.100.25"
	ranged := createService(t, c, ns, "ranged", "lv", func(s *corev1.Service) {
		s.Spec.Type = corev1.ServiceTypeLoadBalancer
		s.Spec.LoadBalancerSourceRanges = []string{node.IP + "/32"}
	})
	ranged.Status.LoadBalancer.Ingress = []corev1.LoadBalancerIngress{{IP: rangedIP}}
	if _, err := c.Client().CoreV1().Services(ns).UpdateStatus(ctx, ranged, metav1.UpdateOptions{}); err != nil {
		t.Fatalf("setting LoadBalancer ingress: %v", err)
	}
	localVIP(t, c, node, rangedIP)
	eventually(t, 20*time.Second, "the Node to its own LoadBalancer IP, its address in the source ranges",
		everyProbeAnswered(t, c, node.NetNS, rangedIP))
	if r := c.ProbeFrom(testCtx(t, 10*time.Second), extNS, rangedIP, 80, corev1.ProtocolTCP, time.Second); r.Outcome == echo.Connected {
		t.Errorf("from outside the source ranges to %s: %s, want the connection refused or dropped", rangedIP, r)
	}
	url := fmt.Sprintf("http://%s:10256/livez", extIPAddr)
	eventually(t, 10*time.Second, "the host's own port on the address", func() error {
		out, err := c.ExternalExec(testCtx(t, 10*time.Second), "curl", "-s", "-o", "/dev/null", "-w", "%{http_code}", "--max-time", "2", url)
		if got := strings.TrimSpace(string(out)); got != "200" {
			return fmt.Errorf("got %q (%v), want 200", got, err)
		}
		return nil
	})
	// The address leaves the Node (another Node took the VIP over): the
	// route serves it again.
	removeExtIP()
	eventually(t, 20*time.Second, "externalIP no longer local", servedByAll(corev1.ProtocolTCP, 80))
}

// loadBalancerSourceRanges: the LoadBalancer IP admits new connections
// from the ranges only, from outside as from Pods, and follows changes of
// the ranges; the Service's ClusterIP is not subject to them.
func TestServiceLoadBalancerSourceRanges(t *testing.T) {
	c := shared
	ns := "svc-lbsr"
	pods := svcPods(t, c, ns, "lbsr", 1)
	client := svcPods(t, c, ns, "lbsr-client", 0)[0]
	const lbIP = "198.18.100.12"
	extNS, extIP := c.ExternalHost()
	lb := createService(t, c, ns, "lb", "lbsr", func(s *corev1.Service) {
		s.Spec.Type = corev1.ServiceTypeLoadBalancer
		s.Spec.LoadBalancerSourceRanges = []string{extIP + "/32"}
	})
	ctx := testCtx(t, 2*time.Minute)
	lb.Status.LoadBalancer.Ingress = []corev1.LoadBalancerIngress{{IP: lbIP}}
	if _, err := c.Client().CoreV1().Services(ns).UpdateStatus(ctx, lb, metav1.UpdateOptions{}); err != nil {
		t.Fatalf("setting LoadBalancer ingress: %v", err)
	}
	undo, err := c.RouteToNode(ctx, lbIP+"/32", c.Nodes()[0].Name)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(undo)
	setRanges := func(ranges ...string) {
		t.Helper()
		cur, err := c.Client().CoreV1().Services(ns).Get(ctx, lb.Name, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		cur.Spec.LoadBalancerSourceRanges = ranges
		if _, err := c.Client().CoreV1().Services(ns).Update(ctx, cur, metav1.UpdateOptions{}); err != nil {
			t.Fatalf("setting loadBalancerSourceRanges %v: %v", ranges, err)
		}
	}
	fromExt := func() echo.Result {
		return c.ProbeFrom(testCtx(t, 10*time.Second), extNS, lbIP, 80, corev1.ProtocolTCP, time.Second)
	}
	fromPod := func() echo.Result { return probeSvc(t, c, client, lbIP, 80, corev1.ProtocolTCP, time.Second) }
	want := func(what string, probe func() echo.Result, outcome echo.Outcome) {
		t.Helper()
		eventually(t, 20*time.Second, what, func() error {
			if r := probe(); r.Outcome != outcome || (outcome == echo.Connected && r.Reply != pods[0].name) {
				return fmt.Errorf("got %s (%v), want %s", r, r.Err, outcome)
			}
			return nil
		})
	}
	// Admitted: the external host. Once it connects the frontends are in,
	// so the Pod outside the ranges is dropped, not merely early.
	want("the external host, in the ranges", fromExt, echo.Connected)
	if r := fromPod(); r.Outcome != echo.TimedOut {
		t.Errorf("a Pod outside the ranges: %s (%v), want the connection dropped", r, r.Err)
	}
	if r := probeSvc(t, c, client, lb.Spec.ClusterIP, 80, corev1.ProtocolTCP, 2*time.Second); r.Outcome != echo.Connected {
		t.Errorf("the ClusterIP from a Pod outside the ranges: %s (%v), want it served", r, r.Err)
	}
	// Now the Pod only.
	setRanges(client.ip + "/32")
	want("the Pod, in the ranges now", fromPod, echo.Connected)
	want("the external host, outside the ranges now", fromExt, echo.TimedOut)
	// No range: open to all again.
	setRanges()
	want("the external host, without ranges", fromExt, echo.Connected)
	want("the Pod, without ranges", fromPod, echo.Connected)
}

// Seine serves kube-proxy's health check on port 10256 in its place:
// /healthz answers 200 on every Node, and 503 on a Node the cluster
// autoscaler has tainted for removal, while /livez keeps answering 200
// there; both JSON with kube-proxy's fields.
func TestProxyHealthz(t *testing.T) {
	c := shared
	nodes := c.Nodes()
	expect := func(node sandbox.Node, path, want string) {
		t.Helper()
		url := fmt.Sprintf("http://%s:10256%s", node.IP, path)
		eventually(t, 20*time.Second, url+" on "+node.Name, func() error {
			out, err := c.ExternalExec(testCtx(t, 10*time.Second), "curl", "-s", "-w", "\n%{http_code}", "--max-time", "2", url)
			// The status code is the last line, after the body's own.
			o := strings.TrimSpace(string(out))
			i := strings.LastIndex(o, "\n")
			body, code := o[:max(i, 0)], o[i+1:]
			if code != want || !strings.Contains(body, `"lastUpdated"`) {
				return fmt.Errorf("got %s %q (%v), want %s", code, body, err, want)
			}
			return nil
		})
	}
	for _, n := range nodes {
		expect(n, "/healthz", "200")
	}
	const taint = "ToBeDeletedByClusterAutoscaler"
	setTaint := func(name string, on bool) error {
		ctx := testCtx(t, 30*time.Second)
		return retry.RetryOnConflict(retry.DefaultRetry, func() error {
			n, err := c.Client().CoreV1().Nodes().Get(ctx, name, metav1.GetOptions{})
			if err != nil {
				return err
			}
			n.Spec.Taints = slices.DeleteFunc(n.Spec.Taints, func(t corev1.Taint) bool { return t.Key == taint })
			if on {
				n.Spec.Taints = append(n.Spec.Taints, corev1.Taint{Key: taint, Value: "1", Effect: corev1.TaintEffectNoSchedule})
			}
			_, err = c.Client().CoreV1().Nodes().Update(ctx, n, metav1.UpdateOptions{})
			return err
		})
	}
	t.Cleanup(func() {
		if err := setTaint(nodes[1].Name, false); err != nil {
			t.Errorf("removing the taint: %v", err)
		}
	})
	if err := setTaint(nodes[1].Name, true); err != nil {
		t.Fatal(err)
	}
	expect(nodes[1], "/healthz", "503")
	expect(nodes[1], "/livez", "200")
	expect(nodes[0], "/healthz", "200")
	if err := setTaint(nodes[1].Name, false); err != nil {
		t.Fatal(err)
	}
	expect(nodes[1], "/healthz", "200")
}

// Standing in for kube-proxy, seine sets kube-proxy's conntrack timeouts
// in each Node's network namespace (proxy.conntrack defaults: TCP
// established 24 h, CLOSE_WAIT 1 h; the sandbox Nodes' namespaces start
// with the kernel's 5 days and 60 s).
func TestServiceProxyTunesConntrack(t *testing.T) {
	c := shared
	for _, n := range c.Nodes() {
		eventually(t, 20*time.Second, "conntrack timeouts on "+n.Name, func() error {
			for file, want := range map[string]string{
				"nf_conntrack_tcp_timeout_established": "86400",
				"nf_conntrack_tcp_timeout_close_wait":  "3600",
			} {
				out, err := c.NodeExec(testCtx(t, 10*time.Second), n.Name, "cat", "/proc/sys/net/netfilter/"+file)
				if got := strings.TrimSpace(string(out)); err != nil || got != want {
					return fmt.Errorf("%s = %q (%v), want %s", file, got, err, want)
				}
			}
			return nil
		})
	}
}
