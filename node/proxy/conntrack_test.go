package proxy

import (
	"context"
	"fmt"
	"net"
	"slices"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"go.uber.org/zap"
	"go.uber.org/zap/zaptest"

	"github.com/seine-net/seine/datapath/ovsctl"
	"github.com/seine-net/seine/datapath/pipeline"
)

// The flushes of one batch, against the frontends installed after it:
// pi goes from old (installed, serving oldServing) to cur (serving
// curServing), beside an untouched frontend other on the same VIPs when
// set.
func batchFlushes(t *testing.T, ready bool, old pipeline.ServicePort, oldServing []pipeline.ServiceEndpoint,
	cur pipeline.ServicePort, curServing []pipeline.ServiceEndpoint, other *portInstall) []string {
	t.Helper()
	ct := &recordingConntrack{}
	pi := &portInstall{port: old, serving: oldServing}
	ports := map[string]*portInstall{"ns/dns/dns/UDP": pi}
	if other != nil {
		ports["ns/dns/dns/UDP/twin"] = other
	}
	p := &Proxier{cfg: Config{Conntrack: ct}, log: zaptest.NewLogger(t), ready: ready,
		installed: map[string]map[string]*portInstall{"ns/dns": ports}}
	p.mu.Lock()
	for _, o := range ports {
		p.indexCTLocked(o, true) // as programmed before the batch
	}
	p.setPortLocked(pi, cur, curServing)
	if len(cur.VIPs) == 0 {
		delete(ports, "ns/dns/dns/UDP")
	}
	p.mu.Unlock()
	p.flushConntrack(context.Background())
	// A flush follows one purge of the cached datapath flows, else a
	// packet on a flow cached before the batch commits a new entry to
	// the old endpoint; no flush, no purge.
	if (len(ct.flushed) > 0) != (ct.purges == 1) || ct.purges > 1 || ct.unpurged > 0 {
		t.Errorf("%d flushes, %d of them before a purge of the datapath flows; %d purges", len(ct.flushed), ct.unpurged, ct.purges)
	}
	sort.Strings(ct.flushed)
	return ct.flushed
}

