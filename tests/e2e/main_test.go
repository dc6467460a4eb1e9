// Package e2e holds Seine's end-to-end tests. They run against a real
// sandbox cluster (tests/sandbox): etcd, kube-apiserver,
// kube-controller-manager and kube-scheduler built from their Go modules,
// one network namespace per Node with its own ovsdb-server and
// ovs-vswitchd (userspace datapath), seine on every Node, and Pods in their
// own network namespaces. They must run as root.
package e2e

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

// sharedName is the sandbox most tests use ($SEINE_E2E_NAME, default
// "e2e", so that two runs on one machine can use different clusters);
// tests that need their own cluster use other names.
var sharedName = func() string {
	if n := os.Getenv("SEINE_E2E_NAME"); n != "" {
		return n
	}
	return "e2e"
}()

// shared is the 3-Node cluster, up for the whole run.
var shared *sandbox.Cluster

func repoRoot() string {
	wd, _ := os.Getwd()
	return filepath.Clean(filepath.Join(wd, "..", ".."))
}

func seineBin() string { return filepath.Join(repoRoot(), "bin", "seine") }

func TestMain(m *testing.M) {
	os.Exit(run(m))
}

func run(m *testing.M) int {
	if os.Geteuid() != 0 {
		fmt.Fprintln(os.Stderr, "e2e tests need root (network namespaces, OVS)")
		return 1
	}
	for _, b := range []string{"seine", "sandbox"} {
		if _, err := os.Stat(filepath.Join(repoRoot(), "bin", b)); err != nil {
			fmt.Fprintf(os.Stderr, "bin/%s missing: run `make build` first (%v)\n", b, err)
			return 1
		}
	}
	os.Setenv("SEINE_BIN", seineBin())
	os.Setenv("SEINE_SANDBOX_BIN", filepath.Join(repoRoot(), "bin", "sandbox"))
	// A crashed earlier run may have left a sandbox behind.
	_ = sandbox.Down(sharedName, "")
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	log, _ := zap.NewDevelopment()
	start := time.Now()
	if err := readModeEnv(); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	// Hybrid, which leaves Nodes through both the tunnel and the gateway,
	// runs the NAT checksum detour; the other modes the default rewrite.
	var set map[string]string
	if e2eMode == config.ModeHybrid {
		set = map[string]string{"natChecksum": config.NATChecksumDetour}
	}
	c, err := sandbox.Up(ctx, sandbox.Options{Name: sharedName, Nodes: 3, Mode: e2eMode, Subnets: e2eSubnets, Set: set, Log: log})
	if err != nil {
		fmt.Fprintf(os.Stderr, "sandbox up: %v\n", err)
		dumpLogs(sharedName)
		_ = sandbox.Down(sharedName, "")
		return 1
	}
	fmt.Fprintf(os.Stderr, "sandbox %s up with 3 Nodes in %d transport subnet(s), mode %s, tables %s, in %s\n",
		sharedName, e2eSubnets, e2eMode, map[bool]string{true: "full", false: "smoke"}[fullTables], time.Since(start).Round(time.Millisecond))
	shared = c
	code := m.Run()
	if code != 0 {
		dumpLogs(sharedName)
	}
	if os.Getenv("SEINE_E2E_KEEP") != "" {
		fmt.Fprintf(os.Stderr, "sandbox %s kept (SEINE_E2E_KEEP); remove it with: bin/sandbox down --name %s\n", sharedName, sharedName)
		return code
	}
	if err := sandbox.Down(sharedName, ""); err != nil {
		fmt.Fprintf(os.Stderr, "sandbox down: %v\n", err)
		return 1
	}
	return code
}

// dumpLogs prints the tail of every seine and kubelet log of a sandbox, for
// the CI log of a failed run.
func dumpLogs(name string) {
	c, err := sandbox.Load(name, "")
	if err != nil {
		return
	}
	for _, n := range c.Nodes() {
		for _, p := range []string{n.LogPath, n.KubeletLogPath} {
			b, err := os.ReadFile(p)
			if err != nil {
				continue
			}
			lines := strings.Split(strings.TrimRight(string(b), "\n"), "\n")
			if len(lines) > 60 {
				lines = lines[len(lines)-60:]
			}
			fmt.Fprintf(os.Stderr, "----- %s -----\n%s\n", p, strings.Join(lines, "\n"))
		}
	}
}

// ovs runs an OVS tool against a sandbox Node's own OVS.
func ovs(t *testing.T, n sandbox.Node, tool string, args ...string) string {
	t.Helper()
	out, err := tryOVS(n, tool, args...)
	if err != nil {
		t.Fatalf("%s %v on %s: %v\n%s", tool, args, n.Name, err, out)
	}
	return out
}

func tryOVS(n sandbox.Node, tool string, args ...string) (string, error) {
	switch tool {
	case "ovs-vsctl":
		args = append([]string{"--db=unix:" + filepath.Join(n.OVSRunDir, "db.sock"), "--timeout=10"}, args...)
	case "ovs-appctl":
		args = append([]string{"-t", filepath.Join(n.OVSRunDir, "ovs-vswitchd.ctl")}, args...)
	case "ovs-ofctl":
		args = append([]string{"-O", "OpenFlow15"}, args...)
	}
	cmd := exec.Command(tool, args...)
	cmd.Env = append(os.Environ(), "OVS_RUNDIR="+n.OVSRunDir)
	out, err := cmd.CombinedOutput()
	return string(out), err
}

// brInt is the path of a Node's integration bridge management socket.
func brInt(n sandbox.Node) string { return filepath.Join(n.OVSRunDir, "br-int.mgmt") }

// eventually polls cond every 200 ms until it returns nil or timeout passes.
func eventually(t *testing.T, timeout time.Duration, what string, cond func() error) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	var err error
	for {
		if err = cond(); err == nil {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: still failing after %s: %v", what, timeout, err)
		}
		time.Sleep(200 * time.Millisecond)
	}
}

func testCtx(t *testing.T, d time.Duration) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	t.Cleanup(cancel)
	return ctx
}

// stopSeine stops the seine daemon of node, and makes sure it runs again
// when the test ends (with the sandbox's configuration) even if the test
// fails before starting it: the tests after it need every Node's daemon.
// A test that starts it with another configuration restores that itself.
func stopSeine(t *testing.T, c *sandbox.Cluster, node string) {
	t.Helper()
	t.Cleanup(func() {
		n, err := c.Node(node)
		if err != nil || c.NodeProcesses(n)["seine"] {
			return
		}
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		if err := c.StartSeine(ctx, node, nil); err != nil {
			t.Errorf("starting seine on %s again: %v", node, err)
		}
	})
	if err := c.StopSeine(node); err != nil {
		t.Fatal(err)
	}
}
