package compute

import (
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"slices"
	"sort"
	"strings"

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
// The input is not modified; the result may share its selectors.
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

// normalizeLabelSelector returns nil for a nil or empty selector, ls
// itself when it is already canonical (the common case: matchLabels only,
// since a map has no order), and a sorted copy otherwise. Informer objects
// are immutable, so sharing ls is safe.
func normalizeLabelSelector(ls *metav1.LabelSelector) *metav1.LabelSelector {
	if ls == nil || (len(ls.MatchLabels) == 0 && len(ls.MatchExpressions) == 0) {
		return nil
	}
	if canonicalExpressions(ls.MatchExpressions) {
		return ls
	}
	out := &metav1.LabelSelector{MatchLabels: ls.MatchLabels}
	for _, e := range ls.MatchExpressions {
		vals := append([]string(nil), e.Values...)
		sort.Strings(vals)
		vals = slices.Compact(vals)
		out.MatchExpressions = append(out.MatchExpressions, metav1.LabelSelectorRequirement{
			Key: e.Key, Operator: e.Operator, Values: vals,
		})
	}
	slices.SortFunc(out.MatchExpressions, compareRequirements)
	return out
}

// compareRequirements orders expressions by key, operator and values.
func compareRequirements(a, b metav1.LabelSelectorRequirement) int {
	if a.Key != b.Key {
		return strings.Compare(a.Key, b.Key)
	}
	if a.Operator != b.Operator {
		return strings.Compare(string(a.Operator), string(b.Operator))
	}
	return slices.Compare(a.Values, b.Values)
}

// canonicalExpressions reports whether es is sorted with compareRequirements
// and each one's values are sorted without duplicates.
func canonicalExpressions(es []metav1.LabelSelectorRequirement) bool {
	for i, e := range es {
		if i > 0 && compareRequirements(es[i-1], e) > 0 {
			return false
		}
		for j := 1; j < len(e.Values); j++ {
			if e.Values[j-1] >= e.Values[j] {
				return false
			}
		}
	}
	return true
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
	byPair smallMap[labelPair, set[*group]]
	rest   set[*group]
	n      int
}

func (ix *selIndex) add(g *group, m *matcher) {
	ix.n++
	if m.anchorKey == "" {
		ix.rest.Add(g)
		return
	}
	for _, v := range m.anchorVals {
		ix.byPair.Ptr(labelPair{m.anchorKey, v}).Add(g)
	}
}

func (ix *selIndex) remove(g *group, m *matcher) {
	ix.n--
	if m.anchorKey == "" {
		ix.rest.Delete(g)
		return
	}
	for _, v := range m.anchorVals {
		p := labelPair{m.anchorKey, v}
		if s, ok := ix.byPair.Get(p); ok {
			s.Delete(g)
			if s.Len() == 0 {
				ix.byPair.Delete(p)
			} else {
				ix.byPair.Put(p, s)
			}
		}
	}
}

// each calls fn for every group whose selector m(g) matches l. A group
// filed under several anchor values is reached at most once, since a label
// key has one value.
func (ix *selIndex) each(l map[string]string, m func(*group) *matcher, fn func(*group)) {
	for g := range ix.rest.Keys() {
		if m(g).matches(l) {
			fn(g)
		}
	}
	if ix.byPair.Len() == 0 {
		return
	}
	for k, v := range l {
		s, _ := ix.byPair.Get(labelPair{k, v})
		for g := range s.Keys() {
			if m(g).matches(l) {
				fn(g)
			}
		}
	}
}
