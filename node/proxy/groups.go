package proxy

import (
	"context"
	"slices"
	"sync"

	of "github.com/seine-net/seine/datapath/openflow"
)

// groupBook lists the Service groups installed on the switch, for
// ReplayGroups. It has a lock of its own: a sync holds Proxier.mu while it
// waits for the switch, and after ovs-vswitchd restarts the switch is
// ready again only once the replay has run, so a replay that needed
// Proxier.mu would wait for a sync that waits for it.
type groupBook struct {
	mu   sync.Mutex
	byID map[uint32]bookedGroup
}

type bookedGroup struct {
	group of.GroupEntry
	top   bool // the port's own group, naming the second-level ones
}

func newGroupBook() *groupBook { return &groupBook{byID: map[uint32]bookedGroup{}} }

func (b *groupBook) put(g of.GroupEntry, top bool) {
	b.mu.Lock()
	b.byID[g.ID] = bookedGroup{group: g, top: top}
	b.mu.Unlock()
}

func (b *groupBook) remove(id uint32) {
	b.mu.Lock()
	delete(b.byID, id)
	b.mu.Unlock()
}

// inOrder returns the groups in installation order: second-level groups
// first, then the groups that name them, each part by ID.
func (b *groupBook) inOrder() []of.GroupEntry {
	b.mu.Lock()
	var subs, tops []of.GroupEntry
	for _, bg := range b.byID {
		if bg.top {
			tops = append(tops, bg.group)
		} else {
			subs = append(subs, bg.group)
		}
	}
	b.mu.Unlock()
	byID := func(a, b of.GroupEntry) int { return int(a.ID) - int(b.ID) }
	slices.SortFunc(subs, byID)
	slices.SortFunc(tops, byID)
	return append(subs, tops...)
}

// keepGroup records g as installed for port pi.
func (p *Proxier) keepGroup(pi *portInstall, g of.GroupEntry) {
	pi.groups[g.ID] = g
	p.book.put(g, g.ID == pi.id)
}

// dropGroup records group id of port pi as deleted from the switch.
func (p *Proxier) dropGroup(pi *portInstall, id uint32) {
	delete(pi.groups, id)
	p.book.remove(id)
}

// ReplayGroups installs every group again, second-level groups first, for
// a switch that lost them (ovs-vswitchd restarted): run it before the
// flows that name them are replayed. It does not take Proxier.mu (see
// groupBook), and returns the first group the switch refuses.
func (p *Proxier) ReplayGroups(ctx context.Context) error {
	for _, g := range p.book.inOrder() {
		// Add, or modify when the switch kept the group after all.
		if err := p.putGroup(ctx, g, false); err != nil {
			return err
		}
	}
	return nil
}
