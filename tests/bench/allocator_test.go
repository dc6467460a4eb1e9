package bench

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/seine-net/seine/tests/bench/stats"
	"github.com/seine-net/seine/tests/sandbox"
)

const (
	// alRounds is how many rounds BenchmarkOVSAllocator takes.
	alRounds = 6
	// alPortAdds is how many OVS ports each turn adds and deletes.
	alPortAdds = 10
)

// BenchmarkOVSAllocator prices the memory allocator of ovs-vswitchd with
// the userspace datapath: glibc's malloc (what Open vSwitch runs with, here
// and in seine's image) against jemalloc preloaded (LD_PRELOAD, ld.so(8);
// the Open vSwitch installation guide suggests building with it), as is
// ("jemalloc") and with 64 KiB TSO segment buffers cached per thread too
// ("jemalloc-tc", MALLOC_CONF=tcache_max:131072; jemalloc(3)). OVS 3.1
// takes a batch of 32 packet buffers from the allocator for every read of
// an AF_PACKET port, idle or not, and a profile of a forwarding Node put
// about an eighth of ovs-vswitchd's CPU time in glibc's malloc and free
// (docs/benchmarks.md, "The turn of ovs-vswitchd's main loop"). Tried on
// 2026-11-27 and not kept: jemalloc lowered latency somewhat and cost
// one-Node throughput in every run.
//
// On a 2-Node sandbox in its default configuration it takes turns for
// alRounds rounds, the order rotating: each turn restarts both Nodes'
// ovs-vswitchd with the turn's allocator (sandbox RestartVSwitchdWithEnv),
// checks that the library is mapped (or not) and the environment set,
// waits until the seine daemons have put their flows back, and measures
// Pod-to-Pod on one Node and across Nodes (one tcprr run and one iperf3
// stream each), then adds alPortAdds veth ports to the first Node's bridge
// one at a time through ovs-vsctl, which waits for ovs-vswitchd to
// reconfigure (the bulk of a serial CNI ADD), and deletes them. Metrics:
// medians per allocator and path (<path>-<allocator>-p50-us, -Gbps;
// port-add-<allocator>-ms, over every add) and the ratios to glibc's,
// <path>-<allocator>/libc-{p50,Gbps} and port-add-<allocator>/libc, for
// jemalloc and jemalloc-tc.
func BenchmarkOVSAllocator(b *testing.B) {
	rr := buildTCPRR(b)
	libs, _ := filepath.Glob("/usr/lib/*/libjemalloc.so.2")
	if len(libs) == 0 {
		b.Skip("libjemalloc.so.2 is not installed (Debian: libjemalloc2)")
	}
	jemalloc := libs[0]
	// jemalloc-tc also caches per thread the buffers of 64 KiB TSO segments
	// (opt.tcache_max, jemalloc(3); 32 KiB by default).
	env := map[string][]string{"libc": nil, "jemalloc": {"LD_PRELOAD=" + jemalloc},
		"jemalloc-tc": {"LD_PRELOAD=" + jemalloc, "MALLOC_CONF=tcache_max:131072"}}
	for range b.N {
		c, ctx, p := perfSandbox(b, "bal")
		nodes := c.Nodes()
		setAllocator := func(a string) {
			for _, n := range nodes {
				if err := c.RestartVSwitchdWithEnv(ctx, n.Name, env[a]); err != nil {
					b.Fatal(err)
				}
				want := a != "libc"
				if got := mapsLibrary(b, n, jemalloc); got != want {
					b.Fatalf("%s: ovs-vswitchd started with allocator %s maps %s: %t", n.Name, a, jemalloc, got)
				}
				environ := vswitchdFile(b, n, "environ")
				for _, e := range env[a] {
					if !strings.Contains(string(environ), e) {
						b.Fatalf("%s: ovs-vswitchd started with allocator %s lacks %s in its environment", n.Name, a, e)
					}
				}
			}
			waitReachable(ctx, b, c, p.localNS, p.srvIP)
			waitReachable(ctx, b, c, p.remoteNS, p.srvIP)
			time.Sleep(2 * time.Second) // the daemons' resync after the restart has settled
		}

		allocators := []string{"libc", "jemalloc", "jemalloc-tc"}
		portAdd := map[string][]float64{}
		takeTurns(b, rr, p, alRounds, allocators, "libc", setAllocator, func(a string) {
			portAdd[a] = append(portAdd[a], portAddMillis(b, nodes[0], alPortAdds)...)
		})
		for _, a := range allocators {
			b.ReportMetric(stats.Median(portAdd[a]), "port-add-"+a+"-ms")
		}
		for _, a := range allocators[1:] {
			b.ReportMetric(stats.Median(portAdd[a])/stats.Median(portAdd["libc"]), "port-add-"+a+"/libc")
		}
	}
}

