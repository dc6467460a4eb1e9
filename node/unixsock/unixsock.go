// Package unixsock listens on the daemon's root-only unix sockets (the CNI
// server's and the local API's).
package unixsock

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"net"
	"os"
	"path/filepath"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// Listen listens on path with mode 0600 from the moment the socket exists,
// so that only root can connect. It creates the parent directory with
// mode 0750 when missing (an existing one keeps its mode: it may be a
// hostPath kubelet made 0755, or a directory other programs share) and
// removes a stale socket left by a previous daemon, but fails if a live
// server still answers on it or if the path is not a socket. what names
// the socket in errors ("CNI socket").
func Listen(ctx context.Context, path, what string) (net.Listener, error) {
	if err := os.MkdirAll(filepath.Dir(path), 0o750); err != nil {
		return nil, fmt.Errorf("creating %s directory: %w", what, err)
	}
	if fi, err := os.Lstat(path); err == nil {
		if fi.Mode().Type() != fs.ModeSocket {
			return nil, fmt.Errorf("%s path %s exists and is not a socket (mode %s)", what, path, fi.Mode())
		}
		d := net.Dialer{Timeout: time.Second}
		if c, err := d.DialContext(ctx, "unix", path); err == nil {
			c.Close()
			return nil, fmt.Errorf("%s %s is in use by another running server", what, path)
		}
		if err := os.Remove(path); err != nil {
			return nil, fmt.Errorf("removing stale %s: %w", what, err)
		}
	} else if !errors.Is(err, fs.ErrNotExist) {
		return nil, fmt.Errorf("checking %s path: %w", what, err)
	}
	lis, err := bindPrivate(ctx, path)
	if err != nil {
		return nil, fmt.Errorf("listening on %s: %w", what, err)
	}
	// bindPrivate made it 0600 already; this only repeats it.
	if err := os.Chmod(path, 0o600); err != nil {
		lis.Close()
		return nil, fmt.Errorf("restricting %s mode: %w", what, err)
	}
	return lis, nil
}

// bindPrivate listens on path, the socket's file created with mode 0600:
// Linux gives it the mode of the socket itself (less the umask), which
// fchmod sets between socket(2) and bind(2). No other user can connect in
// the moment before a chmod of the file, whatever the directory's mode,
// and the process-wide umask stays untouched.
func bindPrivate(ctx context.Context, path string) (net.Listener, error) {
	lc := net.ListenConfig{Control: func(_, _ string, c syscall.RawConn) error {
		var err error
		if cerr := c.Control(func(fd uintptr) { err = unix.Fchmod(int(fd), 0o600) }); cerr != nil {
			return cerr
		}
		if err != nil {
			return fmt.Errorf("fchmod of the socket before bind: %w", err)
		}
		return nil
	}}
	return lc.Listen(ctx, "unix", path)
}
