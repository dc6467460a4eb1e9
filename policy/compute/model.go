// Package compute is the pure heart of Seine's NetworkPolicy controller: an
// incremental model fed with Pods, Namespaces, networking.k8s.io/v1
// NetworkPolicies and Nodes that computes the controlplane.seine.io/v1alpha1
// objects (AddressGroup, AppliedToGroup, NetworkPolicy, PodRealization) the
// agents read, and which of them an event may have changed.
//
// Model:
//   - A group is a normalized GroupSelector (GroupKey); every policy with
//     the same target selector or peer selector shares it. A group's
//     members are the active Pods it selects (active: not hostNetwork, phase
//     neither Succeeded nor Failed).
//   - A group used as a target (by ≥1 policy) is written as one
//     AppliedToGroup per Node with members ("<key>-<NodeKey>").
//   - A group used as a peer is written as AddressGroup slices
//     ("<key>-<i>", i = 0..count-1) of at most SliceSize members with IPs.
//     A Pod keeps its slice while it stays a member with IPs; a new member
//     fills the lowest slice with room, so holes are reused. The slice count
//     is one past the highest non-empty slice; slices below it that are
//     empty are still written (with no members), so an agent can count
//     slices 0..count-1.
//   - A computed NetworkPolicy ("np-<uid>") spans the Nodes where its
//     target group has members; an AddressGroup spans the union of the
//     spans of the policies using it; objects with an empty span do not
//     exist. A PodRealization ("<NodeKey>") exists for every known Node;
//     once the Node's agent reads them in slices (SetPodRealizationSlicing),
//     a Node with more than PodRealizationSliceSize Pods has a power of two
//     of them, each holding the Pods v1alpha1.PodRealizationSlice puts there,
//     so that a change of one Pod's digest rewrites about that many digests
//     rather than all of its Node's.
//
// Cost: a Pod event evaluates only the selectors of its namespace (indexed
// by one label pair each) and the cluster-wide selectors whose namespace
// selector matches its namespace; a Namespace relabel evaluates the
// cluster-wide namespace selectors; a policy event creates at most its own
// new groups. PodRealization digests are cached per set of target groups,
// so 10,000 Pods selected by the same 10,000 policies cost one digest.
//
// A Model is not safe for concurrent use, except that Desired calls may run
// in parallel with each other.
package compute

import (
	"slices"
	"strconv"
	"strings"
	"sync"

	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"

	"github.com/seine-net/seine/policy/apis/controlplane/v1alpha1"
	"github.com/seine-net/seine/policy/realization"
)

// DefaultSliceSize is the default maximum number of members of an
// AddressGroup slice.
const DefaultSliceSize = 500

// DefaultPodRealizationSliceSize is the default number of Pods above which
// a Node's PodRealization is split in two, four, ... slices (for Nodes
// whose agent reads slices). Below kubelet's default of 110 Pods a Node
// keeps one object.
const DefaultPodRealizationSliceSize = 128

// Option configures a Model.
type Option func(*Model)

// WithPodRealizationSliceSize sets the Pods per PodRealization slice that a
// Node's Pod count must exceed before its PodRealization is split
// (DefaultPodRealizationSliceSize when n ≤ 0).
func WithPodRealizationSliceSize(n int) Option {
	return func(m *Model) {
		if n > 0 {
			m.prSliceSize = n
		}
	}
}

// Kind is the kind of a computed object.
type Kind string

// The computed kinds.
const (
	KindAddressGroup   Kind = "AddressGroup"
	KindAppliedToGroup Kind = "AppliedToGroup"
	KindNetworkPolicy  Kind = "NetworkPolicy"
	KindPodRealization Kind = "PodRealization"
)

// Kinds lists every computed kind.
var Kinds = [...]Kind{KindAddressGroup, KindAppliedToGroup, KindNetworkPolicy, KindPodRealization}

// Key names one computed (cluster-scoped) object.
type Key struct {
	Kind Kind
	Name string
}

func (k Key) String() string { return string(k.Kind) + "/" + k.Name }

// Model is the incremental policy computation. Create it with New.
type Model struct {
	sliceSize   int
	prSliceSize int
	// prSlicing holds the Nodes whose agent reads a PodRealization in
	// slices.
	prSlicing map[string]struct{}

	namespaces map[string]*namespace
	groups     map[string]*group
	nextID     uint64
	// clusterIdx indexes groups with a NamespaceSelector by that selector.
	clusterIdx selIndex
	policies   map[string]*policy // "ns/name"
	byObjName  map[string]*policy // "np-<uid>"
	nodes      map[string]*node
	nodeByKey  map[string]*node

	// nsIdx indexes known namespaces by label pair.
	nsIdx labelIndex[*namespace]

	// dirty numbers the dirty objects 0, 1, ... in the order they were
	// first marked.
	dirty map[dkey]int32
	// soloATGs counts the AppliedToGroups in dirty on their own entry.
	soloATGs int
	// epoch numbers the dirty sets: TakeDirty starts the next one. A
	// node (group) stamped with the current epoch has its PodRealization
	// (all its AppliedToGroups) in the dirty set already, so marking it
	// again costs no map lookup.
	epoch uint64

	// digestMu guards digestCache, the only state Desired writes.
	digestMu    sync.Mutex
	digestCache map[string]string
	emptyDigest string
}

