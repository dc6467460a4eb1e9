package pipeline

import (
	"net"

	of "github.com/seine-net/seine/datapath/openflow"
)

// The NAT checksum detour (userspace datapath with userspace TSO).
//
// With userspace TSO a TCP or UDP packet may cross the bridge with a
// partial checksum: its checksum field holds only the pseudo-header sum,
// and whoever sends it on completes it over the payload (the receiving
// Pod's kernel trusts it as it is). OVS 3.1 updates that field on NAT as if
// it held a complete checksum, which leaves it off by twice the change, so
// a NATed partial packet that leaves the Node (through the tunnel, or the
// gateway towards the host and the wire) is completed into a wrong
// checksum and dropped by its receiver. Delivered to a local Pod it works.
//
// So when a packet that conntrack NATed in this pass (NATApplied) is about
// to leave through the tunnel, the gateway or the segmentation port,
// Output first restores the fields SaveHeaders saved before conntrack (OVS's updates of
// the checksum undo each other, so the packet is exactly as it entered,
// with its original partial checksum), writes its in_port into the low 16
// bits of eth_dst (NATDetourMAC), and sends it through the segmentation
// veth pair, whose sending end lets the kernel complete the checksum (and
// segment). The packet comes back on that port; the Classifier puts back
// its in_port, sets NATChecksumDone and runs it through the whole pipeline
// again, where conntrack NATs it with a complete checksum, which OVS
// updates correctly.

// natDetourMAC is the eth_dst prefix of a packet on the NAT checksum
// detour; its low 16 bits carry the packet's in_port.
var natDetourMAC = net.HardwareAddr{0x0e, 0x5f, 0xff, 0xff, 0x00, 0x00}

var natDetourMask = net.HardwareAddr{0xff, 0xff, 0xff, 0xff, 0x00, 0x00}

// NATChecksumDetour reports whether the bridge sends NATed packets through
// the segmentation port before they leave (the bridge has one).
func (b Bridge) NATChecksumDetour() bool { return b.SegmentPort != 0 }

// regMove copies a register field into bits [ofs, ofs+width) of a header
// field, or the reverse (toReg).
func regMove(f RegField, field of.Field, fieldOfs uint8, toReg bool) of.MoveRange {
	reg, ofs, n := of.FieldReg(f.Reg()), uint16(f.Ofs()), uint16(f.NBits())
	if toReg {
		return of.MoveRange{Src: field, SrcOfs: uint16(fieldOfs), Dst: reg, DstOfs: ofs, NBits: n}
	}
	return of.MoveRange{Src: reg, SrcOfs: ofs, Dst: field, DstOfs: uint16(fieldOfs), NBits: n}
}

// savedFields are the header fields SaveHeaders keeps for a protocol.
func savedFields(proto uint8) []struct {
	reg   RegField
	field of.Field
	ofs   uint8
} {
	src, dst := of.FieldTCPSrc, of.FieldTCPDst
	if proto == 17 {
		src, dst = of.FieldUDPSrc, of.FieldUDPDst
	}
	return []struct {
		reg   RegField
		field of.Field
		ofs   uint8
	}{
		{SavedIPSrc, of.FieldIPSrc, 0},
		{SavedIPDst, of.FieldIPDst, 0},
		{SavedL4Src, src, 0},
		{SavedL4Dst, dst, 0},
		{SavedEthSrcLow, of.FieldEthSrc, 0},
		{SavedEthSrcHigh, of.FieldEthSrc, 32},
		{SavedTTL, of.FieldIPTTL, 0},
	}
}

// notFragment matches nw_frag=no. IP fragments never take the detour: the
// kernel that fragmented a datagram computed its checksum in full (no
// offload spans fragments), which OVS's NAT updates correctly, and a later
// fragment has no transport ports to save or restore.
var notFragment = &of.FragMatch{Value: 0, Mask: of.FragAny}

