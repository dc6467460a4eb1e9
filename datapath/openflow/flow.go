// Package openflow is Seine's OpenFlow client for one OVS bridge: it speaks
// OpenFlow 1.3 with the Nicira and ONF extensions OVS implements, over the
// bridge's management socket, using github.com/contiv/libOpenflow for the
// wire encoding.
//
// Flows are plain data (Flow, Match, Action). The pipeline package builds
// them; this package only encodes, sends and dumps them. Field names follow
// ovs-fields(7) and action names ovs-actions(7).
package openflow

import (
	"fmt"
	"net"
)

// Ct state bits, as defined for the ct_state field in ovs-fields(7).
const (
	CtNew  uint32 = 1 << 0
	CtEst  uint32 = 1 << 1
	CtRel  uint32 = 1 << 2
	CtRpl  uint32 = 1 << 3
	CtInv  uint32 = 1 << 4
	CtTrk  uint32 = 1 << 5
	CtSNAT uint32 = 1 << 6
	CtDNAT uint32 = 1 << 7
)

// Well-known port numbers (OpenFlow 1.3 section 7.2.1, ofp_port_no).
const (
	PortInPort uint32 = 0xfffffff8
	PortNormal uint32 = 0xfffffffa
	// PortController sends the packet to the controller connections as a
	// packet-in (OFPP_CONTROLLER); Output asks for the whole packet
	// (max_len OFPCML_NO_BUFFER). See Client.SubscribePacketIns.
	PortController uint32 = 0xfffffffd
	PortLocal      uint32 = 0xfffffffe
)

// Masked32 is a value under a mask; a zero Mask means "all bits" (exact).
type Masked32 struct {
	Value uint32
	Mask  uint32
}

// Masked64 is a 64-bit value under a mask; a zero Mask means exact.
type Masked64 struct {
	Value uint64
	Mask  uint64
}

// RegMatch matches bits of one of the sixteen 32-bit NXM registers reg0..reg15.
// A zero Mask means an exact match of all 32 bits.
type RegMatch struct {
	Reg   uint8
	Value uint32
	Mask  uint32
}

// PortMatch matches a transport port under a bit mask (ovs-fields(7), tp_dst
// with mask), the form used to cover a port range with a few flows.
// A zero Mask means exact.
type PortMatch struct {
	Port uint16
	Mask uint16
}

// FragMatch matches nw_frag, the two fragment bits OVS derives from the IP
// header (ovs-fields(7), "ip_frag"): FragAny is set on every fragment,
// FragLater on every fragment but the first. Common forms: {FragAny,
// FragAny} "yes", {0, FragAny} "no", {FragAny, FragAny|FragLater} "first",
// {FragAny|FragLater, FragAny|FragLater} "later".
type FragMatch struct {
	Value uint8
	Mask  uint8
}

// The nw_frag bits.
const (
	FragAny   uint8 = 1
	FragLater uint8 = 2
)

// CtStateMatch requires the bits in Set to be 1 and those in Clear to be 0.
type CtStateMatch struct {
	Set   uint32
	Clear uint32
}

// Match is a flow's match. Zero values mean "not matched"; prerequisites
// (eth_type for IP and ARP fields, ip_proto for transport ports) are not
// added implicitly: set EthType and IPProto yourself, as ovs-ofctl requires.
type Match struct {
	InPort  uint32 // 0: any
	EthType uint16 // 0x0800 IPv4, 0x0806 ARP
	EthSrc  net.HardwareAddr
	EthDst  net.HardwareAddr
	// EthSrcMask and EthDstMask, when set, match only the bits of EthSrc
	// and EthDst set in them.
	EthSrcMask net.HardwareAddr
	EthDstMask net.HardwareAddr

	ARPOp  uint16 // 1 request, 2 reply
	ARPSPA net.IP
	ARPTPA net.IP
	ARPSHA net.HardwareAddr

	IPSrc   *net.IPNet // nw_src with prefix mask
	IPDst   *net.IPNet // nw_dst with prefix mask
	IPProto uint8      // 1 ICMP, 6 TCP, 17 UDP, 132 SCTP

	L4Src *PortMatch // tcp_src / udp_src / sctp_src, chosen by IPProto
	L4Dst *PortMatch // tcp_dst / udp_dst / sctp_dst, chosen by IPProto
	// Frag matches nw_frag. In OVS's default fragment handling ("normal",
	// ovs-ofctl(8) set-frags) the transport ports of every fragment read
	// as 0, so a fragment never matches L4Src or L4Dst.
	Frag *FragMatch

	TunDst net.IP    // tun_dst (packets received from a tunnel)
	TunSrc net.IP    // tun_src
	TunID  *Masked64 // tun_id: the tunnel key (VNI), under a mask

	Regs    []RegMatch
	CtState *CtStateMatch
	CtMark  *Masked32
	CtZone  *uint16
	ConjID  *uint32
	PktMark *Masked32
}

// Flow is one OpenFlow flow entry.
type Flow struct {
	Table    uint8
	Priority uint16
	Cookie   uint64
	Match    Match
	// Actions run in order. An empty list drops the packet.
	Actions []Action
}

// Action is one OpenFlow or Nicira-extension action. The concrete types are
// listed below; each corresponds to the ovs-actions(7) action of that name.
type Action interface{ isAction() }

// Output sends the packet to Port (an ofport or one of the Port* constants).
type Output struct{ Port uint32 }

// OutputReg sends the packet to the ofport held in bits [Ofs, Ofs+NBits) of
// register Reg (ovs-actions(7) "output:reg1[0..31]").
type OutputReg struct {
	Reg        uint8
	Ofs, NBits uint8
}