// New returns an empty model whose AddressGroup slices hold at most
// sliceSize members (DefaultSliceSize when sliceSize ≤ 0).
func New(sliceSize int, opts ...Option) *Model {
	if sliceSize <= 0 {
		sliceSize = DefaultSliceSize
	}
	m := &Model{
		sliceSize:   sliceSize,
		prSliceSize: DefaultPodRealizationSliceSize,
		prSlicing:   make(map[string]struct{}),
		namespaces:  make(map[string]*namespace),
		groups:      make(map[string]*group),
		policies:    make(map[string]*policy),
		byObjName:   make(map[string]*policy),
		nodes:       make(map[string]*node),
		nodeByKey:   make(map[string]*node),
		dirty:       make(map[dkey]int32),
		epoch:       1,
		digestCache: make(map[string]string),
		emptyDigest: realization.Digest(nil),
	}
	for _, o := range opts {
		o(m)
	}
	return m
}

type namespace struct {
	name   string
	labels map[string]string
	known  bool
	pods   map[string]*pod
	// podIdx indexes the Pods by label pair.
	podIdx labelIndex[*pod]
	// idx indexes the namespace-scoped groups of this namespace by their
	// Pod selector.
	idx selIndex
	// cluster holds the cluster-wide groups whose namespace selector
	// matches this namespace.
	cluster set[*group]
}

type membership struct {
	g *group
	// slice is the AddressGroup slice of the Pod, -1 without IPs.
	slice int32
}

type pod struct {
	ns     *namespace
	name   string
	uid    string
	labels map[string]string
	node   string
	ips    []string
	ports  []v1alpha1.NamedPort
	active bool
	groups []membership
	// prHash is v1alpha1.PodHash of the Pod, which picks its
	// PodRealization slice.
	prHash uint32
}

type node struct {
	name  string
	key   string
	label string // SpanLabel(name)
	known bool   // a Node object exists
	pods  map[*pod]struct{}
	// sliced is set while the Node's agent reads PodRealization slices;
	// prSlices is how many there are (a power of two, 1 when !sliced).
	sliced   bool
	prSlices int
	// prMarked is the epoch in which all its PodRealization slices were
	// last marked.
	prMarked uint64
}

// prSlot is the PodRealization slice of pd on n
// (v1alpha1.PodRealizationSlice: prSlices is a power of two).
func (n *node) prSlot(pd *pod) int32 {
	return int32(pd.prHash & uint32(n.prSlices-1))
}

type group struct {
	id   uint64
	key  string
	sel  v1alpha1.GroupSelector
	podM *matcher
	// nsM is the namespace selector of a cluster-wide group, nil for a
	// group of one namespace.
	nsM *matcher

	targetRefs, peerRefs int
	// policies are the policies targeting this group.
	policies set[*policy]
	// peerAGs counts, per peer group, the policies of this (target) group
	// referencing it.
	peerAGs smallMap[*group, int]
	// peerOf holds the target groups whose policies use this group as peer.
	peerOf set[*group]
	// span counts, per Node, the target groups in peerOf with members there.
	span smallMap[*node, int]

	// byNode lists the members per Node (members without a Node are in
	// no list), slices the members with IPs per AddressGroup slice. A Node
	// with members has active Pods, so the model keeps its node: the
	// pointers stay valid while they are keys here or in span.
	byNode smallMap[*node, []*pod]
	slices [][]*pod
	// ver changes whenever the digest input of its policies changes.
	ver uint64
	// atgsMarked is the epoch in which all its AppliedToGroups were last
	// marked.
	atgsMarked uint64
}

type policy struct {
	nsName   string
	objName  string
	uid      string
	spec     v1alpha1.NetworkPolicySpec
	specHash string
	tg       *group
	peers    []*group
}

// dkey is a dirty object named by the strings the model already holds, so
// marking an object allocates nothing: AddressGroup {a: group key, i:
// slice}, AppliedToGroup {a: group key, b: NodeKey}, NetworkPolicy {a:
// object name}, PodRealization {b: NodeKey, i: slice}; or every
// AppliedToGroup of a group {a: group key}.
type dkey struct {
	a, b string
	i    int32
	kind dkind
}

// dkind is Kind as one byte, which keeps the dirty set's keys small.
type dkind uint8

const (
	dAddressGroup dkind = iota
	dAppliedToGroup
	dNetworkPolicy
	dPodRealization
	// dGroupATGs stands for the AppliedToGroups the group has when the
	// dirty set is taken. Those it loses before are marked one by one
	// (by removeFromNode and detach), as are those it gains.
	dGroupATGs
)

