package cmd

import (
	"context"
	"errors"
	"path/filepath"
	"sync/atomic"
	"testing"
	"time"

	"go.uber.org/zap"

	"github.com/seine-net/seine/node/health"
	"github.com/seine-net/seine/node/localapi"
)

// serveAPI serves a local API whose readiness has the shutdown check
// (failing while stopping is set) on a socket in a temporary directory,
// until the returned stop is called.
func serveAPI(t *testing.T, stopping *atomic.Bool) (socket string, stop func()) {
	t.Helper()
	socket = filepath.Join(t.TempDir(), "seine.sock")
	var probes health.Probes
	probes.Ready.Add(health.CheckShutdown, func() error {
		if stopping.Load() {
			return errors.New("the daemon is shutting down")
		}
		return nil
	})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		done <- localapi.NewServer(nil, zap.NewAtomicLevel(), probes.Handler(nil), zap.NewNop()).Serve(ctx, socket)
	}()
	// Serve creates the socket: wait until it answers.
	api := localapi.NewClient(socket)
	for i := 0; ; i++ {
		if answering, _ := daemonState(context.Background(), api); answering {
			break
		}
		if i == 200 {
			t.Fatal("the local API never answered")
		}
		time.Sleep(10 * time.Millisecond)
	}
	stopped := false
	stop = func() {
		if !stopped {
			stopped = true
			cancel()
			if err := <-done; err != nil {
				t.Errorf("serve: %v", err)
			}
		}
	}
	t.Cleanup(stop)
	return socket, stop
}

func TestWaitDaemonGone(t *testing.T) {
	const limit = time.Minute // never reached: every case ends earlier
	t.Run("no daemon", func(t *testing.T) {
		began := time.Now()
		waitDaemonGone(context.Background(), filepath.Join(t.TempDir(), "absent.sock"), time.Minute, limit, zap.NewNop())
		if d := time.Since(began); d >= time.Minute {
			t.Errorf("waited %s for a daemon that does not exist", d)
		}
	})
	t.Run("a daemon that stays", func(t *testing.T) {
		var stopping atomic.Bool
		socket, _ := serveAPI(t, &stopping)
		began := time.Now()
		waitDaemonGone(context.Background(), socket, 300*time.Millisecond, limit, zap.NewNop())
		if d := time.Since(began); d < 300*time.Millisecond || d >= limit {
			t.Errorf("returned after %s: want the start wait (300ms), not less, nor the limit", d)
		}
	})
	// A daemon that is stopping, or begins to within the start wait, is
	// waited for until its socket goes.
	for _, tc := range []struct {
		name                  string
		stopsAfter, startWait time.Duration // stopsAfter < 0: stopping from the start
	}{
		{"a stopping daemon", -1, 100 * time.Millisecond},
		{"a daemon that begins to stop", 200 * time.Millisecond, 3 * time.Second},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var stopping atomic.Bool
			stopping.Store(tc.stopsAfter < 0)
			socket, stop := serveAPI(t, &stopping)
			var gone atomic.Bool
			go func() {
				if tc.stopsAfter >= 0 {
					time.Sleep(tc.stopsAfter)
					stopping.Store(true)
				}
				time.Sleep(time.Second) // the daemon's components finishing
				gone.Store(true)
				stop()
			}()
			waitDaemonGone(context.Background(), socket, tc.startWait, limit, zap.NewNop())
			if !gone.Load() {
				t.Error("returned while the stopping daemon still answered")
			}
		})
	}
	t.Run("the limit", func(t *testing.T) {
		var stopping atomic.Bool
		stopping.Store(true)
		socket, _ := serveAPI(t, &stopping)
		began := time.Now()
		waitDaemonGone(context.Background(), socket, 100*time.Millisecond, 500*time.Millisecond, zap.NewNop())
		if d := time.Since(began); d < 500*time.Millisecond {
			t.Errorf("returned after %s, before the limit (500ms), while the daemon answered that it stops", d)
		}
	})
}
