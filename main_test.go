package main

import "testing"

func TestRole(t *testing.T) {
	for _, c := range []struct{ argv0, cni, want string }{
		{"/usr/local/bin/seine", "", "daemon"},
		{"seine", "ADD", "cni"},
		{"/opt/cni/bin/seine-cni", "", "cni"},
		{"/opt/cni/bin/seine", "VERSION", "cni"},
		{"./bin/seinectl", "", "ctl"},
		{"seinectl", "DEL", "cni"},
	} {
		if got := role(c.argv0, c.cni); got != c.want {
			t.Errorf("role(%q, %q) = %s, want %s", c.argv0, c.cni, got, c.want)
		}
	}
}
