package pipeline

import (
	"net"

	of "github.com/seine-net/seine/datapath/openflow"
)

// Priorities of NetworkPolicy flows in the EgressRule/IngressRule and
// EgressDefault/IngressDefault tables. Kubernetes NetworkPolicies
// (networking.k8s.io/v1) have no order among themselves: every allow rule of
// every policy lives at one priority, the bypass of established and host
// traffic above them, the plain (single-clause) allows above the
// conjunctions so that a plain allow never shares a flow entry with a
// conjunction clause (ovs-fields(7): a flow with conjunction actions may
// have no other action).
const (
	// PrioPolicyBypass: replies, related packets, established TCP and host
	// traffic skip the policy (PolicyBaseFlows).
	PrioPolicyBypass uint16 = PrioHigh
	// PrioPolicyAllow: a rule whose only restriction is the Pod it
	// applies to (no peer and no port restriction).
	PrioPolicyAllow uint16 = PrioNormal + 5
	// PrioPolicyRule: conjunction clause flows and their conj_id flows,
	// of the first band of conjunction IDs (PolicyRulePriority).
	PrioPolicyRule uint16 = PrioNormal
	// PrioPolicyDefault: the default deny of isolated Pods (one flow per
	// direction, matching the IngressIsolated / EgressIsolated bit), in
	// the *Default tables.
	PrioPolicyDefault uint16 = PrioLow
)

// Conjunction ID bands. A flow entry that several rules share (a Pod, a
// peer address, a port) carries one conjunction action per rule, 16 bytes
// each (NXAST_CONJUNCTION), and an OpenFlow message is at most 64 KiB
// (OpenFlow 1.3 section A.1, 16-bit length): past about 4,090 rules on one
// entry the switch refuses it. So conjunction IDs come in bands of at most
// ConjBandSize live IDs, the band in the ID's top byte, and each band's
// flows live one priority below the previous band's: an entry shared
// across bands is one flow per band, none carrying more than ConjBandSize
// actions. All the flows of one conjunction share its band's priority, as
// ovs-fields(7) ("Conjunctive Match Fields") requires, and a packet whose
// conjunctions do not complete at one priority is looked up again below
// it, so every band's allows hold. Nodes with fewer than ConjBandSize
// conjunctions use the first band only.
const (
	// ConjBandSize is the number of live conjunction IDs per band:
	// 4,000 actions (64,000 bytes) leave room for the flow_mod's header,
	// match and instruction in one bundle message.
	ConjBandSize = 4000
	// ConjBands is the number of bands (priorities PrioPolicyRule down
	// to PrioPolicyRule-ConjBands+1, all above the rule tables' miss).
	ConjBands = 64
	// ConjBandShift places the band in a conjunction ID.
	ConjBandShift = 24
)

// PolicyRulePriority returns the priority of the clause and conj_id flows
// of conjunction id (PrioPolicyRule less its band); ok is false for an ID
// whose band is ConjBands or above.
func PolicyRulePriority(id uint32) (prio uint16, ok bool) {
	band := id >> ConjBandShift
	if band >= ConjBands {
		return 0, false
	}
	return PrioPolicyRule - uint16(band), true
}

// Next returns the table after t in pipeline order (t itself for the last
// table). A NetworkPolicy allow continues at EgressDefault.Next() (egress)
// or IngressDefault.Next() (ingress), skipping the default deny.
func (t Table) Next() Table { return t.next() }

// PolicyBaseFlows returns the fixed flows NetworkPolicy enforcement needs,
// cookie Cookie(b.Round, CategoryPolicy, 0):
//
//   - in EgressRule and IngressRule, tracked packets that do not start a
//     connection skip the policy tables, since only a connection's first
//     packet is subject to NetworkPolicy: replies (ct_state=-new+rpl),
//     related packets (+rel, ICMP errors) and TCP packets of established
//     connections (-new); a TCP connection is established only once the
//     far end answered. Packets of UDP, SCTP and other connections in the
//     original direction are checked again: by its source
//     (lib/conntrack-other.c), OVS's userspace connection tracker takes
//     later datagrams of a connection for established whether or not
//     anything answered, and the Service tables commit a connection before
//     the policy tables see its first packet (EndpointDNAT), so a denied
//     flow sent again and again could otherwise get past the policy;
//   - in EgressRule and IngressRule, a Pod's connection to itself through a
//     Service (ct_mark CtMarkHairpin, from a Pod port) skips the policy in
//     both directions: a Pod reaching its own IP never leaves its network
//     namespace, so no policy can see or deny it, and reaching itself
//     through a Service it backs must not depend on its own policies
//     either (a Pod selected by an ingress policy that admits only other
//     Pods would otherwise refuse itself);
//   - in IngressRule, packets from this Node itself (PktSource gateway with
//     nw_src the gateway IP or the Node IP, e.g. kubelet probes) skip the
//     ingress policy, as the Kubernetes NetworkPolicy documentation
//     requires for traffic from the Pod's own Node;
//   - in EgressDefault and IngressDefault, the default deny: an IPv4
//     packet with EgressIsolated (IngressIsolated) set, i.e. from (to) a
//     Pod that PodFlows marks as isolated, that no allow flow of the rule
//     table sent past the default table is dropped. This is one flow per
//     direction whatever the number of isolated Pods.
func PolicyBaseFlows(b Bridge) []of.Flow {
	ck := Cookie(b.Round, CategoryPolicy, 0)
	var fs []of.Flow
	for _, t := range []struct{ rule, def Table }{{EgressRule, EgressDefault}, {IngressRule, IngressDefault}} {
		for _, m := range []of.Match{
			{EthType: EthTypeIPv4, CtState: &of.CtStateMatch{Set: of.CtTrk | of.CtRpl, Clear: of.CtNew}},
			{EthType: EthTypeIPv4, CtState: &of.CtStateMatch{Set: of.CtTrk | of.CtRel}},
			{EthType: EthTypeIPv4, IPProto: 6, CtState: &of.CtStateMatch{Set: of.CtTrk, Clear: of.CtNew}},
			{EthType: EthTypeIPv4, CtState: &of.CtStateMatch{Set: of.CtTrk},
				CtMark: &of.Masked32{Value: CtMarkHairpin, Mask: CtMarkHairpin},
				Regs:   []of.RegMatch{PktSource.Match(FromPod)}},
		} {
			fs = append(fs, of.Flow{Table: uint8(t.rule), Priority: PrioPolicyBypass, Cookie: ck,
				Match: m, Actions: []of.Action{goTo(t.def.next())}})
		}
	}
	fs = append(fs, []of.Flow{
		{Table: uint8(EgressDefault), Priority: PrioPolicyDefault, Cookie: ck,
			Match: of.Match{EthType: EthTypeIPv4, Regs: []of.RegMatch{EgressIsolated.Match(1)}}}, // drop
		{Table: uint8(IngressDefault), Priority: PrioPolicyDefault, Cookie: ck,
			Match: of.Match{EthType: EthTypeIPv4, Regs: []of.RegMatch{IngressIsolated.Match(1)}}}, // drop
	}...)
	for _, ip := range []net.IP{b.GatewayIP, b.NodeIP} {
		if ip.To4() == nil {
			continue
		}
		fs = append(fs, of.Flow{Table: uint8(IngressRule), Priority: PrioPolicyBypass, Cookie: ck,
			Match: of.Match{EthType: EthTypeIPv4, IPSrc: host(ip),
				Regs: []of.RegMatch{PktSource.Match(FromGateway)}},
			Actions: []of.Action{goTo(IngressDefault.next())}})
	}
	return fs
}
