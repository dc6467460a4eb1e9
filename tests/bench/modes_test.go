package bench

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"go.uber.org/zap"

	"github.com/seine-net/seine/node/config"
	"github.com/seine-net/seine/tests/sandbox"
)

// bareOVSBaseline measures iperf3 between two namespaces joined by one
// plain OVS bridge with the userspace datapath and a NORMAL flow, run in a
// namespace of its own: one pass through ovs-vswitchd, nothing of seine.
// The client and server ends have transmit checksum offload off, as Pod
// interfaces do under the userspace datapath.
func bareOVSBaseline(b *testing.B) float64 {
	b.Helper()
	sw, a, z := "seine-bmb-sw", "seine-bmb-a", "seine-bmb-b"
	for _, n := range []string{sw, a, z} {
		netns(b, n)
	}
	dir, err := os.MkdirTemp("/tmp", "bmb")
	if err != nil {
		b.Fatal(err)
	}
	sh := func(argv ...string) {
		b.Helper()
		cmd := exec.Command(argv[0], argv[1:]...)
		cmd.Env = append(os.Environ(), "OVS_RUNDIR="+dir, "OVS_DBDIR="+dir, "OVS_LOGDIR="+dir)
		if out, err := cmd.CombinedOutput(); err != nil {
			b.Fatalf("%v: %v: %s", argv, err, out)
		}
	}
	db, sock := filepath.Join(dir, "conf.db"), "unix:"+filepath.Join(dir, "db.sock")
	b.Cleanup(func() {
		for _, d := range []string{"ovs-vswitchd", "ovsdb-server"} {
			_ = exec.Command("ovs-appctl", "-t", filepath.Join(dir, d+".ctl"), "exit").Run()
		}
		os.RemoveAll(dir)
	})
	sh("ovsdb-tool", "create", db, "/usr/share/openvswitch/vswitch.ovsschema")
	sh("ip", "netns", "exec", sw, "ovsdb-server", db, "--remote=p"+sock, "--unixctl="+filepath.Join(dir, "ovsdb-server.ctl"),
		"--pidfile="+filepath.Join(dir, "ovsdb-server.pid"), "--log-file="+filepath.Join(dir, "ovsdb-server.log"), "--detach")
	sh("ovs-vsctl", "--db="+sock, "--no-wait", "init")
	sh("ip", "netns", "exec", sw, "ovs-vswitchd", sock, "--unixctl="+filepath.Join(dir, "ovs-vswitchd.ctl"),
		"--pidfile="+filepath.Join(dir, "ovs-vswitchd.pid"), "--log-file="+filepath.Join(dir, "ovs-vswitchd.log"),
		"--disable-system", "--detach")
	sh("ovs-vsctl", "--db="+sock, "add-br", "br0", "--", "set", "bridge", "br0", "datapath_type=netdev")
	for i, n := range []string{a, z} {
		port := fmt.Sprintf("p%d", i)
		addr := fmt.Sprintf("198.18.101.%d/24", i+1)
		sh("ip", "-n", sw, "link", "add", port, "type", "veth", "peer", "name", "eth0", "netns", n)
		sh("ip", "-n", sw, "link", "set", port, "up")
		sh("ip", "netns", "exec", n, "ethtool", "-K", "eth0", "tx", "off")
		sh("ip", "-n", n, "addr", "add", addr, "dev", "eth0")
		sh("ip", "-n", n, "link", "set", "eth0", "up")
		sh("ovs-vsctl", "--db="+sock, "add-port", "br0", port)
	}
	// ARP and the bridge's MAC learning settle with one ping.
	for try := 0; ; try++ {
		if exec.Command("ip", "netns", "exec", a, "ping", "-c", "1", "-W", "1", "198.18.101.2").Run() == nil {
			break
		}
		if try == 10 {
			b.Fatal("no ping across the bare OVS bridge")
		}
	}
	return iperf3(b, z, a, "198.18.101.2")
}

// BenchmarkModeThroughput measures Pod-to-Pod TCP throughput across Nodes
// in each traffic mode: for each, a sandbox of three Nodes over two
// transport subnets, a server Pod on Node 1 and clients on Node 2 (same
// subnet) and Node 3 (the other one, through the underlay router). Each
// figure is also given as a ratio to encap's on the same path in this run,
// and to a bare OVS bridge (one userspace hop, bareOVSBaseline) measured
// before the first mode and after the last.
func BenchmarkModeThroughput(b *testing.B) {
	if os.Geteuid() != 0 {
		b.Skip("needs root")
	}
	type result struct{ same, cross float64 }
	for i := 0; i < b.N; i++ {
		bare := bareOVSBaseline(b)
		results := map[config.TrafficEncapMode]result{}
		for _, mode := range config.Modes() {
			results[mode] = modeThroughput(b, mode)
		}
		bare = (bare + bareOVSBaseline(b)) / 2
		b.ReportMetric(bare, "bare-ovs-Gbps")
		enc := results[config.ModeEncap]
		for _, mode := range config.Modes() {
			r := results[mode]
			for _, path := range []struct {
				name      string
				got, base float64
			}{{"same-subnet", r.same, enc.same}, {"cross-subnet", r.cross, enc.cross}} {
				b.ReportMetric(path.got, fmt.Sprintf("%s-%s-Gbps", mode, path.name))
				b.ReportMetric(path.got/path.base, fmt.Sprintf("%s-%s-vs-encap", mode, path.name))
				b.ReportMetric(path.got/bare, fmt.Sprintf("%s-%s-vs-bare", mode, path.name))
			}
		}
	}
}

// modeThroughput brings a sandbox up in mode and measures the two paths.
func modeThroughput(b *testing.B, mode config.TrafficEncapMode) (r struct{ same, cross float64 }) {
	b.Helper()
	name := "bm" + strings.ToLower(string(mode))[:3]
	os.Setenv("SEINE_BIN", filepath.Join(repoRoot(), "bin", "seine"))
	os.Setenv("SEINE_SANDBOX_BIN", filepath.Join(repoRoot(), "bin", "sandbox"))
	_ = sandbox.Down(name, "")
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	c, err := sandbox.Up(ctx, sandbox.Options{Name: name, Nodes: 3, Subnets: 2, Mode: mode, Log: zap.NewNop()})
	if err != nil {
		_ = sandbox.Down(name, "")
		b.Fatalf("%s: %v", mode, err)
	}
	defer func() {
		if err := sandbox.Down(name, ""); err != nil {
			b.Errorf("down: %v", err)
		}
	}()
	nodes := c.Nodes()
	mk := func(pod, node string) (netnsName, ip string) {
		p, err := c.CreatePod(ctx, sandbox.PodSpec{Namespace: "perf", Name: pod, Node: node})
		if err != nil {
			b.Fatalf("%s: %v", mode, err)
		}
		st, err := c.PodState("perf", pod)
		if err != nil {
			b.Fatal(err)
		}
		return st.NetNS, p.Status.PodIP
	}
	srvNS, srvIP := mk("server", nodes[0].Name)
	sameNS, _ := mk("same", nodes[1].Name)
	crossNS, _ := mk("cross", nodes[2].Name)
	r.same = iperf3(b, srvNS, sameNS, srvIP)
	r.cross = iperf3(b, srvNS, crossNS, srvIP)
	b.Logf("%s: same subnet %.2f Gbit/s, other subnet %.2f Gbit/s", mode, r.same, r.cross)
	return r
}
