package flows

// Allocator hands out small positive IDs (1, 2, ...) for keys: a key keeps
// its ID until released, and released IDs are reused oldest first, only
// once every ID up to max has been handed out, so a freed ID stays unused
// as long as possible. It is not safe for concurrent use.
type Allocator[K comparable] struct {
	byKey map[K]uint32
	free  []uint32 // FIFO of released IDs
	next  uint32
	max   uint32
}

// NewAllocator returns an allocator of IDs 1..max (max 0 means 2^32-1).
func NewAllocator[K comparable](max uint32) *Allocator[K] {
	if max == 0 {
		max = ^uint32(0)
	}
	return &Allocator[K]{byKey: map[K]uint32{}, next: 1, max: max}
}

// Get returns the ID of k, allocating one if k has none. ok is false when
// every ID is in use.
func (a *Allocator[K]) Get(k K) (id uint32, ok bool) {
	if id, ok := a.byKey[k]; ok {
		return id, true
	}
	switch {
	case a.next != 0 && a.next <= a.max:
		id = a.next
		a.next++
	case len(a.free) > 0:
		id = a.free[0]
		a.free = a.free[1:]
	default:
		return 0, false
	}
	a.byKey[k] = id
	return id, true
}

// Lookup returns the ID of k without allocating.
func (a *Allocator[K]) Lookup(k K) (uint32, bool) {
	id, ok := a.byKey[k]
	return id, ok
}

// Release frees the ID of k; unknown keys are a no-op.
func (a *Allocator[K]) Release(k K) {
	id, ok := a.byKey[k]
	if !ok {
		return
	}
	delete(a.byKey, k)
	a.free = append(a.free, id)
}

// Len is the number of IDs in use.
func (a *Allocator[K]) Len() int { return len(a.byKey) }
