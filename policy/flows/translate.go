// Package flows translates computed NetworkPolicies (controlplane.seine.io
// v1alpha1) into the OpenFlow flows that enforce them on one Node, with
// conjunctive matches (ovs-fields(7), "Conjunctive Match Fields"). It is
// pure: the agent (policy/agent) feeds it its caches and installs what it
// returns.
//
// Semantics are those of networking.k8s.io/v1 NetworkPolicy:
//
//   - a Pod is isolated for ingress (egress) once a policy that selects it
//     lists Ingress (Egress) in its policyTypes; isolated Pods only accept
//     (send) what some rule of some such policy allows; rules add up;
//   - the default deny of isolated Pods is not part of a policy's flows:
//     Translate reports the policy's Targets and the directions it
//     isolates (Policy.Ingress, Policy.Egress), the agent takes the union
//     over all policies per Pod and has the Pod's own flows mark its
//     packets (pipeline.Pod IngressIsolated / EgressIsolated), and one
//     fixed flow per direction (pipeline.PolicyBaseFlows) drops marked
//     packets that no allow flow let through. A policy therefore costs
//     nothing per target Pod beyond its rules' Pod clause flows;
//   - egress is enforced on the source Pod's Node, in EgressRule /
//     EgressDefault, the Pod matched by in_port; ingress on the destination
//     Pod's Node, in IngressRule / IngressDefault, the Pod matched by the
//     output port register (pipeline.TargetOFPort);
//   - a connection's first packet is checked, and every packet of a
//     connectionless flow (UDP, SCTP) in its original direction; replies,
//     related packets and established TCP pass (pipeline.PolicyBaseFlows),
//     and traffic from the Node itself is never subject to ingress policy.
//
// One rule becomes one conjunction: a clause of Pod flows, a clause of peer
// flows (nw_src for ingress, nw_dst for egress) unless the rule allows every
// peer, and a clause of port flows unless it allows every port. It costs
// |pods| + |peers| + |ports| + 1 flows, and flows with the same table,
// priority and match carry the conjunction actions of every rule using
// them. A rule restricted by nothing but its Pods becomes one plain allow
// flow per Pod. Named ports split a rule into one conjunction per resolved
// (protocol, port).
package flows

import (
	"fmt"
	"net"
	"slices"
	"sort"
	"strings"

	of "github.com/seine-net/seine/datapath/openflow"
	"github.com/seine-net/seine/datapath/pipeline"
	"github.com/seine-net/seine/policy/apis/controlplane/v1alpha1"
	"k8s.io/apimachinery/pkg/util/intstr"
)

// IP protocol numbers (IANA "Assigned Internet Protocol Numbers").
const (
	ProtoTCP  uint8 = 6
	ProtoUDP  uint8 = 17
	ProtoSCTP uint8 = 132
)

// Pod is a local Pod attached to the bridge.
type Pod struct {
	Namespace, Name string
	OFPort          uint32
	IP              net.IP
}

// Key is "namespace/name".
func (p Pod) Key() string { return p.Namespace + "/" + p.Name }

// Source is the state the translation of one policy reads.
type Source interface {
	// AppliedTo returns the members of this Node's part of the
	// AppliedToGroup with the given group key (nil if none is known).
	AppliedTo(group string) []v1alpha1.GroupMember
	// AddressGroup returns the members of every known slice of the
	// AddressGroup with the given group key.
	AddressGroup(group string) []v1alpha1.GroupMember
	// LocalPod returns the Pod attached to this Node's bridge, if any.
	LocalPod(namespace, name string) (Pod, bool)
}

// ConjKey names one conjunction: a rule of a policy (by index in
// Spec.Rules) and, for rules split by named ports, the resolved
// "PROTOCOL/port" ("" for the rule's main conjunction).
type ConjKey struct {
	Policy string
	Rule   int
	Split  string
}

// IDs gives the conjunction ID of a ConjKey; ok false means none is
// available (the conjunction is then left out).
type IDs interface {
	Get(k ConjKey) (id uint32, ok bool)
}

