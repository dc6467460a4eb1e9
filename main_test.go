package main

import (
	"bytes"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

func TestRole(t *testing.T) {
	for _, c := range []struct{ argv0, want string }{
		{"/usr/local/bin/seine", "daemon"},
		{"seine", "daemon"},
		{"./bin/seinectl", "ctl"},
		{"seinectl", "ctl"},
	} {
		if got := role(c.argv0); got != c.want {
			t.Errorf("role(%q) = %s, want %s", c.argv0, got, c.want)
		}
	}
}

// TestPluginRoleBeforeMain executes this test binary, which links the same
// packages as seine, the way a runtime executes the plugin: the plugin's
// initializer answers and exits before main (here, before the tests) would
// run.
func TestPluginRoleBeforeMain(t *testing.T) {
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	cni := filepath.Join(dir, "seine-cni")
	if err := os.Symlink(exe, cni); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		name, path, command    string
		wantStdout, wantStderr string
	}{
		{"any name with CNI_COMMAND", exe, "VERSION", `"supportedVersions":["0.3.0","0.3.1","0.4.0","1.0.0","1.1.0"]`, ""},
		{"seine-cni with CNI_COMMAND", cni, "VERSION", `"cniVersion":"1.1.0"`, ""},
		{"seine-cni without CNI_COMMAND", cni, "", "", "CNI plugin seine"},
	} {
		t.Run(c.name, func(t *testing.T) {
			cmd := exec.Command(c.path, "-test.run=^$")
			cmd.Env = append(os.Environ(), "CNI_COMMAND="+c.command)
			cmd.Stdin = strings.NewReader(`{"cniVersion":"1.0.0"}`)
			var stdout, stderr bytes.Buffer
			cmd.Stdout, cmd.Stderr = &stdout, &stderr
			if err := cmd.Run(); err != nil {
				t.Fatalf("%v; stderr: %s", err, stderr.String())
			}
			if !strings.Contains(stdout.String(), c.wantStdout) || !strings.Contains(stderr.String(), c.wantStderr) {
				t.Errorf("stdout %q, stderr %q; want %q and %q", stdout.String(), stderr.String(), c.wantStdout, c.wantStderr)
			}
			if strings.Contains(stdout.String(), "PASS") || strings.Contains(stderr.String(), "PASS") {
				t.Errorf("the test binary's main ran: stdout %q", stdout.String())
			}
			if c.command == "VERSION" && !json.Valid(stdout.Bytes()) {
				t.Errorf("VERSION answer is not JSON: %q", stdout.String())
			}
		})
	}
}

// TestPluginStartsEarly runs this test binary, which links the same
// packages as seine, with GODEBUG=inittrace=1 (Go runtime, "Environment
// Variables"): one line per package initializer that has run. As the plugin
// the binary may run only a fraction of them before the plugin's
// initializer exits: those sorting before it, and its imports (see package
// plugin; an import such as path/filepath once put it behind 117 of 311).
func TestPluginStartsEarly(t *testing.T) {
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	inits := func(cniCommand string) int {
		cmd := exec.Command(exe, "-test.run=^$")
		cmd.Env = append(os.Environ(), "GODEBUG=inittrace=1", "CNI_COMMAND="+cniCommand)
		var stderr bytes.Buffer
		cmd.Stderr = &stderr
		if err := cmd.Run(); err != nil {
			t.Fatalf("CNI_COMMAND=%q: %v; stderr: %s", cniCommand, err, stderr.String())
		}
		n := 0
		for line := range strings.Lines(stderr.String()) {
			if strings.HasPrefix(line, "init ") {
				n++
			}
		}
		return n
	}
	all, asPlugin := inits(""), inits("VERSION")
	t.Logf("initializers before the plugin's: %d of %d", asPlugin, all)
	if all < 100 || asPlugin*3 > all {
		t.Errorf("the plugin runs after %d of the binary's %d initializers, want at most a third", asPlugin, all)
	}
}
