package e2e

import (
	"archive/tar"
	"bufio"
	"bytes"
	"compress/gzip"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"maps"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
	networkingv1 "k8s.io/api/networking/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/util/retry"

	"github.com/seine-net/seine/datapath/pipeline"
	opsv1alpha1 "github.com/seine-net/seine/node/apis/ops/v1alpha1"
	opsclient "github.com/seine-net/seine/node/client/clientset/versioned"
	"github.com/seine-net/seine/node/health"
	"github.com/seine-net/seine/node/info"
	"github.com/seine-net/seine/node/inspect"
	"github.com/seine-net/seine/node/localapi"
	cpv1alpha1 "github.com/seine-net/seine/policy/apis/controlplane/v1alpha1"
	cpclient "github.com/seine-net/seine/policy/client/clientset/versioned"
	"github.com/seine-net/seine/tests/sandbox"
)

// seinectl runs bin/seinectl on a Node, as an operator would there: in
// the Node's network namespace, with the Node's API socket and the
// sandbox's in-cluster kubeconfig.
func seinectl(ctx context.Context, c *sandbox.Cluster, n sandbox.Node, args ...string) (string, error) {
	argv := append([]string{filepath.Join(repoRoot(), "bin", "seinectl"), "--socket", n.APISocket,
		"--kubeconfig", c.InternalKubeconfig()}, args...)
	out, err := c.NodeExec(ctx, n.Name, argv...)
	return string(out), err
}

func mustCtl(t *testing.T, c *sandbox.Cluster, n sandbox.Node, args ...string) string {
	t.Helper()
	out, err := seinectl(testCtx(t, time.Minute), c, n, args...)
	if err != nil {
		t.Fatalf("seinectl %s on %s: %v\n%s", strings.Join(args, " "), n.Name, err, out)
	}
	return out
}

// ctlJSON runs seinectl with -o json and decodes its output.
func ctlJSON(t *testing.T, c *sandbox.Cluster, n sandbox.Node, out any, args ...string) {
	t.Helper()
	s := mustCtl(t, c, n, append(args, "-o", "json")...)
	if err := json.Unmarshal([]byte(s), out); err != nil {
		t.Fatalf("seinectl %s: %v\n%s", strings.Join(args, " "), err, s)
	}
}

func opsClients(t *testing.T, c *sandbox.Cluster) (opsclient.Interface, cpclient.Interface) {
	t.Helper()
	rc, err := c.ControlPlane().RESTConfig()
	if err != nil {
		t.Fatal(err)
	}
	return opsclient.NewForConfigOrDie(rc), cpclient.NewForConfigOrDie(rc)
}

// ovsFlowsPerTable counts the entries of each table of a Node's br-int.
func ovsFlowsPerTable(t *testing.T, n sandbox.Node) map[string]int {
	out := ovs(t, n, "ovs-ofctl", "--no-stats", "dump-flows", brInt(n))
	re := regexp.MustCompile(`table=(\d+)`)
	got := map[string]int{}
	for _, l := range strings.Split(out, "\n") {
		if m := re.FindStringSubmatch(l); m != nil {
			id, _ := strconv.Atoi(m[1])
			got[pipeline.Table(id).String()]++
		} else if strings.Contains(l, "actions=") { // table 0 prints no table=
			got[pipeline.Classifier.String()]++
		}
	}
	return got
}

