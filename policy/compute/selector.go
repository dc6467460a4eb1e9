package compute

import (
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"slices"
	"sort"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"

	"github.com/seine-net/seine/policy/apis/controlplane/v1alpha1"
)

// groupKeyHexLen is how many hex digits of SHA-256 a group key keeps (64
// bits: no collision is expected below billions of distinct selectors).
const groupKeyHexLen = 16

// GroupKey returns the key of a group: "g" and the first 16 hex digits of
// the SHA-256 of a canonical, length-prefixed encoding of the normalized
// selector (see NormalizeGroupSelector). Equal selectors — however their
// maps and lists are ordered — give equal keys, so policies share groups.
// Keys contain no "-", which object names use as separator.
func GroupKey(sel v1alpha1.GroupSelector) string {
	return groupKeyNorm(NormalizeGroupSelector(sel))
}

// groupKeyNorm is GroupKey of an already normalized selector.
func groupKeyNorm(n v1alpha1.GroupSelector) string {
	var arr [256]byte
	b := appendStr(arr[:0], n.Namespace)
	b = appendSelector(b, n.PodSelector)
	b = appendSelector(b, n.NamespaceSelector)
	h := sha256.Sum256(b)
	var out [1 + groupKeyHexLen]byte
	out[0] = 'g'
	hex.Encode(out[1:], h[:groupKeyHexLen/2])
	return string(out[:])
}

func appendStr(b []byte, s string) []byte {
	b = binary.AppendUvarint(b, uint64(len(s)))
	return append(b, s...)
}

