package pipeline

import (
	"fmt"
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

// virtualMAC is the one MAC address under which every peer Node's gateway
// is answered by the ARP responder (tunnelled packets carry the peer's
// PeerMAC instead). It is locally administered and unicast (IEEE 802, bit 1
// of the first octet set, bit 0 clear).
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
	// GatewayIP is the first IP of PodCIDR; nil when seine owns no
	// podCIDR (PolicyOnly).
	GatewayIP net.IP
	// PodCIDR is this Node's podCIDR; nil with PolicyOnly.
	PodCIDR *net.IPNet
	// NodeIP is this Node's InternalIP; Pod traffic from peers to it
	// arrives through the tunnel and is handed to the host.
	NodeIP net.IP
	// TunnelPort is the ofport of the tunnel: packets from peer Nodes
	// arrive on it and packets to them leave through it, as Tunnel says;
	// 0 when the Node does not encapsulate (no tunnel port).
	TunnelPort uint32
	// Tunnel says how a packet for a peer Node is handed to TunnelPort.
	Tunnel TunnelEgress
	// SegmentPort is the ofport of the segmentation port (userspace
	// datapath with userspace TSO, and only where packets pass through it;
	// else 0): a packet output to it comes back on it segmented, with
	// complete checksums (tunnel.SegmentPair). Packets for the tunnel pass
	// through it with TunnelSegmented, and NATed packets leaving the Node
	// unless PartialChecksumsRewritten (NATChecksumDetour).
	SegmentPort uint32
	// PartialChecksumsRewritten: every device through which packets leave
	// the bridge (the gateway, a kernel tunnel device, the segmentation
	// port) has the tc program that writes a partial checksum's
	// pseudo-header seed anew (datapath/csumseed), so NATed packets leave
	// directly, without the NAT checksum detour.
	PartialChecksumsRewritten bool
	// PolicyOnly: the bridge sits between a routed primary CNI's Pods and
	// the host (trafficEncapMode networkPolicyOnly). It answers every ARP
	// request with VirtualMAC, routes by destination IP to local Pods
	// (decrementing the TTL of Pod-to-Pod packets, as the host would) and
	// sends everything else to the gateway, so packets arrive as they
	// would without the bridge.
	PolicyOnly bool
}

// TunnelEgress is how the bridge hands a packet to a peer Node. Every
// variant first addresses the packet to the peer's PeerMAC (L3Forwarding),
// so L2Forwarding, and TunnelOutput after a segmentation detour, can tell
// the peers apart.
type TunnelEgress uint8

const (
	// TunnelByTunDst: TunnelPort is OVS's flow-based tunnel port
	// (remote_ip=flow) and the packet's tun_dst names the peer's Node IP.
	TunnelByTunDst TunnelEgress = iota
	// TunnelByMAC: TunnelPort is a kernel tunnel device (VXLAN) attached
	// as an ordinary port; the device's forwarding database maps each
	// PeerMAC to the peer's Node IP, and the kernel encapsulates, then
	// segments and checksums large (TSO) packets itself.
	TunnelByMAC
	// TunnelSegmented: as TunnelByTunDst, but the packet first leaves
	// through SegmentPort, a veth end without checksum or segmentation
	// offload, so the kernel segments it and completes its checksums; the
	// segments come back on the same port and TunnelOutput sends them to
	// the tunnel. OVS before 3.3 drops offloaded packets at a userspace tunnel
	// port ("Tunneling packets with HW offload flags is not supported").
	TunnelSegmented
)

// String names the variant as docs and logs do.
func (e TunnelEgress) String() string {
	switch e {
	case TunnelByTunDst:
		return "tun_dst"
	case TunnelByMAC:
		return "peer-mac"
	case TunnelSegmented:
		return "segmented"
	}
	return fmt.Sprintf("TunnelEgress(%d)", uint8(e))
}

// PeerMAC is the inner destination MAC of packets for the peer Node with
// the given IPv4 Node IP: 0e:5f followed by the address's four bytes
// (locally administered, unicast), so every peer has its own and a kernel
// tunnel device's forwarding database can map it to the peer.
func PeerMAC(nodeIP net.IP) net.HardwareAddr {
	ip := nodeIP.To4()
	if ip == nil {
		return nil
	}
	return net.HardwareAddr{0x0e, 0x5f, ip[0], ip[1], ip[2], ip[3]}
}

