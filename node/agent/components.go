package agent

import (
	"context"
	"sync"
	"time"

	cniserver "github.com/seine-net/seine/node/cni/server"
)

// shutdownGrace bounds how long Run waits, on its way out, for the
// components to return before it closes the connections they use: longer
// than the CNI server's stop (its requests in flight get
// cniserver.DefaultShutdownGrace to finish, then as long again to roll
// back once cancelled), shorter than the 30 s that the systemd unit
// (TimeoutStopSec) and the DaemonSet (terminationGracePeriodSeconds) give
// the daemon.
const shutdownGrace = 2*cniserver.DefaultShutdownGrace + 5*time.Second

// lateStopGrace bounds the wait for the late components (GoLate) once
// their context ends.
const lateStopGrace = 2 * time.Second

// components are the daemon's long-lived goroutines: servers, controllers,
// writers. Each reports how it ended; Run stops at the first failure, and
// on its way out waits for every one of them before it closes the OVSDB
// and OpenFlow connections they use, so that a request in flight finishes
// (or rolls back) on live connections. Late components (the local API)
// keep running until the others have returned.
type components struct {
	wg, lateWG sync.WaitGroup
	reports    chan error
	stopping   chan struct{}
	// lateCtx is the late components' context, cancelled by stop.
	lateCtx    context.Context
	lateCancel context.CancelFunc
}

func newComponents() *components {
	c := &components{reports: make(chan error), stopping: make(chan struct{})}
	c.lateCtx, c.lateCancel = context.WithCancel(context.Background())
	return c
}

// Go runs run in a goroutine of its own and reports its result to Run
// (dropped once Run has stopped reading).
func (c *components) Go(run func() error) {
	c.wg.Add(1)
	go func() {
		defer c.wg.Done()
		err := run()
		select {
		case c.reports <- err:
		case <-c.stopping:
		}
	}()
}

// GoLate runs run like Go, with a context that ends only once stop has
// waited for the other components: the local API answers while they
// finish, its /readyz saying that the daemon is stopping (which `seine ovs
// run` waits on before it stops Open vSwitch).
func (c *components) GoLate(run func(ctx context.Context) error) {
	c.lateWG.Add(1)
	go func() {
		defer c.lateWG.Done()
		err := run(c.lateCtx)
		select {
		case c.reports <- err:
		case <-c.stopping:
		}
	}()
}

// stop tells the components that their reports are no longer read, waits
// up to timeout for all but the late ones to return (their context must
// be cancelled already), then ends the late ones' context and waits up to
// lateStopGrace for them. It reports whether they all returned.
func (c *components) stop(timeout time.Duration) bool {
	close(c.stopping)
	ok := waitGroup(&c.wg, timeout)
	c.lateCancel()
	return waitGroup(&c.lateWG, lateStopGrace) && ok
}

// waitGroup waits up to timeout for wg, reporting whether it finished.
func waitGroup(wg *sync.WaitGroup, timeout time.Duration) bool {
	done := make(chan struct{})
	go func() {
		wg.Wait()
		close(done)
	}()
	select {
	case <-done:
		return true
	case <-time.After(timeout):
		return false
	}
}