// natDetourFlows returns the flows of the NAT checksum detour: saving
// headers, sending NATed packets that leave the Node through the
// segmentation port, and taking them back.
func natDetourFlows(b Bridge) []of.Flow {
	if !b.NATChecksumDetour() {
		return nil
	}
	ck := Cookie(b.Round, CategoryPipeline, 0)
	var fs []of.Flow
	leaving := []uint32{b.GatewayPort}
	if b.TunnelPort != 0 {
		leaving = append(leaving, b.TunnelPort)
	}
	if b.Tunnel == TunnelSegmented {
		leaving = append(leaving, b.SegmentPort)
	}
	for _, proto := range []uint8{6, 17} {
		var save, restore []of.Action
		for _, sf := range savedFields(proto) {
			save = append(save, regMove(sf.reg, sf.field, sf.ofs, true))
			restore = append(restore, regMove(sf.reg, sf.field, sf.ofs, false))
		}
		fs = append(fs, of.Flow{Table: uint8(SaveHeaders), Priority: PrioHigh, Cookie: ck,
			Match: of.Match{EthType: EthTypeIPv4, IPProto: proto, Frag: notFragment}, Actions: append(save, goTo(Conntrack))})
		restore = append(restore,
			of.SetEthDst{MAC: natDetourMAC},
			of.MoveRange{Src: of.FieldInPort, Dst: of.FieldEthDst, NBits: 16},
			of.Output{Port: b.SegmentPort})
		ready := of.RegMatch{Reg: OutputResolved.Reg(), Value: OutputResolved.Mask() | NATApplied.Mask(),
			Mask: OutputResolved.Mask() | NATApplied.Mask() | NATChecksumDone.Mask()}
		for _, port := range leaving {
			fs = append(fs, of.Flow{Table: uint8(Output), Priority: PrioHigh + 20, Cookie: ck,
				Match: of.Match{EthType: EthTypeIPv4, IPProto: proto, Frag: notFragment,
					// A Traceflow packet is small and fully checksummed, and its
					// registers must survive: no detour.
					Regs: []of.RegMatch{ready, TargetOFPort.Match(port), TraceActive.Match(0)}},
				Actions: restore})
		}
	}
	// Connections NATed earlier: conntrack's ct(nat) in the Conntrack
	// table applied their NAT.
	// A DNATed one was sent to a Service endpoint: EndpointSelected, which
	// the host SNAT flows need to send a packet from the gateway back out
	// of it, is set again for the packet's second pass after the detour
	// (ServiceLB no longer sees the VIP), and for a retransmitted first
	// packet. It comes first, as a packet can be both.
	fs = append(fs,
		of.Flow{Table: uint8(ConntrackState), Priority: PrioNormal + 1, Cookie: ck,
			Match:   of.Match{EthType: EthTypeIPv4, CtState: &of.CtStateMatch{Set: of.CtTrk | of.CtDNAT}},
			Actions: []of.Action{NATApplied.Load(1), EndpointSelected.Load(1), goTo(ConntrackState.next())}},
		of.Flow{Table: uint8(ConntrackState), Priority: PrioNormal, Cookie: ck,
			Match:   of.Match{EthType: EthTypeIPv4, CtState: &of.CtStateMatch{Set: of.CtTrk | of.CtSNAT}},
			Actions: []of.Action{NATApplied.Load(1), goTo(ConntrackState.next())}})
	fs = append(fs, of.Flow{Table: uint8(Classifier), Priority: PrioHigh + 10, Cookie: ck,
		Match: of.Match{InPort: b.SegmentPort, EthDst: natDetourMAC, EthDstMask: natDetourMask},
		Actions: []of.Action{
			of.MoveRange{Src: of.FieldEthDst, Dst: of.FieldInPort, NBits: 16},
			NATChecksumDone.Load(1),
			of.Resubmit{Table: uint8(Classifier)},
		}})
	return fs
}
