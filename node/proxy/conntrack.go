package proxy

import (
	"context"
	"net"
	"time"

	"go.uber.org/zap"

	"github.com/seine-net/seine/datapath/ovsctl"
	"github.com/seine-net/seine/datapath/pipeline"
)

// UDP and SCTP "connections" have no end a client would see: one sending
// from a fixed source port renews its conntrack entry with every datagram
// and keeps the translation it first got. So once a batch of Services is
// programmed the proxy flushes, for every VIP and port whose UDP or SCTP
// frontends changed (a ctKey):
//
//   - the entries balanced to an endpoint that served the port before and
//     serves it no longer (deleted, relabelled, not ready and not
//     terminating), or all of them when no frontend has the VIP and port
//     any more;
//   - when the VIP and port start balancing (their first endpoint, their
//     first programming, a VIP added), the entries committed untranslated
//     while they rejected or did not exist, whose reply would come from
//     the VIP itself.
//
// An endpoint that still serves the port, though the frontends' choice
// left it out (it is terminating, or the traffic policy or topology
// hints pass it by), keeps its flows, as kube-proxy's conntrack cleanup
// leaves them (pkg/proxy/conntrack). TCP needs none of this: its
// connections end (reset or timeout) and clients reconnect from a new
// port. After a restart, once the Services known at start are programmed,
// reconcileConntrack checks every entry against them once.

// maxPartialFlushes is the most flushes by partial tuple made after one
// batch: each scans ovs-vswitchd's whole connection table, so past it one
// dump is read instead and each stale entry flushed by its exact tuple.
const maxPartialFlushes = 16

// ctTimeout bounds each call to ovs-vswitchd's control socket.
const ctTimeout = 10 * time.Second

// DefaultReflushDelay is how long after a batch's flushes the proxy
// flushes the same entries once more (Config.ReflushDelay): a datagram
// that an upcall in flight during the batch balanced by the old tables,
// or a flush that timed out on a loaded ovs-vswitchd, would otherwise
// leave a UDP flow on a gone endpoint for as long as it keeps sending.
const DefaultReflushDelay = time.Second

// DefaultMinPurgeInterval is the shortest time from the end of one of the
// proxy's purges of the Node's cached datapath flows (and the flushes
// behind it) to the next (Config.MinPurgeInterval); flushes that come
// sooner wait, and go together behind one purge. A purge makes every flow
// on the Node, related or not, miss the cache once: BenchmarkDatapathPurge
// found up to 10 a second within its noise and 50 a second costing
// traffic across Nodes about a fifth of its throughput
// (docs/benchmarks.md). The policy agent's purges are its own.
const DefaultMinPurgeInterval = 100 * time.Millisecond

// ctKey names a VIP, protocol and port: the original destination of the
// connections a frontend translated.
type ctKey struct {
	vip   string
	proto uint8
	port  uint16
}

// ctBefore is what a ctKey's connections were balanced by before the
// changes of a batch: the endpoints then serving it, and whether it
// balanced at all.
type ctBefore struct {
	serving   []pipeline.ServiceEndpoint
	balancing bool
}

// connectionless reports whether proto is UDP or SCTP.
func connectionless(proto uint8) bool { return proto == 17 || proto == 132 }

// balances reports whether sp sends new connections to endpoints.
func balances(sp pipeline.ServicePort) bool {
	return len(sp.VIPs) > 0 && sp.Action == pipeline.ServiceBalance && len(sp.Endpoints) > 0
}

// hasEndpoint reports whether eps holds ep's address and port.
func hasEndpoint(eps []pipeline.ServiceEndpoint, ep pipeline.ServiceEndpoint) bool {
	for _, e := range eps {
		if e.Port == ep.Port && e.IP.Equal(ep.IP) {
			return true
		}
	}
	return false
}

