package agent

import (
	"context"
	"fmt"
	"net"
	"reflect"
	"regexp"
	"slices"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"go.uber.org/zap/zaptest"
	"go.uber.org/zap/zaptest/observer"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"

	"github.com/seine-net/seine/datapath/flowsync"
	of "github.com/seine-net/seine/datapath/openflow"
	"github.com/seine-net/seine/datapath/ovstest"
	"github.com/seine-net/seine/datapath/pipeline"
	"github.com/seine-net/seine/policy/apis/controlplane/v1alpha1"
	"github.com/seine-net/seine/policy/client/clientset/versioned"
	"github.com/seine-net/seine/policy/realization"
	"github.com/seine-net/seine/tests/apienv"
)

const nodeName = "node-a"

// startControlPlane starts a real API server in a fresh network namespace
// with Seine's CRDs applied, torn down at cleanup.
func startControlPlane(t *testing.T) versioned.Interface {
	t.Helper()
	cs, err := versioned.NewForConfig(apienv.Start(t, "../../deploy/crds"))
	if err != nil {
		t.Fatal(err)
	}
	return cs
}

type node struct {
	o      *ovstest.OVS
	syncer *flowsync.Syncer
	br     pipeline.Bridge
	pods   map[string]LocalPod

	mu    sync.Mutex
	calls []string // OnIsolation calls, "name ingress egress"
}

// setPod (re)installs a Pod's flows with the given isolation, what the CNI
// backend does for OnIsolation.
func (n *node) setPod(name string, ingress, egress bool) error {
	p := n.pods[name]
	return n.syncer.Set(context.Background(), "pod/"+name, pipeline.PodFlows(n.br, pipeline.Pod{OFPort: p.OFPort, IP: p.IP, MAC: mac(p.IP),
		IngressIsolated: ingress, EgressIsolated: egress}))
}

func (n *node) isolationCalls() []string {
	n.mu.Lock()
	defer n.mu.Unlock()
	return append([]string(nil), n.calls...)
}

func mac(ip net.IP) net.HardwareAddr {
	ip = ip.To4()
	return net.HardwareAddr{0x0a, 0x58, ip[0], ip[1], ip[2], ip[3]}
}

