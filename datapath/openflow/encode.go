package openflow

import (
	"encoding/binary"
	"errors"
	"fmt"
	"math/bits"
	"net"

	of13 "github.com/contiv/libOpenflow/openflow13"
)

// OXM classes (OpenFlow 1.3 section 7.2.3.2; NXM_1 is the Nicira class OVS
// accepts in OXM matches and set_field, see ovs-fields(7)), from
// libOpenflow.
const (
	classNXM0  uint16 = of13.OXM_CLASS_NXM_0
	classNXM1  uint16 = of13.OXM_CLASS_NXM_1
	classBasic uint16 = of13.OXM_CLASS_OPENFLOW_BASIC
)

// fieldID names one OXM/NXM field and its width in bytes.
type fieldID struct {
	class uint16
	field uint8
	width uint8
}

// OXM_OF_* fields (OpenFlow 1.3 table 12) and NXM_* fields (ovs-fields(7)):
// the field numbers are libOpenflow's, the widths those of the field
// tables.
var (
	oxmInPort   = fieldID{classBasic, of13.OXM_FIELD_IN_PORT, 4}
	oxmEthDst   = fieldID{classBasic, of13.OXM_FIELD_ETH_DST, 6}
	oxmEthSrc   = fieldID{classBasic, of13.OXM_FIELD_ETH_SRC, 6}
	oxmEthType  = fieldID{classBasic, of13.OXM_FIELD_ETH_TYPE, 2}
	oxmIPProto  = fieldID{classBasic, of13.OXM_FIELD_IP_PROTO, 1}
	oxmIPv4Src  = fieldID{classBasic, of13.OXM_FIELD_IPV4_SRC, 4}
	oxmIPv4Dst  = fieldID{classBasic, of13.OXM_FIELD_IPV4_DST, 4}
	oxmTCPSrc   = fieldID{classBasic, of13.OXM_FIELD_TCP_SRC, 2}
	oxmTCPDst   = fieldID{classBasic, of13.OXM_FIELD_TCP_DST, 2}
	oxmUDPSrc   = fieldID{classBasic, of13.OXM_FIELD_UDP_SRC, 2}
	oxmUDPDst   = fieldID{classBasic, of13.OXM_FIELD_UDP_DST, 2}
	oxmSCTPSrc  = fieldID{classBasic, of13.OXM_FIELD_SCTP_SRC, 2}
	oxmSCTPDst  = fieldID{classBasic, of13.OXM_FIELD_SCTP_DST, 2}
	oxmARPOp    = fieldID{classBasic, of13.OXM_FIELD_ARP_OP, 2}
	oxmARPSPA   = fieldID{classBasic, of13.OXM_FIELD_ARP_SPA, 4}
	oxmARPTPA   = fieldID{classBasic, of13.OXM_FIELD_ARP_TPA, 4}
	oxmARPSHA   = fieldID{classBasic, of13.OXM_FIELD_ARP_SHA, 6}
	oxmARPTHA   = fieldID{classBasic, of13.OXM_FIELD_ARP_THA, 6}
	oxmIPv6Src  = fieldID{classBasic, of13.OXM_FIELD_IPV6_SRC, 16}
	oxmIPv6Dst  = fieldID{classBasic, of13.OXM_FIELD_IPV6_DST, 16}
	oxmTunnelID = fieldID{classBasic, of13.OXM_FIELD_TUNNEL_ID, 8}
	nxmTunID    = fieldID{classNXM1, of13.NXM_NX_TUN_ID, 8}
	nxmTunSrc   = fieldID{classNXM1, of13.NXM_NX_TUN_IPV4_SRC, 4}
	nxmTunDst   = fieldID{classNXM1, of13.NXM_NX_TUN_IPV4_DST, 4}
	nxmPktMark  = fieldID{classNXM1, of13.NXM_NX_PKT_MARK, 4}
	nxmConjID   = fieldID{classNXM1, of13.NXM_NX_CONJ_ID, 4}
	nxmCtState  = fieldID{classNXM1, of13.NXM_NX_CT_STATE, 4}
	nxmCtZone   = fieldID{classNXM1, of13.NXM_NX_CT_ZONE, 2}
	nxmCtMark   = fieldID{classNXM1, of13.NXM_NX_CT_MARK, 4}
	nxmIPFrag   = fieldID{classNXM1, of13.NXM_NX_IP_FRAG, 1}
	nxmOfEthDst = fieldID{classNXM0, of13.NXM_OF_ETH_DST, 6}
	nxmOfEthSrc = fieldID{classNXM0, of13.NXM_OF_ETH_SRC, 6}
	nxmOfIPSrc  = fieldID{classNXM0, of13.NXM_OF_IP_SRC, 4}
	nxmOfIPDst  = fieldID{classNXM0, of13.NXM_OF_IP_DST, 4}
	nxmOfARPSPA = fieldID{classNXM0, of13.NXM_OF_ARP_SPA, 4}
	nxmOfARPTPA = fieldID{classNXM0, of13.NXM_OF_ARP_TPA, 4}
	nxmNxARPSHA = fieldID{classNXM1, of13.NXM_NX_ARP_SHA, 6}
	nxmNxARPTHA = fieldID{classNXM1, of13.NXM_NX_ARP_THA, 6}
	nxmOfInPort = fieldID{classNXM0, of13.NXM_OF_IN_PORT, 2}
	nxmOfTCPSrc = fieldID{classNXM0, of13.NXM_OF_TCP_SRC, 2}
	nxmOfTCPDst = fieldID{classNXM0, of13.NXM_OF_TCP_DST, 2}
	nxmOfUDPSrc = fieldID{classNXM0, of13.NXM_OF_UDP_SRC, 2}
	nxmOfUDPDst = fieldID{classNXM0, of13.NXM_OF_UDP_DST, 2}
	nxmNxIPTTL  = fieldID{classNXM1, of13.NXM_NX_IP_TTL, 1}
)

