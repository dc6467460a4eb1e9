package bench

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/containernetworking/plugins/pkg/ns"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/client-go/kubernetes"
	"k8s.io/utils/ptr"

	"github.com/seine-net/seine/datapath/pipeline"
	"github.com/seine-net/seine/tests/sandbox"
)

// This file holds the parts of the Service-programming benchmark that are
// not benchmarks themselves: filling the API with synthetic Services, a
// kube-proxy process (nftables mode) in a sandbox Node, and the probes that
// tell when kube-proxy's nftables table or Seine's OpenFlow tables reflect
// a Service.

// Synthetic Services: selector-less, one port (TCP unless a benchmark
// asks for UDP), and one hand-written
// EndpointSlice each, so that N Services need no Pods.
const (
	svcNamespace     = "svcbench"
	svcPort          = 80
	svcPortName      = "http"
	svcTargetPort    = 8080
	svcEndpoints     = 4
	sliceManagedBy   = "bench.seine.dev"
	createWorkers    = 32
	kubeProxyMetrics = "127.0.0.1:10249"
)

// svcRef is one synthetic Service as created.
type svcRef struct {
	Index     int
	Name      string
	ClusterIP string
	Slice     string
}

func svcName(i int) string { return fmt.Sprintf("svc-%05d", i) }

// endpointIP is endpoint j of synthetic Service i: addresses from
// 10.244.64.0 to 10.244.249.255, above the podCIDRs a small sandbox
// allocates, so nothing answers them (the benchmark only looks at the
// rules); past 11,904 Services they repeat.
func endpointIP(i, j int) string {
	idx := (i*svcEndpoints + j) % (186 * 256)
	return fmt.Sprintf("10.244.%d.%d", 64+idx/256, idx%256)
}

// changedIP is the replacement address the r-th one-change step writes.
func changedIP(r int) string { return fmt.Sprintf("10.244.250.%d", 10+r) }

// bulkClient is an admin client with a QPS budget for creating thousands
// of objects.
func bulkClient(b *testing.B, c *sandbox.Cluster) kubernetes.Interface {
	b.Helper()
	cs, err := c.BulkClient(2000)
	if err != nil {
		b.Fatal(err)
	}
	return cs
}

func ensureNS(ctx context.Context, cs kubernetes.Interface, name string) error {
	_, err := cs.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: name}}, metav1.CreateOptions{})
	if err != nil && !apierrors.IsAlreadyExists(err) {
		return fmt.Errorf("create namespace %s: %w", name, err)
	}
	return nil
}

// retryAPI retries f on errors a busy API server returns (throttling,
// timeouts, conflicts on the ClusterIP allocator).
func retryAPI(ctx context.Context, f func() error) error {
	var err error
	for try := 0; try < 10; try++ {
		if err = f(); err == nil {
			return nil
		}
		if !(apierrors.IsTooManyRequests(err) || apierrors.IsServerTimeout(err) || apierrors.IsTimeout(err) ||
			apierrors.IsConflict(err) || apierrors.IsInternalError(err) || apierrors.IsServiceUnavailable(err)) {
			return err
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(time.Duration(100*(try+1)) * time.Millisecond):
		}
	}
	return err
}

// createServices creates Services [from, to) of one proto port and their
// EndpointSlices with createWorkers goroutines and returns them by index.
func createServices(ctx context.Context, cs kubernetes.Interface, proto corev1.Protocol, from, to int) ([]svcRef, error) {
	if err := ensureNS(ctx, cs, svcNamespace); err != nil {
		return nil, err
	}
	out := make([]svcRef, to-from)
	idx := make(chan int)
	var wg sync.WaitGroup
	var mu sync.Mutex
	var firstErr error
	for w := 0; w < createWorkers; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range idx {
				ref, err := createService(ctx, cs, proto, i)
				mu.Lock()
				if err != nil && firstErr == nil {
					firstErr = err
				}
				mu.Unlock()
				out[i-from] = ref
			}
		}()
	}
	for i := from; i < to; i++ {
		mu.Lock()
		failed := firstErr != nil
		mu.Unlock()
		if failed {
			break
		}
		idx <- i
	}
	close(idx)
	wg.Wait()
	return out, firstErr
}