// noteConntrack records, before pi changes from its installed state to
// cur (zero: removed) serving serving, the ctKeys whose connections may go
// stale. The frontends of the initial backlog (programmed for the first
// time before the proxy is ready) are left to reconcileConntrack. p.mu
// must be held.
func (p *Proxier) noteConntrack(pi *portInstall, cur pipeline.ServicePort, serving []pipeline.ServiceEndpoint) {
	old := pi.port
	if p.cfg.Conntrack == nil || (len(old.VIPs) == 0 && !p.ready) ||
		(!connectionless(old.Protocol) && !connectionless(cur.Protocol)) {
		return
	}
	if len(old.VIPs) > 0 && old.Protocol == cur.Protocol && old.Port == cur.Port && balances(old) == balances(cur) &&
		slicesEqualIPs(old.VIPs, cur.VIPs) && coversAll(serving, pi.serving) {
		return // nothing that served goes, nothing starts balancing
	}
	if p.ctDirty == nil {
		p.ctDirty = map[ctKey]*ctBefore{}
	}
	note := func(sp pipeline.ServicePort, eps []pipeline.ServiceEndpoint) {
		if !connectionless(sp.Protocol) {
			return
		}
		for _, vip := range sp.VIPs {
			k := ctKey{vip: vip.String(), proto: sp.Protocol, port: sp.Port}
			if _, ok := p.ctDirty[k]; ok {
				continue // the state before the batch's first change stands
			}
			p.ctDirty[k] = p.ctStateLocked(k)
		}
	}
	note(old, pi.serving)
	note(cur, serving)
}

// setPortLocked records that pi is now programmed as sp, serving
// serving (sp zero: removed), noting first what the change may leave
// stale in conntrack. p.mu must be held.
func (p *Proxier) setPortLocked(pi *portInstall, sp pipeline.ServicePort, serving []pipeline.ServiceEndpoint) {
	p.noteConntrack(pi, sp, serving)
	p.indexCTLocked(pi, false)
	pi.port, pi.serving = sp, serving
	p.indexCTLocked(pi, true)
}

// indexCTLocked adds pi to (or removes it from) p.ctPorts under each
// ctKey of its programmed port, when that is UDP or SCTP and conntrack
// is flushed at all. p.mu must be held.
func (p *Proxier) indexCTLocked(pi *portInstall, add bool) {
	if p.cfg.Conntrack == nil || !connectionless(pi.port.Protocol) {
		return
	}
	if p.ctPorts == nil {
		p.ctPorts = map[ctKey]map[*portInstall]struct{}{}
	}
	for _, vip := range pi.port.VIPs {
		k := ctKey{vip: vip.String(), proto: pi.port.Protocol, port: pi.port.Port}
		set := p.ctPorts[k]
		switch {
		case add && set == nil:
			p.ctPorts[k] = map[*portInstall]struct{}{pi: {}}
		case add:
			set[pi] = struct{}{}
		default:
			delete(set, pi)
			if len(set) == 0 {
				delete(p.ctPorts, k)
			}
		}
	}
}

// ctStateLocked is the ctKey's state as installed now: the frontends
// p.ctPorts holds under it. p.mu must be held.
func (p *Proxier) ctStateLocked(k ctKey) *ctBefore {
	b := &ctBefore{}
	for pi := range p.ctPorts[k] {
		b.serving = append(b.serving, pi.serving...)
		b.balancing = b.balancing || balances(pi.port)
	}
	return b
}

