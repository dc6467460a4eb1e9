package agent

import (
	"context"
	"errors"
	"fmt"
	"hash/fnv"
	"slices"

	"github.com/seine-net/seine/datapath/flowsync"
	of "github.com/seine-net/seine/datapath/openflow"
	"github.com/seine-net/seine/policy/flows"
)

// numShards is the number of flowsync owners holding the flow entries that
// two or more policies want (see flowState).
const numShards = 32

// Owner names in the flowsync.Syncer.
const (
	ownerBase   = "policy/base"
	ownerPrefix = "policy/np/"
	shardPrefix = "policy/shared/"
)

func policyOwner(name string) string { return ownerPrefix + name }
func shardOwner(s int) string        { return fmt.Sprintf("%s%02d", shardPrefix, s) }

func shardOf(key string) int {
	h := fnv.New32a()
	h.Write([]byte(key))
	return int(h.Sum32() % numShards)
}

// flowState keeps, for every policy, the flows its translation wants, and
// installs their merge through a flowsync.Syncer so that each flow entry
// (table, priority, match) has exactly one owner:
//
//   - an entry wanted by one policy belongs to that policy's owner
//     ("policy/np/<name>"), so removing the policy removes exactly it;
//   - an entry wanted by several policies (a shared peer or Pod clause
//     carrying the conjunction actions of all of them) belongs to one of
//     numShards shared owners chosen by a hash of the entry key, holding
//     the merge (flows.MergeFlows).
//
// An update reaches the switch as one bundle (flowsync.SetMany), so a
// packet meets either the old merge or the new one. Inside it, and owner
// by owner when the switch refuses the bundle, an entry changing owner is
// first added to its new owner, then dropped by the old one (flowsync keeps
// an entry while any owner wants it), so no packet sees it missing. Memory
// is linear in the number of entries.
// It is not safe for concurrent use.
type flowState struct {
	sync    *flowsync.Syncer
	contrib map[string]map[string]of.Flow  // policy → entry key → its flow
	index   map[string]map[string]struct{} // entry key → contributing policies
	shards  [numShards]map[string]of.Flow  // installed shared entries
}

func newFlowState(s *flowsync.Syncer) *flowState {
	fs := &flowState{sync: s, contrib: map[string]map[string]of.Flow{}, index: map[string]map[string]struct{}{}}
	for i := range fs.shards {
		fs.shards[i] = map[string]of.Flow{}
	}
	return fs
}

// merged returns the flow the switch should hold for key, ok false when no
// policy wants it.
func (s *flowState) merged(key string) (of.Flow, bool) {
	var out of.Flow
	first := true
	for p := range s.index[key] {
		f := s.contrib[p][key]
		if first {
			out, first = f, false
			continue
		}
		out = flows.MergeFlows(out, f)
	}
	return out, !first
}

