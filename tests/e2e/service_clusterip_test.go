package e2e

import (
	"context"
	"fmt"
	"net"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/intstr"

	"github.com/seine-net/seine/tests/sandbox"
	"github.com/seine-net/seine/tests/sandbox/echo"
)

// svcPods creates one echo Pod per node index, labelled app=<app>, in ns.
func svcPods(t *testing.T, c *sandbox.Cluster, ns, app string, nodes ...int) []podRef {
	t.Helper()
	ctx := testCtx(t, 3*time.Minute)
	var pods []podRef
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
		defer cancel()
		for _, p := range pods {
			_ = c.DeletePod(ctx, p.ns, p.name)
		}
	})
	for i, ni := range nodes {
		node := c.Nodes()[ni]
		name := fmt.Sprintf("%s-%d-n%d", app, i, ni+1)
		p, err := c.CreatePod(ctx, sandbox.PodSpec{Namespace: ns, Name: name, Node: node.Name,
			Labels: map[string]string{"app": app}, Ports: demoPorts})
		if err != nil {
			t.Fatalf("creating pod %s: %v", name, err)
		}
		pods = append(pods, podRef{ns: ns, name: name, node: node.Name, ip: p.Status.PodIP})
	}
	return pods
}

// createService creates a Service selecting app=<app> (no selector when app
// is empty) with TCP 80 → named port "http" and UDP 53 → 5353, and deletes
// it at the end of the test.
func createService(t *testing.T, c *sandbox.Cluster, ns, name, app string, mutate func(*corev1.Service)) *corev1.Service {
	t.Helper()
	ctx := testCtx(t, 30*time.Second)
	svc := &corev1.Service{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name},
		Spec: corev1.ServiceSpec{Ports: []corev1.ServicePort{
			{Name: "http", Port: 80, Protocol: corev1.ProtocolTCP, TargetPort: intstr.FromString("http")},
			{Name: "dns", Port: 53, Protocol: corev1.ProtocolUDP, TargetPort: intstr.FromInt32(udpPort)},
		}}}
	if app != "" {
		svc.Spec.Selector = map[string]string{"app": app}
	}
	if mutate != nil {
		mutate(svc)
	}
	if _, err := c.Client().CoreV1().Namespaces().Get(ctx, ns, metav1.GetOptions{}); err != nil {
		_, _ = c.Client().CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{})
	}
	out, err := c.Client().CoreV1().Services(ns).Create(ctx, svc, metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("creating service %s/%s: %v", ns, name, err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		_ = c.Client().CoreV1().Services(ns).Delete(ctx, name, metav1.DeleteOptions{})
	})
	return out
}

func probeSvc(t *testing.T, c *sandbox.Cluster, from podRef, ip string, port int, proto corev1.Protocol, timeout time.Duration) echo.Result {
	t.Helper()
	return c.Probe(testCtx(t, 10*time.Second), from.ns, from.name, ip, port, proto, timeout)
}

// replies probes n times and counts the answering Pods.
func replies(t *testing.T, c *sandbox.Cluster, from podRef, ip string, port int, proto corev1.Protocol, n int) map[string]int {
	t.Helper()
	got := map[string]int{}
	for i := 0; i < n; i++ {
		r := probeSvc(t, c, from, ip, port, proto, 2*time.Second)
		if r.Outcome != echo.Connected {
			got["!"+string(r.Outcome)]++
			continue
		}
		got[r.Reply]++
	}
	return got
}

func keys(m map[string]int) string {
	var ks []string
	for k := range m {
		ks = append(ks, k)
	}
	sort.Strings(ks)
	return strings.Join(ks, ",")
}

func names(pods []podRef) string {
	var ns []string
	for _, p := range pods {
		ns = append(ns, p.name)
	}
	sort.Strings(ns)
	return strings.Join(ns, ",")
}