func (m *Model) markATG(g *group, n *node) {
	if m.mark(dkey{kind: dAppliedToGroup, a: g.key, b: n.key}) {
		m.soloATGs++
	}
}

// markATGs marks every AppliedToGroup of target group g with one entry.
func (m *Model) markATGs(g *group) {
	if g.atgsMarked == m.epoch {
		return
	}
	g.atgsMarked = m.epoch
	m.mark(dkey{kind: dGroupATGs, a: g.key})
}

func (m *Model) markNP(p *policy) { m.mark(dkey{kind: dNetworkPolicy, a: p.objName}) }

// markPR marks every PodRealization slice of n.
func (m *Model) markPR(n *node) {
	if n.prMarked == m.epoch {
		return
	}
	n.prMarked = m.epoch
	for i := range n.prSlices {
		m.mark(dkey{kind: dPodRealization, b: n.key, i: int32(i)})
	}
}

// markPodPR marks the PodRealization slice of n that holds pd.
func (m *Model) markPodPR(n *node, pd *pod) {
	if n.prMarked == m.epoch {
		return
	}
	m.mark(dkey{kind: dPodRealization, b: n.key, i: n.prSlot(pd)})
}

// resizePR sets the number of n's PodRealization slices for its Pod count
// and capability: doubled while the Pods exceed prSliceSize per slice,
// halved while they would fit in a quarter of the slices (so a Pod count
// near a boundary does not move every Pod back and forth). A new count
// marks every slice before and after it: Pods move between them, and
// slices past the new count are deleted.
func (m *Model) resizePR(n *node) {
	s := n.prSlices
	switch {
	case !n.sliced:
		s = 1
	default:
		for len(n.pods) > s*m.prSliceSize {
			s *= 2
		}
		for s > 1 && len(n.pods)*4 <= s*m.prSliceSize {
			s /= 2
		}
	}
	if s == n.prSlices {
		return
	}
	for i := range max(s, n.prSlices) {
		m.mark(dkey{kind: dPodRealization, b: n.key, i: int32(i)})
	}
	n.prSlices = s
	n.prMarked = m.epoch
}

// TakeDirty returns the keys of every object that may have changed since
// the last call (including objects that must now be deleted) and forgets
// them, in the order they were first marked. That order keeps together
// the objects one change marks (the AppliedToGroups of a group a policy
// starts using, ...), so building them in it reuses what the build of the
// previous one read.
func (m *Model) TakeDirty() []Key {
	ents, n := m.dirtyEntries()
	out := make([]Key, 0, n)
	for _, e := range ents {
		if e.k.kind == dGroupATGs {
			out = m.appendGroupATGs(out, e.g)
		} else {
			out = append(out, e.k.key())
		}
	}
	if len(ents) > 1024 {
		// clear keeps a map's memory: after a burst (a cold start marks
		// every object), let the big table go.
		m.dirty = make(map[dkey]int32)
	} else {
		clear(m.dirty)
	}
	m.soloATGs = 0
	m.epoch++
	return out
}

// dirtyEntry is a dirty set entry being taken; g is the group of a
// dGroupATGs entry, nil when it has no AppliedToGroups now.
type dirtyEntry struct {
	k dkey
	g *group
}

// dirtyEntries returns the dirty set's entries in marking order and how
// many keys they stand for.
func (m *Model) dirtyEntries() ([]dirtyEntry, int) {
	ents := make([]dirtyEntry, len(m.dirty))
	n := 0
	for k, seq := range m.dirty {
		e := &ents[seq]
		e.k = k
		if k.kind != dGroupATGs {
			n++
		} else if e.g = m.atgGroup(k.a); e.g != nil {
			n += e.g.byNode.Len()
		}
	}
	return ents, n
}

// key returns the key of a dirty object (not of a dGroupATGs entry).
func (k dkey) key() Key {
	switch k.kind {
	case dAddressGroup:
		return Key{KindAddressGroup, k.a + "-" + strconv.Itoa(int(k.i))}
	case dAppliedToGroup:
		return Key{KindAppliedToGroup, k.a + "-" + k.b}
	case dNetworkPolicy:
		return Key{KindNetworkPolicy, k.a}
	}
	return Key{KindPodRealization, v1alpha1.PodRealizationName(k.b, int(k.i))}
}

// atgGroup returns the group a dGroupATGs entry names if it has
// AppliedToGroups now, else nil.
func (m *Model) atgGroup(key string) *group {
	if g := m.groups[key]; g != nil && g.targetRefs > 0 {
		return g
	}
	return nil
}

