package pipeline

import (
	"net"

	of "github.com/seine-net/seine/datapath/openflow"
)

// Traceflow (node/traceflow) follows one real packet through the
// pipelines of every Node it crosses. The packet is marked, not special:
//
//  1. The source Node injects it with a packet-out at the source Pod's
//     port whose actions load TraceActive=1 and TraceTag=<trace number>,
//     then resubmit it to Classifier: from there on it is handled exactly
//     like a packet the Pod sent.
//  2. In every table, a flow above all others (PrioTraceObserve) matches
//     a marked packet whose TraceVisited bit of that table is still
//     clear: it sends a copy to the daemon (output:CONTROLLER, a packet-in
//     naming the table and carrying the registers), sets the bit and
//     resubmits the packet to the same table, where the ordinary flows
//     now decide. Each table therefore reports the packet once, in the
//     order it visits them, and nothing else changes.
//  3. A marked packet leaving through the tunnel gets the tunnel key
//     TunnelKeyTraced|tag (the key is otherwise always 0); a peer's
//     Classifier turns such a packet back into a marked one (TraceActive,
//     TraceTag from the key) before anything else, so it reports it too.
//     Through a kernel VXLAN device (TunnelByMAC) the key is the device's,
//     so the mark travels in the inner source MAC instead: TraceMAC with
//     the tag in its last two bytes (the peer reads nothing else from
//     that address).
//
// Registers are not datapath fields, so the observation flows add nothing
// to the datapath's cached flows (unmarked packets cost one more
// classifier lookup per table, in the slow path); the tunnel key bit is
// matched only on packets from the tunnel.

// TunnelKeyTraced is the tunnel key bit marking a Traceflow packet; the
// key's bits 0..15 carry TraceTag. VXLAN and Geneve keys have 24 bits,
// GRE keys 32.
const TunnelKeyTraced uint64 = 1 << 23

// TraceMAC is the inner source MAC of a traced packet sent through a
// kernel tunnel device (TunnelByMAC), with the tag in bytes 4 and 5:
// locally administered, and never a Pod's or a gateway's.
var TraceMAC = net.HardwareAddr{0x0e, 0x5e, 0x7a, 0xce, 0, 0}

var traceMACMask = net.HardwareAddr{0xff, 0xff, 0xff, 0xff, 0, 0}

// PrioTraceObserve is the priority of the observation flows; the tunnel
// marker flow is one below, every other flow of the pipeline far below.
const PrioTraceObserve uint16 = 0xfff0

