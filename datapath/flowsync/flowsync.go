// Package flowsync keeps the flows of an OVS bridge equal to the desired
// flows of a set of owners (the pipeline's fixed flows, each Pod, each peer
// Node, ...). Owners replace their whole flow set at once; the syncer sends
// only the difference, in one atomic bundle, and remembers the result so it
// can replay everything after ovs-vswitchd restarts.
//
// Concurrent changes share bundles (package groupcommit): while one bundle
// is on its way to the switch, the changes that arrive queue up, and the
// next bundle carries all of them. No lock is held while a bundle travels,
// so N concurrent callers cost about two round trips each, not N. If a
// shared bundle is rejected, its changes are sent again one by one, so a
// bad change fails only its own caller.
package flowsync

import (
	"context"
	"fmt"
	"maps"
	"net"
	"reflect"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/seine-net/seine/datapath/groupcommit"
	of "github.com/seine-net/seine/datapath/openflow"
)

// Applier is the part of the OpenFlow client the syncer needs.
type Applier interface {
	Apply(ctx context.Context, mods []of.FlowMod) error
}

// Update replaces the flows of one owner; no flows removes the owner.
type Update struct {
	Owner string
	Flows []of.Flow
}

// Syncer owns the desired flow state. It is safe for concurrent use.
type Syncer struct {
	sw      Applier
	commits *groupcommit.Committer[[]Update]

	mu     sync.Mutex
	owners map[string]map[string]of.Flow // owner → flow key → flow (on the switch)
	refs   map[string]int                // flow key → owners wanting it
	flight *stage                        // the bundle on its way, if any
	// replays counts Replay calls, so a committer whose bundle failed can
	// tell that a replay sent its flows meanwhile.
	replays uint64

	bundles atomic.Uint64 // bundles sent by Set/SetMany, for tests

	programming prometheus.Histogram
	mods        *prometheus.CounterVec
}

// New returns a syncer that programs sw.
func New(sw Applier) *Syncer {
	s := &Syncer{sw: sw, owners: map[string]map[string]of.Flow{}, refs: map[string]int{},
		programming: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "seine_flow_programming_duration_seconds",
			Help:    "Time to program one bundle of flow changes into OVS: sent, committed and acknowledged.",
			Buckets: []float64{.0005, .001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 10},
		}),
		mods: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "seine_flow_mods_total",
			Help: "Flow modifications sent to OVS, by operation (add, delete).",
		}, []string{"op"}),
	}
	s.commits = groupcommit.New(s.commit)
	return s
}

// Register adds the syncer's metrics to reg:
// seine_flow_programming_duration_seconds (histogram) and
// seine_flow_mods_total{op}.
func (s *Syncer) Register(reg prometheus.Registerer) error {
	if err := reg.Register(s.programming); err != nil {
		return err
	}
	return reg.Register(s.mods)
}

// apply sends mods to the switch and records the metrics. It needs no lock.
func (s *Syncer) apply(ctx context.Context, mods []of.FlowMod) error {
	start := time.Now()
	if err := s.sw.Apply(ctx, mods); err != nil {
		return err
	}
	s.programming.Observe(time.Since(start).Seconds())
	var adds, dels int
	for _, m := range mods {
		if m.Op == of.OpDelete {
			dels++
		} else {
			adds++
		}
	}
	s.mods.WithLabelValues("add").Add(float64(adds))
	s.mods.WithLabelValues("delete").Add(float64(dels))
	return nil
}

// Set makes the flows of owner exactly flows: flows the owner no longer has
// are deleted, new or changed ones added, unchanged ones left alone. Two
// flows are the same entry when table, priority and match are equal
// (OpenFlow 1.3 section 6.4); an entry whose actions or cookie changed is
// re-added, which replaces it in place. An entry another owner also wants
// is not deleted. Nothing is recorded when the switch rejects the change,
// so a retry recomputes the same difference.
func (s *Syncer) Set(ctx context.Context, owner string, flows []of.Flow) error {
	return s.SetMany(ctx, []Update{{Owner: owner, Flows: flows}})
}