func createService(ctx context.Context, cs kubernetes.Interface, proto corev1.Protocol, i int) (svcRef, error) {
	name := svcName(i)
	svc := &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: svcNamespace},
		Spec: corev1.ServiceSpec{
			Type: corev1.ServiceTypeClusterIP,
			Ports: []corev1.ServicePort{{
				Name: svcPortName, Protocol: proto, Port: svcPort, TargetPort: intstr.FromInt32(svcTargetPort),
			}},
		},
	}
	var got *corev1.Service
	err := retryAPI(ctx, func() error {
		var err error
		got, err = cs.CoreV1().Services(svcNamespace).Create(ctx, svc, metav1.CreateOptions{})
		if apierrors.IsAlreadyExists(err) {
			got, err = cs.CoreV1().Services(svcNamespace).Get(ctx, name, metav1.GetOptions{})
		}
		return err
	})
	if err != nil {
		return svcRef{}, fmt.Errorf("create service %s: %w", name, err)
	}
	slice := &discoveryv1.EndpointSlice{
		ObjectMeta: metav1.ObjectMeta{
			Name: name + "-bench", Namespace: svcNamespace,
			Labels: map[string]string{discoveryv1.LabelServiceName: name, discoveryv1.LabelManagedBy: sliceManagedBy},
		},
		AddressType: discoveryv1.AddressTypeIPv4,
		Ports: []discoveryv1.EndpointPort{{
			Name: ptr.To(svcPortName), Protocol: ptr.To(proto), Port: ptr.To[int32](svcTargetPort),
		}},
	}
	for j := 0; j < svcEndpoints; j++ {
		slice.Endpoints = append(slice.Endpoints, discoveryv1.Endpoint{
			Addresses:  []string{endpointIP(i, j)},
			Conditions: discoveryv1.EndpointConditions{Ready: ptr.To(true), Serving: ptr.To(true), Terminating: ptr.To(false)},
		})
	}
	err = retryAPI(ctx, func() error {
		_, err := cs.DiscoveryV1().EndpointSlices(svcNamespace).Create(ctx, slice, metav1.CreateOptions{})
		if apierrors.IsAlreadyExists(err) {
			return nil
		}
		return err
	})
	if err != nil {
		return svcRef{}, fmt.Errorf("create endpointslice %s: %w", slice.Name, err)
	}
	return svcRef{Index: i, Name: name, ClusterIP: got.Spec.ClusterIP, Slice: slice.Name}, nil
}

// replaceEndpoint rewrites the first endpoint of ref's EndpointSlice to ip
// and returns the address it replaced and the time the (successful)
// update request was sent.
func replaceEndpoint(ctx context.Context, cs kubernetes.Interface, ref svcRef, ip string) (old string, sent time.Time, err error) {
	slices := cs.DiscoveryV1().EndpointSlices(svcNamespace)
	err = retryAPI(ctx, func() error {
		s, err := slices.Get(ctx, ref.Slice, metav1.GetOptions{})
		if err != nil {
			return err
		}
		old = s.Endpoints[0].Addresses[0]
		s.Endpoints[0].Addresses = []string{ip}
		sent = time.Now()
		_, err = slices.Update(ctx, s, metav1.UpdateOptions{})
		return err
	})
	if err != nil {
		return "", time.Time{}, fmt.Errorf("update endpointslice %s: %w", ref.Slice, err)
	}
	return old, sent, nil
}

// ---- kube-proxy ------------------------------------------------------------

// kubeProxyBinary is the kube-proxy `make control-plane` builds.
func kubeProxyBinary(b *testing.B) string {
	b.Helper()
	dir := os.Getenv("SEINE_K8S_BIN")
	if dir == "" {
		dir = "/root/.cache/seine/k8s-v1.36.3/bin"
	}
	p := filepath.Join(dir, "kube-proxy")
	if _, err := os.Stat(p); err != nil {
		b.Fatalf("kube-proxy binary missing (%v): run `make control-plane`, which builds it from tests/tools", err)
	}
	return p
}

// kubeProxy is one kube-proxy process in nftables mode inside a sandbox
// Node's network namespace. It only writes the nftables tables "ip
// kube-proxy" and "ip6 kube-proxy" of that namespace, so it can run next
// to Seine, which only programs OVS.
type kubeProxy struct {
	bin, kubeconfig, logPath string
	node                     sandbox.Node
	http                     *http.Client

	cmd  *exec.Cmd
	done chan struct{}
}

