package noderoute

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"regexp"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/vishvananda/netlink"
	"go.uber.org/zap/zaptest"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes/fake"

	of "github.com/seine-net/seine/datapath/openflow"
	"github.com/seine-net/seine/datapath/pipeline"
	"github.com/seine-net/seine/node/config"
	"github.com/seine-net/seine/tests/netnstest"
)

// errInjected is the failure the flaky fakes return.
var errInjected = errors.New("injected failure")

// flakyRoutes is the kernel's route table with failures the kernel does
// not produce on demand: the next interrupt dumps return the first half of
// the real result with netlink.ErrDumpInterrupted, as a dump racing a
// change does, and the first delete of each destination in refuse fails.
type flakyRoutes struct {
	routeTable
	mu        sync.Mutex
	interrupt int
	dumps     int
	refuse    map[string]bool
}

func (f *flakyRoutes) list(filter *netlink.Route, mask uint64) ([]netlink.Route, error) {
	out, err := f.routeTable.list(filter, mask)
	f.mu.Lock()
	defer f.mu.Unlock()
	f.dumps++
	if err == nil && f.interrupt > 0 {
		f.interrupt--
		return out[:len(out)/2], netlink.ErrDumpInterrupted
	}
	return out, err
}

func (f *flakyRoutes) del(r *netlink.Route) error {
	f.mu.Lock()
	refused := f.refuse[r.Dst.String()]
	delete(f.refuse, r.Dst.String())
	f.mu.Unlock()
	if refused {
		return errInjected
	}
	return f.routeTable.del(r)
}

// flakyTunnel is tunnelRec whose Peers returns the errors in peersErrs
// first, one a call, and whose RemovePeer fails once for each IP in
// refuse.
type flakyTunnel struct {
	tunnelRec
	mu        sync.Mutex
	peersErrs []error
	refuse    map[string]bool
}

func (f *flakyTunnel) Peers() ([]net.IP, error) {
	f.mu.Lock()
	if len(f.peersErrs) > 0 {
		err := f.peersErrs[0]
		f.peersErrs = f.peersErrs[1:]
		f.mu.Unlock()
		return nil, err
	}
	f.mu.Unlock()
	return f.tunnelRec.Peers()
}

func (f *flakyTunnel) RemovePeer(ip net.IP) error {
	f.mu.Lock()
	refused := f.refuse[ip.String()]
	delete(f.refuse, ip.String())
	f.mu.Unlock()
	if refused {
		return errInjected
	}
	return f.tunnelRec.RemovePeer(ip)
}

