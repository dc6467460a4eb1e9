package agent

import (
	"context"
	"sync/atomic"
	"testing"
	"time"
)

// The late components (the local API) run until every other component has
// returned, so that they answer while the others finish.
func TestComponentsStopLateLast(t *testing.T) {
	c := newComponents()
	ctx, cancel := context.WithCancel(context.Background())
	var otherDone, lateSawOther atomic.Bool
	c.Go(func() error {
		<-ctx.Done()
		time.Sleep(200 * time.Millisecond) // a request in flight finishing
		otherDone.Store(true)
		return nil
	})
	c.GoLate(func(lctx context.Context) error {
		<-lctx.Done()
		lateSawOther.Store(otherDone.Load())
		return nil
	})
	cancel()
	if !c.stop(5 * time.Second) {
		t.Fatal("the components did not return")
	}
	if !lateSawOther.Load() {
		t.Error("the late component's context ended before the other component returned")
	}
}

// A component that overruns the grace period does not keep the late ones
// from stopping.
func TestComponentsStopOverrun(t *testing.T) {
	c := newComponents()
	block := make(chan struct{})
	defer close(block)
	c.Go(func() error { <-block; return nil })
	var lateStopped atomic.Bool
	c.GoLate(func(lctx context.Context) error {
		<-lctx.Done()
		lateStopped.Store(true)
		return nil
	})
	if c.stop(100 * time.Millisecond) {
		t.Error("stop reported every component returned while one still ran")
	}
	if !lateStopped.Load() {
		t.Error("the late component was not stopped")
	}
}
