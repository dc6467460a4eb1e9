package main

import (
	"reflect"
	"testing"
)

// TestInterspersed checks flags after positional arguments are moved
// before them (urfave/cli stops at the first positional) and that nothing
// after "--" is touched.
func TestInterspersed(t *testing.T) {
	app := []string{"sandbox", "pod", "create", "ns/p", "--node", "1", "--host-network", "--port", "80"}
	got := interspersed(commands(), app)
	want := []string{"sandbox", "pod", "create", "--node", "1", "--host-network", "--port", "80", "ns/p"}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("got %q, want %q", got, want)
	}
	app = []string{"sandbox", "exec", "ns/p", "--name", "x", "--", "ip", "-br", "addr"}
	got = interspersed(commands(), app)
	want = []string{"sandbox", "exec", "--name", "x", "ns/p", "--", "ip", "-br", "addr"}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("got %q, want %q", got, want)
	}
}
