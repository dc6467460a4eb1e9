package groupcommit

import (
	"context"
	"errors"
	"math/rand/v2"
	"sync"
	"testing"
	"time"
)

// TestQueuedRequestsShareACommit blocks the first commit and queues 20
// requests behind it: they are committed together, in one more commit,
// each with its own outcome.
func TestQueuedRequestsShareACommit(t *testing.T) {
	release := make(chan struct{})
	started := make(chan struct{}, 1)
	var batches [][]int
	var mu sync.Mutex
	c := New(func(_ context.Context, items []int) []error {
		select {
		case started <- struct{}{}:
			<-release
		default:
		}
		mu.Lock()
		batches = append(batches, append([]int(nil), items...))
		mu.Unlock()
		errs := make([]error, len(items))
		for i, it := range items {
			if it == 13 {
				errs[i] = errors.New("thirteen")
			}
		}
		return errs
	})
	first := make(chan error, 1)
	go func() { first <- c.Do(context.Background(), -1) }()
	<-started
	const n = 20
	errs := make([]error, n)
	var wg sync.WaitGroup
	for i := 0; i < n; i++ {
		wg.Add(1)
		go func() { defer wg.Done(); errs[i] = c.Do(context.Background(), i) }()
	}
	for c.Queued() != n {
		time.Sleep(time.Millisecond)
	}
	close(release)
	wg.Wait()
	if err := <-first; err != nil {
		t.Fatal(err)
	}
	for i, err := range errs {
		if (err != nil) != (i == 13) {
			t.Errorf("request %d: %v", i, err)
		}
	}
	if len(batches) != 2 || len(batches[1]) != n || c.Commits() != 2 {
		t.Errorf("commits %d, batches %v; want the first alone, then all %d together", c.Commits(), batches, n)
	}
}

// TestCancelledRequestsLeaveTheQueue runs many requests with random
// commit times and random cancellations: every call returns, cancelled
// ones that were never committed fail with their context's error, and
// every successful item was committed exactly once. Both outcomes occur
// whatever the scheduling: a first commit holds the committer while every
// tenth request, whose context has already ended, gives up behind it, and
// every tenth of the others waits as long as it takes.
func TestCancelledRequestsLeaveTheQueue(t *testing.T) {
	var mu sync.Mutex
	committed := map[int]int{}
	started, release := make(chan struct{}), make(chan struct{})
	c := New(func(_ context.Context, items []int) []error {
		select {
		case started <- struct{}{}:
			<-release
		default:
		}
		time.Sleep(time.Duration(rand.IntN(300)) * time.Microsecond)
		mu.Lock()
		for _, it := range items {
			committed[it]++
		}
		mu.Unlock()
		return make([]error, len(items))
	})
	first := make(chan error, 1)
	go func() { first <- c.Do(context.Background(), -1) }()
	<-started
	const n = 2000
	errs := make([]error, n)
	var wg sync.WaitGroup
	do := func(i int, timeout time.Duration) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			ctx, cancel := context.WithTimeout(context.Background(), timeout)
			defer cancel()
			errs[i] = c.Do(ctx, i)
		}()
	}
	// Every tenth request has given up before it asks, while the first
	// commit holds the committer: all of them must fail.
	for i := 0; i < n; i += 10 {
		do(i, 0)
	}
	wg.Wait()
	close(release)
	// The rest ask while commits come and go: every tenth of them waits
	// as long as it takes, the others give up after a random wait.
	for i := 0; i < n; i++ {
		switch i % 10 {
		case 0:
		case 5:
			do(i, time.Minute)
		default:
			do(i, time.Duration(rand.IntN(500))*time.Microsecond)
		}
	}
	done := make(chan struct{})
	go func() { wg.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(30 * time.Second):
		t.Fatalf("requests still waiting after 30 s (%d queued)", c.Queued())
	}
	if err := <-first; err != nil {
		t.Fatal(err)
	}
	failed := 0
	for i, err := range errs {
		switch {
		case i%10 == 0 && err == nil:
			t.Errorf("item %d gave up before it asked, yet succeeded", i)
		case i%10 == 5 && err != nil:
			t.Errorf("item %d waits as long as it takes, yet failed: %v", i, err)
		case err == nil && committed[i] != 1:
			t.Errorf("item %d succeeded but was committed %d times", i, committed[i])
		case err != nil && (committed[i] != 0 || !errors.Is(err, context.DeadlineExceeded)):
			t.Errorf("item %d: %v, committed %d times", i, err, committed[i])
		case err != nil:
			failed++
		}
	}
	t.Logf("%d requests, %d gave up while queued, %d commits", n, failed, c.Commits())
}

// TestBatchContext ends the commit's context only when every request's
// context has ended, and carries the first request's values.
func TestBatchContext(t *testing.T) {
	type key struct{}
	a, cancelA := context.WithCancel(context.WithValue(context.Background(), key{}, "a"))
	b, cancelB := context.WithCancel(context.Background())
	defer cancelB()
	ctx, stop := batchContext([]*request[int]{{ctx: a}, {ctx: b}})
	defer stop()
	if ctx.Value(key{}) != "a" {
		t.Error("values of the first request lost")
	}
	cancelA()
	select {
	case <-ctx.Done():
		t.Fatal("ended with one request still waiting")
	case <-time.After(20 * time.Millisecond):
	}
	cancelB()
	select {
	case <-ctx.Done():
	case <-time.After(time.Second):
		t.Fatal("did not end with every request's context")
	}
}
