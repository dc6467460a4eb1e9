package e2e

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"os"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/client-go/util/retry"

	"github.com/seine-net/seine/datapath/pipeline"
	"github.com/seine-net/seine/tests/netpol"
	"github.com/seine-net/seine/tests/sandbox"
	"github.com/seine-net/seine/tests/sandbox/echo"
)

// Probe tuning of the NetworkPolicy suites. A denied TCP or UDP probe
// costs its whole timeout, so probes run in parallel.
const (
	netpolProbeTimeout    = time.Second
	netpolConcurrency     = 96
	netpolTraceParallel   = 6
	netpolSettle          = 750 * time.Millisecond
	netpolDefaultDeadline = 20 * time.Second
	// netpolDefaultProbes is how many denied pairs are re-probed to see the
	// all-allowed state back after a scenario.
	netpolDefaultProbes = 6
)

// netpolEnv is the NetworkPolicy model on the shared sandbox: namespaces
// x, y, z and Pods a, b, c in each, created once per test binary run and
// reused by TestNetpolConformance and TestNetpolDifferential. The Pods stay
// until the sandbox goes down at the end of the run; every test removes the
// policies and labels it added.
type netpolEnv struct {
	c *sandbox.Cluster
	// base is the state right after setup.
	base *netpol.State
	// deadline bounds each wait for enforcement (SEINE_NETPOL_DEADLINE).
	deadline time.Duration

	traceOnce sync.Once
	trace     *traceTopology
	traceErr  error

	// viaService makes TCP and UDP probes go to the destination Pod's own
	// ClusterIP (svcIP) instead of its Pod IP.
	viaService bool
	svcIP      map[netpol.PodID]string
}

var (
	netpolOnce    sync.Once
	netpolShared  *netpolEnv
	netpolInitErr error
)

// netpolSetup returns the model, creating it on first use.
func netpolSetup(t *testing.T) *netpolEnv {
	t.Helper()
	netpolOnce.Do(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
		defer cancel()
		start := time.Now()
		netpolShared, netpolInitErr = newNetpolEnv(ctx, shared)
		if netpolInitErr == nil {
			t.Logf("NetworkPolicy model (9 Pods over %d Nodes) ready in %s", len(shared.Nodes()), time.Since(start).Round(time.Millisecond))
		}
	})
	if netpolInitErr != nil {
		t.Fatalf("NetworkPolicy model setup: %v", netpolInitErr)
	}
	return netpolShared
}

func newNetpolEnv(ctx context.Context, c *sandbox.Cluster) (*netpolEnv, error) {
	e := &netpolEnv{c: c, deadline: netpolDefaultDeadline}
	if v := os.Getenv("SEINE_NETPOL_DEADLINE"); v != "" {
		d, err := time.ParseDuration(v)
		if err != nil {
			return nil, fmt.Errorf("SEINE_NETPOL_DEADLINE=%q: %w", v, err)
		}
		e.deadline = d
	}
	cs := c.Client()
	for _, ns := range netpol.Namespaces() {
		want := map[string]string{netpol.LabelNS: ns}
		_, err := cs.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns, Labels: want}}, metav1.CreateOptions{})
		if apierrors.IsAlreadyExists(err) {
			err = e.patchLabels(ctx, "", ns, want)
		}
		if err != nil {
			return nil, fmt.Errorf("namespace %s: %w", ns, err)
		}
		if err := e.deletePolicies(ctx, ns); err != nil {
			return nil, err
		}
	}
	nodes := c.Nodes()
	var ports []sandbox.Port
	for _, p := range netpol.ModelPorts() {
		ports = append(ports, sandbox.Port{Name: p.Name, Port: p.Port, Protocol: p.Protocol})
	}
	var wg sync.WaitGroup
	errs := make(chan error, 9)
	for i, ns := range netpol.Namespaces() {
		for j, name := range netpol.PodNames() {
			spec := sandbox.PodSpec{Namespace: ns, Name: name, Labels: map[string]string{netpol.LabelPod: name},
				Node: nodes[netpol.NodeOf(i, j, len(nodes))].Name, Ports: ports}
			wg.Add(1)
			go func() {
				defer wg.Done()
				// A Pod left by an earlier run against the same sandbox is
				// reused (readState checks it has an IP).
				if _, err := c.CreatePod(ctx, spec); err != nil && !apierrors.IsAlreadyExists(err) {
					errs <- err
				}
			}()
		}
	}
	wg.Wait()
	close(errs)
	if err := <-errs; err != nil {
		return nil, err
	}
	st, err := e.readState(ctx)
	if err != nil {
		return nil, err
	}
	e.base = st
	return e, nil
}