// ClusterIP from a Pod on every Node reaches endpoints on every Node, TCP
// (named targetPort) and UDP (numeric), spread over all of them; the
// client Pods are themselves endpoints, so hairpin is exercised too.
func TestServiceClusterIP(t *testing.T) {
	c := shared
	pods := svcPods(t, c, "svc-cip", "cip", 0, 1, 2)
	svc := createService(t, c, "svc-cip", "web", "cip", nil)
	vip := svc.Spec.ClusterIP
	all := names(pods)
	for _, from := range pods {
		for _, pp := range []struct {
			port  int
			proto corev1.Protocol
		}{{80, corev1.ProtocolTCP}, {53, corev1.ProtocolUDP}} {
			var got map[string]int
			eventually(t, 20*time.Second, fmt.Sprintf("%s %s:%d/%s reaches every endpoint", from.name, vip, pp.port, pp.proto), func() error {
				got = replies(t, c, from, vip, pp.port, pp.proto, 24)
				if keys(got) != all {
					return fmt.Errorf("answered by %v, want each of %s", got, all)
				}
				return nil
			})
		}
	}
	// The echo server sees the client's own address (no SNAT) except for
	// hairpin, where it sees the hairpin address.
	r := probeSvc(t, c, pods[0], vip, 80, corev1.ProtocolTCP, 2*time.Second)
	if r.Outcome != echo.Connected {
		t.Fatalf("probe: %s", r)
	}
	wantClient := pods[0].ip
	if r.Reply == pods[0].name {
		wantClient = "169.254.100.1"
	}
	if !strings.HasPrefix(r.Client, wantClient+":") {
		t.Errorf("server %s saw client %s, want %s", r.Reply, r.Client, wantClient)
	}
}

// Hairpin: a Pod reaches itself through a Service of which it is the only
// endpoint.
func TestServiceHairpin(t *testing.T) {
	c := shared
	pods := svcPods(t, c, "svc-hairpin", "hp", 1)
	svc := createService(t, c, "svc-hairpin", "self", "hp", nil)
	for _, proto := range []corev1.Protocol{corev1.ProtocolTCP, corev1.ProtocolUDP} {
		port := 80
		if proto == corev1.ProtocolUDP {
			port = 53
		}
		eventually(t, 15*time.Second, "hairpin "+string(proto), func() error {
			r := probeSvc(t, c, pods[0], svc.Spec.ClusterIP, port, proto, 2*time.Second)
			if r.Outcome != echo.Connected || r.Reply != pods[0].name {
				return fmt.Errorf("got %s", r)
			}
			return nil
		})
	}
}

// A Service without endpoints is refused at once, TCP and UDP, from a Pod
// and from the Node's host (TCP: its datagrams are refused as they leave,
// which the sender sees as EPERM).
func TestServiceNoEndpointsRejects(t *testing.T) {
	c := shared
	client := svcPods(t, c, "svc-noep", "client", 0)[0]
	svc := createService(t, c, "svc-noep", "empty", "nothing-matches", nil)
	refusedFromPodAndHost(t, c, client, c.Nodes()[0], svc.Spec.ClusterIP, 80, 53)
}

// refusedFromPodAndHost waits until connections to vip on tcpPort and
// udpPort are refused (a TCP reset, an ICMP port unreachable for UDP: the
// answer of a reject, where a drop would time out) from client and, TCP
// only, from node's host, whose own datagrams are refused as they leave
// (EPERM, no ICMP error).
func refusedFromPodAndHost(t *testing.T, c *sandbox.Cluster, client podRef, node sandbox.Node, vip string, tcpPort, udpPort int) {
	t.Helper()
	for _, pp := range []struct {
		port  int
		proto corev1.Protocol
	}{{tcpPort, corev1.ProtocolTCP}, {udpPort, corev1.ProtocolUDP}} {
		eventually(t, 15*time.Second, fmt.Sprintf("%d/%s refused", pp.port, pp.proto), func() error {
			if r := probeSvc(t, c, client, vip, pp.port, pp.proto, 3*time.Second); r.Outcome != echo.Refused {
				return fmt.Errorf("from a Pod: got %s (%v)", r, r.Err)
			}
			if pp.proto != corev1.ProtocolTCP {
				return nil
			}
			if r := c.ProbeFrom(testCtx(t, 10*time.Second), node.NetNS, vip, pp.port, pp.proto, 3*time.Second); r.Outcome != echo.Refused {
				return fmt.Errorf("from the Node's host: got %s (%v)", r, r.Err)
			}
			return nil
		})
	}
}