// appendGroupATGs appends the keys of the AppliedToGroups of g (none if
// nil), except those the dirty set holds on their own entry, which lists
// them.
func (m *Model) appendGroupATGs(out []Key, g *group) []Key {
	if g == nil {
		return out
	}
	for n := range g.byNode.Keys() {
		if m.soloATGs > 0 {
			if _, ok := m.dirty[dkey{kind: dAppliedToGroup, a: g.key, b: n.key}]; ok {
				continue
			}
		}
		out = append(out, Key{KindAppliedToGroup, atgName(g, n)})
	}
	return out
}

// mark adds k to the dirty set, numbering it in marking order, and
// reports whether it is new there.
func (m *Model) mark(k dkey) bool {
	if _, ok := m.dirty[k]; ok {
		return false
	}
	m.dirty[k] = int32(len(m.dirty))
	return true
}

// DirtyLen is the size of the dirty set, in which one entry may stand for
// all AppliedToGroups of a group: TakeDirty returns no key when it is 0.
func (m *Model) DirtyLen() int { return len(m.dirty) }

func (m *Model) ns(name string) *namespace {
	n := m.namespaces[name]
	if n == nil {
		n = &namespace{name: name, pods: make(map[string]*pod)}
		m.namespaces[name] = n
		m.clusterIdx.each(nil, nsMatcher, func(g *group) { n.cluster.Add(g) })
	}
	return n
}

// gcNamespace forgets an unknown namespace without Pods or groups.
func (m *Model) gcNamespace(n *namespace) {
	if !n.known && len(n.pods) == 0 && n.idx.n == 0 {
		delete(m.namespaces, n.name)
	}
}

func (m *Model) nodeFor(name string) *node {
	n := m.nodes[name]
	if n == nil {
		key := v1alpha1.NodeKey(name)
		_, sliced := m.prSlicing[name]
		n = &node{name: name, key: key, label: v1alpha1.SpanLabelPrefix + key, pods: make(map[*pod]struct{}),
			sliced: sliced, prSlices: 1}
		m.nodes[name] = n
		m.nodeByKey[n.key] = n
	}
	return n
}

func (m *Model) gcNode(n *node) {
	if !n.known && len(n.pods) == 0 {
		delete(m.nodes, n.name)
		delete(m.nodeByKey, n.key)
	}
}

func podMatcher(g *group) *matcher { return g.podM }
func nsMatcher(g *group) *matcher  { return g.nsM }

// ---- Nodes ----

// UpsertNode records a Node: its PodRealization exists from now on.
func (m *Model) UpsertNode(n *corev1.Node) {
	nd := m.nodeFor(n.Name)
	if !nd.known {
		nd.known = true
		m.markPR(nd)
	}
}

// SetPodRealizationSlicing records whether the agent of Node name reads
// its PodRealization in slices (it lists
// v1alpha1.PodRealizationSlicesCapability in its AgentInfo). Without it a
// Node keeps one PodRealization whatever its Pod count.
func (m *Model) SetPodRealizationSlicing(name string, on bool) {
	if _, was := m.prSlicing[name]; was == on {
		return
	}
	if on {
		m.prSlicing[name] = struct{}{}
	} else {
		delete(m.prSlicing, name)
	}
	if nd := m.nodes[name]; nd != nil {
		nd.sliced = on
		m.resizePR(nd)
	}
}

// DeleteNode forgets a Node; its PodRealization no longer exists.
func (m *Model) DeleteNode(name string) {
	nd := m.nodes[name]
	if nd == nil || !nd.known {
		return
	}
	nd.known = false
	m.markPR(nd)
	m.gcNode(nd)
}

// ---- Namespaces ----

// UpsertNamespace records a Namespace's labels; a relabel re-evaluates the
// namespace selectors of cluster-wide groups for it. Like UpsertPod, the
// model keeps ns.Labels without copying it.
func (m *Model) UpsertNamespace(ns *corev1.Namespace) {
	n := m.ns(ns.Name)
	n.known = true
	m.relabelNamespace(n, ns.Labels)
}

// DeleteNamespace forgets a Namespace's labels (its Pods go with their own
// delete events).
func (m *Model) DeleteNamespace(name string) {
	n := m.namespaces[name]
	if n == nil {
		return
	}
	n.known = false
	m.relabelNamespace(n, nil)
	m.gcNamespace(n)
}

func (m *Model) relabelNamespace(n *namespace, l map[string]string) {
	if mapsEqual(n.labels, l) && n.labels != nil {
		return
	}
	if l == nil {
		l = map[string]string{} // known, without labels
	}
	m.nsIdx.move(n, n.labels, l)
	n.labels = l
	var next set[*group]
	m.clusterIdx.each(n.labels, nsMatcher, func(g *group) { next.Add(g) })
	for g := range n.cluster.Keys() {
		if next.Has(g) {
			continue
		}
		for _, pd := range n.pods {
			m.leave(pd, g)
		}
	}
	for g := range next.Keys() {
		if n.cluster.Has(g) {
			continue
		}
		for _, pd := range n.pods {
			if pd.active && g.podM.matches(pd.labels) {
				m.join(pd, g)
			}
		}
	}
	n.cluster = next
}

