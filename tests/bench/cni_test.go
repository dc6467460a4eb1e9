package bench

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/containernetworking/plugins/pkg/ns"
	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
	"go.uber.org/zap"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"

	"github.com/seine-net/seine/datapath/pipeline"
	"github.com/seine-net/seine/node/cni/plugin"
	"github.com/seine-net/seine/node/cni/wire"
	"github.com/seine-net/seine/node/podnet"
	"github.com/seine-net/seine/policy/apis/controlplane/v1alpha1"
	"github.com/seine-net/seine/policy/client/clientset/versioned"
	"github.com/seine-net/seine/tests/bench/stats"
	"github.com/seine-net/seine/tests/sandbox"
)

// envBaseline names a seine binary (an older build) that a benchmark
// measures in the same run as bin/seine, on a sandbox of its own, and
// reports under the sub-benchmark "baseline" next to "current"
// (BenchmarkCNIAddConcurrent takes turns between the two; the others
// measure the baseline first).
const envBaseline = "SEINE_BENCH_BASELINE"

// cniLevels are the numbers of ADDs in flight at once.
var cniLevels = []int{1, 10, 50, 200}

// BenchmarkCNIAddConcurrent measures CNI ADD on one sandbox Node with 1,
// 10, 50 and 200 ADDs in flight (at least 50 ADDs per level; at 50 and 200
// every ADD starts at once), along two paths:
//
//   - "cni": what a container runtime sees: libcni runs the installed
//     conflist, executing each plugin (seine alone, which serves hostPorts
//     and shaping itself; binaries before that chained portmap and
//     bandwidth);
//   - "daemon": the seine plugin's call (plugin.Forward) made in process (no exec, no
//     chained plugins): what the daemon itself costs.
//
// These ADDs name no Pod (no K8S_POD_NAME), so the daemon does not wait
// for NetworkPolicy realization. Last, "policy-cni" and "policy-daemon"
// create 50 Pods in the API under a default-deny policy and an allow
// policy (the Node's kubelet stopped, so the benchmark runs their ADDs
// itself) and ADD them all at once along each path: each ADD then waits
// until its Pod's policies are installed.
//
// Metrics per path P and level N: P-cN-p50-ms, P-cN-p99-ms, P-cN-adds/s;
// the mean of each ADD step (seine_cni_add_step_duration_seconds, when
// the daemon exports it) as P-cN-<step>-ms; CPU time per ADD of the seine
// daemon, ovs-vswitchd, ovsdb-server and (cni path) the plugin processes
// as P-cN-cpu-<process>-ms. After each level every attachment is DELeted
// and the benchmark fails if an IP, OVS port or Pod flow is left.
//
// With SEINE_BENCH_BASELINE=<seine binary> that binary ("baseline") runs
// on a second sandbox beside bin/seine's ("current"), and the two take
// turns level by level: every level runs cniRounds times on each, the
// order alternating between rounds, so the machine's drift over the run
// falls on both alike (the policy level runs once on each, baseline
// first). Figures pool the rounds (percentiles over every ADD, ADDs/s
// over the summed wall time, step and CPU means over every ADD). The
// parent benchmark measures; the sub-benchmarks only report, so run it
// with -benchtime 1x and select it whole.
func BenchmarkCNIAddConcurrent(b *testing.B) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Minute)
	defer cancel()
	var meters []*cniMeter
	if base := os.Getenv(envBaseline); base != "" {
		meters = append(meters, newCNIMeter(ctx, b, "baseline", "bcnb", base))
	}
	meters = append(meters, newCNIMeter(ctx, b, "current", "bcnc", filepath.Join(repoRoot(), "bin", "seine")))
	for round := range cniRounds {
		order := slices.Clone(meters)
		if round%2 == 1 {
			slices.Reverse(order)
		}
		for _, path := range []string{"cni", "daemon"} {
			for _, level := range cniLevels {
				for _, m := range order {
					if slices.Contains(m.paths, path) {
						m.level(ctx, path, level, m.nss[:max(level, 50)], nil)
					}
				}
			}
		}
	}
	// Once: it stops each Node's kubelet and creates Pods for good.
	for _, m := range meters {
		m.policyLevel(ctx, m.nss[:50])
	}
	for _, m := range meters {
		b.Run(m.name, func(b *testing.B) { m.report(b) })
	}
}

