package proxy

import (
	"context"
	"fmt"
	"net"
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	"go.uber.org/zap"

	"github.com/seine-net/seine/datapath/flowsync"
	of "github.com/seine-net/seine/datapath/openflow"
	"github.com/seine-net/seine/datapath/ovstest"
	"github.com/seine-net/seine/datapath/pipeline"
)

// benchProxier returns a Proxier programming a private OVS bridge (no
// informers, no nftables: the reject set is left out).
func benchProxier(b testing.TB) *Proxier {
	_, sock := startOVS(b)
	return dialProxier(b, sock)
}

// startOVS starts a private OVS with br-int and returns it and the
// bridge's OpenFlow socket.
func startOVS(b testing.TB) (*ovstest.OVS, string) {
	o := ovstest.Start(b)
	o.Run("ovs-vsctl", "add-br", "br-int", "--", "set", "bridge", "br-int", "datapath_type=netdev",
		"fail_mode=secure", "protocols=OpenFlow10,OpenFlow13,OpenFlow15")
	sock := o.MgmtSocket("br-int")
	for i := 0; i < 200; i++ {
		if _, err := os.Stat(sock); err == nil {
			break
		}
		time.Sleep(50 * time.Millisecond)
	}
	return o, sock
}

// dialProxier returns a Proxier on the bridge of sock with the base flows
// installed; after a reconnection it replays groups, then flows, as the
// daemon does.
func dialProxier(b testing.TB, sock string) *Proxier {
	ctx, cancel := context.WithCancel(context.Background())
	b.Cleanup(cancel)
	var p *Proxier
	var fs *flowsync.Syncer
	c, err := of.Dial(ctx, sock, zap.NewNop(), of.WithOnReconnect(func(ctx context.Context) error {
		if err := p.ReplayGroups(ctx); err != nil {
			return err
		}
		return fs.Replay(ctx)
	}))
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _ = c.Close() })
	fs = flowsync.New(c)
	br := benchBridge
	if err := fs.Set(ctx, "pipeline", pipeline.BaseFlows(br)); err != nil {
		b.Fatal(err)
	}
	if err := fs.Set(ctx, "service-base", pipeline.ServiceBaseFlows(br)); err != nil {
		b.Fatal(err)
	}
	p = &Proxier{cfg: Config{NodeName: "n1", Bridge: br}, flows: fs, sw: c, log: zap.NewNop(),
		installed: map[string]map[string]*portInstall{}, book: newGroupBook(), ids: newIDAllocator(pipeline.MaxServicePortID)}
	return p
}

