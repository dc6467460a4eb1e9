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
	"time"
)

// Listen listens on path with mode 0600, so that only root can connect. It
// creates the parent directory with mode 0750 and removes a stale socket
// left by a previous daemon, but fails if a live server still answers on
// it or if the path is not a socket. what names the socket in errors
// ("CNI socket").
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
	var lc net.ListenConfig
	lis, err := lc.Listen(ctx, "unix", path)
	if err != nil {
		return nil, fmt.Errorf("listening on %s: %w", what, err)
	}
	// The parent directory (0750) already keeps other users out during the
	// moment between bind and chmod.
	if err := os.Chmod(path, 0o600); err != nil {
		lis.Close()
		return nil, fmt.Errorf("restricting %s mode: %w", what, err)
	}
	return lis, nil
}
