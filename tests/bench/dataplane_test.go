package bench

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"

	"github.com/seine-net/seine/datapath/rxbuf"
	"github.com/seine-net/seine/node/info"
	"github.com/seine-net/seine/tests/bench/stats"
	"github.com/seine-net/seine/tests/sandbox"
	"github.com/seine-net/seine/tests/sandbox/echo"
)

// The data-plane benchmark (issue: the data plane at the speed of its
// datapath). Every path is measured the same way, between two network
// namespaces, dpRepeats times (medians reported): TCP throughput with
// iperf3 (one stream, and dpStreams streams, dpSeconds each) and
// request/response latency with tcprr (tests/cmd/tcprr: 64-byte ping-pong
// over one connection, half a round trip, p50 and p99).
const (
	// dpRepeats is how often each path is measured; the figures are the
	// medians (the machine is shared and noisy).
	dpRepeats = 3
	dpSeconds = 4
	dpStreams = 4
	// dpInterleaveRounds is how many rounds the interleaved one-Node
	// comparison takes (one one-stream run of each path per round).
	dpInterleaveRounds = 7
	// dpRRSeconds is how long tcprr measures.
	dpRRSeconds = 3
	// dpPolicies is the number of NetworkPolicies of the "with policies"
	// paths.
	dpPolicies = 1000
)

// dpResult is one path's figures.
type dpResult struct {
	Gbps, GbpsMany float64 // one stream, dpStreams streams
	P50, P99       float64 // µs, half a round trip
	// Datapath counters of the Seine paths, from the server's Node during
	// the one-stream run (dpif-netdev/pmd-stats-show, dpctl/dump-flows).
	Megaflows       int
	SubtablesPerHit float64
}

