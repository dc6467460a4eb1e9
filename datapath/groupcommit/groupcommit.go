// Package groupcommit shares one commit among concurrent requests (group
// commit, as databases do for their log): while a commit is under way, new
// requests queue up; when it ends, the next commit takes every request
// queued. One caller at a time does the committing, on its own goroutine,
// and no lock is held while it commits, so N concurrent requests cost
// about two commits each instead of N.
package groupcommit

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
)

// Commit commits items as one unit and returns each item's error (nil
// for success; the slice has one entry per item). ctx carries the values
// of the first item's context and ends when every item's context has
// ended.
type Commit[T any] func(ctx context.Context, items []T) []error

// Committer runs a Commit for batches of concurrent requests. It is safe
// for concurrent use.
type Committer[T any] struct {
	commit Commit[T]

	mu    sync.Mutex
	queue []*request[T]
	busy  bool // a caller is committing

	commits atomic.Uint64
}

type request[T any] struct {
	ctx  context.Context
	item T
	// done receives the outcome, or lead: the caller commits the queue
	// itself now.
	done chan result
}

type result struct {
	err  error
	lead bool
}

// New returns a Committer that commits with commit.
func New[T any](commit Commit[T]) *Committer[T] {
	return &Committer[T]{commit: commit}
}

// Commits returns how many commits have run.
func (c *Committer[T]) Commits() uint64 { return c.commits.Load() }

// Queued returns how many requests wait for the next commit.
func (c *Committer[T]) Queued() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.queue)
}

// Do commits item, together with whatever other items are queued, and
// returns its error. A request whose context ends while it is still
// queued leaves the queue and fails with the context's error; once its
// commit has begun, it waits for the outcome, so the caller never sees an
// error for an item that was committed.
func (c *Committer[T]) Do(ctx context.Context, item T) error {
	r := &request[T]{ctx: ctx, item: item, done: make(chan result, 1)}
	c.mu.Lock()
	c.queue = append(c.queue, r)
	if c.busy {
		c.mu.Unlock()
		res := c.wait(r)
		if !res.lead {
			return res.err
		}
		c.mu.Lock()
	}
	c.busy = true
	batch := c.queue
	c.queue = nil
	c.mu.Unlock()

	c.run(batch)

	c.mu.Lock()
	c.handOffLocked()
	c.mu.Unlock()
	return (<-r.done).err
}

// wait waits for r's outcome (see Do).
func (c *Committer[T]) wait(r *request[T]) result {
	select {
	case res := <-r.done:
		return res
	case <-r.ctx.Done():
	}
	c.mu.Lock()
	for i, q := range c.queue {
		if q != r {
			continue
		}
		c.queue = append(c.queue[:i], c.queue[i+1:]...)
		// While queued, r can only have been handed the lead: pass it on.
		select {
		case <-r.done:
			c.handOffLocked()
		default:
		}
		c.mu.Unlock()
		return result{err: fmt.Errorf("waiting to commit: %w", r.ctx.Err())}
	}
	c.mu.Unlock()
	return <-r.done
}

// handOffLocked gives the lead to the first queued request, or gives it up
// when none is queued. c.mu must be held.
func (c *Committer[T]) handOffLocked() {
	if len(c.queue) == 0 {
		c.busy = false
		return
	}
	c.queue[0].done <- result{lead: true}
}

// run commits batch and delivers every outcome.
func (c *Committer[T]) run(batch []*request[T]) {
	ctx, cancel := batchContext(batch)
	defer cancel()
	items := make([]T, len(batch))
	for i, r := range batch {
		items[i] = r.item
	}
	errs := c.commit(ctx, items)
	c.commits.Add(1)
	for i, r := range batch {
		var err error
		if i < len(errs) {
			err = errs[i]
		}
		r.done <- result{err: err}
	}
}

// batchContext returns a context that carries the first request's values
// and ends when every request's context has ended.
func batchContext[T any](batch []*request[T]) (context.Context, context.CancelFunc) {
	ctx, cancel := context.WithCancel(context.WithoutCancel(batch[0].ctx))
	var left atomic.Int64
	left.Store(int64(len(batch)))
	stops := make([]func() bool, len(batch))
	for i, r := range batch {
		stops[i] = context.AfterFunc(r.ctx, func() {
			if left.Add(-1) == 0 {
				cancel()
			}
		})
	}
	return ctx, func() {
		for _, stop := range stops {
			stop()
		}
		cancel()
	}
}