// Policy is the translation of one computed NetworkPolicy.
type Policy struct {
	// Flows are the policy's flows, merged among its own rules, sorted by
	// table, priority and match.
	Flows []of.Flow
	// Conj lists the conjunctions the flows use.
	Conj []ConjKey
	// Targets are the attached local Pods the policy applies to, sorted by
	// namespace/name.
	Targets []Pod
	// Ingress and Egress say which directions the policy isolates its
	// Targets for (Spec.PolicyTypes lists "Ingress" / "Egress"): such a
	// Pod only receives (sends) what an allow flow of some policy lets
	// through, once its pipeline.Pod IngressIsolated (EgressIsolated) is
	// set. They are reported whether or not Targets is empty.
	Ingress, Egress bool
	// Warnings describe what was left out (malformed CIDR, unknown
	// protocol, no conjunction ID).
	Warnings []string
}

// Translate returns the flows of np on this Node: cookie is the cookie of
// every flow (pipeline.Cookie(round, pipeline.CategoryPolicy, id)). Only
// rules whose direction is among Spec.PolicyTypes count (networking.k8s.io
// /v1: rules of other directions are ignored). Malformed parts of a rule
// are left out (allowing less) and reported in Warnings.
func Translate(np *v1alpha1.NetworkPolicy, cookie uint64, src Source, ids IDs) Policy {
	b := &builder{cookie: cookie, out: map[string]of.Flow{}, ids: ids}
	targets := localTargets(src.AppliedTo(np.Spec.AppliedToGroup), src)
	res := Policy{}
	for _, t := range targets {
		res.Targets = append(res.Targets, t.pod)
	}
	ingress, egress := false, false
	for _, t := range np.Spec.PolicyTypes {
		switch t {
		case "Ingress":
			ingress = true
		case "Egress":
			egress = true
		}
	}
	res.Ingress, res.Egress = ingress, egress
	if len(targets) > 0 {
		for i := range np.Spec.Rules {
			r := &np.Spec.Rules[i]
			if (r.Direction == v1alpha1.DirectionIn && !ingress) || (r.Direction == v1alpha1.DirectionOut && !egress) {
				continue
			}
			b.rule(ConjKey{Policy: np.Name, Rule: i}, r, targets, src)
		}
	}
	res.Flows = b.flows()
	res.Conj = b.conj
	res.Warnings = b.warnings
	return res
}

// target is a local Pod the policy applies to, with its named ports.
type target struct {
	pod   Pod
	ports []v1alpha1.NamedPort
}

func localTargets(members []v1alpha1.GroupMember, src Source) []target {
	seen := map[string]bool{}
	var out []target
	for _, m := range members {
		p, ok := src.LocalPod(m.Namespace, m.Name)
		if !ok || p.OFPort == 0 || seen[p.Key()] {
			continue
		}
		seen[p.Key()] = true
		out = append(out, target{pod: p, ports: m.Ports})
	}
	sort.Slice(out, func(i, j int) bool { return out[i].pod.Key() < out[j].pod.Key() })
	return out
}

func ingressPodMatch(p Pod) of.Match {
	return of.Match{EthType: pipeline.EthTypeIPv4, Regs: []of.RegMatch{pipeline.TargetOFPort.Match(p.OFPort)}}
}

func egressPodMatch(p Pod) of.Match {
	return of.Match{InPort: p.OFPort, EthType: pipeline.EthTypeIPv4}
}

// portSpec is one resolved port clause value: a protocol and a masked
// destination port, nil for the whole protocol.
type portSpec struct {
	proto uint8
	port  *of.PortMatch
}

func (s portSpec) match() of.Match {
	return of.Match{EthType: pipeline.EthTypeIPv4, IPProto: s.proto, L4Dst: s.port}
}

// namedSpec is a port given by name, resolved per destination Pod.
type namedSpec struct {
	proto uint8
	name  string
}

// resolved is one (protocol, port) a named port resolves to.
type resolved struct {
	proto uint8
	port  uint16
}

func (r resolved) String() string { return fmt.Sprintf("%s/%d", protoName(r.proto), r.port) }