// PeerNodeIP is PeerMAC's inverse: the Node IP a peer MAC names, nil for
// any other address.
func PeerNodeIP(mac net.HardwareAddr) net.IP {
	if len(mac) != 6 || mac[0] != 0x0e || mac[1] != 0x5f {
		return nil
	}
	return net.IPv4(mac[2], mac[3], mac[4], mac[5]).To4()
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
	// EgressMeter, when not 0, is the OpenFlow meter every packet from the
	// Pod's port passes first (its Classifier flow): the backstop of the
	// Pod's egress limit, which its own qdisc enforces (node/bandwidth).
	// The meter must exist before the flows are added.
	EgressMeter uint32
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
		add(Classifier, PrioHigh, of.Match{InPort: b.TunnelPort}, PktSource.Load(FromTunnel), goTo(NATLookup))
	}
	if b.Tunnel == TunnelSegmented && b.SegmentPort != 0 {
		// Segments of a packet that already went through the pipeline.
		add(Classifier, PrioHigh, of.Match{InPort: b.SegmentPort}, goTo(TunnelOutput))
	}
	// SpoofGuard: the host is trusted.
	add(SpoofGuard, PrioHigh, of.Match{EthType: EthTypeARP, Regs: []of.RegMatch{PktSource.Match(FromGateway)}}, goTo(ARPResponder))
	add(SpoofGuard, PrioHigh, of.Match{EthType: EthTypeIPv4, Regs: []of.RegMatch{PktSource.Match(FromGateway)}}, goTo(NATLookup))
	if b.PodCIDR != nil && !b.PolicyOnly {
		// A local Pod's connection the host handed back (PolicyOnly
		// bridges have no Pod range of their own: PodFlows marks each
		// Pod's address instead).
		add(SpoofGuard, PrioHigh+1, of.Match{EthType: EthTypeIPv4, IPSrc: b.PodCIDR, Regs: []of.RegMatch{PktSource.Match(FromGateway)}},
			LocalPodViaHost.Load(1), goTo(NATLookup))
	}
	// ARP for the gateway goes to the gateway, whose kernel answers.
	if b.GatewayIP != nil {
		add(ARPResponder, PrioNormal, of.Match{EthType: EthTypeARP, ARPTPA: b.GatewayIP}, of.Output{Port: b.GatewayPort})
	}
	if b.PolicyOnly {
		// Every ARP request, from a Pod or the host, is answered with
		// the virtual MAC: L3Forwarding sets the real addresses.
		add(ARPResponder, PrioLow, of.Match{EthType: EthTypeARP, ARPOp: 1}, arpReply(nil)...)
	}
	// Conntrack.
	zone := ConntrackZone
	ctTable := uint8(ConntrackState)
	add(Conntrack, PrioHigh, of.Match{EthType: EthTypeIPv4}, of.CT{Zone: zone, Table: &ctTable, NAT: &of.CTNAT{}})
	add(ConntrackState, PrioHigh, of.Match{EthType: EthTypeIPv4, CtState: &of.CtStateMatch{Set: of.CtTrk | of.CtInv}})
	// L3Forwarding: to the gateway's own IP; anything unknown in the local
	// podCIDR is dropped; everything else leaves through the gateway.
	for _, ip := range []net.IP{b.GatewayIP, b.NodeIP} {
		if ip != nil {
			add(L3Forwarding, PrioHigh, of.Match{EthType: EthTypeIPv4, IPDst: host(ip)},
				of.SetEthDst{MAC: b.GatewayMAC}, goTo(L2Forwarding))
		}
	}
	if b.PodCIDR != nil {
		add(L3Forwarding, PrioLow, of.Match{EthType: EthTypeIPv4, IPDst: b.PodCIDR})
	}
	add(L3Forwarding, PrioLow-1, of.Match{EthType: EthTypeIPv4},
		of.SetEthDst{MAC: b.GatewayMAC}, goTo(L2Forwarding))
	// L2Forwarding to the gateway (the tunnel's come with PeerNodeFlows).
	add(L2Forwarding, PrioHigh, of.Match{EthDst: b.GatewayMAC},
		TargetOFPort.Load(b.GatewayPort), OutputResolved.Load(1), goTo(L2Forwarding.next()))
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
	return append(fs, natDetourFlows(b)...)
}