// cniRounds is how many times each level runs on each binary: even, so
// that each goes first equally often.
const cniRounds = 4

// newCNIMeter brings up sandbox name, one Node running binary, and
// returns the meter that measures it under label (the sub-benchmark's
// name).
func newCNIMeter(ctx context.Context, b *testing.B, label, name, binary string) *cniMeter {
	c := upWith(b, name, 1, binary)
	node := c.Nodes()[0]
	cc, err := c.CNI(node.Name, nil)
	if err != nil {
		b.Fatal(err)
	}
	m := &cniMeter{b: b, name: label, cluster: c, node: node, cc: cc, plugin: daemonPluginConf(b, node),
		paths: []string{"cni", "daemon"}, results: map[string]*levelResult{}}
	m.before = m.leftovers()
	if !speaksWire(ctx, m.plugin) {
		// A baseline from before the wire protocol (gRPC until
		// 2026-11-26): the in-process client cannot call it.
		b.Logf("%s does not speak the current plugin protocol: measuring the cni path only", binary)
		m.paths = m.paths[:1]
	}
	m.nss = make([]string, cniLevels[len(cniLevels)-1])
	for i := range m.nss {
		m.nss[i] = netns(b, fmt.Sprintf("seine-%s-%03d", name, i))
	}
	return m
}

// upWith is up with a given seine binary.
func upWith(b *testing.B, name string, nodes int, binary string) *sandbox.Cluster {
	b.Helper()
	if os.Geteuid() != 0 {
		b.Skip("needs root")
	}
	os.Setenv("SEINE_SANDBOX_BIN", filepath.Join(repoRoot(), "bin", "sandbox"))
	_ = sandbox.Down(name, "")
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	c, err := sandbox.Up(ctx, sandbox.Options{Name: name, Nodes: nodes, SeineBinary: binary, Log: zap.NewNop()})
	if err != nil {
		_ = sandbox.Down(name, "")
		b.Fatal(err)
	}
	b.Cleanup(func() {
		if os.Getenv("SEINE_BENCH_KEEP") != "" {
			b.Logf("keeping sandbox %s (SEINE_BENCH_KEEP)", name)
			return
		}
		if err := sandbox.Down(name, ""); err != nil {
			b.Errorf("down: %v", err)
		}
	})
	return c
}

// daemonPluginConf is the seine entry of the Node's installed conflist as
// a single plugin configuration (what libcni hands the seine plugin).
func daemonPluginConf(b *testing.B, n sandbox.Node) []byte {
	b.Helper()
	raw, err := os.ReadFile(filepath.Join(n.CNIConfDir, "10-seine.conflist"))
	if err != nil {
		b.Fatal(err)
	}
	var list struct {
		CNIVersion string           `json:"cniVersion"`
		Name       string           `json:"name"`
		Plugins    []map[string]any `json:"plugins"`
	}
	if err := json.Unmarshal(raw, &list); err != nil {
		b.Fatal(err)
	}
	conf := list.Plugins[0]
	conf["cniVersion"], conf["name"] = list.CNIVersion, list.Name
	out, err := json.Marshal(conf)
	if err != nil {
		b.Fatal(err)
	}
	return out
}

// speaksWire reports whether the daemon whose socket conf names answers
// the plugin protocol of package wire (a STATUS).
func speaksWire(ctx context.Context, conf []byte) bool {
	var c struct {
		SocketPath string `json:"socketPath"`
	}
	if json.Unmarshal(conf, &c) != nil || c.SocketPath == "" {
		return false
	}
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	_, err := wire.Call(ctx, c.SocketPath, &wire.Request{Command: "STATUS", Config: conf})
	return err == nil
}

// cniMeter runs and measures ADD levels on one Node.
type cniMeter struct {
	b       *testing.B
	name    string
	cluster *sandbox.Cluster
	node    sandbox.Node
	cc      *sandbox.CNIClient
	plugin  []byte
	paths   []string // "cni", and "daemon" when the daemon speaks package wire
	nss     []string // Pod network namespaces, one per ADD of the largest level
	before  map[string]int
	seq     int
	results map[string]*levelResult // by label, e.g. "cni-c50"
}