// appendSelector encodes a normalized selector: 'N' for nil, else 'S', the
// sorted labels and the (already sorted) expressions, all length-prefixed.
func appendSelector(b []byte, ls *metav1.LabelSelector) []byte {
	if ls == nil {
		return append(b, 'N')
	}
	b = append(b, 'S')
	keys := make([]string, 0, len(ls.MatchLabels))
	for k := range ls.MatchLabels {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	b = binary.AppendUvarint(b, uint64(len(keys)))
	for _, k := range keys {
		b = appendStr(appendStr(b, k), ls.MatchLabels[k])
	}
	b = binary.AppendUvarint(b, uint64(len(ls.MatchExpressions)))
	for _, e := range ls.MatchExpressions {
		b = appendStr(appendStr(b, e.Key), string(e.Operator))
		b = binary.AppendUvarint(b, uint64(len(e.Values)))
		for _, v := range e.Values {
			b = appendStr(b, v)
		}
	}
	return b
}

// NormalizeGroupSelector returns sel in canonical form: an empty
// PodSelector becomes nil (both select every Pod); an empty
// NamespaceSelector becomes a non-nil empty selector (every namespace);
// Namespace is cleared when NamespaceSelector is set; expressions are
// sorted by key, operator and values, and values sorted and deduplicated.
// The input is not modified.
func NormalizeGroupSelector(sel v1alpha1.GroupSelector) v1alpha1.GroupSelector {
	out := v1alpha1.GroupSelector{Namespace: sel.Namespace}
	out.PodSelector = normalizeLabelSelector(sel.PodSelector)
	if sel.NamespaceSelector != nil {
		out.Namespace = ""
		out.NamespaceSelector = normalizeLabelSelector(sel.NamespaceSelector)
		if out.NamespaceSelector == nil {
			out.NamespaceSelector = &metav1.LabelSelector{}
		}
	}
	return out
}

// normalizeLabelSelector returns nil for a nil or empty selector and a
// sorted copy otherwise.
func normalizeLabelSelector(ls *metav1.LabelSelector) *metav1.LabelSelector {
	if ls == nil || (len(ls.MatchLabels) == 0 && len(ls.MatchExpressions) == 0) {
		return nil
	}
	out := &metav1.LabelSelector{}
	if len(ls.MatchLabels) > 0 {
		out.MatchLabels = make(map[string]string, len(ls.MatchLabels))
		for k, v := range ls.MatchLabels {
			out.MatchLabels[k] = v
		}
	}
	for _, e := range ls.MatchExpressions {
		vals := append([]string(nil), e.Values...)
		sort.Strings(vals)
		vals = slices.Compact(vals)
		out.MatchExpressions = append(out.MatchExpressions, metav1.LabelSelectorRequirement{
			Key: e.Key, Operator: e.Operator, Values: vals,
		})
	}
	sort.Slice(out.MatchExpressions, func(i, j int) bool {
		a, b := out.MatchExpressions[i], out.MatchExpressions[j]
		if a.Key != b.Key {
			return a.Key < b.Key
		}
		if a.Operator != b.Operator {
			return a.Operator < b.Operator
		}
		return slices.Compare(a.Values, b.Values) < 0
	})
	return out
}

// matcher evaluates one label selector. anchorKey/anchorVals, when
// anchorKey is set, name a label every matching set must have with one of
// the values; the selector index uses them to skip selectors that cannot
// match.
type matcher struct {
	sel        labels.Selector
	anchorKey  string
	anchorVals []string
}

// newMatcher compiles a normalized selector; nil selects everything. An
// invalid selector (e.g. an unknown operator) selects nothing, as the API
// server would have rejected it anyway.
func newMatcher(ls *metav1.LabelSelector) *matcher {
	if ls == nil {
		return &matcher{sel: labels.Everything()}
	}
	s, err := metav1.LabelSelectorAsSelector(ls)
	if err != nil {
		return &matcher{sel: labels.Nothing()}
	}
	m := &matcher{sel: s}
	if len(ls.MatchLabels) > 0 {
		keys := make([]string, 0, len(ls.MatchLabels))
		for k := range ls.MatchLabels {
			keys = append(keys, k)
		}
		sort.Strings(keys)
		m.anchorKey, m.anchorVals = keys[0], []string{ls.MatchLabels[keys[0]]}
		return m
	}
	for _, e := range ls.MatchExpressions {
		if e.Operator == metav1.LabelSelectorOpIn && len(e.Values) > 0 {
			m.anchorKey, m.anchorVals = e.Key, e.Values
			break
		}
	}
	return m
}

func (m *matcher) matches(l map[string]string) bool { return m.sel.Matches(labels.Set(l)) }

// labelPair is one key=value of an index.
type labelPair struct{ k, v string }

// selIndex finds the groups whose selector may match a label set without
// evaluating every selector: selectors with an anchor are filed under each
// anchor pair, the others are always candidates.
type selIndex struct {
	byPair map[labelPair]map[*group]struct{}
	rest   map[*group]struct{}
	n      int
}

func (ix *selIndex) add(g *group, m *matcher) {
	ix.n++
	if m.anchorKey == "" {
		if ix.rest == nil {
			ix.rest = make(map[*group]struct{})
		}
		ix.rest[g] = struct{}{}
		return
	}
	if ix.byPair == nil {
		ix.byPair = make(map[labelPair]map[*group]struct{})
	}
	for _, v := range m.anchorVals {
		p := labelPair{m.anchorKey, v}
		s := ix.byPair[p]
		if s == nil {
			s = make(map[*group]struct{}, 1)
			ix.byPair[p] = s
		}
		s[g] = struct{}{}
	}
}

func (ix *selIndex) remove(g *group, m *matcher) {
	ix.n--
	if m.anchorKey == "" {
		delete(ix.rest, g)
		return
	}
	for _, v := range m.anchorVals {
		p := labelPair{m.anchorKey, v}
		if s := ix.byPair[p]; s != nil {
			delete(s, g)
			if len(s) == 0 {
				delete(ix.byPair, p)
			}
		}
	}
}

// each calls fn for every group whose selector m(g) matches l. A group
// filed under several anchor values is reached at most once, since a label
// key has one value.
func (ix *selIndex) each(l map[string]string, m func(*group) *matcher, fn func(*group)) {
	for g := range ix.rest {
		if m(g).matches(l) {
			fn(g)
		}
	}
	if len(ix.byPair) == 0 {
		return
	}
	for k, v := range l {
		for g := range ix.byPair[labelPair{k, v}] {
			if m(g).matches(l) {
				fn(g)
			}
		}
	}
}
