package stats

import (
	"testing"
	"time"
)

// Nearest rank over the sorted values, the input untouched.
func TestQuantile(t *testing.T) {
	v := []float64{9, 1, 7, 3, 5, 8, 2, 6, 4, 10}
	for _, tc := range []struct{ p, want float64 }{{0, 1}, {0.25, 3}, {0.5, 6}, {0.75, 8}, {0.99, 10}, {1, 10}} {
		if got := Quantile(v, tc.p); got != tc.want {
			t.Errorf("Quantile(%v) = %v; want %v", tc.p, got, tc.want)
		}
	}
	if got := Median([]time.Duration{3, 1, 2}); got != 2 {
		t.Errorf("median of 3, 1, 2 = %v; want 2", got)
	}
	if v[0] != 9 {
		t.Errorf("Quantile sorted its input: %v", v)
	}
}