// levelResult is what every run of one level measured, summed.
type levelResult struct {
	lat   []time.Duration // of every ADD
	wall  time.Duration   // of every run, each from its first ADD's start to its last ADD's end
	steps map[string]stepSum
	cpu   map[string]time.Duration
}

// result returns the accumulator of label, creating it.
func (m *cniMeter) result(label string) *levelResult {
	r := m.results[label]
	if r == nil {
		r = &levelResult{steps: map[string]stepSum{}, cpu: map[string]time.Duration{}}
		m.results[label] = r
	}
	return r
}

// report reports every level measured (see level for the metrics; the
// testing package prints them sorted by name).
func (m *cniMeter) report(b *testing.B) {
	for label, r := range m.results {
		b.ReportMetric(ms(stats.Quantile(r.lat, 0.5)), label+"-p50-ms")
		b.ReportMetric(ms(stats.Quantile(r.lat, 0.99)), label+"-p99-ms")
		b.ReportMetric(float64(len(r.lat))/r.wall.Seconds(), label+"-adds/s")
		for step, d := range r.steps {
			if d.count > 0 {
				b.ReportMetric(d.sum/float64(d.count)*1000, label+"-"+step+"-ms")
			}
		}
		for proc, t := range r.cpu {
			b.ReportMetric(ms(t)/float64(len(r.lat)), label+"-cpu-"+proc+"-ms")
		}
	}
}

// attachment is one ADD of a level.
type attachment struct {
	id, netns string
	args      [][2]string // K8S_POD_* for the policy level
}

// level runs len(nss) ADDs along path with n in flight, adds what it
// measured to the level's result, DELs them all and checks nothing is
// left.
func (m *cniMeter) level(ctx context.Context, path string, n int, nss []string, args func(i int) [][2]string) {
	b := m.b
	label := fmt.Sprintf("%s-c%d", path, n)
	m.seq++
	atts := make([]attachment, len(nss))
	for i := range atts {
		atts[i] = attachment{id: fmt.Sprintf("b%02d-%s-%03d", m.seq, path, i), netns: nss[i]}
		if args != nil {
			atts[i].args = args(i)
		}
	}
	steps0 := m.steps()
	cpu0 := m.cpu()
	lat := make([]time.Duration, len(atts))
	errs := make([]error, len(atts))
	sem := make(chan struct{}, n)
	var wg sync.WaitGroup
	start := time.Now()
	for i := range atts {
		wg.Add(1)
		sem <- struct{}{}
		go func() {
			defer wg.Done()
			defer func() { <-sem }()
			t0 := time.Now()
			errs[i] = m.add(ctx, path, atts[i])
			lat[i] = time.Since(t0)
		}()
	}
	wg.Wait()
	wall := time.Since(start)
	cpu1 := m.cpu()
	steps1 := m.steps()
	for i, err := range errs {
		if err != nil {
			b.Fatalf("%s: ADD %d: %v", label, i, err)
		}
	}
	r := m.result(label)
	r.lat = append(r.lat, lat...)
	r.wall += wall
	for step, d := range steps1 {
		if c := d.count - steps0[step].count; c > 0 {
			acc := r.steps[step]
			r.steps[step] = stepSum{sum: acc.sum + d.sum - steps0[step].sum, count: acc.count + c}
		}
	}
	for proc, t := range cpu1 {
		if (path == "daemon" || strings.HasSuffix(path, "-daemon")) && proc == "plugins" {
			continue
		}
		r.cpu[proc] += t - cpu0[proc]
	}

	for i := range atts {
		wg.Add(1)
		sem <- struct{}{}
		go func() {
			defer wg.Done()
			defer func() { <-sem }()
			errs[i] = m.del(ctx, atts[i])
		}()
	}
	wg.Wait()
	for i, err := range errs {
		if err != nil {
			b.Fatalf("%s: DEL %d: %v", label, i, err)
		}
	}
	if left := m.leftovers(); !equalCounts(left, m.before) {
		b.Fatalf("%s: after every DEL: %v, before the level: %v", label, left, m.before)
	}
}

