package e2e

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/containernetworking/cni/libcni"
	"github.com/containernetworking/cni/pkg/types"
	types100 "github.com/containernetworking/cni/pkg/types/100"

	"github.com/seine-net/seine/node/cni/wire"
	"github.com/seine-net/seine/node/config"
	"github.com/seine-net/seine/node/podnet"
	"github.com/seine-net/seine/tests/sandbox"
)

// newCNIEnv returns a libcni client for the Node (the installed conflist
// when conflist is nil).
func newCNIEnv(t *testing.T, c *sandbox.Cluster, n sandbox.Node, conflist []byte) *cniEnv {
	t.Helper()
	cc, err := c.CNI(n.Name, conflist)
	if err != nil {
		t.Fatal(err)
	}
	return &cniEnv{cc}
}

// cniEnv wraps sandbox.CNIClient for these tests.
type cniEnv struct{ *sandbox.CNIClient }

func (e *cniEnv) rt(containerID, netns string) *libcni.RuntimeConf {
	return sandbox.RuntimeConf(containerID, netns)
}

func (e *cniEnv) add(ctx context.Context, rt *libcni.RuntimeConf) (types.Result, error) {
	return e.Add(ctx, rt)
}

func (e *cniEnv) del(ctx context.Context, rt *libcni.RuntimeConf) error { return e.Del(ctx, rt) }

// delAtCleanup DELs rt when the test ends (DEL is idempotent): register it
// once its ADD succeeded, so a failing step leaves no address, port or
// flows on the Node.
func (e *cniEnv) delAtCleanup(t *testing.T, rt *libcni.RuntimeConf) {
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		if err := e.del(ctx, rt); err != nil {
			t.Errorf("DEL of %s at cleanup: %v", rt.ContainerID, err)
		}
	})
}

// newPodNS creates a named network namespace and removes it at cleanup.
func newPodNS(t *testing.T, name string) string {
	t.Helper()
	if out, err := exec.Command("ip", "netns", "add", name).CombinedOutput(); err != nil {
		t.Fatalf("ip netns add %s: %v: %s", name, err, out)
	}
	t.Cleanup(func() { _ = exec.Command("ip", "netns", "del", name).Run() })
	return "/run/netns/" + name
}

// nodeState is what a Pod attachment leaves on a Node; two snapshots are
// equal when nothing leaked.
type nodeState struct {
	Veths, Ports, Flows, IPs, NATRules int
}

func snapshot(t *testing.T, c *sandbox.Cluster, n sandbox.Node) nodeState {
	t.Helper()
	ctx := testCtx(t, 30*time.Second)
	var s nodeState
	out, err := c.NodeExec(ctx, n.Name, "ip", "-o", "link", "show", "type", "veth")
	if err != nil {
		t.Fatalf("listing veths: %v", err)
	}
	s.Veths = countLines(string(out))
	s.Ports = countLines(ovs(t, n, "ovs-vsctl", "list-ports", "br-int"))
	s.Flows = countLines(ovs(t, n, "ovs-ofctl", "--no-stats", "dump-flows", brInt(n)))
	s.IPs = strings.Count(ipamAllocations(t, c, n), `"containerID"`)
	out, err = c.NodeExec(ctx, n.Name, "nft", "list", "ruleset")
	if err != nil {
		t.Fatalf("listing nftables rules: %v", err)
	}
	s.NATRules = countLines(string(out))
	return s
}

func countLines(s string) int {
	n := 0
	for _, l := range strings.Split(s, "\n") {
		if strings.TrimSpace(l) != "" {
			n++
		}
	}
	return n
}

// requireSeineIPAM skips a test of seine's own attachments (its IPAM,
// veths and conflist) in networkPolicyOnly mode, where the primary CNI
// makes them (TestModePolicyOnly* test seine's part there).
func requireSeineIPAM(t *testing.T) {
	t.Helper()
	requireMode(t, config.ModeEncap, config.ModeNoEncap, config.ModeHybrid)
}

// ipamAllocations is the allocation map of a Node's IPAM state file,
// IP → owner, re-encoded as JSON ("{}" when there is none).
func ipamAllocations(t *testing.T, c *sandbox.Cluster, n sandbox.Node) string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(n.Dir, "seine", "ipam", "allocations.json"))
	if errors.Is(err, os.ErrNotExist) {
		return "{}"
	}
	if err != nil {
		t.Fatal(err)
	}
	var st struct {
		Allocations map[string]json.RawMessage `json:"allocations"`
	}
	if err := json.Unmarshal(b, &st); err != nil {
		t.Fatalf("IPAM state of %s: %v", n.Name, err)
	}
	out, _ := json.Marshal(st.Allocations)
	return string(out)
}