func newKubeProxy(b *testing.B, c *sandbox.Cluster, node sandbox.Node) *kubeProxy {
	b.Helper()
	k := &kubeProxy{
		bin:        kubeProxyBinary(b),
		kubeconfig: c.InternalKubeconfig(),
		logPath:    filepath.Join(os.TempDir(), fmt.Sprintf("seine-bench-%s-kube-proxy.log", node.Name)),
		node:       node,
		http:       netnsHTTPClient("/run/netns/" + node.NetNS),
	}
	_ = os.Remove(k.logPath)
	b.Cleanup(func() {
		k.stop()
		k.deleteTables()
	})
	return k
}

// netnsHTTPClient is an HTTP client whose connections are opened inside
// the network namespace at nsPath.
func netnsHTTPClient(nsPath string) *http.Client {
	dial := func(ctx context.Context, network, addr string) (net.Conn, error) {
		var conn net.Conn
		err := ns.WithNetNSPath(nsPath, func(ns.NetNS) error {
			var d net.Dialer
			c, err := d.DialContext(ctx, network, addr)
			conn = c
			return err
		})
		return conn, err
	}
	return &http.Client{Transport: &http.Transport{DialContext: dial, MaxIdleConnsPerHost: 2}, Timeout: 2 * time.Second}
}

// start launches kube-proxy. Its flags keep it away from host-wide
// state: no conntrack sysctls, no OOM score change; metrics and healthz
// on the namespace's loopback.
func (k *kubeProxy) start() error {
	if k.cmd != nil {
		return errors.New("kube-proxy already running")
	}
	f, err := os.OpenFile(k.logPath, os.O_CREATE|os.O_APPEND|os.O_WRONLY, 0o644)
	if err != nil {
		return fmt.Errorf("kube-proxy log: %w", err)
	}
	defer f.Close()
	cmd := exec.Command("ip", "netns", "exec", k.node.NetNS, k.bin,
		"--proxy-mode=nftables",
		"--hostname-override="+k.node.Name,
		"--kubeconfig="+k.kubeconfig,
		"--cluster-cidr="+sandbox.ClusterCIDR,
		"--metrics-bind-address="+kubeProxyMetrics,
		"--healthz-bind-address=127.0.0.1:10256",
		"--conntrack-max-per-core=0",
		"--conntrack-tcp-timeout-established=0",
		"--conntrack-tcp-timeout-close-wait=0",
		"--oom-score-adj=0",
		"--v=2",
	)
	cmd.Stdout, cmd.Stderr = f, f
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("start kube-proxy: %w", err)
	}
	k.cmd, k.done = cmd, make(chan struct{})
	go func(done chan struct{}) { _ = cmd.Wait(); close(done) }(k.done)
	return nil
}

// stop ends kube-proxy (SIGTERM, SIGKILL after 10 s); its rules stay.
func (k *kubeProxy) stop() {
	if k.cmd == nil {
		return
	}
	_ = k.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-k.done:
	case <-time.After(10 * time.Second):
		_ = k.cmd.Process.Kill()
		<-k.done
	}
	k.cmd = nil
}

func (k *kubeProxy) running() bool {
	if k.cmd == nil {
		return false
	}
	select {
	case <-k.done:
		return false
	default:
		return true
	}
}

// nft runs nft inside the Node's namespace.
func (k *kubeProxy) nft(args ...string) (string, error) {
	out, err := exec.Command("ip", append([]string{"netns", "exec", k.node.NetNS, "nft"}, args...)...).CombinedOutput()
	if err != nil {
		return string(out), fmt.Errorf("nft %s: %w: %s", strings.Join(args, " "), err, strings.TrimSpace(string(out)))
	}
	return string(out), nil
}

// deleteTables removes kube-proxy's nftables tables (missing ones are
// fine).
func (k *kubeProxy) deleteTables() {
	_, _ = k.nft("delete", "table", "ip", "kube-proxy")
	_, _ = k.nft("delete", "table", "ip6", "kube-proxy")
}