// nxmReg is NXM_NX_REGn (n in 0..15).
func nxmReg(n uint8) fieldID { return fieldID{classNXM1, of13.NXM_NX_REG0 + n, 4} }

// header returns the field's TLV header without a mask, the form used by
// Nicira actions (load, move, output:reg).
func (f fieldID) header() *of13.MatchField {
	return &of13.MatchField{Class: f.class, Field: f.field, Length: f.width}
}

// rawValue is a field value or mask already in network byte order.
type rawValue struct{ b []byte }

func (r *rawValue) Len() uint16                    { return uint16(len(r.b)) }
func (r *rawValue) MarshalBinary() ([]byte, error) { return r.b, nil }
func (r *rawValue) UnmarshalBinary(b []byte) error { r.b = append(r.b[:0], b...); return nil }

// tlv builds one match/set_field TLV; a nil mask means exact.
func (f fieldID) tlv(value, mask []byte) of13.MatchField {
	m := of13.MatchField{Class: f.class, Field: f.field, Length: f.width, Value: &rawValue{value}}
	if mask != nil {
		m.HasMask = true
		m.Length = 2 * f.width
		masked := make([]byte, len(value))
		for i := range value {
			masked[i] = value[i] & mask[i]
		}
		m.Value = &rawValue{masked}
		m.Mask = &rawValue{mask}
	}
	return m
}

func be16(v uint16) []byte { return binary.BigEndian.AppendUint16(nil, v) }
func be32(v uint32) []byte { return binary.BigEndian.AppendUint32(nil, v) }
func be64(v uint64) []byte { return binary.BigEndian.AppendUint64(nil, v) }

func mac(hw net.HardwareAddr, what string) ([]byte, error) {
	if len(hw) != 6 {
		return nil, fmt.Errorf("%s: want a 6-byte MAC address, got %q", what, hw.String())
	}
	return []byte(hw), nil
}

