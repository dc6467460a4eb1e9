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
// bits of eth_dst (natDetourMAC), and sends it through the segmentation
// veth pair, whose sending end lets the kernel complete the checksum (and
// segment). The packet comes back on that port; the Classifier puts back
// its in_port, sets NATChecksumDone and runs it through the whole pipeline
// again, where conntrack NATs it with a complete checksum, which OVS
// updates correctly.
//
// Where the kernel accepts it, a tc program on those ports' devices
// rewrites the seed of a partial checksum from the packet's headers instead
// (datapath/csumseed, Bridge.PartialChecksumsRewritten), and none of this
// is installed: NATed packets leave as they are, at TSO speed.

// natDetourMAC is the eth_dst prefix of a packet on the NAT checksum
// detour; its low 16 bits carry the packet's in_port.
var natDetourMAC = net.HardwareAddr{0x0e, 0x5f, 0xff, 0xff, 0x00, 0x00}

var natDetourMask = net.HardwareAddr{0xff, 0xff, 0xff, 0xff, 0x00, 0x00}

// NATChecksumDetour reports whether the bridge sends NATed packets through
// the segmentation port before they leave: it has one (userspace TSO, made
// for the detour or for an OVS tunnel port), and no tc program rewrites
// partial checksums where packets leave
// (PartialChecksumsRewritten, the default where the kernel loads it).
func (b Bridge) NATChecksumDetour() bool { return b.SegmentPort != 0 && !b.PartialChecksumsRewritten }

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

// saveHeaders returns the actions that save a TCP (proto 6) or UDP (17)
// packet's headers into the Saved* registers on a bridge with the NAT
// checksum detour; nil for other protocols or bridges. A flow using them
// must match the protocol (OVS checks a move's prerequisites).
func saveHeaders(b Bridge, proto uint8) []of.Action {
	if !b.NATChecksumDetour() || (proto != 6 && proto != 17) {
		return nil
	}
	var acts []of.Action
	for _, sf := range savedFields(proto) {
		acts = append(acts, regMove(sf.reg, sf.field, sf.ofs, true))
	}
	return append(acts, HeadersSaved.Load(1))
}