func TestConntrackFlushes(t *testing.T) {
	vip, ext := net.ParseIP("10.96.0.10"), net.ParseIP("198.18.5.5")
	ep := func(last byte) pipeline.ServiceEndpoint {
		return pipeline.ServiceEndpoint{IP: net.IPv4(10, 244, 1, last), Port: 5353}
	}
	udp := func(vips []net.IP, eps ...pipeline.ServiceEndpoint) pipeline.ServicePort {
		return pipeline.ServicePort{Protocol: 17, Port: 53, VIPs: vips, Endpoints: eps}
	}
	reject := pipeline.ServicePort{Protocol: 17, Port: 53, VIPs: []net.IP{vip}, Action: pipeline.ServiceReject}
	many := func(n int) []pipeline.ServiceEndpoint {
		var out []pipeline.ServiceEndpoint
		for i := 0; i < n; i++ {
			out = append(out, ep(byte(i+1)))
		}
		return out
	}
	const o10 = "ct_nw_dst=10.96.0.10,ct_nw_proto=17,ct_tp_dst=53"
	const untranslated = o10 + "|ct_nw_src=10.96.0.10,ct_nw_proto=17,ct_tp_src=53"
	gone := func(last int) string {
		return fmt.Sprintf("%s|ct_nw_src=10.244.1.%d,ct_nw_proto=17,ct_tp_src=5353", o10, last)
	}
	e1, e2 := []pipeline.ServiceEndpoint{ep(1)}, []pipeline.ServiceEndpoint{ep(1), ep(2)}
	for _, tc := range []struct {
		name       string
		ready      bool
		old        pipeline.ServicePort
		oldServing []pipeline.ServiceEndpoint
		cur        pipeline.ServicePort
		curServing []pipeline.ServiceEndpoint
		other      *portInstall
		want       string
	}{
		{"unchanged", true, udp([]net.IP{vip}, e2...), e2, udp([]net.IP{vip}, ep(2), ep(1)), e2, nil, ""},
		{"an endpoint added", true, udp([]net.IP{vip}, e1...), e1, udp([]net.IP{vip}, e2...), e2, nil, ""},
		{"an endpoint gone", true, udp([]net.IP{vip}, e2...), e2, udp([]net.IP{vip}, ep(2)), []pipeline.ServiceEndpoint{ep(2)}, nil, gone(1)},
		{"an endpoint left the choice but still serves", true, udp([]net.IP{vip}, e2...), e2, udp([]net.IP{vip}, ep(2)), e2, nil, ""},
		{"a VIP gone", true, udp([]net.IP{vip, ext}, e1...), e1, udp([]net.IP{vip}, e1...), e1, nil,
			"ct_nw_dst=198.18.5.5,ct_nw_proto=17,ct_tp_dst=53|"},
		{"the port removed", true, udp([]net.IP{vip}, e1...), e1, pipeline.ServicePort{}, nil, nil, o10 + "|"},
		{"the port removed, its VIP still another frontend's", true, udp([]net.IP{vip}, e2...), e2, pipeline.ServicePort{}, nil,
			&portInstall{port: udp([]net.IP{vip}, ep(2)), serving: []pipeline.ServiceEndpoint{ep(2)}}, gone(1)},
		{"every endpoint gone: rejected now", true, udp([]net.IP{vip}, e1...), e1, reject, nil, nil, gone(1)},
		{"endpoints after none", true, reject, nil, udp([]net.IP{vip}, e1...), e1, nil, untranslated},
		{"first programmed, once ready", true, pipeline.ServicePort{}, nil, udp([]net.IP{vip}, e1...), e1, nil, untranslated},
		{"first programmed, in the initial backlog", false, pipeline.ServicePort{}, nil, udp([]net.IP{vip}, e1...), e1, nil, ""},
		{"TCP", true, pipeline.ServicePort{Protocol: 6, Port: 80, VIPs: []net.IP{vip}, Endpoints: e1}, e1, pipeline.ServicePort{}, nil, nil, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := strings.Join(batchFlushes(t, tc.ready, tc.old, tc.oldServing, tc.cur, tc.curServing, tc.other), " ")
			if got != tc.want {
				t.Errorf("flushes %q, want %q", got, tc.want)
			}
		})
	}
	// Past maxPartialFlushes, one dump and exact flushes instead.
	t.Run("many endpoints gone", func(t *testing.T) {
		ct := &recordingConntrack{}
		for i := 1; i <= maxPartialFlushes+2; i++ {
			ct.entries = append(ct.entries, ovsctl.CTEntry{Zone: pipeline.ConntrackZone,
				Orig:  ovsctl.CTTuple{Src: net.ParseIP("10.244.0.3"), Dst: vip, Proto: 17, SrcPort: uint16(40000 + i), DstPort: 53},
				Reply: ovsctl.CTTuple{Src: ep(byte(i)).IP, Dst: net.ParseIP("10.244.0.3"), Proto: 17, SrcPort: 5353, DstPort: uint16(40000 + i)}})
		}
		all := many(maxPartialFlushes + 2)
		pi := &portInstall{port: udp([]net.IP{vip}, all...), serving: all}
		p := &Proxier{cfg: Config{Conntrack: ct}, log: zaptest.NewLogger(t), ready: true,
			installed: map[string]map[string]*portInstall{"ns/dns": {"ns/dns/dns/UDP": pi}}}
		p.mu.Lock()
		p.indexCTLocked(pi, true)
		cur := udp([]net.IP{vip}, ep(1))
		p.setPortLocked(pi, cur, cur.Endpoints)
		p.mu.Unlock()
		p.flushConntrack(context.Background())
		want := maxPartialFlushes + 1
		if ct.dumps != 1 || len(ct.flushed) != want || strings.Contains(strings.Join(ct.flushed, " "), "ct_tp_src=40001,") {
			t.Errorf("%d dumps, %d flushes (%v); want one dump and the %d entries of the gone endpoints", ct.dumps, len(ct.flushed), ct.flushed, want)
		}
	})
}