// GotoTable continues the pipeline at Table (OpenFlow goto_table
// instruction; must be the last action and Table must be greater than the
// flow's own table).
type GotoTable struct{ Table uint8 }

// Resubmit re-runs the pipeline from Table and continues with the next
// action afterwards (Nicira resubmit(,table)).
type Resubmit struct{ Table uint8 }

// SetEthSrc and the other Set* actions rewrite one header field.
type SetEthSrc struct{ MAC net.HardwareAddr }
type SetEthDst struct{ MAC net.HardwareAddr }
type SetTunDst struct{ IP net.IP }
type SetIPSrc struct{ IP net.IP }
type SetIPDst struct{ IP net.IP }
type SetARPOp struct{ Op uint16 }
type SetARPSHA struct{ MAC net.HardwareAddr }
type SetARPSPA struct{ IP net.IP }

// LoadReg writes Value into bits [Ofs, Ofs+NBits) of register Reg
// (ovs-actions(7) "load:value->reg0[ofs..end]"). NBits 0 means 32.
type LoadReg struct {
	Reg        uint8
	Ofs, NBits uint8
	Value      uint32
}

// Field names the header fields Move can copy (ovs-fields(7) names).
type Field string

const (
	FieldEthSrc Field = "eth_src"
	FieldEthDst Field = "eth_dst"
	FieldARPSHA Field = "arp_sha"
	FieldARPTHA Field = "arp_tha"
	FieldARPSPA Field = "arp_spa"
	FieldARPTPA Field = "arp_tpa"
	FieldIPSrc  Field = "ip_src"
	FieldIPDst  Field = "ip_dst"
	FieldInPort Field = "in_port" // 16 bits, writable (NXM_OF_IN_PORT)
	FieldIPTTL  Field = "nw_ttl"
	FieldTCPSrc Field = "tcp_src" // a move needs the flow to match TCP (ovs-ofctl checks prerequisites)
	FieldTCPDst Field = "tcp_dst"
	FieldUDPSrc Field = "udp_src"
	FieldUDPDst Field = "udp_dst"
	FieldTunID  Field = "tun_id"
)

// FieldReg names the whole 32-bit register reg0..reg15 (n is 0..15), for
// Move and MoveRange.
func FieldReg(n uint8) Field { return Field(fmt.Sprintf("reg%d", n)) }

// Move copies the whole of field Src into field Dst (ovs-actions(7) "move");
// both must have the same width.
type Move struct{ Src, Dst Field }

// MoveRange copies NBits bits starting at bit SrcOfs of Src to the bits
// starting at DstOfs of Dst (ovs-actions(7) "move:reg3[0..15]->tun_id[0..15]").
// Src and Dst are any fields Move accepts.
type MoveRange struct {
	Src, Dst       Field
	SrcOfs, DstOfs uint16
	NBits          uint16
}

// SetTunID sets the tunnel key (tun_id, the VNI of Geneve and VXLAN, the
// GRE key) of a packet about to leave through a flow-based tunnel port.
type SetTunID struct{ ID uint64 }

// CT sends the packet through the connection tracker (ovs-actions(7) "ct").
type CT struct {
	Commit bool
	Zone   uint16
	// Table, when set, recirculates the packet to that table after tracking;
	// otherwise the pipeline continues with the next action, untracked.
	Table *uint8
	// SetMark, when set, writes the bits of Mask (all when 0) of ct_mark
	// (only with Commit); a sparse Mask is written as one load per run.
	SetMark *Masked32
	// NAT, when set, applies or restores NAT (ovs-actions(7) "nat").
	NAT *CTNAT
}

// CTNAT is the nat(...) argument of a ct action. With neither SNAT nor DNAT
// set it restores the NAT of an existing connection.
type CTNAT struct {
	SNAT, DNAT   bool
	IPMin, IPMax net.IP
	PortMin      uint16
	PortMax      uint16
}

// Conjunction is one clause of a conjunctive match (ovs-actions(7)
// "conjunction(id, k/n)"); Clause is 1-based.
type Conjunction struct {
	ID       uint32
	Clause   uint8
	NClauses uint8
}

// DecTTL decrements the IPv4 TTL, dropping the packet when it reaches zero.
type DecTTL struct{}

// Group sends the packet to an OpenFlow group.
type Group struct{ ID uint32 }

func (Output) isAction()      {}
func (OutputReg) isAction()   {}
func (GotoTable) isAction()   {}
func (Resubmit) isAction()    {}
func (SetEthSrc) isAction()   {}
func (SetEthDst) isAction()   {}
func (SetTunDst) isAction()   {}
func (SetIPSrc) isAction()    {}
func (SetIPDst) isAction()    {}
func (SetARPOp) isAction()    {}
func (SetARPSHA) isAction()   {}
func (SetARPSPA) isAction()   {}
func (LoadReg) isAction()     {}
func (Move) isAction()        {}
func (CT) isAction()          {}
func (Conjunction) isAction() {}
func (DecTTL) isAction()      {}
func (Group) isAction()       {}
func (MoveRange) isAction()   {}
func (SetTunID) isAction()    {}

// Op is what a FlowMod does.
type Op int

const (
	// OpAdd adds the flow or replaces one with the same table, priority and
	// match (OFPFC_ADD).
	OpAdd Op = iota
	// OpDelete removes exactly the flow with the same table, priority and
	// match (OFPFC_DELETE_STRICT).
	OpDelete
)

// FlowMod is one change to the flow table.
type FlowMod struct {
	Op   Op
	Flow Flow
}

// FlowStats is one flow as read back from the switch.
type FlowStats struct {
	Flow
	Packets uint64
	Bytes   uint64
}
