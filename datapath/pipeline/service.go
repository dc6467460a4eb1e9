package pipeline

import (
	"fmt"
	"net"
	"slices"

	of "github.com/seine-net/seine/datapath/openflow"
)

// How Services are load balanced (the tables ServiceLB, SessionAffinity
// and EndpointDNAT, between ConntrackState and EgressRule, so that
// NetworkPolicy sees the chosen endpoint):
//
//  1. ServiceLB: a connection's first packet (ct_state=+new+trk) to a
//     Service port's VIP:port gets ServicePortID. For a Service with
//     ClientIP affinity it resubmits to SessionAffinity, whose learned
//     flows load EndpointIP with the endpoint this client used last.
//  2. EndpointDNAT: with EndpointIP still 0 (or naming an endpoint that is
//     gone), the Service port's select group picks an endpoint: its bucket
//     loads EndpointIP and resubmits to EndpointDNAT. The flow of that
//     endpoint then learns the affinity (if any) and runs
//     ct(commit,nat(dst=endpoint)) in the Pod zone, recirculating to
//     EgressRule with the rewritten destination. Later packets of the
//     connection are un-NATed/re-NATed by the Conntrack table's ct(nat)
//     and never reach the group again, so they stick to their endpoint
//     whatever happens to the endpoint set.
//  3. Hairpin: when the client is the endpoint itself, the DNAT commit
//     also sets CtMarkHairpin; ConntrackCommit then SNATs the connection
//     to ServiceHairpinIP in the zone ServiceSNATZone, and replies to that
//     address are un-SNATed by a Conntrack flow before the Pod zone's
//     ct(nat) un-DNATs them.
//  4. External frontends (NodePort, externalIPs, LoadBalancer ingress IPs)
//     match only packets the host handed over through the gateway: the
//     host DNATs NodeIP:nodePort to NodePortVIP:nodePort and routes
//     externalIPs and LoadBalancer IPs to the gateway (node/proxy). Their
//     DNAT commit sets CtMarkExternal, and replies of such connections are
//     sent back to the host (L3Forwarding), whose conntrack undoes its
//     own DNAT. With externalTrafficPolicy Cluster the commit also sets
//     CtMarkServiceSNAT: ConntrackCommit then SNATs the connection to the
//     Node's gateway IP in ServiceSNATZone, so that an endpoint on another
//     Node answers through this one; a Conntrack flow un-SNATs replies to
//     the gateway IP before the Pod zone un-DNATs them.
//  5. Host SNAT: a connection that entered from the gateway (the host's
//     own, or NodePort, externalIPs and LoadBalancer traffic) and whose
//     endpoint the host reaches itself (TargetOFPort is the gateway: a
//     peer routed without the tunnel, a host-network endpoint) would come
//     back to the host with an address the host owns or does not route
//     back here. So ConntrackCommit sets CtMarkHostSNAT and SNATs it to
//     ServiceHostSNATIP in ServiceSNATZone, and the packet goes back out
//     of the gateway (HairpinOut). The host masquerades ServiceHostSNATIP
//     to the Node IP on its way out and routes replies to it into the
//     bridge, where a Conntrack flow un-SNATs them before the Pod zone
//     un-DNATs them; they too leave through the gateway they came in by.
//  6. A Service port without endpoints has no group: its ServiceLB flow
//     commits the connection (so that the answer is not ct_state=+inv)
//     and hands the packet to the host through the gateway, where the
//     node's nftables rejects it (TCP RST, ICMP port unreachable).

// ServiceHairpinIP is the source address given to a Pod's connection to
// itself through a Service. It is link-local (RFC 3927) so that it never
// collides with a cluster address; Pods reply to it through their
// default route, the gateway.
var ServiceHairpinIP = net.IPv4(169, 254, 100, 1).To4()

// ServiceHostSNATIP is the source given to Service connections that enter
// from the gateway and leave through it again (see item 5 above). It is
// link-local (RFC 3927) like ServiceHairpinIP: the host routes it to the
// gateway (a permanent neighbour entry names VirtualMAC) and masquerades
// it when it leaves the Node.
var ServiceHostSNATIP = net.IPv4(169, 254, 100, 3).To4()

// ServiceSNATZone is the conntrack zone of every Service SNAT: hairpin,
// external frontends and ServiceHostSNATIP (a second NAT on a connection
// needs a zone of its own, ovs-actions(7) "ct").
const ServiceSNATZone uint16 = 65521