// ---- Pods ----

// PodInfo is what the model reads of a Pod. The policy controller's
// informer keeps only this of each Pod, not the Pod itself.
type PodInfo struct {
	Namespace, Name, UID string
	// Labels is the Pod's label map (shared, not copied).
	Labels map[string]string
	// NodeName is spec.nodeName.
	NodeName string
	// Active: not hostNetwork, and phase neither Succeeded nor Failed.
	Active bool
	// IPs are status.podIPs (or status.podIP).
	IPs []string
	// Ports are the named container ports, in container order.
	Ports []v1alpha1.NamedPort
}

// PodInfoOf returns what the model reads of p.
func PodInfoOf(p *corev1.Pod) PodInfo {
	return PodInfo{Namespace: p.Namespace, Name: p.Name, UID: string(p.UID), Labels: p.Labels,
		NodeName: p.Spec.NodeName, IPs: podIPs(p), Ports: namedPorts(p),
		Active: !p.Spec.HostNetwork && p.Status.Phase != corev1.PodSucceeded && p.Status.Phase != corev1.PodFailed}
}

// UpsertPod records a Pod (its labels, spec.nodeName, status.podIPs,
// named container ports, phase and hostNetwork): UpsertPodInfo of
// PodInfoOf(p).
func (m *Model) UpsertPod(p *corev1.Pod) { m.UpsertPodInfo(PodInfoOf(p)) }

// UpsertPodInfo records a Pod and updates the groups it belongs to.
// Updates that change nothing the model reads are free. The model keeps
// p.Labels, p.IPs and p.Ports without copying them: like an informer
// cache's objects, they must not be mutated afterwards.
func (m *Model) UpsertPodInfo(p PodInfo) {
	n := m.ns(p.Namespace)
	pd := n.pods[p.Name]
	if pd != nil && pd.uid != p.UID {
		m.removePod(pd)
		pd = nil
	}
	if pd == nil {
		pd = &pod{ns: n, name: p.Name, uid: p.UID, prHash: v1alpha1.PodHash(p.Namespace, p.Name)}
		n.pods[p.Name] = pd
	} else if pd.active == p.Active && pd.node == p.NodeName && slices.Equal(pd.ips, p.IPs) &&
		slices.Equal(pd.ports, p.Ports) && mapsEqual(pd.labels, p.Labels) {
		return
	}
	m.updatePod(pd, p.Labels, p.NodeName, p.IPs, p.Ports, p.Active)
}

// DeletePod forgets a Pod.
func (m *Model) DeletePod(namespaceName, name string) {
	n := m.namespaces[namespaceName]
	if n == nil {
		return
	}
	if pd := n.pods[name]; pd != nil {
		m.removePod(pd)
		m.gcNamespace(n)
	}
}

func (m *Model) removePod(pd *pod) {
	m.updatePod(pd, nil, "", nil, nil, false)
	delete(pd.ns.pods, pd.name)
}

// updatePod moves pd to its new state, touching only the groups and
// objects its change affects.
func (m *Model) updatePod(pd *pod, lbls map[string]string, nodeName string, ips []string, ports []v1alpha1.NamedPort, active bool) {
	oldNode := ""
	if pd.active {
		oldNode = pd.node
	}
	newNode := ""
	if active {
		newNode = nodeName
	}
	// Desired groups.
	var want map[*group]struct{}
	if active {
		want = make(map[*group]struct{}, len(pd.groups)+2)
		pd.ns.idx.each(lbls, podMatcher, func(g *group) { want[g] = struct{}{} })
		for g := range pd.ns.cluster.Keys() {
			if g.podM.matches(lbls) {
				want[g] = struct{}{}
			}
		}
	}
	// Leave groups no longer wanted (with the old state).
	for i := 0; i < len(pd.groups); {
		g := pd.groups[i].g
		if _, ok := want[g]; ok {
			i++
			continue
		}
		m.leave(pd, g) // removes pd.groups[i]
	}
	// Move node membership.
	if oldNode != newNode {
		if oldNode != "" {
			on := m.nodes[oldNode]
			m.markPodPR(on, pd)
			delete(on.pods, pd)
			m.resizePR(on)
			for _, mb := range pd.groups {
				m.removeFromNode(mb.g, pd, on)
			}
			m.gcNode(on)
		}
		if newNode != "" {
			nn := m.nodeFor(newNode)
			nn.pods[pd] = struct{}{}
			m.resizePR(nn)
			for _, mb := range pd.groups {
				m.addToNode(mb.g, pd, nn)
			}
		}
	}
	ipsChanged := !slices.Equal(pd.ips, ips)
	portsChanged := !slices.Equal(pd.ports, ports)
	hadIPs := len(pd.ips) > 0
	if !mapsEqual(pd.labels, lbls) {
		pd.ns.podIdx.move(pd, pd.labels, lbls)
	}
	pd.labels, pd.node, pd.ips, pd.ports, pd.active = lbls, nodeName, ips, ports, active
	nn := m.podNode(pd)
	if nn != nil {
		m.markPodPR(nn, pd)
	}
	// Kept groups: refresh contents.
	if ipsChanged || portsChanged {
		for i := range pd.groups {
			mb := &pd.groups[i]
			g := mb.g
			if nn != nil && g.targetRefs > 0 {
				m.markATG(g, nn)
			}
			switch {
			case hadIPs && len(ips) == 0:
				m.releaseSlice(g, pd, mb.slice)
				mb.slice = -1
			case !hadIPs && len(ips) > 0:
				mb.slice = m.assignSlice(g, pd)
			case mb.slice >= 0:
				m.markSlice(g, int(mb.slice))
			}
		}
	}
	// Join new groups.
	for g := range want {
		if !inGroup(pd, g) {
			m.join(pd, g)
		}
	}
}

