// Package stats holds the order statistics the benchmarks report, so that
// every benchmark (tests/bench, tests/e2e/realnodes) computes a percentile
// the same way.
package stats

import (
	"cmp"
	"slices"
)

// Quantile returns the p-quantile of v (0 ≤ p ≤ 1) by nearest rank: the
// value at index round(p·(n−1)) of v sorted, so 0.5 of an even count is
// the upper of the two middle values. v is left as it is; it must not be
// empty.
func Quantile[T cmp.Ordered](v []T, p float64) T {
	s := slices.Clone(v)
	slices.Sort(s)
	return s[int(p*float64(len(s)-1)+0.5)]
}

// Median is Quantile(v, 0.5).
func Median[T cmp.Ordered](v []T) T { return Quantile(v, 0.5) }