// lastSync reads kubeproxy_sync_proxy_rules_last_timestamp_seconds for
// IPv4: when the last successful nftables transaction finished (zero
// before the first).
func (k *kubeProxy) lastSync(ctx context.Context) (time.Time, error) {
	return scrapeTimestamp(ctx, k.http, "http://"+kubeProxyMetrics+"/metrics",
		"kubeproxy_sync_proxy_rules_last_timestamp_seconds", `ip_family="IPv4"`)
}

// scrapeTimestamp reads the gauge name, a Unix time in seconds, from a
// /metrics endpoint: the first series whose line contains label (any when
// ""). It returns the zero time when there is none or it is 0. It scans the
// text and stops at the series, rather than parsing the page, because the
// benchmarks poll it every few milliseconds beside the proxy they time.
func scrapeTimestamp(ctx context.Context, c *http.Client, url, name, label string) (time.Time, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return time.Time{}, err
	}
	resp, err := c.Do(req)
	if err != nil {
		return time.Time{}, err
	}
	defer resp.Body.Close()
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 64*1024), 1024*1024)
	for sc.Scan() {
		line := sc.Text()
		if !strings.HasPrefix(line, name) || !strings.Contains(line, label) {
			continue
		}
		if rest := line[len(name):]; rest == "" || (rest[0] != ' ' && rest[0] != '{') {
			continue // another metric whose name starts with name
		}
		f := strings.Fields(line)
		v, err := strconv.ParseFloat(f[len(f)-1], 64)
		if err != nil {
			return time.Time{}, fmt.Errorf("parse %q: %w", line, err)
		}
		if v == 0 {
			return time.Time{}, nil
		}
		return time.Unix(0, int64(v*1e9)), nil
	}
	return time.Time{}, sc.Err()
}

var serviceIPsElem = regexp.MustCompile(`(\d+\.\d+\.\d+\.\d+) \. tcp \. (\d+) : goto (service-[^\s,}]+)`)

// serviceChains reads kube-proxy's service-ips map: "<ClusterIP>:<port>"
// (TCP) → the Service port's chain. Listing the map alone stays cheap at
// 10,000 Services, where listing a chain or getting one element makes nft
// fetch every rule of the table (seconds).
func (k *kubeProxy) serviceChains() (map[string]string, error) {
	out, err := k.nft("list", "map", "ip", "kube-proxy", "service-ips")
	if err != nil {
		return nil, err
	}
	m := map[string]string{}
	for _, e := range serviceIPsElem.FindAllStringSubmatch(out, -1) {
		m[e[1]+":"+e[2]] = e[3]
	}
	return m, nil
}

func svcKey(ref svcRef) string { return fmt.Sprintf("%s:%d", ref.ClusterIP, svcPort) }

// hasServices reports whether the service-ips map holds every one of refs.
func (k *kubeProxy) hasServices(refs []svcRef) bool {
	m, err := k.serviceChains()
	if err != nil {
		return false
	}
	for _, r := range refs {
		if m[svcKey(r)] == "" {
			return false
		}
	}
	return true
}

// hasEndpoint reports whether kube-proxy's chain for ref load-balances to
// ip and not to notIP (either may be "").
func (k *kubeProxy) hasEndpoint(ref svcRef, ip, notIP string) bool {
	m, err := k.serviceChains()
	if err != nil || m[svcKey(ref)] == "" {
		return false
	}
	chain := m[svcKey(ref)]
	out, err := k.nft("list", "chain", "ip", "kube-proxy", chain)
	if err != nil {
		return false
	}
	// kube-proxy v1.36 writes "dnat ip to numgen random mod N map { 0 :
	// <ip> . <port>, ... }" here, or jumps to per-endpoint chains named
	// "...__<ip>/<port>" (session affinity): either names the address.
	return (ip == "" || mentionsIP(out, ip)) && (notIP == "" || !mentionsIP(out, notIP))
}

