package ipam

import (
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"sync"
	"testing"
)

func cidr(t *testing.T, s string) *net.IPNet {
	t.Helper()
	_, n, err := net.ParseCIDR(s)
	if err != nil {
		t.Fatal(err)
	}
	return n
}

func owner(i int) Owner { return Owner{ContainerID: fmt.Sprintf("c%d", i), IfName: "eth0"} }

func TestAllocateSkipsReservedAndExhausts(t *testing.T) {
	a, _, err := Open(t.TempDir(), cidr(t, "10.244.1.0/29"))
	if err != nil {
		t.Fatal(err)
	}
	if got := a.Gateway().String(); got != "10.244.1.1" {
		t.Fatalf("gateway %s", got)
	}
	seen := map[string]bool{}
	for i := 0; i < 5; i++ { // .2 .. .6
		ip, err := a.Allocate(owner(i))
		if err != nil {
			t.Fatalf("allocation %d: %v", i, err)
		}
		if seen[ip.String()] || ip.String() == "10.244.1.1" || ip.String() == "10.244.1.7" {
			t.Fatalf("bad or duplicate address %s", ip)
		}
		seen[ip.String()] = true
	}
	if _, err := a.Allocate(owner(99)); !errors.Is(err, ErrExhausted) {
		t.Fatalf("want ErrExhausted, got %v", err)
	}
}

func TestAllocateIsIdempotentPerOwner(t *testing.T) {
	a, _, err := Open(t.TempDir(), cidr(t, "10.244.1.0/24"))
	if err != nil {
		t.Fatal(err)
	}
	ip1, err1 := a.Allocate(owner(1))
	ip2, err2 := a.Allocate(owner(1))
	if err := errors.Join(err1, err2); err != nil || ip1 == nil {
		t.Fatalf("allocating twice for one owner: %s, %v", ip1, err)
	}
	if !ip1.Equal(ip2) {
		t.Fatalf("same owner got %s then %s", ip1, ip2)
	}
	if ip3, err := a.Allocate(owner(2)); err != nil || ip3.Equal(ip1) {
		t.Fatalf("another owner got %s (%v), the first owner's is %s", ip3, err, ip1)
	}
}

func TestNextFitDelaysReuse(t *testing.T) {
	a, _, err := Open(t.TempDir(), cidr(t, "10.244.1.0/24"))
	if err != nil {
		t.Fatal(err)
	}
	first, _ := a.Allocate(owner(1))
	if err := a.Release("c1", "eth0"); err != nil {
		t.Fatal(err)
	}
	second, _ := a.Allocate(owner(2))
	if first.Equal(second) {
		t.Fatalf("released address %s handed out again at once", first)
	}
	if err := a.Release("unknown", "eth0"); err != nil {
		t.Fatalf("release of unknown attachment: %v", err)
	}
}

func TestStateSurvivesReopen(t *testing.T) {
	dir := t.TempDir()
	a, _, err := Open(dir, cidr(t, "10.244.1.0/24"))
	if err != nil {
		t.Fatal(err)
	}
	held := map[string]bool{}
	for i := 0; i < 10; i++ {
		ip, err := a.Allocate(owner(i))
		if err != nil {
			t.Fatal(err)
		}
		held[ip.String()] = true
	}
	b, reset, err := Open(dir, cidr(t, "10.244.1.0/24"))
	if err != nil || reset {
		t.Fatalf("reopen: reset=%v err=%v", reset, err)
	}
	if got := len(b.List()); got != 10 {
		t.Fatalf("reopened allocator has %d allocations, want 10", got)
	}
	for i := 10; i < 200; i++ {
		ip, err := b.Allocate(owner(i))
		if err != nil {
			t.Fatal(err)
		}
		if held[ip.String()] {
			t.Fatalf("address %s handed out twice across a restart", ip)
		}
	}
	if ip, ok := b.Lookup("c3", "eth0"); !ok || !held[ip.String()] {
		t.Fatalf("lookup after reopen: %v %v", ip, ok)
	}
}

