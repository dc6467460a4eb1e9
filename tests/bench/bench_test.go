// Package bench holds Seine's end-to-end benchmarks on a real sandbox
// (`make bench`). Each benchmark brings up its own cluster and reports
// custom metrics (b.ReportMetric); run them with -benchtime 1x. The
// figures and how they were taken are kept in docs/benchmarks.md.
package bench

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"

	"go.uber.org/zap"

	"github.com/seine-net/seine/tests/sandbox"
)

func repoRoot() string {
	wd, _ := os.Getwd()
	return filepath.Clean(filepath.Join(wd, "..", ".."))
}

// up starts a sandbox for one benchmark and tears it down at the end;
// set (may be nil) overrides the daemons' configuration
// (sandbox.Options.Set).
func up(b *testing.B, name string, nodes int, set map[string]string) *sandbox.Cluster {
	b.Helper()
	if os.Geteuid() != 0 {
		b.Skip("needs root")
	}
	os.Setenv("SEINE_BIN", filepath.Join(repoRoot(), "bin", "seine"))
	os.Setenv("SEINE_SANDBOX_BIN", filepath.Join(repoRoot(), "bin", "sandbox"))
	_ = sandbox.Down(name, "")
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	c, err := sandbox.Up(ctx, sandbox.Options{Name: name, Nodes: nodes, Set: set, Log: zap.NewNop()})
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
