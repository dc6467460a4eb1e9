// Package bench holds Seine's end-to-end benchmarks on a real sandbox
// (`make bench`). Each benchmark brings up its own cluster and reports
// custom metrics (b.ReportMetric); run them with -benchtime 1x. The
// figures and how they were taken are kept in docs/benchmarks.md.
package bench

import (
	"context"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"testing"
	"time"

	"go.uber.org/zap"

	"github.com/seine-net/seine/tests/sandbox"
)

func repoRoot() string {
	wd, _ := os.Getwd()
	return filepath.Clean(filepath.Join(wd, "..", ".."))
}

// up starts a sandbox for one benchmark and tears it down at the end.
func up(b *testing.B, name string, nodes int) *sandbox.Cluster {
	b.Helper()
	if os.Geteuid() != 0 {
		b.Skip("needs root")
	}
	os.Setenv("SEINE_BIN", filepath.Join(repoRoot(), "bin", "seine"))
	os.Setenv("SEINE_SANDBOX_BIN", filepath.Join(repoRoot(), "bin", "sandbox"))
	_ = sandbox.Down(name, "")
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	c, err := sandbox.Up(ctx, sandbox.Options{Name: name, Nodes: nodes, Log: zap.NewNop()})
	if err != nil {
		_ = sandbox.Down(name, "")
		b.Fatal(err)
	}
	b.Cleanup(func() {
		if os.Getenv("SEINE_BENCH_KEEP") != "" {
			b.Logf("keeping sandbox %s (SEINE_BENCH_KEEP); remove it with: bin/sandbox down --name %s", name, name)
			return
		}
		if err := sandbox.Down(name, ""); err != nil {
			b.Errorf("down: %v", err)
		}
	})
	return c
}

func netns(b *testing.B, name string) string {
	b.Helper()
	if out, err := exec.Command("ip", "netns", "add", name).CombinedOutput(); err != nil {
		b.Fatalf("ip netns add %s: %v: %s", name, err, out)
	}
	b.Cleanup(func() { _ = exec.Command("ip", "netns", "del", name).Run() })
	return "/run/netns/" + name
}

func percentile(d []time.Duration, p float64) time.Duration {
	s := append([]time.Duration(nil), d...)
	sort.Slice(s, func(i, j int) bool { return s[i] < s[j] })
	idx := int(p*float64(len(s))+0.5) - 1
	if idx < 0 {
		idx = 0
	}
	if idx >= len(s) {
		idx = len(s) - 1
	}
	return s[idx]
}

// iperf3 runs a 5-second TCP test from the client netns to the server's
// address and returns the received throughput in Gbit/s.
func iperf3(b *testing.B, serverNS, clientNS, serverIP string) float64 {
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
		out, err = exec.Command("ip", "netns", "exec", clientNS, "iperf3", "-c", serverIP, "-p", "5201", "-t", "5", "-J").Output()
		if err == nil {
			break
		}
	}
	if err != nil {
		b.Fatalf("iperf3 %s -> %s: %v\n%s", clientNS, serverIP, err, out)
	}
	var r struct {
		End struct {
			SumReceived struct {
				BitsPerSecond float64 `json:"bits_per_second"`
			} `json:"sum_received"`
		} `json:"end"`
	}
	if err := json.Unmarshal(out, &r); err != nil {
		b.Fatal(err)
	}
	return r.End.SumReceived.BitsPerSecond / 1e9
}

// vethBaseline measures iperf3 between two namespaces joined by a plain
// veth pair: the ceiling for this machine in this run.
func vethBaseline(b *testing.B) float64 {
	b.Helper()
	a, z := "seine-bperf-a", "seine-bperf-b"
	netns(b, a)
	netns(b, z)
	cmds := [][]string{
		{"ip", "-n", a, "link", "add", "va", "type", "veth", "peer", "name", "vb", "netns", z},
		{"ip", "-n", a, "addr", "add", "198.18.100.1/24", "dev", "va"},
		{"ip", "-n", z, "addr", "add", "198.18.100.2/24", "dev", "vb"},
		{"ip", "-n", a, "link", "set", "va", "up"},
		{"ip", "-n", z, "link", "set", "vb", "up"},
		{"ip", "-n", a, "link", "set", "lo", "up"},
		{"ip", "-n", z, "link", "set", "lo", "up"},
	}
	for _, c := range cmds {
		if out, err := exec.Command(c[0], c[1:]...).CombinedOutput(); err != nil {
			b.Fatalf("%v: %v: %s", c, err, out)
		}
	}
	return iperf3(b, z, a, "198.18.100.2")
}

// BenchmarkPodThroughput measures Pod-to-Pod TCP throughput on one Node and
// across Nodes, each as a ratio to a plain veth pair measured in the same
// run.
func BenchmarkPodThroughput(b *testing.B) {
	c := up(b, "bperf", 2)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	nodes := c.Nodes()
	mk := func(name, node string) (netnsName, ip string) {
		p, err := c.CreatePod(ctx, sandbox.PodSpec{Namespace: "perf", Name: name, Node: node})
		if err != nil {
			b.Fatal(err)
		}
		st, err := c.PodState("perf", name)
		if err != nil {
			b.Fatal(err)
		}
		return st.NetNS, p.Status.PodIP
	}
	srvNS, srvIP := mk("server", nodes[0].Name)
	localNS, _ := mk("local", nodes[0].Name)
	remoteNS, _ := mk("remote", nodes[1].Name)
	for i := 0; i < b.N; i++ {
		base := vethBaseline(b)
		same := iperf3(b, srvNS, localNS, srvIP)
		cross := iperf3(b, srvNS, remoteNS, srvIP)
		b.ReportMetric(base, "veth-Gbps")
		b.ReportMetric(same, "same-node-Gbps")
		b.ReportMetric(cross, "cross-node-Gbps")
		b.ReportMetric(same/base, "same-node-ratio")
		b.ReportMetric(cross/base, "cross-node-ratio")
	}
}