// Every seinectl command against the running sandbox.
func TestSeinectl(t *testing.T) {
	c := shared
	nodes := c.Nodes()
	n0, n1 := nodes[0], nodes[1]
	mk := policyNamespace(t, c, "ops-ctl")
	server := mk("server", map[string]string{"app": "server"}, 0)
	client := mk("client", map[string]string{"role": "client"}, 0)
	remote := mk("remote", map[string]string{"role": "client"}, 1)
	stranger := mk("stranger", map[string]string{"role": "other"}, 1)
	policy := "ops-ctl/servers"

	t.Run("version", func(t *testing.T) {
		out := mustCtl(t, c, n0, "version")
		want := regexp.MustCompile(`(?m)^seinectl: \S+ \(go.*\ndaemon:   \S+ \(go.* on Node ` + n0.Name + `\novs:      3\.\d+\.\d+ \(netdev datapath\)$`)
		if !want.MatchString(out) {
			t.Fatalf("seinectl version:\n%s", out)
		}
		// `seine ctl` is the same program.
		same, err := c.NodeExec(testCtx(t, time.Minute), n0.Name, seineBin(), "ctl", "--socket", n0.APISocket, "version")
		if err != nil || string(same) != out {
			t.Fatalf("seine ctl version: %v\n%s\nwant\n%s", err, same, out)
		}
	})

	t.Run("get podinterface", func(t *testing.T) {
		var pis []localapi.PodInterface
		ctlJSON(t, c, n0, &pis, "get", "podinterface", "-n", "ops-ctl")
		got := map[string]localapi.PodInterface{}
		for _, p := range pis {
			got[p.Name] = p
		}
		for _, p := range []podRef{server, client} {
			pi, ok := got[p.name]
			if !ok || pi.IP != p.ip || pi.OFPort == 0 || pi.HostVeth == "" {
				t.Fatalf("podinterface of %s: %+v (all: %+v)", p.name, pi, pis)
			}
			ofport := strings.TrimSpace(ovs(t, n0, "ovs-vsctl", "get", "Interface", pi.HostVeth, "ofport"))
			if ofport != fmt.Sprint(pi.OFPort) {
				t.Errorf("%s: ofport %d, OVS says %s", p.name, pi.OFPort, ofport)
			}
			mac := ovs(t, n0, "ovs-vsctl", "get", "Port", pi.HostVeth, "external_ids:\"seine.io/mac\"")
			if strings.Trim(strings.TrimSpace(mac), `"`) != pi.MAC {
				t.Errorf("%s: MAC %s, OVS says %s", p.name, pi.MAC, mac)
			}
		}
		if _, ok := got[remote.name]; ok {
			t.Errorf("%s runs on %s but is listed on %s", remote.name, remote.node, n0.Name)
		}
		table := mustCtl(t, c, n0, "get", "podinterface", "ops-ctl/server", "-o", "wide")
		if !strings.Contains(table, "CONTAINER-ID") || !strings.Contains(table, server.ip) {
			t.Errorf("wide table:\n%s", table)
		}
	})

	t.Run("get networkpolicy, groups and realization", func(t *testing.T) {
		_, cp := opsClients(t, c)
		eventually(t, 30*time.Second, "the policy realized on its Node", func() error {
			var nps []cpv1alpha1.NetworkPolicy
			ctlJSON(t, c, n0, &nps, "get", "networkpolicy", policy)
			if len(nps) != 1 {
				return fmt.Errorf("%d computed policies for %s", len(nps), policy)
			}
			table := mustCtl(t, c, n0, "get", "networkpolicy", "-n", "ops-ctl")
			if !regexp.MustCompile(`np-\S+\s+ops-ctl/servers\s+1\s+1\s+1/1\s+1`).MatchString(table) {
				return fmt.Errorf("table:\n%s", table)
			}
			np, err := c.Client().NetworkingV1().NetworkPolicies("ops-ctl").Get(testCtx(t, 10*time.Second), "servers", metav1.GetOptions{})
			if err != nil {
				return err
			}
			if np.Annotations[info.AnnotationRealizedNodes] != "1/1" || np.Annotations[info.AnnotationRealizedGeneration] != "1" {
				return fmt.Errorf("annotations %v", np.Annotations)
			}
			return nil
		})
		var local []localapi.AgentPolicy
		ctlJSON(t, c, n0, &local, "get", "networkpolicy", "--agent", policy)
		if len(local) != 1 || !local[0].Installed || !slices.Contains(local[0].Targets, "ops-ctl/server") || local[0].Flows == 0 {
			t.Fatalf("the agent's copy of %s: %+v", policy, local)
		}
		atg := local[0].Policy.Spec.AppliedToGroup
		for _, args := range [][]string{{"get", "appliedtogroup", atg}, {"get", "appliedtogroup", atg, "--agent"}} {
			out := mustCtl(t, c, n0, append(args, "-o", "wide")...)
			if !strings.Contains(out, n0.Name) || !strings.Contains(out, "ops-ctl/server("+server.ip+")") {
				t.Errorf("seinectl %s:\n%s", strings.Join(args, " "), out)
			}
		}
		peers := local[0].Policy.Spec.Rules[0].AddressGroups[0]
		for _, args := range [][]string{{"get", "addressgroup", peers}, {"get", "addressgroup", peers, "--agent"}} {
			out := mustCtl(t, c, n0, append(args, "-o", "wide")...)
			for _, p := range []podRef{client, remote} {
				if !strings.Contains(out, "ops-ctl/"+p.name+"("+p.ip+")") {
					t.Errorf("seinectl %s lacks %s:\n%s", strings.Join(args, " "), p.name, out)
				}
			}
		}
		// The cluster view equals what the API holds.
		stored, err := cp.ControlplaneV1alpha1().NetworkPolicies().Get(testCtx(t, 10*time.Second), local[0].Policy.Name, metav1.GetOptions{})
		if err != nil || stored.Spec.AppliedToGroup != atg {
			t.Errorf("stored %s: %v %+v", local[0].Policy.Name, err, stored)
		}
	})

	t.Run("get ovsflows", func(t *testing.T) {
		var flows []localapi.Flow
		ctlJSON(t, c, n0, &flows, "get", "ovsflows", "-p", "ops-ctl/server")
		var pi []localapi.PodInterface
		ctlJSON(t, c, n0, &pi, "get", "podinterface", "ops-ctl/server")
		own := 0
		sawL3 := false
		for _, f := range flows {
			if f.State != localapi.FlowInstalled {
				t.Errorf("flow %+v is %s", f, f.State)
			}
			if f.Owner == "pod ops-ctl/server" {
				own++
			}
			if f.Table == "L3Forwarding" && strings.Contains(f.Match, "nw_dst="+server.ip+"/32") {
				sawL3 = true
			}
			port := fmt.Sprintf("in_port=%d", pi[0].OFPort)
			reg := fmt.Sprintf("reg1=%#x", pi[0].OFPort)
			if !strings.Contains(f.Match, server.ip) && !strings.Contains(f.Match, port) && !strings.Contains(f.Match, reg) &&
				!strings.Contains(f.Match, pi[0].MAC) && f.Owner != "pod ops-ctl/server" {
				t.Errorf("flow %+v does not concern the Pod", f)
			}
		}
		if own != len(pipeline.PodFlows(pipeline.Bridge{}, pipeline.Pod{OFPort: 1, IP: net.IPv4(1, 1, 1, 1)})) || !sawL3 {
			t.Errorf("%d own flows (L3Forwarding seen %v) in:\n%+v", own, sawL3, flows)
		}
		var ingress []localapi.Flow
		ctlJSON(t, c, n0, &ingress, "get", "ovsflows", "--table", "IngressRule")
		if len(ingress) == 0 {
			t.Error("--table IngressRule returned no flow; the policy above needs some")
		}
		for _, f := range ingress {
			if f.Table != "IngressRule" || f.TableID != uint8(pipeline.IngressRule) {
				t.Errorf("--table IngressRule returned %+v", f)
			}
		}
		var byPolicy []localapi.Flow
		ctlJSON(t, c, n0, &byPolicy, "get", "ovsflows", "--networkpolicy", policy)
		conj := false
		for _, f := range byPolicy {
			conj = conj || strings.Contains(f.Actions, "conjunction(") || strings.Contains(f.Match, "conj_id=")
			if f.Table != "IngressRule" {
				t.Errorf("flow of %s outside IngressRule: %+v", policy, f)
			}
		}
		if len(byPolicy) == 0 || !conj {
			t.Errorf("flows of %s: %+v", policy, byPolicy)
		}
		table := mustCtl(t, c, n0, "get", "ovsflows", "-p", "ops-ctl/server", "-o", "wide")
		if !strings.Contains(table, "OWNER") || !strings.Contains(table, "pod ops-ctl/server") || !strings.Contains(table, "Classifier") {
			t.Errorf("table:\n%s", table)
		}
		if out, err := seinectl(testCtx(t, time.Minute), c, n0, "get", "ovsflows", "--table", "Nowhere"); err == nil || !strings.Contains(out, "IngressDefault") {
			t.Errorf("an unknown table: %v\n%s", err, out)
		}
	})

	t.Run("get service and its flows", func(t *testing.T) {
		// The API server's own Service, default/kubernetes, is on every
		// Node's proxy.
		svc, err := c.Client().CoreV1().Services("default").Get(testCtx(t, 10*time.Second), "kubernetes", metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		var fs []localapi.ServiceFrontend
		ctlJSON(t, c, n0, &fs, "get", "service", "default/kubernetes")
		want := net.JoinHostPort(svc.Spec.ClusterIP, "443")
		if len(fs) != 1 || fs[0].Kind != "internal" || fs[0].Port != "https/TCP" || !slices.Contains(fs[0].Addresses, want) ||
			fs[0].Action != "balance" || len(fs[0].Endpoints) == 0 || fs[0].ID == 0 {
			t.Fatalf("frontends of default/kubernetes: %+v, want one internal frontend on %s balancing to the API server", fs, want)
		}
		var flows []localapi.Flow
		ctlJSON(t, c, n0, &flows, "get", "ovsflows", "--service", "default/kubernetes")
		if len(flows) == 0 {
			t.Fatal("no flows for default/kubernetes")
		}
		for _, f := range flows {
			if !strings.Contains(f.Owner, "service default/kubernetes https/TCP internal") {
				t.Errorf("flow of another owner: %+v", f)
			}
		}
		table := mustCtl(t, c, n0, "get", "svc", "-n", "default", "-o", "wide")
		if !strings.Contains(table, "ENDPOINTS") || !strings.Contains(table, "SOURCE-RANGES") || !strings.Contains(table, want) {
			t.Errorf("wide table:\n%s", table)
		}
		if out, err := seinectl(testCtx(t, time.Minute), c, n0, "get", "service", "default/nope"); err == nil || !strings.Contains(out, `no Service "default/nope"`) {
			t.Errorf("an unknown Service: %v\n%s", err, out)
		}
		if out, err := seinectl(testCtx(t, time.Minute), c, n0, "get", "ovsflows", "--service", "default/nope"); err == nil || !strings.Contains(out, "default/nope has no frontend") {
			t.Errorf("flows of an unknown Service: %v\n%s", err, out)
		}
	})

	t.Run("trace-packet", func(t *testing.T) {
		var res localapi.TraceResult
		ctlJSON(t, c, n0, &res, "trace-packet", "-S", "ops-ctl/client", "-D", "ops-ctl/server", "-f", fmt.Sprintf("tcp,tcp_dst=%d", tcpPort))
		if res.Verdict != opsv1alpha1.TraceDelivered || !strings.Contains(res.Detail, "ops-ctl/server") || !slices.Contains(res.Tables, "IngressRule") {
			t.Fatalf("allowed client: %+v", res)
		}
		text := mustCtl(t, c, n0, "trace-packet", "-S", "ops-ctl/client", "-D", server.ip, "-f", fmt.Sprintf("tcp,tcp_dst=%d", tcpPort))
		if !strings.Contains(text, "Verdict:  Delivered") || !strings.Contains(text, "Classifier → SpoofGuard") {
			t.Fatalf("text output:\n%s", text)
		}
		// A deny-all ingress policy on the server: the same packet is
		// dropped by the default deny, then allowed again once it is gone.
		deny := &networkingv1.NetworkPolicy{ObjectMeta: metav1.ObjectMeta{Namespace: "ops-ctl", Name: "servers"},
			Spec: networkingv1.NetworkPolicySpec{PodSelector: metav1.LabelSelector{MatchLabels: map[string]string{"app": "server"}},
				PolicyTypes: []networkingv1.PolicyType{networkingv1.PolicyTypeIngress}}}
		setPolicy(t, c, deny)
		eventually(t, 20*time.Second, "trace-packet denied", func() error {
			ctlJSON(t, c, n0, &res, "trace-packet", "-S", "ops-ctl/client", "-D", "ops-ctl/server", "-f", fmt.Sprintf("tcp,tcp_dst=%d", tcpPort))
			if res.Verdict != opsv1alpha1.TraceDropped || !strings.Contains(res.Detail, "IngressDefault") {
				return fmt.Errorf("%s: %s", res.Verdict, res.Detail)
			}
			return nil
		})
		setPolicy(t, c, allowFrom("ops-ctl", "servers", map[string]string{"app": "server"}, map[string]string{"role": "client"}))
		eventually(t, 20*time.Second, "trace-packet allowed again", func() error {
			ctlJSON(t, c, n0, &res, "trace-packet", "-S", "ops-ctl/client", "-D", "ops-ctl/server", "-f", fmt.Sprintf("tcp,tcp_dst=%d", tcpPort))
			if res.Verdict != opsv1alpha1.TraceDelivered {
				return fmt.Errorf("%s: %s", res.Verdict, res.Detail)
			}
			return nil
		})
		// Towards another Node: traced up to the tunnel.
		ctlJSON(t, c, n0, &res, "trace-packet", "-S", "ops-ctl/client", "-D", "ops-ctl/remote")
		if res.Verdict != opsv1alpha1.TraceForwarded || !strings.Contains(res.Detail, n1.Name) || res.Tables[len(res.Tables)-1] != "Output" {
			t.Errorf("client to remote: %+v", res)
		}
		if out, err := seinectl(testCtx(t, time.Minute), c, n0, "trace-packet", "-S", "ops-ctl/remote", "-D", server.ip); err == nil ||
			!strings.Contains(out, "not attached to Node "+n0.Name) {
			t.Errorf("tracing from a Pod of another Node: %v\n%s", err, out)
		}
	})

	t.Run("query endpoint", func(t *testing.T) {
		out := mustCtl(t, c, n0, "query", "endpoint", "-p", "ops-ctl/server")
		for _, want := range []string{"Endpoint ops-ctl/server (" + server.ip, "Isolated for: ingress", "ops-ctl/servers (np-",
			"rule 1 (In) allows from Pods of group", "ops-ctl/client", "ops-ctl/remote"} {
			if !strings.Contains(out, want) {
				t.Errorf("query endpoint server lacks %q:\n%s", want, out)
			}
		}
		out = mustCtl(t, c, n0, "query", "endpoint", "-p", "ops-ctl/client")
		if !strings.Contains(out, "Isolated for: nothing") || !regexp.MustCompile(`ops-ctl/servers \(np-\S+\) computed rule 1 \(In\)`).MatchString(out) {
			t.Errorf("query endpoint client:\n%s", out)
		}
		out = mustCtl(t, c, n0, "query", "endpoint", "-p", stranger.ns+"/"+stranger.name)
		if !strings.Contains(out, "Rules admitting it as a peer:\n  none") {
			t.Errorf("query endpoint stranger:\n%s", out)
		}
	})

	t.Run("traceflow", func(t *testing.T) {
		ops, _ := opsClients(t, c)
		run := func(n sandbox.Node, src, dst string) opsv1alpha1.Traceflow {
			t.Helper()
			var tf opsv1alpha1.Traceflow
			start := time.Now()
			s, err := seinectl(testCtx(t, time.Minute), c, n, "traceflow", "-S", src, "-D", dst, "-o", "json")
			if jerr := json.Unmarshal([]byte(s), &tf); jerr != nil {
				t.Fatalf("traceflow %s -> %s: %v %v\n%s", src, dst, err, jerr, s)
			}
			t.Logf("traceflow %s -> %s: %s in %s (seinectl run, creation to report)", src, dst, tf.Status.Result, time.Since(start).Round(time.Millisecond))
			return tf
		}
		// Same Node, allowed.
		tf := run(n0, "ops-ctl/client", fmt.Sprintf("ops-ctl/server:%d", tcpPort))
		if tf.Status.Phase != opsv1alpha1.TraceflowSucceeded || tf.Status.Result != opsv1alpha1.TraceDelivered ||
			len(tf.Status.Nodes) != 1 || tf.Status.Nodes[0].Node != n0.Name || !strings.Contains(tf.Status.Nodes[0].Detail, "ops-ctl/server") {
			t.Fatalf("same-Node traceflow: %+v", tf.Status)
		}
		// An allowed packet skips the default deny.
		want := []string{"Classifier", "SpoofGuard", "NATLookup", "SaveHeaders", "Conntrack", "ConntrackState", "ServiceLB", "EgressRule", "EgressDefault",
			"L3Forwarding", "L2Forwarding", "IngressRule", "ConntrackCommit", "Output"}
		if got := tf.Status.Nodes[0].Tables; !slices.Equal(got, want) {
			t.Errorf("tables %v, want %v", got, want)
		}
		// Across Nodes, allowed: run from the other Node (seinectl
		// works from anywhere the kubeconfig reaches).
		tf = run(n0, "ops-ctl/remote", fmt.Sprintf("ops-ctl/server:%d", tcpPort))
		st := tf.Status
		if st.Phase != opsv1alpha1.TraceflowSucceeded || st.Result != opsv1alpha1.TraceDelivered || len(st.Nodes) != 2 ||
			st.Nodes[0].Node != n1.Name || st.Nodes[0].Action != opsv1alpha1.TraceForwarded || st.Nodes[0].NextNode != n0.Name ||
			st.Nodes[1].Node != n0.Name || st.Nodes[1].Action != opsv1alpha1.TraceDelivered || st.Nodes[1].Tables[0] != "Classifier" {
			t.Fatalf("cross-Node traceflow: %+v", st)
		}
		// Across Nodes, denied: dropped by the server's default deny.
		tf = run(n1, "ops-ctl/stranger", fmt.Sprintf("ops-ctl/server:%d", tcpPort))
		st = tf.Status
		if st.Result != opsv1alpha1.TraceDropped || len(st.Nodes) != 2 || !strings.Contains(st.Nodes[1].Detail, "IngressDefault") ||
			st.Nodes[1].Tables[len(st.Nodes[1].Tables)-1] != "IngressDefault" {
			t.Fatalf("denied traceflow: %+v", st)
		}
		// The text output, ICMP by default.
		out := mustCtl(t, c, n1, "traceflow", "-S", "ops-ctl/remote", "-D", server.ip)
		for _, w := range []string{"ICMP", "Node " + n1.Name + ": Classifier", "Forwarded: through the tunnel to Node " + n0.Name, "Result: Delivered"} {
			if !strings.Contains(out, w) {
				t.Errorf("traceflow output lacks %q:\n%s", w, out)
			}
		}
		// seinectl deletes its Traceflows once done.
		l, err := ops.OpsV1alpha1().Traceflows().List(testCtx(t, 10*time.Second), metav1.ListOptions{})
		if err != nil || len(l.Items) != 0 {
			t.Errorf("Traceflows left behind: %v %d", err, len(l.Items))
		}
	})

	t.Run("log-level", func(t *testing.T) {
		if out := mustCtl(t, c, n0, "log-level"); strings.TrimSpace(out) != "info" {
			t.Fatalf("log level %q", out)
		}
		t.Cleanup(func() { _, _ = seinectl(context.Background(), c, n0, "log-level", "info") })
		if out := mustCtl(t, c, n0, "log-level", "debug"); strings.TrimSpace(out) != "debug" {
			t.Fatalf("set debug: %q", out)
		}
		if out := mustCtl(t, c, n0, "log-level"); strings.TrimSpace(out) != "debug" {
			t.Fatalf("after set: %q", out)
		}
		// The daemon logs at debug now: a trace-packet request leaves debug lines.
		eventually(t, 10*time.Second, "debug lines in the daemon's log", func() error {
			b, _ := os.ReadFile(n0.LogPath)
			if !strings.Contains(string(b), "log level changed") || !regexp.MustCompile(`\tdebug\t`).Match(b) {
				return fmt.Errorf("no debug line yet")
			}
			return nil
		})
		if out, err := seinectl(testCtx(t, time.Minute), c, n0, "log-level", "loud"); err == nil || !strings.Contains(out, "want debug, info, warn or error") {
			t.Errorf("a bad level: %v %s", err, out)
		}
	})

	t.Run("supportbundle", func(t *testing.T) {
		path := filepath.Join(t.TempDir(), "bundle.tar.gz")
		if out := mustCtl(t, c, n0, "supportbundle", "-f", path); strings.TrimSpace(out) != path {
			t.Fatalf("supportbundle printed %q", out)
		}
		files := readBundle(t, path)
		for _, part := range inspect.BundleParts {
			if !slices.ContainsFunc(slices.Collect(maps.Keys(files)), func(f string) bool { return strings.HasPrefix(f, part) }) {
				t.Errorf("bundle lacks %s (has %v)", part, slices.Sorted(maps.Keys(files)))
			}
		}
		for f := range files {
			if strings.HasSuffix(f, ".error") {
				t.Errorf("bundle part failed: %s: %s", f, files[f])
			}
		}
		for f, want := range map[string]string{
			"ovs/flows.txt":               `owner="pod ops-ctl/server"`,
			"ovs/bridge-dump-flows.txt":   "table_id=120",
			"ovs/ports.json":              "seine-gw0",
			"network/routes.txt":          "seine-gw0",
			"network/nftables.txt":        "table ip seine",
			"network/conntrack.txt":       "nf_conntrack_tcp_timeout_established 86400",
			"ovs/conntrack-stats.txt":     "Connections",
			"network/services.json":       `"name": "kubernetes"`,
			"policy/networkpolicies.json": "ops-ctl",
			"profiles/goroutine.txt":      "goroutine ",
			"logs/seine.log":              "datapath ready",
			"config.yaml":                 "nodeName: " + n0.Name,
			"health.txt":                  "[+]policies-realized ok",
		} {
			if !strings.Contains(files[f], want) {
				t.Errorf("bundle %s lacks %q", f, want)
			}
		}
		if len(files["profiles/heap.pb.gz"]) == 0 {
			t.Error("empty heap profile")
		}
	})

	t.Run("completion", func(t *testing.T) {
		if out := mustCtl(t, c, n0, "completion", "bash"); !strings.Contains(out, "complete -o default -F _seinectl_complete seinectl") {
			t.Errorf("bash completion:\n%s", out)
		}
		out := mustCtl(t, c, n0, "get", "ovsflows", "--table", "--generate-bash-completion")
		for _, ti := range pipeline.Tables() {
			if !strings.Contains(out, ti.Name) {
				t.Errorf("table %s not completed:\n%s", ti.Name, out)
			}
		}
		if out := mustCtl(t, c, n0, "get", "--generate-bash-completion"); !strings.Contains(out, "podinterface") {
			t.Errorf("get completion:\n%s", out)
		}
	})
}

// setPolicy replaces a NetworkPolicy.
func setPolicy(t *testing.T, c *sandbox.Cluster, np *networkingv1.NetworkPolicy) {
	t.Helper()
	ctx := testCtx(t, 30*time.Second)
	api := c.Client().NetworkingV1().NetworkPolicies(np.Namespace)
	// The controller's realization annotations may race the update.
	err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
		cur, err := api.Get(ctx, np.Name, metav1.GetOptions{})
		if err != nil {
			return err
		}
		np.ResourceVersion = cur.ResourceVersion
		_, err = api.Update(ctx, np, metav1.UpdateOptions{})
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
}

// readBundle opens a support bundle and returns its files by path below
// the archive's top directory.
func readBundle(t *testing.T, path string) map[string]string {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	gz, err := gzip.NewReader(f)
	if err != nil {
		t.Fatalf("the bundle is not gzip: %v", err)
	}
	tr := tar.NewReader(gz)
	files := map[string]string{}
	for {
		h, err := tr.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatalf("reading the bundle: %v", err)
		}
		b, err := io.ReadAll(tr)
		if err != nil {
			t.Fatal(err)
		}
		_, rel, _ := strings.Cut(h.Name, "/")
		files[rel] = string(b)
	}
	return files
}

