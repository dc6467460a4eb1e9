package proxy

import (
	"context"
	"fmt"
	"net"
	"slices"

	"go.uber.org/zap"

	"github.com/seine-net/seine/datapath/flowsync"
	of "github.com/seine-net/seine/datapath/openflow"
	"github.com/seine-net/seine/datapath/pipeline"
)

// maxBatch is the most Services one pass of the worker programs together.
// A cold start with N Services costs about 3·N/maxBatch round trips to the
// switch instead of 3·N.
const maxBatch = 1000

// portPlan is one Service port of a batch: its install record and what it
// should have on the switch.
type portPlan struct {
	key    string // the Service
	pi     *portInstall
	ps     PortState
	flows  []of.Flow
	groups []of.GroupEntry // in installation order: second-level groups first
}

// applyBatch makes the datapath state of every Service in wants match it
// (as applyLocked does for one): all their groups in one bundle, all their
// flows in one bundle, then the groups they no longer use and the host's
// nftables elements and routes in one go. If a shared step fails, or a
// Service also has ports to remove, those Services are programmed again
// one port at a time, so each gets its own error. It returns the errors by
// Service key.
func (p *Proxier) applyBatch(ctx context.Context, wants map[string][]PortState) map[string]error {
	p.mu.Lock()
	defer p.mu.Unlock()
	keys := make([]string, 0, len(wants))
	for k := range wants {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	errs := map[string]error{}
	var slow []string // keys to program one port at a time
	var plans []*portPlan
	for _, key := range keys {
		kp, ok := p.planService(key, wants[key])
		if !ok {
			slow = append(slow, key)
			continue
		}
		plans = append(plans, kp...)
	}
	if len(plans) > 0 {
		if err := p.installPlans(ctx, plans); err != nil {
			p.log.Info("batch of services failed; programming them one at a time",
				zap.Int("ports", len(plans)), zap.Error(err))
			seen := map[string]bool{}
			for _, pl := range plans {
				if !seen[pl.key] {
					seen[pl.key] = true
					slow = append(slow, pl.key)
				}
			}
		}
	}
	for _, key := range slow {
		if err := p.applyLocked(ctx, key, wants[key]); err != nil {
			errs[key] = err
		}
	}
	p.host.sweepAliases(p.namedLocked)
	return errs
}

// namedLocked reports whether an installed frontend lists ip among its
// VIPs. It scans every frontend: call it rarely. p.mu must be held.
func (p *Proxier) namedLocked(ip net.IP) bool {
	for _, ports := range p.installed {
		for _, pi := range ports {
			if slices.ContainsFunc(pi.port.VIPs, ip.Equal) {
				return true
			}
		}
	}
	return false
}

// planService returns the plans of the Service key's wanted ports, giving
// new ports their ID; ok is false when the Service needs the one-port path
// (a port to remove, no ID left, flows that cannot be built).
func (p *Proxier) planService(key string, want []PortState) (plans []*portPlan, ok bool) {
	have := p.installed[key]
	wanted := make(map[string]bool, len(want))
	for _, ps := range want {
		wanted[ps.Key] = true
	}
	for k := range have {
		if !wanted[k] {
			return nil, false
		}
	}
	if len(want) == 0 {
		return nil, true
	}
	if have == nil {
		have = map[string]*portInstall{}
		p.installed[key] = have
	}
	// Every frontend its ID first: one frontend's flows may name
	// another's (AffinityOf).
	for _, ps := range want {
		if have[ps.Key] == nil {
			id, err := p.ids.get(ps.Key, p.prior[frontendKeyOf(ps.Port)])
			if err != nil {
				return nil, false
			}
			have[ps.Key] = &portInstall{id: id, groups: map[uint32]of.GroupEntry{}}
		}
	}
	for _, ps := range want {
		pi := have[ps.Key]
		ps = p.withAliases(ps)
		sp := ps.Port
		sp.ID, sp.AffinityID = pi.id, affinityID(have, ps)
		flows, groups, err := pipeline.ServicePortFlows(p.cfg.Bridge, sp)
		if err != nil {
			return nil, false
		}
		slices.Reverse(groups)
		plans = append(plans, &portPlan{key: key, pi: pi, ps: ps, flows: flows, groups: groups})
	}
	return plans, true
}

// installPlans programs plans with shared bundles and records what is
// installed as it goes, so that the one-port path can take over from
// wherever it fails.
func (p *Proxier) installPlans(ctx context.Context, plans []*portPlan) error {
	var gmods []of.GroupMod
	for _, pl := range plans {
		for _, g := range pl.groups {
			_, known := pl.pi.groups[g.ID]
			op := of.GroupOpAdd
			if known || p.existing[g.ID] {
				op = of.GroupOpModify
			}
			gmods = append(gmods, of.GroupMod{Op: op, Group: g})
		}
	}
	if err := p.sw.ApplyGroups(ctx, gmods); err != nil {
		return fmt.Errorf("groups: %w", err)
	}
	ups := make([]flowsync.Update, 0, len(plans))
	for _, pl := range plans {
		for _, g := range pl.groups {
			p.keepGroup(pl.pi, g)
			delete(p.existing, g.ID)
		}
		ups = append(ups, flowsync.Update{Owner: pipeline.ServiceOwner(pl.pi.id), Flows: pl.flows})
	}
	if err := p.flows.SetMany(ctx, ups); err != nil {
		return fmt.Errorf("flows: %w", err)
	}
	for _, pl := range plans {
		sp := pl.ps.Port
		sp.ID, sp.AffinityID = pl.pi.id, affinityID(p.installed[pl.key], pl.ps)
		p.setPortLocked(pl.pi, sp, pl.ps.Serving)
	}
	var stale []of.GroupMod
	for _, pl := range plans {
		for id := range pl.pi.groups {
			if !slices.ContainsFunc(pl.groups, func(g of.GroupEntry) bool { return g.ID == id }) {
				stale = append(stale, of.GroupMod{Op: of.GroupOpDelete, Group: of.GroupEntry{ID: id}})
			}
		}
	}
	if err := p.sw.ApplyGroups(ctx, stale); err != nil {
		return fmt.Errorf("deleting unused groups: %w", err)
	}
	for _, pl := range plans {
		for id := range pl.pi.groups {
			if !slices.ContainsFunc(pl.groups, func(g of.GroupEntry) bool { return g.ID == id }) {
				p.dropGroup(pl.pi, id)
			}
		}
	}
	var addEl, delEl []element
	var addRoutes, delRoutes []net.IP
	needs := make([][]element, len(plans))
	routes := make([][]net.IP, len(plans))
	for i, pl := range plans {
		sp := pl.ps.Port
		sp.ID = pl.pi.id
		needs[i], routes[i] = p.hostNeedsWithClusterRoutes(sp, pl.ps.ClusterIPs, pl.ps.Aliases)
		addEl, delEl = append(addEl, needs[i]...), append(delEl, pl.pi.elements...)
		addRoutes, delRoutes = append(addRoutes, routes[i]...), append(delRoutes, pl.pi.routes...)
	}
	// Recorded even when the update fails: its counts took the change.
	err := p.host.update(ctx, addEl, delEl, addRoutes, delRoutes)
	for i, pl := range plans {
		pl.pi.elements, pl.pi.routes = needs[i], routes[i]
	}
	return err
}

// readExistingGroups learns which groups are on the switch at start (left
// by an earlier run of the daemon), so that installing one of them is a
// modify, not an add the switch would refuse.
func (p *Proxier) readExistingGroups(ctx context.Context) error {
	ids, err := p.sw.GroupIDs(ctx)
	if err != nil {
		return fmt.Errorf("reading installed groups: %w", err)
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	p.existing = make(map[uint32]bool, len(ids))
	for _, id := range ids {
		p.existing[id] = true
	}
	return nil
}
