package openflow

import (
	"encoding/binary"
	"fmt"
	"net"

	of13 "github.com/contiv/libOpenflow/openflow13"
)

// decodeFlowStats parses the entries of one OFPMP_FLOW multipart reply
// body (OpenFlow 1.3 section 7.3.5.2).
func decodeFlowStats(b []byte) ([]FlowStats, error) {
	var out []FlowStats
	for len(b) > 0 {
		if len(b) < 56 {
			return nil, fmt.Errorf("truncated flow stats entry (%d bytes)", len(b))
		}
		l := int(binary.BigEndian.Uint16(b[0:2]))
		if l < 56 || l > len(b) {
			return nil, fmt.Errorf("bad flow stats entry length %d", l)
		}
		e := b[:l]
		b = b[l:]
		var fs FlowStats
		fs.Table = e[2]
		fs.Priority = binary.BigEndian.Uint16(e[12:14])
		fs.Cookie = binary.BigEndian.Uint64(e[24:32])
		fs.Packets = binary.BigEndian.Uint64(e[32:40])
		fs.Bytes = binary.BigEndian.Uint64(e[40:48])
		match := e[48:]
		ml := int(binary.BigEndian.Uint16(match[2:4]))
		if binary.BigEndian.Uint16(match[0:2]) != of13.MatchType_OXM || ml < 4 || ml > len(match) {
			return nil, fmt.Errorf("bad match in flow stats entry (type %d, length %d)", binary.BigEndian.Uint16(match[0:2]), ml)
		}
		if err := decodeMatch(match[4:ml], &fs.Match); err != nil {
			return nil, fmt.Errorf("flow table=%d priority=%d: %w", fs.Table, fs.Priority, err)
		}
		out = append(out, fs)
	}
	return out, nil
}

// decodeMatch fills m from a list of OXM TLVs. Fields this package does
// not encode are skipped.
func decodeMatch(b []byte, m *Match) error {
	for len(b) > 0 {
		if len(b) < 4 {
			return fmt.Errorf("truncated OXM header")
		}
		class := binary.BigEndian.Uint16(b[0:2])
		field := b[2] >> 1
		hasMask := b[2]&1 != 0
		l := int(b[3])
		if 4+l > len(b) {
			return fmt.Errorf("truncated OXM field class %#x field %d", class, field)
		}
		payload := b[4 : 4+l]
		b = b[4+l:]
		if class == 0xffff {
			continue // experimenter fields: none of ours
		}
		value, mask := payload, []byte(nil)
		if hasMask {
			value, mask = payload[:l/2], payload[l/2:]
		}
		decodeField(fieldID{class: class, field: field, width: uint8(len(value))}, value, mask, m)
	}
	return nil
}

func u16(b []byte) uint16 { return binary.BigEndian.Uint16(b) }
func u32(b []byte) uint32 { return binary.BigEndian.Uint32(b) }

func cloneBytes(b []byte) []byte { return append([]byte(nil), b...) }