func (m *cniMeter) add(ctx context.Context, path string, a attachment) error {
	rt := sandbox.RuntimeConf(a.id, a.netns)
	rt.Args = append(rt.Args, a.args...)
	if path == "cni" || strings.HasSuffix(path, "-cni") {
		_, err := m.cc.Add(ctx, rt)
		return err
	}
	var args []string
	for _, kv := range rt.Args {
		args = append(args, kv[0]+"="+kv[1])
	}
	if _, cerr := plugin.Forward(ctx, &wire.Request{Command: "ADD", ContainerID: a.id, Netns: a.netns, IfName: rt.IfName,
		Args: strings.Join(args, ";"), Config: m.plugin}); cerr != nil {
		return cerr
	}
	return nil
}

func (m *cniMeter) del(ctx context.Context, a attachment) error {
	rt := sandbox.RuntimeConf(a.id, a.netns)
	rt.Args = append(rt.Args, a.args...)
	return m.cc.Del(ctx, rt)
}

// policyLevel ADDs 50 Pods at once that a default-deny and an allow
// policy select, through the conflist.
func (m *cniMeter) policyLevel(ctx context.Context, nss []string) {
	b, c := m.b, m.cluster
	const namespace = "cnibench"
	if err := c.StopKubelet(m.node.Name); err != nil {
		b.Fatal(err)
	}
	cs := c.Client()
	if err := ensureNS(ctx, cs, namespace); err != nil {
		b.Fatal(err)
	}
	nps := cs.NetworkingV1().NetworkPolicies(namespace)
	for _, np := range []*networkingv1.NetworkPolicy{
		{ObjectMeta: metav1.ObjectMeta{Name: "deny"}, Spec: networkingv1.NetworkPolicySpec{
			PolicyTypes: []networkingv1.PolicyType{networkingv1.PolicyTypeIngress, networkingv1.PolicyTypeEgress}}},
		{ObjectMeta: metav1.ObjectMeta{Name: "allow-web"}, Spec: networkingv1.NetworkPolicySpec{
			PodSelector: metav1.LabelSelector{MatchLabels: map[string]string{"app": "web"}},
			Ingress:     []networkingv1.NetworkPolicyIngressRule{{From: []networkingv1.NetworkPolicyPeer{{PodSelector: &metav1.LabelSelector{}}}}},
			Egress:      []networkingv1.NetworkPolicyEgressRule{{To: []networkingv1.NetworkPolicyPeer{{PodSelector: &metav1.LabelSelector{}}}}},
		}},
	} {
		if _, err := nps.Create(ctx, np, metav1.CreateOptions{}); err != nil {
			b.Fatal(err)
		}
	}
	uids := make([]string, len(nss))
	for i := range nss {
		pod, err := cs.CoreV1().Pods(namespace).Create(ctx, &corev1.Pod{
			ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("web-%03d", i), Labels: map[string]string{"app": "web"}},
			Spec: corev1.PodSpec{NodeName: m.node.Name, Containers: []corev1.Container{{Name: "c", Image: "none"}},
				Tolerations: []corev1.Toleration{{Operator: corev1.TolerationOpExists}}},
		}, metav1.CreateOptions{})
		if err != nil {
			b.Fatal(err)
		}
		uids[i] = string(pod.UID)
	}
	// The controller records every Pod in the Node's PodRealization (one
	// object, or its slices) before a CNI ADD can be acknowledged.
	rc, err := c.ControlPlane().RESTConfig()
	if err != nil {
		b.Fatal(err)
	}
	cp, err := versioned.NewForConfig(rc)
	if err != nil {
		b.Fatal(err)
	}
	err = wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, 2*time.Minute, true, func(ctx context.Context) (bool, error) {
		prs, err := cp.ControlplaneV1alpha1().PodRealizations().List(ctx, metav1.ListOptions{LabelSelector: v1alpha1.SpanLabel(m.node.Name)})
		if err != nil {
			return false, nil
		}
		n := 0
		for _, pr := range prs.Items {
			for k := range pr.Spec.Pods {
				if strings.HasPrefix(k, namespace+"/") {
					n++
				}
			}
		}
		return n == len(nss), nil
	})
	if err != nil {
		b.Fatalf("PodRealization of %s never listed the %d Pods: %v", m.node.Name, len(nss), err)
	}
	for _, path := range m.paths {
		path = "policy-" + path
		m.level(ctx, path, len(nss), nss, func(i int) [][2]string {
			return [][2]string{{"K8S_POD_NAMESPACE", namespace}, {"K8S_POD_NAME", fmt.Sprintf("web-%03d", i)}, {"K8S_POD_UID", uids[i]}}
		})
	}
}