// recordingConntrack answers a dump with entries and records flushes and
// purges of the datapath flows.
type recordingConntrack struct {
	mu      sync.Mutex // the second pass runs on a goroutine of its own
	entries []ovsctl.CTEntry
	flushed []string
	dumps   int
	// purges counts PurgeDatapathFlows; unpurged the flushes made before
	// the first.
	purges, unpurged int
}

func (r *recordingConntrack) FlushConntrack(_ context.Context, _ uint16, orig, reply ovsctl.CTTuple) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.flushed = append(r.flushed, orig.String()+"|"+reply.String())
	if r.purges == 0 {
		r.unpurged++
	}
	return nil
}

func (r *recordingConntrack) PurgeDatapathFlows(context.Context) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.purges++
	return nil
}

func (r *recordingConntrack) DumpConntrack(context.Context, uint16) ([]ovsctl.CTEntry, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.dumps++
	return r.entries, nil
}

func (r *recordingConntrack) flushes() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Clone(r.flushed)
}

// With ReflushDelay, what a batch flushed is flushed once more after it
// where it is still stale; not an endpoint that serves again by then.
func TestConntrackFlushedTwice(t *testing.T) {
	vip := net.ParseIP("10.96.0.10")
	ep := func(last byte) pipeline.ServiceEndpoint {
		return pipeline.ServiceEndpoint{IP: net.IPv4(10, 244, 1, last), Port: 5353}
	}
	udp := func(eps ...pipeline.ServiceEndpoint) pipeline.ServicePort {
		return pipeline.ServicePort{Protocol: 17, Port: 53, VIPs: []net.IP{vip}, Endpoints: eps}
	}
	all := []pipeline.ServiceEndpoint{ep(1), ep(2), ep(3)}
	ct := &recordingConntrack{}
	pi := &portInstall{port: udp(all...), serving: all}
	p := &Proxier{cfg: Config{Conntrack: ct, ReflushDelay: 50 * time.Millisecond}, log: zaptest.NewLogger(t), ready: true,
		installed: map[string]map[string]*portInstall{"ns/dns": {"ns/dns/dns/UDP": pi}}}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	p.mu.Lock()
	p.indexCTLocked(pi, true)
	p.setPortLocked(pi, udp(ep(3)), []pipeline.ServiceEndpoint{ep(3)}) // 1 and 2 gone
	p.mu.Unlock()
	p.flushConntrack(ctx)
	if got := len(ct.flushes()); got != 2 {
		t.Fatalf("%d flushes after the batch, want 2", got)
	}
	// Endpoint 2 serves again before the second pass.
	p.mu.Lock()
	p.setPortLocked(pi, udp(ep(2), ep(3)), []pipeline.ServiceEndpoint{ep(2), ep(3)})
	p.ctDirty = nil // that batch's own flushes are not this test's
	p.mu.Unlock()
	deadline := time.Now().Add(5 * time.Second)
	for len(ct.flushes()) < 3 && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	time.Sleep(100 * time.Millisecond) // nothing more comes
	got := ct.flushes()
	if len(got) != 3 || !strings.Contains(got[2], "ct_nw_src=10.244.1.1,") {
		t.Errorf("flushes %q; want the two of the batch, then endpoint 1's again only", got)
	}
}

