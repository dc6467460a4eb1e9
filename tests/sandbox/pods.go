package sandbox

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	"github.com/containernetworking/plugins/pkg/ns"

	"github.com/seine-net/seine/tests/sandbox/echo"
	"github.com/seine-net/seine/tests/sandbox/kubelet"
)

// PodImage is the image name sandbox Pods declare; nothing pulls it.
const PodImage = "registry.invalid/seine/sandbox-echo:1"

// Port is a container port of a sandbox Pod; its server answers with the
// Pod's name.
type Port struct {
	// Name is the port name (optional, IANA_SVC_NAME rules).
	Name string
	// Port is the container port.
	Port int32
	// Protocol is TCP (default), UDP or SCTP.
	Protocol corev1.Protocol
	// HostPort, when not 0, asks for a host port mapping (the portMappings
	// capability).
	HostPort int32
	// HostIP limits the mapping to one address (empty: every address).
	HostIP string
}

// PodSpec describes a sandbox Pod: one container with echo servers on
// Ports.
type PodSpec struct {
	Namespace string
	Name      string
	Labels    map[string]string
	// Annotations of the Pod (kubernetes.io/ingress-bandwidth and
	// kubernetes.io/egress-bandwidth reach the CNI plugin).
	Annotations map[string]string
	// Node pins the Pod to a Node (spec.nodeName, by name or index); empty
	// lets kube-scheduler choose.
	Node  string
	Ports []Port
	// HostNetwork runs the Pod in the Node's namespace.
	HostNetwork bool
}

// CreatePod creates the Pod (and its namespace if missing), waits up to
// 90 s until it is Ready with an IP, and returns it. A Pod it created that
// does not get Ready is deleted before the error returns.
func (c *Cluster) CreatePod(ctx context.Context, spec PodSpec) (*corev1.Pod, error) {
	if spec.Namespace == "" {
		spec.Namespace = "default"
	}
	if err := c.ensureNamespace(ctx, spec.Namespace); err != nil {
		return nil, err
	}
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Namespace: spec.Namespace, Name: spec.Name, Labels: spec.Labels, Annotations: spec.Annotations},
		Spec: corev1.PodSpec{
			Containers:                    []corev1.Container{{Name: "main", Image: PodImage}},
			TerminationGracePeriodSeconds: ptr.To[int64](1),
			HostNetwork:                   spec.HostNetwork,
			AutomountServiceAccountToken:  ptr.To(false),
		},
	}
	if spec.Node != "" {
		n, err := c.Node(spec.Node)
		if err != nil {
			return nil, err
		}
		pod.Spec.NodeName = n.Name
	}
	for _, p := range spec.Ports {
		proto := p.Protocol
		if proto == "" {
			proto = corev1.ProtocolTCP
		}
		pod.Spec.Containers[0].Ports = append(pod.Spec.Containers[0].Ports, corev1.ContainerPort{
			Name: p.Name, ContainerPort: p.Port, Protocol: proto, HostPort: p.HostPort, HostIP: p.HostIP,
		})
	}
	pods := c.Client().CoreV1().Pods(spec.Namespace)
	// The ServiceAccount admission plugin rejects Pods until the namespace's
	// "default" ServiceAccount exists; that takes a moment after creation.
	err := waitFor(ctx, 30*time.Second, 250*time.Millisecond, "pod creation", func(ctx context.Context) (bool, error) {
		_, err := pods.Create(ctx, pod, metav1.CreateOptions{})
		if err == nil {
			return true, nil
		}
		if apierrors.IsForbidden(err) && strings.Contains(err.Error(), "serviceaccount") {
			return false, err
		}
		return false, backoffStop{err}
	})
	var stop backoffStop
	if errors.As(err, &stop) {
		return nil, fmt.Errorf("create pod %s/%s: %w", spec.Namespace, spec.Name, stop.error)
	}
	if err != nil {
		return nil, fmt.Errorf("create pod %s/%s: %w", spec.Namespace, spec.Name, err)
	}
	var got *corev1.Pod
	err = waitFor(ctx, 90*time.Second, 200*time.Millisecond, "pod "+spec.Namespace+"/"+spec.Name+" Ready", func(ctx context.Context) (bool, error) {
		p, err := pods.Get(ctx, spec.Name, metav1.GetOptions{})
		if err != nil {
			return false, err
		}
		if !podReady(p) || p.Status.PodIP == "" {
			return false, fmt.Errorf("phase %s, node %q, conditions %s", p.Status.Phase, p.Spec.NodeName, conditionSummary(p))
		}
		if _, err := c.PodState(p.Namespace, p.Name); err != nil {
			return false, err
		}
		got = p
		return true, nil
	})
	if err != nil {
		// Nothing of a failed call stays behind: the Pod would hold an
		// address, a port and its name for the rest of the run.
		dctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 90*time.Second)
		defer cancel()
		if derr := c.DeletePod(dctx, spec.Namespace, spec.Name); derr != nil {
			err = errors.Join(err, derr)
		}
		return nil, fmt.Errorf("create pod %s/%s: %w", spec.Namespace, spec.Name, err)
	}
	return got, nil
}

