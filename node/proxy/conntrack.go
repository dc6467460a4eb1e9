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

// flushStale removes from conntrack the connections that old, the port as
// the switch had it, balanced to an endpoint that cur no longer sends its
// VIP to: the endpoints that left, or all of them for a VIP (or port) that
// left. Only UDP and SCTP: their "connections" have no end a client would
// see, so a client sending from one source port keeps being NATed to a
// gone endpoint for as long as it keeps sending, as each datagram renews
// the entry's timeout. TCP connections end on their own (reset or
// timeout, then a new source port). kube-proxy does the same
// (pkg/proxy/conntrack). A flush that fails is logged: the entries then
// expire with their timeout.
func (p *Proxier) flushStale(ctx context.Context, old, cur pipeline.ServicePort) {
	if p.cfg.Conntrack == nil || (old.Protocol != 17 && old.Protocol != 132) {
		return
	}
	for _, f := range staleConns(old, cur) {
		err := p.cfg.Conntrack.FlushConntrack(ctx, pipeline.ConntrackZone, f.orig, f.reply)
		if err != nil {
			p.log.Warn("flushing the conntrack entries of a gone endpoint failed; they expire on their own",
				zap.Stringer("orig", f.orig), zap.Stringer("reply", f.reply), zap.Error(err))
			continue
		}
		p.log.Debug("flushed the conntrack entries of a gone endpoint",
			zap.Stringer("orig", f.orig), zap.Stringer("reply", f.reply))
	}
}

// ctFlush is one conntrack flush: the entries matching orig and reply.
type ctFlush struct{ orig, reply ovsctl.CTTuple }

// staleConns returns the flushes flushStale makes, for a UDP or SCTP port
// going from old to cur (the zero ServicePort for a removed port).
func staleConns(old, cur pipeline.ServicePort) []ctFlush {
	var out []ctFlush
	for _, vip := range old.VIPs {
		orig := ovsctl.CTTuple{Dst: vip, Proto: old.Protocol, DstPort: old.Port}
		if cur.Protocol != old.Protocol || cur.Port != old.Port || !containsIP(cur.VIPs, vip) {
			out = append(out, ctFlush{orig: orig})
			continue
		}
		var gone []pipeline.ServiceEndpoint
		for _, ep := range old.Endpoints {
			if !hasEndpoint(cur.Endpoints, ep) {
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
