//go:build conformance

// Package conformance runs the upstream Kubernetes e2e suite (e2e.test from
// the v1.36.3 module, `make e2e-tools`) against Seine installed by its
// manifest on a sandbox of real Nodes: the focus the anchors run for a CNI
// (sig-network's [Conformance] tests, the NetworkPolicy suite, Services),
// less what this machine cannot run (see skips). `make conformance` runs
// it; docs/conformance.md records the outcome.
package conformance

import (
	"context"
	"encoding/xml"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"

	"go.uber.org/zap"

	"github.com/seine-net/seine/tests/sandbox"
)

// Focus selects sig-network's conformance tests, the NetworkPolicy suite
// (Netpol, [Feature:NetworkPolicy]) and the Services tests.
const Focus = `\[sig-network\].*(\[Conformance\]|\[Feature:NetworkPolicy\]|Services)`

// Skips lists what is left out, and why (docs/conformance.md).
var Skips = []struct{ Pattern, Why string }{
	{`LoadBalancer|ESIPP|\[Feature:LoadBalancer\]`, "needs a cloud provider's load balancers"},
	{`SCTP`, "this kernel has no SCTP sockets"},
	{`IPv6|[Dd]ual[- ]?[Ss]tack|\[Feature:IPv6DualStack\]`, "Seine and the sandbox are IPv4 only"},
	{`\[Disruptive\]`, "restarts kube-proxy or the API server over SSH, which the sandbox does not provide"},
	{`\[Flaky\]`, "upstream marks them flaky"},
	{`\[Feature:(ServiceCIDRs|Traffic[A-Za-z]*|NetworkPolicyStatus)\]|\[Alpha\]|\[Beta\]`, "feature gates this API server does not enable"},
}

func skipRegexp() string {
	var ps []string
	for _, s := range Skips {
		ps = append(ps, s.Pattern)
	}
	return strings.Join(ps, "|")
}

func repoRoot() string {
	wd, _ := os.Getwd()
	return filepath.Clean(filepath.Join(wd, "..", ".."))
}

// junit is the part of ginkgo's JUnit report this reads.
type junit struct {
	Suites []struct {
		Cases []struct {
			Name    string    `xml:"name,attr"`
			Time    float64   `xml:"time,attr"`
			Status  string    `xml:"status,attr"`
			Failure *struct{} `xml:"failure"`
			Error   *struct{} `xml:"error"`
			Skipped *struct{} `xml:"skipped"`
		} `xml:"testcase"`
	} `xml:"testsuite"`
}