// PodFlows returns the flows of one local Pod: classification of its port,
// its spoof guard, ARP delivery to it, and L3/L2 forwarding to it. The
// Classifier flow also loads EgressIsolated=1 when p.EgressIsolated, and the
// L2Forwarding flow IngressIsolated=1 when p.IngressIsolated, so changing a
// Pod's isolation changes only those flows. With p.EgressMeter the
// Classifier flow meters the Pod's traffic before anything else, and with
// the NAT checksum detour a second one classifies the packets back from
// it without metering them again.
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
	first := classify
	if p.EgressMeter != 0 {
		first = append([]of.Action{of.Meter{ID: p.EgressMeter}}, classify...)
	}
	fs := []of.Flow{
		{Table: uint8(Classifier), Priority: PrioNormal, Cookie: ck, Match: of.Match{InPort: p.OFPort},
			Actions: first},
		{Table: uint8(SpoofGuard), Priority: PrioHigh, Cookie: ck,
			Match:   of.Match{InPort: p.OFPort, EthType: EthTypeARP, ARPSPA: ip, ARPSHA: p.MAC},
			Actions: []of.Action{goTo(ARPResponder)}},
		{Table: uint8(SpoofGuard), Priority: PrioHigh, Cookie: ck,
			Match:   of.Match{InPort: p.OFPort, EthType: EthTypeIPv4, EthSrc: p.MAC, IPSrc: host(ip)},
			Actions: []of.Action{goTo(NATLookup)}},
		{Table: uint8(L3Forwarding), Priority: PrioHigh, Cookie: ck,
			Match:   of.Match{EthType: EthTypeIPv4, IPDst: host(ip)},
			Actions: []of.Action{of.SetEthSrc{MAC: b.GatewayMAC}, of.SetEthDst{MAC: p.MAC}, goTo(L2Forwarding)}},
		{Table: uint8(L2Forwarding), Priority: PrioHigh, Cookie: ck,
			Match: of.Match{EthDst: p.MAC}, Actions: deliver},
	}
	if p.EgressMeter != 0 && b.NATChecksumDetour() {
		// The meter sees each packet once: one back from the NAT checksum
		// detour (NATChecksumDone) passed it on its first way through.
		fs = append(fs, of.Flow{Table: uint8(Classifier), Priority: PrioNormal + 1, Cookie: ck,
			Match:   of.Match{InPort: p.OFPort, Regs: []of.RegMatch{NATChecksumDone.Match(1)}},
			Actions: classify})
	}
	if b.PolicyOnly {
		// The bridge answers every ARP request itself (BaseFlows), and
		// routes between Pods as the host would: with one hop of TTL.
		// Without a Pod range of its own, it knows the Pod's packets
		// that the host hands back by their source (LocalPodViaHost).
		return append(fs,
			of.Flow{Table: uint8(L3Forwarding), Priority: PrioHigh + 1, Cookie: ck,
				Match:   of.Match{EthType: EthTypeIPv4, IPDst: host(ip), Regs: []of.RegMatch{PktSource.Match(FromPod)}},
				Actions: []of.Action{of.SetEthSrc{MAC: b.GatewayMAC}, of.SetEthDst{MAC: p.MAC}, of.DecTTL{}, goTo(L2Forwarding)}},
			of.Flow{Table: uint8(SpoofGuard), Priority: PrioHigh + 1, Cookie: ck,
				Match:   of.Match{EthType: EthTypeIPv4, IPSrc: host(ip), Regs: []of.RegMatch{PktSource.Match(FromGateway)}},
				Actions: []of.Action{LocalPodViaHost.Load(1), goTo(NATLookup)}})
	}
	return append(fs, of.Flow{Table: uint8(ARPResponder), Priority: PrioNormal, Cookie: ck,
		Match:   of.Match{EthType: EthTypeARP, ARPTPA: ip},
		Actions: []of.Action{of.Output{Port: p.OFPort}}})
}

