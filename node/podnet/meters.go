package podnet

import (
	"cmp"
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
// meter it wants (meterTable), so that a restarted ovs-vswitchd gets back
// exactly the meters its replayed flows use. A meter exists before the
// flows that use it and is deleted after them.

// meterTable is the meters the backend wants on the switch, by id.
type meterTable struct {
	mu   sync.Mutex
	byID map[uint32]of.MeterEntry
}

func newMeterTable() *meterTable { return &meterTable{byID: map[uint32]of.MeterEntry{}} }

// allocate records a meter with the smallest free id and the band of
// limits' egress rate.
func (t *meterTable) allocate(limits bandwidth.Limits) of.MeterEntry {
	kbps, kbits := bandwidth.EgressMeter(limits.EgressRate, limits.EgressBurst)
	t.mu.Lock()
	defer t.mu.Unlock()
	id := uint32(1)
	for ; ; id++ {
		if _, taken := t.byID[id]; !taken {
			break
		}
	}
	m := of.MeterEntry{ID: id, RateKbps: kbps, BurstKbits: kbits}
	t.byID[id] = m
	return m
}

// claim records m under its own id (a restored Pod's), failing if the id
// is taken.
func (t *meterTable) claim(m of.MeterEntry) error {
	t.mu.Lock()
	defer t.mu.Unlock()
	if _, taken := t.byID[m.ID]; taken {
		return fmt.Errorf("meter %d is recorded for two ports", m.ID)
	}
	t.byID[m.ID] = m
	return nil
}

func (t *meterTable) release(id uint32) {
	t.mu.Lock()
	delete(t.byID, id)
	t.mu.Unlock()
}

// all returns the meters, by id.
func (t *meterTable) all() []of.MeterEntry {
	t.mu.Lock()
	out := slices.Collect(maps.Values(t.byID))
	t.mu.Unlock()
	slices.SortFunc(out, func(a, b of.MeterEntry) int { return cmp.Compare(a.ID, b.ID) })
	return out
}

// ReplayMeters adds again every egress meter the backend wants: run it
// after ovs-vswitchd restarts (meters live in its memory), before the
// flows that use them. It tries each meter, and returns the switch's
// refusals joined, each naming its meter.
func (b *Backend) ReplayMeters(ctx context.Context) error {
	if b.cfg.Meters == nil {
		return nil
	}
	var errs []error
	for _, m := range b.meterTab.all() {
		if err := b.cfg.Meters.EnsureMeter(ctx, m); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// planMeter allocates the egress meter of a Pod with limits (none, a zero
// entry, without an egress limit or meters) and puts its removal into
// undo; the caller adds it to the switch (EnsureMeter: the id is new to
// this backend, but an earlier run may have left a meter of that id).
func (b *Backend) planMeter(ctx context.Context, limits bandwidth.Limits, undo *rollback) of.MeterEntry {
	if limits.EgressRate == 0 || b.cfg.Meters == nil {
		return of.MeterEntry{}
	}
	m := b.meterTab.allocate(limits)
	undo.add(func() {
		// The id is free again either way: a meter left on the switch is
		// used by no flow, and the next Pod given the id modifies it.
		if err := b.cfg.Meters.DeleteMeter(context.WithoutCancel(ctx), m.ID); err != nil {
			b.log.Error("rollback: removing the egress meter", zap.Uint32("meter", m.ID), zap.Error(err))
		}
		b.meterTab.release(m.ID)
	})
	return m
}

// deleteMeter removes meter id from the switch, then from the table.
func (b *Backend) deleteMeter(ctx context.Context, id uint32) error {
	if err := b.cfg.Meters.DeleteMeter(ctx, id); err != nil {
		return err
	}
	b.meterTab.release(id)
	return nil
}

// restoreMeter puts back the egress meter p's external_ids record, for a
// Pod found attached at start-up, and returns its id (0: none).
func (b *Backend) restoreMeter(ctx context.Context, p ovsdb.Port) (uint32, error) {
	v, idv := p.ExternalIDs[ExtIDEgressBandwidth], p.ExternalIDs[ExtIDEgressMeter]
	if v == "" || idv == "" || b.cfg.Meters == nil {
		return 0, nil
	}
	var l bandwidth.Limits
	if _, err := fmt.Sscanf(v, "%d/%d", &l.EgressRate, &l.EgressBurst); err != nil || l.EgressRate == 0 {
		return 0, fmt.Errorf("unreadable %s %q", ExtIDEgressBandwidth, v)
	}
	id, err := strconv.ParseUint(idv, 10, 32)
	if err != nil || id == 0 {
		return 0, fmt.Errorf("unreadable %s %q", ExtIDEgressMeter, idv)
	}
	kbps, kbits := bandwidth.EgressMeter(l.EgressRate, l.EgressBurst)
	m := of.MeterEntry{ID: uint32(id), RateKbps: kbps, BurstKbits: kbits}
	if err := b.meterTab.claim(m); err != nil {
		return 0, err
	}
	if err := b.cfg.Meters.EnsureMeter(ctx, m); err != nil {
		b.meterTab.release(m.ID)
		return 0, err
	}
	return m.ID, nil
}

// meterCollector exports what the Pods' egress meters dropped, read from
// the switch at each scrape:
//
//	seine_pod_egress_meter_dropped_packets_total{namespace="default",pod="web"} 0
//
// A Pod whose own qdisc shapes its traffic never reaches its meter's band;
// drops mean the Pod sent above its limit, e.g. after deleting the qdisc.
type meterCollector struct {
	b     *Backend
	drops *prometheus.Desc
}

func newMeterCollector(b *Backend) *meterCollector {
	return &meterCollector{b: b, drops: prometheus.NewDesc("seine_pod_egress_meter_dropped_packets_total",
		"Packets the OpenFlow meter behind a Pod's egress limit dropped: the Pod sent above its kubernetes.io/egress-bandwidth although its own qdisc should have held it there.",
		[]string{"namespace", "pod"}, nil)}
}

func (c *meterCollector) Describe(ch chan<- *prometheus.Desc) { ch <- c.drops }

// meterScrapeTimeout bounds the switch's answer to one scrape.
const meterScrapeTimeout = 2 * time.Second

func (c *meterCollector) Collect(ch chan<- prometheus.Metric) {
	m := c.b.cfg.Meters
	if m == nil {
		return
	}
	var metered []Attachment
	for _, a := range c.b.Attachments() {
		if a.EgressMeter != 0 {
			metered = append(metered, a)
		}
	}
	if len(metered) == 0 {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), meterScrapeTimeout)
	defer cancel()
	stats, err := m.MeterStats(ctx)
	if err != nil {
		ch <- prometheus.NewInvalidMetric(c.drops, err)
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