// TestCNIAddDelCyclesLeakNothing runs 200 ADD/DEL cycles through the
// installed conflist (seine alone, serving the portMappings and bandwidth
// capabilities; every fourth ADD has a hostPort and both rates) and
// compares the Node's veths, OVS ports, flows, IP allocations and
// nftables ruleset before and after.
func TestCNIAddDelCyclesLeakNothing(t *testing.T) {
	requireSeineIPAM(t)
	c := shared
	n := c.Nodes()[2]
	e := newCNIEnv(t, c, n, nil)
	netns := newPodNS(t, "seine-e2e-cycles")
	ctx := testCtx(t, 10*time.Minute)
	before := snapshot(t, c, n)
	const cycles = 200
	seen := map[string]bool{}
	var pending *libcni.RuntimeConf // added and not yet deleted
	t.Cleanup(func() {
		if pending != nil {
			_ = e.del(context.Background(), pending)
		}
	})
	for i := 0; i < cycles; i++ {
		rt := e.rt(fmt.Sprintf("cycle%03d", i), netns)
		if i%4 == 0 {
			rt.CapabilityArgs = map[string]any{
				"portMappings": []map[string]any{{"hostPort": 31000 + i, "containerPort": 80, "protocol": "tcp"}},
				"bandwidth":    map[string]any{"ingressRate": 10_000_000, "egressRate": 10_000_000},
			}
		}
		res, err := e.add(ctx, rt)
		if err != nil {
			t.Fatalf("cycle %d ADD: %v", i, err)
		}
		pending = rt
		if i == 0 {
			out, err := c.NodeExec(ctx, n.Name, "nft", "list", "table", "ip", "seine-hostport")
			if err != nil || !strings.Contains(string(out), "tcp . 31000 ") {
				t.Fatalf("the first ADD's hostPort is not mapped: %v\n%s", err, out)
			}
		}
		r, err := types100.NewResultFromResult(res)
		if err != nil || len(r.IPs) != 1 {
			t.Fatalf("cycle %d ADD result %v: %v", i, res, err)
		}
		seen[r.IPs[0].Address.IP.String()] = true
		if err := e.del(ctx, rt); err != nil {
			t.Fatalf("cycle %d DEL: %v", i, err)
		}
		pending = nil
	}
	after := snapshot(t, c, n)
	if before != after {
		t.Fatalf("after %d ADD/DEL cycles the Node changed: before %+v, after %+v", cycles, before, after)
	}
	if len(seen) < cycles/2 {
		t.Errorf("only %d distinct addresses over %d ADDs: addresses reused at once", len(seen), cycles)
	}
}

// TestCNIConcurrentAddsLeakNothing runs 200 ADDs at once through the
// installed conflist, then 200 DELs at once: every ADD succeeds with its
// own address, and afterwards the Node has no more veths, OVS ports,
// flows, IP allocations or nftables rules than before.
func TestCNIConcurrentAddsLeakNothing(t *testing.T) {
	c := shared
	n := c.Nodes()[2]
	e := newCNIEnv(t, c, n, nil)
	const pods = 200
	rts := make([]*libcni.RuntimeConf, pods)
	for i := range rts {
		rts[i] = e.rt(fmt.Sprintf("conc%03d", i), newPodNS(t, fmt.Sprintf("seine-e2e-conc%03d", i)))
	}
	ctx := testCtx(t, 10*time.Minute)
	before := snapshot(t, c, n)
	errs := make([]error, pods)
	ips := make([]string, pods)
	var wg sync.WaitGroup
	for i := range rts {
		wg.Add(1)
		go func() {
			defer wg.Done()
			res, err := e.add(ctx, rts[i])
			if err != nil {
				errs[i] = err
				return
			}
			r, err := types100.NewResultFromResult(res)
			if err != nil || len(r.IPs) != 1 {
				errs[i] = fmt.Errorf("result %v: %v", res, err)
				return
			}
			ips[i] = r.IPs[0].Address.IP.String()
		}()
	}
	wg.Wait()
	seen := map[string]int{}
	for i, err := range errs {
		if err != nil {
			t.Errorf("ADD %d: %v", i, err)
			continue
		}
		if j, dup := seen[ips[i]]; dup {
			t.Errorf("ADDs %d and %d both got %s", j, i, ips[i])
		}
		seen[ips[i]] = i
	}
	if during := snapshot(t, c, n); during.IPs != before.IPs+len(seen) || during.Ports != before.Ports+len(seen) {
		t.Errorf("with %d Pods attached: %+v, before %+v", len(seen), during, before)
	}
	for i := range rts {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := e.del(ctx, rts[i]); err != nil {
				t.Errorf("DEL %d: %v", i, err)
			}
		}()
	}
	wg.Wait()
	if after := snapshot(t, c, n); before != after {
		t.Fatalf("after %d concurrent ADDs and DELs the Node changed: before %+v, after %+v", pods, before, after)
	}
}