// flushConntrack flushes what the ctKeys noted since the last call call
// for, against the frontends installed now (see the comment at the top).
// It takes p.mu only to read them: the calls to ovs-vswitchd run without
// it. A flush that fails is logged; its entries live out their timeout.
func (p *Proxier) flushConntrack(ctx context.Context) {
	p.mu.Lock()
	dirty := p.ctDirty
	p.ctDirty = nil
	var flushes []ctFlush
	for k, before := range dirty {
		now := p.ctStateLocked(k)
		installed := p.installedLocked(k)
		vip := net.ParseIP(k.vip)
		orig := ovsctl.CTTuple{Dst: vip, Proto: k.proto, DstPort: k.port}
		if !installed {
			flushes = append(flushes, ctFlush{orig: orig})
			continue
		}
		for _, ep := range before.serving {
			if !hasEndpoint(now.serving, ep) {
				flushes = append(flushes, ctFlush{orig: orig, reply: ovsctl.CTTuple{Src: ep.IP, Proto: k.proto, SrcPort: ep.Port}})
			}
		}
		if now.balancing && !before.balancing {
			flushes = append(flushes, ctFlush{orig: orig, reply: ovsctl.CTTuple{Src: vip, Proto: k.proto, SrcPort: k.port}})
		}
	}
	p.mu.Unlock()
	if len(flushes) == 0 {
		return
	}
	p.scheduleFlushes(ctx, flushes)
	if d := p.cfg.ReflushDelay; d > 0 {
		go func() {
			select {
			case <-ctx.Done():
				return
			case <-time.After(d):
			}
			if again := p.stillStale(flushes); len(again) > 0 {
				p.scheduleFlushes(ctx, again)
			}
		}()
	}
}

// scheduleFlushes runs flushes now when no run is under way and the last
// purge of the datapath flows ended at least Config.MinPurgeInterval ago;
// else it holds them, beside any others held, for the next run, which
// makes them all behind one purge. p.mu must not be held.
func (p *Proxier) scheduleFlushes(ctx context.Context, flushes []ctFlush) {
	p.flushMu.Lock()
	p.heldFlushes = append(p.heldFlushes, flushes...)
	if p.flushing || p.flushTimer != nil {
		p.flushMu.Unlock() // the run under way, or the timer, takes them
		return
	}
	if wait := time.Until(p.lastPurge.Add(p.cfg.MinPurgeInterval)); wait > 0 {
		p.flushTimer = time.AfterFunc(wait, func() { p.flushHeldOnTimer(ctx) })
		p.flushMu.Unlock()
		return
	}
	p.flushing = true
	p.flushMu.Unlock()
	p.runHeldFlushes(ctx)
}

// flushHeldOnTimer is the timer scheduleFlushes and runHeldFlushes set:
// it schedules what is held, which runs now unless a run is under way
// (which sets the timer again for what it leaves held).
func (p *Proxier) flushHeldOnTimer(ctx context.Context) {
	p.flushMu.Lock()
	p.flushTimer = nil
	p.flushMu.Unlock()
	p.scheduleFlushes(ctx, nil)
}

// runHeldFlushes makes the held flushes, once each, and those of an
// endpoint only where still stale; the caller set p.flushing. A flush of
// every entry to a VIP and port no longer installed runs even when a
// frontend has them again by now: the new frontend's own bookkeeping
// started from nothing installed, so nothing else flushes the entries
// to the old endpoints (the new frontend's first entries are balanced
// again, once). Flushes held when ctx ends are dropped: after a restart
// reconcileConntrack checks every entry.
func (p *Proxier) runHeldFlushes(ctx context.Context) {
	p.flushMu.Lock()
	held := p.heldFlushes
	p.heldFlushes = nil
	p.flushMu.Unlock()
	ran := false
	if ctx.Err() == nil {
		seen := make(map[string]bool, len(held))
		var whole, rest []ctFlush
		for _, f := range held {
			k := f.orig.String() + "|" + f.reply.String()
			switch {
			case seen[k]:
			case f.reply.Src == nil:
				whole = append(whole, f)
			default:
				rest = append(rest, f)
			}
			seen[k] = true
		}
		if run := append(whole, p.stillStale(rest)...); len(run) > 0 {
			p.runFlushes(ctx, run)
			ran = true
		}
	}
	p.flushMu.Lock()
	defer p.flushMu.Unlock()
	p.flushing = false
	if ran {
		p.lastPurge = time.Now()
	}
	if len(p.heldFlushes) > 0 && p.flushTimer == nil && ctx.Err() == nil {
		wait := max(time.Until(p.lastPurge.Add(p.cfg.MinPurgeInterval)), 0)
		p.flushTimer = time.AfterFunc(wait, func() { p.flushHeldOnTimer(ctx) })
	}
}

