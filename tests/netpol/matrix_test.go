package netpol

import (
	"strings"
	"testing"
)

func TestDiffRendersTables(t *testing.T) {
	pods := []PodID{{"x", "a"}, {"x", "b"}}
	want := NewMatrix(pods, true)
	got := NewMatrix(pods, true)
	if d := Diff("TCP/80", want, got); d != "" {
		t.Fatalf("equal tables differ: %s", d)
	}
	want.Set(0, 1, false)
	d := Diff("TCP/80", want, got)
	for _, s := range []string{"TCP/80: 1 of 4 cells differ", "expected", "observed", "comparison",
		"x/a   .     X",                // expected row x/a: to x/a allowed, to x/b denied
		"x/a   .     X\nx/b   .     .", // comparison marks only (x/a, x/b)
	} {
		if !strings.Contains(d, s) {
			t.Errorf("diff lacks %q:\n%s", s, d)
		}
	}
	if n := want.Mismatches(got); n != 1 {
		t.Errorf("mismatches %d, want 1", n)
	}
	if p := want.Pairs(false); len(p) != 1 || p[0] != [2]int{0, 1} {
		t.Errorf("denied pairs %v", p)
	}
}
