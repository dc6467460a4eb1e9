package e2e

import (
	"bufio"
	"context"
	"fmt"
	"net"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/intstr"

	"github.com/seine-net/seine/node/config"
	"github.com/seine-net/seine/tests/sandbox"
	"github.com/seine-net/seine/tests/sandbox/echo"
)

// lineServer answers every line of every connection with name+"\n" until
// l is closed.
func lineServer(l net.Listener, name string) {
	for {
		conn, err := l.Accept()
		if err != nil {
			return
		}
		go func() {
			defer conn.Close()
			r := bufio.NewReader(conn)
			for {
				if _, err := r.ReadString('\n'); err != nil {
					return
				}
				if _, err := conn.Write([]byte(name + "\n")); err != nil {
					return
				}
			}
		}()
	}
}

// heldConn is a long-lived client connection through a Service.
type heldConn struct {
	conn net.Conn
	r    *bufio.Reader
}

// ask sends a line and returns the answering Pod's name.
func (h *heldConn) ask() (string, error) {
	_ = h.conn.SetDeadline(time.Now().Add(2 * time.Second))
	if _, err := h.conn.Write([]byte("ping\n")); err != nil {
		return "", err
	}
	s, err := h.r.ReadString('\n')
	return strings.TrimSpace(s), err
}

func hold(t *testing.T, c *sandbox.Cluster, from podRef, addr string) (*heldConn, error) {
	conn, err := c.DialFrom(testCtx(t, 5*time.Second), from.ns, from.name, addr)
	if err != nil {
		return nil, err
	}
	t.Cleanup(func() { conn.Close() })
	return &heldConn{conn: conn, r: bufio.NewReader(conn)}, nil
}

// dialIn opens a TCP connection to addr (host:port) from inside the named
// network namespace (/run/netns/<netns>); the connection is usable from
// any goroutine once open.
func dialIn(netns, addr string, timeout time.Duration) (net.Conn, error) {
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	return sandbox.DialIn(ctx, "/run/netns/"+netns, "tcp", addr)
}

// holdService starts a line server on port in one new Pod of namespace
// (label app=name) and creates the Service name with the one TCP port
// "hold" to it; mutate sets the rest (type, traffic policy). The Pod and
// the Service are returned; the test's end stops the server.
func holdService(t *testing.T, c *sandbox.Cluster, namespace, name string, port int32, mutate func(*corev1.Service)) (podRef, *corev1.Service) {
	t.Helper()
	pod := svcPods(t, c, namespace, name, 1)[0]
	l, err := c.ListenIn(pod.ns, pod.name, fmt.Sprintf(":%d", port))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	go lineServer(l, pod.name)
	svc := createService(t, c, namespace, name, name, func(s *corev1.Service) {
		mutate(s)
		s.Spec.Ports = []corev1.ServicePort{{Name: "hold", Port: port, Protocol: corev1.ProtocolTCP, TargetPort: intstr.FromInt32(port)}}
	})
	return pod, svc
}

// holdFromNS opens a connection to addr from the named network namespace
// (the external host's) and waits until want answers on it; the test's
// end closes it.
func holdFromNS(t *testing.T, netns, addr, want string) *heldConn {
	t.Helper()
	var held *heldConn
	eventually(t, 20*time.Second, "a connection to "+addr, func() error {
		conn, err := dialIn(netns, addr, 2*time.Second)
		if err != nil {
			return err
		}
		h := &heldConn{conn: conn, r: bufio.NewReader(conn)}
		if who, err := h.ask(); err != nil || who != want {
			conn.Close()
			return fmt.Errorf("answered by %q (%v)", who, err)
		}
		held = h
		return nil
	})
	t.Cleanup(func() { held.conn.Close() })
	return held
}

