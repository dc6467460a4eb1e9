package bench

import (
	"bytes"
	"context"
	"encoding/json"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/seine-net/seine/tests/bench/stats"
	"github.com/seine-net/seine/tests/sandbox"
)

// crrRounds is how many rounds BenchmarkConnectionRate takes; each round
// measures every path once, so all paths see the same drift of the
// machine's background. crrSeconds is one measurement's length.
const (
	crrRounds  = 5
	crrSeconds = 4
)

// crrResult is one connection-rate measurement.
type crrResult struct {
	ConnsPerSecond float64 `json:"connsPerSecond"`
	P50            float64 `json:"p50us"`
}

// BenchmarkConnectionRate measures how many short TCP connections a path
// carries per second (tcprr -crr, netperf's TCP_CRR: connect, one 64-byte
// request and its echo, close; one at a time), the load that costs a
// flow-based switch the most because every connection is a new 5-tuple.
// Paths: a veth pair, the fastest bare netdev bridge (one NORMAL flow,
// userspace TSO), and Seine on a 2-Node sandbox (VXLAN, the default with
// this datapath): Pod to Pod on one Node, across Nodes, and to a
// ClusterIP whose endpoint is on the other Node (conntrack DNAT; with
// natChecksum: detour, also the NAT checksum detour). With SEINE_BENCH_BASELINE=<seine binary> a second
// sandbox runs that binary and its Seine paths are measured too, taking
// turns with the current ones. Each path is measured once per round for
// crrRounds rounds; the figures are medians.
//
// Metrics: <path>-conns/s and <path>-p50-us (one whole connection, not
// halved), <seine path>-megaflows (datapath flows on the client's Node
// right after the path's last run: without per-connection flows this
// stays small; with the NAT checksum detour, a Service's connections,
// NATed there, keep theirs), and
// current/baseline and same/bare-fast ratios of the connection rate.
func BenchmarkConnectionRate(b *testing.B) {
	if os.Geteuid() != 0 {
		b.Skip("needs root")
	}
	rr := buildTCPRR(b)
	for i := 0; i < b.N; i++ {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Minute)
		type seinePaths struct {
			name                     string
			server, remote           sandbox.Node
			srvNS, localNS, remoteNS string
			srvIP, vip               string
		}
		setUp := func(name string, c *sandbox.Cluster) seinePaths {
			nodes := c.Nodes()
			mk := func(pod, node, role string) (netnsName, ip string) { return perfPod(ctx, b, c, pod, node, role) }
			sp := seinePaths{name: name, server: nodes[0], remote: nodes[1]}
			sp.srvNS, sp.srvIP = mk("server", nodes[0].Name, "server")
			sp.localNS, _ = mk("local", nodes[0].Name, "client")
			sp.remoteNS, _ = mk("remote", nodes[1].Name, "client")
			sp.vip = createPerfService(ctx, b, c)
			waitReachable(ctx, b, c, sp.remoteNS, sp.vip)
			b.Cleanup(crrServer(b, rr, sp.srvNS))
			return sp
		}
		sandboxes := []seinePaths{setUp("seine", up(b, "bcr", 2, nil))}
		if base := os.Getenv(envBaseline); base != "" {
			sandboxes = append(sandboxes, setUp("baseline", upWith(b, "bcrb", 2, base)))
		}

		type path struct {
			name, client, dst string
			node              *sandbox.Node
		}
		var paths []path
		vc, vs, vdst, vdown := vethPair(b)
		defer vdown()
		b.Cleanup(crrServer(b, rr, vs))
		paths = append(paths, path{"veth", vc, vdst, nil})
		bc, bs, bdst, bdown := bareBridgeUp(b, bareBridge{Fast: true})
		defer bdown()
		b.Cleanup(crrServer(b, rr, bs))
		paths = append(paths, path{"bare-fast", bc, bdst, nil})
		for _, sp := range sandboxes {
			server, remote := sp.server, sp.remote
			paths = append(paths,
				path{sp.name + "-same", sp.localNS, sp.srvIP, &server},
				path{sp.name + "-cross", sp.remoteNS, sp.srvIP, &remote},
				path{sp.name + "-svc-cross", sp.remoteNS, sp.vip, &remote})
		}
		runs := map[string][]crrResult{}
		megaflows := map[string]int{}
		for round := range crrRounds {
			for _, p := range paths {
				runs[p.name] = append(runs[p.name], crrRun(b, rr, p.client, p.dst))
				if round == crrRounds-1 && p.node != nil {
					// Right after the run: idle datapath flows expire
					// after 10 s (other_config:max-idle).
					megaflows[p.name] = strings.Count(appctl(b, *p.node, "dpctl/dump-flows"), "\n")
				}
			}
		}
		cancel()

		rate := map[string]float64{}
		for _, p := range paths {
			var cps, p50 []float64
			for _, r := range runs[p.name] {
				cps, p50 = append(cps, r.ConnsPerSecond), append(p50, r.P50)
			}
			rate[p.name] = stats.Median(cps)
			b.ReportMetric(stats.Median(cps), p.name+"-conns/s")
			b.ReportMetric(stats.Median(p50), p.name+"-p50-us")
			if p.node != nil {
				b.ReportMetric(float64(megaflows[p.name]), p.name+"-megaflows")
			}
			b.Logf("%-20s %v conns/s, p50 %v µs", p.name, cps, p50)
		}
		b.ReportMetric(rate["seine-same"]/rate["bare-fast"], "same/bare-fast-conns")
		if len(sandboxes) > 1 {
			for _, s := range []string{"same", "cross", "svc-cross"} {
				b.ReportMetric(rate["seine-"+s]/rate["baseline-"+s], s+"/baseline-conns")
			}
		}
	}
}