// readState reads namespace labels and the model's Pods from the API.
func (e *netpolEnv) readState(ctx context.Context) (*netpol.State, error) {
	cs := e.c.Client()
	st := &netpol.State{NamespaceLabels: map[string]map[string]string{}}
	for _, ns := range netpol.Namespaces() {
		n, err := cs.CoreV1().Namespaces().Get(ctx, ns, metav1.GetOptions{})
		if err != nil {
			return nil, fmt.Errorf("read namespace %s: %w", ns, err)
		}
		st.NamespaceLabels[ns] = n.Labels
		for _, name := range netpol.PodNames() {
			p, err := cs.CoreV1().Pods(ns).Get(ctx, name, metav1.GetOptions{})
			if err != nil {
				return nil, fmt.Errorf("read pod %s/%s: %w", ns, name, err)
			}
			ip := net.ParseIP(p.Status.PodIP).To4()
			if ip == nil {
				return nil, fmt.Errorf("pod %s/%s has no IPv4 address (%q)", ns, name, p.Status.PodIP)
			}
			pod := netpol.Pod{PodID: netpol.PodID{Namespace: ns, Name: name}, Labels: p.Labels, IP: ip, Node: p.Spec.NodeName}
			for _, ctr := range p.Spec.Containers {
				for _, cp := range ctr.Ports {
					pod.Ports = append(pod.Ports, netpol.ContainerPort{Name: cp.Name, Port: cp.ContainerPort, Protocol: cp.Protocol})
				}
			}
			st.Pods = append(st.Pods, pod)
		}
	}
	netpol.SortPods(st.Pods)
	return st, nil
}

// patchLabels sets labels (a nil value removes the key) on a namespace
// (podNS "") or a Pod, by JSON merge patch.
func (e *netpolEnv) patchLabels(ctx context.Context, podNS, name string, set map[string]string) error {
	labels := map[string]any{}
	for k, v := range set {
		labels[k] = v
	}
	return e.patch(ctx, podNS, name, labels)
}

func (e *netpolEnv) patch(ctx context.Context, podNS, name string, labels map[string]any) error {
	b, err := json.Marshal(map[string]any{"metadata": map[string]any{"labels": labels}})
	if err != nil {
		return err
	}
	if podNS == "" {
		_, err = e.c.Client().CoreV1().Namespaces().Patch(ctx, name, types.MergePatchType, b, metav1.PatchOptions{})
	} else {
		_, err = e.c.Client().CoreV1().Pods(podNS).Patch(ctx, name, types.MergePatchType, b, metav1.PatchOptions{})
	}
	if err != nil {
		return fmt.Errorf("label %s/%s: %w", podNS, name, err)
	}
	return nil
}

// addLabels adds labels to a namespace (podNS "") or Pod and registers
// their removal when the test ends.
func (e *netpolEnv) addLabels(t *testing.T, podNS, name string, add map[string]string) {
	t.Helper()
	if err := e.patchLabels(testCtx(t, 30*time.Second), podNS, name, add); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		undo := map[string]any{}
		for k := range add {
			undo[k] = nil
		}
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		if err := e.patch(ctx, podNS, name, undo); err != nil {
			t.Errorf("reverting labels: %v", err)
		}
	})
}