// The ct_mark bits of Service connections (zone ConntrackZone).
const (
	// CtMarkHairpin: the client is its own endpoint.
	CtMarkHairpin uint32 = 1 << 0
	// CtMarkExternal: the connection came in through an external frontend
	// (from the host); its replies go back to the host.
	CtMarkExternal uint32 = 1 << 1
	// CtMarkServiceSNAT: the connection is SNATed to the gateway IP
	// (externalTrafficPolicy Cluster).
	CtMarkServiceSNAT uint32 = 1 << 2
	// CtMarkFromGateway: the connection entered the bridge from the
	// gateway; its replies go back there (BaseFlows).
	CtMarkFromGateway uint32 = 1 << 3
	// CtMarkHostSNAT: the connection entered from the gateway, was DNATed
	// to an endpoint behind the gateway and SNATed to ServiceHostSNATIP;
	// both directions hairpin on the gateway port.
	CtMarkHostSNAT uint32 = 1 << 4
	// CtMarkNAT: conntrack NATs the connection (set by its DNAT commit
	// on bridges with the NAT checksum detour). Its packets have their
	// headers saved before conntrack (SaveHeaders).
	CtMarkNAT uint32 = 1 << 5
	// CtMarkNoNAT: conntrack does not NAT the connection (set by its
	// commit in ConntrackCommit on bridges with the NAT checksum detour).
	// Its packets skip saving and the Conntrack table's ct(nat).
	CtMarkNoNAT uint32 = 1 << 6
)

// NodePortVIP is the address the host DNATs NodePort traffic to before
// handing it to the bridge, and the next hop of the host routes that send
// externalIPs and LoadBalancer IPs to the gateway (with a permanent
// neighbour entry naming VirtualMAC, so the host never ARPs for it). It
// is link-local (RFC 3927), like ServiceHairpinIP.
var NodePortVIP = net.IPv4(169, 254, 100, 2).To4()

// DefaultLocalVIPAliasCIDR is the default range (proxy.localVIPAliasCIDR)
// of the link-local aliases the host DNATs an externalIP or LoadBalancer
// IP to while it is a local address of the Node (node/proxy,
// MapLocalVIPAliases), one per IP: 16,382. It stays clear of the
// addresses clouds and Kubernetes add-ons use in 169.254.0.0/16
// (169.254.169.254, 169.254.170.2, NodeLocal DNSCache's 169.254.20.10) and
// of ServiceHairpinIP, NodePortVIP and ServiceHostSNATIP.
const DefaultLocalVIPAliasCIDR = "169.254.192.0/18"

// ReservedLinkLocal are the link-local addresses a range of aliases must
// leave out: the bridge's own Service addresses and the cloud metadata
// address (169.254.169.254).
func ReservedLinkLocal() []net.IP {
	return []net.IP{ServiceHairpinIP, NodePortVIP, ServiceHostSNATIP, net.IPv4(169, 254, 169, 254).To4()}
}

// MaxBucketsPerGroup is the number of buckets one group message carries at
// most. A bucket here is 56 bytes (16-byte header, 24-byte load, 16-byte
// resubmit) and OpenFlow messages are at most 64 KiB (OpenFlow 1.3 section
// A.1, 16-bit length), so 1,000 buckets (56,016 bytes with the header)
// leave headroom. Larger endpoint sets are split over second-level groups.
const MaxBucketsPerGroup = 1000

// MaxServicePortID bounds ServicePort.ID: the top byte of a group ID is
// the index of a second-level group.
const MaxServicePortID = 1<<24 - 1

// ServiceEndpoint is one endpoint of a Service port.
type ServiceEndpoint struct {
	IP   net.IP
	Port uint16
	// Local: the endpoint is a Pod of this Node (hairpin is possible).
	Local bool
}

// ServiceAction is what a Service port does with a new connection.
type ServiceAction int

const (
	// ServiceBalance sends it to one of Endpoints (which must not be empty).
	ServiceBalance ServiceAction = iota
	// ServiceReject hands it to the host, which rejects it.
	ServiceReject
	// ServiceDrop drops it (e.g. internalTrafficPolicy Local with no
	// local endpoint, as Kubernetes documents for that case).
	ServiceDrop
)