func decodeField(f fieldID, v, mask []byte, m *Match) {
	mask32v := func() uint32 {
		if mask == nil {
			return 0
		}
		return u32(mask)
	}
	ipnet := func() *net.IPNet {
		ip := net.IP(cloneBytes(v))
		msk := net.CIDRMask(len(v)*8, len(v)*8)
		if mask != nil {
			msk = net.IPMask(cloneBytes(mask))
		}
		return &net.IPNet{IP: ip, Mask: msk}
	}
	port := func() *PortMatch {
		p := &PortMatch{Port: u16(v)}
		if mask != nil {
			p.Mask = u16(mask)
		}
		return p
	}
	key := fieldID{class: f.class, field: f.field}
	width := f.width
	switch {
	case key == fieldID{class: classBasic, field: oxmInPort.field} && width == 4:
		m.InPort = u32(v)
	case key == fieldID{class: classBasic, field: oxmEthDst.field} && width == 6:
		m.EthDst = net.HardwareAddr(cloneBytes(v))
		if mask != nil {
			m.EthDstMask = net.HardwareAddr(cloneBytes(mask))
		}
	case key == fieldID{class: classBasic, field: oxmEthSrc.field} && width == 6:
		m.EthSrc = net.HardwareAddr(cloneBytes(v))
		if mask != nil {
			m.EthSrcMask = net.HardwareAddr(cloneBytes(mask))
		}
	case key == fieldID{class: classBasic, field: oxmEthType.field} && width == 2:
		m.EthType = u16(v)
	case key == fieldID{class: classBasic, field: oxmARPOp.field} && width == 2:
		m.ARPOp = u16(v)
	case key == fieldID{class: classBasic, field: oxmARPSPA.field} && width == 4:
		m.ARPSPA = net.IP(cloneBytes(v))
	case key == fieldID{class: classBasic, field: oxmARPTPA.field} && width == 4:
		m.ARPTPA = net.IP(cloneBytes(v))
	case key == fieldID{class: classBasic, field: oxmARPSHA.field} && width == 6:
		m.ARPSHA = net.HardwareAddr(cloneBytes(v))
	case (key == fieldID{class: classBasic, field: oxmIPv4Src.field} && width == 4) ||
		(key == fieldID{class: classBasic, field: oxmIPv6Src.field} && width == 16):
		m.IPSrc = ipnet()
	case (key == fieldID{class: classBasic, field: oxmIPv4Dst.field} && width == 4) ||
		(key == fieldID{class: classBasic, field: oxmIPv6Dst.field} && width == 16):
		m.IPDst = ipnet()
	case key == fieldID{class: classBasic, field: oxmIPProto.field} && width == 1:
		m.IPProto = v[0]
	case (key == fieldID{class: classBasic, field: oxmTCPSrc.field} ||
		key == fieldID{class: classBasic, field: oxmUDPSrc.field} ||
		key == fieldID{class: classBasic, field: oxmSCTPSrc.field}) && width == 2:
		m.L4Src = port()
	case (key == fieldID{class: classBasic, field: oxmTCPDst.field} ||
		key == fieldID{class: classBasic, field: oxmUDPDst.field} ||
		key == fieldID{class: classBasic, field: oxmSCTPDst.field}) && width == 2:
		m.L4Dst = port()
	case key == fieldID{class: classNXM1, field: nxmTunDst.field} && width == 4:
		m.TunDst = net.IP(cloneBytes(v))
	case key == fieldID{class: classNXM1, field: nxmTunSrc.field} && width == 4:
		m.TunSrc = net.IP(cloneBytes(v))
	case (key == fieldID{class: classNXM1, field: nxmTunID.field} || key == fieldID{class: classBasic, field: oxmTunnelID.field}) && width == 8:
		t := &Masked64{Value: binary.BigEndian.Uint64(v)}
		if mask != nil {
			t.Mask = binary.BigEndian.Uint64(mask)
		}
		m.TunID = t
	case f.class == classNXM1 && f.field <= 15 && width == 4:
		m.Regs = append(m.Regs, RegMatch{Reg: f.field, Value: u32(v), Mask: mask32v()})
	case key == fieldID{class: classNXM1, field: nxmCtState.field} && width == 4:
		set := u32(v)
		care := ^uint32(0)
		if mask != nil {
			care = u32(mask)
		}
		m.CtState = &CtStateMatch{Set: set & care, Clear: care &^ set & 0xff}
	case key == fieldID{class: classNXM1, field: nxmCtZone.field} && width == 2:
		z := u16(v)
		m.CtZone = &z
	case key == fieldID{class: classNXM1, field: nxmCtMark.field} && width == 4:
		m.CtMark = &Masked32{Value: u32(v), Mask: mask32v()}
	case key == fieldID{class: classNXM1, field: nxmIPFrag.field} && width == 1:
		fm := &FragMatch{Value: v[0], Mask: FragAny | FragLater}
		if mask != nil {
			fm.Mask = mask[0]
		}
		m.Frag = fm
	case key == fieldID{class: classNXM1, field: nxmConjID.field} && width == 4:
		id := u32(v)
		m.ConjID = &id
	case key == fieldID{class: classNXM1, field: nxmPktMark.field} && width == 4:
		m.PktMark = &Masked32{Value: u32(v), Mask: mask32v()}
	}
}
