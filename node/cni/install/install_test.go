package install

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/containernetworking/cni/libcni"
)

func setup(t *testing.T) (Options, []byte) {
	t.Helper()
	root := t.TempDir()
	bin := []byte("#!/bin/sh\necho seine\n")
	src := filepath.Join(root, "seine-src")
	if err := os.WriteFile(src, bin, 0o700); err != nil {
		t.Fatal(err)
	}
	o := DefaultOptions()
	o.BinDir = filepath.Join(root, "opt", "cni", "bin")
	o.ConfDir = filepath.Join(root, "etc", "cni", "net.d")
	o.SocketPath = "/run/seine/cni.sock"
	o.MTU = 1450
	o.Binary = src
	// Debian's containernetworking-plugins provide portmap and bandwidth.
	o.PluginDirs = []string{o.BinDir, "/usr/lib/cni"}
	return o, bin
}

func TestNegotiatedVersion(t *testing.T) {
	o, _ := setup(t)
	o.ChainPortmap, o.ChainBandwidth = true, true
	v, err := negotiateVersion(o)
	if err != nil {
		t.Fatal(err)
	}
	// Debian 12's plugins (v1.1.1) stop at spec 1.0.0.
	if v != "1.0.0" {
		t.Fatalf("negotiated %q", v)
	}
	o.ChainPortmap, o.ChainBandwidth = false, false
	if v, err := negotiateVersion(o); err != nil || v != CNIVersion {
		t.Fatalf("without chained plugins: %q, %v; want %s", v, err, CNIVersion)
	}
	o.ChainPortmap = true
	o.PluginDirs = []string{t.TempDir()}
	if _, err := negotiateVersion(o); err == nil || !strings.Contains(err.Error(), "portmap not found") {
		t.Fatalf("missing portmap: %v", err)
	}
}

// By default seine is alone in its conflist and declares the capabilities
// it serves itself.
func TestDefaultConfListServesCapabilities(t *testing.T) {
	o, _ := setup(t)
	if err := Install(o); err != nil {
		t.Fatal(err)
	}
	list, err := libcni.ConfListFromFile(filepath.Join(o.ConfDir, ConfListName))
	if err != nil {
		t.Fatal(err)
	}
	if list.CNIVersion != CNIVersion || len(list.Plugins) != 1 || list.Plugins[0].Network.Type != "seine" {
		t.Fatalf("conflist = version %q, %d plugins: %s", list.CNIVersion, len(list.Plugins), list.Bytes)
	}
	caps := list.Plugins[0].Network.Capabilities
	if !caps["portMappings"] || !caps["bandwidth"] || len(caps) != 2 {
		t.Errorf("seine's capabilities = %v, want portMappings and bandwidth", caps)
	}
	// Chaining one plugin moves its capability off seine's entry.
	o.ChainPortmap = true
	raw, err := ConfList(o)
	if err != nil {
		t.Fatal(err)
	}
	list, err = libcni.ConfListFromBytes(raw)
	if err != nil {
		t.Fatal(err)
	}
	if caps := list.Plugins[0].Network.Capabilities; caps["portMappings"] || !caps["bandwidth"] {
		t.Errorf("with portmap chained, seine's capabilities = %v", caps)
	}
}

// TestInstalledChain reads back which plugins an installed conflist
// chains, so an upgrade can keep them.
func TestInstalledChain(t *testing.T) {
	o, _ := setup(t)
	if pm, bw := InstalledChain(o.ConfDir); pm || bw {
		t.Errorf("no conflist: portmap %v, bandwidth %v", pm, bw)
	}
	if err := Install(o); err != nil {
		t.Fatal(err)
	}
	if pm, bw := InstalledChain(o.ConfDir); pm || bw {
		t.Errorf("seine alone: portmap %v, bandwidth %v", pm, bw)
	}
	o.ChainPortmap, o.ChainBandwidth = true, true
	if err := Install(o); err != nil {
		t.Fatal(err)
	}
	if pm, bw := InstalledChain(o.ConfDir); !pm || !bw {
		t.Errorf("both chained: portmap %v, bandwidth %v", pm, bw)
	}
}