func protoName(p uint8) string {
	switch p {
	case ProtoTCP:
		return "TCP"
	case ProtoUDP:
		return "UDP"
	case ProtoSCTP:
		return "SCTP"
	}
	return fmt.Sprint(p)
}

// ParseProtocol maps a Kubernetes protocol name (TCP, UDP, SCTP; "" means
// TCP, as in networking.k8s.io/v1 NetworkPolicyPort) to its IP protocol
// number.
func ParseProtocol(s string) (uint8, error) {
	switch strings.ToUpper(s) {
	case "", "TCP":
		return ProtoTCP, nil
	case "UDP":
		return ProtoUDP, nil
	case "SCTP":
		return ProtoSCTP, nil
	}
	return 0, fmt.Errorf("unsupported protocol %q", s)
}

type builder struct {
	cookie   uint64
	out      map[string]of.Flow
	ids      IDs
	conj     []ConjKey
	warnings []string
}

func (b *builder) warn(format string, args ...any) {
	b.warnings = append(b.warnings, fmt.Sprintf(format, args...))
}

func (b *builder) add(f of.Flow) {
	f.Cookie = b.cookie
	k := FlowKey(f)
	if old, ok := b.out[k]; ok {
		f = MergeFlows(old, f)
	}
	b.out[k] = f
}

