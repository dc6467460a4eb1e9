package flows

import (
	"sort"

	"github.com/seine-net/seine/datapath/flowsync"
	of "github.com/seine-net/seine/datapath/openflow"
	"github.com/seine-net/seine/policy/apis/controlplane/v1alpha1"
)

// FlowKey identifies a flow entry (table, priority, match), as the switch
// and flowsync do.
func FlowKey(f of.Flow) string { return flowsync.Key(f) }

func conjOnly(acts []of.Action) bool {
	if len(acts) == 0 {
		return false
	}
	for _, a := range acts {
		if _, ok := a.(of.Conjunction); !ok {
			return false
		}
	}
	return true
}

// MergeFlows combines two flows of the same entry (same FlowKey), wanted by
// two rules or two policies, into the one flow the switch can hold:
//
//   - both carry only conjunction actions: the union of them, sorted by
//     ID and clause (ovs-fields(7): a flow may carry several conjunction
//     actions, their order is not significant);
//   - otherwise the flow without conjunction actions wins (a plain allow or
//     a drop: every policy wants the same actions for such an entry).
//
// The cookie is the lower of the two, so the result does not depend on the
// order of merging.
func MergeFlows(a, b of.Flow) of.Flow {
	out := a
	if b.Cookie < out.Cookie {
		out.Cookie = b.Cookie
	}
	ca, cb := conjOnly(a.Actions), conjOnly(b.Actions)
	switch {
	case ca && cb:
		seen := map[of.Conjunction]bool{}
		var acts []of.Conjunction
		for _, l := range [][]of.Action{a.Actions, b.Actions} {
			for _, x := range l {
				c := x.(of.Conjunction)
				if !seen[c] {
					seen[c] = true
					acts = append(acts, c)
				}
			}
		}
		sort.Slice(acts, func(i, j int) bool {
			if acts[i].ID != acts[j].ID {
				return acts[i].ID < acts[j].ID
			}
			return acts[i].Clause < acts[j].Clause
		})
		out.Actions = make([]of.Action, len(acts))
		for i, c := range acts {
			out.Actions[i] = c
		}
	case ca:
		out.Actions = b.Actions
	default:
		out.Actions = a.Actions
	}
	return out
}

// MergeAll merges flows of any number of policies into one flow per entry,
// sorted by FlowKey.
func MergeAll(sets ...[]of.Flow) []of.Flow {
	m := map[string]of.Flow{}
	for _, fs := range sets {
		for _, f := range fs {
			k := FlowKey(f)
			if old, ok := m[k]; ok {
				f = MergeFlows(old, f)
			}
			m[k] = f
		}
	}
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	out := make([]of.Flow, len(keys))
	for i, k := range keys {
		out[i] = m[k]
	}
	return out
}

// MapSource is a Source held in maps, for callers that assemble the state
// themselves (tests, benchmarks, tools).
type MapSource struct {
	// AppliedToGroups maps a group key to this Node's members.
	AppliedToGroups map[string][]v1alpha1.GroupMember
	// AddressGroups maps a group key to the members of all its slices.
	AddressGroups map[string][]v1alpha1.GroupMember
	// Pods maps "namespace/name" to the attached local Pod.
	Pods map[string]Pod
}

// AppliedTo implements Source.
func (s *MapSource) AppliedTo(g string) []v1alpha1.GroupMember { return s.AppliedToGroups[g] }

// AddressGroup implements Source.
func (s *MapSource) AddressGroup(g string) []v1alpha1.GroupMember { return s.AddressGroups[g] }

// LocalPod implements Source.
func (s *MapSource) LocalPod(ns, name string) (Pod, bool) {
	p, ok := s.Pods[ns+"/"+name]
	return p, ok
}