// crrServer starts a tcprr server (every connection served) in netnsName
// and returns a function that stops it.
func crrServer(b *testing.B, rr, netnsName string) func() {
	b.Helper()
	srv := exec.Command("ip", "netns", "exec", netnsName, rr, "-listen", "0.0.0.0:5301")
	if err := srv.Start(); err != nil {
		b.Fatal(err)
	}
	return func() { _ = srv.Process.Kill(); _ = srv.Wait() }
}

// crrRun measures the connection rate from clientNS to a tcprr server at
// dst for crrSeconds. The client's namespace reuses TIME_WAIT ports for
// new connections (net.ipv4.tcp_tw_reuse=1), or a fast path would run
// out of them.
func crrRun(b *testing.B, rr, clientNS, dst string) crrResult {
	b.Helper()
	sh(b, "ip", "netns", "exec", clientNS, "sysctl", "-qw", "net.ipv4.tcp_tw_reuse=1")
	var out bytes.Buffer
	var err error
	for try := 0; try < 20; try++ {
		out.Reset()
		cmd := exec.Command("ip", "netns", "exec", clientNS, rr, "-connect", dst+":5301", "-crr",
			"-duration", strconv.Itoa(crrSeconds)+"s")
		cmd.Stdout = &out
		if err = cmd.Run(); err == nil {
			break
		}
		time.Sleep(200 * time.Millisecond)
	}
	if err != nil {
		b.Fatalf("tcprr -crr %s -> %s: %v", clientNS, dst, err)
	}
	var r crrResult
	if err := json.Unmarshal(out.Bytes(), &r); err != nil {
		b.Fatalf("tcprr output %q: %v", out.String(), err)
	}
	if r.ConnsPerSecond <= 0 {
		b.Fatalf("tcprr -crr %s -> %s: no connection completed: %s", clientNS, dst, out.String())
	}
	return r
}

// vethPair creates two namespaces joined by a veth pair and returns the
// client's and the server's namespace, the server's address, and a
// function that removes both.
func vethPair(b *testing.B) (client, server, dst string, down func()) {
	b.Helper()
	a, z := "seine-bdp-a", "seine-bdp-b"
	netns(b, a)
	netns(b, z)
	for _, c := range [][]string{
		{"ip", "-n", a, "link", "add", "eth0", "type", "veth", "peer", "name", "eth0", "netns", z},
		{"ip", "-n", a, "addr", "add", "198.18.100.1/24", "dev", "eth0"},
		{"ip", "-n", z, "addr", "add", "198.18.100.2/24", "dev", "eth0"},
		{"ip", "-n", a, "link", "set", "eth0", "up"},
		{"ip", "-n", z, "link", "set", "eth0", "up"},
		{"ip", "-n", a, "link", "set", "lo", "up"},
		{"ip", "-n", z, "link", "set", "lo", "up"},
	} {
		sh(b, c...)
	}
	return a, z, "198.18.100.2", func() { delNetns(a, z) }
}
