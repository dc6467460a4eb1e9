package controlplane

import (
	"context"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"runtime"
	"strconv"

	"golang.org/x/sys/unix"
)

// netnsDir is where `ip netns add NAME` bind-mounts named network namespaces
// (ip-netns(8)).
const netnsDir = "/run/netns"

// inNetNS runs fn on a dedicated OS thread that has joined the named network
// namespace; "" runs fn on the calling goroutine. Sockets created by fn stay
// in that namespace after fn returns. The thread is never unlocked, so the Go
// runtime discards it when the goroutine ends instead of reusing a thread
// with a foreign namespace. fn never runs on the process's main thread: the
// main thread's namespace is what /proc/PID/ns/net (and so `ip netns pids`)
// reports for the whole process, and a wedged main thread would make this
// process look like a member of the sandbox.
func inNetNS(name string, fn func() error) error {
	if name == "" {
		return fn()
	}
	done := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		if unix.Gettid() == unix.Getpid() {
			// Holding the main thread locked forces the nested call onto
			// another thread; release it afterwards, untouched.
			done <- inNetNS(name, fn)
			runtime.UnlockOSThread()
			return
		}
		f, err := os.Open(filepath.Join(netnsDir, name))
		if err != nil {
			done <- fmt.Errorf("open network namespace %q: %w", name, err)
			return
		}
		err = unix.Setns(int(f.Fd()), unix.CLONE_NEWNET)
		f.Close()
		if err != nil {
			done <- fmt.Errorf("join network namespace %q: %w", name, err)
			return
		}
		done <- fn()
	}()
	return <-done
}

// dialFunc returns a dial function whose connections originate in the named
// network namespace ("" = the caller's), suitable for rest.Config.Dial.
func dialFunc(name string) func(ctx context.Context, network, addr string) (net.Conn, error) {
	return func(ctx context.Context, network, addr string) (net.Conn, error) {
		var conn net.Conn
		err := inNetNS(name, func() error {
			var d net.Dialer
			c, err := d.DialContext(ctx, network, addr)
			conn = c
			return err
		})
		return conn, err
	}
}

// freeLoopbackPorts returns n distinct TCP ports that were free on
// 127.0.0.1 in the named network namespace at the time of the call.
func freeLoopbackPorts(name string, n int) ([]int, error) {
	ports := make([]int, 0, n)
	err := inNetNS(name, func() error {
		var ls []net.Listener
		defer func() {
			for _, l := range ls {
				l.Close()
			}
		}()
		for i := 0; i < n; i++ {
			l, err := net.Listen("tcp", "127.0.0.1:0")
			if err != nil {
				return fmt.Errorf("find free port on 127.0.0.1: %w", err)
			}
			ls = append(ls, l)
			_, p, _ := net.SplitHostPort(l.Addr().String())
			port, err := strconv.Atoi(p)
			if err != nil {
				return fmt.Errorf("parse port of %s: %w", l.Addr(), err)
			}
			ports = append(ports, port)
		}
		return nil
	})
	return ports, err
}