// TestServiceUndefinedPortRejects: a connection to a ClusterIP on a port
// its Service does not define is refused (a TCP reset, an ICMP port
// unreachable for UDP) from a Pod, from the Node's host (TCP) and from a
// client whose router sends the ClusterIP to a Node, as kube-proxy
// refuses it, while the defined ports serve.
func TestServiceUndefinedPortRejects(t *testing.T) {
	c := shared
	ns := "svc-undef"
	backend := svcPods(t, c, ns, "undef", 1)[0]
	client := svcPods(t, c, ns, "client", 0)[0]
	svc := createService(t, c, ns, "undef", "undef", nil)
	node := c.Nodes()[0]
	eventually(t, 15*time.Second, "the defined port", func() error {
		if r := probeSvc(t, c, client, svc.Spec.ClusterIP, 80, corev1.ProtocolTCP, 2*time.Second); r.Outcome != echo.Connected || r.Reply != backend.name {
			return fmt.Errorf("got %s", r)
		}
		return nil
	})
	refusedFromPodAndHost(t, c, client, node, svc.Spec.ClusterIP, 81, 54)
	// A client outside the cluster whose router sends the ClusterIP to
	// the endpoint's Node: the host forwards it into the bridge, which
	// serves the defined port; the other one is refused.
	undo, err := c.RouteToNode(testCtx(t, 30*time.Second), svc.Spec.ClusterIP+"/32", c.Nodes()[1].Name)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(undo)
	extNS, _ := c.ExternalHost()
	eventually(t, 10*time.Second, "the ClusterIP routed in from outside", func() error {
		if r := c.ProbeFrom(testCtx(t, 10*time.Second), extNS, svc.Spec.ClusterIP, 80, corev1.ProtocolTCP, 2*time.Second); r.Outcome != echo.Connected || r.Reply != backend.name {
			return fmt.Errorf("defined port: got %s (%v)", r, r.Err)
		}
		if r := c.ProbeFrom(testCtx(t, 10*time.Second), extNS, svc.Spec.ClusterIP, 81, corev1.ProtocolTCP, 2*time.Second); r.Outcome != echo.Refused {
			return fmt.Errorf("undefined port: got %s (%v)", r, r.Err)
		}
		return nil
	})
}

