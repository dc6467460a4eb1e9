package pipeline

import (
	"net"

	of "github.com/seine-net/seine/datapath/openflow"
)

// Ethernet types.
const (
	EthTypeIPv4 uint16 = 0x0800
	EthTypeARP  uint16 = 0x0806
)

// Priorities. Higher wins (OpenFlow 1.3 section 5.3).
const (
	PrioHigh    uint16 = 200
	PrioNormal  uint16 = 190
	PrioLow     uint16 = 180
	PrioDefault uint16 = 0
)

// VirtualMAC is the one MAC address under which every peer Node's gateway
// is answered by the ARP responder, and the destination MAC of tunnelled
// packets. It is locally administered and unicast (IEEE 802, bit 1 of the
// first octet set, bit 0 clear).
var virtualMAC = [6]byte{0x0e, 0x5e, 0x1e, 0x00, 0x00, 0x01}

// VirtualMAC returns a copy of the virtual MAC.
func VirtualMAC() net.HardwareAddr {
	m := virtualMAC
	return net.HardwareAddr(m[:])
}

// Bridge is what the fixed flows of the integration bridge depend on.
type Bridge struct {
	Round       uint16
	GatewayPort uint32
	GatewayMAC  net.HardwareAddr
	GatewayIP   net.IP     // first IP of PodCIDR
	PodCIDR     *net.IPNet // this Node's podCIDR
	// NodeIP is this Node's InternalIP; Pod traffic from peers to it
	// arrives through the tunnel and is handed to the host.
	NodeIP net.IP
	// TunnelPort is the ofport of the flow-based tunnel; 0 when the Node
	// does not encapsulate (no tunnel port).
	TunnelPort uint32
}

// Pod is a local Pod attached to the bridge.
type Pod struct {
	OFPort uint32
	IP     net.IP
	MAC    net.HardwareAddr
	// IngressIsolated and EgressIsolated say whether some NetworkPolicy
	// isolates the Pod for that direction (networking.k8s.io/v1: a policy
	// selecting it lists the direction in policyTypes). They set the
	// IngressIsolated / EgressIsolated register bits on the Pod's traffic,
	// which the default deny of PolicyBaseFlows drops unless a policy rule
	// allowed it.
	IngressIsolated, EgressIsolated bool
}

// PeerNode is another Node whose podCIDR is reached through the tunnel.
type PeerNode struct {
	// ID is a small number unique among peers, used in cookies.
	ID        uint64
	PodCIDR   *net.IPNet
	NodeIP    net.IP // underlay address: the tunnel's remote end
	GatewayIP net.IP // first IP of the peer's podCIDR
}

func goTo(t Table) of.Action { return of.GotoTable{Table: uint8(t)} }

func host(ip net.IP) *net.IPNet { return &net.IPNet{IP: ip.To4(), Mask: net.CIDRMask(32, 32)} }

