package ipam

import (
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
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
	ip1, _ := a.Allocate(owner(1))
	ip2, _ := a.Allocate(owner(1))
	if !ip1.Equal(ip2) {
		t.Fatalf("same owner got %s then %s", ip1, ip2)
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