// deletePolicies deletes every NetworkPolicy of ns and waits until none
// is listed.
func (e *netpolEnv) deletePolicies(ctx context.Context, ns string) error {
	api := e.c.Client().NetworkingV1().NetworkPolicies(ns)
	if err := api.DeleteCollection(ctx, metav1.DeleteOptions{}, metav1.ListOptions{}); err != nil {
		return fmt.Errorf("delete policies of %s: %w", ns, err)
	}
	for {
		l, err := api.List(ctx, metav1.ListOptions{})
		if err != nil {
			return fmt.Errorf("list policies of %s: %w", ns, err)
		}
		if len(l.Items) == 0 {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("policies of %s not gone: %w", ns, ctx.Err())
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// applyPolicies makes want the complete set of policies in the model's
// namespaces: creates or updates (by name) each, deletes the others. It
// returns the objects as stored (with API defaults), in want's order.
func (e *netpolEnv) applyPolicies(ctx context.Context, want []*networkingv1.NetworkPolicy) ([]*networkingv1.NetworkPolicy, error) {
	keep := map[string]bool{}
	for _, p := range want {
		keep[p.Namespace+"/"+p.Name] = true
	}
	for _, ns := range netpol.Namespaces() {
		api := e.c.Client().NetworkingV1().NetworkPolicies(ns)
		l, err := api.List(ctx, metav1.ListOptions{})
		if err != nil {
			return nil, fmt.Errorf("list policies of %s: %w", ns, err)
		}
		for _, p := range l.Items {
			if !keep[ns+"/"+p.Name] {
				if err := api.Delete(ctx, p.Name, metav1.DeleteOptions{}); err != nil && !apierrors.IsNotFound(err) {
					return nil, fmt.Errorf("delete policy %s/%s: %w", ns, p.Name, err)
				}
			}
		}
	}
	var out []*networkingv1.NetworkPolicy
	for _, p := range want {
		api := e.c.Client().NetworkingV1().NetworkPolicies(p.Namespace)
		obj := p.DeepCopy()
		got, err := api.Create(ctx, obj, metav1.CreateOptions{})
		if apierrors.IsAlreadyExists(err) {
			// Seine's controller annotates policies with their
			// realization, so an update may race it: retry on conflict.
			err = retry.RetryOnConflict(retry.DefaultRetry, func() error {
				cur, gerr := api.Get(ctx, p.Name, metav1.GetOptions{})
				if gerr != nil {
					return gerr
				}
				cur.Spec = *p.Spec.DeepCopy()
				var uerr error
				got, uerr = api.Update(ctx, cur, metav1.UpdateOptions{})
				return uerr
			})
		}
		if err != nil {
			return nil, fmt.Errorf("apply policy %s/%s: %w", p.Namespace, p.Name, err)
		}
		out = append(out, got)
	}
	return out, nil
}

// resetPolicies deletes every policy of the model and waits until up to
// netpolDefaultProbes of the connections denied in lastWant (chosen
// spread over the table) connect again, so the next scenario starts from
// the all-allowed state.
func (e *netpolEnv) resetPolicies(t *testing.T, st *netpol.State, lastWant []netpol.Expectation, probe netpol.ProbeFunc) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), e.deadline+30*time.Second)
	defer cancel()
	for _, ns := range netpol.Namespaces() {
		if err := e.deletePolicies(ctx, ns); err != nil {
			t.Errorf("cleanup: %v", err)
			return
		}
	}
	var denied []netpol.Connection
	for _, ex := range lastWant {
		for _, p := range ex.Want.Pairs(false) {
			denied = append(denied, netpol.Connection{From: &st.Pods[p[0]], To: &st.Pods[p[1]], PP: ex.PP})
		}
	}
	if len(denied) == 0 {
		return
	}
	var sample []netpol.Connection
	step := (len(denied) + netpolDefaultProbes - 1) / netpolDefaultProbes
	for i := 0; i < len(denied); i += step {
		sample = append(sample, denied[i])
	}
	deadline := time.Now().Add(e.deadline)
	for {
		res, err := netpol.ProbeConnections(ctx, sample, netpolConcurrency, probe)
		var still []string
		for i, ok := range res {
			if !ok {
				still = append(still, fmt.Sprintf("%s -> %s %s", sample[i].From.PodID, sample[i].To.PodID, sample[i].PP))
			}
		}
		if err == nil && len(still) == 0 {
			return
		}
		if time.Now().After(deadline) {
			t.Errorf("cleanup: policies deleted %s ago but still denied: %s (probe error: %v)", e.deadline, strings.Join(still, ", "), err)
			return
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// socketProbe connects from Pod to Pod by Pod IP through the echo servers.
// A connection answered by the wrong Pod is an error.
func (e *netpolEnv) socketProbe(ctx context.Context, from, to *netpol.Pod, pp netpol.PortProto) (bool, error) {
	r := e.c.Probe(ctx, from.Namespace, from.Name, to.IP.String(), int(pp.Port), pp.Protocol, netpolProbeTimeout)
	return answeredBy(r, to.Name, "")
}

// answeredBy reads a probe's result as the verdict tables do: connected
// (an error unless want answered; via names what was probed when it was
// not the Pod IP), blocked, or an error when the probe could not be made.
func answeredBy(r echo.Result, want, via string) (bool, error) {
	switch {
	case r.Outcome == echo.Failed:
		return false, r.Err
	case r.Outcome != echo.Connected:
		return false, nil
	case r.Reply != want:
		return true, fmt.Errorf("%sanswered by %q, want %q", via, r.Reply, want)
	}
	return true, nil
}

// traceTopology is what tracing needs of the datapath: each Pod's OVS
// port and MAC, and each Node's tunnel port (0 without one), gateway port
// and MAC.
type traceTopology struct {
	pods  map[netpol.PodID]tracePod
	nodes map[string]traceNode
}

type tracePod struct {
	node   sandbox.Node
	ofport int
	mac    string
}

type traceNode struct {
	node      sandbox.Node
	tunOFPort int
	gwOFPort  int
	gwMAC     string
}

var macRE = regexp.MustCompile(`"?seine\.io/mac"?="?([0-9a-fA-F:]{17})"?`)

// traceTopo looks the topology up once.
func (e *netpolEnv) traceTopo() (*traceTopology, error) {
	e.traceOnce.Do(func() {
		tt := &traceTopology{pods: map[netpol.PodID]tracePod{}, nodes: map[string]traceNode{}}
		get := func(n sandbox.Node, args ...string) (string, error) {
			out, err := tryOVS(n, "ovs-vsctl", args...)
			if err != nil {
				return "", fmt.Errorf("ovs-vsctl %v on %s: %w: %s", args, n.Name, err, out)
			}
			return strings.Trim(strings.TrimSpace(out), `"`), nil
		}
		for _, n := range e.c.Nodes() {
			tun, _ := get(n, "--if-exists", "get", "Interface", "seine-tun0", "ofport") // no tunnel: ""
			gwPort, err := get(n, "get", "Interface", "seine-gw0", "ofport")
			if err != nil {
				e.traceErr = err
				return
			}
			gw, err := get(n, "get", "Interface", "seine-gw0", "mac_in_use")
			if err != nil {
				e.traceErr = err
				return
			}
			tp, _ := strconv.Atoi(tun)
			gp, _ := strconv.Atoi(gwPort)
			tt.nodes[n.Name] = traceNode{node: n, tunOFPort: tp, gwOFPort: gp, gwMAC: gw}
		}
		for _, p := range e.base.Pods {
			n, err := e.c.Node(p.Node)
			if err != nil {
				e.traceErr = err
				return
			}
			name, err := get(n, "--bare", "--columns=name", "find", "Port",
				"external_ids:seine.io/pod-namespace="+p.Namespace, "external_ids:seine.io/pod-name="+p.Name)
			if err != nil || name == "" {
				e.traceErr = fmt.Errorf("no OVS port for Pod %s on %s (%v)", p.PodID, n.Name, err)
				return
			}
			ofp, err := get(n, "get", "Interface", name, "ofport")
			if err != nil {
				e.traceErr = err
				return
			}
			ids, err := get(n, "get", "Port", name, "external_ids")
			if err != nil {
				e.traceErr = err
				return
			}
			m := macRE.FindStringSubmatch(ids)
			if m == nil {
				e.traceErr = fmt.Errorf("port %s of %s has no seine.io/mac in %s", name, p.PodID, ids)
				return
			}
			op, _ := strconv.Atoi(ofp)
			tt.pods[p.PodID] = tracePod{node: n, ofport: op, mac: m[1]}
		}
		e.trace = tt
	})
	return e.trace, e.traceErr
}

// virtualMAC is the destination MAC of tunnelled packets
// (datapath/pipeline.VirtualMAC).
const virtualMAC = "0e:5e:1e:00:00:01"

// traceProbe decides a connection by tracing its first packet: through
// the source Node's pipeline from the source Pod's port (which, for a
// destination on the same Node, also runs the destination's ingress
// tables) and, for another Node, through the destination Node's pipeline
// from the tunnel port (with the tunnel metadata of OVS's tunnel port, or
// the inner destination MAC of a kernel VXLAN device), or from the
// gateway port when the source Node
// routed the packet through the host instead (noEncap, hybrid peers in
// the same subnet, networkPolicyOnly). Self pairs are allowed (loopback in
// the Pod).
func (e *netpolEnv) traceProbe(ctx context.Context, from, to *netpol.Pod, pp netpol.PortProto) (bool, error) {
	if from.PodID == to.PodID {
		return true, nil
	}
	tt, err := e.traceTopo()
	if err != nil {
		return false, err
	}
	src, dst := tt.pods[from.PodID], tt.pods[to.PodID]
	ok, out, err := netpol.TraceAllowed(ctx, src.node.OVSRunDir, "br-int", netpol.TracePacket{
		InPort: src.ofport, Protocol: pp.Protocol, DLSrc: src.mac, DLDst: tt.nodes[src.node.Name].gwMAC,
		NWSrc: from.IP.String(), NWDst: to.IP.String(), DstPort: int(pp.Port)})
	if err != nil {
		return false, fmt.Errorf("%w\n%s", err, out)
	}
	if !ok || src.node.Name == dst.node.Name {
		return ok, nil
	}
	dn := tt.nodes[dst.node.Name]
	second := netpol.TracePacket{
		InPort: dn.tunOFPort, TunSrc: src.node.IP, TunDst: dst.node.IP, Protocol: pp.Protocol,
		DLSrc: tt.nodes[src.node.Name].gwMAC, DLDst: virtualMAC, TTL: 63,
		NWSrc: from.IP.String(), NWDst: to.IP.String(), DstPort: int(pp.Port)}
	peerMAC := pipeline.PeerMAC(net.ParseIP(dst.node.IP)).String()
	switch {
	case strings.Contains(out, "->tun_dst"): // OVS's tunnel port
	case strings.Contains(out, peerMAC+"->eth_dst"):
		// A kernel VXLAN device: no tunnel metadata; the inner
		// destination MAC is the peer's own.
		second.TunSrc, second.TunDst, second.DLDst = "", "", peerMAC
	default:
		// Routed by the hosts: the destination's host hands it over
		// through its gateway.
		second.InPort, second.TunSrc, second.TunDst, second.DLSrc, second.DLDst, second.TTL =
			dn.gwOFPort, "", "", dn.gwMAC, dst.mac, 62
	}
	ok, out, err = netpol.TraceAllowed(ctx, dst.node.OVSRunDir, "br-int", second)
	if err != nil {
		return false, fmt.Errorf("%w\n%s", err, out)
	}
	return ok, nil
}

// prober picks socket probes, or traces for SCTP (no SCTP sockets in
// this kernel), and the matching concurrency.
func (e *netpolEnv) prober(proto corev1.Protocol) (netpol.ProbeFunc, int) {
	if proto == corev1.ProtocolSCTP {
		return e.traceProbe, netpolTraceParallel
	}
	if e.viaService {
		return e.serviceProbe, netpolConcurrency
	}
	return e.socketProbe, netpolConcurrency
}

// createServices gives every model Pod a ClusterIP Service of its own
// (selecting its "pod" label, TCP and UDP model ports, targetPort = port),
// as upstream's suite does, and returns a function deleting them.
func (e *netpolEnv) createServices(ctx context.Context) (func(), error) {
	cs := e.c.Client()
	e.svcIP = map[netpol.PodID]string{}
	var created []netpol.PodID
	undo := func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		for _, id := range created {
			_ = cs.CoreV1().Services(id.Namespace).Delete(ctx, "s-"+id.Name, metav1.DeleteOptions{})
		}
	}
	for _, ns := range netpol.Namespaces() {
		for _, name := range netpol.PodNames() {
			svc := &corev1.Service{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "s-" + name},
				Spec: corev1.ServiceSpec{Selector: map[string]string{netpol.LabelPod: name}}}
			for _, p := range netpol.ModelPorts() {
				if p.Protocol == corev1.ProtocolSCTP {
					continue
				}
				svc.Spec.Ports = append(svc.Spec.Ports, corev1.ServicePort{Name: strings.ToLower(fmt.Sprintf("p%d-%s", p.Port, p.Protocol)),
					Port: p.Port, Protocol: p.Protocol, TargetPort: intstr.FromInt32(p.Port)})
			}
			out, err := cs.CoreV1().Services(ns).Create(ctx, svc, metav1.CreateOptions{})
			if apierrors.IsAlreadyExists(err) {
				out, err = cs.CoreV1().Services(ns).Get(ctx, svc.Name, metav1.GetOptions{})
			}
			if err != nil {
				undo()
				return nil, fmt.Errorf("service %s/%s: %w", ns, svc.Name, err)
			}
			id := netpol.PodID{Namespace: ns, Name: name}
			created = append(created, id)
			e.svcIP[id] = out.Spec.ClusterIP
		}
	}
	return undo, nil
}

// serviceProbe connects through the destination Pod's ClusterIP. A Pod
// reaching itself that way is hairpin traffic, which no policy denies
// (pipeline.PolicyBaseFlows), just as the oracle expects of a Pod reaching
// its own IP.
func (e *netpolEnv) serviceProbe(ctx context.Context, from, to *netpol.Pod, pp netpol.PortProto) (bool, error) {
	ip, ok := e.svcIP[to.PodID]
	if !ok {
		return false, fmt.Errorf("no Service for %s/%s", to.Namespace, to.Name)
	}
	r := e.c.Probe(ctx, from.Namespace, from.Name, ip, int(pp.Port), pp.Protocol, netpolProbeTimeout)
	return answeredBy(r, to.Name, "ClusterIP "+ip+" ")
}

// noEnforcement reports whether observed tables show no denial at all
// while want has some: the datapath ignored the policies entirely.
func noEnforcement(want []netpol.Expectation, got []*netpol.Matrix) bool {
	if len(got) != len(want) {
		return false
	}
	wantDenials := false
	for i, w := range want {
		n := len(w.Want.Pods) * len(w.Want.Pods)
		if w.Want.Count() < n {
			wantDenials = true
		}
		if got[i].Count() < n {
			return false
		}
	}
	return wantDenials
}

// errNoEnforcement marks a scenario whose probes saw no policy effect.
var errNoEnforcement = errors.New("no policy enforcement observed")