func ipv4(ip net.IP, what string) ([]byte, error) {
	v4 := ip.To4()
	if v4 == nil {
		return nil, fmt.Errorf("%s: want an IPv4 address, got %v", what, ip)
	}
	return []byte(v4), nil
}

// mask32 returns nil for "exact" masks (0 or all ones).
func mask32(m uint32) []byte {
	if m == 0 || m == 0xffffffff {
		return nil
	}
	return be32(m)
}

// encodeMatch builds the OXM match for m, prerequisites first (ovs-fields(7),
// "Field Prerequisites": eth_type before IP/ARP fields, ip_proto before
// transport ports).
func encodeMatch(m *Match) (*of13.Match, error) {
	om := of13.NewMatch()
	add := func(f of13.MatchField) { om.AddField(f) }
	if m.InPort != 0 {
		add(oxmInPort.tlv(be32(m.InPort), nil))
	}
	if m.EthDst != nil {
		b, err := mac(m.EthDst, "eth_dst")
		if err != nil {
			return nil, err
		}
		var mask []byte
		if m.EthDstMask != nil {
			if mask, err = mac(m.EthDstMask, "eth_dst mask"); err != nil {
				return nil, err
			}
		}
		add(oxmEthDst.tlv(b, mask))
	}
	if m.EthSrc != nil {
		b, err := mac(m.EthSrc, "eth_src")
		if err != nil {
			return nil, err
		}
		var mask []byte
		if m.EthSrcMask != nil {
			if mask, err = mac(m.EthSrcMask, "eth_src mask"); err != nil {
				return nil, err
			}
		}
		add(oxmEthSrc.tlv(b, mask))
	}
	if m.EthType != 0 {
		add(oxmEthType.tlv(be16(m.EthType), nil))
	}
	if m.ARPOp != 0 {
		add(oxmARPOp.tlv(be16(m.ARPOp), nil))
	}
	if m.ARPSPA != nil {
		b, err := ipv4(m.ARPSPA, "arp_spa")
		if err != nil {
			return nil, err
		}
		add(oxmARPSPA.tlv(b, nil))
	}
	if m.ARPTPA != nil {
		b, err := ipv4(m.ARPTPA, "arp_tpa")
		if err != nil {
			return nil, err
		}
		add(oxmARPTPA.tlv(b, nil))
	}
	if m.ARPSHA != nil {
		b, err := mac(m.ARPSHA, "arp_sha")
		if err != nil {
			return nil, err
		}
		add(oxmARPSHA.tlv(b, nil))
	}
	for _, p := range []struct {
		net    *net.IPNet
		v4, v6 fieldID
		name   string
	}{{m.IPSrc, oxmIPv4Src, oxmIPv6Src, "nw_src"}, {m.IPDst, oxmIPv4Dst, oxmIPv6Dst, "nw_dst"}} {
		if p.net == nil {
			continue
		}
		f, err := prefixTLV(p.net, p.v4, p.v6, p.name)
		if err != nil {
			return nil, err
		}
		if f != nil {
			add(*f)
		}
	}
	if m.IPProto != 0 {
		add(oxmIPProto.tlv([]byte{m.IPProto}, nil))
	}
	if m.L4Src != nil || m.L4Dst != nil {
		var src, dst fieldID
		switch m.IPProto {
		case 6:
			src, dst = oxmTCPSrc, oxmTCPDst
		case 17:
			src, dst = oxmUDPSrc, oxmUDPDst
		case 132:
			src, dst = oxmSCTPSrc, oxmSCTPDst
		default:
			return nil, fmt.Errorf("transport port match needs IPProto 6, 17 or 132, got %d", m.IPProto)
		}
		for _, p := range []struct {
			pm *PortMatch
			f  fieldID
		}{{m.L4Src, src}, {m.L4Dst, dst}} {
			if p.pm == nil {
				continue
			}
			var mask []byte
			if p.pm.Mask != 0 && p.pm.Mask != 0xffff {
				mask = be16(p.pm.Mask)
			}
			add(p.f.tlv(be16(p.pm.Port), mask))
		}
	}
	if m.Frag != nil {
		if m.EthType == 0 {
			return nil, errors.New("nw_frag match needs EthType (IPv4 or IPv6)")
		}
		if m.Frag.Mask == 0 || m.Frag.Mask&^(FragAny|FragLater) != 0 {
			return nil, fmt.Errorf("nw_frag mask %#x: want a non-zero subset of %#x", m.Frag.Mask, FragAny|FragLater)
		}
		var mask []byte
		if m.Frag.Mask != FragAny|FragLater {
			mask = []byte{m.Frag.Mask}
		}
		add(nxmIPFrag.tlv([]byte{m.Frag.Value & m.Frag.Mask}, mask))
	}
	if m.TunDst != nil {
		b, err := ipv4(m.TunDst, "tun_dst")
		if err != nil {
			return nil, err
		}
		add(nxmTunDst.tlv(b, nil))
	}
	if m.TunSrc != nil {
		b, err := ipv4(m.TunSrc, "tun_src")
		if err != nil {
			return nil, err
		}
		add(nxmTunSrc.tlv(b, nil))
	}
	if m.TunID != nil {
		var mask []byte
		if m.TunID.Mask != 0 && m.TunID.Mask != ^uint64(0) {
			mask = be64(m.TunID.Mask)
		}
		add(nxmTunID.tlv(be64(m.TunID.Value), mask))
	}
	seen := map[uint8]bool{}
	for _, r := range m.Regs {
		if r.Reg > 15 {
			return nil, fmt.Errorf("register reg%d does not exist (reg0..reg15)", r.Reg)
		}
		if seen[r.Reg] {
			return nil, fmt.Errorf("register reg%d matched twice", r.Reg)
		}
		seen[r.Reg] = true
		add(nxmReg(r.Reg).tlv(be32(r.Value), mask32(r.Mask)))
	}
	if m.CtState != nil && (m.CtState.Set|m.CtState.Clear) != 0 {
		if m.CtState.Set&m.CtState.Clear != 0 {
			return nil, fmt.Errorf("ct_state bits %#x both set and cleared", m.CtState.Set&m.CtState.Clear)
		}
		add(nxmCtState.tlv(be32(m.CtState.Set), be32(m.CtState.Set|m.CtState.Clear)))
	}
	if m.CtZone != nil {
		add(nxmCtZone.tlv(be16(*m.CtZone), nil))
	}
	if m.CtMark != nil {
		add(nxmCtMark.tlv(be32(m.CtMark.Value), mask32(m.CtMark.Mask)))
	}
	if m.ConjID != nil {
		add(nxmConjID.tlv(be32(*m.ConjID), nil))
	}
	if m.PktMark != nil {
		add(nxmPktMark.tlv(be32(m.PktMark.Value), mask32(m.PktMark.Mask)))
	}
	return om, nil
}

