package ovsdaemon

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"go.uber.org/zap/zaptest"
	"k8s.io/apimachinery/pkg/util/wait"

	"github.com/seine-net/seine/tests/netnstest"
)

func pidOf(t *testing.T, runDir, daemon string) int {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(runDir, daemon+".pid"))
	if err != nil {
		return 0
	}
	pid, _ := strconv.Atoi(strings.TrimSpace(string(b)))
	return pid
}

// TestRunSupervisesAndStops runs both daemons (userspace datapath) in a
// fresh network namespace: Health answers; a killed ovs-vswitchd is
// restarted and keeps the bridges of the database; a second Run on the
// same database starts from it; cancelling Run stops both daemons.
func TestRunSupervisesAndStops(t *testing.T) {
	if _, err := exec.LookPath("ovs-vswitchd"); err != nil {
		t.Skip("Open vSwitch is not installed")
	}
	netnstest.Run(t, func() {
		dir := t.TempDir()
		cfg := Config{RunDir: filepath.Join(dir, "run"), DBFile: filepath.Join(dir, "db", "conf.db"), Datapath: DatapathNetdev,
			UserspaceTSO: true}
		if err := Health(context.Background(), cfg.RunDir); err == nil || !strings.Contains(err.Error(), "ovsdb-server") {
			t.Fatalf("health before start: %v", err)
		}
		for round := 1; round <= 2; round++ {
			ctx, cancel := context.WithCancel(context.Background())
			done := make(chan error, 1)
			checks := make(chan struct{})
			go func() {
				defer close(checks)
				healthy := func() {
					t.Helper()
					err := wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, 30*time.Second, true, func(ctx context.Context) (bool, error) {
						hctx, hcancel := context.WithTimeout(ctx, 2*time.Second)
						defer hcancel()
						return Health(hctx, cfg.RunDir) == nil, nil
					})
					if err != nil {
						t.Errorf("round %d: daemons not healthy: %v", round, err)
					}
				}
				healthy()
				vsctl := func(args ...string) string {
					out, err := exec.Command("ovs-vsctl", append([]string{"--db=unix:" + cfg.DBSocket(), "--timeout=10"}, args...)...).CombinedOutput()
					if err != nil {
						t.Errorf("ovs-vsctl %v: %v: %s", args, err, out)
					}
					return strings.TrimSpace(string(out))
				}
				// ovs-vswitchd started with userspace TSO (the key is set
				// before it starts).
				if got := vsctl("get", "Open_vSwitch", ".", "other_config:userspace-tso-enable"); got != `"true"` {
					t.Errorf("round %d: userspace-tso-enable = %s", round, got)
				}
				if round == 1 {
					vsctl("add-br", "br-sup", "--", "set", "Bridge", "br-sup", "datapath_type=netdev")
				} else if got := vsctl("list-br"); got != "br-sup" {
					t.Errorf("round 2 bridges %q: the database was not kept", got)
				}
				old := pidOf(t, cfg.RunDir, "ovs-vswitchd")
				if old == 0 {
					t.Error("no ovs-vswitchd pidfile")
					return
				}
				_ = syscall.Kill(old, syscall.SIGKILL)
				err := wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, 30*time.Second, true, func(context.Context) (bool, error) {
					p := pidOf(t, cfg.RunDir, "ovs-vswitchd")
					return p != 0 && p != old, nil
				})
				if err != nil {
					t.Errorf("round %d: ovs-vswitchd was not restarted", round)
				}
				healthy()
				if got := vsctl("list-br"); got != "br-sup" {
					t.Errorf("bridges after the restart: %q", got)
				}
			}()
			go func() { <-checks; cancel() }()
			done <- Run(ctx, cfg, zaptest.NewLogger(t))
			if err := <-done; err != nil {
				t.Fatalf("round %d: Run: %v", round, err)
			}
			for _, d := range []string{"ovsdb-server", "ovs-vswitchd"} {
				if p := pidOf(t, cfg.RunDir, d); p != 0 && syscall.Kill(p, 0) == nil {
					t.Errorf("round %d: %s (pid %d) still runs after Run returned", round, d, p)
					_ = syscall.Kill(p, syscall.SIGKILL)
				}
			}
		}
		if err := Health(context.Background(), cfg.RunDir); err == nil {
			t.Error("health after stop succeeded")
		}
	})
}

// TestRunGivesUp returns an error naming the daemon that keeps exiting.
func TestRunGivesUp(t *testing.T) {
	if _, err := exec.LookPath("ovs-vswitchd"); err != nil {
		t.Skip("Open vSwitch is not installed")
	}
	netnstest.Run(t, func() {
		dir := t.TempDir()
		cfg := Config{RunDir: filepath.Join(dir, "run"), DBFile: filepath.Join(dir, "db", "conf.db"), Datapath: DatapathNetdev,
			MaxRestarts: 1, RestartWindow: time.Minute}
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		go func() {
			var old int
			for i := 0; i < 2 && ctx.Err() == nil; i++ {
				err := wait.PollUntilContextTimeout(ctx, 50*time.Millisecond, 20*time.Second, true, func(context.Context) (bool, error) {
					p := pidOf(t, cfg.RunDir, "ovs-vswitchd")
					if p > 0 && p != old && syscall.Kill(p, 0) == nil {
						old = p
						return true, nil
					}
					return false, nil
				})
				if err != nil {
					// Run has returned (ctx cancelled) or never started
					// ovs-vswitchd again: nothing of ours to kill, and
					// kill(2) of pid 0 would hit the whole process group.
					return
				}
				_ = syscall.Kill(old, syscall.SIGKILL)
			}
		}()
		err := Run(ctx, cfg, zaptest.NewLogger(t))
		if err == nil || !strings.Contains(err.Error(), "ovs-vswitchd exited 2 times") {
			t.Fatalf("Run = %v, want it to give up on ovs-vswitchd", err)
		}
	})
}

// TestConfigRejectsUnknownDatapath names the bad value.
func TestConfigRejectsUnknownDatapath(t *testing.T) {
	err := Run(context.Background(), Config{Datapath: "dpdk"}, zaptest.NewLogger(t))
	if err == nil || !strings.Contains(err.Error(), `"dpdk"`) {
		t.Fatalf("Run = %v", err)
	}
}