func (m *Model) join(pd *pod, g *group) {
	s := int32(-1)
	if len(pd.ips) > 0 {
		s = m.assignSlice(g, pd)
	}
	pd.groups = append(pd.groups, membership{g: g, slice: s})
	if n := m.podNode(pd); n != nil {
		m.addToNode(g, pd, n)
		if g.targetRefs > 0 {
			m.markPodPR(n, pd)
		}
	}
}

func (m *Model) leave(pd *pod, g *group) {
	i := slices.IndexFunc(pd.groups, func(mb membership) bool { return mb.g == g })
	if i < 0 {
		return
	}
	mb := pd.groups[i]
	pd.groups = slices.Delete(pd.groups, i, i+1)
	if mb.slice >= 0 {
		m.releaseSlice(g, pd, mb.slice)
	}
	if n := m.podNode(pd); n != nil {
		m.removeFromNode(g, pd, n)
		if g.targetRefs > 0 {
			m.markPodPR(n, pd)
		}
	}
}

// podNode returns the node of an active Pod with a Node, else nil.
func (m *Model) podNode(pd *pod) *node {
	if !pd.active || pd.node == "" {
		return nil
	}
	return m.nodes[pd.node]
}

func atgName(g *group, n *node) string { return g.key + "-" + n.key }

func agName(g *group, slice int) string { return g.key + "-" + strconv.Itoa(slice) }

func npName(uid string) string { return "np-" + uid }

func (m *Model) addToNode(g *group, pd *pod, n *node) {
	list := g.byNode.Ptr(n)
	*list = append(*list, pd)
	first := len(*list) == 1
	if g.targetRefs > 0 {
		m.markATG(g, n)
	}
	if first {
		m.groupNodeChanged(g, n, +1)
	}
}

func (m *Model) removeFromNode(g *group, pd *pod, n *node) {
	list, _ := g.byNode.Get(n)
	list, ok := removePod(list, pd)
	if !ok {
		return
	}
	if g.targetRefs > 0 {
		m.markATG(g, n)
	}
	if len(list) > 0 {
		g.byNode.Put(n, list)
	} else {
		g.byNode.Delete(n)
		m.groupNodeChanged(g, n, -1)
	}
}

// groupNodeChanged handles a target group gaining (+1) or losing (-1) its
// first/last member on a Node: the span of its policies and of the
// AddressGroups they use changes.
func (m *Model) groupNodeChanged(g *group, n *node, d int) {
	if g.targetRefs == 0 {
		return
	}
	for p := range g.policies.Keys() {
		m.markNP(p)
	}
	for ag := range g.peerAGs.Keys() {
		m.spanAdd(ag, n, d)
	}
}

// spanAdd adjusts the count of target groups giving ag a presence on node.
func (m *Model) spanAdd(ag *group, n *node, d int) {
	c, _ := ag.span.Get(n)
	c += d
	if c <= 0 {
		ag.span.Delete(n)
	} else {
		ag.span.Put(n, c)
	}
	if (d > 0 && c == 1) || (d < 0 && c == 0) {
		m.markAllSlices(ag)
	}
}

func (m *Model) exported(ag *group) bool { return ag.peerRefs > 0 && ag.span.Len() > 0 }

func (m *Model) markSlice(ag *group, s int) {
	if m.exported(ag) {
		m.mark(dkey{kind: dAddressGroup, a: ag.key, i: int32(s)})
	}
}

func (m *Model) markAllSlices(ag *group) {
	for i := range ag.slices {
		m.mark(dkey{kind: dAddressGroup, a: ag.key, i: int32(i)})
	}
}

// assignSlice puts pd into the lowest slice of g with room.
func (m *Model) assignSlice(g *group, pd *pod) int32 {
	for i, s := range g.slices {
		if len(s) < m.sliceSize {
			g.slices[i] = append(s, pd)
			m.markSlice(g, i)
			return int32(i)
		}
	}
	g.slices = append(g.slices, []*pod{pd})
	i := len(g.slices) - 1
	m.markSlice(g, i)
	m.sliceCountChanged(g)
	return int32(i)
}