// PeerNodeFlows returns the flows that reach a peer Node's podCIDR through
// the tunnel, and the ARP answer for its gateway (the host route to the
// peer's podCIDR points at that gateway IP). L3Forwarding addresses the
// packet to the peer's PeerMAC; L2Forwarding hands it to the tunnel as
// b.Tunnel says (with TunnelSegmented, TunnelOutput takes it from the
// segmentation port to the tunnel).
//
// Local Pods reach the peer Node's own IP through the tunnel too: the
// peer's host replies through its gateway and the tunnel (its route to our
// podCIDR), so both directions cross both bridges and their connection
// tracking sees whole connections.
func PeerNodeFlows(b Bridge, n PeerNode) []of.Flow {
	ck := Cookie(b.Round, CategoryNode, n.ID)
	peerMAC := PeerMAC(n.NodeIP)
	toPeer := []of.Action{
		of.SetEthSrc{MAC: b.GatewayMAC},
		of.SetEthDst{MAC: peerMAC},
		of.DecTTL{},
		goTo(L2Forwarding),
	}
	var deliver []of.Action
	switch b.Tunnel {
	case TunnelByMAC:
		deliver = []of.Action{TargetOFPort.Load(b.TunnelPort)}
	case TunnelSegmented:
		deliver = []of.Action{TargetOFPort.Load(b.SegmentPort)}
	default:
		deliver = []of.Action{of.SetTunDst{IP: n.NodeIP.To4()}, TargetOFPort.Load(b.TunnelPort)}
	}
	deliver = append(deliver, OutputResolved.Load(1), goTo(L2Forwarding.next()))
	flows := []of.Flow{
		{Table: uint8(ARPResponder), Priority: PrioHigh, Cookie: ck,
			Match:   of.Match{EthType: EthTypeARP, ARPOp: 1, ARPTPA: n.GatewayIP.To4()},
			Actions: arpReply(n.GatewayIP.To4())},
		{Table: uint8(L3Forwarding), Priority: PrioHigh, Cookie: ck,
			Match:   of.Match{EthType: EthTypeIPv4, IPDst: n.PodCIDR},
			Actions: toPeer},
		{Table: uint8(L3Forwarding), Priority: PrioHigh, Cookie: ck,
			Match:   of.Match{EthType: EthTypeIPv4, IPDst: host(n.NodeIP), Regs: []of.RegMatch{PktSource.Match(FromPod)}},
			Actions: toPeer},
		{Table: uint8(L2Forwarding), Priority: PrioHigh, Cookie: ck,
			Match: of.Match{EthDst: peerMAC}, Actions: deliver},
	}
	if b.Tunnel == TunnelSegmented {
		flows = append(flows,
			of.Flow{Table: uint8(TunnelOutput), Priority: PrioHigh, Cookie: ck,
				Match:   of.Match{EthDst: peerMAC},
				Actions: []of.Action{of.SetTunDst{IP: n.NodeIP.To4()}, of.Output{Port: b.TunnelPort}}},
			// A Traceflow packet is small and must keep its registers
			// (TraceTag becomes the tunnel key in Output): it goes to the
			// tunnel directly, without the segmentation detour.
			of.Flow{Table: uint8(L2Forwarding), Priority: PrioHigh + 1, Cookie: ck,
				Match: of.Match{EthDst: peerMAC, Regs: []of.RegMatch{TraceActive.Match(1)}},
				Actions: []of.Action{of.SetTunDst{IP: n.NodeIP.To4()}, TargetOFPort.Load(b.TunnelPort),
					OutputResolved.Load(1), goTo(L2Forwarding.next())}})
	}
	return flows
}

// arpReply turns an ARP request into the reply "ip is at VirtualMAC" and
// sends it back out of its in_port. A nil ip answers for the requested
// address (arp_tpa, moved to arp_spa).
func arpReply(ip net.IP) []of.Action {
	vmac := VirtualMAC()
	acts := []of.Action{
		of.Move{Src: of.FieldEthSrc, Dst: of.FieldEthDst},
		of.SetEthSrc{MAC: vmac},
		of.SetARPOp{Op: 2},
		of.Move{Src: of.FieldARPSHA, Dst: of.FieldARPTHA},
		of.SetARPSHA{MAC: vmac},
	}
	if ip == nil {
		// Swap the protocol addresses through ARPScratch.
		scratch := of.FieldReg(ARPScratch.Reg())
		return append(acts,
			of.Move{Src: of.FieldARPTPA, Dst: scratch},
			of.Move{Src: of.FieldARPSPA, Dst: of.FieldARPTPA},
			of.Move{Src: scratch, Dst: of.FieldARPSPA},
			of.Output{Port: of.PortInPort})
	}
	return append(acts,
		of.Move{Src: of.FieldARPSPA, Dst: of.FieldARPTPA},
		of.SetARPSPA{IP: ip},
		of.Output{Port: of.PortInPort})
}

// RoutedPeerNodeFlows returns the flows of a peer Node reached through the
// host's routing instead of the tunnel (trafficEncapMode noEncap, or
// hybrid for a peer in this Node's transport subnet): traffic to its
// podCIDR leaves through the gateway, and the host routes it to the peer's
// Node IP (or to the underlay's router). Same cookie as PeerNodeFlows, so
// a peer switching between the two replaces its flows in place.
func RoutedPeerNodeFlows(b Bridge, n PeerNode) []of.Flow {
	return []of.Flow{{Table: uint8(L3Forwarding), Priority: PrioHigh, Cookie: Cookie(b.Round, CategoryNode, n.ID),
		Match:   of.Match{EthType: EthTypeIPv4, IPDst: n.PodCIDR},
		Actions: []of.Action{of.SetEthDst{MAC: b.GatewayMAC}, goTo(L2Forwarding)}}}
}
