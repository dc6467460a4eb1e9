// Package realnodes tests Seine installed the way users install it: on a
// sandbox of real Nodes (kubelet v1.36 and containerd with runc, each Node
// in network and mount namespaces of its own; `sandbox up --kubelet`),
// with nothing but `kubectl apply -f` of its manifest and its image
// imported into every Node's containerd. Pods are real containers of the
// e2e suite's agnhost image; the tests reach them with `kubectl exec`,
// which a real kubelet serves.
//
// It needs `make node-tools image` (the Makefile's e2e-test target builds
// them) and root.
package realnodes

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"go.uber.org/zap"

	"github.com/seine-net/seine/tests/sandbox"
)

// name is the sandbox of this package ($SEINE_REALNODES_NAME, default "rn").
var name = func() string {
	if n := os.Getenv("SEINE_REALNODES_NAME"); n != "" {
		return n
	}
	return "rn"
}()

// cluster is the 2-Node sandbox, up for the whole run.
var cluster *sandbox.Cluster

// hostSysctls are the machine-wide settings a kubelet wants to change,
// read before the sandbox came up (TestHostSysctlsUntouched).
var hostSysctls = map[string]string{
	"vm/overcommit_memory": "", "kernel/panic": "", "kernel/panic_on_oops": "",
}

func repoRoot() string {
	wd, _ := os.Getwd()
	return filepath.Clean(filepath.Join(wd, "..", "..", ".."))
}

func TestMain(m *testing.M) { os.Exit(run(m)) }

func run(m *testing.M) int {
	if os.Geteuid() != 0 {
		fmt.Fprintln(os.Stderr, "real-Node tests need root (namespaces, mounts, cgroups)")
		return 1
	}
	bin := filepath.Join(repoRoot(), "bin")
	os.Setenv("SEINE_BIN", filepath.Join(bin, "seine"))
	os.Setenv("SEINE_SANDBOX_BIN", filepath.Join(bin, "sandbox"))
	_ = sandbox.Down(name, "")
	for k := range hostSysctls {
		b, _ := os.ReadFile("/proc/sys/" + k)
		hostSysctls[k] = strings.TrimSpace(string(b))
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	log, _ := zap.NewDevelopment()
	start := time.Now()
	c, err := sandbox.Up(ctx, sandbox.Options{Name: name, Nodes: 2, Kubelet: true, Log: log})
	if err != nil {
		fmt.Fprintf(os.Stderr, "sandbox up --kubelet: %v\n", err)
		dumpLogs()
		_ = sandbox.Down(name, "")
		return 1
	}
	fmt.Fprintf(os.Stderr, "sandbox %s up with 2 real Nodes, seine installed by its manifest, in %s\n", name, time.Since(start).Round(time.Millisecond))
	cluster = c
	code := m.Run()
	if code != 0 {
		dumpLogs()
	}
	if os.Getenv("SEINE_E2E_KEEP") != "" {
		fmt.Fprintf(os.Stderr, "keeping sandbox %s (SEINE_E2E_KEEP)\n", name)
		return code
	}
	if err := sandbox.Down(name, ""); err != nil {
		fmt.Fprintf(os.Stderr, "sandbox down: %v\n", err)
		if code == 0 {
			code = 1
		}
	}
	// Nothing of the real Nodes is left: their cgroups, with every
	// container process, went with them.
	if left, _ := filepath.Glob("/sys/fs/cgroup/pids/" + name + "-node-*"); len(left) > 0 {
		fmt.Fprintf(os.Stderr, "sandbox down left cgroups %v\n", left)
		if code == 0 {
			code = 1
		}
	}
	return code
}

// dumpLogs prints the tail of every Node's kubelet, containerd and seine
// logs, for a failed run.
func dumpLogs() {
	dir := sandbox.StateDir(name, "")
	for _, pattern := range []string{"n*/kubelet.log", "n*/containerd.log", "n*/overlay/var/upper/log/pods/seine-system_*/*/*.log"} {
		files, _ := filepath.Glob(filepath.Join(dir, pattern))
		for _, f := range files {
			b, err := os.ReadFile(f)
			if err != nil {
				continue
			}
			lines := strings.Split(strings.TrimRight(string(b), "\n"), "\n")
			if len(lines) > 40 {
				lines = lines[len(lines)-40:]
			}
			fmt.Fprintf(os.Stderr, "==> %s <==\n%s\n", f, strings.Join(lines, "\n"))
		}
	}
}

func testCtx(t testing.TB, d time.Duration) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	t.Cleanup(cancel)
	return ctx
}

// kubectl runs kubectl against the sandbox and fails the test on error.
func kubectl(t *testing.T, args ...string) string {
	t.Helper()
	out, err := cluster.Kubectl(testCtx(t, 2*time.Minute), args...)
	if err != nil {
		t.Fatalf("kubectl %s: %v", strings.Join(args, " "), err)
	}
	return out
}