// TestCNIDelIsIdempotent: DEL of an unknown container, and DEL with the
// netns already gone, succeed.
func TestCNIDelIsIdempotent(t *testing.T) {
	requireSeineIPAM(t)
	c := shared
	n := c.Nodes()[2]
	e := newCNIEnv(t, c, n, nil)
	ctx := testCtx(t, time.Minute)
	if err := e.del(ctx, e.rt("never-added", "")); err != nil {
		t.Fatalf("DEL of an unknown container: %v", err)
	}
	before := snapshot(t, c, n)
	netns := newPodNS(t, "seine-e2e-delgone")
	rt := e.rt("netns-gone", netns)
	if _, err := e.add(ctx, rt); err != nil {
		t.Fatal(err)
	}
	e.delAtCleanup(t, rt)
	if out, err := exec.Command("ip", "netns", "del", "seine-e2e-delgone").CombinedOutput(); err != nil {
		t.Fatalf("%v: %s", err, out)
	}
	rt.NetNS = ""
	if err := e.del(ctx, rt); err != nil {
		t.Fatalf("DEL after the netns is gone: %v", err)
	}
	if err := e.del(ctx, rt); err != nil {
		t.Fatalf("second DEL: %v", err)
	}
	eventually(t, 10*time.Second, "state released", func() error {
		if after := snapshot(t, c, n); after != before {
			return fmt.Errorf("before %+v, after %+v", before, after)
		}
		return nil
	})
}

// cniCode extracts the CNI error code from a libcni error.
func cniCode(err error) uint {
	var te *types.Error
	if errors.As(err, &te) {
		return te.Code
	}
	return 0
}

func TestCNIErrors(t *testing.T) {
	requireSeineIPAM(t)
	c := shared
	n := c.Nodes()[2]
	ctx := testCtx(t, 3*time.Minute)

	t.Run("bad conflist", func(t *testing.T) {
		before := snapshot(t, c, n)
		for _, tc := range []struct {
			name     string
			conflist string
			code     uint
		}{
			{"unsupported cniVersion", `{"cniVersion":"9.9.9","name":"seine","plugins":[{"type":"seine","socketPath":"` + n.CNISocket + `"}]}`, types.ErrIncompatibleCNIVersion},
			{"bad MTU", `{"cniVersion":"1.1.0","name":"seine","plugins":[{"type":"seine","mtu":-5,"socketPath":"` + n.CNISocket + `"}]}`, types.ErrInvalidNetworkConfig},
		} {
			t.Run(tc.name, func(t *testing.T) {
				e := newCNIEnv(t, c, n, []byte(tc.conflist))
				netns := newPodNS(t, "seine-e2e-badconf")
				_, err := e.add(ctx, e.rt("badconf", netns))
				if err == nil {
					t.Fatal("ADD with a bad configuration succeeded")
				}
				if got := cniCode(err); got != tc.code {
					t.Fatalf("error code %d (%v), want %d", got, err, tc.code)
				}
			})
		}
		if after := snapshot(t, c, n); after != before {
			t.Fatalf("a rejected ADD left state: before %+v, after %+v", before, after)
		}
	})

	t.Run("daemon down", func(t *testing.T) {
		e := newCNIEnv(t, c, n, nil)
		before := snapshot(t, c, n)
		stopSeine(t, c, n.Name)
		t.Cleanup(func() {
			if err := c.StartSeine(context.Background(), n.Name, nil); err != nil {
				t.Errorf("restarting seine: %v", err)
			}
		})
		netns := newPodNS(t, "seine-e2e-down")
		_, err := e.add(ctx, e.rt("daemon-down", netns))
		if err == nil {
			t.Fatal("ADD with the daemon down succeeded")
		}
		if got := cniCode(err); got != types.ErrTryAgainLater {
			t.Fatalf("error code %d (%v), want %d (try again later)", got, err, types.ErrTryAgainLater)
		}
		if !strings.Contains(err.Error(), "not running") {
			t.Errorf("error %q does not say the daemon is not running", err)
		}
		// STATUS exists from spec 1.1.0 on; ask through a seine-only list
		// (Debian's chained plugins stop at 1.0.0). A daemon that served a
		// moment ago is taken for restarting: STATUS succeeds, so that the
		// Node stays Ready; once its heartbeat is older than
		// wire.AliveGrace, STATUS fails with 50.
		s := newCNIEnv(t, c, n, seineOnlyList(n))
		if status := s.Status(ctx); status != nil {
			t.Errorf("STATUS right after the daemon stopped: %v, want success", status)
		}
		old := time.Now().Add(-wire.AliveGrace - time.Second)
		if err := os.Chtimes(wire.AlivePath(n.CNISocket), old, old); err != nil {
			t.Fatalf("the daemon left no heartbeat: %v", err)
		}
		status := s.Status(ctx)
		if got := cniCode(status); got != types.ErrPluginNotAvailable {
			t.Fatalf("STATUS error code %d (%v), want %d", got, status, types.ErrPluginNotAvailable)
		}
		if after := snapshot(t, c, n); after != before {
			t.Fatalf("a failed ADD left state: before %+v, after %+v", before, after)
		}
	})
}