// newBareController returns an encap controller of Node "self" over an
// informer that knows no Node (nothing installed: everything is stale).
func newBareController(t *testing.T, cfg Config) *Controller {
	t.Helper()
	cfg.NodeName, cfg.Mode, cfg.Flows, cfg.SNAT = "self", config.ModeEncap, flowRec{&journal{}}, snatRec{}
	f := informers.NewSharedInformerFactory(fake.NewSimpleClientset(), 0)
	c, err := New(f.Core().V1().Nodes(), cfg, zaptest.NewLogger(t))
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// TestRemoveStaleRoutesPersists: an interrupted route dump is started
// again rather than ending the removal, and a route the kernel refuses to
// delete leaves the others deleted, is reported, and goes on the next
// call.
func TestRemoveStaleRoutesPersists(t *testing.T) {
	netnstest.Run(t, func() {
		run(t, "ip", "link", "add", "gw0", "type", "veth", "peer", "name", "gw0p")
		run(t, "ip", "link", "set", "gw0", "up")
		run(t, "ip", "link", "set", "gw0p", "up")
		run(t, "ip", "addr", "add", "10.244.1.1/24", "dev", "gw0")
		for _, n := range []string{"7", "8", "9"} {
			run(t, "ip", "route", "add", "10.244."+n+".0/24", "via", "10.244."+n+".1", "dev", "gw0", "onlink", "proto", "95")
		}
		c := newBareController(t, Config{Gateway: "gw0"})
		flaky := &flakyRoutes{routeTable: c.routes, interrupt: dumpAttempts - 1, refuse: map[string]bool{"10.244.8.0/24": true}}
		c.routes = flaky

		err := c.removeStaleRoutes()
		if !errors.Is(err, errInjected) || !strings.Contains(err.Error(), "10.244.8.0/24") {
			t.Errorf("first removal: %v, want the refused delete of 10.244.8.0/24", err)
		}
		if flaky.dumps != dumpAttempts {
			t.Errorf("%d dumps, want %d (interrupted ones started again)", flaky.dumps, dumpAttempts)
		}
		const base = "10.244.1.0/24 dev gw0 proto kernel scope link src 10.244.1.1"
		if got, want := routes(t), base+"\n10.244.8.0/24 via 10.244.8.1 dev gw0 proto 95 onlink"; got != want {
			t.Errorf("after the first removal, routes\n%s\nwant\n%s", got, want)
		}
		if err := c.removeStaleRoutes(); err != nil {
			t.Errorf("second removal: %v", err)
		}
		if got := routes(t); got != base {
			t.Errorf("after the second removal, routes\n%s\nwant\n%s", got, base)
		}

		// A dump interrupted every time is an error naming the cause,
		// and nothing is deleted from its partial result.
		run(t, "ip", "route", "add", "10.244.9.0/24", "via", "10.244.9.1", "dev", "gw0", "onlink", "proto", "95")
		flaky.interrupt = dumpAttempts
		if err := c.removeStaleRoutes(); !errors.Is(err, netlink.ErrDumpInterrupted) {
			t.Errorf("removal over interrupted dumps: %v, want netlink.ErrDumpInterrupted", err)
		}
		if got := routes(t); !strings.Contains(got, "10.244.9.0/24") {
			t.Errorf("a route was deleted from an interrupted dump:\n%s", got)
		}
	})
}

// TestRemoveStaleTunnelPeersPersists: an interrupted listing of the
// tunnel's peers is started again, and an entry the device refuses to
// remove leaves the others removed, is reported, and goes on the next
// call.
func TestRemoveStaleTunnelPeersPersists(t *testing.T) {
	j := &journal{ips: []string{"198.19.240.98", "198.19.240.99"}}
	tun := &flakyTunnel{tunnelRec: tunnelRec{j},
		peersErrs: []error{fmt.Errorf("forwarding entries of seine-vxlan: %w", netlink.ErrDumpInterrupted)},
		refuse:    map[string]bool{"198.19.240.98": true}}
	c := newBareController(t, Config{Tunnel: tun})

	err := c.removeStaleTunnelPeers()
	if !errors.Is(err, errInjected) || !strings.Contains(err.Error(), "198.19.240.98") {
		t.Errorf("first removal: %v, want the refused removal of 198.19.240.98", err)
	}
	j.mu.Lock()
	left := slices.Clone(j.ips)
	j.mu.Unlock()
	if !slices.Equal(left, []string{"198.19.240.98"}) {
		t.Errorf("after the first removal the tunnel knows %v, want only the refused 198.19.240.98", left)
	}
	if err := c.removeStaleTunnelPeers(); err != nil {
		t.Errorf("second removal: %v", err)
	}
	j.mu.Lock()
	left = slices.Clone(j.ips)
	j.mu.Unlock()
	if len(left) != 0 {
		t.Errorf("after the second removal the tunnel knows %v, want none", left)
	}
}

// ownNetnsEnv names, in a test binary started by ownNetns, the test it
// is to run.
const ownNetnsEnv = "SEINE_NODEROUTE_OWN_NETNS"

// ownNetns reports whether the test runs in a process of its own in a
// fresh network namespace. If it does not, ownNetns runs it so (the test
// binary again, with CLONE_NEWNET, for this test only), reports that
// run's failure as the test's, and returns false: the caller returns.
// Tests of Run need it: the controller's goroutines do netlink on threads
// of their own, which netnstest (one thread) does not move.
func ownNetns(t *testing.T) bool {
	t.Helper()
	if os.Getenv(ownNetnsEnv) == t.Name() {
		return true
	}
	if os.Geteuid() != 0 {
		t.Skip("needs root")
	}
	args := []string{"-test.run=^" + regexp.QuoteMeta(t.Name()) + "$", "-test.count=1", "-test.v"}
	if d, ok := t.Deadline(); ok {
		args = append(args, "-test.timeout="+time.Until(d).String())
	}
	cmd := exec.Command(os.Args[0], args...)
	cmd.Env = append(os.Environ(), ownNetnsEnv+"="+t.Name())
	cmd.SysProcAttr = &syscall.SysProcAttr{Cloneflags: syscall.CLONE_NEWNET}
	out, err := cmd.CombinedOutput()
	t.Logf("in a network namespace of its own:\n%s", out)
	if err != nil {
		t.Fatalf("test binary: %v", err)
	}
	if !strings.Contains(string(out), "--- PASS: "+t.Name()+" ") {
		t.Fatalf("the test did not pass in its own network namespace")
	}
	return false
}

// await polls cond until it holds; it fails the test if ctx ends first.
func await(t *testing.T, ctx context.Context, what string, cond func() bool) {
	t.Helper()
	if err := wait.PollUntilContextCancel(ctx, 5*time.Millisecond, true,
		func(context.Context) (bool, error) { return cond(), nil }); err != nil {
		t.Fatalf("waiting for %s: %v", what, err)
	}
}

// startRun runs c until the test ends (Run's goroutines, in this process's
// namespace), and waits for Run to return then.
func startRun(t *testing.T, ctx context.Context, c *Controller, f informers.SharedInformerFactory) {
	t.Helper()
	ctx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	f.Start(ctx.Done())
	go func() { done <- c.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Run: %v", err)
		}
		f.Shutdown()
	})
}