// prefixTLV encodes an address prefix; a /0 prefix matches everything and
// yields no field.
func prefixTLV(n *net.IPNet, v4, v6 fieldID, name string) (*of13.MatchField, error) {
	ones, size := n.Mask.Size()
	if size == 0 {
		return nil, fmt.Errorf("%s %v: non-contiguous mask", name, n)
	}
	if ones == 0 {
		return nil, nil
	}
	var f fieldID
	var ip []byte
	if ip4 := n.IP.To4(); ip4 != nil && size == 32 {
		f, ip = v4, ip4
	} else if ip16 := n.IP.To16(); ip16 != nil && size == 128 {
		f, ip = v6, ip16
	} else {
		return nil, fmt.Errorf("%s %v: address and mask families differ", name, n)
	}
	var mask []byte
	if ones != size {
		mask = []byte(n.Mask)
	}
	t := f.tlv(ip, mask)
	return &t, nil
}

// encodeInstructions turns a flow's action list into OpenFlow 1.3
// instructions in the order the switch runs them (OpenFlow 1.3 section
// 5.9): meter, then one apply-actions with everything but Meter and
// GotoTable, then goto-table.
func encodeInstructions(f *Flow) ([]of13.Instruction, error) {
	var instrs []of13.Instruction
	var gotoTable *GotoTable
	var acts []of13.Action
	for i, a := range f.Actions {
		if m, ok := a.(Meter); ok {
			if i != 0 {
				return nil, errors.New("meter must be the first action")
			}
			if m.ID == 0 || m.ID > of13.OFPM13_MAX {
				return nil, fmt.Errorf("meter:%d: no such meter id", m.ID)
			}
			instrs = append(instrs, of13.NewInstrMeter(m.ID))
			continue
		}
		if g, ok := a.(GotoTable); ok {
			if i != len(f.Actions)-1 {
				return nil, errors.New("goto_table must be the last action")
			}
			if g.Table <= f.Table {
				return nil, fmt.Errorf("goto_table:%d does not go forward from table %d", g.Table, f.Table)
			}
			gotoTable = &g
			continue
		}
		oa, err := encodeAction(a)
		if err != nil {
			return nil, err
		}
		acts = append(acts, oa)
	}
	if len(acts) > 0 {
		apply := of13.NewInstrApplyActions()
		for _, a := range acts {
			if err := apply.AddAction(a, false); err != nil {
				return nil, err
			}
		}
		instrs = append(instrs, apply)
	}
	if gotoTable != nil {
		instrs = append(instrs, of13.NewInstrGotoTable(gotoTable.Table))
	}
	return instrs, nil
}