// A connection from outside to a LoadBalancer IP that is a local address
// of its Node (externalTrafficPolicy Local) survives a restart of seine on
// that Node, and new ones are served after it: the restarted daemon
// takes the address's alias back from the host's table, so neither the
// host's DNAT of the connection nor the bridge's frontend changes. A
// restart with another range of aliases (proxy.localVIPAliasCIDR) moves
// the alias there and unroutes the old range.
func TestServiceLocalVIPKeepsConnectionsAcrossRestart(t *testing.T) {
	c := shared
	namespace := "svc-localvip-restart"
	const port, lbIP = 9000, "198.18.100.23"
	pod, svc := holdService(t, c, namespace, "lvr", port, func(s *corev1.Service) {
		s.Spec.Type = corev1.ServiceTypeLoadBalancer
		s.Spec.ExternalTrafficPolicy = corev1.ServiceExternalTrafficPolicyLocal
	})
	ctx := testCtx(t, 2*time.Minute)
	node := c.Nodes()[1]
	alias := func(ip string) (string, error) {
		out, err := c.NodeExec(testCtx(t, 10*time.Second), node.Name, "nft", "list", "map", "ip", "seine-proxy", "local-vip-aliases")
		if err != nil {
			return "", fmt.Errorf("listing the aliases on %s: %v: %s", node.Name, err, out)
		}
		for _, f := range strings.FieldsFunc(string(out), func(r rune) bool { return r == '{' || r == '}' || r == ',' || r == '\n' }) {
			if k, v, ok := strings.Cut(strings.TrimSpace(f), " : "); ok && k == ip {
				return v, nil
			}
		}
		return "", fmt.Errorf("no alias of %s on %s: %s", ip, node.Name, out)
	}
	// Another external IP takes an alias first and gives it up, so the
	// LoadBalancer IP's is not the one a restarted daemon would hand out
	// first if it forgot the earlier ones.
	const other = "198.18.100.24"
	first := createService(t, c, namespace, "first", "", func(s *corev1.Service) { s.Spec.ExternalIPs = []string{other} })
	eventually(t, 20*time.Second, "an alias for "+other, func() error { _, err := alias(other); return err })
	svc.Status.LoadBalancer.Ingress = []corev1.LoadBalancerIngress{{IP: lbIP}}
	if _, err := c.Client().CoreV1().Services(namespace).UpdateStatus(ctx, svc, metav1.UpdateOptions{}); err != nil {
		t.Fatalf("setting LoadBalancer ingress: %v", err)
	}
	var before string
	eventually(t, 20*time.Second, "an alias for "+lbIP, func() error {
		var err error
		before, err = alias(lbIP)
		return err
	})
	if err := c.Client().CoreV1().Services(namespace).Delete(ctx, first.Name, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	eventually(t, 20*time.Second, other+"'s alias given up", func() error {
		if a, err := alias(other); err == nil {
			return fmt.Errorf("%s still has alias %s", other, a)
		}
		return nil
	})
	localVIP(t, c, node, lbIP)
	extNS, _ := c.ExternalHost()
	addr := net.JoinHostPort(lbIP, fmt.Sprint(port))
	held := holdFromNS(t, extNS, addr, pod.name)
	stopSeine(t, c, node.Name)
	if err := c.StartSeine(testCtx(t, time.Minute), node.Name, nil); err != nil {
		t.Fatal(err)
	}
	if after, err := alias(lbIP); err != nil || after != before {
		t.Errorf("alias of %s: %s before the restart, %s after (%v)", lbIP, before, after, err)
	}
	for i := 0; i < 3; i++ {
		if who, err := held.ask(); err != nil || who != pod.name {
			t.Fatalf("the established connection after the restart: answered by %q (%v)", who, err)
		}
	}
	holdFromNS(t, extNS, addr, pod.name)

	// Another range of aliases (proxy.localVIPAliasCIDR): the IP gets its
	// alias from there, new connections are served, and the old range is
	// no longer routed into the bridge.
	const moved = "169.254.64.0/20"
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		if err := c.StopSeine(node.Name); err != nil {
			t.Errorf("stopping seine on %s: %v", node.Name, err)
		}
		if err := c.StartSeine(ctx, node.Name, nil); err != nil {
			t.Errorf("starting seine on %s with its usual configuration: %v", node.Name, err)
		}
	})
	stopSeine(t, c, node.Name)
	if err := c.StartSeine(testCtx(t, time.Minute), node.Name, map[string]string{"proxy": "{localVIPAliasCIDR: " + moved + "}"}); err != nil {
		t.Fatal(err)
	}
	_, movedNet, _ := net.ParseCIDR(moved)
	eventually(t, 20*time.Second, "an alias from "+moved, func() error {
		a, err := alias(lbIP)
		if err != nil {
			return err
		}
		if !movedNet.Contains(net.ParseIP(a)) {
			return fmt.Errorf("alias %s is outside %s", a, moved)
		}
		return nil
	})
	holdFromNS(t, extNS, addr, pod.name)
	eventually(t, 20*time.Second, "the old range unrouted", func() error {
		out, err := c.NodeExec(testCtx(t, 10*time.Second), node.Name, "ip", "route", "show", "169.254.192.0/18")
		if err != nil || strings.TrimSpace(string(out)) != "" {
			return fmt.Errorf("still routed on %s: %q (%v)", node.Name, out, err)
		}
		return nil
	})
}

