// Package netnstest runs test bodies in a fresh, anonymous network
// namespace, so what they program (links, addresses, nftables) touches
// nothing else and vanishes with the namespace.
package netnstest

import (
	"os"
	"runtime"
	"testing"

	"github.com/vishvananda/netns"
)

// Run runs body on a locked OS thread inside a new network namespace and
// returns the thread to its original namespace afterwards. Commands body
// starts (os/exec) run in the new namespace too. It skips the test when
// not root.
func Run(t *testing.T, body func()) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("needs root")
	}
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	orig, err := netns.Get()
	if err != nil {
		t.Fatal(err)
	}
	defer orig.Close()
	ns, err := netns.New()
	if err != nil {
		t.Fatal(err)
	}
	defer ns.Close()
	defer netns.Set(orig)
	body()
}
