package compute

import (
	"bufio"
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"strconv"
	"syscall"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/seine-net/seine/policy/compute/workloads"
)

// Environment of BenchmarkSideBySide.
const (
	// envChild names the workload a re-executed test binary computes.
	envChild = "SEINE_COMPUTE_CHILD"
	// envAntreaTest is the path of Antrea's controller test binary
	// (tests/bench/antrea/build.sh); default
	// ~/.cache/seine/antrea-v2.4.0/networkpolicy.test.
	envAntreaTest = "SEINE_ANTREA_TEST"
)

// antreaTests are Antrea's tests of the same four shapes, in workload
// order (antrea-io/antrea pkg/controller/networkpolicy,
// networkpolicy_controller_perf_test.go).
var antreaTests = []string{
	"TestInitXLargeScaleWithSmallNamespaces",
	"TestInitXLargeScaleWithLargeNamespaces",
	"TestInitXLargeScaleWithOneNamespace",
	"TestInitXLargeScaleWithNetpolPerPod",
}

// proc is what one child process cost.
type proc struct {
	compute time.Duration // as the child itself reports it
	heapMB  float64       // peak heap the child reports (Antrea only)
	wall    time.Duration // the whole process, generating the inputs included
	rssMB   float64       // peak resident set of the whole process
}

// BenchmarkSideBySide computes each of the four scale workloads in a
// fresh process, and, when Antrea's controller test binary is there (see
// tests/bench/antrea/build.sh), runs Antrea's four TestInitXLargeScale*
// tests the same way, alternating, on the same machine: so both are
// measured as users compare them, by the peak RSS of the whole process
// (the inputs, which each test generates in its process, included: Seine's
// Pods in the compact form its controller's informer keeps, Antrea's as
// its test holds them) and time.
//
// Metrics per workload N: seine-wN-s (feeding the model and building every
// object, the child's own timing), seine-wN-rss-MB, seine-wN-wall-s (the
// process from exec to exit); antrea-wN-s (the TIME its test reports: from
// starting the informers to the last computation), antrea-wN-heap-MB (its
// reported MEMORY: the peak of MemStats.Alloc sampled every 500 ms),
// antrea-wN-rss-MB, antrea-wN-wall-s; and speedup-wN (Antrea's time over
// Seine's), rss-ratio-wN (Seine's peak RSS over Antrea's).
func BenchmarkSideBySide(b *testing.B) {
	antrea := os.Getenv(envAntreaTest)
	if antrea == "" {
		home, _ := os.UserHomeDir()
		antrea = filepath.Join(home, ".cache", "seine", "antrea-v2.4.0", "networkpolicy.test")
	}
	if _, err := os.Stat(antrea); err != nil {
		b.Logf("Antrea's controller test binary %s not found (tests/bench/antrea/build.sh builds it): Seine alone", antrea)
		antrea = ""
	}
	for i := 0; i < b.N; i++ {
		for w, spec := range workloads.All(1) {
			label := fmt.Sprintf("w%d", w+1)
			s := runSeineChild(b, spec.Name)
			b.ReportMetric(s.compute.Seconds(), "seine-"+label+"-s")
			b.ReportMetric(s.rssMB, "seine-"+label+"-rss-MB")
			b.ReportMetric(s.wall.Seconds(), "seine-"+label+"-wall-s")
			if antrea == "" {
				continue
			}
			a := runAntreaTest(b, antrea, antreaTests[w])
			b.ReportMetric(a.compute.Seconds(), "antrea-"+label+"-s")
			b.ReportMetric(a.heapMB, "antrea-"+label+"-heap-MB")
			b.ReportMetric(a.rssMB, "antrea-"+label+"-rss-MB")
			b.ReportMetric(a.wall.Seconds(), "antrea-"+label+"-wall-s")
			b.ReportMetric(a.compute.Seconds()/s.compute.Seconds(), "speedup-"+label)
			b.ReportMetric(s.rssMB/a.rssMB, "rss-ratio-"+label)
		}
	}
}