func (m *Model) releaseSlice(g *group, pd *pod, s int32) {
	if s < 0 || int(s) >= len(g.slices) {
		return
	}
	g.slices[s], _ = removePod(g.slices[s], pd)
	m.markSlice(g, int(s))
	n := len(g.slices)
	for n > 0 && len(g.slices[n-1]) == 0 {
		n--
		m.markSlice(g, n)
	}
	if n != len(g.slices) {
		g.slices = g.slices[:n]
		m.sliceCountChanged(g)
	}
}

// sliceCountChanged invalidates the digests of the Pods targeted by
// policies using g as peer.
func (m *Model) sliceCountChanged(g *group) {
	for tg := range g.peerOf.Keys() {
		m.bumpDigest(tg)
	}
}

// bumpDigest invalidates the digest of every Pod in target group tg.
func (m *Model) bumpDigest(tg *group) {
	tg.ver++
	for n, pods := range tg.byNode.All() {
		if n.prSlices == 1 {
			m.markPR(n)
			continue
		}
		for _, pd := range pods {
			m.markPodPR(n, pd)
		}
	}
}

// ---- NetworkPolicies ----

// UpsertNetworkPolicy records a networking.k8s.io/v1 NetworkPolicy and
// recomputes its object. The groups of its new version are taken before
// those of the old one are released, so groups shared between versions
// (and with other policies) stay as they are.
func (m *Model) UpsertNetworkPolicy(np *networkingv1.NetworkPolicy) {
	nsName := np.Namespace + "/" + np.Name
	old := m.policies[nsName]
	spec, tgSel, peerSels := computeSpec(np)
	hash := realization.SpecHash(spec)
	if old != nil && old.uid == string(np.UID) && old.specHash == hash {
		return
	}
	p := &policy{nsName: nsName, objName: npName(string(np.UID)), uid: string(np.UID), spec: spec, specHash: hash}
	m.attach(p, tgSel, peerSels)
	if old != nil {
		m.detach(old)
	}
	m.policies[nsName] = p
	m.byObjName[p.objName] = p
}

// DeleteNetworkPolicy forgets a NetworkPolicy; its object no longer
// exists, nor do groups only it used.
func (m *Model) DeleteNetworkPolicy(namespaceName, name string) {
	nsName := namespaceName + "/" + name
	if p := m.policies[nsName]; p != nil {
		m.detach(p)
		delete(m.policies, nsName)
	}
}

func (m *Model) attach(p *policy, tgSel v1alpha1.GroupSelector, peerSels []keyedSel) {
	tg := m.acquire(tgSel, p.spec.AppliedToGroup)
	p.tg = tg
	tg.targetRefs++
	if tg.targetRefs == 1 {
		m.markATGs(tg)
	}
	tg.policies.Add(p)
	for _, ks := range peerSels {
		ag := m.acquire(ks.sel, ks.key)
		p.peers = append(p.peers, ag)
		ag.peerRefs++
		if ag.peerRefs == 1 && ag.span.Len() > 0 {
			m.markAllSlices(ag)
		}
		refs := tg.peerAGs.Ptr(ag)
		*refs++
		if *refs == 1 {
			ag.peerOf.Add(tg)
			for n := range tg.byNode.Keys() {
				m.spanAdd(ag, n, +1)
			}
		}
	}
	m.markNP(p)
	m.bumpDigest(tg)
}

func (m *Model) detach(p *policy) {
	tg := p.tg
	m.markNP(p)
	if m.byObjName[p.objName] == p {
		delete(m.byObjName, p.objName)
	}
	m.bumpDigest(tg)
	for _, ag := range p.peers {
		refs := tg.peerAGs.Ptr(ag)
		*refs--
		if *refs == 0 {
			tg.peerAGs.Delete(ag)
			ag.peerOf.Delete(tg)
			for n := range tg.byNode.Keys() {
				m.spanAdd(ag, n, -1)
			}
		}
		ag.peerRefs--
		if ag.peerRefs == 0 {
			m.markAllSlices(ag)
		}
	}
	tg.policies.Delete(p)
	tg.targetRefs--
	if tg.targetRefs == 0 {
		for n := range tg.byNode.Keys() {
			m.markATG(tg, n)
		}
	}
	m.releaseGroup(tg)
	for _, ag := range p.peers {
		m.releaseGroup(ag)
	}
}