// stillStale returns the flushes whose entries are still stale against
// the frontends installed now: not those of an endpoint that serves the
// VIP and port again, of a VIP and port that stopped balancing, or of
// one installed again. p.mu is taken.
func (p *Proxier) stillStale(flushes []ctFlush) []ctFlush {
	p.mu.Lock()
	defer p.mu.Unlock()
	var out []ctFlush
	for _, f := range flushes {
		k := ctKey{vip: f.orig.Dst.String(), proto: f.orig.Proto, port: f.orig.DstPort}
		now := p.ctStateLocked(k)
		switch {
		case f.reply.Src == nil:
			if p.installedLocked(k) {
				continue
			}
		case f.reply.Src.Equal(f.orig.Dst):
			if !now.balancing {
				continue
			}
		case hasEndpoint(now.serving, pipeline.ServiceEndpoint{IP: f.reply.Src, Port: f.reply.SrcPort}):
			continue
		}
		out = append(out, f)
	}
	return out
}

// runFlushes purges the cached datapath flows and flushes the entries of
// flushes (by partial tuple, or past maxPartialFlushes from one dump). p.mu
// must not be held.
func (p *Proxier) runFlushes(ctx context.Context, flushes []ctFlush) {
	// A packet that meets a datapath flow cached from the tables before
	// the batch is balanced the old way and commits a new entry to the
	// old endpoint, which would outlive the flush (with the userspace
	// datapath, OVS 3.1 keeps such flows until its revalidators pass,
	// hundreds of ms under load): drop the cached flows first, as the
	// policy agent does after a revoking change.
	cctx, cancel := context.WithTimeout(ctx, ctTimeout)
	err := p.cfg.Conntrack.PurgeDatapathFlows(cctx)
	cancel()
	if err != nil {
		p.log.Warn("purging the datapath flows before a conntrack flush failed; a flow balanced by the old tables may keep its endpoint",
			zap.Error(err))
	} else {
		p.metrics.purged()
	}
	if len(flushes) > maxPartialFlushes {
		p.flushMatching(ctx, flushes)
		return
	}
	for _, f := range flushes {
		cctx, cancel := context.WithTimeout(ctx, ctTimeout)
		err := p.cfg.Conntrack.FlushConntrack(cctx, pipeline.ConntrackZone, f.orig, f.reply)
		cancel()
		if err != nil {
			p.log.Warn("flushing stale conntrack entries of a Service failed; they expire on their own",
				zap.Stringer("orig", f.orig), zap.Stringer("reply", f.reply), zap.Error(err))
			continue
		}
		p.log.Debug("flushed stale conntrack entries of a Service",
			zap.Stringer("orig", f.orig), zap.Stringer("reply", f.reply))
	}
}

// installedLocked reports whether a frontend has the ctKey. p.mu must be
// held.
func (p *Proxier) installedLocked(k ctKey) bool { return len(p.ctPorts[k]) > 0 }

// ctFlush is one conntrack flush: the entries matching orig and reply.
type ctFlush struct{ orig, reply ovsctl.CTTuple }

// matches reports whether the entry e is one f flushes.
func (f ctFlush) matches(e ovsctl.CTEntry) bool {
	return tupleMatches(f.orig, e.Orig) && tupleMatches(f.reply, e.Reply)
}

// tupleMatches reports whether t, whose zero fields match anything,
// matches the tuple of an entry.
func tupleMatches(t, of ovsctl.CTTuple) bool {
	return (t.Src == nil || t.Src.Equal(of.Src)) && (t.Dst == nil || t.Dst.Equal(of.Dst)) &&
		(t.Proto == 0 || t.Proto == of.Proto) && (t.SrcPort == 0 || t.SrcPort == of.SrcPort) &&
		(t.DstPort == 0 || t.DstPort == of.DstPort)
}

