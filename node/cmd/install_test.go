package cmd

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/seine-net/seine/node/cni/install"
)

// routedConflist is a routed primary CNI's conflist, as seine chains into.
const routedConflist = `{"cniVersion":"1.0.0","name":"routed","plugins":[{"type":"ptp","ipam":{"type":"host-local","ranges":[[{"subnet":"10.244.1.0/24"}]]}}]}`

// runInstallCNI runs `seine install-cni args...` and returns its output.
func runInstallCNI(t *testing.T, args ...string) (string, error) {
	t.Helper()
	app := NewApp()
	var out bytes.Buffer
	app.Writer, app.ErrWriter = &out, &out
	err := app.Run(append([]string{"seine", "install-cni"}, args...))
	return out.String(), err
}

// TestInstallCNIFromConfig: with the daemon's configuration in
// networkPolicyOnly mode, install-cni (as the DaemonSet's init container
// runs it, the host under a root of its own) installs the binary, removes
// the conflist of seine's own an install in encap mode left, and chains
// seine into the primary's conflist, with the configured socket. Before
// the primary has written its conflist it installs the binary and
// succeeds (the daemon chains itself in later). In encap mode the same
// flags write seine's own conflist with the configured socket.
func TestInstallCNIFromConfig(t *testing.T) {
	host := t.TempDir()
	binDir, confDir := filepath.Join(host, "opt/cni/bin"), filepath.Join(host, "etc/cni/net.d")
	for _, d := range []string{binDir, confDir} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	cfgPath := filepath.Join(t.TempDir(), "seine.yaml")
	writeConfig := func(body string) {
		t.Helper()
		if err := os.WriteFile(cfgPath, []byte("nodeName: n1\ncniSocket: /run/seine-test/cni.sock\n"+body), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	args := []string{"--cni-bin-dir", binDir, "--cni-conf-dir", confDir, "--config", cfgPath, "--host-root", host}
	primary := filepath.Join(confDir, "20-routed.conflist")
	writeConfig("trafficEncapMode: networkPolicyOnly\nprimaryCNIConflist: /etc/cni/net.d/20-routed.conflist\n")

	// The primary has not written its conflist yet.
	if out, err := runInstallCNI(t, args...); err != nil || !strings.Contains(out, "does not exist yet") {
		t.Fatalf("install-cni before the primary's conflist: %v\n%s", err, out)
	}
	if _, err := os.Stat(filepath.Join(binDir, install.PluginType)); err != nil {
		t.Fatalf("the plugin binary is not installed: %v", err)
	}
	if _, err := os.Stat(primary); err == nil {
		t.Fatal("install-cni wrote the primary's conflist")
	}

	// An earlier install in encap mode left seine's own conflist.
	own := filepath.Join(confDir, install.ConfListName)
	if err := os.WriteFile(own, []byte(`{"cniVersion":"1.0.0","name":"seine","plugins":[{"type":"seine"}]}`), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(primary, []byte(routedConflist), 0o644); err != nil {
		t.Fatal(err)
	}
	if out, err := runInstallCNI(t, args...); err != nil {
		t.Fatalf("install-cni: %v\n%s", err, out)
	}
	if _, err := os.Stat(own); err == nil {
		t.Errorf("%s is still there: it would sort before the primary's conflist", own)
	}
	if ok, err := install.Chained(primary); err != nil || !ok {
		t.Errorf("seine not chained into the primary's conflist: %v %v", ok, err)
	}
	if b, _ := os.ReadFile(primary); !strings.Contains(string(b), "/run/seine-test/cni.sock") {
		t.Errorf("the chained plugin does not name the configured socket:\n%s", b)
	}

	// encap: seine's own conflist, with the configured socket.
	writeConfig("")
	if out, err := runInstallCNI(t, args...); err != nil {
		t.Fatalf("install-cni in encap mode: %v\n%s", err, out)
	}
	if b, err := os.ReadFile(own); err != nil || !strings.Contains(string(b), "/run/seine-test/cni.sock") {
		t.Errorf("seine's conflist in encap mode: %v\n%s", err, b)
	}

	// --unchain without --chain-into is refused, also with --config in
	// networkPolicyOnly (it must not chain seine in instead).
	writeConfig("trafficEncapMode: networkPolicyOnly\nprimaryCNIConflist: /etc/cni/net.d/20-routed.conflist\n")
	if _, err := runInstallCNI(t, append(args, "--unchain")...); err == nil || !strings.Contains(err.Error(), "--unchain needs --chain-into") {
		t.Errorf("--unchain with --config: %v", err)
	}

	// A configuration the daemon would refuse is refused here too.
	writeConfig("trafficEncapMode: networkPolicyOnly\n")
	if _, err := runInstallCNI(t, args...); err == nil || !strings.Contains(err.Error(), "primaryCNIConflist") {
		t.Errorf("networkPolicyOnly without primaryCNIConflist: %v", err)
	}
}