// encodeActionList encodes actions for a group bucket (no GotoTable).
func encodeActionList(actions []Action) ([]of13.Action, error) {
	out := make([]of13.Action, 0, len(actions))
	for _, a := range actions {
		switch a.(type) {
		case GotoTable:
			return nil, errors.New("goto_table is an instruction and cannot appear in a group bucket")
		case Meter:
			return nil, errors.New("meter is an instruction and cannot appear in a group bucket")
		}
		oa, err := encodeAction(a)
		if err != nil {
			return nil, err
		}
		out = append(out, oa)
	}
	return out, nil
}

// ofsNbits packs a bit range the Nicira way: ofs << 6 | (n_bits - 1).
func ofsNbits(ofs, nbits uint8) uint16 { return uint16(ofs)<<6 | uint16(nbits-1) }

func checkRange(ofs, nbits uint8, what string) (uint8, error) {
	if nbits == 0 {
		nbits = 32
	}
	if int(ofs)+int(nbits) > 32 {
		return 0, fmt.Errorf("%s: bits [%d,%d) exceed the 32-bit register", what, ofs, int(ofs)+int(nbits))
	}
	return nbits, nil
}

func setField(f fieldID, value []byte) of13.Action {
	return of13.NewActionSetField(f.tlv(value, nil))
}

// moveField maps Move's field names to NXM headers and widths.
func moveField(f Field) (fieldID, bool) {
	switch f {
	case FieldEthSrc:
		return nxmOfEthSrc, true
	case FieldEthDst:
		return nxmOfEthDst, true
	case FieldARPSHA:
		return nxmNxARPSHA, true
	case FieldARPTHA:
		return nxmNxARPTHA, true
	case FieldARPSPA:
		return nxmOfARPSPA, true
	case FieldARPTPA:
		return nxmOfARPTPA, true
	case FieldIPSrc:
		return nxmOfIPSrc, true
	case FieldIPDst:
		return nxmOfIPDst, true
	case FieldInPort:
		return nxmOfInPort, true
	case FieldIPTTL:
		return nxmNxIPTTL, true
	case FieldTCPSrc:
		return nxmOfTCPSrc, true
	case FieldTCPDst:
		return nxmOfTCPDst, true
	case FieldUDPSrc:
		return nxmOfUDPSrc, true
	case FieldUDPDst:
		return nxmOfUDPDst, true
	case FieldTunID:
		return nxmTunID, true
	}
	var n uint8
	if _, err := fmt.Sscanf(string(f), "reg%d", &n); err == nil && n <= 15 && f == FieldReg(n) {
		return nxmReg(n), true
	}
	return fieldID{}, false
}