// startNode starts OVS with br-int, the base pipeline and Pods a, b, c.
func startNode(t *testing.T) *node {
	o := ovstest.Start(t)
	o.Run("ovs-vsctl", "add-br", "br-int", "--", "set", "bridge", "br-int", "datapath_type=netdev",
		"fail_mode=secure", "protocols=OpenFlow10,OpenFlow13,OpenFlow15")
	o.Run("ovs-vsctl", "add-port", "br-int", "gw0", "--", "set", "interface", "gw0", "type=internal", "ofport_request=2")
	// The client lives as long as its Dial context.
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	c, err := of.Dial(ctx, o.MgmtSocket("br-int"), zaptest.NewLogger(t).Named("of"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	_, pc, _ := net.ParseCIDR("10.244.1.0/24")
	n := &node{o: o, syncer: flowsync.New(c), pods: map[string]LocalPod{},
		br: pipeline.Bridge{Round: 1, GatewayPort: 2, GatewayMAC: mac(net.IPv4(10, 244, 1, 1)), GatewayIP: net.IPv4(10, 244, 1, 1).To4(),
			PodCIDR: pc, NodeIP: net.IPv4(198, 18, 0, 11).To4()}}
	if err := n.syncer.Set(ctx, "base", pipeline.BaseFlows(n.br)); err != nil {
		t.Fatal(err)
	}
	for i, name := range []string{"a", "b", "c"} {
		port := uint32(3 + i)
		ip := net.IPv4(10, 244, 1, byte(3+i)).To4()
		o.Run("ovs-vsctl", "add-port", "br-int", "p"+name, "--", "set", "interface", "p"+name, "type=internal",
			fmt.Sprintf("ofport_request=%d", port))
		n.pods[name] = LocalPod{Namespace: "default", Name: name, OFPort: port, IP: ip}
		if err := n.setPod(name, false, false); err != nil {
			t.Fatal(err)
		}
	}
	return n
}

// policyDump returns the policy flows (cookie category CategoryPolicy) as
// sorted lines without statistics.
func (n *node) policyDump(t *testing.T) []string {
	t.Helper()
	lines, err := n.tryPolicyDump()
	if err != nil {
		t.Fatal(err)
	}
	return lines
}

// tryPolicyDump is policyDump for goroutines other than the test's, where
// t.Fatal must not be called.
func (n *node) tryPolicyDump() ([]string, error) {
	cookie := fmt.Sprintf("cookie=%#x/%#x", uint64(pipeline.CategoryPolicy)<<pipeline.CookieCategoryShift, pipeline.CookieCategoryMask)
	out, err := n.o.TryRun("ovs-ofctl", "-O", "OpenFlow15", "--no-stats", "dump-flows", n.o.MgmtSocket("br-int"), cookie)
	if err != nil {
		return nil, fmt.Errorf("dumping the policy flows: %w", err)
	}
	var lines []string
	for _, l := range strings.Split(out, "\n") {
		l = strings.TrimSpace(l)
		if l == "" || strings.Contains(l, "reply") {
			continue
		}
		lines = append(lines, l)
	}
	sort.Strings(lines)
	return lines, nil
}

// verdict traces a packet from the gateway-side tunnel-less peer (in via
// gw0 with a foreign source) or from a Pod to a Pod.
func (n *node) verdict(t *testing.T, flow string) string {
	out := n.o.Run("ovs-appctl", "ofproto/trace", "br-int", flow, "--ct-next", "trk,new")
	if m := regexp.MustCompile(`output port is (\d+)|output:(\d+)`).FindStringSubmatch(out); m != nil {
		return "output:" + m[1] + m[2]
	}
	lines := strings.Split(strings.TrimSpace(out), "\n")
	if strings.HasSuffix(lines[len(lines)-1], "drop") {
		return "drop"
	}
	return lines[len(lines)-1]
}

func (n *node) podToPod(from, to string, dport int) string {
	f, d := n.pods[from], n.pods[to]
	return fmt.Sprintf("in_port=%d,dl_src=%s,dl_dst=%s,tcp,tcp_dst=%d,nw_ttl=64,nw_src=%s,nw_dst=%s",
		f.OFPort, mac(f.IP), mac(d.IP), dport, f.IP, d.IP)
}

func diff(a, b []string) (onlyA, onlyB []string) {
	ma, mb := map[string]bool{}, map[string]bool{}
	for _, l := range a {
		ma[l] = true
	}
	for _, l := range b {
		mb[l] = true
	}
	for _, l := range a {
		if !mb[l] {
			onlyA = append(onlyA, l)
		}
	}
	for _, l := range b {
		if !ma[l] {
			onlyB = append(onlyB, l)
		}
	}
	return
}

// runAgent runs ag until the test ends, and fails the test if Run fails.
func runAgent(t *testing.T, ctx context.Context, ag *Agent) {
	runCtx, stop := context.WithCancel(ctx)
	runDone := make(chan error, 1)
	go func() { runDone <- ag.Run(runCtx) }()
	t.Cleanup(func() {
		stop()
		if err := <-runDone; err != nil {
			t.Errorf("Run: %v", err)
		}
	})
}

func eventually(t *testing.T, what string, cond func() bool) {
	t.Helper()
	for deadline := time.Now().Add(20 * time.Second); !cond(); time.Sleep(100 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
	}
}

func span(extra map[string]string) map[string]string {
	l := map[string]string{v1alpha1.SpanLabel(nodeName): ""}
	for k, v := range extra {
		l[k] = v
	}
	return l
}

func member(name, ip string) v1alpha1.GroupMember {
	return v1alpha1.GroupMember{Namespace: "default", Name: name, IPs: []string{ip}}
}

func inPolicy(name, atg, ag string, port int32, labels map[string]string) *v1alpha1.NetworkPolicy {
	p := intstr.FromInt32(port)
	return &v1alpha1.NetworkPolicy{ObjectMeta: metav1.ObjectMeta{Name: name, Labels: labels},
		Spec: v1alpha1.NetworkPolicySpec{AppliedToGroup: atg, PolicyTypes: []string{"Ingress"},
			Rules: []v1alpha1.Rule{{Direction: v1alpha1.DirectionIn, AddressGroups: []string{ag},
				Ports: []v1alpha1.PolicyPort{{Protocol: "TCP", Port: &p}}}}}}
}

// TestAgentWithAPIServerAndOVS plays the controller by hand against a real
// API server and checks the flows the agent installs on a real OVS.
func TestAgentWithAPIServerAndOVS(t *testing.T) {
	cs := startControlPlane(t)
	n := startNode(t)
	api := cs.ControlplaneV1alpha1()
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	mustCreate := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	nk := v1alpha1.NodeKey(nodeName)
	// a is the target of "np-web", admitting b on TCP 80; c is the target
	// of "np-hidden", which lacks this Node's span label.
	_, err := api.AppliedToGroups().Create(ctx, &v1alpha1.AppliedToGroup{ObjectMeta: metav1.ObjectMeta{Name: "tgt-a-" + nk,
		Labels: span(map[string]string{v1alpha1.GroupLabel: "tgt-a"})},
		Spec: v1alpha1.AppliedToGroupSpec{NodeName: nodeName, Members: []v1alpha1.GroupMember{member("a", "10.244.1.3")}}}, metav1.CreateOptions{})
	mustCreate(err)
	_, err = api.AddressGroups().Create(ctx, &v1alpha1.AddressGroup{ObjectMeta: metav1.ObjectMeta{Name: "peers-b-0",
		Labels: span(map[string]string{v1alpha1.GroupLabel: "peers-b"})},
		Spec: v1alpha1.AddressGroupSpec{Members: []v1alpha1.GroupMember{member("b", "10.244.1.4")}}}, metav1.CreateOptions{})
	mustCreate(err)
	_, err = api.NetworkPolicies().Create(ctx, inPolicy("np-web", "tgt-a", "peers-b", 80, span(nil)), metav1.CreateOptions{})
	mustCreate(err)
	_, err = api.AppliedToGroups().Create(ctx, &v1alpha1.AppliedToGroup{ObjectMeta: metav1.ObjectMeta{Name: "tgt-c-" + nk,
		Labels: map[string]string{v1alpha1.GroupLabel: "tgt-c"}},
		Spec: v1alpha1.AppliedToGroupSpec{NodeName: nodeName, Members: []v1alpha1.GroupMember{member("c", "10.244.1.5")}}}, metav1.CreateOptions{})
	mustCreate(err)
	_, err = api.NetworkPolicies().Create(ctx, inPolicy("np-hidden", "tgt-c", "peers-b", 80, nil), metav1.CreateOptions{})
	mustCreate(err)

	// OnIsolation re-installs the Pod's flows like the CNI backend, and
	// checks that a Pod is isolated only once its allow flows are in the
	// switch (the np-web / np-b port clause).
	var orderErrs []string
	onIsolation := func(_ context.Context, namespace, name string, ingress, egress bool) error {
		if namespace != "default" {
			t.Errorf("OnIsolation for %s/%s", namespace, name)
		}
		if ingress {
			// The agent's goroutine: record failures, never t.Fatal.
			port := map[string]string{"a": "tp_dst=8", "b": "tp_dst=53"}[name]
			dump, err := n.tryPolicyDump()
			if err == nil && !strings.Contains(strings.Join(dump, "\n"), port) {
				err = fmt.Errorf("%s isolated before its allow flow (%s) was installed", name, port)
			}
			if err != nil {
				n.mu.Lock()
				orderErrs = append(orderErrs, err.Error())
				n.mu.Unlock()
			}
		}
		n.mu.Lock()
		n.calls = append(n.calls, fmt.Sprintf("%s %v %v", name, ingress, egress))
		n.mu.Unlock()
		return n.setPod(name, ingress, egress)
	}
	t.Cleanup(func() {
		n.mu.Lock()
		defer n.mu.Unlock()
		for _, e := range orderErrs {
			t.Error(e)
		}
	})
	ag := New(cs, Config{NodeName: nodeName, Bridge: n.br, Flows: n.syncer, RealizeTimeout: 3 * time.Second,
		OnIsolation: onIsolation}, zaptest.NewLogger(t).Named("agent"))
	for _, p := range n.pods {
		ag.PodAttached(p)
	}
	runAgent(t, ctx, ag)
	eventually(t, "agent synced", ag.Synced)
	eventually(t, "np-web enforced", func() bool { return n.verdict(t, n.podToPod("c", "a", 80)) == "drop" })
	checks := []struct {
		from, to string
		port     int
		want     string
	}{
		{"b", "a", 80, "output:3"},
		{"b", "a", 81, "drop"},
		{"c", "a", 80, "drop"},
		// np-hidden is not in this Node's span: c stays open.
		{"a", "c", 80, "output:5"},
		{"a", "c", 443, "output:5"},
	}
	for _, c := range checks {
		if got := n.verdict(t, n.podToPod(c.from, c.to, c.port)); got != c.want {
			t.Errorf("%s→%s:%d = %s, want %s", c.from, c.to, c.port, got, c.want)
		}
	}
	if got := n.isolationCalls(); !reflect.DeepEqual(got, []string{"a true false"}) {
		t.Errorf("OnIsolation calls %v, want only a isolated for ingress", got)
	}
	base := n.policyDump(t)
	t.Logf("policy flows with np-web:\n%s", strings.Join(base, "\n"))

	// An update changes exactly the differing flow: the port clause.
	np, err := api.NetworkPolicies().Get(ctx, "np-web", metav1.GetOptions{})
	mustCreate(err)
	p := intstr.FromInt32(8080)
	np.Spec.Rules[0].Ports[0].Port = &p
	_, err = api.NetworkPolicies().Update(ctx, np, metav1.UpdateOptions{})
	mustCreate(err)
	eventually(t, "port update", func() bool { return n.verdict(t, n.podToPod("b", "a", 8080)) == "output:3" })
	// What operators see: np-web installed for a, realized; np-hidden
	// (not in the span) absent; realizations timed.
	eventually(t, "np-web shown installed", func() bool {
		for _, p := range ag.View().Policies {
			if p.Object.Name == "np-web" {
				return p.Installed && reflect.DeepEqual(p.Targets, []string{"default/a"}) && p.Flows > 0 && len(p.ConjIDs) > 0
			}
		}
		return false
	})
	if err := ag.Realized(); err != nil {
		t.Errorf("Realized: %v", err)
	}
	if rp := ag.RealizedPolicies(); len(rp) != 1 || rp["np-web"] != np.Spec.Source.Generation {
		t.Errorf("RealizedPolicies = %v, want np-web only", rp)
	}
	reg := prometheus.NewRegistry()
	if err := ag.Register(reg); err != nil {
		t.Fatal(err)
	}
	mfs, err := reg.Gather()
	mustCreate(err)
	samples := uint64(0)
	for _, mf := range mfs {
		if mf.GetName() == "seine_policy_realization_duration_seconds" {
			samples = mf.GetMetric()[0].GetHistogram().GetSampleCount()
		}
	}
	if samples < 2 {
		t.Errorf("%d realizations timed, want at least 2 (np-web created, then updated)", samples)
	}
	updated := n.policyDump(t)
	gone, added := diff(base, updated)
	if len(gone) != 1 || !strings.Contains(gone[0], "tp_dst=80") || len(added) != 1 || !strings.Contains(added[0], "tp_dst=8080") {
		t.Errorf("update changed more than the port flow:\n- %s\n+ %s", strings.Join(gone, "\n- "), strings.Join(added, "\n+ "))
	}

	// A second policy on b, then its removal, leaves exactly the flows of
	// before.
	_, err = api.AppliedToGroups().Create(ctx, &v1alpha1.AppliedToGroup{ObjectMeta: metav1.ObjectMeta{Name: "tgt-b-" + nk,
		Labels: span(map[string]string{v1alpha1.GroupLabel: "tgt-b"})},
		Spec: v1alpha1.AppliedToGroupSpec{NodeName: nodeName, Members: []v1alpha1.GroupMember{member("b", "10.244.1.4")}}}, metav1.CreateOptions{})
	mustCreate(err)
	_, err = api.NetworkPolicies().Create(ctx, inPolicy("np-b", "tgt-b", "peers-b", 53, span(nil)), metav1.CreateOptions{})
	mustCreate(err)
	eventually(t, "np-b enforced", func() bool { return n.verdict(t, n.podToPod("a", "b", 80)) == "drop" })
	with := n.policyDump(t)
	if _, add := diff(updated, with); len(add) < 4 {
		t.Errorf("np-b added only %d flows: %v", len(add), add)
	}
	mustCreate(api.NetworkPolicies().Delete(ctx, "np-b", metav1.DeleteOptions{}))
	eventually(t, "np-b removed", func() bool { return n.verdict(t, n.podToPod("a", "b", 80)) == "output:4" })
	eventually(t, "flows back to before np-b", func() bool {
		g, a := diff(updated, n.policyDump(t))
		return len(g) == 0 && len(a) == 0
	})
	if got := n.isolationCalls(); !reflect.DeepEqual(got, []string{"a true false", "b true false", "b false false"}) {
		t.Errorf("OnIsolation calls %v, want b isolated by np-b then released", got)
	}

	// WaitRealized: a's digest as the controller would compute it.
	np, err = api.NetworkPolicies().Get(ctx, "np-web", metav1.GetOptions{})
	mustCreate(err)
	good := realization.Digest([]realization.Policy{{Name: "np-web", SpecHash: realization.SpecHash(np.Spec),
		AddressGroupSlices: map[string]int{"peers-b": 1}}})
	if err := ag.WaitRealized(ctx, "default", "a", "uid-a"); err == nil || !strings.Contains(err.Error(), "has not recorded") {
		t.Errorf("WaitRealized without PodRealization: %v", err)
	}
	// The Node's PodRealization in two slices: the agent looks in both.
	_, err = api.PodRealizations().Create(ctx, &v1alpha1.PodRealization{ObjectMeta: metav1.ObjectMeta{Name: nk, Labels: span(nil)},
		Spec: v1alpha1.PodRealizationSpec{NodeName: nodeName, Slices: 2, Pods: map[string]string{
			realization.PodKey("default", "a", "uid-a"): good,
			realization.PodKey("default", "b", "uid-b"): good, // b has no policy: mismatch
		}}}, metav1.CreateOptions{})
	mustCreate(err)
	_, err = api.PodRealizations().Create(ctx, &v1alpha1.PodRealization{ObjectMeta: metav1.ObjectMeta{Name: v1alpha1.PodRealizationName(nk, 1), Labels: span(nil)},
		Spec: v1alpha1.PodRealizationSpec{NodeName: nodeName, Slice: 1, Slices: 2, Pods: map[string]string{
			realization.PodKey("default", "c", "uid-c"): realization.Digest(nil),
		}}}, metav1.CreateOptions{})
	mustCreate(err)
	if err := ag.WaitRealized(ctx, "default", "a", "uid-a"); err != nil {
		t.Errorf("WaitRealized(a): %v", err)
	}
	if err := ag.WaitRealized(ctx, "default", "c", "uid-c"); err != nil {
		t.Errorf("WaitRealized(c) with the empty digest: %v", err)
	}
	t0 := time.Now()
	err = ag.WaitRealized(ctx, "default", "b", "uid-b")
	if err == nil || !strings.Contains(err.Error(), "differs from the controller's") {
		t.Errorf("WaitRealized(b) = %v, want a digest mismatch timeout", err)
	}
	if d := time.Since(t0); d < 2*time.Second {
		t.Errorf("WaitRealized(b) returned after %v, before RealizeTimeout (3s)", d)
	}
	// A Pod detached drops out of the policy's flows, and its isolation is
	// forgotten (no call: its flows go with it).
	ag.PodDetached("default", "a")
	eventually(t, "a's flows removed", func() bool { return len(n.policyDump(t)) == len(pipeline.PolicyBaseFlows(n.br)) })
	if got := n.isolationCalls(); len(got) != 3 {
		t.Errorf("OnIsolation calls after detaching a: %v", got)
	}
	// Attached again (a new sandbox: fresh, non-isolated Pod flows), a is
	// isolated again, and WaitRealized returns only once it is: the very
	// next packet is already subject to np-web.
	if err := n.setPod("a", false, false); err != nil {
		t.Fatal(err)
	}
	if got := n.verdict(t, n.podToPod("c", "a", 80)); got != "output:3" {
		t.Fatalf("c→a with a detached and fresh flows = %s, want output:3", got)
	}
	ag.PodAttached(n.pods["a"])
	if err := ag.WaitRealized(ctx, "default", "a", "uid-a"); err != nil {
		t.Fatalf("WaitRealized(a) after attaching again: %v", err)
	}
	if got := n.isolationCalls(); len(got) != 4 || got[3] != "a true false" {
		t.Errorf("OnIsolation calls after attaching a again: %v", got)
	}
	for _, c := range []struct {
		from string
		port int
		want string
	}{{"c", 80, "drop"}, {"b", 8080, "output:3"}, {"b", 80, "drop"}} {
		if got := n.verdict(t, n.podToPod(c.from, "a", c.port)); got != c.want {
			t.Errorf("right after WaitRealized: %s→a:%d = %s, want %s", c.from, c.port, got, c.want)
		}
	}
}

// TestFlowEconomyOnNode: a policy selecting 100 local Pods, admitting a
// 100-Pod peer group on 3 ports, installs fewer than 250 flows on the
// Node's switch (counted in OVS, not in the translation).
func TestFlowEconomyOnNode(t *testing.T) {
	cs := startControlPlane(t)
	n := startNode(t)
	api := cs.ControlplaneV1alpha1()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	ag := New(cs, Config{NodeName: nodeName, Bridge: n.br, Flows: n.syncer, RealizeTimeout: 3 * time.Second,
		OnIsolation: func(context.Context, string, string, bool, bool) error { return nil }}, zaptest.NewLogger(t).Named("agent"))
	var targets, peers []v1alpha1.GroupMember
	for i := 0; i < 100; i++ {
		name, ip := fmt.Sprintf("t%d", i), fmt.Sprintf("10.244.1.%d", 20+i)
		ag.PodAttached(LocalPod{Namespace: "default", Name: name, OFPort: uint32(100 + i), IP: net.ParseIP(ip)})
		targets = append(targets, member(name, ip))
		peers = append(peers, member(fmt.Sprintf("p%d", i), fmt.Sprintf("10.244.%d.%d", 2+i/200, i%200+2)))
	}
	runAgent(t, ctx, ag)
	eventually(t, "agent synced", ag.Synced)
	before := len(n.policyDump(t))
	nk := v1alpha1.NodeKey(nodeName)
	if _, err := api.AppliedToGroups().Create(ctx, &v1alpha1.AppliedToGroup{ObjectMeta: metav1.ObjectMeta{Name: "eco-" + nk,
		Labels: span(map[string]string{v1alpha1.GroupLabel: "eco"})},
		Spec: v1alpha1.AppliedToGroupSpec{NodeName: nodeName, Members: targets}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := api.AddressGroups().Create(ctx, &v1alpha1.AddressGroup{ObjectMeta: metav1.ObjectMeta{Name: "eco-peers-0",
		Labels: span(map[string]string{v1alpha1.GroupLabel: "eco-peers"})},
		Spec: v1alpha1.AddressGroupSpec{Members: peers}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	np := inPolicy("np-eco", "eco", "eco-peers", 80, span(nil))
	p443, p53 := intstr.FromInt32(443), intstr.FromInt32(53)
	np.Spec.Rules[0].Ports = append(np.Spec.Rules[0].Ports, v1alpha1.PolicyPort{Protocol: "TCP", Port: &p443},
		v1alpha1.PolicyPort{Protocol: "UDP", Port: &p53})
	if _, err := api.NetworkPolicies().Create(ctx, np, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	// Count once the agent reports the policy installed: every batch of
	// its flows is on the switch then.
	eventually(t, "np-eco shown installed", func() bool {
		for _, p := range ag.View().Policies {
			if p.Object.Name == "np-eco" {
				return p.Installed
			}
		}
		return false
	})
	got := len(n.policyDump(t)) - before
	if got < 200 {
		t.Errorf("np-eco installed with %d flows on the switch, want at least one per target and peer (200)", got)
	}
	t.Logf("100 targets × 100 peers × 3 ports: %d flows on the switch", got)
	if got >= 250 {
		t.Errorf("the policy installed %d flows, want fewer than 250", got)
	}
}

// recordedDigest finds a Pod in any of its Node's PodRealizations, and
// refuses two that disagree (a Pod moving between slices).
func TestRecordedDigest(t *testing.T) {
	pr := func(name string, pods map[string]string) any {
		return &v1alpha1.PodRealization{ObjectMeta: metav1.ObjectMeta{Name: name}, Spec: v1alpha1.PodRealizationSpec{Pods: pods}}
	}
	for _, c := range []struct {
		name    string
		prs     []any
		want    string
		wantErr string
	}{
		{"none stored", nil, "", "has not recorded pod ns/p/u in a PodRealization of this Node (0 stored)"},
		{"in neither", []any{pr("n", map[string]string{"ns/q/u": "d1"}), pr("n-1", nil)}, "", "(2 stored)"},
		{"in slice 1", []any{pr("n", map[string]string{"ns/q/u": "d1"}), pr("n-1", map[string]string{"ns/p/u": "d2"})}, "d2", ""},
		{"in two, agreeing", []any{pr("n", map[string]string{"ns/p/u": "d2"}), pr("n-1", map[string]string{"ns/p/u": "d2"})}, "d2", ""},
		{"in two, disagreeing", []any{pr("n", map[string]string{"ns/p/u": "d1"}), pr("n-1", map[string]string{"ns/p/u": "d2"})}, "",
			"PodRealizations n and n-1 record different digests for pod ns/p/u"},
	} {
		got, err := recordedDigest(c.prs, "ns/p/u")
		if got != c.want || (err == nil) != (c.wantErr == "") || (err != nil && !strings.Contains(err.Error(), c.wantErr)) {
			t.Errorf("%s: recordedDigest = %q, %v; want %q, %q", c.name, got, err, c.want, c.wantErr)
		}
	}
}

// A Pod attached as restored carries flows whose isolation nothing has
// checked (a restart, or an earlier attachment of the Pod current again):
// the agent compares it with the policies even when no policy is dirty,
// here with no policy at all, so the stale isolation of a Pod a deleted
// policy isolated goes.
// recordIsolation is an OnIsolation that records the call and applies it
// as the CNI backend does.
func (n *node) recordIsolation(_ context.Context, _, name string, ingress, egress bool) error {
	n.mu.Lock()
	n.calls = append(n.calls, fmt.Sprintf("%s %v %v", name, ingress, egress))
	n.mu.Unlock()
	return n.setPod(name, ingress, egress)
}

func TestRestoredIsolationCheckedWithoutPolicies(t *testing.T) {
	cs := startControlPlane(t)
	n := startNode(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	if err := n.setPod("a", true, false); err != nil { // as a deleted policy left it
		t.Fatal(err)
	}
	onIsolation := n.recordIsolation
	ag := New(cs, Config{NodeName: nodeName, Bridge: n.br, Flows: n.syncer, RealizeTimeout: 3 * time.Second,
		OnIsolation: onIsolation}, zaptest.NewLogger(t).Named("agent"))
	a := n.pods["a"]
	a.Restored = true
	ag.PodAttached(a)
	runAgent(t, ctx, ag)
	eventually(t, "agent synced", ag.Synced)
	eventually(t, "a's stale isolation lifted", func() bool { return slices.Contains(n.isolationCalls(), "a false false") })
	if got := n.verdict(t, n.podToPod("b", "a", 80)); got != "output:3" {
		t.Errorf("b→a:80 = %s after the check, want output:3", got)
	}
	// The same once running: b comes back isolated for egress.
	if err := n.setPod("b", false, true); err != nil {
		t.Fatal(err)
	}
	b := n.pods["b"]
	b.Restored = true
	ag.PodAttached(b)
	eventually(t, "b's stale isolation lifted", func() bool { return slices.Contains(n.isolationCalls(), "b false false") })
}

// A policy whose target group changes (a podSelector edit) keeps what is
// installed until this Node's part of the new group arrives: the
// controller writes the two objects concurrently, and reading the missing
// group as empty would lift the Pods' isolation in between.
func TestPolicyWaitsForItsAppliedToGroup(t *testing.T) {
	cs := startControlPlane(t)
	n := startNode(t)
	api := cs.ControlplaneV1alpha1()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	nk := v1alpha1.NodeKey(nodeName)
	atg := func(group string) *v1alpha1.AppliedToGroup {
		return &v1alpha1.AppliedToGroup{ObjectMeta: metav1.ObjectMeta{Name: group + "-" + nk,
			Labels: span(map[string]string{v1alpha1.GroupLabel: group})},
			Spec: v1alpha1.AppliedToGroupSpec{NodeName: nodeName, Members: []v1alpha1.GroupMember{member("a", "10.244.1.3")}}}
	}
	must := func(_ any, err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	must(api.AppliedToGroups().Create(ctx, atg("tgt-a"), metav1.CreateOptions{}))
	must(api.AddressGroups().Create(ctx, &v1alpha1.AddressGroup{ObjectMeta: metav1.ObjectMeta{Name: "peers-b-0",
		Labels: span(map[string]string{v1alpha1.GroupLabel: "peers-b"})},
		Spec: v1alpha1.AddressGroupSpec{Members: []v1alpha1.GroupMember{member("b", "10.244.1.4")}}}, metav1.CreateOptions{}))
	must(api.NetworkPolicies().Create(ctx, inPolicy("np-web", "tgt-a", "peers-b", 80, span(nil)), metav1.CreateOptions{}))
	core, logs := observer.New(zapcore.DebugLevel)
	onIsolation := n.recordIsolation
	ag := New(cs, Config{NodeName: nodeName, Bridge: n.br, Flows: n.syncer, RealizeTimeout: 3 * time.Second,
		OnIsolation: onIsolation}, zap.New(core))
	for _, p := range n.pods {
		ag.PodAttached(p)
	}
	runAgent(t, ctx, ag)
	eventually(t, "a isolated", func() bool { return slices.Contains(n.isolationCalls(), "a true false") })
	np, err := api.NetworkPolicies().Get(ctx, "np-web", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	np.Spec.AppliedToGroup = "tgt-a2"
	must(api.NetworkPolicies().Update(ctx, np, metav1.UpdateOptions{}))
	// The agent has seen the update once it says it waits, or once it
	// lifted a's isolation (what it must not do).
	eventually(t, "the agent seeing the policy without its group", func() bool {
		return logs.FilterMessage("policy waits for its AppliedToGroup").Len() > 0 ||
			slices.Contains(n.isolationCalls(), "a false false")
	})
	if got := n.isolationCalls(); !reflect.DeepEqual(got, []string{"a true false"}) {
		t.Errorf("isolation calls %v while the new group is on its way, want a to stay isolated", got)
	}
	if got := n.verdict(t, n.podToPod("c", "a", 80)); got != "drop" {
		t.Errorf("c→a:80 = %s while the new group is on its way, want drop", got)
	}
	must(api.AppliedToGroups().Create(ctx, atg("tgt-a2"), metav1.CreateOptions{}))
	eventually(t, "np-web on its new group", func() bool {
		for _, p := range ag.View().Policies {
			if p.Object.Name == "np-web" && p.Installed && slices.Contains(p.Targets, "default/a") {
				return true
			}
		}
		return false
	})
	if got := n.verdict(t, n.podToPod("b", "a", 80)); got != "output:3" {
		t.Errorf("b→a:80 = %s on the new group, want output:3", got)
	}
	if got := n.isolationCalls(); !reflect.DeepEqual(got, []string{"a true false"}) {
		t.Errorf("isolation calls %v, want a isolated throughout", got)
	}
}

// At a start where a policy's AppliedToGroup has not arrived (the
// controller still writing it), the agent does not report Synced, nor
// Realized, until it has: the daemon removes the previous run's flows on
// Synced, and with them the allows of the policy that waits.
func TestSyncedWaitsForAppliedToGroups(t *testing.T) {
	cs := startControlPlane(t)
	n := startNode(t)
	api := cs.ControlplaneV1alpha1()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	must := func(_ any, err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	must(api.AddressGroups().Create(ctx, &v1alpha1.AddressGroup{ObjectMeta: metav1.ObjectMeta{Name: "peers-b-0",
		Labels: span(map[string]string{v1alpha1.GroupLabel: "peers-b"})},
		Spec: v1alpha1.AddressGroupSpec{Members: []v1alpha1.GroupMember{member("b", "10.244.1.4")}}}, metav1.CreateOptions{}))
	must(api.NetworkPolicies().Create(ctx, inPolicy("np-late", "tgt-late", "peers-b", 80, span(nil)), metav1.CreateOptions{}))
	core, logs := observer.New(zapcore.DebugLevel)
	ag := New(cs, Config{NodeName: nodeName, Bridge: n.br, Flows: n.syncer, RealizeTimeout: 3 * time.Second,
		OnIsolation: n.recordIsolation}, zap.New(core))
	for _, p := range n.pods {
		ag.PodAttached(p)
	}
	runAgent(t, ctx, ag)
	eventually(t, "the agent's first reconcile", func() bool {
		return logs.FilterMessage("policy waits for its AppliedToGroup").Len() > 0
	})
	// The first reconcile is done: whatever it would set is set within
	// this second.
	for end := time.Now().Add(time.Second); time.Now().Before(end); time.Sleep(50 * time.Millisecond) {
		if ag.Synced() {
			t.Fatal("Synced while np-late waits for its AppliedToGroup")
		}
	}
	if err := ag.Realized(); err == nil {
		t.Error("Realized while np-late waits for its AppliedToGroup")
	}
	nk := v1alpha1.NodeKey(nodeName)
	must(api.AppliedToGroups().Create(ctx, &v1alpha1.AppliedToGroup{ObjectMeta: metav1.ObjectMeta{Name: "tgt-late-" + nk,
		Labels: span(map[string]string{v1alpha1.GroupLabel: "tgt-late"})},
		Spec: v1alpha1.AppliedToGroupSpec{NodeName: nodeName, Members: []v1alpha1.GroupMember{member("a", "10.244.1.3")}}},
		metav1.CreateOptions{}))
	eventually(t, "agent synced", ag.Synced)
	if err := ag.Realized(); err != nil {
		t.Errorf("Realized once the group is in: %v", err)
	}
	if got := n.verdict(t, n.podToPod("b", "a", 80)); got != "output:3" {
		t.Errorf("b→a:80 = %s once synced, want output:3", got)
	}

	// Once synced, a policy moved to a group that does not come is
	// reported by Realized only after RealizeTimeout (3 s here): the
	// controller's writes may arrive apart in normal operation.
	np, err := api.NetworkPolicies().Get(ctx, "np-late", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	np.Spec.AppliedToGroup = "tgt-never"
	must(api.NetworkPolicies().Update(ctx, np, metav1.UpdateOptions{}))
	waits := logs.FilterMessage("policy waits for its AppliedToGroup").Len()
	eventually(t, "the agent seeing the new group missing", func() bool {
		return logs.FilterMessage("policy waits for its AppliedToGroup").Len() > waits
	})
	seen := time.Now()
	if err := ag.Realized(); err != nil && time.Since(seen) < 2*time.Second {
		t.Errorf("Realized right after the policy started waiting: %v", err)
	}
	eventually(t, "Realized reporting np-late", func() bool {
		err := ag.Realized()
		return err != nil && strings.Contains(err.Error(), "np-late") && strings.Contains(err.Error(), "tgt-never")
	})
	if !ag.Synced() {
		t.Error("Synced went back to false")
	}
}