// BaseFlows returns the bridge's fixed flows: the miss flow of every table
// (Tables()), the classification of gateway and tunnel traffic, conntrack,
// commit, output and the routes to the gateway itself.
func BaseFlows(b Bridge) []of.Flow {
	ck := Cookie(b.Round, CategoryPipeline, 0)
	var fs []of.Flow
	add := func(t Table, prio uint16, m of.Match, acts ...of.Action) {
		fs = append(fs, of.Flow{Table: uint8(t), Priority: prio, Cookie: ck, Match: m, Actions: acts})
	}
	for _, ti := range Tables() {
		if ti.Miss == MissNext {
			add(ti.Table, PrioDefault, of.Match{}, goTo(ti.Table.next()))
		} else {
			add(ti.Table, PrioDefault, of.Match{}) // drop
		}
	}
	// Classifier.
	add(Classifier, PrioHigh, of.Match{InPort: b.GatewayPort}, PktSource.Load(FromGateway), goTo(SpoofGuard))
	if b.TunnelPort != 0 {
		add(Classifier, PrioHigh, of.Match{InPort: b.TunnelPort}, PktSource.Load(FromTunnel), goTo(Conntrack))
	}
	// SpoofGuard: the host is trusted.
	add(SpoofGuard, PrioHigh, of.Match{EthType: EthTypeARP, Regs: []of.RegMatch{PktSource.Match(FromGateway)}}, goTo(ARPResponder))
	add(SpoofGuard, PrioHigh, of.Match{EthType: EthTypeIPv4, Regs: []of.RegMatch{PktSource.Match(FromGateway)}}, goTo(Conntrack))
	// ARP for the gateway goes to the gateway, whose kernel answers.
	add(ARPResponder, PrioNormal, of.Match{EthType: EthTypeARP, ARPTPA: b.GatewayIP}, of.Output{Port: b.GatewayPort})
	// Conntrack.
	zone := ConntrackZone
	ctTable := uint8(ConntrackState)
	add(Conntrack, PrioHigh, of.Match{EthType: EthTypeIPv4}, of.CT{Zone: zone, Table: &ctTable, NAT: &of.CTNAT{}})
	add(ConntrackState, PrioHigh, of.Match{EthType: EthTypeIPv4, CtState: &of.CtStateMatch{Set: of.CtTrk | of.CtInv}})
	// L3Forwarding: to the gateway's own IP; anything unknown in the local
	// podCIDR is dropped; everything else leaves through the gateway.
	add(L3Forwarding, PrioHigh, of.Match{EthType: EthTypeIPv4, IPDst: host(b.GatewayIP)},
		of.SetEthDst{MAC: b.GatewayMAC}, goTo(L2Forwarding))
	if b.NodeIP != nil {
		add(L3Forwarding, PrioHigh, of.Match{EthType: EthTypeIPv4, IPDst: host(b.NodeIP)},
			of.SetEthDst{MAC: b.GatewayMAC}, goTo(L2Forwarding))
	}
	add(L3Forwarding, PrioLow, of.Match{EthType: EthTypeIPv4, IPDst: b.PodCIDR})
	add(L3Forwarding, PrioLow-1, of.Match{EthType: EthTypeIPv4},
		of.SetEthDst{MAC: b.GatewayMAC}, goTo(L2Forwarding))
	// L2Forwarding to the gateway and the tunnel. A packet of a Service
	// connection (NATed by the bridge) that the host sent and that goes
	// back to the host (an endpoint on the host network, reached through
	// a NodePort or from the host itself) leaves by output:in_port:
	// OpenFlow drops an output to the port a packet came in on. Other
	// packets from the host back to the host stay dropped (no loop).
	add(L2Forwarding, PrioHigh, of.Match{EthDst: b.GatewayMAC},
		TargetOFPort.Load(b.GatewayPort), OutputResolved.Load(1), goTo(L2Forwarding.next()))
	for _, natted := range []uint32{of.CtDNAT, of.CtSNAT} {
		add(L2Forwarding, PrioHigh+1, of.Match{EthDst: b.GatewayMAC, CtState: &of.CtStateMatch{Set: of.CtTrk | natted},
			Regs: []of.RegMatch{PktSource.Match(FromGateway)}},
			TargetOFPort.Load(b.GatewayPort), OutputResolved.Load(1), HairpinOut.Load(1), goTo(L2Forwarding.next()))
	}
	if b.TunnelPort != 0 {
		add(L2Forwarding, PrioHigh, of.Match{EthDst: VirtualMAC()},
			TargetOFPort.Load(b.TunnelPort), OutputResolved.Load(1), goTo(L2Forwarding.next()))
	}
	// Commit new connections, then output. Connections the host started
	// (or forwarded: kube-proxy's DNAT, NodePort) are marked so that their
	// replies go back through the gateway even when addressed to a Pod:
	// only the host can undo what it did to them.
	add(ConntrackCommit, PrioHigh, of.Match{EthType: EthTypeIPv4, CtState: &of.CtStateMatch{Set: of.CtTrk | of.CtNew}},
		of.CT{Commit: true, Zone: zone}, goTo(Output))
	add(ConntrackCommit, PrioHigh+1, of.Match{EthType: EthTypeIPv4, CtState: &of.CtStateMatch{Set: of.CtTrk | of.CtNew},
		Regs: []of.RegMatch{PktSource.Match(FromGateway)}},
		of.CT{Commit: true, Zone: zone, SetMark: &of.Masked32{Value: CtMarkFromGateway, Mask: CtMarkFromGateway}}, goTo(Output))
	add(L3Forwarding, PrioHigh+10, of.Match{EthType: EthTypeIPv4, CtState: &of.CtStateMatch{Set: of.CtTrk | of.CtRpl},
		CtMark: &of.Masked32{Value: CtMarkFromGateway, Mask: CtMarkFromGateway}},
		of.SetEthSrc{MAC: b.GatewayMAC}, of.SetEthDst{MAC: b.GatewayMAC}, goTo(L2Forwarding))
	add(Output, PrioHigh, of.Match{Regs: []of.RegMatch{OutputResolved.Match(1)}},
		of.OutputReg{Reg: TargetOFPort.Reg(), Ofs: TargetOFPort.Ofs(), NBits: TargetOFPort.NBits()})
	add(Output, PrioHigh+10, of.Match{Regs: []of.RegMatch{{Reg: 0, Value: 1<<OutputResolved.Ofs() | 1<<HairpinOut.Ofs(),
		Mask: OutputResolved.Mask() | HairpinOut.Mask()}}}, of.Output{Port: of.PortInPort})
	return fs
}