// ServicePort is one port of one Service as the datapath sees it.
type ServicePort struct {
	// ID is unique among the Node's Service ports, 1..MaxServicePortID; it
	// is the group ID, the ServicePortID register value and the cookie's
	// object ID.
	ID uint32
	// VIPs are the addresses the port answers on (the ClusterIP).
	VIPs []net.IP
	// Protocol is the IP protocol number: 6 TCP, 17 UDP, 132 SCTP.
	Protocol uint8
	Port     uint16
	Action   ServiceAction
	// Endpoints receive new connections (ServiceBalance only).
	Endpoints []ServiceEndpoint
	// AffinitySeconds > 0 enables ClientIP session affinity for that long
	// after a client's last new connection.
	AffinitySeconds uint16
	// AffinityID is the ID under which the port's clients are remembered
	// (ClientIP affinity): one ID for all the frontends of a Service port
	// (its internal frontend's), so that a client keeps its endpoint
	// whichever of the port's addresses it connects to, as kube-proxy
	// keeps it per Service port. 0 means ID. The learned flows carry that
	// ID's cookie.
	AffinityID uint32
	// External makes this an external frontend: it only matches packets
	// from the gateway, takes precedence over a frontend without External
	// on the same VIP and port, and its replies return to the host.
	External bool
	// SNAT (External only) makes new connections leave with the gateway
	// IP as their source (externalTrafficPolicy Cluster).
	SNAT bool
	// FragmentVIPs (UDP, not External) are VIPs of which this is the only
	// UDP port: they take the fragments of new datagrams too. A datagram
	// larger than the path MTU arrives in IP fragments, and under OVS's
	// default fragment handling ("normal", ovs-ofctl(8) set-frags) no
	// fragment matches udp_dst: the lookup sees its ports as 0. The
	// kernel datapath hands the pipeline the datagram conntrack
	// reassembled, so this never matters there. The userspace datapath
	// reassembles it for conntrack only and goes on with the fragments
	// (OVS lib/ipf.c), which share the connection's ct_state but not its
	// ports (OVS sets ct_tp_dst only on a first fragment). So fragments
	// are matched on the VIP alone, which names one Service port only
	// when the Service has one UDP port. They may pick different buckets
	// (the group hashes the real ports of a first fragment and zeros for
	// the others), but each ends in a ct(commit,nat) of the same zone, and
	// the datagram is reassembled, NATed and sent on at the one that sees
	// its last fragment, so all of it reaches one endpoint. The caller
	// must not name a VIP here for two ports (ClusterIPs are the
	// Service's own; externalIPs may be shared, so leave them out).
	FragmentVIPs []net.IP
	// Sources, when set (External only), limit the frontend to packets
	// from these addresses (IPv4 prefixes), and it takes precedence over
	// the frontend of the same VIP and port without Sources. It carries
	// the Node's own connections (LocalPods adds its Pods') to a frontend
	// whose externalTrafficPolicy is Local: Kubernetes sends those to every
	// endpoint, not only the Node's own (kube-proxy's "short-circuit" of
	// locally originated traffic).
	Sources []*net.IPNet
	// LocalPods (External only) adds this Node's Pods to Sources: the
	// packets the host handed back with a local Pod's source address
	// (LocalPodViaHost), a Pod's connection to the Node's own NodePort,
	// externalIP or LoadBalancer IP. kube-proxy short-circuits these too.
	LocalPods bool
	// SourceRanges, when set, admit new connections from these ranges
	// only; the frontend drops those from anywhere else, and they reach
	// no other frontend of the VIP and port (a Service's
	// loadBalancerSourceRanges on its LoadBalancer IPs, as kube-proxy
	// enforces them). With Sources too, Sources alone decide (the caller
	// keeps only the sources the ranges admit).
	SourceRanges []*net.IPNet
}

