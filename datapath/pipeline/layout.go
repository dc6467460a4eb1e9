// Package pipeline describes Seine's OpenFlow pipeline as data — the tables
// in order, what a table does with a packet no flow matches, and the typed
// layout of the registers that carry state between tables — and builds the
// flows of each datapath object (the bridge itself, a local Pod, a peer
// Node) from that description. It has no I/O: datapath/flowsync installs
// what it returns.
//
// A packet walks the tables in the order of Tables(); a table whose flows
// do not match sends it to the next table or drops it, as its Miss says.
package pipeline

import (
	"fmt"
	"strconv"
	"strings"

	"github.com/seine-net/seine/datapath/openflow"
)

// Table is an OpenFlow table of the pipeline.
type Table uint8

// The tables, in pipeline order. Gaps leave room for later stages.
const (
	Classifier      Table = 0   // in_port → packet source (reg0 PktSource)
	SpoofGuard      Table = 10  // Pods may only send from their own IP and MAC
	ARPResponder    Table = 20  // answers ARP for peer gateways, forwards other ARP to its target
	NATLookup       Table = 25  // (NAT checksum detour) looks the connection up without NAT, to learn from ct_mark whether it is NATed
	SaveHeaders     Table = 26  // (NAT checksum detour) saves the fields NAT may rewrite, into Saved* registers
	Conntrack       Table = 30  // ct(): track IP packets in the Seine zone
	ConntrackState  Table = 31  // drop ct_state=+inv
	ServiceLB       Table = 40  // new connections to a Service VIP: mark the Service port, look up affinity
	SessionAffinity Table = 41  // learned ClientIP affinity flows (reached by resubmit only)
	EndpointDNAT    Table = 42  // pick an endpoint (select group) and DNAT to it
	EgressRule      Table = 50  // NetworkPolicy egress allow rules (conjunctions)
	EgressDefault   Table = 60  // default deny for Pods isolated for egress
	L3Forwarding    Table = 70  // by nw_dst: local Pod, peer Node's podCIDR (tunnel), or gateway
	L2Forwarding    Table = 80  // by eth_dst: the output ofport into reg1
	IngressRule     Table = 90  // NetworkPolicy ingress allow rules (conjunctions)
	IngressDefault  Table = 100 // default deny for Pods isolated for ingress
	ConntrackCommit Table = 110 // ct(commit) new connections
	Output          Table = 120 // output:reg1
	TunnelOutput    Table = 130 // segmented packets back from the segmentation port: tun_dst by peer MAC, to the tunnel
)

// Miss is what a table does with a packet that matches none of its flows.
type Miss int

const (
	MissDrop Miss = iota // drop the packet
	MissNext             // continue at the next table of the pipeline
)

// TableInfo describes one table.
type TableInfo struct {
	Table Table
	Name  string
	Miss  Miss
}

// Tables returns the pipeline's tables in order.
func Tables() []TableInfo {
	return []TableInfo{
		{Classifier, "Classifier", MissDrop},
		{SpoofGuard, "SpoofGuard", MissDrop},
		{ARPResponder, "ARPResponder", MissDrop},
		{NATLookup, "NATLookup", MissNext},
		{SaveHeaders, "SaveHeaders", MissNext},
		{Conntrack, "Conntrack", MissNext},
		{ConntrackState, "ConntrackState", MissNext},
		{ServiceLB, "ServiceLB", MissNext},
		{SessionAffinity, "SessionAffinity", MissNext},
		{EndpointDNAT, "EndpointDNAT", MissNext},
		{EgressRule, "EgressRule", MissNext},
		{EgressDefault, "EgressDefault", MissNext},
		{L3Forwarding, "L3Forwarding", MissDrop},
		{L2Forwarding, "L2Forwarding", MissDrop},
		{IngressRule, "IngressRule", MissNext},
		{IngressDefault, "IngressDefault", MissNext},
		{ConntrackCommit, "ConntrackCommit", MissNext},
		{Output, "Output", MissDrop},
		{TunnelOutput, "TunnelOutput", MissDrop},
	}
}

// String returns the table's name.
func (t Table) String() string {
	for _, ti := range Tables() {
		if ti.Table == t {
			return ti.Name
		}
	}
	return fmt.Sprintf("table%d", uint8(t))
}

// TableNames maps table IDs to names, for OVSDB's Flow_Table so that
// `ovs-ofctl dump-flows --names` prints them.
func TableNames() map[uint8]string {
	m := map[uint8]string{}
	for _, ti := range Tables() {
		m[uint8(ti.Table)] = ti.Name
	}
	return m
}

// Index is t's position in Tables() (-1 if t is not a pipeline table).
func (t Table) Index() int {
	for i, ti := range Tables() {
		if ti.Table == t {
			return i
		}
	}
	return -1
}