// SetMany applies several updates as one change: one bundle, all or
// nothing, applied in order (a later update of the same owner wins). It
// returns once the switch has committed the bundle, or with the error that
// names the rejected flow. A caller whose context ends while its change
// waits behind another bundle gets the context's error and nothing is
// sent for it.
func (s *Syncer) SetMany(ctx context.Context, updates []Update) error {
	return s.commits.Do(ctx, updates)
}

// commit sends the changes of concurrent callers as one bundle; if the
// switch rejects it, each change is sent again alone, so that only the
// bad one fails.
func (s *Syncer) commit(ctx context.Context, batch [][]Update) []error {
	errs := make([]error, len(batch))
	err := s.try(ctx, batch)
	if err == nil || len(batch) == 1 {
		for i := range errs {
			errs[i] = err
		}
		return errs
	}
	for i := range batch {
		errs[i] = s.try(ctx, batch[i:i+1])
	}
	return errs
}

// try applies batch as one bundle and records the result. If the bundle
// fails after a Replay sent its flows, it is sent once more (the replay
// may have installed part of it).
func (s *Syncer) try(ctx context.Context, batch [][]Update) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	st := newStage(s)
	for _, ups := range batch {
		for _, u := range ups {
			st.set(u.Owner, u.Flows)
		}
	}
	if len(st.mods) == 0 {
		st.commit()
		return nil
	}
	s.flight = st
	replays := s.replays
	var err error
	for attempt := 0; attempt < 2; attempt++ {
		s.mu.Unlock()
		err = s.apply(ctx, st.mods)
		s.bundles.Add(1)
		s.mu.Lock()
		if err == nil || s.replays == replays {
			break
		}
		replays = s.replays
	}
	s.flight = nil
	if err != nil {
		return fmt.Errorf("programming flows of %s: %w", st.describe(), err)
	}
	st.commit()
	return nil
}

// stage is the state a bundle would leave: the owners it changes and the
// flow mods that take the switch there.
type stage struct {
	s      *Syncer
	owners map[string]map[string]of.Flow // staged owners; nil: removed
	refs   map[string]int                // change of s.refs per key
	mods   []of.FlowMod
	names  []string // owners changed, in order
}

func newStage(s *Syncer) *stage {
	return &stage{s: s, owners: map[string]map[string]of.Flow{}, refs: map[string]int{}}
}

func (st *stage) get(owner string) map[string]of.Flow {
	if fs, ok := st.owners[owner]; ok {
		return fs
	}
	return st.s.owners[owner]
}

// set stages owner's new flows and appends the mods they need.
func (st *stage) set(owner string, flows []of.Flow) {
	want := make(map[string]of.Flow, len(flows))
	for _, f := range flows {
		want[Key(f)] = f
	}
	have := st.get(owner)
	for k, f := range have {
		if _, ok := want[k]; ok {
			continue
		}
		st.refs[k]--
		if st.s.refs[k]+st.refs[k] == 0 {
			st.mods = append(st.mods, of.FlowMod{Op: of.OpDelete, Flow: f})
		} else if other, ok := st.holder(k, owner); ok && !sameFlow(other, f) {
			// The switch holds the version written last, perhaps this
			// owner's: an owner that still wants the entry gets its own
			// back (two Services with one external IP and port, say).
			st.mods = append(st.mods, of.FlowMod{Op: of.OpAdd, Flow: other})
		}
	}
	for k, f := range want {
		old, ok := have[k]
		if !ok {
			st.refs[k]++
		} else if sameFlow(old, f) {
			continue
		}
		st.mods = append(st.mods, of.FlowMod{Op: of.OpAdd, Flow: f})
	}
	if len(want) == 0 {
		want = nil
	}
	if _, seen := st.owners[owner]; !seen {
		st.names = append(st.names, owner)
	}
	st.owners[owner] = want
}

// holder returns the flow of entry key of an owner other than except that
// still wants it, as staged, choosing the first owner by name so that the
// choice does not depend on map order. It scans every owner: call it only
// for entries owners share, which are few.
func (st *stage) holder(key, except string) (of.Flow, bool) {
	var best string
	var flow of.Flow
	found := false
	consider := func(o string, fs map[string]of.Flow) {
		if o == except {
			return
		}
		if f, ok := fs[key]; ok && (!found || o < best) {
			best, flow, found = o, f, true
		}
	}
	for o, fs := range st.owners {
		consider(o, fs)
	}
	for o, fs := range st.s.owners {
		if _, staged := st.owners[o]; !staged {
			consider(o, fs)
		}
	}
	return flow, found
}