// ServiceBaseFlows returns the fixed flows of the Service tables, cookie
// Cookie(b.Round, CategoryService, 0): non-Service packets skip to
// EgressRule, SessionAffinity returns nothing when no affinity is
// learned, and the hairpin SNAT and un-SNAT.
func ServiceBaseFlows(b Bridge) []of.Flow {
	ck := Cookie(b.Round, CategoryService, 0)
	snatTable := uint8(Output)
	backTo := uint8(Conntrack)
	// Without a gateway IP (PolicyOnly) every SNATed external connection
	// takes ServiceHostSNATIP: the host routes it back into the bridge.
	snatIP := ServiceHostSNATIP
	if b.GatewayIP != nil {
		snatIP = b.GatewayIP.To4()
	}
	fs := []of.Flow{
		{Table: uint8(ServiceLB), Priority: PrioDefault + 1, Cookie: ck, Actions: []of.Action{goTo(EgressRule)}},
		{Table: uint8(SessionAffinity), Priority: PrioDefault + 1, Cookie: ck}, // return from resubmit
		{Table: uint8(Conntrack), Priority: PrioHigh + 10, Cookie: ck,
			Match:   of.Match{EthType: EthTypeIPv4, IPDst: host(ServiceHairpinIP)},
			Actions: []of.Action{of.CT{Zone: ServiceSNATZone, Table: &backTo, NAT: &of.CTNAT{}}}},
		{Table: uint8(ConntrackCommit), Priority: PrioHigh + 10, Cookie: ck,
			Match: of.Match{EthType: EthTypeIPv4, CtState: &of.CtStateMatch{Set: of.CtTrk, Clear: of.CtRpl},
				CtMark: &of.Masked32{Value: CtMarkHairpin, Mask: CtMarkHairpin}},
			Actions: []of.Action{HairpinOut.Load(1), of.CT{Commit: true, Zone: ServiceSNATZone, Table: &snatTable,
				NAT: &of.CTNAT{SNAT: true, IPMin: ServiceHairpinIP}}}},
		{Table: uint8(ConntrackCommit), Priority: PrioHigh + 10, Cookie: ck,
			Match: of.Match{EthType: EthTypeIPv4, CtState: &of.CtStateMatch{Set: of.CtTrk | of.CtRpl},
				CtMark: &of.Masked32{Value: CtMarkHairpin, Mask: CtMarkHairpin}},
			Actions: []of.Action{HairpinOut.Load(1), goTo(Output)}},
		{Table: uint8(Output), Priority: PrioHigh + 10, Cookie: ck,
			Match:   of.Match{Regs: Regs(OutputResolved.Match(1), HairpinOut.Match(1))},
			Actions: []of.Action{of.Output{Port: of.PortInPort}}},
		// External frontends: un-SNAT replies to the SNAT address (only
		// untracked packets, so the recirculated one moves on), SNAT new
		// connections, and send replies back to the host.
		{Table: uint8(ConntrackCommit), Priority: PrioHigh + 5, Cookie: ck,
			Match: of.Match{EthType: EthTypeIPv4, CtState: &of.CtStateMatch{Set: of.CtTrk, Clear: of.CtRpl},
				CtMark: &of.Masked32{Value: CtMarkServiceSNAT, Mask: CtMarkServiceSNAT}},
			Actions: []of.Action{of.CT{Commit: true, Zone: ServiceSNATZone, Table: &snatTable,
				NAT: &of.CTNAT{SNAT: true, IPMin: snatIP}}}},
		{Table: uint8(L3Forwarding), Priority: PrioHigh + 10, Cookie: ck,
			Match: of.Match{EthType: EthTypeIPv4, CtState: &of.CtStateMatch{Set: of.CtTrk | of.CtRpl},
				CtMark: &of.Masked32{Value: CtMarkExternal, Mask: CtMarkExternal}},
			Actions: []of.Action{of.SetEthSrc{MAC: b.GatewayMAC}, of.SetEthDst{MAC: b.GatewayMAC}, goTo(L2Forwarding)}},
		// Host SNAT (item 5): a new connection from the gateway, DNATed
		// (EndpointSelected) to an endpoint behind the gateway; its later
		// packets; its replies.
		{Table: uint8(ConntrackCommit), Priority: PrioHigh + 20, Cookie: ck,
			Match: of.Match{EthType: EthTypeIPv4, CtState: &of.CtStateMatch{Set: of.CtTrk | of.CtNew},
				Regs: Regs(PktSource.Match(FromGateway), TargetOFPort.Match(b.GatewayPort), EndpointSelected.Match(1))},
			Actions: []of.Action{HairpinOut.Load(1),
				of.CT{Commit: true, Zone: ConntrackZone, SetMark: &of.Masked32{
					Value: CtMarkHostSNAT | CtMarkFromGateway, Mask: CtMarkHostSNAT | CtMarkFromGateway}},
				of.CT{Commit: true, Zone: ServiceSNATZone, Table: &snatTable,
					NAT: &of.CTNAT{SNAT: true, IPMin: ServiceHostSNATIP}}}},
		{Table: uint8(ConntrackCommit), Priority: PrioHigh + 20, Cookie: ck,
			Match: of.Match{EthType: EthTypeIPv4, CtState: &of.CtStateMatch{Set: of.CtTrk, Clear: of.CtNew | of.CtRpl},
				CtMark: &of.Masked32{Value: CtMarkHostSNAT, Mask: CtMarkHostSNAT}},
			Actions: []of.Action{HairpinOut.Load(1), of.CT{Commit: true, Zone: ServiceSNATZone, Table: &snatTable,
				NAT: &of.CTNAT{SNAT: true, IPMin: ServiceHostSNATIP}}}},
		{Table: uint8(ConntrackCommit), Priority: PrioHigh + 20, Cookie: ck,
			Match: of.Match{EthType: EthTypeIPv4, CtState: &of.CtStateMatch{Set: of.CtTrk | of.CtRpl},
				CtMark: &of.Masked32{Value: CtMarkHostSNAT, Mask: CtMarkHostSNAT}},
			Actions: []of.Action{HairpinOut.Load(1), goTo(Output)}},
	}
	unSNAT := []net.IP{ServiceHostSNATIP}
	if b.GatewayIP != nil {
		unSNAT = append(unSNAT, b.GatewayIP.To4())
	}
	for _, ip := range unSNAT {
		fs = append(fs, of.Flow{Table: uint8(Conntrack), Priority: PrioHigh + 10, Cookie: ck,
			Match:   of.Match{EthType: EthTypeIPv4, IPDst: host(ip), CtState: &of.CtStateMatch{Clear: of.CtTrk}},
			Actions: []of.Action{of.CT{Zone: ServiceSNATZone, Table: &backTo, NAT: &of.CTNAT{}}}})
	}
	return fs
}

