package openflow

import (
	"fmt"
	"strings"
)

// String renders the match in ovs-ofctl(8) flow syntax, e.g.
// "in_port=1,ip,nw_src=10.0.0.0/24,reg0=0x3/0xf". It is meant for logs and
// error messages; an empty match renders as "any".
func (m Match) String() string {
	var p []string
	add := func(format string, args ...any) { p = append(p, fmt.Sprintf(format, args...)) }
	if m.InPort != 0 {
		add("in_port=%s", portName(m.InPort))
	}
	if m.EthSrc != nil {
		add("dl_src=%s", m.EthSrc)
	}
	if m.EthDst != nil {
		add("dl_dst=%s", m.EthDst)
	}
	switch m.EthType {
	case 0:
	case 0x0800:
		add("ip")
	case 0x0806:
		add("arp")
	case 0x86dd:
		add("ipv6")
	default:
		add("dl_type=0x%04x", m.EthType)
	}
	if m.ARPOp != 0 {
		add("arp_op=%d", m.ARPOp)
	}
	if m.ARPSPA != nil {
		add("arp_spa=%s", m.ARPSPA)
	}
	if m.ARPTPA != nil {
		add("arp_tpa=%s", m.ARPTPA)
	}
	if m.ARPSHA != nil {
		add("arp_sha=%s", m.ARPSHA)
	}
	if m.IPSrc != nil {
		add("nw_src=%s", m.IPSrc)
	}
	if m.IPDst != nil {
		add("nw_dst=%s", m.IPDst)
	}
	if m.IPProto != 0 {
		add("nw_proto=%d", m.IPProto)
	}
	l4 := "tp"
	switch m.IPProto {
	case 6:
		l4 = "tcp"
	case 17:
		l4 = "udp"
	case 132:
		l4 = "sctp"
	}
	if m.L4Src != nil {
		add("%s_src=%s", l4, portMatch(*m.L4Src))
	}
	if m.L4Dst != nil {
		add("%s_dst=%s", l4, portMatch(*m.L4Dst))
	}
	if m.TunDst != nil {
		add("tun_dst=%s", m.TunDst)
	}
	for _, r := range m.Regs {
		add("reg%d=%s", r.Reg, masked(r.Value, r.Mask))
	}
	if m.CtState != nil {
		add("ct_state=%s", ctStateString(*m.CtState))
	}
	if m.CtZone != nil {
		add("ct_zone=%d", *m.CtZone)
	}
	if m.CtMark != nil {
		add("ct_mark=%s", masked(m.CtMark.Value, m.CtMark.Mask))
	}
	if m.ConjID != nil {
		add("conj_id=%d", *m.ConjID)
	}
	if m.PktMark != nil {
		add("pkt_mark=%s", masked(m.PktMark.Value, m.PktMark.Mask))
	}
	if len(p) == 0 {
		return "any"
	}
	return strings.Join(p, ",")
}

// String renders "table=T,priority=P,cookie=0xC,<match>".
func (f Flow) String() string {
	return fmt.Sprintf("table=%d,priority=%d,cookie=%#x,%s", f.Table, f.Priority, f.Cookie, f.Match)
}

func portName(p uint32) string {
	switch p {
	case PortInPort:
		return "IN_PORT"
	case PortNormal:
		return "NORMAL"
	case PortLocal:
		return "LOCAL"
	}
	return fmt.Sprint(p)
}

func masked(v, m uint32) string {
	if m == 0 || m == 0xffffffff {
		return fmt.Sprintf("%#x", v)
	}
	return fmt.Sprintf("%#x/%#x", v&m, m)
}

func portMatch(p PortMatch) string {
	if p.Mask == 0 || p.Mask == 0xffff {
		return fmt.Sprint(p.Port)
	}
	return fmt.Sprintf("%#x/%#x", p.Port&p.Mask, p.Mask)
}

func ctStateString(s CtStateMatch) string {
	names := []string{"new", "est", "rel", "rpl", "inv", "trk", "snat", "dnat"}
	var b strings.Builder
	for i, n := range names {
		bit := uint32(1) << i
		switch {
		case s.Set&bit != 0:
			b.WriteString("+" + n)
		case s.Clear&bit != 0:
			b.WriteString("-" + n)
		}
	}
	if b.Len() == 0 {
		return "any"
	}
	return b.String()
}