// natDetourFlows returns the flows of the NAT checksum detour: saving
// headers, sending NATed packets that leave the Node through the
// segmentation port, and taking them back.
//
// Saving reads the addresses and ports, and OVS un-wildcards every field
// an action reads, so a datapath flow (megaflow) that saves matches one
// connection's 5-tuple exactly and each new connection would take an
// upcall. So only packets that conntrack may NAT are saved: NATLookup
// looks the connection up without NAT (ct_state and ct_mark, the packet
// unchanged), and SaveHeaders saves for connections marked CtMarkNAT and
// for established ones marked neither way (committed by an earlier
// release). Connections marked CtMarkNoNAT skip the save and the Conntrack
// table's ct(nat), and a new connection is saved only if a Service's
// EndpointDNAT flow NATs it. Replies to the SNAT addresses are saved
// without the lookup: their connection is in ServiceSNATZone, and the
// Conntrack table's un-SNAT flows take only untracked packets.
func natDetourFlows(b Bridge) []of.Flow {
	if !b.NATChecksumDetour() {
		return nil
	}
	ck := Cookie(b.Round, CategoryPipeline, 0)
	var fs []of.Flow
	add := func(t Table, prio uint16, m of.Match, acts ...of.Action) {
		fs = append(fs, of.Flow{Table: uint8(t), Priority: prio, Cookie: ck, Match: m, Actions: acts})
	}
	leaving := []uint32{b.GatewayPort}
	if b.TunnelPort != 0 {
		leaving = append(leaving, b.TunnelPort)
	}
	if b.Tunnel == TunnelSegmented {
		leaving = append(leaving, b.SegmentPort)
	}
	snatIPs := []net.IP{ServiceHairpinIP, ServiceHostSNATIP}
	if b.GatewayIP != nil {
		snatIPs = append(snatIPs, b.GatewayIP)
	}
	lookupTable := uint8(SaveHeaders)
	marked := func(bit uint32) *of.Masked32 { return &of.Masked32{Value: bit, Mask: bit} }
	trk := func(set, clear uint32) *of.CtStateMatch { return &of.CtStateMatch{Set: set, Clear: clear} }
	for _, proto := range []uint8{6, 17} {
		l4 := func(m of.Match) of.Match {
			m.EthType, m.IPProto, m.Frag = EthTypeIPv4, proto, notFragment
			return m
		}
		save := append(saveHeaders(b, proto), goTo(Conntrack))
		// NATLookup.
		add(NATLookup, PrioHigh, l4(of.Match{}), of.CT{Zone: ConntrackZone, Table: &lookupTable})
		for _, ip := range snatIPs {
			add(NATLookup, PrioHigh+10, l4(of.Match{IPDst: host(ip)}), goTo(SaveHeaders))
		}
		// SaveHeaders.
		add(SaveHeaders, PrioHigh+30, l4(of.Match{CtState: trk(0, of.CtTrk)}), save...)
		add(SaveHeaders, PrioHigh+21, l4(of.Match{CtState: trk(of.CtTrk, 0), CtMark: marked(CtMarkNAT)}), save...)
		add(SaveHeaders, PrioHigh+20, l4(of.Match{CtState: trk(of.CtTrk, 0), CtMark: marked(CtMarkNoNAT)}), goTo(ConntrackState))
		add(SaveHeaders, PrioHigh+10, l4(of.Match{CtState: trk(of.CtTrk|of.CtNew, 0)}), goTo(Conntrack))
		add(SaveHeaders, PrioHigh, l4(of.Match{CtState: trk(of.CtTrk, 0)}), save...)

		restore := make([]of.Action, 0, len(save)+2)
		for _, sf := range savedFields(proto) {
			restore = append(restore, regMove(sf.reg, sf.field, sf.ofs, false))
		}
		restore = append(restore,
			of.SetEthDst{MAC: natDetourMAC},
			of.MoveRange{Src: of.FieldInPort, Dst: of.FieldEthDst, NBits: 16},
			of.Output{Port: b.SegmentPort})
		ready := of.RegMatch{Reg: OutputResolved.Reg(), Value: OutputResolved.Mask() | NATApplied.Mask() | HeadersSaved.Mask(),
			Mask: OutputResolved.Mask() | NATApplied.Mask() | HeadersSaved.Mask() | NATChecksumDone.Mask()}
		for _, port := range leaving {
			// A Traceflow packet is small and fully checksummed, and its
			// registers must survive: no detour.
			add(Output, PrioHigh+20, l4(of.Match{Regs: []of.RegMatch{ready, TargetOFPort.Match(port), TraceActive.Match(0)}}),
				restore...)
		}
	}
	// New connections that no Service NATs are committed with
	// CtMarkNoNAT (those the host started keep CtMarkFromGateway too).
	// Above the base flows' plain commits, below the Service flows that
	// commit NATed connections.
	notNATed := NATApplied.Match(0)
	add(ConntrackCommit, PrioHigh+2, of.Match{EthType: EthTypeIPv4, CtState: trk(of.CtTrk|of.CtNew, 0), Regs: []of.RegMatch{notNATed}},
		of.CT{Commit: true, Zone: ConntrackZone, SetMark: marked(CtMarkNoNAT)}, goTo(Output))
	add(ConntrackCommit, PrioHigh+3, of.Match{EthType: EthTypeIPv4, CtState: trk(of.CtTrk|of.CtNew, 0),
		Regs: Regs(notNATed, PktSource.Match(FromGateway))},
		of.CT{Commit: true, Zone: ConntrackZone, SetMark: marked(CtMarkNoNAT | CtMarkFromGateway)}, goTo(Output))
	// Connections NATed earlier: conntrack's ct(nat) in the Conntrack
	// table applied their NAT.
	// A DNATed one was sent to a Service endpoint: EndpointSelected, which
	// the host SNAT flows need to send a packet from the gateway back out
	// of it, is set again for the packet's second pass after the detour
	// (ServiceLB no longer sees the VIP), and for a retransmitted first
	// packet. It comes first, as a packet can be both.
	add(ConntrackState, PrioNormal+1, of.Match{EthType: EthTypeIPv4, CtState: trk(of.CtTrk|of.CtDNAT, 0)},
		NATApplied.Load(1), EndpointSelected.Load(1), goTo(ConntrackState.next()))
	// A DNATed connection without CtMarkNAT whose packet is still +new
	// (a retransmitted SYN, unanswered UDP) was committed by flows that
	// did not mark it: an earlier release's, or an old EndpointDNAT flow
	// while this Node's flows are being replaced. Its packet was not
	// saved, so it cannot take the detour (and leaves with the checksum
	// OVS got wrong); marking the connection now saves the next ones.
	// This is the plain commit's place (a ct action without a table
	// leaves the packet untracked for the tables after it), below the
	// Service flows that SNAT.
	add(ConntrackCommit, PrioHigh+4, of.Match{EthType: EthTypeIPv4, CtState: trk(of.CtTrk|of.CtNew|of.CtDNAT, 0),
		CtMark: &of.Masked32{Value: 0, Mask: CtMarkNAT}},
		of.CT{Commit: true, Zone: ConntrackZone, SetMark: &of.Masked32{Value: CtMarkNAT, Mask: CtMarkNAT | CtMarkNoNAT}},
		goTo(Output))
	add(ConntrackState, PrioNormal, of.Match{EthType: EthTypeIPv4, CtState: trk(of.CtTrk|of.CtSNAT, 0)},
		NATApplied.Load(1), goTo(ConntrackState.next()))
	fs = append(fs, of.Flow{Table: uint8(Classifier), Priority: PrioHigh + 10, Cookie: ck,
		Match: of.Match{InPort: b.SegmentPort, EthDst: natDetourMAC, EthDstMask: natDetourMask},
		Actions: []of.Action{
			of.MoveRange{Src: of.FieldEthDst, Dst: of.FieldInPort, NBits: 16},
			NATChecksumDone.Load(1),
			of.Resubmit{Table: uint8(Classifier)},
		}})
	return fs
}