// gatewayDevice adds gw0, up, with this Node's gateway address.
func gatewayDevice(t *testing.T) {
	t.Helper()
	run(t, "ip", "link", "add", "gw0", "type", "veth", "peer", "name", "gw0p")
	run(t, "ip", "link", "set", "gw0", "up")
	run(t, "ip", "link", "set", "gw0p", "up")
	run(t, "ip", "addr", "add", "10.244.0.1/24", "dev", "gw0")
}

// TestStaleRemovalRetried: a removal of stale state that fails is retried
// (with backoff) until it succeeds, not given up after one attempt.
func TestStaleRemovalRetried(t *testing.T) {
	if !ownNetns(t) {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	gatewayDevice(t)
	run(t, "ip", "route", "add", "10.244.9.0/24", "via", "10.244.9.1", "dev", "gw0", "onlink", "proto", "95")
	j := &journal{ips: []string{"198.19.240.99"}}
	tun := &flakyTunnel{tunnelRec: tunnelRec{j}, peersErrs: []error{errInjected, errInjected}}
	f := informers.NewSharedInformerFactory(fake.NewSimpleClientset(node("self", "198.19.240.1", "10.244.0.0/24")), 0)
	c, err := New(f.Core().V1().Nodes(), Config{NodeName: "self", Mode: config.ModeEncap, Gateway: "gw0",
		Flows: flowRec{j}, SNAT: snatRec{}, Tunnel: tun}, zaptest.NewLogger(t))
	if err != nil {
		t.Fatal(err)
	}
	startRun(t, ctx, c, f)
	await(t, ctx, "the stale tunnel entry removed", func() bool {
		j.mu.Lock()
		defer j.mu.Unlock()
		return len(j.ips) == 0
	})
	if got := routes(t); strings.Contains(got, "10.244.9.0/24") {
		t.Errorf("stale route left:\n%s", got)
	}
}

// gate holds a call until released: entered is closed when the call
// arrives, release lets it go on.
type gate struct {
	entered, release chan struct{}
	enter, open      sync.Once
}

func newGate() *gate { return &gate{entered: make(chan struct{}), release: make(chan struct{})} }

func (g *gate) pass(ctx context.Context) {
	g.enter.Do(func() { close(g.entered) })
	select {
	case <-g.release:
	case <-ctx.Done():
	}
}

func (g *gate) let() { g.open.Do(func() { close(g.release) }) }

// gatedFlows is flowRec whose first Set of each owner in gates waits at
// that gate.
type gatedFlows struct {
	flowRec
	gates map[string]*gate
}

func (f gatedFlows) Set(ctx context.Context, owner string, flows []of.Flow) error {
	if g := f.gates[owner]; g != nil {
		g.pass(ctx)
	}
	return f.flowRec.Set(ctx, owner, flows)
}

// racingTunnel is tunnelRec that lists its peers in address order, and
// only once peer-b's sync is under way (past AddPeer, inside Flows.Set);
// its first RemovePeer lets that sync go on.
type racingTunnel struct {
	tunnelRec
	ctx context.Context
	b   *gate
}

func (r racingTunnel) Peers() ([]net.IP, error) {
	select {
	case <-r.b.entered:
	case <-r.ctx.Done():
		return nil, r.ctx.Err()
	}
	ips, err := r.tunnelRec.Peers()
	slices.SortFunc(ips, func(a, b net.IP) int { return strings.Compare(a.String(), b.String()) })
	return ips, err
}

func (r racingTunnel) RemovePeer(ip net.IP) error {
	err := r.tunnelRec.RemovePeer(ip)
	r.b.let()
	return err
}

// TestStaleRemovalWaitsForSync: the stale-state removal after the initial
// sync does not run while a peer that joined meanwhile is being synced;
// one that did would find the peer's tunnel entry installed but the peer
// not yet recorded, and remove the entry. peer-b joins while peer-a's
// sync is held, so it is queued before the initial sync completes; its
// sync is held past AddPeer; the tunnel lists its peers only once that
// sync is held, and lets it go at its first RemovePeer, or the test does
// once the removal is queued behind it.
func TestStaleRemovalWaitsForSync(t *testing.T) {
	if !ownNetns(t) {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	gatewayDevice(t)
	j := &journal{ips: []string{"198.19.240.99"}} // left by a removed peer
	a, b := newGate(), newGate()
	cs := fake.NewSimpleClientset(node("self", "198.19.240.1", "10.244.0.0/24"), node("peer-a", "198.19.240.2", "10.244.1.0/24"))
	f := informers.NewSharedInformerFactory(cs, 0)
	_, podCIDR, _ := net.ParseCIDR("10.244.0.0/24")
	c, err := New(f.Core().V1().Nodes(), Config{NodeName: "self", Mode: config.ModeEncap, Gateway: "gw0",
		Flows: gatedFlows{flowRec{j}, map[string]*gate{owner("peer-a"): a, owner("peer-b"): b}}, SNAT: snatRec{},
		Tunnel: racingTunnel{tunnelRec{j}, ctx, b}, Bridge: pipeline.Bridge{Round: 1, PodCIDR: podCIDR, TunnelPort: 1, Tunnel: pipeline.TunnelByMAC}},
		zaptest.NewLogger(t))
	if err != nil {
		t.Fatal(err)
	}
	startRun(t, ctx, c, f)
	await(t, ctx, "peer-a's sync held", func() bool { return isClosed(a.entered) })
	if _, err := cs.CoreV1().Nodes().Create(ctx, node("peer-b", "198.19.240.3", "10.244.2.0/24"), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	// Queued: peer-b and the Nodes of the initial list not synced yet
	// but peer-a, which is being synced.
	await(t, ctx, "peer-b queued", func() bool {
		c.mu.Lock()
		defer c.mu.Unlock()
		return c.queue.Len() == len(c.pending)
	})
	a.let()
	await(t, ctx, "peer-b's sync held", func() bool { return isClosed(b.entered) })
	await(t, ctx, "the stale-state removal queued or under way", func() bool { return c.queue.Len() > 0 || isClosed(b.release) })
	b.let()
	await(t, ctx, "the stale entry removed", func() bool { return slices.Contains(j.entries(), "remove 198.19.240.99") })
	j.mu.Lock()
	ips := slices.Clone(j.ips)
	j.mu.Unlock()
	if !slices.Contains(ips, "198.19.240.3") {
		t.Errorf("peer-b's tunnel entry was removed as stale: the tunnel knows %v; calls %v", ips, j.entries())
	}
	if got := routes(t); !strings.Contains(got, "10.244.2.0/24 via 10.244.2.1 dev gw0") {
		t.Errorf("peer-b's route missing:\n%s", got)
	}
}

func isClosed(ch chan struct{}) bool {
	select {
	case <-ch:
		return true
	default:
		return false
	}
}

// pruneRec records the SNAT exemptions, and which Nodes had one when
// Prune was first called.
type pruneRec struct {
	mu       sync.Mutex
	ips      map[string]net.IP
	prunes   int
	atPrune  []string
	syncsPre int // Syncs before the first Prune
}

func (p *pruneRec) SetNodeIP(node string, ip net.IP) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if ip == nil {
		delete(p.ips, node)
	} else {
		p.ips[node] = ip
	}
}

func (p *pruneRec) Sync(context.Context) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.prunes == 0 {
		p.syncsPre++
	}
	return nil
}

func (p *pruneRec) Prune(context.Context) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.prunes == 0 {
		for n := range p.ips {
			p.atPrune = append(p.atPrune, n)
		}
		slices.Sort(p.atPrune)
	}
	p.prunes++
	return nil
}

