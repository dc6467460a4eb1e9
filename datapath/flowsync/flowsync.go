// Package flowsync keeps the flows of an OVS bridge equal to the desired
// flows of a set of owners (the pipeline's fixed flows, each Pod, each peer
// Node, ...). Owners replace their whole flow set at once; the syncer sends
// only the difference, in one atomic bundle, and remembers the result so it
// can replay everything after ovs-vswitchd restarts.
package flowsync

import (
	"context"
	"fmt"
	"net"
	"reflect"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	of "github.com/seine-net/seine/datapath/openflow"
)

// Applier is the part of the OpenFlow client the syncer needs.
type Applier interface {
	Apply(ctx context.Context, mods []of.FlowMod) error
}

// Syncer owns the desired flow state. It is safe for concurrent use.
type Syncer struct {
	mu     sync.Mutex
	sw     Applier
	owners map[string]map[string]of.Flow // owner → flow key → flow

	programming prometheus.Histogram
	mods        *prometheus.CounterVec
}

// New returns a syncer that programs sw.
func New(sw Applier) *Syncer {
	return &Syncer{sw: sw, owners: map[string]map[string]of.Flow{},
		programming: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "seine_flow_programming_duration_seconds",
			Help:    "Time to program one change of flows into OVS: one bundle sent, committed and acknowledged.",
			Buckets: []float64{.0005, .001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 10},
		}),
		mods: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "seine_flow_mods_total",
			Help: "Flow modifications sent to OVS, by operation (add, delete).",
		}, []string{"op"}),
	}
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

// apply sends mods and records the metrics; s.mu must be held.
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
// re-added, which replaces it in place. Nothing is recorded when the switch
// rejects the change, so a retry recomputes the same difference.
func (s *Syncer) Set(ctx context.Context, owner string, flows []of.Flow) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	want := make(map[string]of.Flow, len(flows))
	for _, f := range flows {
		want[Key(f)] = f
	}
	have := s.owners[owner]
	var mods []of.FlowMod
	for k, f := range have {
		if _, ok := want[k]; !ok && !s.sharedLocked(owner, k) {
			mods = append(mods, of.FlowMod{Op: of.OpDelete, Flow: f})
		}
	}
	for k, f := range want {
		if old, ok := have[k]; ok && sameFlow(old, f) {
			continue
		}
		mods = append(mods, of.FlowMod{Op: of.OpAdd, Flow: f})
	}
	if len(mods) > 0 {
		if err := s.apply(ctx, mods); err != nil {
			return fmt.Errorf("programming flows of %s: %w", owner, err)
		}
	}
	if len(want) == 0 {
		delete(s.owners, owner)
	} else {
		s.owners[owner] = want
	}
	return nil
}

// sharedLocked reports whether an owner other than owner also wants the
// flow entry k, in which case deleting it would break that owner.
func (s *Syncer) sharedLocked(owner, k string) bool {
	for o, fs := range s.owners {
		if o == owner {
			continue
		}
		if _, ok := fs[k]; ok {
			return true
		}
	}
	return false
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

// Replay re-adds every desired flow, for a switch that lost its flows.
func (s *Syncer) Replay(ctx context.Context) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	var mods []of.FlowMod
	for _, fs := range s.owners {
		for _, f := range fs {
			mods = append(mods, of.FlowMod{Op: of.OpAdd, Flow: f})
		}
	}
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
	seen := map[string]struct{}{}
	for _, fs := range s.owners {
		for k := range fs {
			seen[k] = struct{}{}
		}
	}
	return len(seen)
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

// Key identifies a flow entry: table, priority and match.
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
	mac("eth_src", m.EthSrc)
	mac("eth_dst", m.EthDst)
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
		fmt.Fprintf(&b, ",tp_src=%d/%#x", m.L4Src.Port, m.L4Src.Mask)
	}
	if m.L4Dst != nil {
		fmt.Fprintf(&b, ",tp_dst=%d/%#x", m.L4Dst.Port, m.L4Dst.Mask)
	}
	ip("tun_dst", m.TunDst)
	ip("tun_src", m.TunSrc)
	if m.TunID != nil {
		fmt.Fprintf(&b, ",tun_id=%#x/%#x", m.TunID.Value, m.TunID.Mask)
	}
	for _, r := range m.Regs {
		fmt.Fprintf(&b, ",reg%d=%#x/%#x", r.Reg, r.Value, r.Mask)
	}
	if m.CtState != nil {
		fmt.Fprintf(&b, ",ct_state=+%#x-%#x", m.CtState.Set, m.CtState.Clear)
	}
	if m.CtMark != nil {
		fmt.Fprintf(&b, ",ct_mark=%#x/%#x", m.CtMark.Value, m.CtMark.Mask)
	}
	if m.CtZone != nil {
		fmt.Fprintf(&b, ",ct_zone=%d", *m.CtZone)
	}
	if m.ConjID != nil {
		fmt.Fprintf(&b, ",conj_id=%d", *m.ConjID)
	}
	if m.PktMark != nil {
		fmt.Fprintf(&b, ",pkt_mark=%#x/%#x", m.PktMark.Value, m.PktMark.Mask)
	}
	return b.String()
}