func encodeAction(a Action) (of13.Action, error) {
	switch a := a.(type) {
	case Output:
		if a.Port == 0 {
			return nil, errors.New("output to port 0 (no such port)")
		}
		o := of13.NewActionOutput(a.Port)
		o.MaxLen = of13.OFPCML_NO_BUFFER
		return o, nil
	case OutputReg:
		if a.Reg > 15 {
			return nil, fmt.Errorf("output:reg%d: no such register", a.Reg)
		}
		n, err := checkRange(a.Ofs, a.NBits, "output:reg")
		if err != nil {
			return nil, err
		}
		return of13.NewOutputFromField(nxmReg(a.Reg).header(), ofsNbits(a.Ofs, n)), nil
	case Resubmit:
		return of13.NewNXActionResubmitTableAction(of13.OFPP_IN_PORT, a.Table), nil
	case SetEthSrc:
		b, err := mac(a.MAC, "set eth_src")
		if err != nil {
			return nil, err
		}
		return setField(oxmEthSrc, b), nil
	case SetEthDst:
		b, err := mac(a.MAC, "set eth_dst")
		if err != nil {
			return nil, err
		}
		return setField(oxmEthDst, b), nil
	case SetTunDst:
		b, err := ipv4(a.IP, "set tun_dst")
		if err != nil {
			return nil, err
		}
		return setField(nxmTunDst, b), nil
	case SetIPSrc:
		b, err := ipv4(a.IP, "set ip_src")
		if err != nil {
			return nil, err
		}
		return setField(oxmIPv4Src, b), nil
	case SetIPDst:
		b, err := ipv4(a.IP, "set ip_dst")
		if err != nil {
			return nil, err
		}
		return setField(oxmIPv4Dst, b), nil
	case SetARPOp:
		return setField(oxmARPOp, be16(a.Op)), nil
	case SetARPSHA:
		b, err := mac(a.MAC, "set arp_sha")
		if err != nil {
			return nil, err
		}
		return setField(oxmARPSHA, b), nil
	case SetARPSPA:
		b, err := ipv4(a.IP, "set arp_spa")
		if err != nil {
			return nil, err
		}
		return setField(oxmARPSPA, b), nil
	case LoadReg:
		if a.Reg > 15 {
			return nil, fmt.Errorf("load to reg%d: no such register", a.Reg)
		}
		n, err := checkRange(a.Ofs, a.NBits, "load")
		if err != nil {
			return nil, err
		}
		if n < 32 && a.Value>>n != 0 {
			return nil, fmt.Errorf("load:%#x does not fit in %d bits", a.Value, n)
		}
		return of13.NewNXActionRegLoad(ofsNbits(a.Ofs, n), nxmReg(a.Reg).header(), uint64(a.Value)), nil
	case Move:
		src, ok := moveField(a.Src)
		if !ok {
			return nil, fmt.Errorf("move: unsupported source field %q", a.Src)
		}
		dst, ok := moveField(a.Dst)
		if !ok {
			return nil, fmt.Errorf("move: unsupported destination field %q", a.Dst)
		}
		if src.width != dst.width {
			return nil, fmt.Errorf("move %s->%s: widths differ (%d vs %d bytes)", a.Src, a.Dst, src.width, dst.width)
		}
		return of13.NewNXActionRegMove(uint16(src.width)*8, 0, 0, src.header(), dst.header()), nil
	case MoveRange:
		src, ok := moveField(a.Src)
		if !ok {
			return nil, fmt.Errorf("move: unsupported source field %q", a.Src)
		}
		dst, ok := moveField(a.Dst)
		if !ok {
			return nil, fmt.Errorf("move: unsupported destination field %q", a.Dst)
		}
		if a.NBits == 0 || int(a.SrcOfs)+int(a.NBits) > int(src.width)*8 || int(a.DstOfs)+int(a.NBits) > int(dst.width)*8 {
			return nil, fmt.Errorf("move %s[%d..]->%s[%d..]: %d bits do not fit", a.Src, a.SrcOfs, a.Dst, a.DstOfs, a.NBits)
		}
		return of13.NewNXActionRegMove(a.NBits, a.SrcOfs, a.DstOfs, src.header(), dst.header()), nil
	case SetTunID:
		return setField(nxmTunID, be64(a.ID)), nil
	case CT:
		return encodeCT(a)
	case Conjunction:
		if a.NClauses < 2 || a.NClauses > 64 || a.Clause < 1 || a.Clause > a.NClauses {
			return nil, fmt.Errorf("conjunction(%d,%d/%d): want 1 <= clause <= n_clauses, 2 <= n_clauses <= 64", a.ID, a.Clause, a.NClauses)
		}
		// The wire form counts clauses from zero (ovs-actions(7) "conjunction").
		return of13.NewNXActionConjunction(a.Clause-1, a.NClauses, a.ID), nil
	case DecTTL:
		// OVS accepts the Nicira dec_ttl only in OpenFlow 1.0; 1.3 has its own.
		return of13.NewActionDecNwTtl(), nil
	case Group:
		return of13.NewActionGroup(a.ID), nil
	case Learn:
		return encodeLearn(a)
	case nil:
		return nil, errors.New("nil action")
	}
	return nil, fmt.Errorf("unsupported action type %T", a)
}

