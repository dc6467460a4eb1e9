package agent

import (
	"errors"
	"fmt"
	"slices"
	"sort"
	"time"

	"github.com/seine-net/seine/policy/apis/controlplane/v1alpha1"
	"github.com/seine-net/seine/policy/realization"
)

// markDirtyLocked schedules a policy for translation, noting when it first
// became dirty. a.mu must be held.
func (a *Agent) markDirtyLocked(name string) { a.markDirtyAtLocked(name, time.Now()) }

// markDirtyAtLocked is markDirtyLocked for a change first seen at t (kept
// if earlier than what is recorded).
func (a *Agent) markDirtyAtLocked(name string, t time.Time) {
	a.dirty[name] = true
	if old, ok := a.dirtySince[name]; !ok || (!t.IsZero() && t.Before(old)) {
		a.dirtySince[name] = t
	}
}

// PolicyState is one computed NetworkPolicy as this Node's agent holds it.
type PolicyState struct {
	// Object is the computed policy from the agent's cache (shared: do not
	// modify).
	Object *v1alpha1.NetworkPolicy
	// Installed: flows for the policy's current spec are installed.
	Installed bool
	// Targets are the local Pods ("namespace/name") the installed flows
	// cover.
	Targets []string
	// Flows is the number of flows the policy's translation wants
	// (entries shared with other policies count for each).
	Flows int
	// Cookie and ConjIDs identify the installed flows: the policy's own
	// entries carry Cookie, shared clause entries a conjunction action
	// with one of ConjIDs, and the conj_id flows match one.
	Cookie  uint64
	ConjIDs []uint32
}

// View is a copy of what the agent holds, for operators.
type View struct {
	Policies        []PolicyState
	AppliedToGroups []*v1alpha1.AppliedToGroup
	AddressGroups   []*v1alpha1.AddressGroup
	// PodRealizations are this Node's: one object, or its slices, by name.
	PodRealizations []*v1alpha1.PodRealization
}

// View returns the computed objects in the agent's caches and what of
// them is installed. It is empty before the agent runs.
func (a *Agent) View() View {
	a.mu.Lock()
	defer a.mu.Unlock()
	var v View
	if !a.informed {
		return v
	}
	for _, o := range a.npInf.GetStore().List() {
		np := o.(*v1alpha1.NetworkPolicy)
		ps := PolicyState{Object: np}
		if d := a.done[np.Name]; d != nil {
			ps.Installed = !a.dirty[np.Name] && d.digest.SpecHash == realization.SpecHash(np.Spec)
			for k := range d.targets {
				ps.Targets = append(ps.Targets, k)
			}
			sort.Strings(ps.Targets)
			ps.Flows, ps.Cookie, ps.ConjIDs = d.flows, d.cookie, slices.Clone(d.conjIDs)
		}
		v.Policies = append(v.Policies, ps)
	}
	sort.Slice(v.Policies, func(i, j int) bool { return v.Policies[i].Object.Name < v.Policies[j].Object.Name })
	for _, o := range a.atgInf.GetStore().List() {
		v.AppliedToGroups = append(v.AppliedToGroups, o.(*v1alpha1.AppliedToGroup))
	}
	sort.Slice(v.AppliedToGroups, func(i, j int) bool { return v.AppliedToGroups[i].Name < v.AppliedToGroups[j].Name })
	for _, o := range a.agInf.GetStore().List() {
		v.AddressGroups = append(v.AddressGroups, o.(*v1alpha1.AddressGroup))
	}
	sort.Slice(v.AddressGroups, func(i, j int) bool { return v.AddressGroups[i].Name < v.AddressGroups[j].Name })
	for _, o := range a.prInf.GetStore().List() {
		v.PodRealizations = append(v.PodRealizations, o.(*v1alpha1.PodRealization))
	}
	sort.Slice(v.PodRealizations, func(i, j int) bool { return v.PodRealizations[i].Name < v.PodRealizations[j].Name })
	return v
}

// RealizedPolicies maps each computed policy whose current spec is
// installed to the generation of its source NetworkPolicy.
func (a *Agent) RealizedPolicies() map[string]int64 {
	out := map[string]int64{}
	for _, p := range a.View().Policies {
		if p.Installed {
			out[p.Object.Name] = p.Object.Spec.Source.Generation
		}
	}
	return out
}

// Realized is nil when the agent has synced and its last installation of
// flows (and isolation) succeeded: every policy object it holds is
// enforced, none has waited longer than RealizeTimeout for its
// AppliedToGroup. Otherwise it says why not.
func (a *Agent) Realized() error {
	if !a.synced.Load() {
		return errors.New("the policy agent has not installed its initial state yet")
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.lastErr != nil {
		return fmt.Errorf("installing policy flows failed: %w", a.lastErr)
	}
	// The controller writes a policy and its groups concurrently, so a
	// policy may wait a moment in normal operation; only a wait past
	// RealizeTimeout counts.
	var late []string
	for name, w := range a.awaiting {
		if time.Since(w.since) > a.cfg.RealizeTimeout {
			late = append(late, name)
		}
	}
	if len(late) > 0 {
		slices.Sort(late)
		return fmt.Errorf("%d NetworkPolicy(s) waited more than %s for this Node's part of their AppliedToGroup, first %s (group %s)",
			len(late), a.cfg.RealizeTimeout, late[0], a.awaiting[late[0]].group)
	}
	return nil
}
