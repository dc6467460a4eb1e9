package ctl

import (
	"encoding/json"
	"net"
	"net/http"
	"path/filepath"
	"strings"
	"testing"

	"github.com/seine-net/seine/node/localapi"
)

// fakeDaemon serves the local API's version route on a socket in a
// temporary directory and returns the socket's path.
func fakeDaemon(t *testing.T) string {
	sock := filepath.Join(t.TempDir(), "seine.sock")
	l, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	mux := http.NewServeMux()
	mux.HandleFunc("/v1/version", func(w http.ResponseWriter, _ *http.Request) {
		_ = json.NewEncoder(w).Encode(localapi.Version{Node: "n1", Daemon: "v1.2.3", OVS: "3.3.0", Datapath: "system"})
	})
	srv := &http.Server{Handler: mux}
	go func() { _ = srv.Serve(l) }()
	t.Cleanup(func() { _ = srv.Close() })
	return sock
}

// seinectl version prints what it knows in every format, and exits
// non-zero when the daemon did not answer, as kubectl version without a
// server does.
func TestVersionWithoutTheDaemonFails(t *testing.T) {
	up := fakeDaemon(t)
	down := filepath.Join(t.TempDir(), "none.sock")
	for _, o := range []string{"", "json", "yaml"} {
		app, out, _ := testApp(nil)
		err := app.Run([]string{"seinectl", "--socket", down, "version", "-o", o})
		if err == nil || !strings.Contains(err.Error(), "none.sock") {
			t.Errorf("-o %q, no daemon: error %v, want one naming the socket", o, err)
		}
		if !strings.Contains(out.String(), "unreachable") && !strings.Contains(out.String(), "daemonError") {
			t.Errorf("-o %q, no daemon: printed %q", o, out.String())
		}
		app, out, _ = testApp(nil)
		if err := app.Run([]string{"seinectl", "--socket", up, "version", "-o", o}); err != nil {
			t.Errorf("-o %q: %v", o, err)
		}
		if !strings.Contains(out.String(), "v1.2.3") {
			t.Errorf("-o %q: printed %q", o, out.String())
		}
		// --client asks no daemon and succeeds without one.
		app, out, _ = testApp(nil)
		if err := app.Run([]string{"seinectl", "--socket", down, "version", "--client", "-o", o}); err != nil {
			t.Errorf("-o %q --client, no daemon: %v", o, err)
		}
		if strings.Contains(out.String(), "unreachable") || strings.Contains(out.String(), "daemonError") {
			t.Errorf("-o %q --client: printed %q, want no daemon asked", o, out.String())
		}
	}
}