// BenchmarkDataplane measures, in one run: a veth pair; a bare OVS netdev
// bridge (one NORMAL flow, AF_PACKET ports) in Seine's old configuration
// (no userspace TSO, transmit checksum offload off on the veths) and in
// its fastest (userspace TSO, offloads on, the 4 MiB socket receive buffer
// seine keeps), the fastest with the kernel's default receive buffer, and
// the fastest again with as many ports as Seine's server Node polls; two
// bare bridges in two
// namespaces joined by a kernel VXLAN device on each, with userspace TSO
// (the fastest two-bridge topology), their Nodes joined by one veth pair
// and again, as the sandbox joins its Nodes, through a Linux bridge
// (bare2-vxlan-bridged); and Seine on a 2-Node sandbox in its default
// configuration (VXLAN through the kernel device with this datapath): Pod
// to Pod on one Node and across Nodes (also on the bare pair's wire: a
// direct veth between the Nodes, see BenchmarkCrossNodeLink), the same
// through a Service's ClusterIP, and the same with 1,000 NetworkPolicies
// selecting the server Pod (against one Node measured again just before
// as their baseline); and, the figures least moved by the machine's
// background, the one-Node ratios once more with the fastest bare bridge
// and Seine taking turns (same/bare-fast-interleaved-Gbps; the latency
// paired, both paths in one tcprr run alternating round trips:
// same/bare-fast-paired-p50, the median of the rounds' ratios; and
// paired against the bare bridge with as many polled ports as the server's
// Node, same/bare-fast-ports-paired-p50, and with one port fewer,
// same/bare-fast-ports-less-one-paired-p50), and the policies' cost with
// the server they select and a Pod beside it that none selects, the same
// way, before and after the policies are made
// (1000np-{same,cross-vxlan}-interleaved-Gbps-cost: one less the selected
// Pod's throughput ratio to the plain one, and -unselected-Gbps-ratio, the
// same ratio before the policies; 1000np-{same,cross-vxlan}-paired-p50-cost:
// the change of the selected Pod's p50 ratio to the plain one, and
// -unselected-p50-ratio before). Last, Geneve
// across Nodes (set explicitly; OVS's userspace tunnel port), to the Pod
// that no policy selects, the policies still installed and the transport
// bridge just made: its figure does not compare with runs that measured
// Geneve first, on a fresh sandbox.
// Metrics per path: <path>-Gbps
// (one stream), <path>-Gbps-P4, <path>-p50-us and <path>-p99-us, and the
// ratios the targets name.
func BenchmarkDataplane(b *testing.B) {
	if os.Geteuid() != 0 {
		b.Skip("needs root")
	}
	rr := buildTCPRR(b)
	res := map[string]dpResult{}
	report := func(path string, r dpResult) {
		res[path] = r
		b.ReportMetric(r.Gbps, path+"-Gbps")
		b.ReportMetric(r.GbpsMany, path+"-Gbps-P"+strconv.Itoa(dpStreams))
		b.ReportMetric(r.P50, path+"-p50-us")
		b.ReportMetric(r.P99, path+"-p99-us")
		if r.Megaflows > 0 {
			b.ReportMetric(float64(r.Megaflows), path+"-megaflows")
			b.ReportMetric(r.SubtablesPerHit, path+"-subtables/hit")
		}
		b.Logf("%-22s %6.2f Gbit/s  %6.2f Gbit/s (%d streams)  p50 %6.1f µs  p99 %6.1f µs  megaflows %d  subtables/hit %.2f",
			path, r.Gbps, r.GbpsMany, dpStreams, r.P50, r.P99, r.Megaflows, r.SubtablesPerHit)
	}
	for i := 0; i < b.N; i++ {
		if os.Getenv("SEINE_BENCH_ONLY_BARE2") != "" {
			report("bare2-vxlan", twoBridgesPath(b, rr, false))
			report("bare2-vxlan-bridged", twoBridgesPath(b, rr, true))
			continue
		}
		// The sandbox first: its control plane, kubelets and daemons run
		// (mostly idle) during every measurement, the bare ones included,
		// so all paths share the same background on this 2-core machine.
		// The default configuration first (VXLAN with this datapath),
		// Geneve at the end.
		c := up(b, "bdp", 2, nil)
		nodes := c.Nodes()
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Minute)
		mk := func(name, node, role string) (netnsName, ip string) { return perfPod(ctx, b, c, name, node, role) }
		srvNS, srvIP := mk("server", nodes[0].Name, "server")
		localNS, _ := mk("local", nodes[0].Name, "client")
		remoteNS, _ := mk("remote", nodes[1].Name, "client")
		vip := createPerfService(ctx, b, c)
		srvNode := nodes[0]
		// Bare topologies, each torn down before the next. The main thread
		// of a userspace ovs-vswitchd reads every AF_PACKET and tap port of
		// every bridge in each iteration of its loop (OVS 3.1 dpif-netdev,
		// non-PMD ports), so the number of ports alone costs throughput:
		// bare-fast-ports polls as many as the server's Node: its own
		// bridge port and the measured pair, and idle ones for the rest.
		report("veth", vethPath(b, rr))
		report("bare-old", bareBridgePath(b, rr, bareBridge{}))
		report("bare-fast", bareBridgePath(b, rr, bareBridge{Fast: true}))
		report("bare-fast-rmem208k", bareBridgePath(b, rr, bareBridge{Fast: true, RcvBuf: kernelRcvBuf}))
		polled := polledPorts(b, srvNode)
		b.ReportMetric(float64(polled), "seine-node-polled-ports")
		report("bare-fast-ports", bareBridgePath(b, rr, bareBridge{Fast: true, IdlePorts: polled - 3}))
		report("bare2-vxlan", twoBridgesPath(b, rr, false))
		report("bare2-vxlan-bridged", twoBridgesPath(b, rr, true))

		seine := func(client, dst string) dpResult {
			return measurePath(b, rr, srvNS, client, dst, &srvNode)
		}
		report("seine-same", seine(localNS, srvIP))
		// The one-Node ratio again, interleaved: the fastest bare bridge
		// stays up beside the sandbox and the two paths take turns, one
		// one-stream run each per round, so both see the same drift of
		// the machine's background.
		// The latencies are measured paired: one tcprr run alternating
		// round trips between the two paths.
		same := rrEnds{srvNS, localNS, srvIP}
		t := withBare(b, bareBridge{Fast: true}, same, func(a, z rrEnds) pairedTurns { return takePairedTurns(b, rr, a, z) })
		b.ReportMetric(stats.Median(t.zGbps), "bare-fast-interleaved-Gbps")
		b.ReportMetric(stats.Median(t.aGbps), "seine-same-interleaved-Gbps")
		b.ReportMetric(t.gbpsRatio(), "same/bare-fast-interleaved-Gbps")
		b.ReportMetric(stats.Median(t.zP50), "bare-fast-paired-p50-us")
		b.ReportMetric(stats.Median(t.aP50), "seine-same-paired-p50-us")
		b.ReportMetric(stats.Median(t.p50Ratios), "same/bare-fast-paired-p50")
		b.Logf("interleaved, %d rounds: bare %v Gbit/s, Seine %v Gbit/s; paired p50 bare %v µs, Seine %v µs, ratios %v",
			dpInterleaveRounds, t.zGbps, t.aGbps, t.zP50, t.aP50, t.p50Ratios)
		ratios := func(a, z rrEnds) []float64 { return pairedRatios(b, rr, a, z) }
		// The same latency against the bare bridge with as many polled
		// ports as the server's Node: what is left is the pipeline's.
		portsRatios := withBare(b, bareBridge{Fast: true, IdlePorts: polled - 3}, same, ratios)
		b.ReportMetric(stats.Median(portsRatios), "same/bare-fast-ports-paired-p50")
		b.Logf("paired against the bare bridge with %d polled ports, %d rounds: p50 ratios %v", polled, dpInterleaveRounds, portsRatios)
		// And against one port fewer than the Node polls.
		fewerRatios := withBare(b, bareBridge{Fast: true, IdlePorts: polled - 4}, same, ratios)
		b.ReportMetric(stats.Median(fewerRatios), "same/bare-fast-ports-less-one-paired-p50")
		b.Logf("paired against the bare bridge with %d polled ports, %d rounds: p50 ratios %v", polled-1, dpInterleaveRounds, fewerRatios)
		report("seine-svc-same", seine(localNS, vip))
		report("seine-cross-vxlan", seine(remoteNS, srvIP))
		// The same on the bare pair's wire (BenchmarkCrossNodeLink): a
		// direct veth between the two Nodes carries the tunnel traffic.
		link := directLink(b, nodes[0], nodes[1])
		link.route(b, true)
		waitReachable(ctx, b, c, remoteNS, srvIP)
		before := link.rxBytes(b)
		report("seine-cross-vxlan-direct", seine(remoteNS, srvIP))
		if got := link.rxBytes(b) - before; got < 1<<30 {
			b.Fatalf("the direct link received %d bytes while it was measured: the tunnel traffic did not take it", got)
		}
		if err := link.del(); err != nil {
			b.Fatal(err) // the paths after this one would run on it
		}
		waitReachable(ctx, b, c, remoteNS, srvIP)
		report("seine-svc-cross-vxlan", seine(remoteNS, vip))
		// A second server on the server's Node that no policy selects: the
		// interleaved baseline of the policies' cost. Made only now: until
		// here the server's Node holds the two Pods of the one-Node path
		// and nothing more, as the bare bridge holds its two namespaces
		// (every port costs the userspace datapath a read per turn).
		plainNS, plainIP := mk("plain", nodes[0].Name, "plain")
		// The policies' baseline on one Node: the same configuration
		// (VXLAN), measured just before they are created.
		report("seine-same-vxlan", seine(localNS, srvIP))
		// The policies' cost again, the server they select and the plain
		// Pod beside it in the same state of the Node and of the machine:
		// their throughput taking turns, their latency paired. Each
		// comparison is made before the policies too. The latency cost is
		// the change of the ratio: two Pods of one Node differ by up to a
		// tenth in latency with no policy at all (ovs-vswitchd reads its
		// ports in the order of their datapath port numbers' hashes, and
		// a port read later in each turn waits longer).
		froms := []struct{ path, client string }{{"same", localNS}, {"cross-vxlan", remoteNS}}
		unselected := map[string]pairedTurns{}
		for _, from := range froms {
			unselected[from.path] = takePairedTurns(b, rr, rrEnds{srvNS, from.client, srvIP}, rrEnds{plainNS, from.client, plainIP})
		}

		createPerfPolicies(ctx, b, c, srvNode)
		report("seine-same-1000np", seine(localNS, srvIP))
		report("seine-cross-vxlan-1000np", seine(remoteNS, srvIP))
		for _, from := range froms {
			after := takePairedTurns(b, rr, rrEnds{srvNS, from.client, srvIP}, rrEnds{plainNS, from.client, plainIP})
			was := unselected[from.path]
			name := "1000np-" + from.path
			// Throughput: the selected Pod's ratio to the plain one with the
			// policies, as before; the ratio without them is reported
			// beside it, to show how far the method itself moves.
			b.ReportMetric(1-after.gbpsRatio(), name+"-interleaved-Gbps-cost")
			b.ReportMetric(was.gbpsRatio(), name+"-unselected-Gbps-ratio")
			b.ReportMetric(stats.Median(after.p50Ratios)/stats.Median(was.p50Ratios)-1, name+"-paired-p50-cost")
			b.ReportMetric(stats.Median(was.p50Ratios), name+"-unselected-p50-ratio")
			b.Logf("%s, %d rounds each, selected against not selected: before the policies %.2f against %.2f Gbit/s, p50 ratios %.3f; with them %.2f against %.2f Gbit/s, p50 ratios %.3f",
				name, dpInterleaveRounds, stats.Median(was.aGbps), stats.Median(was.zGbps), was.p50Ratios,
				stats.Median(after.aGbps), stats.Median(after.zGbps), after.p50Ratios)
		}

		// Geneve: OVS's userspace tunnel port (through the segmentation
		// port), to the server no policy selects.
		for _, n := range nodes {
			if err := c.StopSeine(n.Name); err != nil {
				b.Fatal(err)
			}
			if err := c.StartSeine(ctx, n.Name, map[string]string{"tunnelType": "geneve"}); err != nil {
				b.Fatal(err)
			}
		}
		waitReachable(ctx, b, c, remoteNS, plainIP)
		report("seine-cross-geneve", measurePath(b, rr, plainNS, remoteNS, plainIP, &srvNode))
		cancel()

		fast := res["bare-fast"]
		ratio := func(name string, v float64) { b.ReportMetric(v, name) }
		ratio("same/bare-fast-Gbps", res["seine-same"].Gbps/fast.Gbps)
		ratio("same/bare-fast-ports-Gbps", res["seine-same"].Gbps/res["bare-fast-ports"].Gbps)
		ratio("same/bare-fast-p50", res["seine-same"].P50/fast.P50)
		ratio("cross-vxlan/bare2-Gbps", res["seine-cross-vxlan"].Gbps/res["bare2-vxlan"].Gbps)
		ratio("cross-vxlan/bare2-bridged-Gbps", res["seine-cross-vxlan"].Gbps/res["bare2-vxlan-bridged"].Gbps)
		ratio("cross-vxlan-direct/bare2-Gbps", res["seine-cross-vxlan-direct"].Gbps/res["bare2-vxlan"].Gbps)
		ratio("cross-vxlan-direct/bare2-Gbps-P"+strconv.Itoa(dpStreams), res["seine-cross-vxlan-direct"].GbpsMany/res["bare2-vxlan"].GbpsMany)
		ratio("cross-geneve/bare2-Gbps", res["seine-cross-geneve"].Gbps/res["bare2-vxlan"].Gbps)
		ratio("1000np-same-Gbps-cost", 1-res["seine-same-1000np"].Gbps/res["seine-same-vxlan"].Gbps)
		ratio("1000np-cross-Gbps-cost", 1-res["seine-cross-vxlan-1000np"].Gbps/res["seine-cross-vxlan"].Gbps)
		ratio("1000np-same-p50-cost", res["seine-same-1000np"].P50/res["seine-same-vxlan"].P50-1)
	}
}