// The AgentInfo of every Node holds the figures of that Node.
func TestAgentInfo(t *testing.T) {
	c := shared
	ops, _ := opsClients(t, c)
	ver, err := exec.Command(seineBin(), "version").Output()
	if err != nil {
		t.Fatal(err)
	}
	version := strings.Fields(string(ver))[1]
	ovsVer, err := exec.Command("ovs-vswitchd", "--version").Output()
	if err != nil {
		t.Fatal(err)
	}
	wantOVS := strings.Fields(strings.SplitN(string(ovsVer), "\n", 2)[0])[3]
	for _, n := range c.Nodes() {
		eventually(t, 40*time.Second, "AgentInfo of "+n.Name, func() error {
			ai, err := ops.OpsV1alpha1().AgentInfos().Get(testCtx(t, 10*time.Second), n.Name, metav1.GetOptions{})
			if err != nil {
				return err
			}
			s := ai.Status
			if s.Version != version || s.OVS.Version != wantOVS || s.OVS.DatapathType != "netdev" || s.TunnelType != sandboxTunnel ||
				s.TrafficMode != string(c.Mode()) || s.NodeIP != n.IP || s.PeerCount != int32(len(c.Nodes())-1) {
				return fmt.Errorf("status %+v", s)
			}
			if len(ai.OwnerReferences) != 1 || ai.OwnerReferences[0].Kind != "Node" || ai.OwnerReferences[0].Name != n.Name {
				return fmt.Errorf("owners %+v", ai.OwnerReferences)
			}
			for _, typ := range []string{opsv1alpha1.AgentOVSConnected, opsv1alpha1.AgentAPIConnected, opsv1alpha1.AgentPoliciesRealized, opsv1alpha1.AgentReady} {
				if !meta.IsStatusConditionTrue(s.Conditions, typ) {
					return fmt.Errorf("condition %s not True: %+v", typ, s.Conditions)
				}
			}
			if time.Since(s.LastHeartbeatTime.Time) > 70*time.Second {
				return fmt.Errorf("heartbeat %v", s.LastHeartbeatTime)
			}
			// Pods: the ports OVS has for Pods of this Node.
			ports := ovs(t, n, "ovs-vsctl", "--bare", "--columns=name", "find", "Port", "external_ids:seine.io/pod-name!=\"\"")
			if pods := len(strings.Fields(ports)); int(s.PodCount) != pods {
				return fmt.Errorf("podCount %d, OVS has %d Pod ports", s.PodCount, pods)
			}
			// Flows: per table, what the bridge holds.
			have := ovsFlowsPerTable(t, n)
			sum := int32(0)
			for _, tf := range s.FlowTables {
				sum += tf.Flows
				// SessionAffinity also holds the flows OVS learned.
				if tf.Table != pipeline.SessionAffinity.String() && have[tf.Table] != int(tf.Flows) {
					return fmt.Errorf("table %s: %d flows reported, %d in OVS", tf.Table, tf.Flows, have[tf.Table])
				}
			}
			if sum != s.FlowCount || len(s.FlowTables) != len(pipeline.Tables()) {
				return fmt.Errorf("flowCount %d, tables sum to %d (%d tables)", s.FlowCount, sum, len(s.FlowTables))
			}
			return nil
		})
	}
	out := mustCtl(t, c, c.Nodes()[0], "get", "agentinfo")
	for _, n := range c.Nodes() {
		if !regexp.MustCompile(`(?m)^` + n.Name + `\s+True\s+` + regexp.QuoteMeta(version)).MatchString(out) {
			t.Errorf("seinectl get agentinfo lacks %s:\n%s", n.Name, out)
		}
	}
	// An AgentInfo whose Node does not exist is removed by the leader.
	if _, err := ops.OpsV1alpha1().AgentInfos().Create(testCtx(t, 10*time.Second),
		&opsv1alpha1.AgentInfo{ObjectMeta: metav1.ObjectMeta{Name: "e2e-removed-node"}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	eventually(t, 60*time.Second, "the AgentInfo of a removed Node deleted", func() error {
		_, err := ops.OpsV1alpha1().AgentInfos().Get(testCtx(t, 10*time.Second), "e2e-removed-node", metav1.GetOptions{})
		switch {
		case err == nil:
			return fmt.Errorf("still there")
		case !apierrors.IsNotFound(err):
			return fmt.Errorf("reading it: %w", err)
		}
		return nil
	})
}

// checkControllerInfo waits until the ControllerInfo names the Lease's
// holder, since its acquire time, with the counts of the stored objects.
func checkControllerInfo(t *testing.T, c *sandbox.Cluster) *opsv1alpha1.ControllerInfo {
	t.Helper()
	ops, cp := opsClients(t, c)
	var got *opsv1alpha1.ControllerInfo
	eventually(t, 60*time.Second, "ControllerInfo names the leader", func() error {
		ctx := testCtx(t, 10*time.Second)
		l, err := c.Client().CoordinationV1().Leases(sandbox.SeineNamespace).Get(ctx, "seine-controller", metav1.GetOptions{})
		if err != nil || l.Spec.HolderIdentity == nil || l.Spec.AcquireTime == nil {
			return fmt.Errorf("lease: %v", err)
		}
		ci, err := ops.OpsV1alpha1().ControllerInfos().Get(ctx, "seine-controller", metav1.GetOptions{})
		if err != nil {
			return err
		}
		s := ci.Status
		if s.Leader != *l.Spec.HolderIdentity {
			return fmt.Errorf("ControllerInfo names %q, the Lease %q", s.Leader, *l.Spec.HolderIdentity)
		}
		if d := s.LeaderSince.Sub(l.Spec.AcquireTime.Time); d < -2*time.Second || d > 2*time.Second {
			return fmt.Errorf("leaderSince %v, the Lease was acquired at %v", s.LeaderSince, l.Spec.AcquireTime)
		}
		nps, err := cp.ControlplaneV1alpha1().NetworkPolicies().List(ctx, metav1.ListOptions{})
		if err != nil {
			return err
		}
		prs, err := cp.ControlplaneV1alpha1().PodRealizations().List(ctx, metav1.ListOptions{})
		if err != nil {
			return err
		}
		if int(s.Computed.NetworkPolicies) != len(nps.Items) || int(s.Computed.PodRealizations) != len(prs.Items) ||
			int(s.Sources.Nodes) != len(c.Nodes()) || s.InitialSyncDuration.Duration <= 0 || s.LastComputation == nil {
			return fmt.Errorf("status %+v; stored: %d policies, %d PodRealizations", s, len(nps.Items), len(prs.Items))
		}
		got = ci
		return nil
	})
	out := mustCtl(t, c, c.Nodes()[0], "get", "controllerinfo")
	if !regexp.MustCompile(`(?m)^seine-controller\s+` + got.Status.Leader + `\s`).MatchString(out) {
		t.Errorf("seinectl get controllerinfo:\n%s", out)
	}
	return got
}

// Prometheus can scrape every Node's metrics from off the Node (the
// external host), with the series operators need and plausible values.
func TestMetricsScrape(t *testing.T) {
	c := shared
	// On Node 0 a CNI ADD that succeeds and one that fails (a netns that
	// does not exist), so the request histogram and the error counter
	// have their series whatever ran before.
	n0 := c.Nodes()[0]
	e := newCNIEnv(t, c, n0, nil)
	ctx := testCtx(t, time.Minute)
	ok := e.rt("e2e-metrics-ok", newPodNS(t, "seine-e2e-metrics"))
	if _, err := e.add(ctx, ok); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := e.del(context.Background(), ok); err != nil {
			t.Errorf("DEL: %v", err)
		}
	})
	if _, err := e.add(ctx, e.rt("e2e-metrics-bad", "/run/netns/e2e-no-such-netns")); err == nil {
		t.Fatal("ADD into a missing netns succeeded")
	}
	extNS, _ := c.ExternalHost()
	for _, n := range c.Nodes() {
		mfs := scrape(t, extNS, "http://"+net.JoinHostPort(n.IP, "9345")+"/metrics")
		val := func(name string, labels map[string]string) (float64, bool) {
			mf, ok := mfs[name]
			if !ok {
				return 0, false
			}
		next:
			for _, m := range mf.GetMetric() {
				for k, v := range labels {
					if !slices.ContainsFunc(m.GetLabel(), func(l *dto.LabelPair) bool { return l.GetName() == k && l.GetValue() == v }) {
						continue next
					}
				}
				switch {
				case m.GetGauge() != nil:
					return m.GetGauge().GetValue(), true
				case m.GetCounter() != nil:
					return m.GetCounter().GetValue(), true
				case m.GetHistogram() != nil:
					return float64(m.GetHistogram().GetSampleCount()), true
				}
			}
			return 0, false
		}
		must := func(name string, labels map[string]string, ok func(float64) bool) {
			t.Helper()
			v, found := val(name, labels)
			if !found || !ok(v) {
				t.Errorf("%s: %s%v = %v (found %v)", n.Name, name, labels, v, found)
			}
		}
		positive := func(v float64) bool { return v > 0 }
		must("seine_table_flows", map[string]string{"table": "Classifier"}, positive)
		must("seine_table_flows", map[string]string{"table": "Output"}, positive)
		must("seine_flows", nil, func(v float64) bool { return v > 50 })
		must("seine_flow_programming_duration_seconds", nil, positive)
		// Every step, the last one included: the daemon serves only once
		// it is done.
		for _, step := range []string{"node", "ovsdb", "transport", "bridge", "pipeline", "proxy", "pods", "peers", "policy", "round", "serve"} {
			must("seine_startup_step_duration_seconds", map[string]string{"step": step}, positive)
		}
		var pis []localapi.PodInterface
		ctlJSON(t, c, n, &pis, "get", "podinterface")
		must("seine_local_pods", nil, func(v float64) bool { return v == float64(len(pis)) })
		must("seine_peer_nodes", nil, func(v float64) bool { return v == float64(len(c.Nodes())-1) })
		must("seine_ovs_connected", nil, func(v float64) bool { return v == 1 })
		must("seine_policy_controller_queue_depth", nil, func(v float64) bool { return v >= 0 })
		must("seine_policy_controller_leader", nil, func(v float64) bool { return v == 0 || v == 1 })
		must("seine_policy_agent_pending_policies", nil, func(v float64) bool { return v >= 0 })
		must("seine_build_info", nil, func(v float64) bool { return v == 1 })
		// The workqueues report to the liveness watchdog through the
		// same provider that exports their metrics.
		for _, q := range []string{"proxy", "policy-agent", "noderoute"} {
			must("seine_workqueue_adds_total", map[string]string{"name": q}, positive)
			must("seine_workqueue_longest_running_processor_seconds", map[string]string{"name": q}, func(v float64) bool { return v < 60 })
		}
		if _, ok := mfs["seine_policy_realization_duration_seconds"]; !ok {
			t.Errorf("%s: no policy realization histogram", n.Name)
		}
		if _, ok := mfs["seine_policy_controller_round_duration_seconds"]; !ok {
			t.Errorf("%s: no computation round histogram", n.Name)
		}
		if _, ok := mfs["seine_policy_controller_compute_duration_seconds"]; !ok {
			t.Errorf("%s: no computation histogram", n.Name)
		}
		if n.Name == n0.Name {
			must("seine_cni_request_duration_seconds", map[string]string{"command": "ADD", "result": "success"}, positive)
			must("seine_cni_errors_total", map[string]string{"command": "ADD"}, positive)
		}
		if v, _ := val("seine_policy_controller_leader", nil); v == 1 {
			must("seine_policy_controller_round_duration_seconds", nil, positive)
			must("seine_policy_controller_compute_duration_seconds", nil, positive)
		}
		// The probes answer on the same address.
		if got := get(t, extNS, "http://"+net.JoinHostPort(n.IP, "9345")+"/healthz?verbose"); !strings.Contains(got, "[+]"+health.CheckWorkers+" ok") {
			t.Errorf("%s /healthz?verbose = %q, want the workers check passing", n.Name, got)
		}
		// The probes answer on the same address.
		for path, want := range map[string]string{"/healthz": "ok\n", "/readyz": "ok\n"} {
			if got := get(t, extNS, "http://"+net.JoinHostPort(n.IP, "9345")+path); got != want {
				t.Errorf("%s %s = %q", n.Name, path, got)
			}
		}
	}
	leaders := 0
	for _, n := range c.Nodes() {
		mfs := scrape(t, extNS, "http://"+net.JoinHostPort(n.IP, "9345")+"/metrics")
		if mf, ok := mfs["seine_policy_controller_leader"]; ok && mf.GetMetric()[0].GetGauge().GetValue() == 1 {
			leaders++
		}
	}
	if leaders != 1 {
		t.Errorf("%d Nodes report leading the policy controller", leaders)
	}
}