// encodeCT builds ct(...) with the nested nat and exec(load->ct_mark)
// actions (ovs-actions(7) "The ct action").
func encodeCT(a CT) (of13.Action, error) {
	ct := of13.NewNXActionConnTrack().ZoneImm(a.Zone)
	if a.Commit {
		ct.Commit()
	}
	if a.Table != nil {
		if *a.Table == of13.NX_CT_RECIRC_NONE {
			return nil, errors.New("ct: table 255 is reserved")
		}
		ct.Table(*a.Table)
	}
	if a.NAT != nil {
		nat, err := encodeNAT(a.NAT)
		if err != nil {
			return nil, err
		}
		ct.AddAction(nat)
	}
	if a.SetMark != nil {
		if !a.Commit {
			return nil, errors.New("ct: setting ct_mark requires commit")
		}
		mask := a.SetMark.Mask
		if mask == 0 {
			mask = 0xffffffff
		}
		// A load writes one contiguous bit range, so a sparse mask takes
		// one load per run of ones.
		for _, r := range bitRuns(mask) {
			value := (a.SetMark.Value >> r.ofs) & (1<<r.nbits - 1)
			ct.AddAction(of13.NewNXActionRegLoad(ofsNbits(r.ofs, r.nbits), nxmCtMark.header(), uint64(value)))
		}
	}
	return ct, nil
}

// bitRun is a run of consecutive ones in a mask: nbits bits from bit ofs.
type bitRun struct{ ofs, nbits uint8 }

// bitRuns splits a non-zero mask into its runs of ones, lowest first.
func bitRuns(mask uint32) []bitRun {
	var runs []bitRun
	for mask != 0 {
		ofs := uint8(bits.TrailingZeros32(mask))
		n := uint8(bits.TrailingZeros32(^(mask >> ofs)))
		runs = append(runs, bitRun{ofs, n})
		mask &^= uint32(uint64(1)<<n-1) << ofs
	}
	return runs
}