// After ovs-vswitchd restarts (empty tables, no groups), the replay puts
// back every group, UDP ones with their selection method, before the flows
// naming them; and it does so while a sync holds the proxy's lock waiting
// for the switch, as one does when a Service changes during the restart
// (the switch is ready again only after the replay).
func TestGroupsReplayedAfterSwitchRestart(t *testing.T) {
	o, sock := startOVS(t)
	p := dialProxier(t, sock)
	ctx := context.Background()
	for i := 0; i < 5; i++ {
		ps := benchPort(i, 0)
		if i == 4 {
			ps[0].Port.Protocol = 17
		}
		if err := p.apply(ctx, fmt.Sprintf("ns/s%d", i), ps); err != nil {
			t.Fatal(err)
		}
	}
	dump := func() (groups, flows string) {
		fl := strings.Split(o.Run("ovs-ofctl", "-O", "OpenFlow13", "--no-stats", "dump-flows", sock), "\n")
		slices.Sort(fl)
		gl := strings.Split(o.Run("ovs-ofctl", "-O", "OpenFlow15", "dump-groups", sock), "\n")
		slices.Sort(gl)
		return strings.Join(gl, "\n"), strings.Join(fl, "\n")
	}
	g0, f0 := dump()
	if strings.Count(g0, "group_id=") != 5 || !strings.Contains(g0, "selection_method=hash") {
		t.Fatalf("before the restart:\n%s", g0)
	}
	p.mu.Lock()
	locked := true
	defer func() {
		if locked {
			p.mu.Unlock()
		}
	}()
	o.Restart()
	deadline := time.Now().Add(20 * time.Second)
	for {
		g, f := dump()
		if strings.Count(g, "group_id=") == 5 && f == f0 {
			p.mu.Unlock()
			locked = false
			if g != g0 {
				t.Errorf("groups differ after the replay:\n%s\nwant\n%s", g, g0)
			}
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("after the restart, the proxy's lock held: %d groups, flows equal: %v\n%s\n----\n%s", strings.Count(g, "group_id="), f == f0, f, f0)
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// A restarted proxy gives every frontend the ID (and so the group) it had,
// whatever order Services arrive in, and removes the groups of Services
// that are gone.
func TestRestartKeepsServicePortIDs(t *testing.T) {
	_, sock := startOVS(t)
	p := dialProxier(t, sock)
	ctx := context.Background()
	ids := map[string]uint32{}
	for i := 0; i < 20; i++ {
		if err := p.apply(ctx, fmt.Sprintf("ns/s%d", i), benchPort(i, 0)); err != nil {
			t.Fatal(err)
		}
	}
	for k, ports := range p.installed {
		for _, pi := range ports {
			ids[k] = pi.id
		}
	}
	// "Restart": a new Proxier on the same bridge, Services in reverse
	// order, s0 gone, the flows of the old round still installed.
	q := dialProxier(t, sock)
	if err := q.readPriorIDs(ctx); err != nil {
		t.Fatal(err)
	}
	if len(q.prior) != 20 {
		t.Fatalf("learned %d prior IDs, want 20", len(q.prior))
	}
	for i := 19; i >= 1; i-- {
		if err := q.apply(ctx, fmt.Sprintf("ns/s%d", i), benchPort(i, 0)); err != nil {
			t.Fatal(err)
		}
	}
	for k, ports := range q.installed {
		for _, pi := range ports {
			if pi.id != ids[k] {
				t.Errorf("%s got port ID %d after restart, had %d", k, pi.id, ids[k])
			}
		}
	}
	if err := q.pruneGroups(ctx); err != nil {
		t.Fatal(err)
	}
	left, err := q.sw.GroupIDs(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if len(left) != 19 || slices.Contains(left, ids["ns/s0"]) {
		t.Errorf("groups after prune %v, want 19 without s0's %d", left, ids["ns/s0"])
	}
}

func benchPort(i, variant int) []PortState {
	sp := pipeline.ServicePort{VIPs: []net.IP{net.IPv4(10, 96, byte(i/250), byte(i%250+1))}, Protocol: 6, Port: 80}
	for e := 0; e < 3; e++ {
		sp.Endpoints = append(sp.Endpoints, pipeline.ServiceEndpoint{
			IP: net.IPv4(10, 244, byte(e), byte((i+variant)%250+1)), Port: 8080})
	}
	return []PortState{{Key: fmt.Sprintf("ns/s%d/http/TCP", i), Port: sp}}
}

// One Service's endpoints change while n Services are installed in a real
// OVS: the time of the whole incremental update (group modify, flow diff
// in one bundle).
func benchmarkChange(b *testing.B, n int) {
	p := benchProxier(b)
	ctx := context.Background()
	start := time.Now()
	for i := 0; i < n; i++ {
		if err := p.apply(ctx, fmt.Sprintf("ns/s%d", i), benchPort(i, 0)); err != nil {
			b.Fatal(err)
		}
	}
	b.Logf("installed %d services in %s", n, time.Since(start).Round(time.Millisecond))
	v := 0
	b.ResetTimer()
	for b.Loop() {
		v++
		if err := p.apply(ctx, "ns/s7", benchPort(7, v)); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkServiceChangeAt1000Services(b *testing.B)  { benchmarkChange(b, 1000) }
func BenchmarkServiceChangeAt10000Services(b *testing.B) { benchmarkChange(b, 10000) }

// Installing n Services into a real OVS from nothing, as a cold start
// does: one Service at a time (each with its own group bundle and flow
// bundle, as before batching) and in batches of maxBatch Services.
func benchmarkInstall(b *testing.B, n int) {
	for _, mode := range []string{"one-by-one", "batched"} {
		b.Run(mode, func(b *testing.B) {
			o, sock := startOVS(b)
			for b.Loop() {
				b.StopTimer()
				o.Run("ovs-ofctl", "-O", "OpenFlow13", "del-flows", sock)
				o.Run("ovs-ofctl", "-O", "OpenFlow13", "del-groups", sock)
				p := dialProxier(b, sock)
				ctx := context.Background()
				b.StartTimer()
				start := time.Now()
				if mode == "one-by-one" {
					for i := 0; i < n; i++ {
						if err := p.apply(ctx, fmt.Sprintf("ns/s%d", i), benchPort(i, 0)); err != nil {
							b.Fatal(err)
						}
					}
				} else {
					for lo := 0; lo < n; lo += maxBatch {
						wants := map[string][]PortState{}
						for i := lo; i < min(n, lo+maxBatch); i++ {
							wants[fmt.Sprintf("ns/s%d", i)] = benchPort(i, 0)
						}
						if errs := p.applyBatch(ctx, wants); len(errs) > 0 {
							b.Fatal(errs)
						}
					}
				}
				b.ReportMetric(float64(time.Since(start).Milliseconds()), "install-ms")
			}
		})
	}
}

func BenchmarkServiceInstall1000(b *testing.B)  { benchmarkInstall(b, 1000) }
func BenchmarkServiceInstall10000(b *testing.B) { benchmarkInstall(b, 10000) }

// Every frontend of a Service port with ClientIP affinity looks its
// clients up, and learns them, under the internal frontend's ID, in the
// batch path and in the one-port path alike, even when the other frontend
// comes first.
func TestFrontendsShareAffinityID(t *testing.T) {
	o, sock := startOVS(t)
	p := dialProxier(t, sock)
	ctx := context.Background()
	want := func(i int) []PortState {
		in := benchPort(i, 0)[0]
		in.Port.AffinitySeconds, in.AffinityOf = 60, in.Key
		np := in
		np.Key = in.Key + "/nodeport"
		np.Port.VIPs, np.Port.Port, np.Port.External = []net.IP{pipeline.NodePortVIP}, uint16(30000+i), true
		return []PortState{np, in}
	}
	check := func(key string) {
		t.Helper()
		in := p.installed[key][key+"/http/TCP"]
		if in == nil {
			t.Fatalf("%s: internal frontend not installed: %v", key, p.installed[key])
		}
		flows := o.Run("ovs-ofctl", "-O", "OpenFlow13", "--no-stats", "dump-flows", sock, fmt.Sprintf("table=%d", pipeline.EndpointDNAT))
		lb := o.Run("ovs-ofctl", "-O", "OpenFlow13", "--no-stats", "dump-flows", sock, fmt.Sprintf("table=%d", pipeline.ServiceLB))
		load := fmt.Sprintf("load:%#x->NXM_NX_REG12[]", in.id)
		if n := strings.Count(lb, load); n != 2 {
			t.Errorf("%s: %d ServiceLB flows with %s, want both frontends':\n%s", key, n, load, lb)
		}
		learn := fmt.Sprintf("cookie=%#x,eth_type=0x800,NXM_OF_IP_SRC[],reg12=%#x,", pipeline.Cookie(p.cfg.Bridge.Round, pipeline.CategoryService, uint64(in.id)), in.id)
		if n := strings.Count(flows, learn); n != 6 {
			t.Errorf("%s: %d EndpointDNAT flows learning under %d, want 6 (3 endpoints, 2 frontends):\n%s", key, n, in.id, flows)
		}
	}
	if err := p.apply(ctx, "ns/s1", want(1)); err != nil {
		t.Fatal(err)
	}
	check("ns/s1")
	p.mu.Lock()
	err := p.applyLocked(ctx, "ns/s2", want(2))
	p.mu.Unlock()
	if err != nil {
		t.Fatal(err)
	}
	check("ns/s2")
	// A flow learned under the port's ID (as OVS adds it) goes with the
	// Service, whichever frontend learned it.
	id := p.installed["ns/s2"]["ns/s2/http/TCP"].id
	ck := pipeline.Cookie(p.cfg.Bridge.Round, pipeline.CategoryService, uint64(id))
	o.Run("ovs-ofctl", "-O", "OpenFlow13", "add-flow", sock,
		fmt.Sprintf("table=%d,cookie=%#x,priority=%d,ip,nw_src=198.19.0.10,reg12=%d,actions=load:0x0af40205->NXM_NX_REG6[]", pipeline.SessionAffinity, ck, pipeline.PrioNormal, id))
	if err := p.apply(ctx, "ns/s2", nil); err != nil {
		t.Fatal(err)
	}
	if left := o.Run("ovs-ofctl", "-O", "OpenFlow13", "--no-stats", "dump-flows", sock, fmt.Sprintf("cookie=%#x/-1", ck)); strings.Contains(left, "cookie=") {
		t.Errorf("flows of the removed Service port left:\n%s", left)
	}
}

// Frontends sharing a VIP and port (a NodePort's external frontend and
// its "/node" twin for the Node's own connections; a LoadBalancer IP's
// source-ranged frontends for Pods and from the gateway) each get their
// own ID back after a restart, whatever order they come in.
func TestRestartKeepsIDsOfFrontendsSharingAVIP(t *testing.T) {
	_, sock := startOVS(t)
	p := dialProxier(t, sock)
	ctx := context.Background()
	ranges := []*net.IPNet{{IP: net.IPv4(198, 18, 0, 0), Mask: net.CIDRMask(16, 32)}}
	want := func(i int) []PortState {
		in := benchPort(i, 0)[0]
		np := in
		np.Key = in.Key + "/nodeport"
		np.Port.VIPs, np.Port.Port, np.Port.External = []net.IP{pipeline.NodePortVIP}, uint16(30000+i), true
		twin := np
		twin.Key = np.Key + "/node"
		twin.Port.Sources = []*net.IPNet{{IP: net.IPv4(198, 18, 0, 11), Mask: net.CIDRMask(32, 32)}}
		lbPods := in
		lbPods.Key = in.Key + "/loadbalancer-pods"
		lbPods.Port.VIPs, lbPods.Port.SourceRanges = []net.IP{net.IPv4(198, 18, 100, byte(i))}, ranges
		lb := lbPods
		lb.Key = in.Key + "/loadbalancer"
		lb.Port.External = true
		return []PortState{in, np, twin, lbPods, lb}
	}
	ids := map[string]uint32{}
	for i := 1; i <= 2; i++ {
		if err := p.apply(ctx, fmt.Sprintf("ns/s%d", i), want(i)); err != nil {
			t.Fatal(err)
		}
		for k, pi := range p.installed[fmt.Sprintf("ns/s%d", i)] {
			ids[k] = pi.id
		}
	}
	q := dialProxier(t, sock)
	if err := q.readPriorIDs(ctx); err != nil {
		t.Fatal(err)
	}
	// One Service's frontends in order, the other's reversed.
	for i := 1; i <= 2; i++ {
		w := want(i)
		if i == 2 {
			slices.Reverse(w)
		}
		if err := q.apply(ctx, fmt.Sprintf("ns/s%d", i), w); err != nil {
			t.Fatal(err)
		}
		for k, pi := range q.installed[fmt.Sprintf("ns/s%d", i)] {
			if pi.id != ids[k] {
				t.Errorf("%s got port ID %d after the restart, had %d", k, pi.id, ids[k])
			}
		}
	}
}