// stepSum is one step of seine_cni_add_step_duration_seconds.
type stepSum struct {
	sum   float64
	count uint64
}

// steps scrapes the daemon's step histogram (empty when the daemon has
// none).
func (m *cniMeter) steps() map[string]stepSum {
	out := map[string]stepSum{}
	text, err := m.scrape()
	if err != nil {
		m.b.Fatalf("metrics of %s: %v", m.node.Name, err)
	}
	parser := expfmt.NewTextParser(model.UTF8Validation)
	mfs, err := parser.TextToMetricFamilies(strings.NewReader(text))
	if err != nil {
		m.b.Fatalf("metrics of %s: %v", m.node.Name, err)
	}
	mf := mfs["seine_cni_add_step_duration_seconds"]
	if mf == nil {
		return out
	}
	for _, mt := range mf.GetMetric() {
		out[labelValue(mt, "step")] = stepSum{sum: mt.GetHistogram().GetSampleSum(), count: mt.GetHistogram().GetSampleCount()}
	}
	return out
}

func labelValue(m *dto.Metric, name string) string {
	for _, l := range m.GetLabel() {
		if l.GetName() == name {
			return l.GetValue()
		}
	}
	return ""
}

// scrape reads the daemon's /metrics (the Node's IP, port 9345, in its
// network namespace).
func (m *cniMeter) scrape() (string, error) {
	nodeNS, err := ns.GetNS("/run/netns/" + m.node.NetNS)
	if err != nil {
		return "", err
	}
	defer nodeNS.Close()
	var conn net.Conn
	if err := nodeNS.Do(func(ns.NetNS) error {
		var err error
		conn, err = net.DialTimeout("tcp", net.JoinHostPort(m.node.IP, "9345"), 5*time.Second)
		return err
	}); err != nil {
		return "", err
	}
	defer conn.Close()
	_ = conn.SetDeadline(time.Now().Add(10 * time.Second))
	if _, err := io.WriteString(conn, "GET /metrics HTTP/1.0\r\nHost: localhost\r\n\r\n"); err != nil {
		return "", err
	}
	resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
	if err != nil {
		return "", err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	return string(body), err
}

// cpu returns the CPU time (user + system) so far of the Node's seine
// daemon, ovs-vswitchd and ovsdb-server, and of this process's waited-for
// children ("plugins": the CNI plugins libcni ran, and any tool the
// benchmark ran).
func (m *cniMeter) cpu() map[string]time.Duration {
	out := map[string]time.Duration{}
	for proc, pidfile := range map[string]string{
		"seine":        filepath.Join(m.node.Dir, "seine.pid"),
		"ovs-vswitchd": filepath.Join(m.node.OVSRunDir, "ovs-vswitchd.pid"),
		"ovsdb-server": filepath.Join(m.node.OVSRunDir, "ovsdb-server.pid"),
	} {
		d, err := processCPU(pidfile)
		if err != nil {
			m.b.Fatal(err)
		}
		out[proc] = d
	}
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_CHILDREN, &ru); err == nil {
		out["plugins"] = time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
	}
	return out
}

// processCPU returns the CPU time (user + system, all threads) so far of
// the process whose pid pidfile holds, at the kernel's clock-tick
// resolution (10 ms).
func processCPU(pidfile string) (time.Duration, error) {
	raw, err := os.ReadFile(pidfile)
	if err != nil {
		return 0, err
	}
	stat, err := os.ReadFile("/proc/" + strings.TrimSpace(string(raw)) + "/stat")
	if err != nil {
		return 0, err
	}
	// Fields after the command (which may hold spaces): state is 3,
	// utime 14 and stime 15, in clock ticks (USER_HZ, 100 on Linux).
	f := strings.Fields(string(stat[strings.LastIndexByte(string(stat), ')')+2:]))
	ut, _ := strconv.ParseUint(f[11], 10, 64)
	st, _ := strconv.ParseUint(f[12], 10, 64)
	return time.Duration(ut+st) * 10 * time.Millisecond, nil
}

