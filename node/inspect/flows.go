package inspect

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"slices"
	"strings"
	"time"

	"github.com/seine-net/seine/datapath/flowsync"
	of "github.com/seine-net/seine/datapath/openflow"
	"github.com/seine-net/seine/datapath/pipeline"
	"github.com/seine-net/seine/node/localapi"
	"github.com/seine-net/seine/node/podnet"
	"github.com/seine-net/seine/node/proxy"
	policyagent "github.com/seine-net/seine/policy/agent"
)

// canonical normalises a match so that a desired flow and the same flow
// as OVS dumps it have the same flowsync.Key: exact masks written as zero,
// registers in register order (OVS's order).
func canonical(f of.Flow) of.Flow {
	m := f.Match
	if len(m.Regs) > 0 {
		regs := slices.Clone(m.Regs)
		for i := range regs {
			if regs[i].Mask == 0xffffffff {
				regs[i].Mask = 0
			}
		}
		slices.SortFunc(regs, func(a, b of.RegMatch) int { return int(a.Reg) - int(b.Reg) })
		m.Regs = regs
	}
	port := func(p *of.PortMatch) *of.PortMatch {
		if p != nil && p.Mask == 0xffff {
			return &of.PortMatch{Port: p.Port}
		}
		return p
	}
	m.L4Src, m.L4Dst = port(m.L4Src), port(m.L4Dst)
	m32 := func(v *of.Masked32) *of.Masked32 {
		if v != nil && v.Mask == 0xffffffff {
			return &of.Masked32{Value: v.Value}
		}
		return v
	}
	m.CtMark, m.PktMark = m32(m.CtMark), m32(m.PktMark)
	if m.TunID != nil && m.TunID.Mask == ^uint64(0) {
		m.TunID = &of.Masked64{Value: m.TunID.Value}
	}
	return of.Flow{Table: f.Table, Priority: f.Priority, Match: m}
}

// desiredEntry is one desired flow entry and its owners.
type desiredEntry struct {
	flow   of.Flow
	owners []string
	seen   bool
}

// flowFilter decides which flows a query selects.
type flowFilter struct {
	table  *uint8
	pod    *podnet.Attachment
	policy *policyagent.PolicyState
	// service holds the IDs of a Service's frontends.
	service map[uint32]bool
}

func (f flowFilter) match(fl of.Flow, owners []string) bool {
	if f.table != nil && fl.Table != *f.table {
		return false
	}
	if p := f.pod; p != nil && !podFlow(fl, owners, p) {
		return false
	}
	if p := f.policy; p != nil && !policyFlow(fl, p) {
		return false
	}
	if f.service != nil && !serviceFlow(fl, owners, f.service) {
		return false
	}
	return true
}

// serviceFlow reports whether fl belongs to one of the frontends ids: by
// its owner, or by its cookie (the learned affinity flows, which only OVS
// has, carry that of their Service port's internal frontend, one of ids).
func serviceFlow(fl of.Flow, owners []string, ids map[uint32]bool) bool {
	for id := range ids {
		if slices.Contains(owners, pipeline.ServiceOwner(id)) {
			return true
		}
	}
	cat := pipeline.Category(fl.Cookie & pipeline.CookieCategoryMask >> pipeline.CookieCategoryShift)
	id := fl.Cookie &^ (pipeline.CookieRoundMask | pipeline.CookieCategoryMask)
	return cat == pipeline.CategoryService && id <= uint64(pipeline.MaxServicePortID) && ids[uint32(id)]
}

func podFlow(fl of.Flow, owners []string, p *podnet.Attachment) bool {
	if slices.Contains(owners, p.FlowOwner) {
		return true
	}
	m := fl.Match
	ip := net.ParseIP(p.IP)
	isPodIP := func(n *net.IPNet) bool {
		ones, bits := 0, 0
		if n != nil {
			ones, bits = n.Mask.Size()
		}
		return n != nil && ones == bits && n.IP.Equal(ip)
	}
	if m.InPort == p.OFPort || isPodIP(m.IPSrc) || isPodIP(m.IPDst) || (m.ARPTPA != nil && m.ARPTPA.Equal(ip)) {
		return true
	}
	if m.EthSrc.String() == p.MAC || m.EthDst.String() == p.MAC {
		return true
	}
	for _, r := range m.Regs {
		if r.Reg == pipeline.TargetOFPort.Reg() && (r.Mask == 0 || r.Mask == 0xffffffff) && r.Value == p.OFPort {
			return true
		}
	}
	return false
}

func policyFlow(fl of.Flow, p *policyagent.PolicyState) bool {
	if fl.Cookie == p.Cookie && p.Cookie != 0 {
		return true
	}
	if fl.Match.ConjID != nil && slices.Contains(p.ConjIDs, *fl.Match.ConjID) {
		return true
	}
	for _, a := range fl.Actions {
		if c, ok := a.(of.Conjunction); ok && slices.Contains(p.ConjIDs, c.ID) {
			return true
		}
	}
	return false
}