// buildTCPRR builds tests/cmd/tcprr into a temporary directory.
func buildTCPRR(b *testing.B) string {
	b.Helper()
	out := filepath.Join(b.TempDir(), "tcprr")
	cmd := exec.Command("go", "build", "-o", out, "./tests/cmd/tcprr")
	cmd.Dir = repoRoot()
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	if o, err := cmd.CombinedOutput(); err != nil {
		b.Fatalf("building tcprr: %v\n%s", err, o)
	}
	return out
}

// sh runs a command and fails the benchmark on error.
func sh(b *testing.B, argv ...string) string {
	b.Helper()
	out, err := exec.Command(argv[0], argv[1:]...).CombinedOutput()
	if err != nil {
		b.Fatalf("%s: %v\n%s", strings.Join(argv, " "), err, out)
	}
	return string(out)
}

// measurePath measures one path from clientNS to dst (a server in
// serverNS). With node set, it also reads the datapath counters of that
// Node's ovs-vswitchd over the one-stream run.
func measurePath(b *testing.B, rr, serverNS, clientNS, dst string, node *sandbox.Node) dpResult {
	b.Helper()
	var r dpResult
	var one, many, p50, p99 []float64
	for i := 0; i < dpRepeats; i++ {
		if node != nil && i == 0 {
			appctl(b, *node, "dpif-netdev/pmd-stats-clear")
		}
		one = append(one, iperf3Run(b, serverNS, clientNS, dst, 1))
		if node != nil && i == 0 {
			r.SubtablesPerHit = subtablesPerHit(appctl(b, *node, "dpif-netdev/pmd-stats-show"))
			r.Megaflows = strings.Count(appctl(b, *node, "dpctl/dump-flows"), "\n")
		}
		many = append(many, iperf3Run(b, serverNS, clientNS, dst, dpStreams))
		a, z := tcprrRun(b, rr, serverNS, clientNS, dst)
		p50, p99 = append(p50, a), append(p99, z)
	}
	r.Gbps, r.GbpsMany, r.P50, r.P99 = stats.Median(one), stats.Median(many), stats.Median(p50), stats.Median(p99)
	return r
}

func appctl(b *testing.B, n sandbox.Node, args ...string) string {
	b.Helper()
	return sh(b, append([]string{"ovs-appctl", "-t", filepath.Join(n.OVSRunDir, "ovs-vswitchd.ctl")}, args...)...)
}

var subtablesRE = regexp.MustCompile(`avg\. subtable lookups per megaflow hit: ([0-9.]+)`)

func subtablesPerHit(stats string) float64 {
	m := subtablesRE.FindStringSubmatch(stats)
	if m == nil {
		return 0
	}
	v, _ := strconv.ParseFloat(m[1], 64)
	return v
}

// iperf3Run runs iperf3 for dpSeconds with the given number of parallel
// streams and returns the received throughput in Gbit/s.
func iperf3Run(b *testing.B, serverNS, clientNS, dst string, streams int) float64 {
	b.Helper()
	gbps, _ := iperf3Transfer(b, serverNS, clientNS, dst, streams)
	return gbps
}

// iperf3Transfer is iperf3Run returning the bytes received too.
func iperf3Transfer(b *testing.B, serverNS, clientNS, dst string, streams int) (gbps, bytes float64) {
	b.Helper()
	srv := exec.Command("ip", "netns", "exec", serverNS, "iperf3", "-s", "-1", "-p", "5201")
	if err := srv.Start(); err != nil {
		b.Fatal(err)
	}
	defer func() { _ = srv.Process.Kill(); _ = srv.Wait() }()
	var out []byte
	var err error
	for try := 0; try < 20; try++ {
		time.Sleep(200 * time.Millisecond)
		out, err = exec.Command("ip", "netns", "exec", clientNS, "iperf3", "-c", dst, "-p", "5201",
			"-t", strconv.Itoa(dpSeconds), "-P", strconv.Itoa(streams), "-J").Output()
		if err == nil {
			break
		}
	}
	if err != nil {
		b.Fatalf("iperf3 %s -> %s: %v\n%s", clientNS, dst, err, out)
	}
	var r struct {
		End struct {
			SumReceived struct {
				BitsPerSecond float64 `json:"bits_per_second"`
				Bytes         float64 `json:"bytes"`
			} `json:"sum_received"`
		} `json:"end"`
	}
	if err := json.Unmarshal(out, &r); err != nil {
		b.Fatal(err)
	}
	return r.End.SumReceived.BitsPerSecond / 1e9, r.End.SumReceived.Bytes
}