func TestResolveChain(t *testing.T) {
	for _, installed := range []bool{false, true} {
		o, _ := setup(t)
		o.ChainPortmap, o.ChainBandwidth = installed, installed
		if err := Install(o); err != nil {
			t.Fatal(err)
		}
		for _, c := range []struct {
			portmap, bandwidth Choice
			wantPM, wantBW     bool
			notes              int
		}{
			{KeepInstalled, KeepInstalled, installed, installed, map[bool]int{false: 0, true: 2}[installed]},
			{ChainPlugin, ServeInSeine, true, false, 0},
			{ServeInSeine, KeepInstalled, false, installed, map[bool]int{false: 0, true: 1}[installed]},
			{KeepInstalled, ChainPlugin, installed, true, map[bool]int{false: 0, true: 1}[installed]},
		} {
			r := Options{ConfDir: o.ConfDir}
			notes := r.ResolveChain(c.portmap, c.bandwidth)
			if r.ChainPortmap != c.wantPM || r.ChainBandwidth != c.wantBW || len(notes) != c.notes {
				t.Errorf("installed chained %v, choices %d/%d: portmap %v bandwidth %v notes %q; want %v %v and %d notes",
					installed, c.portmap, c.bandwidth, r.ChainPortmap, r.ChainBandwidth, notes, c.wantPM, c.wantBW, c.notes)
			}
			for _, n := range notes {
				if !strings.Contains(n, "=false") {
					t.Errorf("note %q does not say how to hand the plugin over", n)
				}
			}
		}
	}
}

func TestInstallWritesConfListAndBinary(t *testing.T) {
	o, bin := setup(t)
	o.ChainPortmap, o.ChainBandwidth = true, true
	if err := Install(o); err != nil {
		t.Fatal(err)
	}
	dst := filepath.Join(o.BinDir, "seine")
	got, err := os.ReadFile(dst)
	if err != nil || !bytes.Equal(got, bin) {
		t.Fatalf("installed binary = %q, %v", got, err)
	}
	if fi, _ := os.Stat(dst); fi.Mode().Perm() != 0o755 {
		t.Errorf("binary mode = %o, want 755", fi.Mode().Perm())
	}

	list, err := libcni.ConfListFromFile(filepath.Join(o.ConfDir, ConfListName))
	if err != nil {
		t.Fatal(err)
	}
	if list.Name != "seine" || list.CNIVersion != "1.0.0" || len(list.Plugins) != 3 {
		t.Fatalf("conflist = name %q version %q %d plugins", list.Name, list.CNIVersion, len(list.Plugins))
	}
	var types []string
	for _, p := range list.Plugins {
		types = append(types, p.Network.Type)
	}
	if types[0] != "seine" || types[1] != "portmap" || types[2] != "bandwidth" {
		t.Errorf("plugin types = %v", types)
	}
	if !list.Plugins[1].Network.Capabilities["portMappings"] || !list.Plugins[2].Network.Capabilities["bandwidth"] {
		t.Errorf("chained capabilities missing: %s", list.Bytes)
	}
	first := string(list.Plugins[0].Bytes)
	for _, want := range []string{`"socketPath":"/run/seine/cni.sock"`, `"mtu":1450`} {
		if !bytes.Contains([]byte(first), []byte(want)) {
			t.Errorf("seine plugin conf %s lacks %s", first, want)
		}
	}
	// libcni finds it as the network a runtime would load.
	if _, err := libcni.LoadNetworkConf(o.ConfDir, "seine"); err != nil {
		t.Errorf("LoadNetworkConf: %v", err)
	}
}

