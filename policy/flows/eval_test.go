package flows

import (
	"net"
	"sort"

	of "github.com/seine-net/seine/datapath/openflow"
	"github.com/seine-net/seine/datapath/pipeline"
)

// packet is what the evaluator below looks at: the fields the policy
// tables match on.
type packet struct {
	inPort   uint32
	outPort  uint32 // reg1 after L2Forwarding
	src, dst net.IP
	proto    uint8
	dport    uint16
	est      bool   // ct_state=-new+est+trk instead of +new+trk
	ctMark   uint32 // the connection's ct_mark (pipeline.CtMark*)
	source   uint32
	conjID   *uint32
	// The isolation bits the Pod flows load (pipeline.PodFlows): egress
	// of the source Pod, ingress of the destination Pod.
	egressIso, ingressIso bool
}

func regValue(p packet, reg uint8) uint32 {
	switch reg {
	case 0:
		v := p.source
		if p.ingressIso {
			v |= pipeline.IngressIsolated.Match(1).Value
		}
		if p.egressIso {
			v |= pipeline.EgressIsolated.Match(1).Value
		}
		return v
	case 1:
		return p.outPort
	}
	return 0
}

func matches(m of.Match, p packet) bool {
	if m.InPort != 0 && m.InPort != p.inPort {
		return false
	}
	if m.ConjID != nil && (p.conjID == nil || *m.ConjID != *p.conjID) {
		return false
	}
	if m.IPSrc != nil && !m.IPSrc.Contains(p.src) {
		return false
	}
	if m.IPDst != nil && !m.IPDst.Contains(p.dst) {
		return false
	}
	if m.IPProto != 0 && m.IPProto != p.proto {
		return false
	}
	if m.L4Dst != nil {
		mask := m.L4Dst.Mask
		if mask == 0 {
			mask = 0xffff
		}
		if p.dport&mask != m.L4Dst.Port&mask {
			return false
		}
	}
	for _, r := range m.Regs {
		mask := r.Mask
		if mask == 0 {
			mask = 0xffffffff
		}
		if regValue(p, r.Reg)&mask != r.Value&mask {
			return false
		}
	}
	if m.CtMark != nil && p.ctMark&m.CtMark.Mask != m.CtMark.Value&m.CtMark.Mask {
		return false
	}
	if m.CtState != nil {
		st := of.CtTrk
		if p.est {
			st |= of.CtEst
		} else {
			st |= of.CtNew
		}
		if st&m.CtState.Set != m.CtState.Set || st&m.CtState.Clear != 0 {
			return false
		}
	}
	return true
}

// lookup does what ovs-vswitchd does in one table (ovs-fields(7)
// conjunctive match semantics): by descending priority, a completed
// conjunction leads to its conj_id flow; otherwise the plain flow matching
// at that priority wins. It returns the actions of the chosen flow and
// whether one matched.
func lookup(fs []of.Flow, table pipeline.Table, p packet) ([]of.Action, bool) {
	byPrio := map[uint16][]of.Flow{}
	var prios []int
	for _, f := range fs {
		if f.Table != uint8(table) {
			continue
		}
		if _, ok := byPrio[f.Priority]; !ok {
			prios = append(prios, int(f.Priority))
		}
		byPrio[f.Priority] = append(byPrio[f.Priority], f)
	}
	sort.Sort(sort.Reverse(sort.IntSlice(prios)))
	for _, pr := range prios {
		type cstate struct {
			n    uint8
			seen map[uint8]bool
		}
		conj := map[uint32]*cstate{}
		var plain []of.Flow
		for _, f := range byPrio[uint16(pr)] {
			if f.Match.ConjID != nil || !matches(f.Match, p) {
				continue
			}
			if conjOnly(f.Actions) {
				for _, a := range f.Actions {
					c := a.(of.Conjunction)
					s := conj[c.ID]
					if s == nil {
						s = &cstate{n: c.NClauses, seen: map[uint8]bool{}}
						conj[c.ID] = s
					}
					s.seen[c.Clause] = true
				}
				continue
			}
			plain = append(plain, f)
		}
		var ids []uint32
		for id, s := range conj {
			if len(s.seen) == int(s.n) {
				ids = append(ids, id)
			}
		}
		sort.Slice(ids, func(i, j int) bool { return ids[i] < ids[j] })
		for _, id := range ids {
			q := p
			cid := id
			q.conjID = &cid
			for _, f := range fs {
				if f.Table == uint8(table) && f.Match.ConjID != nil && *f.Match.ConjID == id && matches(f.Match, q) {
					return f.Actions, true
				}
			}
		}
		if len(plain) > 0 {
			return plain[0].Actions, true
		}
	}
	return nil, false
}

// isolation is the isolation of one local Pod: the union over the
// policies that select it of the directions they isolate.
type isolation struct{ ingress, egress bool }

// evalSet is what the evaluator checks packets against: the installed
// policy flows (with pipeline.PolicyBaseFlows) and, by ofport, the
// isolation the local Pods' flows carry.
type evalSet struct {
	flows []of.Flow
	iso   map[uint32]isolation
}

// isolations is the per-ofport union of the isolation of the policies'
// targets, what the agent computes for pipeline.Pod.
func isolations(ps ...Policy) map[uint32]isolation {
	m := map[uint32]isolation{}
	for _, p := range ps {
		for _, t := range p.Targets {
			i := m[t.OFPort]
			i.ingress = i.ingress || p.Ingress
			i.egress = i.egress || p.Egress
			m[t.OFPort] = i
		}
	}
	return m
}

// passes runs the packet through a rule table and its default table and
// reports whether it gets past both (a goto beyond the default table or a
// miss in both). It first sets the isolation bits the way the Pod flows
// do: the Classifier flow of the source Pod's in_port, the L2Forwarding
// flow of the destination Pod.
func passes(s evalSet, rule pipeline.Table, p packet) bool {
	fs := s.flows
	if p.source == pipeline.FromPod {
		p.egressIso = s.iso[p.inPort].egress
	}
	p.ingressIso = s.iso[p.outPort].ingress
	def := rule.Next()
	for _, t := range []pipeline.Table{rule, def} {
		acts, ok := lookup(fs, t, p)
		if !ok {
			continue // miss: next table
		}
		if len(acts) == 0 {
			return false // drop
		}
		g, ok := acts[len(acts)-1].(of.GotoTable)
		if !ok {
			return false
		}
		if g.Table > uint8(def) {
			return true
		}
	}
	return true
}
