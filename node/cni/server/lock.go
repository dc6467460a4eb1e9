package server

import (
	"context"
	"math"
	"sync"

	"golang.org/x/sync/semaphore"
)

// gcWeight is the weight a GC acquires on the operation semaphore: all of it,
// so a GC waits for every in-flight container command and blocks new ones.
const gcWeight = math.MaxInt32

// opLock orders CNI commands: commands for one container ID run one at a
// time in arrival order (a DEL racing an ADD of the same container waits for
// it), commands for different containers run concurrently, and a GC runs
// alone. STATUS takes no lock.
type opLock struct {
	all *semaphore.Weighted

	mu   sync.Mutex
	keys map[string]*keyEntry
}

type keyEntry struct {
	sem  chan struct{} // capacity 1: holding a token is holding the key
	refs int           // holders plus waiters; the entry is dropped at 0
}

func newOpLock() *opLock {
	return &opLock{all: semaphore.NewWeighted(gcWeight), keys: map[string]*keyEntry{}}
}

// lockExclusive waits until no other command runs and holds off new ones
// until the returned function is called.
func (l *opLock) lockExclusive(ctx context.Context) (unlock func(), err error) {
	if err := l.all.Acquire(ctx, gcWeight); err != nil {
		return nil, err
	}
	return func() { l.all.Release(gcWeight) }, nil
}

// lockKey waits for the key of one container; an empty key only excludes GC.
// It fails with ctx.Err() when ctx ends first.
func (l *opLock) lockKey(ctx context.Context, key string) (unlock func(), err error) {
	if err := l.all.Acquire(ctx, 1); err != nil {
		return nil, err
	}
	if key == "" {
		return func() { l.all.Release(1) }, nil
	}
	l.mu.Lock()
	e := l.keys[key]
	if e == nil {
		e = &keyEntry{sem: make(chan struct{}, 1)}
		l.keys[key] = e
	}
	e.refs++
	l.mu.Unlock()

	select {
	case e.sem <- struct{}{}:
		return func() {
			<-e.sem
			l.release(key, e)
			l.all.Release(1)
		}, nil
	case <-ctx.Done():
		l.release(key, e)
		l.all.Release(1)
		return nil, ctx.Err()
	}
}

func (l *opLock) release(key string, e *keyEntry) {
	l.mu.Lock()
	defer l.mu.Unlock()
	e.refs--
	if e.refs == 0 {
		delete(l.keys, key)
	}
}