// leftovers counts what attachments leave on the Node: IP allocations,
// OVS ports of Pods, Pod flows.
func (m *cniMeter) leftovers() map[string]int {
	out := map[string]int{}
	raw, err := os.ReadFile(filepath.Join(m.node.Dir, "seine", "ipam", "allocations.json"))
	if err == nil {
		var st struct {
			Allocations map[string]json.RawMessage `json:"allocations"`
		}
		if err := json.Unmarshal(raw, &st); err != nil {
			m.b.Fatal(err)
		}
		out["ips"] = len(st.Allocations)
	}
	ports, err := exec.Command("ovs-vsctl", "--db=unix:"+filepath.Join(m.node.OVSRunDir, "db.sock"),
		"--columns=name", "find", "Port", "external_ids:"+podnet.ExtIDIfName+"=eth0").Output()
	if err != nil {
		m.b.Fatal(err)
	}
	out["ports"] = strings.Count(string(ports), "name ")
	n, err := newSeineOF(m.node).count(categoryFilter(pipeline.CategoryPod))
	if err != nil {
		m.b.Fatal(err)
	}
	out["pod-flows"] = n
	return out
}

func equalCounts(a, b map[string]int) bool {
	keys := map[string]bool{}
	for k := range a {
		keys[k] = true
	}
	for k := range b {
		keys[k] = true
	}
	ks := make([]string, 0, len(keys))
	for k := range keys {
		ks = append(ks, k)
	}
	sort.Strings(ks)
	for _, k := range ks {
		if a[k] != b[k] {
			return false
		}
	}
	return true
}

// BenchmarkPluginExec measures what executing each plugin of Seine's
// conflist costs by itself: the process start-up that every ADD pays once
// per plugin, before any work. It runs each binary with CNI_COMMAND=VERSION
// (answered without contacting the daemon, CNI spec "VERSION") 200 times,
// in 4 rounds of 50 that take the plugins in turn, so that the machine's
// drift spreads over all of them. Metrics per plugin P (seine-cni;
// seine-cni-baseline with SEINE_BENCH_BASELINE=<seine binary>; portmap and
// bandwidth from /usr/lib/cni when installed): P-wall-ms and P-cpu-ms
// (user + system time of the child) per exec.
func BenchmarkPluginExec(b *testing.B) {
	plugins := []struct{ name, path string }{
		{"seine-cni", filepath.Join(repoRoot(), "bin", "seine-cni")},
		{"seine-cni-baseline", os.Getenv(envBaseline)},
		{"portmap", "/usr/lib/cni/portmap"},
		{"bandwidth", "/usr/lib/cni/bandwidth"},
	}
	const rounds, execs = 4, 50
	for i := 0; i < b.N; i++ {
		wall := make([]time.Duration, len(plugins))
		cpu := make([]time.Duration, len(plugins))
		for r := 0; r < rounds; r++ {
			for k, p := range plugins {
				if p.path == "" {
					continue
				}
				if _, err := os.Stat(p.path); err != nil {
					if r == 0 {
						b.Logf("%s: %v; not measured", p.name, err)
					}
					continue
				}
				for j := 0; j < execs; j++ {
					cmd := exec.Command(p.path)
					cmd.Env = []string{"CNI_COMMAND=VERSION"}
					cmd.Stdin = strings.NewReader(`{"cniVersion":"1.0.0"}`)
					t0 := time.Now()
					out, err := cmd.Output()
					wall[k] += time.Since(t0)
					if err != nil || !strings.Contains(string(out), "supportedVersions") {
						b.Fatalf("%s VERSION: %v: %s", p.name, err, out)
					}
					cpu[k] += cmd.ProcessState.UserTime() + cmd.ProcessState.SystemTime()
				}
			}
		}
		for k, p := range plugins {
			if wall[k] > 0 {
				b.ReportMetric(ms(wall[k])/(rounds*execs), p.name+"-wall-ms")
				b.ReportMetric(ms(cpu[k])/(rounds*execs), p.name+"-cpu-ms")
			}
		}
	}
}