// tcprrRun runs tcprr for dpRRSeconds and returns p50 and p99 in µs.
func tcprrRun(b *testing.B, rr, serverNS, clientNS, dst string) (p50, p99 float64) {
	b.Helper()
	out := tcprrClient(b, rr, []string{serverNS}, clientNS, "-connect", dst+":5301")
	var r struct {
		P50 float64 `json:"p50us"`
		P99 float64 `json:"p99us"`
	}
	if err := json.Unmarshal(out, &r); err != nil {
		b.Fatalf("tcprr output %q: %v", out, err)
	}
	return r.P50, r.P99
}

// rrEnds is one path of a paired tcprr run: a server in serverNS reached
// at dst from clientNS.
type rrEnds struct{ serverNS, clientNS, dst string }

// pairedRR is what one paired tcprr run gives: each path's p50 in µs and
// the ratio of a's to z's, from the same seconds.
type pairedRR struct{ A, Z, Ratio float64 }

// tcprrPair runs tcprr for dpRRSeconds on paths a and z at once, one round
// trip on each in turn (tcprr -against), so that the two medians share the
// machine's every moment: on this 2-core VM two tcprr runs seconds apart
// differ by more (70–107 µs for one path, 2026-11-27) than the floors the
// ratios are read against.
func tcprrPair(b *testing.B, rr string, a, z rrEnds) pairedRR {
	b.Helper()
	out := tcprrClient(b, rr, []string{a.serverNS, z.serverNS}, a.clientNS, "-connect", a.dst+":5301",
		"-against", z.dst+":5301", "-against-netns", "/run/netns/"+z.clientNS)
	var r struct {
		P50     float64 `json:"p50us"`
		Against struct {
			P50 float64 `json:"p50us"`
		} `json:"against"`
		Ratio float64 `json:"p50Ratio"`
	}
	if err := json.Unmarshal(out, &r); err != nil || r.Ratio == 0 {
		b.Fatalf("tcprr output %q: %v", out, err)
	}
	return pairedRR{A: r.P50, Z: r.Against.P50, Ratio: r.Ratio}
}

// tcprrClient starts a tcprr server on port 5301 in each of serverNSs,
// then runs the tcprr client with args for dpRRSeconds in clientNS, trying
// again while the servers come up, and returns what the client printed.
// The servers go when it returns.
func tcprrClient(b *testing.B, rr string, serverNSs []string, clientNS string, args ...string) []byte {
	b.Helper()
	for _, ns := range serverNSs {
		srv := exec.Command("ip", "netns", "exec", ns, rr, "-listen", "0.0.0.0:5301")
		if err := srv.Start(); err != nil {
			b.Fatal(err)
		}
		defer func() { _ = srv.Process.Kill(); _ = srv.Wait() }()
	}
	var out bytes.Buffer
	var err error
	for try := 0; try < 20; try++ {
		time.Sleep(200 * time.Millisecond)
		out.Reset()
		cmd := exec.Command("ip", append(append([]string{"netns", "exec", clientNS, rr}, args...),
			"-duration", strconv.Itoa(dpRRSeconds)+"s")...)
		cmd.Stdout = &out
		if err = cmd.Run(); err == nil {
			return out.Bytes()
		}
	}
	b.Fatalf("tcprr in %s %v: %v", clientNS, args, err)
	return nil
}

// vethPath is a veth pair between two namespaces.
func vethPath(b *testing.B, rr string) dpResult {
	b.Helper()
	client, server, dst, down := vethPair(b)
	defer down()
	return measurePath(b, rr, server, client, dst, nil)
}

func delNetns(names ...string) {
	for _, n := range names {
		_ = exec.Command("ip", "netns", "del", n).Run()
	}
}

// bareOVS starts ovsdb-server and ovs-vswitchd (userspace datapath) in
// netns with their files in a fresh directory, userspace TSO as given; the
// daemons are stopped by stop (and by b.Cleanup).
type bareOVS struct {
	dir string
}

func startBareOVS(b *testing.B, netnsName string, tso bool) *bareOVS {
	b.Helper()
	dir, err := os.MkdirTemp("", "seine-bdp-ovs-")
	if err != nil {
		b.Fatal(err)
	}
	o := &bareOVS{dir: dir}
	b.Cleanup(o.stop)
	db, sock := filepath.Join(dir, "conf.db"), filepath.Join(dir, "db.sock")
	// Every runtime file, the bridges' OpenFlow sockets included, in dir.
	env := append(os.Environ(), "OVS_RUNDIR="+dir, "OVS_DBDIR="+dir, "OVS_LOGDIR="+dir)
	for _, argv := range [][]string{
		{"ovsdb-tool", "create", db, "/usr/share/openvswitch/vswitch.ovsschema"},
		{"ip", "netns", "exec", netnsName, "ovsdb-server", db, "--remote=punix:" + sock,
			"--unixctl=" + filepath.Join(dir, "ovsdb-server.ctl"), "--pidfile=" + filepath.Join(dir, "ovsdb-server.pid"),
			"--log-file=" + filepath.Join(dir, "ovsdb-server.log"), "--detach"},
		{"ovs-vsctl", "--db=unix:" + sock, "--no-wait", "init", "--", "set", "Open_vSwitch", ".",
			"other_config:userspace-tso-enable=" + strconv.FormatBool(tso)},
		{"ip", "netns", "exec", netnsName, "ovs-vswitchd", "unix:" + sock,
			"--unixctl=" + filepath.Join(dir, "ovs-vswitchd.ctl"), "--pidfile=" + filepath.Join(dir, "ovs-vswitchd.pid"),
			"--log-file=" + filepath.Join(dir, "ovs-vswitchd.log"), "--disable-system", "--detach"},
	} {
		cmd := exec.Command(argv[0], argv[1:]...)
		cmd.Env = env
		if out, err := cmd.CombinedOutput(); err != nil {
			b.Fatalf("%s: %v\n%s", strings.Join(argv, " "), err, out)
		}
	}
	return o
}

func (o *bareOVS) vsctl(b *testing.B, args ...string) {
	b.Helper()
	sh(b, append([]string{"ovs-vsctl", "--db=unix:" + filepath.Join(o.dir, "db.sock"), "--timeout=10"}, args...)...)
}

func (o *bareOVS) ofctl(b *testing.B, args ...string) {
	b.Helper()
	sh(b, append([]string{"ovs-ofctl", "-O", "OpenFlow13"}, args...)...)
}

// mgmt returns the bridge's OpenFlow socket once ovs-vswitchd created it.
func (o *bareOVS) mgmt(b *testing.B, bridge string) string {
	b.Helper()
	p := filepath.Join(o.dir, bridge+".mgmt")
	for i := 0; i < 100; i++ {
		if _, err := os.Stat(p); err == nil {
			return p
		}
		time.Sleep(100 * time.Millisecond)
	}
	b.Fatalf("%s did not appear; ovs-vswitchd.log:\n%s", p, tailFile(filepath.Join(o.dir, "ovs-vswitchd.log"), 20))
	return ""
}

