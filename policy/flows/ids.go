package flows

import "github.com/seine-net/seine/datapath/pipeline"

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

// ConjIDs hands out conjunction IDs in priority bands
// (pipeline.PolicyRulePriority): a new key gets an ID of the first band
// holding fewer than size live IDs, band b's IDs being b<<24 | n with n
// from that band's own Allocator. With fewer than size keys every ID is
// in band 0, so the flows are those of an unbanded allocator. It is not
// safe for concurrent use.
type ConjIDs struct {
	size     int
	bands    []*Allocator[ConjKey]
	band     map[ConjKey]int
	byPolicy map[string]map[ConjKey]bool
}

// NewConjIDs returns an allocator of bands bands of size live IDs each
// (the agent uses pipeline.ConjBandSize and pipeline.ConjBands).
func NewConjIDs(size, bands int) *ConjIDs {
	c := &ConjIDs{size: size, band: map[ConjKey]int{}, byPolicy: map[string]map[ConjKey]bool{}}
	for range bands {
		c.bands = append(c.bands, NewAllocator[ConjKey](1<<pipeline.ConjBandShift-1))
	}
	return c
}

// Get returns the ID of k, allocating one if k has none; ok is false when
// every band is full.
func (c *ConjIDs) Get(k ConjKey) (uint32, bool) {
	if b, ok := c.band[k]; ok {
		n, _ := c.bands[b].Lookup(k)
		return uint32(b)<<pipeline.ConjBandShift | n, true
	}
	for b, a := range c.bands {
		if a.Len() >= c.size {
			continue
		}
		n, ok := a.Get(k)
		if !ok {
			continue
		}
		c.band[k] = b
		if c.byPolicy[k.Policy] == nil {
			c.byPolicy[k.Policy] = map[ConjKey]bool{}
		}
		c.byPolicy[k.Policy][k] = true
		return uint32(b)<<pipeline.ConjBandShift | n, true
	}
	return 0, false
}

// Lookup returns the ID of k without allocating.
func (c *ConjIDs) Lookup(k ConjKey) (uint32, bool) {
	b, ok := c.band[k]
	if !ok {
		return 0, false
	}
	n, _ := c.bands[b].Lookup(k)
	return uint32(b)<<pipeline.ConjBandShift | n, true
}

// Release frees the ID of k; unknown keys are a no-op.
func (c *ConjIDs) Release(k ConjKey) {
	b, ok := c.band[k]
	if !ok {
		return
	}
	c.bands[b].Release(k)
	delete(c.band, k)
	delete(c.byPolicy[k.Policy], k)
	if len(c.byPolicy[k.Policy]) == 0 {
		delete(c.byPolicy, k.Policy)
	}
}

// Keep releases every ID of policy's keys but those in keep: once the
// policy's flows are installed as translated with keep (nil: the policy
// is gone), including the IDs of a translation that never got installed.
func (c *ConjIDs) Keep(policy string, keep []ConjKey) {
	want := make(map[ConjKey]bool, len(keep))
	for _, k := range keep {
		want[k] = true
	}
	for k := range c.byPolicy[policy] {
		if !want[k] {
			c.Release(k)
		}
	}
}

// Len is the number of IDs in use.
func (c *ConjIDs) Len() int { return len(c.band) }