// TableByName returns the table with the given name (as Tables() names
// it), or the table numbered by a decimal string.
func TableByName(name string) (Table, bool) {
	for _, ti := range Tables() {
		if strings.EqualFold(ti.Name, name) {
			return ti.Table, true
		}
	}
	if n, err := strconv.ParseUint(name, 10, 8); err == nil {
		return Table(n), true
	}
	return 0, false
}

// next returns the table after t in pipeline order (t itself for the last).
func (t Table) next() Table {
	ts := Tables()
	for i, ti := range ts {
		if ti.Table == t && i+1 < len(ts) {
			return ts[i+1].Table
		}
	}
	return t
}

// RegField is a bit range of one NXM register, packed as reg<<16 | ofs<<8 |
// nbits so the layout can be declared as constants.
type RegField uint32

// The register layout. Every bit the pipeline uses is declared here.
const (
	// PktSource (reg0[0..3]) says where the packet entered the bridge.
	PktSource RegField = 0<<16 | 0<<8 | 4
	// OutputResolved (reg0[16]) is set once TargetOFPort holds the output port.
	OutputResolved RegField = 0<<16 | 16<<8 | 1
	// TargetOFPort (reg1[0..31]) is the ofport Output sends the packet to.
	TargetOFPort RegField = 1<<16 | 0<<8 | 32
	// EndpointSelected (reg0[17]) is set by the EndpointDNAT flow that
	// DNATs a new Service connection to its endpoint; registers survive
	// the recirculation, so the later tables know the packet is one.
	EndpointSelected RegField = 0<<16 | 17<<8 | 1
	// HairpinOut (reg0[18]) sends the packet back out of its own in_port
	// (a Pod talking to itself through a Service, or the host to an
	// endpoint on its own host network): OpenFlow drops an output to the
	// ingress port unless it is output:in_port.
	HairpinOut RegField = 0<<16 | 18<<8 | 1
	// IngressIsolated (reg0[24]) is set by the L2Forwarding flow of a
	// local Pod that some NetworkPolicy isolates for ingress: the packet
	// is headed to that Pod, and IngressDefault drops it unless an
	// IngressRule flow allowed it first.
	IngressIsolated RegField = 0<<16 | 24<<8 | 1
	// EgressIsolated (reg0[25]) is set by the Classifier flow of a local
	// Pod that some NetworkPolicy isolates for egress: the packet comes
	// from that Pod, and EgressDefault drops it unless an EgressRule flow
	// allowed it first.
	EgressIsolated RegField = 0<<16 | 25<<8 | 1
	// NATApplied (reg0[20]) is set when conntrack NATed the packet in
	// this pass: by the ConntrackState flows for connections NATed before,
	// by the EndpointDNAT commit for a new one.
	NATApplied RegField = 0<<16 | 20<<8 | 1
	// NATChecksumDone (reg0[19]) marks a packet that came back from the
	// NAT checksum detour (see NATChecksumDetour): it is not sent there
	// again.
	NATChecksumDone RegField = 0<<16 | 19<<8 | 1
	// HeadersSaved (reg0[21]) is set when the Saved* registers hold this
	// pass's packet as it entered (see NATChecksumDetour): only such a
	// packet may take the detour, which puts them back.
	HeadersSaved RegField = 0<<16 | 21<<8 | 1
	// LocalPodViaHost (reg0[22]) is set by SpoofGuard on a packet from
	// the gateway whose source is one of this Node's Pods: the host
	// handed back a Pod's connection to the Node's NodePort, externalIP
	// or LoadBalancer IP after its DNAT. The frontends of the Node's own
	// connections match it (ServicePort.LocalPods).
	LocalPodViaHost RegField = 0<<16 | 22<<8 | 1
	// SavedIPSrc, SavedIPDst, SavedL4Src, SavedL4Dst, SavedEthSrcLow
	// (eth_src[0..31]), SavedEthSrcHigh (eth_src[32..47]) and SavedTTL
	// hold a TCP or UDP packet's fields as it entered the pipeline, before
	// conntrack could NAT them (SaveHeaders, or the EndpointDNAT flow of a
	// new connection; only with the detour, and only for packets that
	// conntrack may NAT; HeadersSaved says they were).
	SavedIPSrc      RegField = 7<<16 | 0<<8 | 32
	SavedIPDst      RegField = 8<<16 | 0<<8 | 32
	SavedL4Dst      RegField = 9<<16 | 0<<8 | 16
	SavedL4Src      RegField = 9<<16 | 16<<8 | 16
	SavedEthSrcLow  RegField = 10<<16 | 0<<8 | 32
	SavedEthSrcHigh RegField = 11<<16 | 0<<8 | 16
	SavedTTL        RegField = 11<<16 | 16<<8 | 8
	// ServicePortID (reg5[0..31]) identifies the Service port a new
	// connection is addressed to (see ServiceLB).
	ServicePortID RegField = 5<<16 | 0<<8 | 32
	// EndpointIP (reg6[0..31]) is the IPv4 address of the chosen endpoint.
	EndpointIP RegField = 6<<16 | 0<<8 | 32
	// AffinityKey (reg12[0..31]) names the Service port whose ClientIP
	// affinity SessionAffinity looks up (ServicePort.AffinityID): one
	// value for all the port's frontends, where ServicePortID tells them
	// apart.
	AffinityKey RegField = 12<<16 | 0<<8 | 32
	// TraceTag (reg3[0..15]) is the trace number of a Traceflow packet:
	// loaded by the packet-out on the source Node, copied from the tunnel
	// key on the others (see TraceFlows).
	TraceTag RegField = 3<<16 | 0<<8 | 16
	// TraceActive (reg3[16]) marks a Traceflow packet: every table reports
	// it to the daemon (a packet-in) before processing it.
	TraceActive RegField = 3<<16 | 16<<8 | 1
	// TraceVisited (reg4[0..31]) has bit i set once table i of Tables()
	// has reported a Traceflow packet, so each table reports it once.
	TraceVisited RegField = 4<<16 | 0<<8 | 32
	// ARPScratch (reg2[0..31]) holds an ARP protocol address while the
	// catch-all ARP responder of PolicyOnly bridges swaps arp_spa and
	// arp_tpa; nothing after ARPResponder reads it.
	ARPScratch RegField = 2<<16 | 0<<8 | 32
)