func (o *bareOVS) stop() {
	for _, d := range []string{"ovs-vswitchd", "ovsdb-server"} {
		if pid, err := os.ReadFile(filepath.Join(o.dir, d+".pid")); err == nil {
			_ = exec.Command("kill", strings.TrimSpace(string(pid))).Run()
		}
	}
	time.Sleep(300 * time.Millisecond)
	_ = os.RemoveAll(o.dir)
}

// polledPorts counts the interfaces that the Node's ovs-vswitchd reads in
// its main loop: every interface of every bridge, each bridge's own
// internal interface included, but OVS's own tunnel ports (virtual, fed by
// the other ports) and patch ports.
func polledPorts(b *testing.B, n sandbox.Node) int {
	b.Helper()
	out := vsctl(b, n, "--format=csv", "--no-headings", "--columns=type", "list", "Interface")
	count := 0
	for _, typ := range strings.Fields(out) {
		switch strings.Trim(typ, `"`) {
		case "geneve", "vxlan", "gre", "stt", "patch":
		default:
			count++
		}
	}
	return count
}

// bareBridge configures bareBridgePath.
type bareBridge struct {
	// Fast: userspace TSO and the veths' offloads left on; else Seine's
	// old configuration: no userspace TSO, transmit checksum offload off on
	// both ends of each veth (as podnet did).
	Fast bool
	// IdlePorts more ports (veth ends whose peers are up but silent) join
	// the bridge.
	IdlePorts int
	// MTU of the two veth pairs; 0 keeps the kernel's 1500.
	MTU int
	// RcvBuf is the net.core.rmem_default, in bytes, in force while the
	// bridge's ports are added: the receive buffer of their AF_PACKET
	// sockets (datapath/rxbuf). 0: what seine keeps with the netdev
	// datapath (rxbuf.DefaultMin); the old configuration always has the
	// kernel's default (kernelRcvBuf), which seine left alone.
	RcvBuf int
	// Flows replace the bridge's NORMAL flow (ovs-ofctl add-flow syntax,
	// OpenFlow 1.5). The two measured ports are ofports 1 and 2; their
	// namespaces' addresses are 198.18.101.1 and .2 with MACs
	// 0e:00:00:00:00:01 and :02.
	Flows []string
}

// bareBridgePath is one netdev bridge between two namespaces, with one
// NORMAL flow unless cfg says otherwise.
func bareBridgePath(b *testing.B, rr string, cfg bareBridge) dpResult {
	b.Helper()
	client, server, dst, down := bareBridgeUp(b, cfg)
	defer down()
	return measurePath(b, rr, server, client, dst, nil)
}

// bareBridgeUp builds bareBridgePath's bridge and returns the client's and
// the server's namespaces, the server's address, and a function that tears
// it all down.
func bareBridgeUp(b *testing.B, cfg bareBridge) (client, server, dst string, down func()) {
	b.Helper()
	sw, c1, c2 := "seine-bdp-sw", "seine-bdp-c1", "seine-bdp-c2"
	for _, n := range []string{sw, c1, c2} {
		netns(b, n)
		sh(b, "ip", "-n", n, "link", "set", "lo", "up")
	}
	rcvbuf := cfg.RcvBuf
	switch {
	case !cfg.Fast:
		rcvbuf = kernelRcvBuf
	case rcvbuf == 0:
		rcvbuf = rxbuf.DefaultMin
	}
	restoreRcvBuf := withRcvBuf(b, rcvbuf)
	defer restoreRcvBuf() // the ports' sockets have it once they are added
	o := startBareOVS(b, sw, cfg.Fast)
	o.vsctl(b, "add-br", "br0", "--", "set", "bridge", "br0", "datapath_type=netdev",
		"protocols=OpenFlow10,OpenFlow13,OpenFlow15")
	for i, c := range []string{c1, c2} {
		p := fmt.Sprintf("p%d", i+1)
		sh(b, "ip", "-n", sw, "link", "add", p, "type", "veth", "peer", "name", "eth0", "netns", c)
		sh(b, "ip", "-n", c, "addr", "add", fmt.Sprintf("198.18.101.%d/24", i+1), "dev", "eth0")
		sh(b, "ip", "-n", c, "link", "set", "eth0", "address", fmt.Sprintf("0e:00:00:00:00:%02x", i+1))
		sh(b, "ip", "-n", c, "neigh", "replace", fmt.Sprintf("198.18.101.%d", 2-i), "lladdr",
			fmt.Sprintf("0e:00:00:00:00:%02x", 2-i), "dev", "eth0")
		if !cfg.Fast {
			sh(b, "ip", "netns", "exec", sw, "ethtool", "-K", p, "tx", "off")
			sh(b, "ip", "netns", "exec", c, "ethtool", "-K", "eth0", "tx", "off")
		}
		if cfg.MTU != 0 {
			sh(b, "ip", "-n", sw, "link", "set", p, "mtu", strconv.Itoa(cfg.MTU))
			sh(b, "ip", "-n", c, "link", "set", "eth0", "mtu", strconv.Itoa(cfg.MTU))
		}
		sh(b, "ip", "-n", sw, "link", "set", p, "up")
		sh(b, "ip", "-n", c, "link", "set", "eth0", "up")
		o.vsctl(b, "add-port", "br0", p, "--", "set", "interface", p, fmt.Sprintf("ofport_request=%d", i+1))
	}
	for i := range cfg.IdlePorts {
		p := fmt.Sprintf("idle%d", i)
		sh(b, "ip", "-n", sw, "link", "add", p, "type", "veth", "peer", "name", p+"-peer")
		sh(b, "ip", "-n", sw, "link", "set", p, "up")
		sh(b, "ip", "-n", sw, "link", "set", p+"-peer", "up")
		o.vsctl(b, "add-port", "br0", p)
	}
	if cfg.Flows != nil {
		mgmt := o.mgmt(b, "br0")
		sh(b, "ovs-ofctl", "-O", "OpenFlow15", "del-flows", mgmt)
		for _, f := range cfg.Flows {
			sh(b, "ovs-ofctl", "-O", "OpenFlow15", "add-flow", mgmt, f)
		}
	}
	return c1, c2, "198.18.101.2", func() {
		o.stop()
		delNetns(sw, c1, c2)
	}
}

// turns are the series of an interleaved comparison: one-stream
// throughput in Gbit/s and tcprr's p50 in µs, one entry per round.
type turns struct {
	Gbps, P50 []float64
}

// pairedTurns is a comparison of two paths a and z taken in rounds: each
// round one one-stream iperf3 run of a, one of z, then one paired tcprr
// run of the two (tcprrPair). One entry per round.
type pairedTurns struct {
	aGbps, zGbps []float64
	aP50, zP50   []float64 // µs
	p50Ratios    []float64 // a's p50 over z's, from the same seconds
}

