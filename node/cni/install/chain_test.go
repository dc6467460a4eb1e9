package install

import (
	"context"
	"encoding/json"
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/containernetworking/cni/libcni"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"go.uber.org/zap/zaptest"
	"go.uber.org/zap/zaptest/observer"
)

// ptpConflist is a routed primary's conflist as Debian's plugins take it,
// with a key seine does not know (kept as written).
const ptpConflist = `{
  "cniVersion": "1.0.0",
  "name": "routed",
  "x-vendor": {"owner": "primary"},
  "plugins": [
    {"type": "ptp", "ipam": {"type": "host-local", "ranges": [[{"subnet": "10.244.1.0/24"}]]}},
    {"type": "portmap", "capabilities": {"portMappings": true}}
  ]
}
`

func pluginTypes(t *testing.T, path string) []string {
	t.Helper()
	list, err := libcni.ConfListFromFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, p := range list.Plugins {
		out = append(out, p.Network.Type)
	}
	return out
}

func TestChainAndUnchain(t *testing.T) {
	path := filepath.Join(t.TempDir(), "10-routed.conflist")
	if _, err := Chain(path, "/run/seine/cni.sock"); !errors.Is(err, fs.ErrNotExist) {
		t.Fatalf("missing file: %v", err)
	}
	if err := os.WriteFile(path, []byte(ptpConflist), 0o600); err != nil {
		t.Fatal(err)
	}
	changed, err := Chain(path, "/run/seine/cni.sock")
	if err != nil || !changed {
		t.Fatalf("Chain: %v, %v", changed, err)
	}
	if got := strings.Join(pluginTypes(t, path), ","); got != "ptp,seine,portmap" {
		t.Fatalf("plugins %s, want ptp,seine,portmap", got)
	}
	b, _ := os.ReadFile(path)
	var doc map[string]any
	if err := json.Unmarshal(b, &doc); err != nil || doc["x-vendor"] == nil || doc["name"] != "routed" {
		t.Fatalf("the primary's other keys were not kept: %s", b)
	}
	if !strings.Contains(string(b), `"socketPath": "/run/seine/cni.sock"`) {
		t.Fatalf("seine plugin without its socket: %s", b)
	}
	if fi, _ := os.Stat(path); fi.Mode().Perm() != 0o600 {
		t.Errorf("mode %v changed", fi.Mode())
	}
	// Idempotent; a new socket path is fixed in place; a seine plugin in
	// the wrong place is moved after the primary.
	if changed, err := Chain(path, "/run/seine/cni.sock"); err != nil || changed {
		t.Fatalf("second Chain rewrote the file: %v, %v", changed, err)
	}
	if changed, err := Chain(path, "/var/run/other.sock"); err != nil || !changed {
		t.Fatalf("Chain with a new socket: %v, %v", changed, err)
	}
	if got := strings.Join(pluginTypes(t, path), ","); got != "ptp,seine,portmap" {
		t.Fatalf("plugins %s after the socket change", got)
	}
	if b, _ := os.ReadFile(path); !strings.Contains(string(b), "/var/run/other.sock") || strings.Contains(string(b), "/run/seine/cni.sock") {
		t.Fatalf("socket not replaced: %s", b)
	}
	if ok, err := Chained(path); err != nil || !ok {
		t.Fatalf("Chained: %v %v", ok, err)
	}
	if changed, err := Unchain(path); err != nil || !changed {
		t.Fatalf("Unchain: %v, %v", changed, err)
	}
	if got := strings.Join(pluginTypes(t, path), ","); got != "ptp,portmap" {
		t.Fatalf("plugins %s after Unchain", got)
	}
	if ok, _ := Chained(path); ok {
		t.Fatal("still chained")
	}
	// A list without any plugin cannot take seine.
	if err := os.WriteFile(path, []byte(`{"cniVersion":"1.0.0","name":"x","plugins":[]}`), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := Chain(path, "/s"); err == nil || !strings.Contains(err.Error(), "no primary plugin") {
		t.Fatalf("empty list: %v", err)
	}
}

// TestKeepChained: the primary writes its conflist after seine started
// watching, and rewrites it twice without seine (once in place, once by
// renaming a new file over it); each time seine is chained again.
func TestKeepChained(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "10-routed.conflist")
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	core, logs := observer.New(zapcore.InfoLevel)
	log := zap.New(zapcore.NewTee(zaptest.NewLogger(t).Core(), core))
	go func() { done <- KeepChained(ctx, path, "/run/seine/cni.sock", log) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Error(err)
		}
	})
	waitChained := func(what string) {
		t.Helper()
		deadline := time.Now().Add(10 * time.Second)
		for {
			if ok, _ := Chained(path); ok {
				return
			}
			if time.Now().After(deadline) {
				b, _ := os.ReadFile(path)
				t.Fatalf("%s: seine not chained after 10 s:\n%s", what, b)
			}
			time.Sleep(20 * time.Millisecond)
		}
	}
	// The watch is on once KeepChained has found the file missing.
	watching := time.After(10 * time.Second)
	for logs.FilterMessage("waiting for the primary CNI's conflist").Len() == 0 {
		select {
		case err := <-done:
			done <- err // for the cleanup
			t.Fatalf("KeepChained returned: %v", err)
		case <-watching:
			t.Fatal("KeepChained did not report the missing conflist within 10 s")
		case <-time.After(5 * time.Millisecond):
		}
	}
	if err := os.WriteFile(path, []byte(ptpConflist), 0o644); err != nil {
		t.Fatal(err)
	}
	waitChained("file created")
	if err := os.WriteFile(path, []byte(ptpConflist), 0o644); err != nil {
		t.Fatal(err)
	}
	waitChained("file rewritten in place")
	tmp := filepath.Join(dir, ".tmp-routed")
	if err := os.WriteFile(tmp, []byte(ptpConflist), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(tmp, path); err != nil {
		t.Fatal(err)
	}
	waitChained("file replaced by rename")
	if got := strings.Join(pluginTypes(t, path), ","); got != "ptp,seine,portmap" {
		t.Fatalf("plugins %s", got)
	}
}