// Values of PktSource.
const (
	FromGateway uint32 = 1
	FromTunnel  uint32 = 2
	FromPod     uint32 = 3
)

// Reg is the register number.
func (f RegField) Reg() uint8 { return uint8(f >> 16) }

// Ofs is the first bit of the field.
func (f RegField) Ofs() uint8 { return uint8(f >> 8) }

// NBits is the field's width in bits.
func (f RegField) NBits() uint8 { return uint8(f) }

// Mask is the field's bits within its register.
func (f RegField) Mask() uint32 {
	if f.NBits() >= 32 {
		return 0xffffffff
	}
	return ((uint32(1) << f.NBits()) - 1) << f.Ofs()
}

// String names the field as ovs-ofctl prints it, e.g. "reg0[0..3]" or
// "reg0[16]".
func (f RegField) String() string {
	if f.NBits() == 1 {
		return fmt.Sprintf("reg%d[%d]", f.Reg(), f.Ofs())
	}
	return fmt.Sprintf("reg%d[%d..%d]", f.Reg(), f.Ofs(), f.Ofs()+f.NBits()-1)
}

// Load is the action writing v into the field.
func (f RegField) Load(v uint32) openflow.LoadReg {
	return openflow.LoadReg{Reg: f.Reg(), Ofs: f.Ofs(), NBits: f.NBits(), Value: v}
}

// Match is the register match requiring the field to equal v.
func (f RegField) Match(v uint32) openflow.RegMatch {
	return openflow.RegMatch{Reg: f.Reg(), Value: v << f.Ofs(), Mask: f.Mask()}
}

// Regs combines field matches into one match per register, since a flow
// may match each register only once. Fields of one register must not
// overlap.
func Regs(ms ...openflow.RegMatch) []openflow.RegMatch {
	var out []openflow.RegMatch
next:
	for _, m := range ms {
		for i := range out {
			if out[i].Reg == m.Reg {
				out[i].Value |= m.Value
				out[i].Mask |= m.Mask
				continue next
			}
		}
		out = append(out, m)
	}
	return out
}

// Cookie layout: bits 48..63 are the round (incremented at each daemon
// start, so flows of an older round can be found and removed once the new
// round is installed); bits 40..47 the category of the object owning the
// flow; bits 0..39 an object ID within that category.
const (
	CookieRoundShift    = 48
	CookieCategoryShift = 40
	CookieRoundMask     = uint64(0xffff) << CookieRoundShift
	CookieCategoryMask  = uint64(0xff) << CookieCategoryShift
)

// Category says what kind of object a flow belongs to.
type Category uint8

const (
	CategoryPipeline Category = 1 // the bridge's fixed flows
	CategoryPod      Category = 2 // one local Pod
	CategoryNode     Category = 3 // one peer Node
	CategoryPolicy   Category = 4 // NetworkPolicy rules
	CategoryService  Category = 5 // Service load balancing
	CategoryTrace    Category = 6 // Traceflow observation flows
)

// Cookie builds the cookie of a flow of the given category and object ID in
// the given round.
func Cookie(round uint16, c Category, id uint64) uint64 {
	return uint64(round)<<CookieRoundShift | uint64(c)<<CookieCategoryShift | id&(1<<40-1)
}

// ConntrackZone is the conntrack zone of Pod traffic.
const ConntrackZone uint16 = 65520