// FrontendKind is what a Service port's ServiceLB flows match beside its
// VIPs and port, which sets their priorities: several frontends may share
// a VIP and port, one of each kind.
type FrontendKind uint8

const (
	// FrontendInternal: packets from Pods (and, from the gateway, the
	// host's own), at PrioNormal (±1: the reject from the gateway, the
	// drop of sources outside SourceRanges).
	FrontendInternal FrontendKind = iota
	// FrontendExternal (External): packets the host handed over through
	// the gateway, at PrioHigh (PrioHigh-1: the drop of sources outside
	// SourceRanges).
	FrontendExternal
	// FrontendSourced (External with Sources or LocalPods): those of
	// them from the listed sources or the Node's Pods, at PrioHigh+2.
	FrontendSourced
)

// Kind returns sp's frontend kind.
func (sp ServicePort) Kind() FrontendKind {
	switch {
	case sp.External && (len(sp.Sources) > 0 || sp.LocalPods):
		return FrontendSourced
	case sp.External:
		return FrontendExternal
	}
	return FrontendInternal
}

// FrontendKindOf returns the kind of the frontend a ServiceLB flow of
// priority prio belongs to (see FrontendKind).
func FrontendKindOf(prio uint16) FrontendKind {
	switch {
	case prio >= PrioHigh+2:
		return FrontendSourced
	case prio >= PrioHigh-1:
		return FrontendExternal
	}
	return FrontendInternal
}

// ServiceOwner is the flowsync owner name of a Service port's flows.
func ServiceOwner(id uint32) string { return fmt.Sprintf("svc/%d", id) }