// get fetches url (http://host:port/path) from inside the named network
// namespace: the connection is opened there, then used from here.
func get(t *testing.T, netnsName, url string) string {
	t.Helper()
	hostPort, path, _ := strings.Cut(strings.TrimPrefix(url, "http://"), "/")
	conn, err := dialIn(netnsName, hostPort, 10*time.Second)
	if err != nil {
		t.Fatalf("connecting to %s from %s: %v", hostPort, netnsName, err)
	}
	defer conn.Close()
	_ = conn.SetDeadline(time.Now().Add(10 * time.Second))
	req, _ := http.NewRequest(http.MethodGet, "http://"+hostPort+"/"+path, nil)
	req.Close = true
	if err := req.Write(conn); err != nil {
		t.Fatalf("GET %s: %v", url, err)
	}
	resp, err := http.ReadResponse(bufio.NewReader(conn), req)
	if err != nil {
		t.Fatalf("GET %s: %v", url, err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatalf("GET %s: %v", url, err)
	}
	return string(body)
}

func scrape(t *testing.T, netnsName, url string) map[string]*dto.MetricFamily {
	t.Helper()
	body := get(t, netnsName, url)
	p := expfmt.NewTextParser(model.UTF8Validation)
	mfs, err := p.TextToMetricFamilies(bytes.NewBufferString(body))
	if err != nil {
		t.Fatalf("parsing %s: %v", url, err)
	}
	return mfs
}