// TestOpenRemovesLeftoverTemps leaves, beside the allocation file, the
// temporary file of a write a crash cut short (half its JSON) and a file
// of another name: Open removes the first only, and the allocations are
// those of the allocation file.
func TestOpenRemovesLeftoverTemps(t *testing.T) {
	dir := t.TempDir()
	a, _, err := Open(dir, cidr(t, "10.244.1.0/24"))
	if err != nil {
		t.Fatal(err)
	}
	ip, err := a.Allocate(owner(1))
	if err != nil {
		t.Fatal(err)
	}
	tmp, err := os.CreateTemp(dir, ".allocations-*")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := tmp.WriteString(`{"podCIDR": "10.244.1.0/24", "allocations": {`); err != nil {
		t.Fatal(err)
	}
	if err := tmp.Close(); err != nil {
		t.Fatal(err)
	}
	other := filepath.Join(dir, "allocations.json.bak")
	if err := os.WriteFile(other, []byte("keep"), 0o600); err != nil {
		t.Fatal(err)
	}

	b, reset, err := Open(dir, cidr(t, "10.244.1.0/24"))
	if err != nil || reset {
		t.Fatalf("reopen: reset=%v err=%v", reset, err)
	}
	if _, err := os.Stat(tmp.Name()); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("leftover %s: %v, want it removed", tmp.Name(), err)
	}
	if _, err := os.Stat(other); err != nil {
		t.Errorf("%s: %v, want it kept", other, err)
	}
	if got, ok := b.Lookup("c1", "eth0"); !ok || !got.Equal(ip) || len(b.List()) != 1 {
		t.Errorf("after reopen: c1 holds %v (%v) of %d allocations, want %s of 1", got, ok, len(b.List()), ip)
	}
}

// TestOpenCreatesDirectory opens an allocator in a directory two levels
// of which do not exist yet: Open creates them (mode 0700), and
// allocations are kept there.
func TestOpenCreatesDirectory(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "data", "ipam")
	a, _, err := Open(dir, cidr(t, "10.244.1.0/24"))
	if err != nil {
		t.Fatal(err)
	}
	fi, err := os.Stat(dir)
	if err != nil {
		t.Fatal(err)
	}
	if !fi.IsDir() || fi.Mode().Perm() != 0o700 {
		t.Errorf("%s: mode %v, want a directory of 0700", dir, fi.Mode())
	}
	if _, err := a.Allocate(owner(1)); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(dir, "allocations.json")); err != nil {
		t.Errorf("allocation file: %v", err)
	}
}

func TestChangedPodCIDRResets(t *testing.T) {
	dir := t.TempDir()
	a, _, _ := Open(dir, cidr(t, "10.244.1.0/24"))
	if _, err := a.Allocate(owner(1)); err != nil {
		t.Fatal(err)
	}
	b, reset, err := Open(dir, cidr(t, "10.244.2.0/24"))
	if err != nil || !reset || len(b.List()) != 0 {
		t.Fatalf("reset=%v err=%v list=%v", reset, err, b.List())
	}
}

func TestCorruptStateIsAnError(t *testing.T) {
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "allocations.json"), []byte("{"), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, _, err := Open(dir, cidr(t, "10.244.1.0/24")); err == nil {
		t.Fatal("corrupt state accepted")
	}
}

func TestRejectsTinyOrIPv6CIDR(t *testing.T) {
	for _, c := range []string{"10.244.1.0/31", "fd00::/64"} {
		if _, _, err := Open(t.TempDir(), cidr(t, c)); err == nil {
			t.Fatalf("%s accepted", c)
		}
	}
}

// TestConcurrentAllocationsShareWrites allocates and then releases 100
// addresses at once: every address is distinct and on disk when its call
// returns, and the calls shared their writes (group commit).
func TestConcurrentAllocationsShareWrites(t *testing.T) {
	dir := t.TempDir()
	a, _, err := Open(dir, cidr(t, "10.244.0.0/22"))
	if err != nil {
		t.Fatal(err)
	}
	const n = 100
	ips := make([]net.IP, n)
	errs := make([]error, n)
	start := make(chan struct{})
	var wg sync.WaitGroup
	for i := 0; i < n; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			ips[i], errs[i] = a.Allocate(owner(i))
		}()
	}
	close(start)
	wg.Wait()
	seen := map[string]bool{}
	for i := range ips {
		if errs[i] != nil {
			t.Fatalf("allocation %d: %v", i, errs[i])
		}
		if seen[ips[i].String()] {
			t.Fatalf("%s handed out twice", ips[i])
		}
		seen[ips[i].String()] = true
	}
	if a.writes >= n {
		t.Errorf("%d allocations wrote the file %d times; want fewer writes than allocations", n, a.writes)
	}
	t.Logf("%d concurrent allocations, %d writes", n, a.writes)
	b, _, err := Open(dir, cidr(t, "10.244.0.0/22"))
	if err != nil {
		t.Fatal(err)
	}
	for i := range ips {
		if ip, ok := b.Lookup(owner(i).ContainerID, "eth0"); !ok || !ip.Equal(ips[i]) {
			t.Fatalf("allocation %d not on disk: %v %v", i, ip, ok)
		}
	}

	for i := 0; i < n; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs[i] = a.Release(owner(i).ContainerID, "eth0")
		}()
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		t.Fatal(err)
	}
	if c, _, err := Open(dir, cidr(t, "10.244.0.0/22")); err != nil || len(c.List()) != 0 {
		t.Fatalf("after releasing everything the file holds %v (%v)", c.List(), err)
	}
}

