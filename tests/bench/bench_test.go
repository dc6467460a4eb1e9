// Package bench holds Seine's end-to-end benchmarks on a real sandbox
// (`make bench`). Each benchmark brings up its own cluster and reports
// custom metrics (b.ReportMetric); run them with -benchtime 1x. The
// figures and how they were taken are kept in docs/benchmarks.md.
package bench

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"sync"
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

// BenchmarkCNIAdd measures CNI ADD latency through the installed conflist
// (seine, portmap, bandwidth) on one Node, for 50 Pods one after another
// and 50 at once. Metrics: p50 and p99 in milliseconds.
func BenchmarkCNIAdd(b *testing.B) {
	c := up(b, "bcni", 1)
	node := c.Nodes()[0].Name
	cc, err := c.CNI(node, nil)
	if err != nil {
		b.Fatal(err)
	}
	ctx := context.Background()
	const pods = 50
	run := func(label string, concurrent bool) {
		var mu sync.Mutex
		var lat []time.Duration
		var wg sync.WaitGroup
		var firstErr error
		add := func(i int) {
			defer wg.Done()
			rt := sandbox.RuntimeConf(fmt.Sprintf("%s%02d", label, i), netns(b, fmt.Sprintf("seine-bcni-%s%02d", label, i)))
			start := time.Now()
			_, err := cc.Add(ctx, rt)
			d := time.Since(start)
			mu.Lock()
			defer mu.Unlock()
			if err != nil && firstErr == nil {
				firstErr = err
			}
			lat = append(lat, d)
		}
		rts := make([]int, pods)
		for i := range rts {
			wg.Add(1)
			if concurrent {
				go add(i)
			} else {
				add(i)
			}
		}
		wg.Wait()
		if firstErr != nil {
			b.Fatalf("%s ADD: %v", label, firstErr)
		}
		b.ReportMetric(float64(percentile(lat, 0.5).Microseconds())/1000, label+"-p50-ms")
		b.ReportMetric(float64(percentile(lat, 0.99).Microseconds())/1000, label+"-p99-ms")
		for i := 0; i < pods; i++ {
			if err := cc.Del(ctx, sandbox.RuntimeConf(fmt.Sprintf("%s%02d", label, i), "")); err != nil {
				b.Fatal(err)
			}
		}
	}
	for i := 0; i < b.N; i++ {
		run("serial", false)
		run("parallel", true)
	}
}
