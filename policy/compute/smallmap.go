package compute

import "iter"

// smallMapMax is how many entries a smallMap holds before it adds a hash
// index. Up to 16 entries a linear search costs about what a Go map
// lookup does, while it reads one slice instead of a map's header,
// directory and table, and saves the map's hundreds of bytes.
const smallMapMax = 16

// smallMap is a map for the model's many tiny associations (a group's
// Nodes, the Pods under one label pair, the policies of one group): its
// entries live in a slice found by linear search, and only past
// smallMapMax entries does it add a Go map from key to slice position.
// One entry costs its key and value instead of the ~100–400 bytes of a Go
// map's first group and header. The zero value is empty and ready to use.
// Deleting moves the last entry into the hole, so iteration order is
// unspecified, as with a Go map; the map must not be changed while All or
// Keys iterates over it.
type smallMap[K comparable, V any] struct {
	entries []smallEntry[K, V]
	index   map[K]int32
}

// smallEntry puts the value first: a zero-size value (sets) then adds no
// padding after the key.
type smallEntry[K comparable, V any] struct {
	val V
	key K
}

// Len returns the number of entries.
func (s *smallMap[K, V]) Len() int { return len(s.entries) }

func (s *smallMap[K, V]) find(k K) int {
	if s.index != nil {
		if i, ok := s.index[k]; ok {
			return int(i)
		}
		return -1
	}
	for i := range s.entries {
		if s.entries[i].key == k {
			return i
		}
	}
	return -1
}

// Get returns the value of k and whether k is present.
func (s *smallMap[K, V]) Get(k K) (V, bool) {
	if i := s.find(k); i >= 0 {
		return s.entries[i].val, true
	}
	var zero V
	return zero, false
}

// Has reports whether k is present.
func (s *smallMap[K, V]) Has(k K) bool { return s.find(k) >= 0 }

// Ptr returns a pointer to the value of k, adding k with the zero value
// when absent. The pointer is valid until the next Put, Ptr or Delete.
func (s *smallMap[K, V]) Ptr(k K) *V {
	i := s.find(k)
	if i < 0 {
		var zero V
		s.Put(k, zero)
		i = len(s.entries) - 1
	}
	return &s.entries[i].val
}

// Put sets the value of k and reports whether k is new.
func (s *smallMap[K, V]) Put(k K, v V) bool {
	if i := s.find(k); i >= 0 {
		s.entries[i].val = v
		return false
	}
	s.entries = append(s.entries, smallEntry[K, V]{val: v, key: k})
	switch n := len(s.entries); {
	case s.index != nil:
		s.index[k] = int32(n - 1)
	case n > smallMapMax:
		s.index = make(map[K]int32, n)
		for i := range s.entries {
			s.index[s.entries[i].key] = int32(i)
		}
	}
	return true
}

// Delete removes k and reports whether it was present. A map that shrinks
// to half of smallMapMax entries drops its index (the gap keeps a map
// hovering at the threshold from rebuilding it on every change), and an
// empty one its slice.
func (s *smallMap[K, V]) Delete(k K) bool {
	i := s.find(k)
	if i < 0 {
		return false
	}
	last := len(s.entries) - 1
	if i != last {
		s.entries[i] = s.entries[last]
		if s.index != nil {
			s.index[s.entries[i].key] = int32(i)
		}
	}
	s.entries[last] = smallEntry[K, V]{}
	s.entries = s.entries[:last]
	if s.index != nil {
		delete(s.index, k)
		if last <= smallMapMax/2 {
			s.index = nil
		}
	}
	if last == 0 {
		s.entries = nil
	}
	return true
}

// All yields every entry.
func (s *smallMap[K, V]) All() iter.Seq2[K, V] {
	return func(yield func(K, V) bool) {
		for i := range s.entries {
			if !yield(s.entries[i].key, s.entries[i].val) {
				return
			}
		}
	}
}

// Keys yields every key.
func (s *smallMap[K, V]) Keys() iter.Seq[K] {
	return func(yield func(K) bool) {
		for i := range s.entries {
			if !yield(s.entries[i].key) {
				return
			}
		}
	}
}

// set is a smallMap without values.
type set[T comparable] struct{ smallMap[T, struct{}] }

// Add inserts x and reports whether it is new.
func (s *set[T]) Add(x T) bool { return s.Put(x, struct{}{}) }