func (t pairedTurns) gbpsRatio() float64 { return stats.Median(t.aGbps) / stats.Median(t.zGbps) }

// takePairedTurns takes dpInterleaveRounds rounds of pairedTurns.
func takePairedTurns(b *testing.B, rr string, a, z rrEnds) pairedTurns {
	b.Helper()
	var t pairedTurns
	for range dpInterleaveRounds {
		t.aGbps = append(t.aGbps, iperf3Run(b, a.serverNS, a.clientNS, a.dst, 1))
		t.zGbps = append(t.zGbps, iperf3Run(b, z.serverNS, z.clientNS, z.dst, 1))
		p := tcprrPair(b, rr, a, z)
		t.aP50, t.zP50, t.p50Ratios = append(t.aP50, p.A), append(t.zP50, p.Z), append(t.p50Ratios, p.Ratio)
	}
	return t
}

// withBare brings up a bare bridge of cfg beside path other and returns
// f's result for the two, the bare bridge as z.
func withBare[T any](b *testing.B, cfg bareBridge, other rrEnds, f func(other, bare rrEnds) T) T {
	b.Helper()
	bc, bs, bdst, down := bareBridgeUp(b, cfg)
	defer down()
	return f(other, rrEnds{bs, bc, bdst})
}

// pairedRatios takes dpInterleaveRounds paired tcprr runs of a against z
// and returns each run's p50 ratio.
func pairedRatios(b *testing.B, rr string, a, z rrEnds) []float64 {
	b.Helper()
	var ratios []float64
	for range dpInterleaveRounds {
		ratios = append(ratios, tcprrPair(b, rr, a, z).Ratio)
	}
	return ratios
}

// kernelRcvBuf is the kernel's default net.core.rmem_default (212992
// bytes on 64-bit Linux), which seine left alone before it kept
// rxbuf.DefaultMin.
const kernelRcvBuf = 212992

// withRcvBuf sets the host's net.core.rmem_default to v bytes (lower too)
// and returns a function that puts back the value it found. Sockets take
// the value when they are created.
func withRcvBuf(b *testing.B, v int) func() {
	b.Helper()
	orig, err := rxbuf.Current()
	if err != nil {
		b.Fatal(err)
	}
	set := func(v int) error { return os.WriteFile(rxbuf.Sysctl, []byte(strconv.Itoa(v)), 0o644) }
	if err := set(v); err != nil {
		b.Fatalf("net.core.rmem_default: %v", err)
	}
	return func() {
		if err := set(orig); err != nil {
			b.Errorf("restoring net.core.rmem_default to %d: %v", orig, err)
		}
	}
}

// seineLikeFlows walks a packet between ports 1 and 2 through a pipeline
// of Seine's shape (tables as in pipeline.Tables): classification, spoof
// guard, the NAT checksum detour's lookup and header save (its flows for
// connections not NATed), conntrack with NAT and a recirculation, a dozen
// tables passed by their miss flows, L3 and L2 forwarding into registers,
// commit of new connections, output:reg1.
func seineLikeFlows() []string {
	fs := []string{"table=0,priority=0,arp,actions=NORMAL"}
	for i := 1; i <= 2; i++ {
		fs = append(fs,
			fmt.Sprintf("table=0,priority=190,in_port=%d,actions=load:3->NXM_NX_REG0[0..3],goto_table:10", i),
			fmt.Sprintf("table=10,priority=200,ip,in_port=%d,dl_src=0e:00:00:00:00:%02x,nw_src=198.18.101.%d,actions=goto_table:25", i, i, i),
			fmt.Sprintf("table=70,priority=200,ip,nw_dst=198.18.101.%d,actions=mod_dl_src:0e:00:00:00:00:ff,mod_dl_dst:0e:00:00:00:00:%02x,goto_table:80", i, i),
			fmt.Sprintf("table=80,priority=200,dl_dst=0e:00:00:00:00:%02x,actions=load:%d->NXM_NX_REG1[],load:1->NXM_NX_REG0[16],goto_table:90", i, i))
	}
	return append(fs,
		"table=25,priority=200,tcp,nw_frag=no,actions=ct(zone=65520,table=26)",
		"table=25,priority=0,actions=goto_table:26",
		"table=26,priority=220,ct_state=+trk,ct_mark=0x40/0x40,tcp,nw_frag=no,actions=goto_table:31",
		"table=26,priority=210,ct_state=+new+trk,tcp,nw_frag=no,actions=goto_table:30",
		"table=26,priority=200,ct_state=+trk,tcp,nw_frag=no,actions=move:NXM_OF_IP_SRC[]->NXM_NX_REG7[],move:NXM_OF_IP_DST[]->NXM_NX_REG8[],"+
			"move:NXM_OF_TCP_SRC[]->NXM_NX_REG9[16..31],move:NXM_OF_TCP_DST[]->NXM_NX_REG9[0..15],"+
			"move:NXM_OF_ETH_SRC[0..31]->NXM_NX_REG10[],move:NXM_OF_ETH_SRC[32..47]->NXM_NX_REG11[0..15],"+
			"move:NXM_NX_IP_TTL[]->NXM_NX_REG11[16..23],goto_table:30",
		"table=26,priority=0,actions=goto_table:30",
		"table=30,priority=200,ip,actions=ct(zone=65520,nat,table=31)",
		"table=31,priority=200,ct_state=+inv+trk,ip,actions=drop",
		"table=31,priority=0,actions=goto_table:40",
		"table=40,priority=0,actions=goto_table:41",
		"table=41,priority=0,actions=goto_table:42",
		"table=42,priority=0,actions=goto_table:50",
		"table=50,priority=0,actions=goto_table:60",
		"table=60,priority=0,actions=goto_table:70",
		"table=90,priority=0,actions=goto_table:100",
		"table=100,priority=0,actions=goto_table:110",
		"table=110,priority=200,ct_state=+new+trk,ip,actions=ct(commit,zone=65520,exec(set_field:0x40/0x40->ct_mark)),goto_table:120",
		"table=110,priority=0,actions=goto_table:120",
		"table=120,priority=200,reg0=0x10000/0x10000,actions=output:NXM_NX_REG1[]")
}

