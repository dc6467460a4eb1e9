package ctl

import (
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// apiServer answers every request with an empty ControllerInfo list.
func apiServer(t *testing.T) string {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		_, _ = w.Write([]byte(`{"kind":"ControllerInfoList","apiVersion":"ops.seine.io/v1alpha1","items":[]}`))
	}))
	t.Cleanup(srv.Close)
	return srv.URL
}

func writeFile(t *testing.T, dir, name, text string) string {
	p := filepath.Join(dir, name)
	if err := os.WriteFile(p, []byte(text), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

// $KUBECONFIG is a list of files, merged as kubectl does (here the cluster
// and user are in one file, the context in the other); --kubeconfig names
// one file and wins over $KUBECONFIG.
func TestKubeconfigList(t *testing.T) {
	dir := t.TempDir()
	server := apiServer(t)
	a := writeFile(t, dir, "a", `apiVersion: v1
kind: Config
clusters:
- name: c1
  cluster: {server: "`+server+`"}
users:
- name: u1
  user: {token: t0ken}
`)
	b := writeFile(t, dir, "b", `apiVersion: v1
kind: Config
contexts:
- name: ctx
  context: {cluster: c1, user: u1}
current-context: ctx
`)
	whole := writeFile(t, dir, "whole", `apiVersion: v1
kind: Config
clusters:
- name: c1
  cluster: {server: "`+server+`"}
contexts:
- name: ctx
  context: {cluster: c1}
current-context: ctx
`)
	run := func(args ...string) (string, error) {
		app := NewApp()
		var out strings.Builder
		app.Writer, app.ErrWriter = &out, &out
		err := app.Run(append([]string{"seinectl"}, args...))
		return out.String(), err
	}
	t.Setenv("KUBECONFIG", a+string(os.PathListSeparator)+b)
	if out, err := run("get", "controllerinfo", "-o", "json"); err != nil || strings.TrimSpace(out) != "[]" {
		t.Errorf("KUBECONFIG=a:b: %v, printed %q", err, out)
	}
	t.Setenv("KUBECONFIG", filepath.Join(dir, "missing")+string(os.PathListSeparator)+b)
	if out, err := run("--kubeconfig", whole, "get", "controllerinfo", "-o", "json"); err != nil || strings.TrimSpace(out) != "[]" {
		t.Errorf("--kubeconfig whole: %v, printed %q", err, out)
	}
	if _, err := run("--kubeconfig", filepath.Join(dir, "missing"), "get", "controllerinfo"); err == nil || !strings.Contains(err.Error(), "missing") {
		t.Errorf("--kubeconfig missing: error %v, want one naming the file", err)
	}
}