// ServicePortFlows returns the flows and groups of one Service port. The
// groups must be installed before the flows (flows name them) and removed
// after. Groups are returned top-level first.
func ServicePortFlows(b Bridge, sp ServicePort) ([]of.Flow, []of.GroupEntry, error) {
	if sp.ID == 0 || sp.ID > MaxServicePortID {
		return nil, nil, fmt.Errorf("service port id %d outside 1..%d", sp.ID, MaxServicePortID)
	}
	switch sp.Protocol {
	case 6, 17, 132:
	default:
		return nil, nil, fmt.Errorf("service port %d: unsupported protocol %d", sp.ID, sp.Protocol)
	}
	if sp.AffinityID > MaxServicePortID {
		return nil, nil, fmt.Errorf("service port %d: affinity id %d outside 1..%d", sp.ID, sp.AffinityID, MaxServicePortID)
	}
	if sp.Action == ServiceBalance && len(sp.Endpoints) == 0 {
		return nil, nil, fmt.Errorf("service port %d: balancing over no endpoints", sp.ID)
	}
	ck := Cookie(b.Round, CategoryService, uint64(sp.ID))
	newConn := &of.CtStateMatch{Set: of.CtTrk | of.CtNew}
	var fs []of.Flow
	var lbActs []of.Action
	switch sp.Action {
	case ServiceBalance:
		lbActs = append(lbActs, ServicePortID.Load(sp.ID))
		if sp.AffinitySeconds > 0 {
			lbActs = append(lbActs, AffinityKey.Load(affinityID(sp)), of.Resubmit{Table: uint8(SessionAffinity)})
		}
		lbActs = append(lbActs, goTo(EndpointDNAT))
	case ServiceReject:
		lbActs = toHostForReject(b, sp.External)
	case ServiceDrop:
	}
	// The priorities of the kinds: FrontendKindOf reads them back.
	lbPrio := PrioNormal
	var lbRegs []of.RegMatch
	if sp.External {
		lbPrio, lbRegs = PrioHigh, []of.RegMatch{PktSource.Match(FromGateway)}
	}
	sources := []*net.IPNet{nil}
	ranged := false // sources are SourceRanges: the others are dropped
	switch {
	case sp.Kind() == FrontendSourced:
		sources = sources[:0]
		for _, src := range sp.Sources {
			if src.IP.To4() != nil {
				sources = append(sources, &net.IPNet{IP: src.IP.To4().Mask(src.Mask), Mask: src.Mask})
			}
		}
		lbPrio = PrioHigh + 2
	case len(sp.SourceRanges) > 0:
		sources = sources[:0]
		for _, r := range sp.SourceRanges {
			if r.IP.To4() != nil {
				sources = append(sources, &net.IPNet{IP: r.IP.To4().Mask(r.Mask), Mask: r.Mask})
			}
		}
		ranged = true
	}
	for _, vip := range sp.VIPs {
		if vip.To4() == nil {
			continue
		}
		if sp.Kind() == FrontendSourced && sp.LocalPods {
			fs = append(fs, of.Flow{Table: uint8(ServiceLB), Priority: lbPrio, Cookie: ck,
				Match: of.Match{EthType: EthTypeIPv4, IPDst: host(vip), IPProto: sp.Protocol,
					L4Dst: &of.PortMatch{Port: sp.Port}, CtState: newConn, Regs: Regs(append(slices.Clip(lbRegs), LocalPodViaHost.Match(1))...)},
				Actions: lbActs})
		}
		for _, src := range sources {
			fs = append(fs, of.Flow{Table: uint8(ServiceLB), Priority: lbPrio, Cookie: ck,
				Match: of.Match{EthType: EthTypeIPv4, IPSrc: src, IPDst: host(vip), IPProto: sp.Protocol,
					L4Dst: &of.PortMatch{Port: sp.Port}, CtState: newConn, Regs: lbRegs},
				Actions: lbActs})
			if sp.Action == ServiceReject && !sp.External {
				// Connections the host forwards in enter from the
				// gateway, and go back to it to be rejected (the host
				// rejects its own before they leave, node/proxy).
				fs = append(fs, of.Flow{Table: uint8(ServiceLB), Priority: lbPrio + 1, Cookie: ck,
					Match: of.Match{EthType: EthTypeIPv4, IPSrc: src, IPDst: host(vip), IPProto: sp.Protocol,
						L4Dst: &of.PortMatch{Port: sp.Port}, CtState: newConn, Regs: []of.RegMatch{PktSource.Match(FromGateway)}},
					Actions: toHostForReject(b, true)})
			}
		}
		if ranged {
			// One priority below the admitted ranges: a new connection
			// from elsewhere is dropped. The caller gives the VIP no
			// other frontend of the same registers below this one (the
			// proxy keeps LoadBalancer IPs with ranges out of the
			// internal and external frontends), so nothing else takes
			// it; the external frontend's drop (PrioHigh-1, from the
			// gateway) also keeps the gateway's packets from the
			// internal one at PrioNormal.
			fs = append(fs, of.Flow{Table: uint8(ServiceLB), Priority: lbPrio - 1, Cookie: ck,
				Match: of.Match{EthType: EthTypeIPv4, IPDst: host(vip), IPProto: sp.Protocol,
					L4Dst: &of.PortMatch{Port: sp.Port}, CtState: newConn, Regs: lbRegs}})
		}
	}
	if sp.Protocol == 17 && !sp.External {
		// Fragments of a new datagram (see FragmentVIPs).
		frag := &of.FragMatch{Value: of.FragAny, Mask: of.FragAny}
		for _, vip := range sp.FragmentVIPs {
			if vip.To4() == nil {
				continue
			}
			fs = append(fs, of.Flow{Table: uint8(ServiceLB), Priority: lbPrio, Cookie: ck,
				Match:   of.Match{EthType: EthTypeIPv4, IPDst: host(vip), IPProto: sp.Protocol, Frag: frag, CtState: newConn},
				Actions: lbActs})
			if sp.Action == ServiceReject {
				fs = append(fs, of.Flow{Table: uint8(ServiceLB), Priority: lbPrio + 1, Cookie: ck,
					Match: of.Match{EthType: EthTypeIPv4, IPDst: host(vip), IPProto: sp.Protocol, Frag: frag, CtState: newConn,
						Regs: []of.RegMatch{PktSource.Match(FromGateway)}},
					Actions: toHostForReject(b, true)})
			}
		}
	}
	var mark uint32
	if sp.External {
		mark = CtMarkExternal
		if sp.SNAT {
			mark |= CtMarkServiceSNAT
		}
	}
	if sp.Action != ServiceBalance {
		return fs, nil, nil
	}
	// Fallback to the group: no endpoint chosen yet, or a learned one
	// that is gone or that this frontend does not balance to.
	fs = append(fs, of.Flow{Table: uint8(EndpointDNAT), Priority: PrioLow, Cookie: ck,
		Match:   of.Match{EthType: EthTypeIPv4, Regs: []of.RegMatch{ServicePortID.Match(sp.ID)}},
		Actions: []of.Action{of.Group{ID: sp.ID}}})
	egress := uint8(EgressRule)
	seen := map[string]bool{}
	var eps []ServiceEndpoint
	for _, ep := range sp.Endpoints {
		ip := ep.IP.To4()
		if ip == nil || seen[ip.String()] {
			continue
		}
		seen[ip.String()] = true
		eps = append(eps, ep)
		v := ipToU32(ip)
		dnat := func(hairpin bool) []of.Action {
			var acts []of.Action
			if sp.AffinitySeconds > 0 {
				acts = append(acts, affinityLearn(b, sp))
			}
			ct := of.CT{Commit: true, Zone: ConntrackZone, Table: &egress,
				NAT: &of.CTNAT{DNAT: true, IPMin: ip, PortMin: ep.Port}}
			m, mask := mark, CtMarkHairpin|CtMarkExternal|CtMarkServiceSNAT
			if hairpin {
				m |= CtMarkHairpin
			}
			if save := saveHeaders(b, sp.Protocol); save != nil {
				// The packet is still as it entered: its headers are
				// saved here, the only place a new connection is NATed.
				acts = append(acts, save...)
				// CtMarkNoNAT is cleared, so the two marks never both
				// hold: a connection committed before its Service's
				// flows existed (unanswered UDP) may come by here.
				m, mask = m|CtMarkNAT, mask|CtMarkNAT|CtMarkNoNAT
			}
			if m != 0 {
				ct.SetMark = &of.Masked32{Value: m, Mask: mask}
			}
			return append(acts, EndpointSelected.Load(1), NATApplied.Load(1), ct)
		}
		regs := []of.RegMatch{ServicePortID.Match(sp.ID), EndpointIP.Match(v)}
		fs = append(fs, of.Flow{Table: uint8(EndpointDNAT), Priority: PrioNormal, Cookie: ck,
			Match: of.Match{EthType: EthTypeIPv4, IPProto: sp.Protocol, Regs: regs}, Actions: dnat(false)})
		if ep.Local && !sp.External {
			fs = append(fs, of.Flow{Table: uint8(EndpointDNAT), Priority: PrioHigh, Cookie: ck,
				Match: of.Match{EthType: EthTypeIPv4, IPProto: sp.Protocol, IPSrc: host(ip), Regs: regs}, Actions: dnat(true)})
		}
	}
	groups := serviceGroups(sp.ID, eps)
	if sel := selectionFor(sp); sel != nil {
		for i := range groups {
			s := *sel
			s.Param = uint64(i)
			groups[i].Selection = &s
		}
	}
	return fs, groups, nil
}

