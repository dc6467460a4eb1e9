package compute

import (
	"math/rand/v2"
	"testing"
)

// TestSmallMapAgainstMap applies random puts and deletes to a smallMap and
// a Go map and compares them after every step, across the index threshold
// in both directions.
func TestSmallMapAgainstMap(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	var s smallMap[int, int]
	want := map[int]int{}
	for step := 0; step < 20000; step++ {
		k := r.IntN(3 * smallMapMax)
		switch r.IntN(3) {
		case 2:
			// Ptr adds a missing key with the zero value; writes through
			// the pointer land in the map.
			*s.Ptr(k) += 1000
			want[k] += 1000
		case 0:
			_, existed := want[k]
			if isNew := s.Put(k, step); isNew == existed {
				t.Fatalf("step %d: Put(%d) new=%v, but present=%v", step, k, isNew, existed)
			}
			want[k] = step
		default:
			_, existed := want[k]
			if got := s.Delete(k); got != existed {
				t.Fatalf("step %d: Delete(%d)=%v, want %v", step, k, got, existed)
			}
			delete(want, k)
		}
		if s.Len() != len(want) {
			t.Fatalf("step %d: Len %d, want %d", step, s.Len(), len(want))
		}
		if s.index == nil && s.Len() > smallMapMax {
			t.Fatalf("step %d: %d entries without an index", step, s.Len())
		}
		seen := 0
		for k, v := range s.All() {
			seen++
			if want[k] != v {
				t.Fatalf("step %d: entry %d=%d, want %d", step, k, v, want[k])
			}
		}
		if seen != len(want) {
			t.Fatalf("step %d: All yielded %d entries, want %d", step, seen, len(want))
		}
		for k, v := range want {
			if got, ok := s.Get(k); !ok || got != v {
				t.Fatalf("step %d: Get(%d)=%d,%v want %d", step, k, got, ok, v)
			}
		}
	}
}

func TestSetAdd(t *testing.T) {
	var s set[string]
	if !s.Add("a") || s.Add("a") || !s.Has("a") || s.Has("b") || s.Len() != 1 {
		t.Fatalf("set after adding a twice: %+v", s.entries)
	}
	if !s.Delete("a") || s.Delete("a") || s.Len() != 0 || s.entries != nil {
		t.Fatalf("set after deleting a: %+v", s.entries)
	}
}
