package podnet

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strconv"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"

	of "github.com/seine-net/seine/datapath/openflow"
	"github.com/seine-net/seine/datapath/ovsdb"
	"github.com/seine-net/seine/node/bandwidth"
)

// The egress meters: an OpenFlow meter per Pod with an egress limit backs
// up the tbf on the Pod's own interface (node/bandwidth, EgressMeter).
// Meter ids are the backend's own, the smallest free one for each new
// Pod, recorded in the port's seine.io/egress-meter; not the ofport, which
// ovs-vswitchd may give otherwise than requested. The backend keeps every
// meter it wants and which attachment holds it (meterTable): a restarted
// ovs-vswitchd gets back exactly the meters the replayed flows use, and a
// DEL deletes a meter only if its attachment still holds it (deleting a
// meter deletes the flows that use it, whoever they belong to). A meter
// exists before the flows that use it and is deleted after them.

// meterTable is the meters the backend wants on the switch: by id, and
// the id each attachment (flow owner) holds.
type meterTable struct {
	mu      sync.Mutex
	byID    map[uint32]heldMeter
	byOwner map[string]uint32
}

type heldMeter struct {
	of.MeterEntry
	owner string
}

func newMeterTable() *meterTable {
	return &meterTable{byID: map[uint32]heldMeter{}, byOwner: map[string]uint32{}}
}

// allocate gives owner a meter with the smallest free id and the band of
// limits' egress rate (the one it holds already, if any, with that band).
func (t *meterTable) allocate(owner string, limits bandwidth.Limits) of.MeterEntry {
	kbps, kbits := bandwidth.EgressMeter(limits.EgressRate, limits.EgressBurst)
	t.mu.Lock()
	defer t.mu.Unlock()
	id, held := t.byOwner[owner]
	for id = max(id, 1); !held; id++ {
		if _, taken := t.byID[id]; !taken {
			break
		}
	}
	m := of.MeterEntry{ID: id, RateKbps: kbps, BurstKbits: kbits}
	t.byID[id] = heldMeter{m, owner}
	t.byOwner[owner] = id
	return m
}

// claim records that owner holds m (a restored attachment's meter),
// failing if another attachment holds the id or owner holds another.
func (t *meterTable) claim(owner string, m of.MeterEntry) error {
	t.mu.Lock()
	defer t.mu.Unlock()
	if h, taken := t.byID[m.ID]; taken && h.owner != owner {
		return fmt.Errorf("meter %d is recorded for two Pods, %s and %s", m.ID, h.owner, owner)
	}
	if id, held := t.byOwner[owner]; held && id != m.ID {
		return fmt.Errorf("%s holds meter %d, not %d", owner, id, m.ID)
	}
	t.byID[m.ID] = heldMeter{m, owner}
	t.byOwner[owner] = m.ID
	return nil
}

// held returns the meter owner holds (0: none).
func (t *meterTable) held(owner string) uint32 {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.byOwner[owner]
}

// release frees the meter owner holds, if any.
func (t *meterTable) release(owner string) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if id, ok := t.byOwner[owner]; ok {
		delete(t.byID, id)
		delete(t.byOwner, owner)
	}
}

// get returns meter id, if it is wanted.
func (t *meterTable) get(id uint32) (of.MeterEntry, bool) {
	t.mu.Lock()
	defer t.mu.Unlock()
	h, ok := t.byID[id]
	return h.MeterEntry, ok
}

// ids returns the ids of the meters, in order.
func (t *meterTable) ids() []uint32 {
	t.mu.Lock()
	out := slices.Collect(maps.Keys(t.byID))
	t.mu.Unlock()
	slices.Sort(out)
	return out
}

