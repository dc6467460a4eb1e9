package compute

import (
	"cmp"
	"slices"
	"strconv"
	"strings"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/seine-net/seine/policy/apis/controlplane/v1alpha1"
	"github.com/seine-net/seine/policy/realization"
)

// maxDigestCache bounds the digest cache; it is emptied when it grows past.
const maxDigestCache = 1 << 17

// Desired builds the object k names as it should be stored: a
// *v1alpha1.AddressGroup, *v1alpha1.AppliedToGroup,
// *v1alpha1.NetworkPolicy or *v1alpha1.PodRealization with name, labels
// (GroupLabel / PolicyUIDLabel and one SpanLabel per Node of its span),
// spec and status set, and no other metadata. ok is false when the object
// must not exist (unknown name, empty span, no longer referenced). The
// object shares slices with the model: treat it as read-only. Those shared
// parts are replaced, never modified, by later events, so the object stays
// valid after the model changes. Desired, DesiredKeys and DirtyLen may run
// concurrently with each other (e.g. under a read lock), not with events
// or TakeDirty.
func (m *Model) Desired(k Key) (obj metav1.Object, ok bool) {
	switch k.Kind {
	case KindAddressGroup:
		return m.desiredAG(k.Name)
	case KindAppliedToGroup:
		return m.desiredATG(k.Name)
	case KindNetworkPolicy:
		return m.desiredNP(k.Name)
	case KindPodRealization:
		return m.desiredPR(k.Name)
	}
	return nil, false
}

// DesiredKeys returns the key of every object that should exist now.
func (m *Model) DesiredKeys() []Key {
	var out []Key
	for _, g := range m.groups {
		if g.targetRefs > 0 {
			for n := range g.byNode.Keys() {
				out = append(out, Key{KindAppliedToGroup, atgName(g, n)})
			}
		}
		if m.exported(g) {
			for i := range g.slices {
				out = append(out, Key{KindAddressGroup, agName(g, i)})
			}
		}
	}
	for _, p := range m.policies {
		if p.tg.byNode.Len() > 0 {
			out = append(out, Key{KindNetworkPolicy, p.objName})
		}
	}
	for _, n := range m.nodes {
		if n.known {
			for i := range n.prSlices {
				out = append(out, Key{KindPodRealization, v1alpha1.PodRealizationName(n.key, i)})
			}
		}
	}
	return out
}

func (m *Model) desiredAG(name string) (metav1.Object, bool) {
	key, rest, ok := splitName(name)
	if !ok {
		return nil, false
	}
	g := m.groups[key]
	s, err := strconv.Atoi(rest)
	if g == nil || err != nil || s < 0 || s >= len(g.slices) || !m.exported(g) || strconv.Itoa(s) != rest {
		return nil, false
	}
	members := buildMembers(g.slices[s])
	lbls := make(map[string]string, g.span.Len()+1)
	lbls[v1alpha1.GroupLabel] = g.key
	for n := range g.span.Keys() {
		lbls[n.label] = ""
	}
	return &v1alpha1.AddressGroup{
		ObjectMeta: metav1.ObjectMeta{Name: name, Labels: lbls},
		Spec:       v1alpha1.AddressGroupSpec{Selector: g.sel, Slice: int32(s), Members: members},
		Status:     v1alpha1.GroupStatus{MemberCount: int32(len(members))},
	}, true
}

func (m *Model) desiredATG(name string) (metav1.Object, bool) {
	key, nk, ok := splitName(name)
	if !ok {
		return nil, false
	}
	g := m.groups[key]
	n := m.nodeByKey[nk]
	if g == nil || n == nil || g.targetRefs == 0 {
		return nil, false
	}
	list, _ := g.byNode.Get(n)
	if len(list) == 0 {
		return nil, false
	}
	members := buildMembers(list)
	return &v1alpha1.AppliedToGroup{
		ObjectMeta: metav1.ObjectMeta{Name: name, Labels: map[string]string{
			v1alpha1.GroupLabel: g.key,
			n.label:             "",
		}},
		Spec:   v1alpha1.AppliedToGroupSpec{Selector: g.sel, NodeName: n.name, Members: members},
		Status: v1alpha1.GroupStatus{MemberCount: int32(len(members))},
	}, true
}