// acquire returns the group of sel, creating and populating it if needed.
// sel is normalized and key is its GroupKey.
func (m *Model) acquire(sel v1alpha1.GroupSelector, key string) *group {
	if g := m.groups[key]; g != nil {
		return g
	}
	m.nextID++
	g := &group{id: m.nextID, key: key, sel: sel, podM: newMatcher(sel.PodSelector)}
	m.groups[key] = g
	populate := func(n *namespace) {
		forCandidates(n.pods, &n.podIdx, g.podM, func(pd *pod) {
			if pd.active && g.podM.matches(pd.labels) {
				m.join(pd, g)
			}
		})
	}
	if sel.NamespaceSelector == nil {
		n := m.ns(sel.Namespace)
		n.idx.add(g, g.podM)
		populate(n)
		return g
	}
	g.nsM = newMatcher(sel.NamespaceSelector)
	m.clusterIdx.add(g, g.nsM)
	forCandidates(m.namespaces, &m.nsIdx, g.nsM, func(n *namespace) {
		if !g.nsM.matches(n.labels) {
			return
		}
		n.cluster.Add(g)
		populate(n)
	})
	return g
}

// forCandidates calls fn for every item of all that may match mt: the
// items under mt's anchor pairs in idx, or all of them without an anchor.
func forCandidates[T comparable](all map[string]T, idx *labelIndex[T], mt *matcher, fn func(T)) {
	if mt.anchorKey == "" {
		for _, x := range all {
			fn(x)
		}
		return
	}
	for _, v := range mt.anchorVals {
		if s, ok := idx.Get(labelPair{mt.anchorKey, v}); ok {
			for x := range s.Keys() {
				fn(x)
			}
		}
	}
}

// labelIndex files items (Pods, namespaces) under each of their label
// pairs.
type labelIndex[T comparable] struct {
	smallMap[labelPair, set[T]]
}

// move refiles x from its old label pairs to its new ones.
func (idx *labelIndex[T]) move(x T, old, new map[string]string) {
	for k, v := range old {
		if w, ok := new[k]; ok && w == v {
			continue
		}
		p := labelPair{k, v}
		if s, ok := idx.Get(p); ok {
			s.Delete(x)
			if s.Len() == 0 {
				idx.Delete(p)
			} else {
				idx.Put(p, s)
			}
		}
	}
	for k, v := range new {
		if w, ok := old[k]; ok && w == v {
			continue
		}
		idx.Ptr(labelPair{k, v}).Add(x)
	}
}

// releaseGroup destroys g when no policy uses it any more.
func (m *Model) releaseGroup(g *group) {
	if g.targetRefs > 0 || g.peerRefs > 0 || m.groups[g.key] != g {
		return
	}
	leaveAll := func(n *namespace) {
		forCandidates(n.pods, &n.podIdx, g.podM, func(pd *pod) { m.leave(pd, g) })
	}
	if g.nsM != nil {
		for _, n := range m.namespaces {
			if n.cluster.Has(g) {
				leaveAll(n)
			}
		}
	} else {
		leaveAll(m.namespaces[g.sel.Namespace])
	}
	delete(m.groups, g.key)
	if g.nsM == nil {
		n := m.namespaces[g.sel.Namespace]
		n.idx.remove(g, g.podM)
		m.gcNamespace(n)
		return
	}
	m.clusterIdx.remove(g, g.nsM)
	for _, n := range m.namespaces {
		n.cluster.Delete(g)
	}
}

// ---- helpers ----

func inGroup(pd *pod, g *group) bool {
	for _, mb := range pd.groups {
		if mb.g == g {
			return true
		}
	}
	return false
}

// removePod removes pd from list (order is not kept).
func removePod(list []*pod, pd *pod) ([]*pod, bool) {
	for i, x := range list {
		if x == pd {
			last := len(list) - 1
			list[i] = list[last]
			list[last] = nil
			return list[:last], true
		}
	}
	return list, false
}

func podIPs(p *corev1.Pod) []string {
	var ips []string
	for _, ip := range p.Status.PodIPs {
		if ip.IP != "" {
			ips = append(ips, ip.IP)
		}
	}
	if len(ips) == 0 && p.Status.PodIP != "" {
		ips = []string{p.Status.PodIP}
	}
	return ips
}

// namedPorts lists the named ports of the Pod's containers in container
// order; the protocol defaults to TCP as in the Pod API.
func namedPorts(p *corev1.Pod) []v1alpha1.NamedPort {
	var out []v1alpha1.NamedPort
	for i := range p.Spec.Containers {
		for _, cp := range p.Spec.Containers[i].Ports {
			if cp.Name == "" {
				continue
			}
			proto := string(cp.Protocol)
			if proto == "" {
				proto = string(corev1.ProtocolTCP)
			}
			out = append(out, v1alpha1.NamedPort{Name: cp.Name, Protocol: proto, Port: cp.ContainerPort})
		}
	}
	return out
}

func mapsEqual(a, b map[string]string) bool {
	if len(a) != len(b) {
		return false
	}
	for k, v := range a {
		if w, ok := b[k]; !ok || w != v {
			return false
		}
	}
	return true
}

// splitName splits "<group key>-<rest>".
func splitName(name string) (string, string, bool) {
	return strings.Cut(name, "-")
}