// BenchmarkBridgeCost prices, one at a time, what sets a Seine Node's
// userspace bridge apart from the fastest bare bridge (one NORMAL flow,
// userspace TSO, two ports): a pipeline of Seine's shape, the Pods' MTU
// under a tunnel (1450), and idle ports, which the main thread of
// ovs-vswitchd reads in every iteration of its loop (OVS 3.1's dpif-netdev
// polls non-PMD ports, AF_PACKET and tap, in turn); then the bare bridge
// and the idle ports again with the kernel's default socket receive buffer
// (212992 bytes) instead of the 4 MiB seine keeps (datapath/rxbuf). All in
// one run, after the bare bridge as baseline. Metrics per variant V:
// V-Gbps (one stream), V-Gbps-P4, V-p50-us, V-p99-us, and V/bare-Gbps.
func BenchmarkBridgeCost(b *testing.B) {
	if os.Geteuid() != 0 {
		b.Skip("needs root")
	}
	rr := buildTCPRR(b)
	variants := []struct {
		name string
		cfg  bareBridge
	}{
		{"bare", bareBridge{Fast: true}},
		{"pipeline", bareBridge{Fast: true, Flows: seineLikeFlows()}},
		{"mtu1450", bareBridge{Fast: true, MTU: 1450}},
		{"idle8", bareBridge{Fast: true, IdlePorts: 8}},
		{"idle32", bareBridge{Fast: true, IdlePorts: 32}},
		{"pipeline-mtu1450-idle8", bareBridge{Fast: true, Flows: seineLikeFlows(), MTU: 1450, IdlePorts: 8}},
		// The same with the kernel's default socket receive buffer, as
		// before seine raised it.
		{"rmem208k", bareBridge{Fast: true, RcvBuf: kernelRcvBuf}},
		{"rmem208k-idle8", bareBridge{Fast: true, RcvBuf: kernelRcvBuf, IdlePorts: 8}},
		{"rmem208k-idle32", bareBridge{Fast: true, RcvBuf: kernelRcvBuf, IdlePorts: 32}},
	}
	for range b.N {
		var base float64
		for _, v := range variants {
			r := bareBridgePath(b, rr, v.cfg)
			if v.name == "bare" {
				base = r.Gbps
			}
			b.ReportMetric(r.Gbps, v.name+"-Gbps")
			b.ReportMetric(r.GbpsMany, v.name+"-Gbps-P"+strconv.Itoa(dpStreams))
			b.ReportMetric(r.P50, v.name+"-p50-us")
			b.ReportMetric(r.P99, v.name+"-p99-us")
			b.ReportMetric(r.Gbps/base, v.name+"/bare-Gbps")
			b.Logf("%-24s %6.2f Gbit/s  %6.2f Gbit/s (%d streams)  p50 %6.1f µs  p99 %6.1f µs  %.2f of bare",
				v.name, r.Gbps, r.GbpsMany, dpStreams, r.P50, r.P99, r.Gbps/base)
		}
	}
}

// twoBridgesPath joins two netdev bridges (userspace TSO, in two "Node"
// namespaces) with a kernel VXLAN device on each, attached as an ordinary
// port; each bridge forwards between its "Pod" veth and the VXLAN device
// with two flows, and the VXLAN device's forwarding entry names the other
// Node. The Nodes' eth0 are configured as the sandbox's (no transmit
// offloads, GRO on) and joined by one veth pair or, with bridged, as the
// sandbox joins its Nodes: each by a veth to a Linux bridge in an underlay
// namespace (tests/sandbox, buildTopology), one more veth and a bridge
// hop per packet each way.
func twoBridgesPath(b *testing.B, rr string, bridged bool) dpResult {
	b.Helper()
	client, server, dst, down := twoBridgesUp(b, bridged)
	defer down()
	return measurePath(b, rr, server, client, dst, nil)
}

// twoBridgesUp builds twoBridgesPath's topology and returns the client's
// and the server's namespaces, the server's address, and a function that
// tears it all down.
func twoBridgesUp(b *testing.B, bridged bool) (client, server, dst string, down func()) {
	b.Helper()
	defer withRcvBuf(b, rxbuf.DefaultMin)() // the ports' sockets have it once they are added
	n := []string{"seine-bdp-n1", "seine-bdp-n2"}
	p := []string{"seine-bdp-p1", "seine-bdp-p2"}
	all := append(append([]string{}, n...), p...)
	const u = "seine-bdp-u"
	if bridged {
		all = append(all, u)
	}
	b.Cleanup(func() { delNetns(all...) }) // also when the benchmark fails
	for _, x := range all {
		netns(b, x)
		sh(b, "ip", "-n", x, "link", "set", "lo", "up")
	}
	if bridged {
		sh(b, "ip", "-n", u, "link", "add", "br0", "type", "bridge")
		sh(b, "ip", "-n", u, "link", "set", "br0", "up")
		for i := range n {
			port := fmt.Sprintf("n%d", i+1)
			sh(b, "ip", "-n", u, "link", "add", port, "type", "veth", "peer", "name", "eth0", "netns", n[i])
			sh(b, "ip", "-n", u, "link", "set", port, "master", "br0", "up")
			sh(b, "ip", "netns", "exec", u, "ethtool", "-K", port, "tx", "off", "tso", "off", "gso", "off")
		}
	} else {
		sh(b, "ip", "-n", n[0], "link", "add", "eth0", "type", "veth", "peer", "name", "eth0", "netns", n[1])
	}
	remoteMAC := func(i int) string { return fmt.Sprintf("0e:5f:c6:12:66:%02x", i+1) }
	var ovs []*bareOVS
	for i := range n {
		sh(b, "ip", "netns", "exec", n[i], "ethtool", "-K", "eth0", "tx", "off", "tso", "off", "gso", "off", "gro", "on")
		sh(b, "ip", "-n", n[i], "addr", "add", fmt.Sprintf("198.18.102.%d/24", i+1), "dev", "eth0")
		sh(b, "ip", "-n", n[i], "link", "set", "eth0", "up")
	}
	for i := range n {
		peer := 1 - i
		o := startBareOVS(b, n[i], true)
		ovs = append(ovs, o)
		o.vsctl(b, "add-br", "br0", "--", "set", "bridge", "br0", "datapath_type=netdev", "fail_mode=secure")
		sh(b, "ip", "-n", n[i], "link", "add", "vp", "type", "veth", "peer", "name", "eth0", "netns", p[i])
		sh(b, "ip", "-n", p[i], "addr", "add", fmt.Sprintf("198.18.103.%d/24", i+1), "dev", "eth0")
		sh(b, "ip", "-n", p[i], "link", "set", "eth0", "up", "mtu", "1450")
		sh(b, "ip", "-n", p[i], "neigh", "replace", fmt.Sprintf("198.18.103.%d", peer+1), "lladdr", remoteMAC(peer), "dev", "eth0")
		sh(b, "ip", "-n", n[i], "link", "set", "vp", "up")
		sh(b, "ip", "-n", n[i], "link", "add", "vx0", "type", "vxlan", "id", "0", "dstport", "4789",
			"local", fmt.Sprintf("198.18.102.%d", i+1), "nolearning")
		sh(b, "ip", "-n", n[i], "link", "set", "vx0", "up", "mtu", "1450")
		sh(b, "ip", "netns", "exec", n[i], "bridge", "fdb", "append", remoteMAC(peer), "dev", "vx0",
			"dst", fmt.Sprintf("198.18.102.%d", peer+1))
		o.vsctl(b, "add-port", "br0", "vx0", "--", "set", "interface", "vx0", "ofport_request=1")
		o.vsctl(b, "add-port", "br0", "vp", "--", "set", "interface", "vp", "ofport_request=2")
		podMAC := strings.TrimSpace(sh(b, "ip", "netns", "exec", p[i], "cat", "/sys/class/net/eth0/address"))
		o.ofctl(b, "add-flow", o.mgmt(b, "br0"), "in_port=2,actions=output:1")
		o.ofctl(b, "add-flow", o.mgmt(b, "br0"), "in_port=1,actions=mod_dl_dst:"+podMAC+",output:2")
	}
	return p[0], p[1], "198.18.103.2", func() {
		for _, o := range ovs {
			o.stop()
		}
		delNetns(all...)
	}
}