func (m *Model) desiredNP(name string) (metav1.Object, bool) {
	p := m.byObjName[name]
	if p == nil || p.tg.byNode.Len() == 0 {
		return nil, false
	}
	lbls := make(map[string]string, p.tg.byNode.Len()+1)
	lbls[v1alpha1.PolicyUIDLabel] = p.uid
	for n := range p.tg.byNode.Keys() {
		lbls[n.label] = ""
	}
	return &v1alpha1.NetworkPolicy{
		ObjectMeta: metav1.ObjectMeta{Name: name, Labels: lbls},
		Spec:       p.spec,
		Status:     v1alpha1.NetworkPolicyStatus{RuleCount: int32(len(p.spec.Rules)), SpanSize: int32(p.tg.byNode.Len())},
	}, true
}

func (m *Model) desiredPR(name string) (metav1.Object, bool) {
	nodeKey, slice := name, 0
	if k, rest, ok := strings.Cut(name, "-"); ok {
		i, err := strconv.Atoi(rest)
		if err != nil || i < 1 || strconv.Itoa(i) != rest {
			return nil, false
		}
		nodeKey, slice = k, i
	}
	n := m.nodeByKey[nodeKey]
	if n == nil || !n.known || slice >= n.prSlices {
		return nil, false
	}
	size := len(n.pods)
	if n.prSlices > 1 {
		size = size/n.prSlices + size/(4*n.prSlices) // and a quarter, for an uneven hash
	}
	pods := make(map[string]string, size)
	var buf []*group
	var sig []byte
	for pd := range n.pods {
		if int(n.prSlot(pd)) == slice {
			pods[realization.PodKey(pd.ns.name, pd.name, pd.uid)], buf, sig = m.podDigest(pd, buf, sig)
		}
	}
	spec := v1alpha1.PodRealizationSpec{NodeName: n.name, Pods: pods}
	if n.prSlices > 1 {
		spec.Slice, spec.Slices = int32(slice), int32(n.prSlices)
	}
	return &v1alpha1.PodRealization{
		ObjectMeta: metav1.ObjectMeta{Name: name, Labels: map[string]string{n.label: ""}},
		Spec:       spec,
		Status:     v1alpha1.PodRealizationStatus{PodCount: int32(len(pods))},
	}, true
}

// podDigest returns the realization digest of pd. Pods in the same target
// groups (at the same versions) share one cached digest.
func (m *Model) podDigest(pd *pod, buf []*group, sig []byte) (string, []*group, []byte) {
	buf = buf[:0]
	for _, mb := range pd.groups {
		if mb.g.targetRefs > 0 {
			buf = append(buf, mb.g)
		}
	}
	if len(buf) == 0 {
		return m.emptyDigest, buf, sig
	}
	if len(buf) > 1 {
		slices.SortFunc(buf, func(a, b *group) int { return cmp.Compare(a.id, b.id) })
	}
	sig = sig[:0]
	for _, g := range buf {
		sig = strconv.AppendUint(sig, g.id, 36)
		sig = append(sig, '.')
		sig = strconv.AppendUint(sig, g.ver, 36)
		sig = append(sig, ',')
	}
	m.digestMu.Lock()
	d, ok := m.digestCache[string(sig)]
	m.digestMu.Unlock()
	if ok {
		return d, buf, sig
	}
	var ps []realization.Policy
	for _, g := range buf {
		for p := range g.policies.Keys() {
			ps = append(ps, m.realizationPolicy(p))
		}
	}
	d = realization.Digest(ps)
	m.digestMu.Lock()
	if len(m.digestCache) >= maxDigestCache {
		clear(m.digestCache)
	}
	m.digestCache[string(sig)] = d
	m.digestMu.Unlock()
	return d, buf, sig
}

// realizationPolicy is what a Pod's digest covers of policy p.
func (m *Model) realizationPolicy(p *policy) realization.Policy {
	rp := realization.Policy{Name: p.objName, SpecHash: p.specHash}
	if len(p.peers) > 0 {
		rp.AddressGroupSlices = make(map[string]int, len(p.peers))
		for _, ag := range p.peers {
			rp.AddressGroupSlices[ag.key] = len(ag.slices)
		}
	}
	return rp
}

// buildMembers lists the members of a set sorted by namespace and name.
func buildMembers(set []*pod) []v1alpha1.GroupMember {
	if len(set) == 0 {
		return nil
	}
	out := make([]v1alpha1.GroupMember, 0, len(set))
	for _, pd := range set {
		out = append(out, v1alpha1.GroupMember{Namespace: pd.ns.name, Name: pd.name, IPs: pd.ips, Ports: pd.ports})
	}
	if len(out) > 1 {
		slices.SortFunc(out, func(a, b v1alpha1.GroupMember) int {
			if c := cmp.Compare(a.Namespace, b.Namespace); c != 0 {
				return c
			}
			return cmp.Compare(a.Name, b.Name)
		})
	}
	return out
}