// TestSNATPrunedAfterInitialSync: the SNAT exemption set, which keeps a
// previous run's IPs until pruned, is pruned once every Node known at
// start has been synced, with every one of them recorded.
func TestSNATPrunedAfterInitialSync(t *testing.T) {
	if !ownNetns(t) {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	gatewayDevice(t)
	j := &journal{}
	snat := &pruneRec{ips: map[string]net.IP{}}
	f := informers.NewSharedInformerFactory(fake.NewSimpleClientset(node("self", "198.19.240.1", "10.244.0.0/24"),
		node("peer-a", "198.19.240.2", "10.244.1.0/24"), node("peer-b", "198.19.240.3", "10.244.2.0/24")), 0)
	_, podCIDR, _ := net.ParseCIDR("10.244.0.0/24")
	c, err := New(f.Core().V1().Nodes(), Config{NodeName: "self", Mode: config.ModeEncap, Gateway: "gw0",
		Flows: flowRec{j}, SNAT: snat, Tunnel: tunnelRec{j}, Bridge: pipeline.Bridge{Round: 1, PodCIDR: podCIDR, TunnelPort: 1, Tunnel: pipeline.TunnelByMAC}},
		zaptest.NewLogger(t))
	if err != nil {
		t.Fatal(err)
	}
	startRun(t, ctx, c, f)
	await(t, ctx, "the SNAT exemptions pruned", func() bool {
		snat.mu.Lock()
		defer snat.mu.Unlock()
		return snat.prunes > 0
	})
	snat.mu.Lock()
	defer snat.mu.Unlock()
	if want := []string{"peer-a", "peer-b", "self"}; !slices.Equal(snat.atPrune, want) {
		t.Errorf("pruned with %v recorded, want %v", snat.atPrune, want)
	}
	if snat.syncsPre != 3 {
		t.Errorf("%d Syncs before the prune, want one for each Node", snat.syncsPre)
	}
}