// toHostForReject commits a new connection (so the host's answer is not
// ct_state=+inv) and hands it to the host, which rejects it. fromGateway:
// the packet entered from the gateway, and OpenFlow drops an output to
// the ingress port unless it is output:in_port.
func toHostForReject(b Bridge, fromGateway bool) []of.Action {
	out := of.Output{Port: b.GatewayPort}
	if fromGateway {
		out = of.Output{Port: of.PortInPort}
	}
	return []of.Action{of.CT{Commit: true, Zone: ConntrackZone}, of.SetEthDst{MAC: b.GatewayMAC}, out}
}

// selectionFor returns the selection method of a Service port's groups, nil
// for OVS's default. The default (dp_hash over the symmetric L4 hash)
// leaves UDP ports out, so all UDP flows between two addresses would pick
// one endpoint; and it lets one datapath flow pick endpoints for many
// connections, which can outrun a just-learned ClientIP affinity flow
// until OVS revalidates. Hashing the 5-tuple in the slow path ("hash")
// fixes both, at the cost of one upcall per new connection, so it is used
// for UDP and for ClientIP affinity only.
func selectionFor(sp ServicePort) *of.Selection {
	if sp.Protocol != 17 && sp.AffinitySeconds == 0 {
		return nil
	}
	fields := []of.HashField{of.HashIPv4Src, of.HashIPv4Dst, of.HashIPProto}
	switch sp.Protocol {
	case 6:
		fields = append(fields, of.HashTCPSrc, of.HashTCPDst)
	case 17:
		fields = append(fields, of.HashUDPSrc, of.HashUDPDst)
	case 132:
		fields = append(fields, of.HashSCTPSrc, of.HashSCTPDst)
	}
	return &of.Selection{Method: "hash", Fields: fields}
}

