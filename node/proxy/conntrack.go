package proxy

import (
	"context"

	"go.uber.org/zap"

	"github.com/seine-net/seine/datapath/ovsctl"
	"github.com/seine-net/seine/datapath/pipeline"
)

// maxEndpointFlushes is the most endpoints of one VIP whose connections
// are flushed one by one; past it, every connection to the VIP and port is
// flushed at once. Each flush with a partial tuple scans the whole
// connection table.
const maxEndpointFlushes = 16

// flushStale removes from conntrack the UDP and SCTP connections that
// would otherwise stay stuck once the frontend goes from old (as the
// switch had it; zero before its first programming) to cur (zero when
// removed), serving being every endpoint that still serves the Service
// port (see PortState.Serving). Such "connections" have no end a client
// would see: one sending from a fixed source port renews its entry with
// every datagram and keeps the translation it first got. So:
//
//   - connections balanced to an endpoint that no longer serves the port,
//     or to a VIP or port that left, are flushed;
//   - when cur balances and old did not (no endpoint, or not programmed
//     yet), the connections committed without translation (rejected, or
//     sent before the frontend existed) are flushed.
//
// An endpoint that still serves but left the frontend's choice (it is
// terminating, or the traffic policy or topology hints leave it out)
// keeps its connections, as kube-proxy's conntrack cleanup leaves them
// (pkg/proxy/conntrack). TCP needs none of this: its connections end
// (reset or timeout) and clients reconnect from a new port. A flush that
// fails is logged: the entries then expire with their timeout.
//
// The frontends of the initial backlog (programmed for the first time
// before the proxy is ready) are left to reconcileConntrack, which checks
// every connection in one pass once they are all programmed. p.mu must be
// held.
func (p *Proxier) flushStale(ctx context.Context, old, cur pipeline.ServicePort, serving []pipeline.ServiceEndpoint) {
	if p.cfg.Conntrack == nil || (len(old.VIPs) == 0 && !p.ready) {
		return
	}
	for _, f := range staleConns(old, cur, serving) {
		err := p.cfg.Conntrack.FlushConntrack(ctx, pipeline.ConntrackZone, f.orig, f.reply)
		if err != nil {
			p.log.Warn("flushing stale conntrack entries of a Service failed; they expire on their own",
				zap.Stringer("orig", f.orig), zap.Stringer("reply", f.reply), zap.Error(err))
			continue
		}
		p.log.Debug("flushed stale conntrack entries of a Service",
			zap.Stringer("orig", f.orig), zap.Stringer("reply", f.reply))
	}
}

// reconcileConntrack removes, once the initial backlog is programmed, the
// UDP and SCTP connections to a programmed VIP and port whose other end is
// not an endpoint serving that port: those a restart left stale (the
// endpoint left while the daemon was down) and those never translated
// (sent while the frontend rejected, or did not exist yet). One dump of
// the zone, then one flush of each stale connection by its exact tuple.
// p.mu must be held.
func (p *Proxier) reconcileConntrack(ctx context.Context) error {
	if p.cfg.Conntrack == nil {
		return nil
	}
	serving := map[string][]pipeline.ServiceEndpoint{} // by ovsctl.CTTuple of the VIP side
	for _, ports := range p.installed {
		for _, pi := range ports {
			if !connectionless(pi.port.Protocol) || !balances(pi.port) {
				continue
			}
			for _, vip := range pi.port.VIPs {
				k := ovsctl.CTTuple{Dst: vip, Proto: pi.port.Protocol, DstPort: pi.port.Port}.String()
				serving[k] = append(serving[k], pi.serving...)
			}
		}
	}
	if len(serving) == 0 {
		return nil
	}
	entries, err := p.cfg.Conntrack.DumpConntrack(ctx, pipeline.ConntrackZone)
	if err != nil {
		return err
	}
	flushed := 0
	for _, e := range entries {
		eps, ok := serving[ovsctl.CTTuple{Dst: e.Orig.Dst, Proto: e.Orig.Proto, DstPort: e.Orig.DstPort}.String()]
		if !ok || hasEndpoint(eps, pipeline.ServiceEndpoint{IP: e.Reply.Src, Port: e.Reply.SrcPort}) {
			continue
		}
		if err := p.cfg.Conntrack.FlushConntrack(ctx, pipeline.ConntrackZone, e.Orig, ovsctl.CTTuple{}); err != nil {
			return err
		}
		flushed++
	}
	p.log.Info("stale Service connections flushed", zap.Int("connections", len(entries)), zap.Int("flushed", flushed))
	return nil
}

// ctFlush is one conntrack flush: the entries matching orig and reply.
type ctFlush struct{ orig, reply ovsctl.CTTuple }

// connectionless reports whether proto is UDP or SCTP.
func connectionless(proto uint8) bool { return proto == 17 || proto == 132 }

// balances reports whether sp sends new connections to endpoints.
func balances(sp pipeline.ServicePort) bool {
	return len(sp.VIPs) > 0 && sp.Action == pipeline.ServiceBalance && len(sp.Endpoints) > 0
}

// staleConns returns the flushes flushStale makes.
func staleConns(old, cur pipeline.ServicePort, serving []pipeline.ServiceEndpoint) []ctFlush {
	var out []ctFlush
	if connectionless(old.Protocol) {
		for _, vip := range old.VIPs {
			orig := ovsctl.CTTuple{Dst: vip, Proto: old.Protocol, DstPort: old.Port}
			if cur.Protocol != old.Protocol || cur.Port != old.Port || !containsIP(cur.VIPs, vip) {
				out = append(out, ctFlush{orig: orig})
				continue
			}
			var gone []pipeline.ServiceEndpoint
			for _, ep := range old.Endpoints {
				if !hasEndpoint(serving, ep) {
					gone = append(gone, ep)
				}
			}
			if len(gone) > maxEndpointFlushes {
				out = append(out, ctFlush{orig: orig})
				continue
			}
			for _, ep := range gone {
				out = append(out, ctFlush{orig: orig, reply: ovsctl.CTTuple{Src: ep.IP, Proto: old.Protocol, SrcPort: ep.Port}})
			}
		}
	}
	if connectionless(cur.Protocol) && balances(cur) && !balances(old) {
		// Untranslated: the reply would come from the VIP itself.
		for _, vip := range cur.VIPs {
			out = append(out, ctFlush{
				orig:  ovsctl.CTTuple{Dst: vip, Proto: cur.Protocol, DstPort: cur.Port},
				reply: ovsctl.CTTuple{Src: vip, Proto: cur.Protocol, SrcPort: cur.Port},
			})
		}
	}
	return out
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