// Flows returns the flows of the bridge that q selects: every entry OVS
// has, with its counters, joined with Seine's desired state (actions and
// owner), plus desired entries OVS lacks.
func (in *Inspector) Flows(ctx context.Context, q localapi.FlowQuery) ([]localapi.Flow, error) {
	var flt flowFilter
	if q.Table != "" {
		t, ok := pipeline.TableByName(q.Table)
		if !ok {
			return nil, localapi.BadRequest("no table %q in the pipeline (tables: %s)", q.Table, strings.Join(tableNames(), ", "))
		}
		tt := uint8(t)
		flt.table = &tt
	}
	if q.Pod != "" {
		ns, name, ok := strings.Cut(q.Pod, "/")
		if !ok {
			return nil, localapi.BadRequest("pod %q: want namespace/name", q.Pod)
		}
		a, found := in.d.Pods.Attachment(ns, name)
		if !found {
			return nil, localapi.NotFound("pod %s is not attached to Node %s", q.Pod, in.d.Config.NodeName)
		}
		flt.pod = &a
	}
	if q.NetworkPolicy != "" {
		p, err := in.policyState(q.NetworkPolicy)
		if err != nil {
			return nil, err
		}
		flt.policy = p
	}
	// The Service proxy's frontends name the flows' owners; while the
	// proxy is busy (ovs-vswitchd away) the flows are listed without.
	fctx, cancel := context.WithTimeout(ctx, time.Second)
	frontends, ferr := in.frontends(fctx)
	cancel()
	if q.Service != "" {
		if !strings.Contains(q.Service, "/") {
			return nil, localapi.BadRequest("service %q: want namespace/name", q.Service)
		}
		if ferr != nil {
			return nil, &localapi.StatusError{Code: http.StatusServiceUnavailable, Err: ferr}
		}
		flt.service = map[uint32]bool{}
		for _, f := range frontends {
			if f.Service == q.Service {
				flt.service[f.ServicePort.ID] = true
			}
		}
		if len(flt.service) == 0 {
			return nil, localapi.NotFound("service %s has no frontend on Node %s (not proxied here, or the proxy is off)",
				q.Service, in.d.Config.NodeName)
		}
	}
	owners := in.ownerNames(frontends)
	desired := map[string]*desiredEntry{}
	for owner, fs := range in.d.Flows.Snapshot() {
		for _, f := range fs {
			k := flowsync.Key(canonical(f))
			e := desired[k]
			if e == nil {
				e = &desiredEntry{flow: f}
				desired[k] = e
			}
			e.owners = append(e.owners, owner)
		}
	}
	dump, err := in.d.OpenFlow.DumpFlows(ctx, flt.table, 0, 0)
	if err != nil {
		return nil, fmt.Errorf("dumping flows: %w", err)
	}
	var out []localapi.Flow
	for _, st := range dump {
		k := flowsync.Key(canonical(st.Flow))
		e := desired[k]
		fl := localapi.Flow{Table: tableName(st.Table), TableID: st.Table, Priority: st.Priority,
			Cookie: fmt.Sprintf("%#x", st.Cookie), Match: st.Match.String(), Packets: st.Packets, Bytes: st.Bytes, State: localapi.FlowUnknown}
		f := st.Flow
		var own []string
		if e != nil {
			e.seen = true
			f.Actions = e.flow.Actions
			own = e.owners
			fl.State = localapi.FlowInstalled
			fl.Actions = of.FormatActions(e.flow.Actions, tableName)
			fl.Owner = describeOwners(e.owners, owners)
		}
		if !flt.match(f, own) {
			continue
		}
		out = append(out, fl)
	}
	for _, e := range desired {
		if e.seen || !flt.match(e.flow, e.owners) {
			continue
		}
		out = append(out, localapi.Flow{Table: tableName(e.flow.Table), TableID: e.flow.Table, Priority: e.flow.Priority,
			Cookie: fmt.Sprintf("%#x", e.flow.Cookie), Match: e.flow.Match.String(),
			Actions: of.FormatActions(e.flow.Actions, tableName), Owner: describeOwners(e.owners, owners), State: localapi.FlowMissing})
	}
	sortFlows(out)
	return out, nil
}

func tableNames() []string {
	var out []string
	for _, ti := range pipeline.Tables() {
		out = append(out, ti.Name)
	}
	return out
}

// policyState finds a policy by its computed name or its source's
// namespace/name.
func (in *Inspector) policyState(ref string) (*policyagent.PolicyState, error) {
	if in.d.Policy == nil {
		return nil, localapi.BadRequest("NetworkPolicy enforcement is disabled on this Node")
	}
	for _, p := range in.d.Policy.View().Policies {
		src := p.Object.Spec.Source
		if p.Object.Name == ref || src.Namespace+"/"+src.Name == ref {
			return &p, nil
		}
	}
	return nil, localapi.NotFound("no NetworkPolicy %q applies to a Pod on Node %s", ref, in.d.Config.NodeName)
}

// ownerNames maps flowsync owners to what operators know them by.
func (in *Inspector) ownerNames(frontends []proxy.Frontend) map[string]string {
	m := map[string]string{}
	for _, a := range in.d.Pods.Attachments() {
		m[a.FlowOwner] = "pod " + a.Namespace + "/" + a.Name
	}
	for _, p := range in.view().Policies {
		src := p.Object.Spec.Source
		m["policy/np/"+p.Object.Name] = "policy " + src.Namespace + "/" + src.Name
	}
	for _, f := range frontends {
		m[pipeline.ServiceOwner(f.ServicePort.ID)] = "service " + f.Service + " " + f.Port + " " + f.Kind
	}
	return m
}

func describeOwners(owners []string, names map[string]string) string {
	var out []string
	for _, o := range owners {
		switch {
		case names[o] != "":
			out = append(out, names[o])
		case strings.HasPrefix(o, "node/"):
			out = append(out, "node "+strings.TrimPrefix(o, "node/"))
		case strings.HasPrefix(o, "svc/"):
			out = append(out, "service port "+strings.TrimPrefix(o, "svc/"))
		case strings.HasPrefix(o, "policy/shared/"):
			out = append(out, "policies (shared)")
		default:
			out = append(out, o)
		}
	}
	slices.Sort(out)
	return strings.Join(slices.Compact(out), ", ")
}