// Flushes that come within MinPurgeInterval of the last purge wait and go
// together, once each, behind one more purge: not one purge per batch. A
// held flush of a VIP and port no longer installed still runs when a
// frontend has them again by then.
func TestFlushesShareAPurge(t *testing.T) {
	vip := net.ParseIP("10.96.0.10")
	flush := func(last byte) ctFlush {
		return ctFlush{orig: ovsctl.CTTuple{Dst: vip, Proto: 17, DstPort: 53},
			reply: ovsctl.CTTuple{Src: net.IPv4(10, 244, 1, last), Proto: 17, SrcPort: 5353}}
	}
	ct := &recordingConntrack{}
	back := ctFlush{orig: ovsctl.CTTuple{Dst: net.ParseIP("10.96.0.11"), Proto: 17, DstPort: 53}}
	p := &Proxier{cfg: Config{Conntrack: ct, MinPurgeInterval: 300 * time.Millisecond}, log: zaptest.NewLogger(t),
		ctPorts: map[ctKey]map[*portInstall]struct{}{{vip: "10.96.0.11", proto: 17, port: 53}: {&portInstall{}: {}}}}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	purges := func() int {
		ct.mu.Lock()
		defer ct.mu.Unlock()
		return ct.purges
	}
	p.scheduleFlushes(ctx, []ctFlush{flush(1)}) // the first goes at once
	if purges() != 1 || len(ct.flushes()) != 1 {
		t.Fatalf("after the first batch: %d purges, flushes %q; want 1 and 1", purges(), ct.flushes())
	}
	for _, last := range []byte{2, 3, 2, 4} { // four batches, one flush twice
		p.scheduleFlushes(ctx, []ctFlush{flush(last)})
	}
	p.scheduleFlushes(ctx, []ctFlush{back}) // its VIP was removed, and is back
	if purges() != 1 || len(ct.flushes()) != 1 {
		t.Fatalf("batches within the interval ran at once: %d purges, flushes %q", purges(), ct.flushes())
	}
	deadline := time.Now().Add(5 * time.Second)
	for len(ct.flushes()) < 5 && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	time.Sleep(50 * time.Millisecond) // nothing more comes
	got := ct.flushes()
	if purges() != 2 || len(got) != 5 || ct.unpurged != 0 {
		t.Errorf("held flushes: %d purges, flushes %q; want 2 purges, endpoints 1 to 4 flushed once each and 10.96.0.11 once", purges(), got)
	}
	want := []string{"ct_nw_src=10.244.1.1,", "ct_nw_dst=10.96.0.11,", "ct_nw_src=10.244.1.2,", "ct_nw_src=10.244.1.3,", "ct_nw_src=10.244.1.4,"}
	for i, w := range want {
		if i < len(got) && !strings.Contains(got[i], w) {
			t.Errorf("flush %d is %q, want %s", i, got[i], w)
		}
	}
}

// After a restart, the connections to a programmed UDP VIP whose other end
// is not a serving endpoint are flushed, each by its exact tuple; the
// others, TCP ones and those to unknown VIPs, stay.
func TestReconcileConntrack(t *testing.T) {
	vip, client := net.ParseIP("10.96.0.10"), net.ParseIP("10.244.0.3")
	live, gone := pipeline.ServiceEndpoint{IP: net.ParseIP("10.244.1.5"), Port: 5353}, net.ParseIP("10.244.2.5")
	cport := uint16(40000)
	entry := func(proto uint8, dst net.IP, dport uint16, replySrc net.IP, sport uint16) ovsctl.CTEntry {
		cport++
		return ovsctl.CTEntry{Zone: pipeline.ConntrackZone,
			Orig:  ovsctl.CTTuple{Src: client, Dst: dst, Proto: proto, SrcPort: cport, DstPort: dport},
			Reply: ovsctl.CTTuple{Src: replySrc, Dst: client, Proto: proto, SrcPort: sport, DstPort: cport}}
	}
	ct := &recordingConntrack{entries: []ovsctl.CTEntry{
		entry(17, vip, 53, live.IP, 5353),                    // to a serving endpoint: stays
		entry(17, vip, 53, gone, 5353),                       // to an endpoint gone: flushed
		entry(17, vip, 53, vip, 53),                          // never translated: flushed
		entry(6, vip, 53, gone, 5353),                        // TCP: stays
		entry(17, net.ParseIP("10.96.0.11"), 53, gone, 5353), // no frontend: stays
		entry(17, vip, 54, gone, 5353),                       // another port: stays
	}}
	udp := pipeline.ServicePort{Protocol: 17, Port: 53, VIPs: []net.IP{vip}, Endpoints: []pipeline.ServiceEndpoint{live}}
	p := &Proxier{cfg: Config{Conntrack: ct}, log: zaptest.NewLogger(t),
		installed: map[string]map[string]*portInstall{"ns/dns": {"ns/dns/dns/UDP": {port: udp, serving: udp.Endpoints}}}}
	p.reconcileConntrack(context.Background())
	want := []string{
		"ct_nw_src=10.244.0.3,ct_nw_dst=10.96.0.10,ct_nw_proto=17,ct_tp_src=40002,ct_tp_dst=53|",
		"ct_nw_src=10.244.0.3,ct_nw_dst=10.96.0.10,ct_nw_proto=17,ct_tp_src=40003,ct_tp_dst=53|",
	}
	if strings.Join(ct.flushed, " ") != strings.Join(want, " ") {
		t.Errorf("flushed %v, want the two stale UDP connections %v", ct.flushed, want)
	}
}