// TestFailedWriteUndoesAllocation makes the state file unwritable (a
// directory in its place): the allocation fails, holds nothing, and once
// the file is writable again the address is handed out.
func TestFailedWriteUndoesAllocation(t *testing.T) {
	dir := t.TempDir()
	a, _, err := Open(dir, cidr(t, "10.244.1.0/24"))
	if err != nil {
		t.Fatal(err)
	}
	kept, err := a.Allocate(owner(0))
	if err != nil {
		t.Fatal(err)
	}
	blocker := filepath.Join(dir, "allocations.json")
	if err := os.Remove(blocker); err != nil {
		t.Fatal(err)
	}
	if err := os.Mkdir(blocker, 0o700); err != nil {
		t.Fatal(err)
	}
	if ip, err := a.Allocate(owner(1)); err == nil {
		t.Fatalf("allocation with an unwritable state file succeeded: %s", ip)
	}
	if _, ok := a.Lookup("c1", "eth0"); ok || len(a.List()) != 1 {
		t.Fatalf("failed allocation is held: %v", a.List())
	}
	if err := a.Release("c0", "eth0"); err == nil {
		t.Fatal("release with an unwritable state file succeeded")
	}
	if ip, ok := a.Lookup("c0", "eth0"); !ok || !ip.Equal(kept) {
		t.Fatalf("failed release dropped the allocation: %v %v", ip, ok)
	}
	if err := os.Remove(blocker); err != nil {
		t.Fatal(err)
	}
	if _, err := a.Allocate(owner(1)); err != nil {
		t.Fatal(err)
	}
	b, _, err := Open(dir, cidr(t, "10.244.1.0/24"))
	if err != nil || len(b.List()) != 2 {
		t.Fatalf("reopened: %v %v", b.List(), err)
	}
}

// TestClaim records a given address for an attachment (as a restart does
// for a Pod whose allocation never reached the disk) and refuses one that
// is taken or reserved.
func TestClaim(t *testing.T) {
	dir := t.TempDir()
	a, _, err := Open(dir, cidr(t, "10.244.1.0/24"))
	if err != nil {
		t.Fatal(err)
	}
	if err := a.Claim(owner(1), net.ParseIP("10.244.1.9")); err != nil {
		t.Fatal(err)
	}
	if err := a.Claim(owner(1), net.ParseIP("10.244.1.9")); err != nil {
		t.Fatalf("claiming again: %v", err)
	}
	for _, bad := range []struct {
		o  Owner
		ip string
	}{{owner(2), "10.244.1.9"}, {owner(1), "10.244.1.10"}, {owner(3), "10.244.1.1"}, {owner(3), "10.244.1.255"}, {owner(3), "10.244.2.5"}} {
		if err := a.Claim(bad.o, net.ParseIP(bad.ip)); err == nil {
			t.Errorf("claim of %s by %s accepted", bad.ip, bad.o.ContainerID)
		}
	}
	b, _, err := Open(dir, cidr(t, "10.244.1.0/24"))
	if err != nil {
		t.Fatal(err)
	}
	if ip, ok := b.Lookup("c1", "eth0"); !ok || ip.String() != "10.244.1.9" {
		t.Fatalf("claim not on disk: %v %v", ip, ok)
	}
	for i := 0; i < 250; i++ {
		if ip, err := b.Allocate(owner(100 + i)); err == nil && ip.String() == "10.244.1.9" {
			t.Fatal("claimed address handed out")
		}
	}
}