// Scaling the backing Pods up and down: the Service follows within a few
// seconds; endpoints of a deleted Pod stop receiving connections.
func TestServiceFollowsEndpoints(t *testing.T) {
	c := shared
	ns := "svc-scale"
	client := svcPods(t, c, ns, "client", 0)[0]
	first := svcPods(t, c, ns, "scale", 1)
	svc := createService(t, c, ns, "scale", "scale", nil)
	vip := svc.Spec.ClusterIP
	eventually(t, 15*time.Second, "first endpoint", func() error {
		if got := replies(t, c, client, vip, 80, corev1.ProtocolTCP, 3); keys(got) != first[0].name {
			return fmt.Errorf("got %v", got)
		}
		return nil
	})
	// Scale up: a Pod on another Node.
	more := svcPods(t, c, ns, "scale2", 2)
	ctx := testCtx(t, time.Minute)
	p, err := c.Client().CoreV1().Pods(ns).Get(ctx, more[0].name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	p.Labels["app"] = "scale"
	if _, err := c.Client().CoreV1().Pods(ns).Update(ctx, p, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	want := names(append(first, more...))
	start := time.Now()
	eventually(t, 10*time.Second, "scaled up", func() error {
		if got := replies(t, c, client, vip, 80, corev1.ProtocolTCP, 12); keys(got) != want {
			return fmt.Errorf("got %v, want %s", got, want)
		}
		return nil
	})
	t.Logf("new endpoint served %s after relabel", time.Since(start).Round(time.Millisecond))
	// Scale down: delete the first Pod.
	if err := c.DeletePod(ctx, ns, first[0].name); err != nil {
		t.Fatal(err)
	}
	eventually(t, 10*time.Second, "scaled down", func() error {
		if got := replies(t, c, client, vip, 80, corev1.ProtocolTCP, 12); keys(got) != more[0].name {
			return fmt.Errorf("got %v, want only %s", got, more[0].name)
		}
		return nil
	})
}

// ClientIP session affinity: every connection of a client goes to the same
// endpoint while the affinity lives, whichever of the Service port's
// addresses it connects to (its ClusterIP, its externalIPs), as under
// kube-proxy; it expires after timeoutSeconds.
func TestServiceSessionAffinity(t *testing.T) {
	c := shared
	ns := "svc-affinity"
	client := svcPods(t, c, ns, "client", 0)[0]
	pods := svcPods(t, c, ns, "aff", 0, 1, 2)
	externalIPs := []string{"198.18.100.31", "198.18.100.32"}
	svc := createService(t, c, ns, "sticky", "aff", func(s *corev1.Service) {
		s.Spec.ExternalIPs = externalIPs
		s.Spec.SessionAffinity = corev1.ServiceAffinityClientIP
		s.Spec.SessionAffinityConfig = &corev1.SessionAffinityConfig{ClientIP: &corev1.ClientIPConfig{TimeoutSeconds: ptrTo(int32(3))}}
	})
	vip := svc.Spec.ClusterIP
	node0 := c.Nodes()[0]
	eventually(t, 20*time.Second, "endpoints up", func() error {
		r := probeSvc(t, c, client, vip, 80, corev1.ProtocolTCP, 2*time.Second)
		if r.Outcome != echo.Connected {
			return fmt.Errorf("%s", r)
		}
		return nil
	})
	// After each expiry the group chooses afresh among 3 endpoints: 10
	// rounds all on one endpoint would happen by chance once in 20,000.
	chosen := map[string]bool{}
	const rounds = 10
	for round := 0; round < rounds && len(chosen) < 2; round++ {
		got := replies(t, c, client, vip, 80, corev1.ProtocolTCP, 8)
		if len(got) != 1 {
			t.Fatalf("round %d: connections spread over %v despite affinity", round, got)
		}
		chosen[keys(got)] = true
		// Each externalIP has a chance in three of the same endpoint by
		// chance: both in every round, once in 81 over two rounds.
		for _, ip := range externalIPs {
			if at := replies(t, c, client, ip, 80, corev1.ProtocolTCP, 4); keys(at) != keys(got) {
				t.Fatalf("round %d: the externalIP %s answered by %v, the ClusterIP by %v: the affinity is not the Service port's", round, ip, at, got)
			}
		}
		flows := ovs(t, node0, "ovs-ofctl", "dump-flows", brInt(node0), "table=41")
		if n := strings.Count(flows, "nw_src="+client.ip); n != 1 {
			t.Fatalf("%d learned affinity flows for %s, want one for the Service port:\n%s", n, client.ip, flows)
		}
		// The learned flow's idle timeout is 3 s; ovs-vswitchd expires
		// flows on its own schedule, slower under load.
		eventually(t, 15*time.Second, "the affinity flow expired", func() error {
			if flows := ovs(t, node0, "ovs-ofctl", "dump-flows", brInt(node0), "table=41"); strings.Contains(flows, "nw_src="+client.ip) {
				return fmt.Errorf("affinity flow still there:\n%s", flows)
			}
			return nil
		})
		// The OpenFlow flow is gone, but datapath flows cached from it
		// keep steering the client until the revalidators pass over them
		// (a pass that began before the expiry may miss them): wait for
		// two passes so the next round starts from a fresh choice.
		ovs(t, node0, "ovs-appctl", "revalidator/wait")
		ovs(t, node0, "ovs-appctl", "revalidator/wait")
	}
	if len(chosen) < 2 {
		t.Errorf("after %d expiries the client always got %v of %s", rounds, chosen, names(pods))
	}
}

// internalTrafficPolicy Local: Pods only reach endpoints on their own Node;
// a Node without one drops the connection.
func TestServiceInternalTrafficPolicyLocal(t *testing.T) {
	c := shared
	ns := "svc-itp"
	clients := svcPods(t, c, ns, "client", 0, 2)
	pods := svcPods(t, c, ns, "itp", 0, 1)
	svc := createService(t, c, ns, "local", "itp", func(s *corev1.Service) {
		s.Spec.InternalTrafficPolicy = ptrTo(corev1.ServiceInternalTrafficPolicyLocal)
	})
	eventually(t, 20*time.Second, "local endpoint only", func() error {
		if got := replies(t, c, clients[0], svc.Spec.ClusterIP, 80, corev1.ProtocolTCP, 10); keys(got) != pods[0].name {
			return fmt.Errorf("got %v, want only %s", got, pods[0].name)
		}
		return nil
	})
	// A Node that has not programmed the Service yet drops too: wait for
	// the client's Node to have it (its ServiceLB flow drops).
	far := c.Nodes()[2]
	eventually(t, 20*time.Second, "the Service programmed on "+far.Name, func() error {
		vip := "nw_dst=" + svc.Spec.ClusterIP
		if out := ovs(t, far, "ovs-ofctl", "dump-flows", brInt(far), "table=40"); !strings.Contains(out, vip+",") && !strings.Contains(out, vip+" ") {
			return fmt.Errorf("ServiceLB has no flow for %s:\n%s", svc.Spec.ClusterIP, out)
		}
		return nil
	})
	if r := probeSvc(t, c, clients[1], svc.Spec.ClusterIP, 80, corev1.ProtocolTCP, time.Second); r.Outcome != echo.TimedOut {
		t.Errorf("from a Node without local endpoint: %s (%v), want the connection dropped", r, r.Err)
	}
	// That client reaches the remote endpoint itself: only the Service
	// drops it.
	if r := probeSvc(t, c, clients[1], pods[1].ip, tcpPort, corev1.ProtocolTCP, 2*time.Second); r.Outcome != echo.Connected || r.Reply != pods[1].name {
		t.Errorf("from a Node without local endpoint to the endpoint's Pod IP: %s (%v), want %s to answer", r, r.Err, pods[1].name)
	}
}

// A UDP flow (one source port) stays with its endpoint while that endpoint
// serves the Service, and moves to another once it leaves: the proxy
// flushes the flow's conntrack entry, which each datagram would otherwise
// keep alive for good. The endpoint that leaves keeps running (its Pod is
// relabelled), so without the flush it would keep answering.
func TestServiceUDPFlowLeavesGoneEndpoint(t *testing.T) {
	c := shared
	ns := "svc-udp-stale"
	clients := svcPods(t, c, ns, "client", 2)
	pods := svcPods(t, c, ns, "udpflow", 0, 1)
	svc := createService(t, c, ns, "udp", "udpflow", nil)
	eventually(t, 30*time.Second, "both endpoints answering", func() error {
		if got := replies(t, c, clients[0], svc.Spec.ClusterIP, 53, corev1.ProtocolUDP, 16); keys(got) != names(pods) {
			return fmt.Errorf("got %v, want %s", got, names(pods))
		}
		return nil
	})
	conn, err := c.DialNetFrom(testCtx(t, 10*time.Second), ns, clients[0].name, "udp", net.JoinHostPort(svc.Spec.ClusterIP, "53"))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	ask := func() (string, error) {
		_ = conn.SetDeadline(time.Now().Add(time.Second))
		if _, err := conn.Write([]byte("probe\n")); err != nil {
			return "", err
		}
		buf := make([]byte, 512)
		n, err := conn.Read(buf)
		if err != nil {
			return "", err
		}
		name, _, _ := strings.Cut(string(buf[:n]), "\n")
		return name, nil
	}
	var first string
	eventually(t, 10*time.Second, "the flow answered", func() error {
		var err error
		first, err = ask()
		return err
	})
	for i := 0; i < 5; i++ {
		if got, err := ask(); err != nil || got != first {
			t.Fatalf("datagram %d of the flow: %q (%v), want %s again", i, got, err, first)
		}
	}
	gone, stays := pods[0], pods[1]
	if first == pods[1].name {
		gone, stays = pods[1], pods[0]
	}
	relabel := func(pod podRef, app string) {
		t.Helper()
		patch := []byte(fmt.Sprintf(`{"metadata":{"labels":{"app":%q}}}`, app))
		if _, err := c.Client().CoreV1().Pods(ns).Patch(testCtx(t, 10*time.Second), pod.name, types.MergePatchType, patch, metav1.PatchOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	relabel(gone, "udpflow-left")
	eventually(t, 30*time.Second, "the flow moved to "+stays.name, func() error {
		got, err := ask()
		if err != nil || got != stays.name {
			return fmt.Errorf("answered by %q (%v)", got, err)
		}
		return nil
	})
	// No endpoint left: the flow's datagrams are refused, and its
	// connection is committed untranslated meanwhile. An endpoint back
	// must take the flow over all the same.
	relabel(stays, "udpflow-left")
	eventually(t, 30*time.Second, "the flow refused without endpoints", func() error {
		if got, err := ask(); err == nil {
			return fmt.Errorf("still answered by %q", got)
		}
		return nil
	})
	relabel(gone, "udpflow")
	eventually(t, 30*time.Second, "the flow on the endpoint back, "+gone.name, func() error {
		got, err := ask()
		if err != nil || got != gone.name {
			return fmt.Errorf("answered by %q (%v)", got, err)
		}
		return nil
	})
}

// labelZone sets (zone != "") or removes the topology.kubernetes.io/zone
// label of a Node.
func labelZone(t *testing.T, c *sandbox.Cluster, node, zone string) {
	t.Helper()
	ctx := testCtx(t, 30*time.Second)
	v := "null"
	if zone != "" {
		v = strconv.Quote(zone)
	}
	patch := fmt.Sprintf(`{"metadata":{"labels":{%q:%s}}}`, corev1.LabelTopologyZone, v)
	if _, err := c.Client().CoreV1().Nodes().Patch(ctx, node, types.MergePatchType, []byte(patch), metav1.PatchOptions{}); err != nil {
		t.Fatalf("labelling node %s with zone %q: %v", node, zone, err)
	}
}

// trafficDistribution: the EndpointSlice controller (the real
// kube-controller-manager) gives the endpoints zone hints for
// PreferSameZone and Node hints for PreferSameNode, and each Node's proxy
// sends only to the endpoints hinted for it. A Node losing its zone label
// sends to every endpoint again.
func TestServiceTrafficDistribution(t *testing.T) {
	c := shared
	ns := "svc-topology"
	zones := []string{"e2e-zone-a", "e2e-zone-b", "e2e-zone-a"}
	// Registered first: the labels go even when labelling fails midway.
	t.Cleanup(func() {
		for _, n := range c.Nodes() {
			labelZone(t, c, n.Name, "")
		}
	})
	for i, n := range c.Nodes() {
		labelZone(t, c, n.Name, zones[i])
	}
	clients := svcPods(t, c, ns, "client", 0, 1)
	pods := svcPods(t, c, ns, "tz", 0, 1, 2)
	sameZone := createService(t, c, ns, "same-zone", "tz", func(s *corev1.Service) {
		s.Spec.TrafficDistribution = ptrTo(corev1.ServiceTrafficDistributionPreferSameZone)
	})
	sameNode := createService(t, c, ns, "same-node", "tz", func(s *corev1.Service) {
		s.Spec.TrafficDistribution = ptrTo(corev1.ServiceTrafficDistributionPreferSameNode)
	})
	expect := func(what string, from podRef, svc *corev1.Service, want []podRef) {
		t.Helper()
		eventually(t, 30*time.Second, what, func() error {
			if got := replies(t, c, from, svc.Spec.ClusterIP, 80, corev1.ProtocolTCP, 24); keys(got) != names(want) {
				return fmt.Errorf("from %s to %s: got %v, want %s", from.node, svc.Name, got, names(want))
			}
			return nil
		})
	}
	expect("zone a's endpoints from zone a", clients[0], sameZone, []podRef{pods[0], pods[2]})
	expect("zone b's endpoint from zone b", clients[1], sameZone, []podRef{pods[1]})
	expect("the Node's own endpoint", clients[0], sameNode, []podRef{pods[0]})
	expect("the Node's own endpoint", clients[1], sameNode, []podRef{pods[1]})
	// The hints stay (the controller recomputes them on a Pod or Service
	// change, not on a Node's), so only the proxy's own watch of its Node
	// can see that it has no zone any more.
	labelZone(t, c, clients[1].node, "")
	expect("every endpoint from a Node without zone", clients[1], sameZone, pods)
}

// A Service with 1,000 endpoints (hand-written EndpointSlice, a Service
// without selector) is programmed as a select group of 1,000 buckets on
// every Node.
func TestServiceThousandEndpoints(t *testing.T) {
	c := shared
	ns := "svc-big"
	svc := createService(t, c, ns, "big", "", nil)
	ctx := testCtx(t, time.Minute)
	slice := &discoveryv1.EndpointSlice{
		ObjectMeta:  metav1.ObjectMeta{Name: "big-1", Namespace: ns, Labels: map[string]string{discoveryv1.LabelServiceName: "big"}},
		AddressType: discoveryv1.AddressTypeIPv4,
		Ports: []discoveryv1.EndpointPort{{Name: ptrTo("http"), Port: ptrTo(int32(tcpPort)), Protocol: ptrTo(corev1.ProtocolTCP)},
			{Name: ptrTo("dns"), Port: ptrTo(int32(udpPort)), Protocol: ptrTo(corev1.ProtocolUDP)}},
	}
	for i := 0; i < 1000; i++ {
		slice.Endpoints = append(slice.Endpoints, discoveryv1.Endpoint{
			Addresses:  []string{fmt.Sprintf("10.244.%d.%d", 200+i/250, i%250+1)},
			Conditions: discoveryv1.EndpointConditions{Ready: ptrTo(true)}})
	}
	if _, err := c.Client().DiscoveryV1().EndpointSlices(ns).Create(ctx, slice, metav1.CreateOptions{}); err != nil {
		t.Fatalf("creating EndpointSlice: %v", err)
	}
	t.Cleanup(func() {
		_ = c.Client().DiscoveryV1().EndpointSlices(ns).Delete(context.Background(), "big-1", metav1.DeleteOptions{})
	})
	_ = svc
	for _, n := range c.Nodes() {
		eventually(t, 20*time.Second, "1,000-bucket groups on "+n.Name, func() error {
			out, err := tryOVS(n, "ovs-ofctl", "dump-groups", brInt(n))
			if err != nil {
				return err
			}
			full := 0
			for _, line := range strings.Split(out, "\n") {
				if strings.Count(line, "bucket=") == 1000 {
					full++
				}
			}
			if full != 2 {
				return fmt.Errorf("%d groups with 1,000 buckets, want 2 (TCP and UDP ports)", full)
			}
			return nil
		})
	}
}

func ptrTo[T any](v T) *T { return &v }

// A Service without selector whose EndpointSlice is managed by hand: the
// proxy follows it, and leaves it alone once it is labelled
// service.kubernetes.io/headless, as kube-proxy does (the upstream suite's
// "should implement service.kubernetes.io/headless").
func TestServiceIgnoresHeadlessEndpointSlices(t *testing.T) {
	c := shared
	const ns = "svc-hl"
	client := svcPods(t, c, ns, "client", 0)[0]
	server := svcPods(t, c, ns, "server", 1)[0]
	svc := createService(t, c, ns, "manual", "", nil)
	ctx := testCtx(t, time.Minute)
	slice := &discoveryv1.EndpointSlice{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "manual-1", Labels: map[string]string{
			discoveryv1.LabelServiceName: svc.Name, discoveryv1.LabelManagedBy: "seine-e2e"}},
		AddressType: discoveryv1.AddressTypeIPv4,
		Endpoints:   []discoveryv1.Endpoint{{Addresses: []string{server.ip}, Conditions: discoveryv1.EndpointConditions{Ready: ptrTo(true)}}},
		Ports:       []discoveryv1.EndpointPort{{Name: ptrTo("http"), Port: ptrTo[int32](tcpPort), Protocol: ptrTo(corev1.ProtocolTCP)}},
	}
	slice, err := c.Client().DiscoveryV1().EndpointSlices(ns).Create(ctx, slice, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	eventually(t, 15*time.Second, "the Service reaches the hand-made endpoint", func() error {
		if r := probeSvc(t, c, client, svc.Spec.ClusterIP, 80, corev1.ProtocolTCP, 2*time.Second); r.Outcome != echo.Connected || r.Reply != server.name {
			return fmt.Errorf("got %s", r)
		}
		return nil
	})
	slice.Labels[corev1.IsHeadlessService] = ""
	if _, err := c.Client().DiscoveryV1().EndpointSlices(ns).Update(ctx, slice, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	eventually(t, 15*time.Second, "the Service without its headless-labelled slice", func() error {
		if r := probeSvc(t, c, client, svc.Spec.ClusterIP, 80, corev1.ProtocolTCP, 2*time.Second); r.Outcome != echo.Refused {
			return fmt.Errorf("got %s, want refused (no endpoints)", r)
		}
		return nil
	})
}

// A UDP datagram larger than the MTU crosses in IP fragments both ways
// (the echo server pads its answer to the request's size): each one
// reaches an endpoint through the ClusterIP, from a Pod on the endpoints'
// Node, from a Pod on another Node and from a Node itself (host network),
// the path of the upstream "should be able to handle large requests: udp"
// conformance tests.
func TestServiceLargeUDP(t *testing.T) {
	c := shared
	const size = 4000 // three fragments at a 1,450-byte MTU
	eps := svcPods(t, c, "svc-bigudp", "bigudp", 1, 2)
	clients := svcPods(t, c, "svc-bigudp", "bigudp-client", 0, 1)
	svc := createService(t, c, "svc-bigudp", "big", "bigudp", nil)
	vip := svc.Spec.ClusterIP
	all := map[string]bool{}
	for _, p := range eps {
		all[p.name] = true
	}
	type source struct {
		name  string
		probe func(n int) echo.Result // a datagram of n bytes to vip:53
	}
	var from []source
	for _, p := range clients {
		from = append(from, source{"pod " + p.name, func(n int) echo.Result {
			return c.ProbeDatagram(testCtx(t, 5*time.Second), p.ns, p.name, vip, 53, n, 2*time.Second)
		}})
	}
	node := c.Nodes()[0]
	from = append(from, source{"node " + node.Name, func(n int) echo.Result {
		return c.ProbeDatagramFrom(testCtx(t, 5*time.Second), node.NetNS, vip, 53, n, 2*time.Second)
	}})
	for _, s := range from {
		eventually(t, 20*time.Second, s.name+": small datagram answered", func() error {
			if r := s.probe(6); r.Outcome != echo.Connected {
				return fmt.Errorf("got %s (%v)", r, r.Err)
			}
			return nil
		})
		for i := 0; i < 10; i++ {
			var r echo.Result
			for try := 0; try < 3; try++ {
				if r = s.probe(size); r.Outcome == echo.Connected {
					break
				}
			}
			if r.Outcome != echo.Connected || !all[r.Reply] || r.Bytes != size {
				t.Fatalf("%s: %d-byte datagram %d to %s:53: %s, %d bytes (%v); want an answer of %d bytes from one of %s",
					s.name, size, i, vip, r, r.Bytes, r.Err, size, names(eps))
			}
		}
	}
}