// TestConformance brings up 3 real Nodes, runs the selected specs with
// ginkgo ($SEINE_CONFORMANCE_PROCS processes, default 4) from the control
// plane's namespace, and fails on any failed spec. The report (JUnit, the
// full log, a summary) goes to $SEINE_CONFORMANCE_OUT (default
// bin/conformance).
func TestConformance(t *testing.T) {
	nodeBin := os.Getenv("SEINE_NODE_BIN")
	e2eBin := os.Getenv("SEINE_E2E_BIN")
	for _, f := range []string{filepath.Join(e2eBin, "e2e.test"), filepath.Join(e2eBin, "ginkgo"), filepath.Join(nodeBin, "kubectl")} {
		if _, err := os.Stat(f); err != nil {
			t.Fatalf("%v: run `make node-tools e2e-tools` (SEINE_NODE_BIN, SEINE_E2E_BIN)", err)
		}
	}
	out := os.Getenv("SEINE_CONFORMANCE_OUT")
	if out == "" {
		out = filepath.Join(repoRoot(), "bin", "conformance")
	}
	if err := os.MkdirAll(out, 0o755); err != nil {
		t.Fatal(err)
	}
	procs := 4
	if p, err := strconv.Atoi(os.Getenv("SEINE_CONFORMANCE_PROCS")); err == nil && p > 0 {
		procs = p
	}
	bin := filepath.Join(repoRoot(), "bin")
	t.Setenv("SEINE_BIN", filepath.Join(bin, "seine"))
	t.Setenv("SEINE_SANDBOX_BIN", filepath.Join(bin, "sandbox"))
	const name = "cf"
	_ = sandbox.Down(name, "")
	t.Cleanup(func() {
		if os.Getenv("SEINE_E2E_KEEP") == "" {
			if err := sandbox.Down(name, ""); err != nil {
				t.Errorf("sandbox down: %v", err)
			}
		}
	})
	log, _ := zap.NewDevelopment()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	c, err := sandbox.Up(ctx, sandbox.Options{Name: name, Nodes: 3, Kubelet: true, Log: log})
	cancel()
	if err != nil {
		t.Fatalf("sandbox up --kubelet: %v", err)
	}

	logFile, err := os.Create(filepath.Join(out, "e2e.log"))
	if err != nil {
		t.Fatal(err)
	}
	defer logFile.Close()
	args := []string{"--net=/run/netns/seine-" + name + "-cp", "--",
		filepath.Join(e2eBin, "ginkgo"), "--procs=" + strconv.Itoa(procs), "--no-color", "--timeout=3h",
		"--focus=" + Focus, "--skip=" + skipRegexp(),
		"--output-dir=" + out, "--junit-report=junit.xml",
		filepath.Join(e2eBin, "e2e.test"), "--",
		"--kubeconfig=" + c.InternalKubeconfig(), "--provider=skeleton", "--node-os-distro=debian",
		"--dns-domain=cluster.local", "--dump-logs-on-failure=false",
		// e2e.test counts the Nodes only in the first ginkgo process; the
		// others would see -1 and skip every spec that needs two Nodes.
		"--num-nodes=" + strconv.Itoa(len(c.Nodes())),
	}
	// A report left by an earlier run must not stand in for this one's.
	if err := os.Remove(filepath.Join(out, "junit.xml")); err != nil && !errors.Is(err, fs.ErrNotExist) {
		t.Fatal(err)
	}
	cmd := exec.Command("nsenter", args...)
	cmd.Env = append(os.Environ(), "PATH="+nodeBin+":"+os.Getenv("PATH"))
	cmd.Stdout, cmd.Stderr = logFile, logFile
	start := time.Now()
	runErr := cmd.Run()
	t.Logf("e2e.test ran %s (%v); log %s", time.Since(start).Round(time.Second), runErr, logFile.Name())

	b, err := os.ReadFile(filepath.Join(out, "junit.xml"))
	if err != nil {
		t.Fatalf("no JUnit report: %v", err)
	}
	var r junit
	if err := xml.Unmarshal(b, &r); err != nil {
		t.Fatal(err)
	}
	var passed, skipped []string
	var failed []string
	for _, s := range r.Suites {
		for _, tc := range s.Cases {
			switch {
			case tc.Failure != nil || tc.Error != nil:
				failed = append(failed, tc.Name)
			case tc.Skipped != nil || tc.Status == "skipped":
				skipped = append(skipped, tc.Name)
			default:
				if strings.Contains(tc.Name, "[sig-network]") {
					passed = append(passed, fmt.Sprintf("%s (%.0fs)", tc.Name, tc.Time))
				}
			}
		}
	}
	sort.Strings(passed)
	sort.Strings(failed)
	summary := fmt.Sprintf("focus %s\nskip %s\npassed %d, failed %d, in %s\n\nFAILED\n%s\n\nPASSED\n%s\n",
		Focus, skipRegexp(), len(passed), len(failed), time.Since(start).Round(time.Second),
		strings.Join(failed, "\n"), strings.Join(passed, "\n"))
	if err := os.WriteFile(filepath.Join(out, "summary.txt"), []byte(summary), 0o644); err != nil {
		t.Error(err)
	}
	t.Logf("passed %d, failed %d; summary %s", len(passed), len(failed), filepath.Join(out, "summary.txt"))
	for _, f := range failed {
		t.Errorf("failed: %s", f)
	}
	if len(passed) == 0 {
		t.Errorf("no spec passed (ginkgo: %v)", runErr)
	}
	if runErr != nil && len(failed) == 0 {
		// ginkgo failed without a failed spec: a suite-level failure
		// (setup, timeout, interruption) the report does not list.
		t.Errorf("ginkgo failed with no failed spec in its report: %v; log %s", runErr, logFile.Name())
	}
}