// update replaces the wanted flows of the given policies (nil or empty:
// the policy is gone) and installs the result. It returns the policies
// whose own owner was installed, and an error naming every owner that
// failed; the wanted state is kept either way, so calling update again
// with the same policies retries.
func (s *flowState) update(ctx context.Context, want map[string][]of.Flow) (map[string]bool, error) {
	changed := map[string]struct{}{}
	// Owners to re-install: the updated policies, any policy that gains or
	// loses sole ownership of a changed entry, and the shards of changed
	// entries.
	owners := map[string]struct{}{}
	sole := func(k string) {
		if len(s.index[k]) == 1 {
			for p := range s.index[k] {
				owners[p] = struct{}{}
			}
		}
	}
	for p, fl := range want {
		owners[p] = struct{}{}
		for k := range s.contrib[p] {
			changed[k] = struct{}{}
			sole(k)
			delete(s.index[k], p)
			if len(s.index[k]) == 0 {
				delete(s.index, k)
			}
		}
		if len(fl) == 0 {
			delete(s.contrib, p)
			continue
		}
		m := make(map[string]of.Flow, len(fl))
		for _, f := range fl {
			k := flows.FlowKey(f)
			m[k] = f
			changed[k] = struct{}{}
			sole(k)
			if s.index[k] == nil {
				s.index[k] = map[string]struct{}{}
			}
			s.index[k][p] = struct{}{}
		}
		s.contrib[p] = m
	}
	shardNew := map[int]map[string]of.Flow{}
	for k := range changed {
		sh := shardOf(k)
		if shardNew[sh] == nil {
			shardNew[sh] = map[string]of.Flow{}
		}
		switch len(s.index[k]) {
		case 0:
		case 1:
			for p := range s.index[k] {
				owners[p] = struct{}{}
			}
		default:
			f, _ := s.merged(k)
			shardNew[sh][k] = f
		}
	}
	// The three phases below, as lists of updates: shards gain their new
	// shared entries (keeping the old ones), policy owners get exactly
	// their exclusive entries, shards drop the entries no longer shared.
	var gain, own, drop []flowsync.Update
	var dropShard []int // the shard of each update in drop
	nextShards := map[int]map[string]of.Flow{}
	for sh, add := range shardNew {
		cur := s.shards[sh]
		fl := make([]of.Flow, 0, len(cur)+len(add))
		next := make(map[string]of.Flow, len(cur))
		for k, f := range cur {
			if _, ok := add[k]; !ok {
				fl = append(fl, f)
			}
			if _, ok := changed[k]; !ok {
				next[k] = f
			}
		}
		for k, f := range add {
			fl = append(fl, f)
			next[k] = f
		}
		gain = append(gain, flowsync.Update{Owner: shardOwner(sh), Flows: fl})
		final := make([]of.Flow, 0, len(next))
		for _, f := range next {
			final = append(final, f)
		}
		drop = append(drop, flowsync.Update{Owner: shardOwner(sh), Flows: final})
		dropShard = append(dropShard, sh)
		nextShards[sh] = next
	}
	ownerOf := map[string]string{} // flowsync owner → policy
	for p := range owners {
		var fl []of.Flow
		for k, f := range s.contrib[p] {
			if len(s.index[k]) == 1 {
				fl = append(fl, f)
			}
		}
		own = append(own, flowsync.Update{Owner: policyOwner(p), Flows: fl})
		ownerOf[policyOwner(p)] = p
	}
	done := map[string]bool{}
	// First as one bundle: the switch goes from the old merge to the new
	// in one step, so no packet meets a conjunction whose clauses are
	// half old and half new (say a rule's new peers with its old ports,
	// which neither version allows).
	all := slices.Concat(gain, own, drop)
	if len(all) == 0 {
		return done, nil
	}
	if err := s.sync.SetMany(ctx, all); err == nil {
		for _, u := range own {
			done[ownerOf[u.Owner]] = true
		}
		for sh, next := range nextShards {
			s.shards[sh] = next
		}
		return done, nil
	}
	// The switch refused it (one bad flow fails the whole bundle): owner
	// by owner in the same order, so that only the owners holding the
	// bad flow fail, and no entry is missing in between.
	var errs []error
	for _, u := range gain {
		if err := s.sync.Set(ctx, u.Owner, u.Flows); err != nil {
			errs = append(errs, err)
		}
	}
	for _, u := range own {
		if err := s.sync.Set(ctx, u.Owner, u.Flows); err != nil {
			errs = append(errs, err)
			continue
		}
		done[ownerOf[u.Owner]] = true
	}
	for i, u := range drop {
		if err := s.sync.Set(ctx, u.Owner, u.Flows); err != nil {
			errs = append(errs, err)
			continue
		}
		s.shards[dropShard[i]] = nextShards[dropShard[i]]
	}
	if len(errs) > 0 {
		// A shard that failed leaves its policies not done, so they
		// are retried.
		for p := range want {
			delete(done, p)
		}
	}
	return done, errors.Join(errs...)
}

// count returns the number of distinct flow entries wanted.
func (s *flowState) count() int { return len(s.index) }