// TraceFlows returns the Traceflow flows of the bridge (cookie category
// CategoryTrace): one observation flow per table of Tables(), and, with a
// tunnel, the marker flows that carry a trace across it.
func TraceFlows(b Bridge) []of.Flow {
	ck := Cookie(b.Round, CategoryTrace, 0)
	var fs []of.Flow
	for i, ti := range Tables() {
		visited := of.RegMatch{Reg: TraceVisited.Reg(), Value: 0, Mask: 1 << i}
		fs = append(fs, of.Flow{Table: uint8(ti.Table), Priority: PrioTraceObserve, Cookie: ck,
			Match: of.Match{Regs: []of.RegMatch{TraceActive.Match(1), visited}},
			Actions: []of.Action{
				of.Output{Port: of.PortController},
				of.LoadReg{Reg: TraceVisited.Reg(), Ofs: uint8(i), NBits: 1, Value: 1},
				of.Resubmit{Table: uint8(ti.Table)},
			}})
	}
	if b.TunnelPort == 0 {
		return fs
	}
	ofs, n := uint16(TraceTag.Ofs()), uint16(TraceTag.NBits())
	if b.Tunnel == TunnelByMAC {
		return append(fs,
			of.Flow{Table: uint8(Classifier), Priority: PrioTraceObserve - 1, Cookie: ck,
				Match: of.Match{InPort: b.TunnelPort, EthSrc: TraceMAC, EthSrcMask: traceMACMask,
					Regs: []of.RegMatch{TraceActive.Match(0)}},
				Actions: []of.Action{
					of.MoveRange{Src: of.FieldEthSrc, Dst: of.FieldReg(TraceTag.Reg()), SrcOfs: 0, DstOfs: ofs, NBits: n},
					TraceActive.Load(1),
					of.Resubmit{Table: uint8(Classifier)},
				}},
			of.Flow{Table: uint8(Output), Priority: PrioHigh + 1, Cookie: ck,
				Match: of.Match{Regs: []of.RegMatch{OutputResolved.Match(1), TargetOFPort.Match(b.TunnelPort), TraceActive.Match(1)}},
				Actions: []of.Action{
					of.SetEthSrc{MAC: TraceMAC},
					of.MoveRange{Src: of.FieldReg(TraceTag.Reg()), Dst: of.FieldEthSrc, SrcOfs: ofs, DstOfs: 0, NBits: n},
					of.OutputReg{Reg: TargetOFPort.Reg(), Ofs: TargetOFPort.Ofs(), NBits: TargetOFPort.NBits()},
				}})
	}
	fs = append(fs,
		of.Flow{Table: uint8(Classifier), Priority: PrioTraceObserve - 1, Cookie: ck,
			Match: of.Match{InPort: b.TunnelPort, TunID: &of.Masked64{Value: TunnelKeyTraced, Mask: TunnelKeyTraced},
				Regs: []of.RegMatch{TraceActive.Match(0)}},
			Actions: []of.Action{
				of.MoveRange{Src: of.FieldTunID, Dst: of.FieldReg(TraceTag.Reg()), SrcOfs: 0, DstOfs: ofs, NBits: n},
				TraceActive.Load(1),
				of.Resubmit{Table: uint8(Classifier)},
			}},
		of.Flow{Table: uint8(Output), Priority: PrioHigh + 1, Cookie: ck,
			Match: of.Match{Regs: []of.RegMatch{OutputResolved.Match(1), TargetOFPort.Match(b.TunnelPort), TraceActive.Match(1)}},
			Actions: []of.Action{
				of.SetTunID{ID: TunnelKeyTraced},
				of.MoveRange{Src: of.FieldReg(TraceTag.Reg()), Dst: of.FieldTunID, SrcOfs: ofs, DstOfs: 0, NBits: n},
				of.OutputReg{Reg: TargetOFPort.Reg(), Ofs: TargetOFPort.Ofs(), NBits: TargetOFPort.NBits()},
			}},
	)
	return fs
}

// TraceInjectActions are the packet-out actions that start a trace with
// the given tag at the packet-out's in_port.
func TraceInjectActions(tag uint16) []of.Action {
	return []of.Action{TraceActive.Load(1), TraceTag.Load(uint32(tag)), of.Resubmit{Table: uint8(Classifier)}}
}

// DropReason explains why a packet whose last table was t went no
// further (for Traceflow and trace-packet reports).
func DropReason(t Table) string {
	switch t {
	case Classifier:
		return "it entered on a port the pipeline does not know"
	case SpoofGuard:
		return "its source IP or MAC is not the sending Pod's (spoof guard)"
	case ARPResponder:
		return "no port owns the ARP target"
	case ConntrackState:
		return "connection tracking marked it invalid (ct_state=+inv)"
	case ServiceLB:
		return "a Service without endpoints: handed to the host, which rejects it"
	case EgressDefault:
		return "the source Pod is isolated for egress by a NetworkPolicy and no egress rule allowed it"
	case IngressDefault:
		return "the destination Pod is isolated for ingress by a NetworkPolicy and no ingress rule allowed it"
	case L3Forwarding:
		return "no route: an unknown address in this Node's podCIDR"
	case L2Forwarding:
		return "no port owns its destination MAC"
	case Output:
		return "no output port was resolved"
	}
	return "no flow of the table passed it on"
}