// commit makes the staged state the syncer's. s.mu must be held.
func (st *stage) commit() {
	for o, fs := range st.owners {
		if fs == nil {
			delete(st.s.owners, o)
		} else {
			st.s.owners[o] = fs
		}
	}
	for k, d := range st.refs {
		if n := st.s.refs[k] + d; n > 0 {
			st.s.refs[k] = n
		} else {
			delete(st.s.refs, k)
		}
	}
}

// describe names the owners of the stage for errors.
func (st *stage) describe() string {
	if len(st.names) <= 3 {
		return strings.Join(st.names, ", ")
	}
	return fmt.Sprintf("%s and %d more owners", strings.Join(st.names[:3], ", "), len(st.names)-3)
}

// Delete removes every flow of owner; unknown owners are a no-op.
func (s *Syncer) Delete(ctx context.Context, owner string) error {
	return s.Set(ctx, owner, nil)
}

// Has reports whether owner has flows installed.
func (s *Syncer) Has(owner string) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	_, ok := s.owners[owner]
	return ok
}

// Replay re-adds every desired flow, for a switch that lost its flows,
// including those of a bundle on its way (whose leader sends it again if
// it fails meanwhile). It sends directly, not behind queued changes: the
// OpenFlow client calls it on reconnection, while other calls wait.
func (s *Syncer) Replay(ctx context.Context) error {
	s.mu.Lock()
	s.replays++
	all := maps.Clone(s.owners)
	if st := s.flight; st != nil {
		for o, fs := range st.owners {
			if fs == nil {
				delete(all, o)
			} else {
				all[o] = fs
			}
		}
	}
	var mods []of.FlowMod
	for _, fs := range all {
		for _, f := range fs {
			mods = append(mods, of.FlowMod{Op: of.OpAdd, Flow: f})
		}
	}
	s.mu.Unlock()
	if len(mods) == 0 {
		return nil
	}
	return s.apply(ctx, mods)
}

// Snapshot returns a copy of the desired flows, by owner, sorted by table
// and priority.
func (s *Syncer) Snapshot() map[string][]of.Flow {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make(map[string][]of.Flow, len(s.owners))
	for o, fs := range s.owners {
		l := make([]of.Flow, 0, len(fs))
		for _, f := range fs {
			l = append(l, f)
		}
		sort.Slice(l, func(i, j int) bool {
			if l[i].Table != l[j].Table {
				return l[i].Table < l[j].Table
			}
			return l[i].Priority > l[j].Priority
		})
		out[o] = l
	}
	return out
}

// Count returns the number of distinct flow entries desired.
func (s *Syncer) Count() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.refs)
}

// CountByTable returns the number of distinct flow entries desired in
// each table.
func (s *Syncer) CountByTable() map[uint8]int {
	s.mu.Lock()
	defer s.mu.Unlock()
	seen := map[string]uint8{}
	for _, fs := range s.owners {
		for k, f := range fs {
			seen[k] = f.Table
		}
	}
	out := map[uint8]int{}
	for _, t := range seen {
		out[t]++
	}
	return out
}

// sameFlow reports whether two entries with equal keys also carry the same
// cookie and actions (pointed-to values compared, as reflect.DeepEqual
// does: actions hold pointers for optional fields).
func sameFlow(a, b of.Flow) bool {
	return a.Cookie == b.Cookie && reflect.DeepEqual(a.Actions, b.Actions)
}