// PodFlows returns the flows of one local Pod: classification of its port,
// its spoof guard, ARP delivery to it, and L3/L2 forwarding to it. The
// Classifier flow also loads EgressIsolated=1 when p.EgressIsolated, and the
// L2Forwarding flow IngressIsolated=1 when p.IngressIsolated, so changing a
// Pod's isolation changes only those two flows.
func PodFlows(b Bridge, p Pod) []of.Flow {
	ck := Cookie(b.Round, CategoryPod, uint64(p.OFPort))
	ip := p.IP.To4()
	classify := []of.Action{PktSource.Load(FromPod)}
	if p.EgressIsolated {
		classify = append(classify, EgressIsolated.Load(1))
	}
	classify = append(classify, goTo(SpoofGuard))
	deliver := []of.Action{TargetOFPort.Load(p.OFPort), OutputResolved.Load(1)}
	if p.IngressIsolated {
		deliver = append(deliver, IngressIsolated.Load(1))
	}
	deliver = append(deliver, goTo(L2Forwarding.next()))
	return []of.Flow{
		{Table: uint8(Classifier), Priority: PrioNormal, Cookie: ck, Match: of.Match{InPort: p.OFPort},
			Actions: classify},
		{Table: uint8(SpoofGuard), Priority: PrioHigh, Cookie: ck,
			Match:   of.Match{InPort: p.OFPort, EthType: EthTypeARP, ARPSPA: ip, ARPSHA: p.MAC},
			Actions: []of.Action{goTo(ARPResponder)}},
		{Table: uint8(SpoofGuard), Priority: PrioHigh, Cookie: ck,
			Match:   of.Match{InPort: p.OFPort, EthType: EthTypeIPv4, EthSrc: p.MAC, IPSrc: host(ip)},
			Actions: []of.Action{goTo(Conntrack)}},
		{Table: uint8(ARPResponder), Priority: PrioNormal, Cookie: ck,
			Match:   of.Match{EthType: EthTypeARP, ARPTPA: ip},
			Actions: []of.Action{of.Output{Port: p.OFPort}}},
		{Table: uint8(L3Forwarding), Priority: PrioHigh, Cookie: ck,
			Match:   of.Match{EthType: EthTypeIPv4, IPDst: host(ip)},
			Actions: []of.Action{of.SetEthSrc{MAC: b.GatewayMAC}, of.SetEthDst{MAC: p.MAC}, goTo(L2Forwarding)}},
		{Table: uint8(L2Forwarding), Priority: PrioHigh, Cookie: ck,
			Match: of.Match{EthDst: p.MAC}, Actions: deliver},
	}
}

// arpAnswer is the ARPResponder flow answering requests for ip with the
// virtual MAC, out of the port they came in on.
func arpAnswer(ck uint64, ip net.IP) of.Flow {
	vmac := VirtualMAC()
	return of.Flow{Table: uint8(ARPResponder), Priority: PrioHigh, Cookie: ck,
		Match: of.Match{EthType: EthTypeARP, ARPOp: 1, ARPTPA: ip.To4()},
		Actions: []of.Action{
			of.Move{Src: of.FieldEthSrc, Dst: of.FieldEthDst},
			of.SetEthSrc{MAC: vmac},
			of.SetARPOp{Op: 2},
			of.Move{Src: of.FieldARPSHA, Dst: of.FieldARPTHA},
			of.SetARPSHA{MAC: vmac},
			of.Move{Src: of.FieldARPSPA, Dst: of.FieldARPTPA},
			of.SetARPSPA{IP: ip.To4()},
			of.Output{Port: of.PortInPort},
		}}
}

// PeerNodeFlows returns the flows that reach a peer Node's podCIDR through
// the tunnel, and the ARP answer for its gateway (the host route to the
// peer's podCIDR points at that gateway IP).
//
// Local Pods reach the peer Node's own IP through the tunnel too: the
// peer's host replies through its gateway and the tunnel (its route to our
// podCIDR), so both directions cross both bridges and their connection
// tracking sees whole connections.
func PeerNodeFlows(b Bridge, n PeerNode) []of.Flow {
	ck := Cookie(b.Round, CategoryNode, n.ID)
	vmac := VirtualMAC()
	toTunnel := func() []of.Action {
		return []of.Action{
			of.SetEthSrc{MAC: b.GatewayMAC},
			of.SetEthDst{MAC: vmac},
			of.SetTunDst{IP: n.NodeIP.To4()},
			of.DecTTL{},
			goTo(L2Forwarding),
		}
	}
	return []of.Flow{
		arpAnswer(ck, n.GatewayIP),
		{Table: uint8(L3Forwarding), Priority: PrioHigh, Cookie: ck,
			Match:   of.Match{EthType: EthTypeIPv4, IPDst: n.PodCIDR},
			Actions: toTunnel()},
		{Table: uint8(L3Forwarding), Priority: PrioHigh, Cookie: ck,
			Match:   of.Match{EthType: EthTypeIPv4, IPDst: host(n.NodeIP), Regs: []of.RegMatch{PktSource.Match(FromPod)}},
			Actions: toTunnel()},
	}
}