// ReplayMeters adds again every egress meter the backend wants: run it
// after ovs-vswitchd restarts (meters live in its memory), before the
// flows that use them. It tries each meter (as it is at that moment: a
// Pod may come or go meanwhile), and returns the switch's refusals joined,
// each naming its meter: flows through a refused meter cannot be replayed.
func (b *Backend) ReplayMeters(ctx context.Context) error {
	if b.cfg.Meters == nil {
		return nil
	}
	var errs []error
	for _, id := range b.meterTab.ids() {
		m, ok := b.meterTab.get(id)
		if !ok {
			continue
		}
		if err := b.cfg.Meters.EnsureMeter(ctx, m); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// planMeter allocates the egress meter of attachment owner with limits
// (none, a zero entry, without an egress limit or meters) and puts its
// removal into undo; the caller adds it to the switch (EnsureMeter: the
// id is new to this backend, but an earlier run may have left a meter of
// that id).
func (b *Backend) planMeter(ctx context.Context, owner string, limits bandwidth.Limits, undo *rollback) of.MeterEntry {
	if limits.EgressRate == 0 || b.cfg.Meters == nil {
		return of.MeterEntry{}
	}
	m := b.meterTab.allocate(owner, limits)
	undo.add(func() {
		// The id is free again either way: a meter left on the switch is
		// used by no flow, and the next Pod given the id modifies it.
		if err := b.cfg.Meters.DeleteMeter(context.WithoutCancel(ctx), m.ID); err != nil {
			b.log.Error("rollback: removing the egress meter", zap.Uint32("meter", m.ID), zap.Error(err))
		}
		b.meterTab.release(owner)
	})
	return m
}

// deleteMeter removes the meter attachment owner holds, if any, from the
// switch, then from the table; run it once the owner's flows are gone.
func (b *Backend) deleteMeter(ctx context.Context, owner string) error {
	id := b.meterTab.held(owner)
	if id == 0 || b.cfg.Meters == nil {
		return nil
	}
	if err := b.cfg.Meters.DeleteMeter(ctx, id); err != nil {
		return fmt.Errorf("removing egress meter %d: %w", id, err)
	}
	b.meterTab.release(owner)
	return nil
}

// claimMeter records the egress meter port p's external_ids give the
// attachment owner, for a Pod found attached at start-up; a record it
// cannot read or that clashes is logged and left out.
func (b *Backend) claimMeter(owner string, p ovsdb.Port) {
	idv := p.ExternalIDs[ExtIDEgressMeter]
	if p.ExternalIDs[ExtIDEgressBandwidth] == "" || idv == "" || b.cfg.Meters == nil {
		return
	}
	l, _, err := parseEgressRecord(p)
	if id, ierr := strconv.ParseUint(idv, 10, 32); err == nil && (ierr != nil || id == 0) {
		err = fmt.Errorf("unreadable %s %q", ExtIDEgressMeter, idv)
	} else if err == nil {
		kbps, kbits := bandwidth.EgressMeter(l.EgressRate, l.EgressBurst)
		err = b.meterTab.claim(owner, of.MeterEntry{ID: uint32(id), RateKbps: kbps, BurstKbits: kbits})
	}
	if err != nil {
		b.log.Error("egress meter of an attached Pod; its qdisc alone limits it", zap.String("port", p.Name), zap.Error(err))
	}
}

// restoreMeter puts the meter attachment owner claimed on the switch and
// returns its id (0: none). A meter the switch refuses is released, and
// the Pod's qdisc alone limits it.
func (b *Backend) restoreMeter(ctx context.Context, owner string, port string) uint32 {
	id := b.meterTab.held(owner)
	if id == 0 {
		return 0
	}
	m, _ := b.meterTab.get(id)
	if err := b.cfg.Meters.EnsureMeter(ctx, m); err != nil {
		b.log.Error("egress meter of an attached Pod; its qdisc alone limits it", zap.String("port", port), zap.Error(err))
		b.meterTab.release(owner)
		return 0
	}
	return id
}

// parseEgressRecord reads a port's seine.io/egress-bandwidth
// ("<rate>/<burst>", bits/s and bits; ok false without one).
func parseEgressRecord(p ovsdb.Port) (l bandwidth.Limits, ok bool, err error) {
	v := p.ExternalIDs[ExtIDEgressBandwidth]
	if v == "" {
		return l, false, nil
	}
	if _, err := fmt.Sscanf(v, "%d/%d", &l.EgressRate, &l.EgressBurst); err != nil || l.EgressRate == 0 {
		return l, false, fmt.Errorf("unreadable %s %q", ExtIDEgressBandwidth, v)
	}
	return l, true, nil
}

// claimOFPortMeter gives attachment owner, whose port p records an egress
// limit but no meter id, the port's ofport as its meter id if no one holds
// it: the release that first had meters used ofports as ids, so a meter of
// that id may be on the switch already, used by the Pod's flows of that
// release. Run it after every recorded meter is claimed; meterUnrecorded
// allocates for the Pods it leaves out.
func (b *Backend) claimOFPortMeter(owner string, p ovsdb.Port) {
	if p.ExternalIDs[ExtIDEgressMeter] != "" || p.OFPort <= 0 || b.cfg.Meters == nil {
		return
	}
	l, ok, err := parseEgressRecord(p)
	if !ok || err != nil {
		return // meterUnrecorded logs an unreadable record
	}
	kbps, kbits := bandwidth.EgressMeter(l.EgressRate, l.EgressBurst)
	// Refused when another Pod holds the id: that Pod's record wins.
	_ = b.meterTab.claim(owner, of.MeterEntry{ID: uint32(p.OFPort), RateKbps: kbps, BurstKbits: kbits})
}

// meterUnrecorded gives a Pod found attached at start-up with an egress
// limit but no meter (attached while the datapath had no usable meters,
// or by the release that used ofports, whose ofport another Pod holds) a
// meter of its own with the smallest free id, as an ADD would, and adds it
// to the switch; the caller records it (recordMeter). It returns 0,
// leaving the Pod's qdisc as its only limit, when there is nothing to do
// (no limit, a meter on record: restoreMeter's, or no meters) or when the
// limit is unreadable or the switch refuses the meter (both logged).
func (b *Backend) meterUnrecorded(ctx context.Context, owner string, p ovsdb.Port) uint32 {
	if p.ExternalIDs[ExtIDEgressMeter] != "" || b.cfg.Meters == nil {
		return 0
	}
	l, ok, err := parseEgressRecord(p)
	if err != nil {
		b.log.Error("egress limit of an attached Pod; its qdisc alone limits it", zap.String("port", p.Name), zap.Error(err))
	}
	if !ok {
		return 0
	}
	m := b.meterTab.allocate(owner, l)
	if err := b.cfg.Meters.EnsureMeter(ctx, m); err != nil {
		b.meterTab.release(owner)
		b.log.Error("egress meter for an attached Pod that had none; its qdisc alone limits it",
			zap.String("port", p.Name), zap.Error(err))
		return 0
	}
	return m.ID
}

// recordMeter records meter id in the external_ids of port, for a Pod
// restored without one on record. A failure is logged and the meter kept:
// the next start gives the Pod one again.
func (b *Backend) recordMeter(ctx context.Context, port string, id uint32) {
	if err := b.ports.SetPortExternalIDs(ctx, port, map[string]string{ExtIDEgressMeter: strconv.FormatUint(uint64(id), 10)}); err != nil {
		b.log.Warn("recording the egress meter of an attached Pod", zap.String("port", port), zap.Uint32("meter", id), zap.Error(err))
		return
	}
	b.log.Info("egress meter recorded for an attached Pod that had none on record", zap.String("port", port), zap.Uint32("meter", id))
}

// meterCollector exports what the Pods' egress meters dropped, read from
// the switch at each scrape, and how many Pods' egress limits have no
// meter behind them:
//
//	seine_pod_egress_meter_dropped_packets_total{namespace="default",pod="web"} 0
//	seine_pod_egress_limits_without_meter 0
//
// A Pod whose own qdisc shapes its traffic never reaches its meter's band;
// drops mean the Pod sent above its limit, e.g. after deleting the qdisc.
// A limit without a meter is enforced by the Pod's qdisc alone: the
// datapath has no usable meters (the daemon logged so at start), or, for
// a Pod restored at start-up, its recorded meter was unreadable, clashed
// with another Pod's or could not be put back on the switch, or its limit
// was unreadable or the switch refused a new meter (each logged).
type meterCollector struct {
	b         *Backend
	drops     *prometheus.Desc
	unmetered *prometheus.Desc
}

func newMeterCollector(b *Backend) *meterCollector {
	return &meterCollector{b: b,
		drops: prometheus.NewDesc("seine_pod_egress_meter_dropped_packets_total",
			"Packets the OpenFlow meter behind a Pod's egress limit dropped: the Pod sent above its kubernetes.io/egress-bandwidth although its own qdisc should have held it there.",
			[]string{"namespace", "pod"}, nil),
		unmetered: prometheus.NewDesc("seine_pod_egress_limits_without_meter",
			"Pods attached on this Node whose kubernetes.io/egress-bandwidth has no OpenFlow meter behind it, so that their own qdisc alone limits them (no usable meters on the datapath, or a restored Pod whose recorded meter was unreadable, clashed with another Pod's or could not be put back, or whose new meter the switch refused).",
			nil, nil),
	}
}

func (c *meterCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- c.drops
	ch <- c.unmetered
}

// meterScrapeTimeout bounds the switch's answer to one scrape.
const meterScrapeTimeout = 2 * time.Second

func (c *meterCollector) Collect(ch chan<- prometheus.Metric) {
	var metered []Attachment
	unmetered := 0
	for _, a := range c.b.Attachments() {
		switch {
		case a.EgressMeter != 0:
			metered = append(metered, a)
		case a.EgressLimited:
			unmetered++
		}
	}
	ch <- prometheus.MustNewConstMetric(c.unmetered, prometheus.GaugeValue, float64(unmetered))
	m := c.b.cfg.Meters
	if m == nil || len(metered) == 0 {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), meterScrapeTimeout)
	defer cancel()
	stats, err := m.MeterStats(ctx)
	if err != nil {
		// Not an invalid metric: that would fail the whole scrape, just
		// while ovs-vswitchd restarts, when the other metrics matter.
		c.b.log.Debug("reading the egress meters' counters", zap.Error(err))
		return
	}
	dropped := make(map[uint32]uint64, len(stats))
	for _, s := range stats {
		dropped[s.ID] = s.DroppedPackets
	}
	for _, a := range metered {
		if d, ok := dropped[a.EgressMeter]; ok {
			ch <- prometheus.MustNewConstMetric(c.drops, prometheus.CounterValue, float64(d), a.Namespace, a.Name)
		}
	}
}
