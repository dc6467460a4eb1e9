package unixsock

import (
	"context"
	"io/fs"
	"os"
	"path/filepath"
	"testing"
)

// The socket is root's from the moment it exists, not only once Listen
// has chmodded it: in the DaemonSet its directory is a hostPath kubelet
// made 0755, which keeps no one out.
func TestSocketPrivateFromBind(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "run")
	if err := os.Mkdir(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(dir, 0o755); err != nil { // whatever the umask
		t.Fatal(err)
	}
	path := filepath.Join(dir, "cni.sock")
	lis, err := bindPrivate(context.Background(), path)
	if err != nil {
		t.Fatal(err)
	}
	fi, err := os.Lstat(path)
	lis.Close()
	if err != nil {
		t.Fatal(err)
	}
	if fi.Mode().Type() != fs.ModeSocket || fi.Mode().Perm() != 0o600 {
		t.Errorf("socket bound with mode %s, want 0600", fi.Mode())
	}

	// Listen, the same; a directory it did not create keeps its mode.
	lis, err = Listen(context.Background(), path, "test socket")
	if err != nil {
		t.Fatal(err)
	}
	defer lis.Close()
	if fi, err := os.Lstat(path); err != nil || fi.Mode().Perm() != 0o600 {
		t.Errorf("Listen: socket %v, %v; want mode 0600", fi.Mode(), err)
	}
	if fi, err := os.Stat(dir); err != nil || fi.Mode().Perm() != 0o755 {
		t.Errorf("Listen changed its directory: %v, %v", fi.Mode(), err)
	}
}