// backoffStop marks an error that ends a waitFor loop at once.
type backoffStop struct{ error }

func podReady(p *corev1.Pod) bool {
	for _, c := range p.Status.Conditions {
		if c.Type == corev1.PodReady {
			return c.Status == corev1.ConditionTrue
		}
	}
	return false
}

func conditionSummary(p *corev1.Pod) string {
	var parts []string
	for _, c := range p.Status.Conditions {
		s := fmt.Sprintf("%s=%s", c.Type, c.Status)
		if c.Message != "" {
			s += fmt.Sprintf(" (%s)", c.Message)
		}
		parts = append(parts, s)
	}
	return strings.Join(parts, ", ")
}

// DeletePod deletes the Pod and waits up to 60 s until the object is gone
// and its network namespace removed. A missing Pod is not an error.
func (c *Cluster) DeletePod(ctx context.Context, namespace, name string) error {
	pods := c.Client().CoreV1().Pods(namespace)
	p, err := pods.Get(ctx, name, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("delete pod %s/%s: %w", namespace, name, err)
	}
	netns := kubelet.PodNetNSName(c.st.Name, string(p.UID))
	if err := pods.Delete(ctx, name, metav1.DeleteOptions{Preconditions: &metav1.Preconditions{UID: &p.UID}}); err != nil && !apierrors.IsNotFound(err) {
		return fmt.Errorf("delete pod %s/%s: %w", namespace, name, err)
	}
	err = waitFor(ctx, 60*time.Second, 200*time.Millisecond, "pod "+namespace+"/"+name+" gone", func(ctx context.Context) (bool, error) {
		cur, err := pods.Get(ctx, name, metav1.GetOptions{})
		if err == nil && cur.UID == p.UID {
			return false, errors.New("pod object still exists")
		}
		if err != nil && !apierrors.IsNotFound(err) {
			return false, err
		}
		if _, err := os.Stat(netnsPath(netns)); err == nil {
			return false, fmt.Errorf("netns %s still exists", netns)
		}
		return true, nil
	})
	if err != nil {
		return fmt.Errorf("delete pod %s/%s: %w", namespace, name, err)
	}
	return nil
}

// podNetNS is the namespace a Pod's processes run in (its Node's for
// hostNetwork Pods).
func (c *Cluster) podNetNS(namespace, pod string) (string, error) {
	st, err := c.PodState(namespace, pod)
	if err != nil {
		return "", fmt.Errorf("pod %s/%s is not running in sandbox %s: %w", namespace, pod, c.st.Name, err)
	}
	if st.HostNetwork {
		n, err := c.Node(st.Node)
		if err != nil {
			return "", err
		}
		return n.NetNS, nil
	}
	return st.NetNS, nil
}

// Exec runs argv inside the Pod's network namespace and returns its
// combined output; a non-zero exit is an *exec.ExitError.
func (c *Cluster) Exec(ctx context.Context, namespace, pod string, argv ...string) ([]byte, error) {
	ns, err := c.podNetNS(namespace, pod)
	if err != nil {
		return nil, err
	}
	return execIn(ctx, ns, argv)
}

// NodeExec runs argv inside the Node's network namespace and, on a real
// Node, its mount namespace too (as a process of that machine sees things).
func (c *Cluster) NodeExec(ctx context.Context, node string, argv ...string) ([]byte, error) {
	n, err := c.Node(node)
	if err != nil {
		return nil, err
	}
	if c.st.Kubelet {
		out, err := inNode(ctx, n, argv...)
		return []byte(out), err
	}
	return execIn(ctx, n.NetNS, argv)
}

// ExternalExec runs argv inside the external host's namespace.
func (c *Cluster) ExternalExec(ctx context.Context, argv ...string) ([]byte, error) {
	return execIn(ctx, extNS(c.st.Name), argv)
}

func execIn(ctx context.Context, netns string, argv []string) ([]byte, error) {
	if len(argv) == 0 {
		return nil, errors.New("exec: no command")
	}
	cmd := exec.CommandContext(ctx, "ip", append([]string{"netns", "exec", netns}, argv...)...)
	out, err := cmd.CombinedOutput()
	if err != nil {
		return out, fmt.Errorf("exec %q in %s: %w", strings.Join(argv, " "), netns, err)
	}
	return out, nil
}

// ProbeResult is the outcome of a probe (see package echo).
type ProbeResult = echo.Result

// Probe outcomes.
const (
	Connected = echo.Connected
	Refused   = echo.Refused
	TimedOut  = echo.TimedOut
	Failed    = echo.Failed
)