// Key identifies a flow entry as OVS does (ovs-ofctl(8), "Flow Syntax":
// a flow table holds one entry per priority and match): table, priority
// and every field of the match, each numeric masked value as value&mask
// with its mask (a zero mask, which of.Match reads as exact, as all ones),
// a masked MAC as mac&mask. Some spellings of one entry still give two
// keys (registers listed in another order, a /0 prefix against none):
// that costs a needless flow mod, never two entries sharing a key.
func Key(f of.Flow) string {
	var b strings.Builder
	fmt.Fprintf(&b, "t%d,p%d", f.Table, f.Priority)
	m := f.Match
	if m.InPort != 0 {
		fmt.Fprintf(&b, ",in_port=%d", m.InPort)
	}
	if m.EthType != 0 {
		fmt.Fprintf(&b, ",eth_type=%#x", m.EthType)
	}
	mac := func(n string, v net.HardwareAddr) {
		if v != nil {
			fmt.Fprintf(&b, ",%s=%s", n, v)
		}
	}
	ip := func(n string, v net.IP) {
		if v != nil {
			fmt.Fprintf(&b, ",%s=%s", n, v)
		}
	}
	pfx := func(n string, v *net.IPNet) {
		if v != nil {
			fmt.Fprintf(&b, ",%s=%s", n, v)
		}
	}
	mac("eth_src", maskMAC(m.EthSrc, m.EthSrcMask))
	mac("eth_src_mask", m.EthSrcMask)
	mac("eth_dst", maskMAC(m.EthDst, m.EthDstMask))
	mac("eth_dst_mask", m.EthDstMask)
	if m.ARPOp != 0 {
		fmt.Fprintf(&b, ",arp_op=%d", m.ARPOp)
	}
	ip("arp_spa", m.ARPSPA)
	ip("arp_tpa", m.ARPTPA)
	mac("arp_sha", m.ARPSHA)
	pfx("nw_src", m.IPSrc)
	pfx("nw_dst", m.IPDst)
	if m.IPProto != 0 {
		fmt.Fprintf(&b, ",ip_proto=%d", m.IPProto)
	}
	if m.L4Src != nil {
		v, mk := masked(m.L4Src.Port, m.L4Src.Mask)
		fmt.Fprintf(&b, ",tp_src=%d/%#x", v, mk)
	}
	if m.L4Dst != nil {
		v, mk := masked(m.L4Dst.Port, m.L4Dst.Mask)
		fmt.Fprintf(&b, ",tp_dst=%d/%#x", v, mk)
	}
	if m.Frag != nil {
		fmt.Fprintf(&b, ",nw_frag=%#x/%#x", m.Frag.Value&m.Frag.Mask, m.Frag.Mask)
	}
	ip("tun_dst", m.TunDst)
	ip("tun_src", m.TunSrc)
	if m.TunID != nil {
		v, mk := masked(m.TunID.Value, m.TunID.Mask)
		fmt.Fprintf(&b, ",tun_id=%#x/%#x", v, mk)
	}
	for _, r := range m.Regs {
		v, mk := masked(r.Value, r.Mask)
		fmt.Fprintf(&b, ",reg%d=%#x/%#x", r.Reg, v, mk)
	}
	if m.CtState != nil {
		fmt.Fprintf(&b, ",ct_state=+%#x-%#x", m.CtState.Set, m.CtState.Clear)
	}
	if m.CtMark != nil {
		v, mk := masked(m.CtMark.Value, m.CtMark.Mask)
		fmt.Fprintf(&b, ",ct_mark=%#x/%#x", v, mk)
	}
	if m.CtZone != nil {
		fmt.Fprintf(&b, ",ct_zone=%d", *m.CtZone)
	}
	if m.ConjID != nil {
		fmt.Fprintf(&b, ",conj_id=%d", *m.ConjID)
	}
	if m.PktMark != nil {
		v, mk := masked(m.PktMark.Value, m.PktMark.Mask)
		fmt.Fprintf(&b, ",pkt_mark=%#x/%#x", v, mk)
	}
	return b.String()
}

// maskMAC returns mac with only the bits set in mask (mac itself when
// there is no mask).
func maskMAC(mac, mask net.HardwareAddr) net.HardwareAddr {
	if mac == nil || len(mask) != len(mac) {
		return mac
	}
	out := make(net.HardwareAddr, len(mac))
	for i := range mac {
		out[i] = mac[i] & mask[i]
	}
	return out
}

// masked returns v under mask as OVS keeps it: v&mask, with a zero mask
// (exact, in of.Match) as all ones.
func masked[T uint16 | uint32 | uint64](v, mask T) (T, T) {
	if mask == 0 {
		mask = ^T(0)
	}
	return v & mask, mask
}