// perfPod creates Pod perf/<name> on node with label role=<role> and
// returns its network namespace's name and its IP.
func perfPod(ctx context.Context, b *testing.B, c *sandbox.Cluster, name, node, role string) (netnsName, ip string) {
	b.Helper()
	p, err := c.CreatePod(ctx, sandbox.PodSpec{Namespace: "perf", Name: name, Node: node,
		Labels: map[string]string{"role": role}})
	if err != nil {
		b.Fatal(err)
	}
	st, err := c.PodState("perf", name)
	if err != nil {
		b.Fatal(err)
	}
	return st.NetNS, p.Status.PodIP
}

// createPerfService creates Service perf/server (ports 5201 and 5301 to
// the server Pod) and returns its ClusterIP; callers wait for it to
// answer (waitReachable).
func createPerfService(ctx context.Context, b *testing.B, c *sandbox.Cluster) string {
	b.Helper()
	svc := &corev1.Service{ObjectMeta: metav1.ObjectMeta{Name: "server"}, Spec: corev1.ServiceSpec{
		Selector: map[string]string{"role": "server"},
		Ports: []corev1.ServicePort{
			{Name: "iperf", Port: 5201, TargetPort: intstr.FromInt32(5201), Protocol: corev1.ProtocolTCP},
			{Name: "rr", Port: 5301, TargetPort: intstr.FromInt32(5301), Protocol: corev1.ProtocolTCP},
		}}}
	s, err := c.Client().CoreV1().Services("perf").Create(ctx, svc, metav1.CreateOptions{})
	if err != nil {
		b.Fatal(err)
	}
	return s.Spec.ClusterIP
}

// waitReachable waits until a TCP connection from clientNS to dst's
// iperf3 port is answered (refused counts: the path works).
func waitReachable(ctx context.Context, b *testing.B, c *sandbox.Cluster, clientNS, dst string) {
	b.Helper()
	deadline := time.Now().Add(60 * time.Second)
	for time.Now().Before(deadline) {
		r := c.ProbeFrom(ctx, clientNS, dst, 5201, corev1.ProtocolTCP, 500*time.Millisecond)
		if r.Outcome == echo.Connected || r.Outcome == echo.Refused {
			return
		}
		time.Sleep(200 * time.Millisecond)
	}
	b.Fatalf("%s not reachable from %s", dst, clientNS)
}

// createPerfPolicies creates dpPolicies NetworkPolicies in namespace perf
// selecting the server Pod: dpPolicies-1 allow ingress from one ipBlock
// address on one port each (addresses no Pod has), one allows the client
// Pods on the measured ports. It returns once the server's Node has
// installed them (its flow count stopped growing) and the cluster is quiet
// again: the leader annotates every policy with how many Nodes of its span
// realized it (node/info, a PATCH per policy and change, for tens of
// seconds after 1,000 policies), work that would otherwise share this
// 2-core machine with the measurement and be counted as the policies' cost
// in the datapath.
func createPerfPolicies(ctx context.Context, b *testing.B, c *sandbox.Cluster, node sandbox.Node) {
	b.Helper()
	nps := c.Client().NetworkingV1().NetworkPolicies("perf")
	server := metav1.LabelSelector{MatchLabels: map[string]string{"role": "server"}}
	tcp := corev1.ProtocolTCP
	port := func(p int) networkingv1.NetworkPolicyPort {
		v := intstr.FromInt32(int32(p))
		return networkingv1.NetworkPolicyPort{Protocol: &tcp, Port: &v}
	}
	for i := 0; i < dpPolicies-1; i++ {
		np := &networkingv1.NetworkPolicy{ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("np-%04d", i)},
			Spec: networkingv1.NetworkPolicySpec{PodSelector: server,
				Ingress: []networkingv1.NetworkPolicyIngressRule{{
					From: []networkingv1.NetworkPolicyPeer{{IPBlock: &networkingv1.IPBlock{
						CIDR: fmt.Sprintf("10.244.%d.%d/32", 200+i/256, i%256)}}},
					Ports: []networkingv1.NetworkPolicyPort{port(6000 + i%500)},
				}}}}
		if err := retryAPI(ctx, func() error { _, err := nps.Create(ctx, np, metav1.CreateOptions{}); return err }); err != nil {
			b.Fatal(err)
		}
	}
	allow := &networkingv1.NetworkPolicy{ObjectMeta: metav1.ObjectMeta{Name: "allow-clients"},
		Spec: networkingv1.NetworkPolicySpec{PodSelector: server,
			Ingress: []networkingv1.NetworkPolicyIngressRule{{
				From: []networkingv1.NetworkPolicyPeer{{PodSelector: &metav1.LabelSelector{
					MatchLabels: map[string]string{"role": "client"}}}},
				Ports: []networkingv1.NetworkPolicyPort{port(5201), port(5301)},
			}}}}
	if _, err := nps.Create(ctx, allow, metav1.CreateOptions{}); err != nil {
		b.Fatal(err)
	}
	sof := newSeineOF(node)
	last, stable := -1, 0
	for stable < 5 {
		time.Sleep(time.Second)
		n, err := sof.count("")
		if err != nil {
			b.Fatal(err)
		}
		if n == last {
			stable++
		} else {
			stable = 0
		}
		last = n
		if ctx.Err() != nil {
			b.Fatal(ctx.Err())
		}
	}
	b.Logf("%d NetworkPolicies installed: %d flows on %s", dpPolicies, last, node.Name)
	for {
		list, err := nps.List(ctx, metav1.ListOptions{})
		if err != nil {
			b.Fatal(err)
		}
		done := 0
		for _, np := range list.Items {
			r, s, ok := strings.Cut(np.Annotations[info.AnnotationRealizedNodes], "/")
			if ok && r == s && s != "0" && np.Annotations[info.AnnotationRealizedGeneration] == strconv.FormatInt(np.Generation, 10) {
				done++
			}
		}
		if done == len(list.Items) {
			break
		}
		if ctx.Err() != nil {
			b.Fatalf("%d of %d NetworkPolicies annotated as realized: %v", done, len(list.Items), ctx.Err())
		}
		time.Sleep(time.Second)
	}
	b.Logf("every NetworkPolicy annotated as realized")
	time.Sleep(3 * time.Second) // the last annotations' watch events
}
