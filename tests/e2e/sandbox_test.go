package e2e

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"testing"
	"time"

	"go.uber.org/zap/zaptest"

	"github.com/seine-net/seine/node/config"
	"github.com/seine-net/seine/tests/sandbox"
)

// machineState lists what a sandbox could leave behind on the host.
func machineState(t *testing.T) string {
	t.Helper()
	var parts []string
	add := func(title string, lines []string) {
		sort.Strings(lines)
		parts = append(parts, title+":\n  "+strings.Join(lines, "\n  "))
	}
	run := func(args ...string) []byte {
		out, err := exec.Command(args[0], args[1:]...).Output()
		if err != nil {
			t.Fatalf("%s: %v", strings.Join(args, " "), err)
		}
		return out
	}
	out := run("ip", "netns", "list")
	add("netns", strings.Split(strings.TrimSpace(string(out)), "\n"))
	out = run("ip", "-o", "link", "show")
	var links []string
	for _, l := range strings.Split(strings.TrimSpace(string(out)), "\n") {
		if f := strings.Fields(l); len(f) > 1 {
			links = append(links, f[1])
		}
	}
	add("links", links)
	mounts, err := os.ReadFile("/proc/mounts")
	if err != nil {
		t.Fatal(err)
	}
	var ms []string
	for _, l := range strings.Split(string(mounts), "\n") {
		if strings.Contains(l, "netns") || strings.Contains(l, "seine") {
			ms = append(ms, l)
		}
	}
	add("mounts", ms)
	var procs []string
	entries, err := os.ReadDir("/proc")
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range entries {
		b, err := os.ReadFile(filepath.Join("/proc", e.Name(), "cmdline"))
		if err != nil || len(b) == 0 {
			continue
		}
		cmd := strings.ReplaceAll(string(b), "\x00", " ")
		for _, w := range []string{"ovs-vswitchd", "ovsdb-server", "kube-apiserver", "etcd", "kube-controller-manager", "kube-scheduler", "seine node", "sandbox kubelet"} {
			if strings.Contains(cmd, w) && !strings.Contains(cmd, "/"+sharedName+"/") && !strings.Contains(cmd, "seine-"+sharedName+"-") {
				procs = append(procs, cmd)
			}
		}
	}
	add("processes", procs)
	files, _ := filepath.Glob("/run/seine-sandbox/*")
	add("state dirs", files)
	return strings.Join(parts, "\n")
}

// TestSmallSandbox brings up its own one-Node sandbox whose podCIDR is a /29
// (five Pod addresses): it checks that exhausting the pool gives the CNI
// error for it and leaves no state, then that `down` leaves the machine as
// it found it.
func TestSmallSandbox(t *testing.T) {
	requireMode(t, config.ModeEncap) // the same in every mode: once is enough
	const name = "e2esmall"
	_ = sandbox.Down(name, "")
	before := machineState(t)
	ctx := testCtx(t, 5*time.Minute)
	c, err := sandbox.Up(ctx, sandbox.Options{Name: name, Nodes: 1, NodeCIDRMaskSize: 29, Log: zaptest.NewLogger(t)})
	if err != nil {
		_ = sandbox.Down(name, "")
		t.Fatalf("up: %v", err)
	}
	downed := false
	t.Cleanup(func() {
		if !downed {
			_ = sandbox.Down(name, "")
		}
	})

	t.Run("IP pool exhausted", func(t *testing.T) {
		n := c.Nodes()[0]
		if cidr := nodePodCIDR(t, c, n.Name); !strings.HasSuffix(cidr, "/29") {
			t.Fatalf("podCIDR %s, want a /29", cidr)
		}
		e := newCNIEnv(t, c, n, nil)
		netns := newPodNS(t, "seine-e2esmall-exhaust")
		var added []string
		var lastErr error
		for i := 0; i < 8; i++ {
			id := fmt.Sprintf("exhaust%d", i)
			if _, err := e.add(ctx, e.rt(id, netns)); err != nil {
				lastErr = err
				break
			}
			added = append(added, id)
			// One netns holds one eth0: give each ADD its own.
			netns = newPodNS(t, fmt.Sprintf("seine-e2esmall-exh%d", i))
		}
		// A /29 has 8 addresses: network, gateway, broadcast and 5 for Pods.
		if len(added) != 5 {
			t.Fatalf("%d ADDs succeeded before the pool ran out, want 5 (last error %v)", len(added), lastErr)
		}
		if got := cniCode(lastErr); got != 100 {
			t.Fatalf("exhausted pool: error code %d (%v), want 100", got, lastErr)
		}
		if !strings.Contains(lastErr.Error(), "exhausted") {
			t.Errorf("error %q does not name the cause", lastErr)
		}
		before := snapshot(t, c, n)
		_, err := e.add(ctx, e.rt("exhaust-again", netns))
		if cniCode(err) != 100 {
			t.Fatalf("second exhausted ADD: %v", err)
		}
		if after := snapshot(t, c, n); after != before {
			t.Fatalf("a failed ADD left state: before %+v, after %+v", before, after)
		}
		for _, id := range added {
			if err := e.del(ctx, e.rt(id, "")); err != nil {
				t.Fatal(err)
			}
		}
	})

	downed = true
	if err := sandbox.Down(name, ""); err != nil {
		t.Fatalf("down: %v", err)
	}
	after := machineState(t)
	if after != before {
		t.Fatalf("the machine differs after up and down:\nbefore:\n%s\nafter:\n%s", before, after)
	}
}
