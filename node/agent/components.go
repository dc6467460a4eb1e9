package agent

import (
	"sync"
	"time"

	cniserver "github.com/seine-net/seine/node/cni/server"
)

// shutdownGrace bounds how long Run waits, on its way out, for the
// components to return before it closes the connections they use: longer
// than the CNI server's stop (its requests in flight get
// cniserver.DefaultShutdownGrace to finish, then as long again to roll
// back once cancelled), shorter than the 30 s the systemd unit
// (TimeoutStopSec) gives the daemon, and than the DaemonSet's 90 s
// (terminationGracePeriodSeconds), which also covers the openvswitch
// sidecar's stop after the daemon's.
const shutdownGrace = 2*cniserver.DefaultShutdownGrace + 5*time.Second

// components are the daemon's long-lived goroutines: servers, controllers,
// writers. Each reports how it ended; Run stops at the first failure, and
// on its way out waits for every one of them before it closes the OVSDB
// and OpenFlow connections they use, so that a request in flight finishes
// (or rolls back) on live connections.
type components struct {
	wg       sync.WaitGroup
	reports  chan error
	stopping chan struct{}
}

func newComponents() *components {
	return &components{reports: make(chan error), stopping: make(chan struct{})}
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

// stop tells the components that their reports are no longer read, and
// waits up to timeout for all of them to return (their context must be
// cancelled already). It reports whether they did.
func (c *components) stop(timeout time.Duration) bool {
	close(c.stopping)
	done := make(chan struct{})
	go func() {
		c.wg.Wait()
		close(done)
	}()
	select {
	case <-done:
		return true
	case <-time.After(timeout):
		return false
	}
}