// seineOnlyList is a spec-1.1.0 conflist with seine alone, for STATUS and
// GC (Debian's chained plugins stop at spec 1.0.0).
func seineOnlyList(n sandbox.Node) []byte {
	return []byte(`{"cniVersion":"1.1.0","name":"seine","plugins":[{"type":"seine","socketPath":"` + n.CNISocket + `"}]}`)
}

// TestCNICheckAndGC: CHECK passes for a healthy attachment and fails once
// its Pod interface is gone, or its host end is no longer a port of the
// bridge; GC releases every attachment not listed as valid.
func TestCNICheckAndGC(t *testing.T) {
	requireSeineIPAM(t)
	c := shared
	n := c.Nodes()[1]
	ctx := testCtx(t, 2*time.Minute)
	e := newCNIEnv(t, c, n, seineOnlyList(n))
	before := snapshot(t, c, n)
	keep := e.rt("gc-keep", newPodNS(t, "seine-e2e-gckeep"))
	drop := e.rt("gc-drop", newPodNS(t, "seine-e2e-gcdrop"))
	unported := e.rt("gc-unported", newPodNS(t, "seine-e2e-gcunport"))
	for _, rt := range []*libcni.RuntimeConf{keep, drop, unported} {
		if _, err := e.add(ctx, rt); err != nil {
			t.Fatal(err)
		}
		e.delAtCleanup(t, rt)
	}
	if err := e.Check(ctx, keep); err != nil {
		t.Fatalf("CHECK of a healthy attachment: %v", err)
	}
	// Break the other one: remove its Pod-side interface.
	if out, err := exec.Command("ip", "-n", "seine-e2e-gcdrop", "link", "del", "eth0").CombinedOutput(); err != nil {
		t.Fatalf("%v: %s", err, out)
	}
	if err := e.Check(ctx, drop); err == nil {
		t.Fatal("CHECK passed for an attachment whose interface is gone")
	}
	// Break the third: take its host end off the bridge.
	port := podnet.HostVethName("gc-unported", "eth0")
	ovs(t, n, "ovs-vsctl", "del-port", "br-int", port)
	if err := e.Check(ctx, unported); err == nil || !strings.Contains(err.Error(), port+" is not a port of") {
		t.Fatalf("CHECK of an attachment whose host end left the bridge: %v", err)
	}
	if err := e.GC(ctx, []types.GCAttachment{{ContainerID: "gc-keep", IfName: "eth0"}}); err != nil {
		t.Fatalf("GC: %v", err)
	}
	if strings.Contains(ipamAllocations(t, c, n), "gc-drop") {
		t.Fatal("GC left the IP of an attachment not in the valid list")
	}
	if !strings.Contains(ipamAllocations(t, c, n), "gc-keep") {
		t.Fatal("GC released a valid attachment")
	}
	if err := e.Check(ctx, keep); err != nil {
		t.Fatalf("CHECK after GC: %v", err)
	}
	if err := e.del(ctx, keep); err != nil {
		t.Fatal(err)
	}
	if after := snapshot(t, c, n); after != before {
		t.Fatalf("state left after GC and DEL: before %+v, after %+v", before, after)
	}
}