// waitProgrammed waits until a kube-proxy sync that finished at or after
// since leaves the rules in the state ok checks, and returns that sync's
// finishing time (from kube-proxy's own metric, so the figure does not
// include the cost of listing a large nftables table).
func (k *kubeProxy) waitProgrammed(ctx context.Context, since time.Time, poll time.Duration, ok func() bool) (time.Time, error) {
	var checked time.Time
	for {
		if !k.running() {
			return time.Time{}, fmt.Errorf("kube-proxy exited; log %s:\n%s", k.logPath, tailFile(k.logPath, 20))
		}
		ts, err := k.lastSync(ctx)
		if err == nil && !ts.Before(since) && !ts.Equal(checked) {
			if ok() {
				// A sync that finished while ok ran may be the one that
				// made it true: take the later timestamp then.
				if after, err := k.lastSync(ctx); err == nil && after.After(ts) {
					ts = after
				}
				return ts, nil
			}
			checked = ts
		}
		select {
		case <-ctx.Done():
			return time.Time{}, fmt.Errorf("kube-proxy rules not programmed: %w (last sync %v, log %s)", ctx.Err(), ts, k.logPath)
		case <-time.After(poll):
		}
	}
}

// ruleCounts counts the rules and chains of table ip kube-proxy.
func (k *kubeProxy) ruleCounts() (rules, chains int, err error) {
	out, err := k.nft("-a", "list", "table", "ip", "kube-proxy")
	if err != nil {
		return 0, 0, err
	}
	for _, line := range strings.Split(out, "\n") {
		t := strings.TrimSpace(line)
		switch {
		case strings.HasPrefix(t, "chain "):
			chains++
		case strings.HasPrefix(t, "table "), strings.HasPrefix(t, "set "), strings.HasPrefix(t, "map "),
			strings.HasPrefix(t, "counter "), strings.HasPrefix(t, "flowtable "):
		case strings.Contains(t, "# handle "):
			rules++
		}
	}
	return rules, chains, nil
}