func (b *builder) flows() []of.Flow {
	keys := make([]string, 0, len(b.out))
	for k := range b.out {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	fs := make([]of.Flow, len(keys))
	for i, k := range keys {
		fs[i] = b.out[k]
	}
	return fs
}

// clause is one dimension of a conjunction; any means unrestricted (the
// clause is left out), an empty matches list with any false matches
// nothing.
type clause struct {
	any     bool
	matches []of.Match
}

// conjunction emits the flows of one conjunction of the rule in table
// (EgressRule or IngressRule): the Pod clause first, then the restricted
// clauses. A single (Pod) clause becomes plain allow flows.
func (b *builder) conjunction(table pipeline.Table, key ConjKey, pods []of.Match, others ...clause) {
	dims := [][]of.Match{pods}
	for _, c := range others {
		if c.any {
			continue
		}
		dims = append(dims, c.matches)
	}
	for _, d := range dims {
		if len(d) == 0 {
			return // a clause that matches nothing: the rule allows nothing
		}
	}
	next := of.GotoTable{Table: uint8(nextStage(table))}
	if len(dims) == 1 {
		for _, m := range pods {
			b.add(of.Flow{Table: uint8(table), Priority: pipeline.PrioPolicyAllow, Match: m,
				Actions: []of.Action{next}})
		}
		return
	}
	id, ok := b.ids.Get(key)
	if !ok {
		b.warn("rule %d split %q: no conjunction ID available", key.Rule, key.Split)
		return
	}
	b.conj = append(b.conj, key)
	prio, ok := pipeline.PolicyRulePriority(id)
	if !ok {
		b.warn("rule %d split %q: conjunction ID %#x is outside the priority bands", key.Rule, key.Split, id)
		return
	}
	n := uint8(len(dims))
	for k, d := range dims {
		for _, m := range d {
			b.add(of.Flow{Table: uint8(table), Priority: prio, Match: m,
				Actions: []of.Action{of.Conjunction{ID: id, Clause: uint8(k + 1), NClauses: n}}})
		}
	}
	cid := id
	b.add(of.Flow{Table: uint8(table), Priority: prio, Match: of.Match{ConjID: &cid},
		Actions: []of.Action{next}})
}

// nextStage is where an allowed packet continues: past the default deny.
func nextStage(rule pipeline.Table) pipeline.Table {
	if rule == pipeline.EgressRule {
		return pipeline.EgressDefault.Next()
	}
	return pipeline.IngressDefault.Next()
}

// ports parses the rule's ports into numbered specs and named specs. all
// is true when the rule has no ports (every port and protocol).
func (b *builder) ports(ri int, ps []v1alpha1.PolicyPort) (all bool, numbered []portSpec, named []namedSpec) {
	if len(ps) == 0 {
		return true, nil, nil
	}
	for _, p := range ps {
		proto, err := ParseProtocol(p.Protocol)
		if err != nil {
			b.warn("rule %d: %v", ri, err)
			continue
		}
		switch {
		case p.Port == nil:
			numbered = append(numbered, portSpec{proto: proto})
		case p.Port.Type == intstr.String:
			named = append(named, namedSpec{proto: proto, name: p.Port.StrVal})
		default:
			lo := p.Port.IntVal
			hi := lo
			if p.EndPort != nil {
				hi = *p.EndPort
			}
			if lo < 0 || hi > 65535 || hi < lo {
				b.warn("rule %d: bad port range %d-%d", ri, lo, hi)
				continue
			}
			pms := PortRange(uint16(lo), uint16(hi))
			if pms == nil {
				numbered = append(numbered, portSpec{proto: proto})
			}
			for i := range pms {
				pm := pms[i]
				numbered = append(numbered, portSpec{proto: proto, port: &pm})
			}
		}
	}
	return false, numbered, named
}

// resolve returns what the named specs resolve to among a Pod's named
// container ports (same name and protocol).
func resolve(named []namedSpec, ports []v1alpha1.NamedPort) []resolved {
	var out []resolved
	for _, n := range named {
		for _, cp := range ports {
			proto, err := ParseProtocol(cp.Protocol)
			if err != nil || proto != n.proto || cp.Name != n.name || cp.Port <= 0 || cp.Port > 65535 {
				continue
			}
			out = append(out, resolved{proto: n.proto, port: uint16(cp.Port)})
		}
	}
	return out
}

func (r resolved) spec() portSpec {
	return portSpec{proto: r.proto, port: &of.PortMatch{Port: r.port, Mask: 0xffff}}
}

func portMatches(specs []portSpec) []of.Match {
	ms := make([]of.Match, len(specs))
	for i, s := range specs {
		ms[i] = s.match()
	}
	return ms
}

// peerIP is one peer address of a rule with the named ports of its Pod.
type peerIP struct {
	ip    net.IP
	ports []v1alpha1.NamedPort
}

// peers returns the rule's address-group peers (IPv4 /32 each, with their
// named ports) and its ipBlock prefixes.
func (b *builder) peers(ri int, r *v1alpha1.Rule, src Source) (pods []peerIP, blocks []*net.IPNet) {
	seen := map[string]bool{}
	for _, g := range r.AddressGroups {
		for _, m := range src.AddressGroup(g) {
			for _, s := range m.IPs {
				ip := net.ParseIP(s).To4()
				if ip == nil || seen[ip.String()] {
					continue
				}
				seen[ip.String()] = true
				pods = append(pods, peerIP{ip: ip, ports: m.Ports})
			}
		}
	}
	sort.Slice(pods, func(i, j int) bool { return string(pods[i].ip) < string(pods[j].ip) })
	if len(r.WithinIPBlocks) > 0 {
		var within []*net.IPNet
		for _, blk := range r.WithinIPBlocks {
			nets, err := SubtractCIDRs(blk.CIDR, blk.Except)
			if err != nil {
				b.warn("rule %d: withinIPBlocks %s: %v", ri, blk.CIDR, err)
				continue
			}
			within = append(within, nets...)
		}
		pods = slices.DeleteFunc(pods, func(p peerIP) bool {
			return !slices.ContainsFunc(within, func(n *net.IPNet) bool { return n.Contains(p.ip) })
		})
	}
	for _, blk := range r.IPBlocks {
		nets, err := SubtractCIDRs(blk.CIDR, blk.Except)
		if err != nil {
			b.warn("rule %d: ipBlock %s: %v", ri, blk.CIDR, err)
			continue
		}
		blocks = append(blocks, nets...)
	}
	return pods, blocks
}

func peerMatch(dir v1alpha1.Direction, n *net.IPNet) of.Match {
	if dir == v1alpha1.DirectionIn {
		return of.Match{EthType: pipeline.EthTypeIPv4, IPSrc: n}
	}
	return of.Match{EthType: pipeline.EthTypeIPv4, IPDst: n}
}

func hostNet(ip net.IP) *net.IPNet { return &net.IPNet{IP: ip, Mask: net.CIDRMask(32, 32)} }

// rule emits the conjunctions of one rule.
func (b *builder) rule(key ConjKey, r *v1alpha1.Rule, targets []target, src Source) {
	table := pipeline.IngressRule
	podMatch := ingressPodMatch
	if r.Direction == v1alpha1.DirectionOut {
		table = pipeline.EgressRule
		podMatch = egressPodMatch
	} else if r.Direction != v1alpha1.DirectionIn {
		b.warn("rule %d: unknown direction %q", key.Rule, r.Direction)
		return
	}
	allPorts, numbered, named := b.ports(key.Rule, r.Ports)
	var peerPods []peerIP
	var blocks []*net.IPNet
	if !r.AllPeers {
		peerPods, blocks = b.peers(key.Rule, r, src)
	}
	allPodMatches := make([]of.Match, len(targets))
	for i, t := range targets {
		allPodMatches[i] = podMatch(t.pod)
	}
	peerClause := func(ips []net.IP, withBlocks bool) clause {
		if r.AllPeers {
			return clause{any: true}
		}
		var ms []of.Match
		for _, ip := range ips {
			ms = append(ms, peerMatch(r.Direction, hostNet(ip)))
		}
		if withBlocks {
			for _, n := range blocks {
				ms = append(ms, peerMatch(r.Direction, n))
			}
		}
		return clause{matches: ms}
	}
	allPeerIPs := make([]net.IP, len(peerPods))
	for i, p := range peerPods {
		allPeerIPs[i] = p.ip
	}

	// Named ports split the rule by resolved (protocol, port): ingress by
	// the target Pods that have the name, egress by the peer Pods that
	// have it. A split that covers every Pod (ingress) or every peer
	// (egress, without ipBlocks) joins the main conjunction's port clause.
	type split struct {
		res  resolved
		pods []of.Match // ingress
		ips  []net.IP   // egress
	}
	splits := map[resolved]*split{}
	get := func(rv resolved) *split {
		s := splits[rv]
		if s == nil {
			s = &split{res: rv}
			splits[rv] = s
		}
		return s
	}
	if len(named) > 0 {
		if r.Direction == v1alpha1.DirectionIn {
			for _, t := range targets {
				seen := map[resolved]bool{}
				for _, rv := range resolve(named, t.ports) {
					if !seen[rv] {
						seen[rv] = true
						s := get(rv)
						s.pods = append(s.pods, podMatch(t.pod))
					}
				}
			}
		} else {
			for _, p := range peerPods {
				seen := map[resolved]bool{}
				for _, rv := range resolve(named, p.ports) {
					if !seen[rv] {
						seen[rv] = true
						s := get(rv)
						s.ips = append(s.ips, p.ip)
					}
				}
			}
		}
	}
	order := make([]resolved, 0, len(splits))
	for rv := range splits {
		order = append(order, rv)
	}
	sort.Slice(order, func(i, j int) bool {
		if order[i].proto != order[j].proto {
			return order[i].proto < order[j].proto
		}
		return order[i].port < order[j].port
	})
	mainPorts := numbered
	var separate []*split
	for _, rv := range order {
		s := splits[rv]
		full := false
		if r.Direction == v1alpha1.DirectionIn {
			full = len(s.pods) == len(targets)
		} else {
			full = len(s.ips) == len(peerPods) && len(blocks) == 0 && !r.AllPeers
		}
		if full {
			mainPorts = append(mainPorts, rv.spec())
		} else {
			separate = append(separate, s)
		}
	}

	if allPorts || len(mainPorts) > 0 {
		b.conjunction(table, key, allPodMatches, peerClause(allPeerIPs, true),
			clause{any: allPorts, matches: portMatches(mainPorts)})
	}
	for _, s := range separate {
		k := key
		k.Split = s.res.String()
		ports := clause{matches: []of.Match{s.res.spec().match()}}
		if r.Direction == v1alpha1.DirectionIn {
			b.conjunction(table, k, s.pods, peerClause(allPeerIPs, true), ports)
		} else {
			b.conjunction(table, k, allPodMatches, peerClause(s.ips, false), ports)
		}
	}
}