// Established connections through a ClusterIP keep their endpoint when
// the other endpoints go away, while new connections only reach the one
// left.
func TestServiceKeepsEstablishedConnections(t *testing.T) {
	c := shared
	ns := "svc-est"
	const port = 9000
	pods := svcPods(t, c, ns, "est", 0, 1, 2)
	client := svcPods(t, c, ns, "client", 0)[0]
	for _, p := range pods {
		l, err := c.ListenIn(p.ns, p.name, fmt.Sprintf(":%d", port))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { l.Close() })
		go lineServer(l, p.name)
	}
	svc := createService(t, c, ns, "est", "est", func(s *corev1.Service) {
		s.Spec.Ports = []corev1.ServicePort{{Name: "hold", Port: port, Protocol: corev1.ProtocolTCP, TargetPort: intstr.FromInt32(port)}}
	})
	addr := net.JoinHostPort(svc.Spec.ClusterIP, fmt.Sprint(port))
	all := names(pods)
	var held []*heldConn
	var owner []string
	eventually(t, 20*time.Second, "connections to every endpoint", func() error {
		seen := map[string]int{}
		held, owner = nil, nil
		for i := 0; i < 12; i++ {
			h, err := hold(t, c, client, addr)
			if err != nil {
				return err
			}
			who, err := h.ask()
			if err != nil {
				return err
			}
			held, owner = append(held, h), append(owner, who)
			seen[who]++
		}
		if keys(seen) != all {
			return fmt.Errorf("connections went to %v, want each of %s", seen, all)
		}
		return nil
	})
	keep := owner[0]
	ctx := testCtx(t, time.Minute)
	for _, p := range pods {
		if p.name != keep {
			if err := c.DeletePod(ctx, p.ns, p.name); err != nil {
				t.Fatal(err)
			}
		}
	}
	eventually(t, 10*time.Second, "new connections reach only "+keep, func() error {
		for i := 0; i < 6; i++ {
			h, err := hold(t, c, client, addr)
			if err != nil {
				return err
			}
			if who, err := h.ask(); err != nil || who != keep {
				return fmt.Errorf("new connection answered by %q (%v)", who, err)
			}
		}
		return nil
	})
	for i, h := range held {
		if owner[i] != keep {
			continue
		}
		for j := 0; j < 3; j++ {
			if who, err := h.ask(); err != nil || who != keep {
				t.Errorf("established connection %d to %s: answered by %q (%v)", i, keep, who, err)
			}
		}
	}
}

// A connection from outside through a NodePort survives a moment when
// the Service has no endpoint at all (its one endpoint's Pod relabelled
// away, still running): new connections are refused meanwhile, the
// established one keeps its endpoint, as under kube-proxy.
func TestServiceNodePortKeepsConnectionsWithoutEndpoints(t *testing.T) {
	c := shared
	namespace := "svc-est-np"
	const port = 9000
	pod, svc := holdService(t, c, namespace, "estnp", port, func(s *corev1.Service) {
		s.Spec.Type = corev1.ServiceTypeNodePort
	})
	node := c.Nodes()[0]
	addr := net.JoinHostPort(node.IP, fmt.Sprint(svc.Spec.Ports[0].NodePort))
	extNS, _ := c.ExternalHost()
	held := holdFromNS(t, extNS, addr, pod.name)
	patch := []byte(`{"metadata":{"labels":{"app":"estnp-away"}}}`)
	if _, err := c.Client().CoreV1().Pods(namespace).Patch(testCtx(t, 10*time.Second), pod.name, types.MergePatchType, patch, metav1.PatchOptions{}); err != nil {
		t.Fatal(err)
	}
	eventually(t, 20*time.Second, "new connections refused", func() error {
		if r := c.ProbeFrom(testCtx(t, 10*time.Second), extNS, node.IP, int(svc.Spec.Ports[0].NodePort), corev1.ProtocolTCP, 2*time.Second); r.Outcome != echo.Refused {
			return fmt.Errorf("new connection: %s", r)
		}
		return nil
	})
	for i := 0; i < 3; i++ {
		if who, err := held.ask(); err != nil || who != pod.name {
			t.Fatalf("the established connection, with no endpoint left: answered by %q (%v)", who, err)
		}
	}
}