func encodeNAT(n *CTNAT) (of13.Action, error) {
	nat := of13.NewNXActionCTNAT()
	switch {
	case n.SNAT && n.DNAT:
		return nil, errors.New("nat: SNAT and DNAT are exclusive")
	case n.SNAT:
		_ = nat.SetSNAT()
	case n.DNAT:
		_ = nat.SetDNAT()
	default:
		if n.IPMin != nil || n.IPMax != nil || n.PortMin != 0 || n.PortMax != 0 {
			return nil, errors.New("nat: an address or port range needs SNAT or DNAT")
		}
		return nat, nil
	}
	if n.IPMin == nil && n.IPMax != nil {
		return nil, errors.New("nat: IPMax without IPMin")
	}
	if n.IPMin != nil {
		v4 := n.IPMin.To4() != nil
		if n.IPMax != nil && (n.IPMax.To4() != nil) != v4 {
			return nil, errors.New("nat: IPMin and IPMax families differ")
		}
		if v4 {
			nat.SetRangeIPv4Min(n.IPMin.To4())
			if n.IPMax != nil {
				nat.SetRangeIPv4Max(n.IPMax.To4())
			}
		} else {
			nat.SetRangeIPv6Min(n.IPMin.To16())
			if n.IPMax != nil {
				nat.SetRangeIPv6Max(n.IPMax.To16())
			}
		}
	}
	if n.PortMin == 0 && n.PortMax != 0 {
		return nil, errors.New("nat: PortMax without PortMin")
	}
	if n.PortMin != 0 {
		pmin, pmax := n.PortMin, n.PortMax
		if pmax == 0 {
			pmax = pmin
		}
		if pmax < pmin {
			return nil, fmt.Errorf("nat: port range %d-%d is empty", pmin, pmax)
		}
		nat.SetRangeProtoMin(&pmin)
		nat.SetRangeProtoMax(&pmax)
	}
	return nat, nil
}

// encodeFlowMod builds the OFPT_FLOW_MOD for one change. Adds carry the
// cookie; strict deletes match table, priority and match regardless of
// cookie.
func encodeFlowMod(fm *FlowMod) (*of13.FlowMod, error) {
	f := &fm.Flow
	if f.Table == 0xff {
		return nil, errors.New("table 255 is reserved (OFPTT_ALL)")
	}
	match, err := encodeMatch(&f.Match)
	if err != nil {
		return nil, err
	}
	m := of13.NewFlowMod()
	m.TableId = f.Table
	m.Priority = f.Priority
	m.Match = *match
	switch fm.Op {
	case OpAdd:
		m.Command = of13.FC_ADD
		m.Cookie = f.Cookie
		instrs, err := encodeInstructions(f)
		if err != nil {
			return nil, err
		}
		m.Instructions = instrs
	case OpDelete:
		m.Command = of13.FC_DELETE_STRICT
	default:
		return nil, fmt.Errorf("unknown flow mod op %d", fm.Op)
	}
	if n := flowModLen(m); n+bundleAddOverhead > maxMessageLen {
		return nil, fmt.Errorf("flow of %d bytes (%d actions) does not fit one OpenFlow message (%d bytes, the bundle's %d included)",
			n, len(f.Actions), maxMessageLen, bundleAddOverhead)
	}
	return m, nil
}

// bundleAddOverhead is what a bundle add message puts around the message
// it carries (OpenFlow 1.4 section 7.3.9.6, the ONF extension in 1.3):
// its header, bundle_id, pad and flags.
const bundleAddOverhead = 16

// flowModLen is m's encoded length counted in int: libOpenflow sums the
// lengths as uint16, which wraps past 64 KiB and silently truncates the
// message (a flow would lose actions).
func flowModLen(m *of13.FlowMod) int {
	n := int(m.Header.Len()) + 40 + int(m.Match.Len())
	if m.Command == of13.FC_DELETE || m.Command == of13.FC_DELETE_STRICT {
		return n
	}
	for _, in := range m.Instructions {
		a, ok := in.(*of13.InstrActions)
		if !ok {
			n += int(in.Len())
			continue
		}
		n += 8
		for _, act := range a.Actions {
			n += int(act.Len())
		}
	}
	return n
}
