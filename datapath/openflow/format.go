package openflow

import (
	"fmt"
	"net"
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
	macMatch := func(name string, v, mask net.HardwareAddr) {
		if mask != nil {
			add("%s=%s/%s", name, v, mask)
		} else {
			add("%s=%s", name, v)
		}
	}
	if m.EthSrc != nil {
		macMatch("dl_src", m.EthSrc, m.EthSrcMask)
	}
	if m.EthDst != nil {
		macMatch("dl_dst", m.EthDst, m.EthDstMask)
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
	if m.Frag != nil {
		add("nw_frag=%s", fragString(*m.Frag))
	}
	if m.TunDst != nil {
		add("tun_dst=%s", m.TunDst)
	}
	if m.TunSrc != nil {
		add("tun_src=%s", m.TunSrc)
	}
	if m.TunID != nil {
		if m.TunID.Mask == 0 || m.TunID.Mask == ^uint64(0) {
			add("tun_id=%#x", m.TunID.Value)
		} else {
			add("tun_id=%#x/%#x", m.TunID.Value&m.TunID.Mask, m.TunID.Mask)
		}
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
	case PortController:
		return "CONTROLLER"
	}
	return fmt.Sprint(p)
}

func masked(v, m uint32) string {
	if m == 0 || m == 0xffffffff {
		return fmt.Sprintf("%#x", v)
	}
	return fmt.Sprintf("%#x/%#x", v&m, m)
}

// fragString names an nw_frag match as ovs-ofctl(8) writes it, or gives
// value/mask for the combinations it has no name for.
func fragString(f FragMatch) string {
	const both = FragAny | FragLater
	switch (FragMatch{Value: f.Value & f.Mask, Mask: f.Mask}) {
	case FragMatch{FragAny, FragAny}:
		return "yes"
	case FragMatch{0, FragAny}:
		return "no"
	case FragMatch{FragAny, both}:
		return "first"
	case FragMatch{both, both}:
		return "later"
	case FragMatch{0, FragLater}:
		return "not_later"
	}
	return fmt.Sprintf("%#x/%#x", f.Value&f.Mask, f.Mask)
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

// FormatActions renders actions in ovs-actions(7) syntax, e.g.
// "set_field:0e:5e:1e:00:00:01->eth_dst,goto_table:L2Forwarding"; table
// names a table (nil prints numbers). An empty list renders as "drop".
func FormatActions(actions []Action, table func(uint8) string) string {
	if table == nil {
		table = func(t uint8) string { return fmt.Sprint(t) }
	}
	if len(actions) == 0 {
		return "drop"
	}
	p := make([]string, 0, len(actions))
	for _, a := range actions {
		p = append(p, formatAction(a, table))
	}
	return strings.Join(p, ",")
}

func bitRange(name string, ofs, nbits uint8) string {
	if nbits == 0 {
		nbits = 32
	}
	if nbits == 1 {
		return fmt.Sprintf("%s[%d]", name, ofs)
	}
	if ofs == 0 && nbits == 32 {
		return name + "[]"
	}
	return fmt.Sprintf("%s[%d..%d]", name, ofs, int(ofs)+int(nbits)-1)
}

func formatAction(a Action, table func(uint8) string) string {
	set := func(v any, field string) string { return fmt.Sprintf("set_field:%v->%s", v, field) }
	switch a := a.(type) {
	case Output:
		return "output:" + portName(a.Port)
	case OutputReg:
		return "output:" + bitRange(fmt.Sprintf("reg%d", a.Reg), a.Ofs, a.NBits)
	case GotoTable:
		return "goto_table:" + table(a.Table)
	case Meter:
		return fmt.Sprintf("meter:%d", a.ID)
	case Resubmit:
		return "resubmit(," + table(a.Table) + ")"
	case SetEthSrc:
		return set(a.MAC, "eth_src")
	case SetEthDst:
		return set(a.MAC, "eth_dst")
	case SetTunDst:
		return set(a.IP, "tun_dst")
	case SetTunID:
		return set(fmt.Sprintf("%#x", a.ID), "tun_id")
	case SetIPSrc:
		return set(a.IP, "ip_src")
	case SetIPDst:
		return set(a.IP, "ip_dst")
	case SetARPOp:
		return set(a.Op, "arp_op")
	case SetARPSHA:
		return set(a.MAC, "arp_sha")
	case SetARPSPA:
		return set(a.IP, "arp_spa")
	case LoadReg:
		return fmt.Sprintf("load:%#x->%s", a.Value, bitRange(fmt.Sprintf("reg%d", a.Reg), a.Ofs, a.NBits))
	case Move:
		return fmt.Sprintf("move:%s->%s", a.Src, a.Dst)
	case MoveRange:
		r := func(f Field, ofs uint16) string { return fmt.Sprintf("%s[%d..%d]", f, ofs, ofs+a.NBits-1) }
		return "move:" + r(a.Src, a.SrcOfs) + "->" + r(a.Dst, a.DstOfs)
	case CT:
		p := []string{}
		if a.Commit {
			p = append(p, "commit")
		}
		p = append(p, fmt.Sprintf("zone=%d", a.Zone))
		if a.Table != nil {
			p = append(p, "table="+table(*a.Table))
		}
		if a.NAT != nil {
			p = append(p, formatNAT(a.NAT))
		}
		if a.SetMark != nil {
			p = append(p, fmt.Sprintf("exec(set_field:%s->ct_mark)", masked(a.SetMark.Value, a.SetMark.Mask)))
		}
		return "ct(" + strings.Join(p, ",") + ")"
	case Conjunction:
		return fmt.Sprintf("conjunction(%d,%d/%d)", a.ID, a.Clause, a.NClauses)
	case DecTTL:
		return "dec_ttl"
	case Group:
		return fmt.Sprintf("group:%d", a.ID)
	case Learn:
		return fmt.Sprintf("learn(table=%s,priority=%d,hard_timeout=%d,...)", table(a.Table), a.Priority, a.HardTimeout)
	}
	return fmt.Sprintf("%T", a)
}

func formatNAT(n *CTNAT) string {
	kind := ""
	switch {
	case n.SNAT:
		kind = "src"
	case n.DNAT:
		kind = "dst"
	default:
		return "nat"
	}
	r := ""
	if n.IPMin != nil {
		r = "=" + n.IPMin.String()
		if n.IPMax != nil && !n.IPMax.Equal(n.IPMin) {
			r += "-" + n.IPMax.String()
		}
		if n.PortMin != 0 {
			r += fmt.Sprintf(":%d", n.PortMin)
			if n.PortMax != 0 && n.PortMax != n.PortMin {
				r += fmt.Sprintf("-%d", n.PortMax)
			}
		}
	}
	return "nat(" + kind + r + ")"
}