// flushMatching reads the zone once and flushes each entry one of flushes
// matches, by its exact original tuple.
func (p *Proxier) flushMatching(ctx context.Context, flushes []ctFlush) {
	entries, ok := p.dumpZone(ctx)
	if !ok {
		return
	}
	n := 0
	for _, e := range entries {
		for _, f := range flushes {
			if f.matches(e) {
				p.flushEntry(ctx, e)
				n++
				break
			}
		}
	}
	p.log.Debug("flushed stale conntrack entries of Services", zap.Int("connections", len(entries)), zap.Int("flushed", n))
}

// dumpZone reads the connections of zone 65520; ok is false, and the
// failure logged, when it cannot.
func (p *Proxier) dumpZone(ctx context.Context) (entries []ovsctl.CTEntry, ok bool) {
	cctx, cancel := context.WithTimeout(ctx, ctTimeout)
	defer cancel()
	entries, err := p.cfg.Conntrack.DumpConntrack(cctx, pipeline.ConntrackZone)
	if err != nil {
		p.log.Warn("reading conntrack to flush stale Service connections failed; they expire on their own", zap.Error(err))
		return nil, false
	}
	return entries, true
}

// flushEntry flushes one entry by its exact original tuple; an entry gone
// meanwhile is no failure worth more than a debug line.
func (p *Proxier) flushEntry(ctx context.Context, e ovsctl.CTEntry) {
	cctx, cancel := context.WithTimeout(ctx, ctTimeout)
	defer cancel()
	if err := p.cfg.Conntrack.FlushConntrack(cctx, pipeline.ConntrackZone, e.Orig, ovsctl.CTTuple{}); err != nil {
		p.log.Debug("flushing a stale Service connection failed", zap.Stringer("orig", e.Orig), zap.Error(err))
	}
}

// reconcileConntrack checks, once the initial backlog is programmed, every
// UDP and SCTP entry to a VIP and port some frontend has: one whose other
// end does not serve the port any more (an endpoint that left while the
// daemon was down, or a flow never translated) is flushed by its exact
// tuple. One dump of the zone; p.mu must not be held.
func (p *Proxier) reconcileConntrack(ctx context.Context) {
	if p.cfg.Conntrack == nil {
		return
	}
	p.mu.Lock()
	serving := map[ctKey][]pipeline.ServiceEndpoint{}
	for _, ports := range p.installed {
		for _, pi := range ports {
			if !connectionless(pi.port.Protocol) {
				continue
			}
			for _, vip := range pi.port.VIPs {
				k := ctKey{vip: vip.String(), proto: pi.port.Protocol, port: pi.port.Port}
				serving[k] = append(serving[k], pi.serving...)
			}
		}
	}
	p.mu.Unlock()
	if len(serving) == 0 {
		return
	}
	entries, ok := p.dumpZone(ctx)
	if !ok {
		return
	}
	flushed := 0
	for _, e := range entries {
		eps, ok := serving[ctKey{vip: e.Orig.Dst.String(), proto: e.Orig.Proto, port: e.Orig.DstPort}]
		if !ok || hasEndpoint(eps, pipeline.ServiceEndpoint{IP: e.Reply.Src, Port: e.Reply.SrcPort}) {
			continue
		}
		p.flushEntry(ctx, e)
		flushed++
	}
	p.log.Info("stale Service connections flushed", zap.Int("connections", len(entries)), zap.Int("flushed", flushed))
}

// slicesEqualIPs reports whether a and b hold the same addresses in order.
func slicesEqualIPs(a, b []net.IP) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if !a[i].Equal(b[i]) {
			return false
		}
	}
	return true
}

// coversAll reports whether eps holds every endpoint of want.
func coversAll(eps, want []pipeline.ServiceEndpoint) bool {
	for _, ep := range want {
		if !hasEndpoint(eps, ep) {
			return false
		}
	}
	return true
}