func TestInstallIdempotentAndUpdates(t *testing.T) {
	o, _ := setup(t)
	o.ChainPortmap, o.ChainBandwidth = true, true
	if err := Install(o); err != nil {
		t.Fatal(err)
	}
	conf := filepath.Join(o.ConfDir, ConfListName)
	dst := filepath.Join(o.BinDir, "seine")
	// Back-date both files so an unwanted rewrite shows as a new mtime.
	old := time.Now().Add(-time.Hour).Truncate(time.Second)
	for _, p := range []string{conf, dst} {
		if err := os.Chtimes(p, old, old); err != nil {
			t.Fatal(err)
		}
	}
	if err := Install(o); err != nil {
		t.Fatalf("second Install: %v", err)
	}
	for _, p := range []string{conf, dst} {
		fi, err := os.Stat(p)
		if err != nil {
			t.Fatal(err)
		}
		if !fi.ModTime().Equal(old) {
			t.Errorf("%s rewritten by an identical Install", p)
		}
	}
	for _, dir := range []string{o.ConfDir, o.BinDir} {
		entries, err := os.ReadDir(dir)
		if err != nil {
			t.Fatal(err)
		}
		if len(entries) != 1 {
			t.Errorf("%s holds %d entries, want 1 (temp files left?)", dir, len(entries))
		}
	}

	// A new binary and new options replace the installed files.
	newBin := []byte("#!/bin/sh\necho seine v2\n")
	if err := os.WriteFile(o.Binary, newBin, 0o700); err != nil {
		t.Fatal(err)
	}
	o.ChainPortmap, o.ChainBandwidth = false, false
	if err := Install(o); err != nil {
		t.Fatal(err)
	}
	if got, _ := os.ReadFile(dst); !bytes.Equal(got, newBin) {
		t.Errorf("binary not updated: %q", got)
	}
	list, err := libcni.ConfListFromFile(conf)
	if err != nil {
		t.Fatal(err)
	}
	if len(list.Plugins) != 1 || list.Plugins[0].Network.Type != "seine" {
		t.Errorf("unchained conflist has %d plugins", len(list.Plugins))
	}
}

func TestInstallKeepsOtherConfsAndRejectsBadMTU(t *testing.T) {
	o, _ := setup(t)
	if err := os.MkdirAll(o.ConfDir, 0o755); err != nil {
		t.Fatal(err)
	}
	other := filepath.Join(o.ConfDir, "05-other.conflist")
	if err := os.WriteFile(other, []byte(`{"cniVersion":"1.0.0","name":"other","plugins":[{"type":"bridge"}]}`), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := Install(o); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(other); err != nil {
		t.Errorf("other conflist removed: %v", err)
	}
	o.MTU = -1
	if err := Install(o); err == nil {
		t.Error("Install accepted mtu -1")
	}
}

func TestInstallSkipsCopyOntoItself(t *testing.T) {
	o, bin := setup(t)
	if err := Install(o); err != nil {
		t.Fatal(err)
	}
	// The daemon may run from the installed copy itself.
	o.Binary = filepath.Join(o.BinDir, "seine")
	if err := Install(o); err != nil {
		t.Fatal(err)
	}
	if got, _ := os.ReadFile(o.Binary); !bytes.Equal(got, bin) {
		t.Errorf("self-install changed the binary: %q", got)
	}
}

// TestInstallPluginsWhereMissing copies the chained portmap and bandwidth,
// and loopback, from the image's directory only when the host lacks them,
// and then
// negotiates the version with the installed copies.
func TestInstallPluginsWhereMissing(t *testing.T) {
	o, _ := setup(t)
	o.ChainPortmap, o.ChainBandwidth = true, true
	o.PluginDirs = nil // negotiate with what is in BinDir only
	o.PluginsFrom = "/usr/lib/cni"
	if err := os.MkdirAll(o.BinDir, 0o755); err != nil {
		t.Fatal(err)
	}
	hostPortmap := []byte("#!/bin/sh\necho '{\"cniVersion\":\"1.0.0\",\"supportedVersions\":[\"0.4.0\",\"1.0.0\"]}'\n")
	if err := os.WriteFile(filepath.Join(o.BinDir, "portmap"), hostPortmap, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := Install(o); err != nil {
		t.Fatal(err)
	}
	if got, _ := os.ReadFile(filepath.Join(o.BinDir, "portmap")); !bytes.Equal(got, hostPortmap) {
		t.Error("the host's portmap was replaced")
	}
	for _, name := range []string{"bandwidth", "loopback"} {
		want, _ := os.ReadFile("/usr/lib/cni/" + name)
		if got, err := os.ReadFile(filepath.Join(o.BinDir, name)); err != nil || !bytes.Equal(got, want) {
			t.Errorf("%s not installed from /usr/lib/cni: %v", name, err)
		}
	}
	o.PluginsFrom = t.TempDir()
	if err := os.Remove(filepath.Join(o.BinDir, "bandwidth")); err != nil {
		t.Fatal(err)
	}
	if err := Install(o); err == nil || !strings.Contains(err.Error(), "CNI plugin bandwidth") {
		t.Errorf("missing everywhere: %v", err)
	}
}