// Probe connects from the Pod's namespace to host:port over proto and
// classifies the answer (Connected with the server Pod's name as Reply,
// Refused or TimedOut after timeout).
func (c *Cluster) Probe(ctx context.Context, namespace, pod, host string, port int, proto corev1.Protocol, timeout time.Duration) ProbeResult {
	ns, err := c.podNetNS(namespace, pod)
	if err != nil {
		return ProbeResult{Outcome: Failed, Err: err}
	}
	return c.ProbeFrom(ctx, ns, host, port, proto, timeout)
}

// ProbeFrom is Probe from any namespace by name, e.g. a Node's or the
// external host's.
func (c *Cluster) ProbeFrom(ctx context.Context, netnsName, host string, port int, proto corev1.Protocol, timeout time.Duration) ProbeResult {
	return echo.Probe(ctx, netnsPath(netnsName), host, port, proto, timeout)
}

// ProbeDatagram sends one UDP datagram of size bytes from a Pod to
// host:port and waits for the echo server's answer of the same size
// (echo.ProbeDatagram).
func (c *Cluster) ProbeDatagram(ctx context.Context, namespace, pod, host string, port, size int, timeout time.Duration) ProbeResult {
	ns, err := c.podNetNS(namespace, pod)
	if err != nil {
		return ProbeResult{Outcome: Failed, Err: err}
	}
	return c.ProbeDatagramFrom(ctx, ns, host, port, size, timeout)
}

// ProbeDatagramFrom is ProbeDatagram from any namespace by name.
func (c *Cluster) ProbeDatagramFrom(ctx context.Context, netnsName, host string, port, size int, timeout time.Duration) ProbeResult {
	return echo.ProbeDatagram(ctx, netnsPath(netnsName), host, port, size, timeout)
}

// Serve starts echo servers answering reply+"\n" on ports inside the
// named namespace (e.g. the external host's) in this process; close the
// result to stop them.
func (c *Cluster) Serve(netnsName, reply string, ports []Port) (*echo.Servers, error) {
	var eps []echo.Port
	for _, p := range ports {
		eps = append(eps, echo.Port{Port: p.Port, Protocol: p.Protocol})
	}
	return echo.Serve(netnsPath(netnsName), reply, eps, c.log)
}

// RouteToNode makes the underlay router send dst (a CIDR, e.g. an
// externalIP or a LoadBalancer address) to the Node's address, as an
// upstream router or a load balancer would. The returned function removes
// the route.
func (c *Cluster) RouteToNode(ctx context.Context, dst, node string) (func(), error) {
	n, err := c.Node(node)
	if err != nil {
		return nil, err
	}
	u := underlayNS(c.st.Name)
	if _, err := execIn(ctx, u, []string{"ip", "route", "replace", dst, "via", n.IP}); err != nil {
		return nil, err
	}
	return func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_, _ = execIn(ctx, u, []string{"ip", "route", "del", dst})
	}, nil
}

// DialFrom opens a TCP connection to addr from inside the Pod's network
// namespace (the socket stays there), for tests that need a long-lived
// connection.
func (c *Cluster) DialFrom(ctx context.Context, namespace, pod, addr string) (net.Conn, error) {
	return c.DialNetFrom(ctx, namespace, pod, "tcp", addr)
}

// DialNetFrom is DialFrom for any network of net.Dial: "udp" gives a
// socket that sends every datagram from the same source port, as a
// long-lived UDP flow does.
func (c *Cluster) DialNetFrom(ctx context.Context, namespace, pod, network, addr string) (net.Conn, error) {
	name, err := c.podNetNS(namespace, pod)
	if err != nil {
		return nil, err
	}
	return DialIn(ctx, netnsPath(name), network, addr)
}

// DialIn dials addr over network (as net.Dial names them) from inside the
// network namespace at netnsPath (a /run/netns entry, or /proc/<pid>/ns/net);
// the connection is then used from any goroutine.
func DialIn(ctx context.Context, netnsPath, network, addr string) (net.Conn, error) {
	var conn net.Conn
	err := ns.WithNetNSPath(netnsPath, func(ns.NetNS) error {
		var d net.Dialer
		var err error
		conn, err = d.DialContext(ctx, network, addr)
		return err
	})
	return conn, err
}

// ListenIn listens on the TCP address addr inside the Pod's network
// namespace.
func (c *Cluster) ListenIn(namespace, pod, addr string) (net.Listener, error) {
	name, err := c.podNetNS(namespace, pod)
	if err != nil {
		return nil, err
	}
	var l net.Listener
	err = ns.WithNetNSPath(netnsPath(name), func(ns.NetNS) error {
		var err error
		l, err = net.Listen("tcp", addr)
		return err
	})
	return l, err
}