// perfEnds are the Pods of a data-plane benchmark: a server on the first
// Node, a client beside it and one on the second Node.
type perfEnds struct {
	srvNS, srvIP, localNS, remoteNS string
}

// perfSandbox brings up 2-Node sandbox name in its default configuration
// with perfEnds, all reachable, and a context that ends after 20 minutes or
// at the benchmark's cleanup.
func perfSandbox(b *testing.B, name string) (*sandbox.Cluster, context.Context, perfEnds) {
	b.Helper()
	c := up(b, name, 2, nil)
	nodes := c.Nodes()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Minute)
	b.Cleanup(cancel)
	var p perfEnds
	p.srvNS, p.srvIP = perfPod(ctx, b, c, "server", nodes[0].Name, "server")
	p.localNS, _ = perfPod(ctx, b, c, "local", nodes[0].Name, "client")
	p.remoteNS, _ = perfPod(ctx, b, c, "remote", nodes[1].Name, "client")
	waitReachable(ctx, b, c, p.localNS, p.srvIP)
	waitReachable(ctx, b, c, p.remoteNS, p.srvIP)
	return c, ctx, p
}

// mapsLibrary reports whether Node n's ovs-vswitchd has library mapped.
func mapsLibrary(b *testing.B, n sandbox.Node, library string) bool {
	b.Helper()
	return strings.Contains(string(vswitchdFile(b, n, "maps")), library)
}

// vswitchdFile reads /proc/<pid>/<name> of Node n's ovs-vswitchd.
func vswitchdFile(b *testing.B, n sandbox.Node, name string) []byte {
	b.Helper()
	pid, err := os.ReadFile(filepath.Join(n.OVSRunDir, "ovs-vswitchd.pid"))
	if err != nil {
		b.Fatal(err)
	}
	out, err := os.ReadFile(fmt.Sprintf("/proc/%s/%s", strings.TrimSpace(string(pid)), name))
	if err != nil {
		b.Fatal(err)
	}
	return out
}

// portAddMillis adds count veth ports to Node n's br-int one at a time,
// each with ovs-vsctl's default wait for ovs-vswitchd to reconfigure, and
// returns each add's wall time in ms; it deletes the ports and devices
// again.
func portAddMillis(b *testing.B, n sandbox.Node, count int) []float64 {
	b.Helper()
	var ms []float64
	var made []string
	defer func() { // also when a step fails the benchmark
		for _, port := range made {
			_ = exec.Command("ovs-vsctl", "--db=unix:"+filepath.Join(n.OVSRunDir, "db.sock"), "--timeout=10",
				"--if-exists", "del-port", "br-int", port).Run()
			delLink(n.NetNS, port)
		}
	}()
	for i := range count {
		port, peer := "bal"+strconv.Itoa(i), "balp"+strconv.Itoa(i)
		sh(b, "ip", "-n", n.NetNS, "link", "add", port, "type", "veth", "peer", "name", peer)
		made = append(made, port)
		sh(b, "ip", "-n", n.NetNS, "link", "set", port, "up")
		start := time.Now()
		vsctl(b, n, "add-port", "br-int", port)
		ms = append(ms, float64(time.Since(start).Microseconds())/1000)
	}
	return ms
}