// With proxy.enable=false, seine leaves Services to kube-proxy on the host:
// no Service flows, groups, routes or nftables table on the Node, and a
// Pod's ClusterIP traffic reaches the host, where a kube-proxy-like DNAT
// rule sends it to an endpoint on another Node and the replies find their
// way back through the host. Turning the proxy on again restores it.
func TestServiceProxyDisabled(t *testing.T) {
	c := shared
	ns := "svc-noproxy"
	server := svcPods(t, c, ns, "kp", 1)[0]
	client := svcPods(t, c, ns, "client", 0)[0]
	svc := createService(t, c, ns, "kp", "kp", nil)
	vip := svc.Spec.ClusterIP
	node := c.Nodes()[0]
	eventually(t, 15*time.Second, "ClusterIP through seine", func() error {
		if r := probeSvc(t, c, client, vip, 80, corev1.ProtocolTCP, 2*time.Second); r.Outcome != sandbox.Connected {
			return fmt.Errorf("got %s", r)
		}
		return nil
	})
	restart := func(set map[string]string, env ...string) {
		t.Helper()
		stopSeine(t, c, node.Name)
		if err := c.StartSeine(testCtx(t, time.Minute), node.Name, set, env...); err != nil {
			t.Fatal(err)
		}
	}
	t.Cleanup(func() {
		_, _ = c.NodeExec(testCtx(t, 10*time.Second), node.Name, "nft", "delete", "table", "ip", "fake-kube-proxy")
		_ = c.StopSeine(node.Name)
		if err := c.StartSeine(testCtx(t, time.Minute), node.Name, nil); err != nil {
			t.Error(err)
		}
	})
	var override []string
	if e2eMode != config.ModeEncap {
		// The other modes refuse to run without the proxy, naming the
		// override.
		stopSeine(t, c, node.Name)
		err := c.StartSeine(testCtx(t, time.Minute), node.Name, map[string]string{"proxy": "{enable: false}"})
		if err == nil || !strings.Contains(err.Error(), "proxy.enable") || !strings.Contains(err.Error(), config.AllowNoEncapWithoutProxyEnv) {
			t.Fatalf("seine started in %s mode without the proxy, or its error names neither the key nor the override: %v", e2eMode, err)
		}
		override = []string{config.AllowNoEncapWithoutProxyEnv + "=true"}
	}
	restart(map[string]string{"proxy": "{enable: false}"}, override...)
	eventually(t, 15*time.Second, "no Service state left on "+node.Name, func() error {
		if out := ovs(t, node, "ovs-ofctl", "dump-flows", brInt(node), "table=40"); strings.Contains(out, vip) {
			return fmt.Errorf("ServiceLB still has %s:\n%s", vip, out)
		}
		if out := ovs(t, node, "ovs-ofctl", "-O", "OpenFlow13", "dump-groups", brInt(node)); strings.Contains(out, "group_id") {
			return fmt.Errorf("groups left:\n%s", out)
		}
		ctx := testCtx(t, 10*time.Second)
		if out, _ := c.NodeExec(ctx, node.Name, "ip", "route", "show", "proto", "94"); strings.TrimSpace(string(out)) != "" {
			return fmt.Errorf("proxy routes left: %s", out)
		}
		if _, err := c.NodeExec(ctx, node.Name, "nft", "list", "table", "ip", "seine-proxy"); err == nil {
			return fmt.Errorf("table seine-proxy left")
		}
		return nil
	})
	rules := fmt.Sprintf(`table ip fake-kube-proxy {
  chain prerouting { type nat hook prerouting priority dstnat; ip daddr %s tcp dport 80 dnat to %s:%d; }
}`, vip, server.ip, tcpPort)
	if out, err := c.NodeExec(testCtx(t, 10*time.Second), node.Name, "sh", "-c", "echo '"+rules+"' | nft -f -"); err != nil {
		t.Fatalf("fake kube-proxy rules: %v: %s", err, out)
	}
	eventually(t, 15*time.Second, "ClusterIP through the host", func() error {
		r := probeSvc(t, c, client, vip, 80, corev1.ProtocolTCP, 2*time.Second)
		if r.Outcome != sandbox.Connected || r.Reply != server.name {
			return fmt.Errorf("got %s", r)
		}
		return nil
	})
}
