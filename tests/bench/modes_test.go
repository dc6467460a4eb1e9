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
	"github.com/seine-net/seine/tests/bench/stats"
	"github.com/seine-net/seine/tests/sandbox"
)

// bareOVSBridge joins two namespaces (client 198.18.101.1, server .2) by
// one plain OVS bridge with the userspace datapath and a NORMAL flow, run
// in a namespace of its own: one pass through ovs-vswitchd, nothing of
// seine. The client and server ends have transmit checksum offload off,
// as Pod interfaces do under the userspace datapath. It returns the
// client's and the server's namespace names.
func bareOVSBridge(b *testing.B) [2]string {
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
	return [2]string{a, z}
}

// BenchmarkModeThroughput measures Pod-to-Pod TCP throughput across Nodes
// in each traffic mode: for each, a sandbox of three Nodes over two
// transport subnets, a server Pod on Node 1 and clients on Node 2 (same
// subnet) and Node 3 (the other one, through the underlay router). Every
// sandbox is up at once and the paths are measured in turn, with a bare OVS
// bridge (one userspace hop, bareOVSBaseline) among them, in three rounds;
// each figure is the median of its three. Each is also given as a ratio to
// encap's on the same path, and to the bare bridge. The machine is shared
// and noisy: interleaving spreads the noise over every path alike.
func BenchmarkModeThroughput(b *testing.B) {
	if os.Geteuid() != 0 {
		b.Skip("needs root")
	}
	type path struct{ srvNS, cliNS, srvIP string }
	paths := map[string]path{}
	var order []string
	for _, mode := range config.Modes() {
		p := modePaths(b, mode)
		for _, k := range []string{"same-subnet", "cross-subnet"} {
			name := string(mode) + "-" + k
			paths[name] = p[k]
			order = append(order, name)
		}
	}
	bareNS := bareOVSBridge(b)
	order = append(order, "bare-ovs")
	paths["bare-ovs"] = path{bareNS[1], bareNS[0], "198.18.101.2"}
	for i := 0; i < b.N; i++ {
		got := map[string][]float64{}
		for round := 0; round < 3; round++ {
			for _, k := range order {
				p := paths[k]
				got[k] = append(got[k], iperf3Run(b, p.srvNS, p.cliNS, p.srvIP, 1))
			}
		}
		med := map[string]float64{}
		for k, v := range got {
			med[k] = stats.Median(v)
			b.Logf("%s: %.2f Gbit/s (median of %v)", k, med[k], v)
		}
		b.ReportMetric(med["bare-ovs"], "bare-ovs-Gbps")
		for _, k := range order[:len(order)-1] {
			encap := string(config.ModeEncap) + k[strings.Index(k, "-"):] // the same path in encap
			b.ReportMetric(med[k], k+"-Gbps")
			b.ReportMetric(med[k]/med[encap], k+"-vs-encap")
			b.ReportMetric(med[k]/med["bare-ovs"], k+"-vs-bare")
		}
	}
}

// modePaths brings a sandbox up in mode (torn down when the benchmark
// ends) and returns its two paths: "same-subnet" and "cross-subnet".
func modePaths(b *testing.B, mode config.TrafficEncapMode) map[string]struct{ srvNS, cliNS, srvIP string } {
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
	b.Cleanup(func() {
		if err := sandbox.Down(name, ""); err != nil {
			b.Errorf("down: %v", err)
		}
	})
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
	return map[string]struct{ srvNS, cliNS, srvIP string }{
		"same-subnet":  {srvNS, sameNS, srvIP},
		"cross-subnet": {srvNS, crossNS, srvIP},
	}
}