// ctBench is a ready Proxier with a recording conntrack; its port method
// builds the UDP frontend i with eps endpoints.
type ctBench struct {
	p  *Proxier
	ct *recordingConntrack
}

func newCTBench() *ctBench {
	ct := &recordingConntrack{}
	return &ctBench{ct: ct, p: &Proxier{cfg: Config{Conntrack: ct}, log: zap.NewNop(), ready: true,
		installed: map[string]map[string]*portInstall{}}}
}

func (c *ctBench) port(i, eps int) (pipeline.ServicePort, []pipeline.ServiceEndpoint) {
	sp := pipeline.ServicePort{Protocol: 17, Port: 53, VIPs: []net.IP{net.IPv4(10, 96, byte(i/250), byte(i%250+1))}}
	for e := range eps {
		sp.Endpoints = append(sp.Endpoints, pipeline.ServiceEndpoint{IP: net.IPv4(10, 244, byte(e), byte(i%250+1)), Port: 5353})
	}
	return sp, sp.Endpoints
}

// add installs UDP frontends lo..hi-1 with three endpoints each as one
// batch, and works out its flushes.
func (c *ctBench) add(lo, hi int) {
	c.p.mu.Lock()
	for i := lo; i < hi; i++ {
		pi := &portInstall{}
		c.p.installed[fmt.Sprintf("ns/s%d", i)] = map[string]*portInstall{"dns": pi}
		sp, serving := c.port(i, 3)
		c.p.setPortLocked(pi, sp, serving)
	}
	c.p.mu.Unlock()
	c.ct.flushed = c.ct.flushed[:0]
	c.p.flushConntrack(context.Background())
}

// Adding n UDP frontends to a ready proxy in batches of maxBatch (as many
// Services created at once arrive), each batch's conntrack bookkeeping
// included. Pure bookkeeping, no switch: the flushes are recorded.
func benchmarkConntrackAdd(b *testing.B, n int) {
	for b.Loop() {
		c := newCTBench()
		for lo := 0; lo < n; lo += maxBatch {
			c.add(lo, min(n, lo+maxBatch))
		}
	}
}

func BenchmarkConntrackAdd1000(b *testing.B)  { benchmarkConntrackAdd(b, 1000) }
func BenchmarkConntrackAdd10000(b *testing.B) { benchmarkConntrackAdd(b, 10000) }

// One batch in which changed of n installed UDP frontends each lose (or,
// the next time, get back) an endpoint: noting the changes, then working
// out the flushes.
func benchmarkConntrackChange(b *testing.B, n, changed int) {
	c := newCTBench()
	for lo := 0; lo < n; lo += maxBatch {
		c.add(lo, min(n, lo+maxBatch))
	}
	eps := 3
	for b.Loop() {
		eps = 5 - eps
		c.p.mu.Lock()
		for j := range changed {
			i := j * (n / changed)
			sp, serving := c.port(i, eps)
			c.p.setPortLocked(c.p.installed[fmt.Sprintf("ns/s%d", i)]["dns"], sp, serving)
		}
		c.p.mu.Unlock()
		c.ct.flushed = c.ct.flushed[:0]
		c.p.flushConntrack(context.Background())
	}
}

func BenchmarkConntrackChange10000x1(b *testing.B)   { benchmarkConntrackChange(b, 10000, 1) }
func BenchmarkConntrackChange10000x100(b *testing.B) { benchmarkConntrackChange(b, 10000, 100) }