// serviceGroups builds the select group of a Service port: one bucket per
// endpoint, or, past MaxBucketsPerGroup, a top group whose buckets jump to
// second-level groups (IDs id | k<<24, k = 1..) of nearly equal size, each
// weighted by its size.
func serviceGroups(id uint32, eps []ServiceEndpoint) []of.GroupEntry {
	buckets := make([]of.Bucket, len(eps))
	for i, ep := range eps {
		buckets[i] = of.Bucket{Actions: []of.Action{
			EndpointIP.Load(ipToU32(ep.IP.To4())),
			of.Resubmit{Table: uint8(EndpointDNAT)},
		}}
	}
	if len(buckets) <= MaxBucketsPerGroup {
		return []of.GroupEntry{{ID: id, Type: of.GroupSelect, Buckets: buckets}}
	}
	n := (len(buckets) + MaxBucketsPerGroup - 1) / MaxBucketsPerGroup
	top := of.GroupEntry{ID: id, Type: of.GroupSelect}
	var subs []of.GroupEntry
	for k := 0; k < n; k++ {
		lo, hi := k*len(buckets)/n, (k+1)*len(buckets)/n
		sub := of.GroupEntry{ID: SubGroupID(id, k), Type: of.GroupSelect, Buckets: buckets[lo:hi]}
		subs = append(subs, sub)
		top.Buckets = append(top.Buckets, of.Bucket{Weight: uint16(hi - lo), Actions: []of.Action{of.Group{ID: sub.ID}}})
	}
	return append([]of.GroupEntry{top}, subs...)
}

// SubGroupID is the ID of the k-th (0-based) second-level group of the
// Service port id.
func SubGroupID(id uint32, k int) uint32 { return id | uint32(k+1)<<24 }

// affinityID is the AffinityKey value of sp's clients.
func affinityID(sp ServicePort) uint32 {
	if sp.AffinityID != 0 {
		return sp.AffinityID
	}
	return sp.ID
}

// affinityLearn is the learn action remembering, for AffinitySeconds after
// the client's last new connection, which endpoint (EndpointIP) this client
// (nw_src) got from the Service port (AffinityKey): every frontend of the
// port (ClusterIP, externalIPs, NodePort, LoadBalancer IPs) shares it. An
// endpoint it names that a frontend does not balance to (an
// externalTrafficPolicy Local frontend and a remote endpoint) has no
// EndpointDNAT flow there, and that frontend's group chooses instead; the
// endpoint so chosen is then learned in its place, for the whole port.
func affinityLearn(b Bridge, sp ServicePort) of.Learn {
	ep, key := EndpointIP, AffinityKey
	return of.Learn{Table: uint8(SessionAffinity), Priority: PrioNormal, HardTimeout: sp.AffinitySeconds,
		Cookie: Cookie(b.Round, CategoryService, uint64(affinityID(sp))),
		Specs: []of.LearnSpec{
			{Kind: of.LearnMatchValue, Dst: of.LearnEthType, Value: uint64(EthTypeIPv4)},
			{Kind: of.LearnMatchField, Dst: of.LearnIPSrc},
			{Kind: of.LearnMatchValue, Dst: of.LearnReg(key.Reg()), DstOfs: key.Ofs(), NBits: key.NBits(), Value: uint64(affinityID(sp))},
			{Kind: of.LearnLoadField, Src: of.LearnReg(ep.Reg()), Dst: of.LearnReg(ep.Reg()),
				SrcOfs: ep.Ofs(), DstOfs: ep.Ofs(), NBits: ep.NBits()},
		}}
}

func ipToU32(ip net.IP) uint32 {
	ip = ip.To4()
	return uint32(ip[0])<<24 | uint32(ip[1])<<16 | uint32(ip[2])<<8 | uint32(ip[3])
}
