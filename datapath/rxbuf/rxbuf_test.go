package rxbuf

import (
	"os"
	"strconv"
	"strings"
	"testing"

	"github.com/seine-net/seine/tests/netnstest"
)

// TestEnsure raises the host's net.core.rmem_default (restored after),
// checks that Ensure never lowers it, refuses a minimum of 0, and fails
// with a clear cause from a network namespace other than the host's.
func TestEnsure(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root")
	}
	orig, err := Current()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := os.WriteFile(Sysctl, []byte(strconv.Itoa(orig)), 0o644); err != nil {
			t.Errorf("restoring net.core.rmem_default to %d: %v", orig, err)
		}
	})
	want := orig + 4096
	before, raised, err := Ensure(want)
	if err != nil || before != orig || !raised {
		t.Fatalf("Ensure(%d) = %d, %v, %v; want %d, true, nil", want, before, raised, err, orig)
	}
	if v, _ := Current(); v != want {
		t.Fatalf("after Ensure(%d): %d", want, v)
	}
	if _, raised, err := Ensure(orig); err != nil || raised {
		t.Fatalf("Ensure of a lower value: raised %v, %v", raised, err)
	}
	if v, _ := Current(); v != want {
		t.Fatalf("Ensure of a lower value lowered it to %d", v)
	}
	if _, _, err := Ensure(0); err == nil {
		t.Fatal("Ensure(0) succeeded")
	}
	netnstest.Run(t, func() {
		_, raised, err := Ensure(want + 4096)
		if err == nil || raised || !strings.Contains(err.Error(), "initial network namespace") {
			t.Errorf("Ensure from another network namespace: raised %v, %v; want an error naming the initial namespace", raised, err)
		}
	})
	if v, _ := Current(); v != want {
		t.Fatalf("the failed Ensure changed the value to %d", v)
	}
}
