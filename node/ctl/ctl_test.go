package ctl

import (
	"bytes"
	"slices"
	"strings"
	"testing"
)

// Flags after arguments move in front of them, as kubectl users write.
func TestInterspersed(t *testing.T) {
	app := NewApp()
	cases := []struct{ in, want string }{
		{"seinectl get agentinfo n1 -o wide", "seinectl get agentinfo -o wide n1"},
		{"seinectl --socket /s get ovsflows -p default/a --table Output", "seinectl --socket /s get ovsflows -p default/a --table Output"},
		{"seinectl get networkpolicy default/p --agent -o=json", "seinectl get networkpolicy --agent -o=json default/p"},
		{"seinectl log-level debug", "seinectl log-level debug"},
		{"seinectl get ovsflows --table --generate-bash-completion", "seinectl get ovsflows --table --generate-bash-completion"},
		{"seinectl get", "seinectl get"},
		// The application's flags move in front of the commands.
		{"seinectl get agentinfo n1 --socket /s -o wide", "seinectl --socket /s get agentinfo -o wide n1"},
		{"seinectl get --kubeconfig k agentinfo", "seinectl --kubeconfig k get agentinfo"},
		{"seinectl --socket /a get podinterface --socket=/b", "seinectl --socket /a --socket=/b get podinterface"},
		{"seinectl traceflow -S a -D b --kubeconfig=/k --timeout 3s", "seinectl --kubeconfig=/k traceflow -S a -D b --timeout 3s"},
		{"seinectl log-level debug --socket /s", "seinectl --socket /s log-level debug"},
		{"seinectl query --kubeconfig k endpoint -p a --socket /s", "seinectl --kubeconfig k --socket /s query endpoint -p a"},
		{"seinectl get ovsflows --socket /s --table --generate-bash-completion", "seinectl --socket /s get ovsflows --table --generate-bash-completion"},
	}
	for _, c := range cases {
		got := strings.Join(interspersed(app, strings.Fields(c.in)), " ")
		if got != c.want {
			t.Errorf("%q:\n got %q\nwant %q", c.in, got, c.want)
		}
	}
}

// A global flag after the command is taken, not refused.
func TestGlobalFlagAfterTheCommand(t *testing.T) {
	sock := t.TempDir() + "/elsewhere.sock"
	app, _, _ := testApp(nil)
	err := app.Run(interspersed(app, []string{"seinectl", "log-level", "--socket", sock}))
	if err == nil || !strings.Contains(err.Error(), sock) {
		t.Fatalf("log-level --socket %s: error %v, want one naming that socket", sock, err)
	}
}

func TestParseDestination(t *testing.T) {
	d, port, err := parseDestination("web/server:8080")
	if err != nil || d.Namespace != "web" || d.Pod != "server" || port != 8080 {
		t.Fatalf("web/server:8080 -> %+v %d %v", d, port, err)
	}
	d, port, err = parseDestination("10.96.0.10")
	if err != nil || d.IP != "10.96.0.10" || port != 0 {
		t.Fatalf("10.96.0.10 -> %+v %d %v", d, port, err)
	}
	if _, _, err := parseDestination("a/b:x"); err == nil {
		t.Fatal("a bad port was accepted")
	}
}

// The completion scripts exist for the three shells; tables complete from
// the pipeline.
func TestCompletion(t *testing.T) {
	for _, sh := range []string{"bash", "zsh", "fish"} {
		var out bytes.Buffer
		app := NewApp()
		app.Writer = &out
		if err := app.Run([]string{"seinectl", "completion", sh}); err != nil || !strings.Contains(out.String(), "seinectl") {
			t.Errorf("completion %s: %v\n%s", sh, err, out.String())
		}
	}
	if !slices.Contains(tableNames(), "IngressDefault") {
		t.Errorf("table names %v", tableNames())
	}
}