// runChild runs cmd and returns its output, wall time and peak RSS.
func runChild(b *testing.B, cmd *exec.Cmd) ([]byte, proc) {
	b.Helper()
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	start := time.Now()
	err := cmd.Run()
	p := proc{wall: time.Since(start)}
	if cmd.ProcessState != nil {
		if ru, ok := cmd.ProcessState.SysUsage().(*syscall.Rusage); ok {
			p.rssMB = float64(ru.Maxrss) / 1024 // kilobytes on Linux
		}
	}
	if err != nil {
		b.Logf("%s: %v\n%s", cmd.Args, err, out.Bytes())
	}
	return out.Bytes(), p
}

var childResult = regexp.MustCompile(`(?m)^RESULT ([0-9.]+) s$`)

func runSeineChild(b *testing.B, workload string) proc {
	b.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^TestComputeChild$", "-test.count=1")
	cmd.Env = append(os.Environ(), envChild+"="+workload)
	out, p := runChild(b, cmd)
	m := childResult.FindSubmatch(out)
	if m == nil {
		b.Fatalf("workload %s: no result in\n%s", workload, out)
	}
	s, _ := strconv.ParseFloat(string(m[1]), 64)
	p.compute = time.Duration(s * float64(time.Second))
	return p
}

// antreaSummary matches the line after "Summary metrics:" that Antrea's
// test logs: namespaces, entities, policies, TIME(s), MEMORY(M), ...
var antreaSummary = regexp.MustCompile(`^\s*(\d+)\s+(\d+)\s+(\d+)\s+([0-9.]+)\s+(\d+)\s`)

func runAntreaTest(b *testing.B, binary, test string) proc {
	b.Helper()
	cmd := exec.Command(binary, "-test.run=^"+test+"$", "-test.v", "-test.count=1", "-test.timeout=30m")
	out, p := runChild(b, cmd)
	sc := bufio.NewScanner(bytes.NewReader(out))
	summary := false
	for sc.Scan() {
		line := sc.Text()
		if bytes.Contains([]byte(line), []byte("Summary metrics:")) {
			summary = true
			continue
		}
		if !summary {
			continue
		}
		if m := antreaSummary.FindStringSubmatch(line); m != nil {
			s, _ := strconv.ParseFloat(m[4], 64)
			mb, _ := strconv.ParseFloat(m[5], 64)
			p.compute, p.heapMB = time.Duration(s*float64(time.Second)), mb
			return p
		}
	}
	b.Fatalf("%s: no summary in its output:\n%s", test, out)
	return p
}

// cachedPod mirrors what the policy controller's Pod informer keeps of a
// Pod (policy/controller's cachedPod): the metadata its key needs and
// the model's PodInfo.
type cachedPod struct {
	meta metav1.ObjectMeta
	info PodInfo
}

// TestComputeChild is BenchmarkSideBySide's child: with SEINE_COMPUTE_CHILD
// set to a workload's name it builds the workload, keeping each Pod in the
// compact form the controller's informer keeps (the full Pod is dropped as
// soon as it is made, as the informer's transform drops it), feeds a model
// and builds every object, and prints the time the feeding and building
// took; otherwise it does nothing.
func TestComputeChild(t *testing.T) {
	name := os.Getenv(envChild)
	if name == "" {
		t.Skip("run by BenchmarkSideBySide")
	}
	for _, spec := range workloads.All(1) {
		if spec.Name != name {
			continue
		}
		var pods []cachedPod
		w := spec.Build(workloads.PodsTo(func(p *corev1.Pod) {
			pods = append(pods, cachedPod{
				meta: metav1.ObjectMeta{Namespace: p.Namespace, Name: p.Name, UID: p.UID, ResourceVersion: p.ResourceVersion},
				info: PodInfoOf(p)})
		}))
		runtime.GC()
		start := time.Now()
		m := New(0)
		for _, n := range w.Nodes {
			m.UpsertNode(n)
		}
		for _, ns := range w.Namespaces {
			m.UpsertNamespace(ns)
		}
		for i := range pods {
			m.UpsertPodInfo(pods[i].info)
		}
		for _, np := range w.Policies {
			m.UpsertNetworkPolicy(np)
		}
		objs := buildAll(m, m.TakeDirty())
		d := time.Since(start)
		runtime.KeepAlive(m)
		runtime.KeepAlive(w)
		runtime.KeepAlive(pods)
		fmt.Printf("RESULT %.3f s\n%d objects\n", d.Seconds(), objs)
		return
	}
	t.Fatalf("no workload %q", name)
}