func tailFile(path string, n int) string {
	b, err := os.ReadFile(path)
	if err != nil {
		return err.Error()
	}
	lines := strings.Split(strings.TrimRight(string(b), "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}

// ---- Seine's OpenFlow tables ------------------------------------------------

// seineOF reads a Node's br-int through ovs-ofctl. Seine's Service proxy
// is recognised by the cookie category pipeline.CategoryService on the
// flows matching a ClusterIP (ip,nw_dst=<ClusterIP>), and the start round
// in bits 48..63 of the cookies tells a restarted daemon's flows from the
// previous one's.
type seineOF struct {
	mgmt string
}

func newSeineOF(n sandbox.Node) *seineOF {
	return &seineOF{mgmt: filepath.Join(n.OVSRunDir, "br-int.mgmt")}
}

func categoryFilter(c pipeline.Category) string {
	return fmt.Sprintf("cookie=0x%x/0x%x", uint64(c)<<pipeline.CookieCategoryShift, pipeline.CookieCategoryMask)
}

func roundCategoryFilter(round uint16, c pipeline.Category) string {
	v := uint64(round)<<pipeline.CookieRoundShift | uint64(c)<<pipeline.CookieCategoryShift
	return fmt.Sprintf("cookie=0x%x/0x%x", v, pipeline.CookieRoundMask|pipeline.CookieCategoryMask)
}

func (s *seineOF) ofctl(args ...string) (string, error) {
	out, err := exec.Command("ovs-ofctl", append([]string{"-O", "OpenFlow15"}, args...)...).CombinedOutput()
	if err != nil {
		return string(out), fmt.Errorf("ovs-ofctl %s: %w: %s", strings.Join(args, " "), err, strings.TrimSpace(string(out)))
	}
	return string(out), nil
}

// ofFlow is one line of dump-flows, with its cookie parsed.
type ofFlow struct {
	Cookie uint64
	Text   string
}

func (f ofFlow) Round() uint16 { return uint16(f.Cookie >> pipeline.CookieRoundShift) }

var (
	cookieRE = regexp.MustCompile(`cookie=0x([0-9a-f]+)`)
	groupRE  = regexp.MustCompile(`group:(\d+)`)
	flowCnt  = regexp.MustCompile(`flow_count=(\d+)`)
)

// flows dumps the flows matching match (ovs-ofctl flow syntax, "" for all).
func (s *seineOF) flows(match string) ([]ofFlow, error) {
	args := []string{"--no-stats", "dump-flows", s.mgmt}
	if match != "" {
		args = append(args, match)
	}
	out, err := s.ofctl(args...)
	if err != nil {
		return nil, err
	}
	var fs []ofFlow
	for _, line := range strings.Split(out, "\n") {
		line = strings.TrimSpace(line)
		if line == "" || strings.HasPrefix(line, "OFPST_") || strings.HasPrefix(line, "NXST_") {
			continue
		}
		f := ofFlow{Text: line}
		if m := cookieRE.FindStringSubmatch(line); m != nil {
			f.Cookie, _ = strconv.ParseUint(m[1], 16, 64)
		}
		fs = append(fs, f)
	}
	return fs, nil
}

// serviceFlows are the Service-category flows for a ClusterIP.
func (s *seineOF) serviceFlows(clusterIP string) ([]ofFlow, error) {
	return s.flows(categoryFilter(pipeline.CategoryService) + ",ip,nw_dst=" + clusterIP)
}

// count is the number of flows matching match (dump-aggregate).
func (s *seineOF) count(match string) (int, error) {
	out, err := s.ofctl("dump-aggregate", s.mgmt, match)
	if err != nil {
		return 0, err
	}
	m := flowCnt.FindStringSubmatch(out)
	if m == nil {
		return 0, fmt.Errorf("dump-aggregate: no flow_count in %q", out)
	}
	return strconv.Atoi(m[1])
}

// groups counts the bridge's groups.
func (s *seineOF) groups() (int, error) {
	out, err := s.ofctl("dump-groups", s.mgmt)
	if err != nil {
		return 0, err
	}
	return strings.Count(out, "group_id="), nil
}

// round is the start round of the daemon's fixed pipeline flows.
func (s *seineOF) round() (uint16, error) {
	fs, err := s.flows(categoryFilter(pipeline.CategoryPipeline))
	if err != nil {
		return 0, err
	}
	if len(fs) == 0 {
		return 0, errors.New("no pipeline flows on br-int")
	}
	r := fs[0].Round()
	for _, f := range fs {
		if f.Round() > r || r-f.Round() > 0x8000 { // newest, modulo wrap
			r = f.Round()
		}
	}
	return r, nil
}

// serviceState is what Seine programmed for a ClusterIP: every flow that
// shares its cookie with one of the ClusterIP's Service flows (the cookie's
// object ID names the Service port, so this takes in the endpoint flows,
// which do not match on the ClusterIP) and the groups those flows send to.
// It returns the text and the cookies, for cheaper polls with cookieText.
func (s *seineOF) serviceState(clusterIP string) (string, []uint64, error) {
	fs, err := s.serviceFlows(clusterIP)
	if err != nil {
		return "", nil, err
	}
	var cookies []uint64
	seen := map[uint64]bool{}
	for _, f := range fs {
		if !seen[f.Cookie] {
			seen[f.Cookie] = true
			cookies = append(cookies, f.Cookie)
		}
	}
	txt, err := s.cookieText(cookies)
	return txt, cookies, err
}

// cookieText dumps the flows with exactly these cookies and the groups
// they send to.
func (s *seineOF) cookieText(cookies []uint64) (string, error) {
	var sb strings.Builder
	var gids []string
	seen := map[string]bool{}
	for _, c := range cookies {
		fs, err := s.flows(fmt.Sprintf("cookie=0x%x/-1", c))
		if err != nil {
			return "", err
		}
		for _, f := range fs {
			sb.WriteString(f.Text + "\n")
			for _, m := range groupRE.FindAllStringSubmatch(f.Text, -1) {
				if !seen[m[1]] {
					seen[m[1]] = true
					gids = append(gids, m[1])
				}
			}
		}
	}
	for _, g := range gids {
		out, err := s.ofctl("dump-groups", s.mgmt, g)
		if err != nil {
			return "", err
		}
		sb.WriteString(out)
	}
	return sb.String(), nil
}

// mentionsIP reports whether OpenFlow text refers to ip, dotted
// (ct(nat(dst=...)), set_field:...->ip_dst) or as a 32-bit hex immediate
// (set_field:0x...->reg).
func mentionsIP(text, ip string) bool {
	if regexp.MustCompile(`(^|[^0-9.])` + regexp.QuoteMeta(ip) + `($|[^0-9])`).MatchString(text) {
		return true
	}
	a := net.ParseIP(ip).To4()
	if a == nil {
		return false
	}
	hex := fmt.Sprintf("0x%x", uint32(a[0])<<24|uint32(a[1])<<16|uint32(a[2])<<8|uint32(a[3]))
	return regexp.MustCompile(regexp.QuoteMeta(hex) + `($|[^0-9a-fx])`).MatchString(text)
}
