package e2e

import (
	"debug/elf"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// TestBinaryIsStatic checks bin/seine has no program interpreter and no
// shared-library dependencies, and that the symlinked names dispatch.
func TestBinaryIsStatic(t *testing.T) {
	f, err := elf.Open(seineBin())
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	for _, p := range f.Progs {
		if p.Type == elf.PT_INTERP {
			t.Fatal("bin/seine has a PT_INTERP segment: it is dynamically linked")
		}
	}
	if libs, _ := f.ImportedLibraries(); len(libs) > 0 {
		t.Fatalf("bin/seine needs shared libraries %v", libs)
	}
	bin := filepath.Dir(seineBin())
	for name, args := range map[string][]string{"seinectl": {"version", "--client"}, "seine": {"version"}} {
		want := name + " "
		if name == "seinectl" {
			want = "seinectl: "
		}
		out, err := exec.Command(filepath.Join(bin, name), args...).CombinedOutput()
		if err != nil || !strings.HasPrefix(string(out), want) || !strings.Contains(string(out), "linux/amd64") {
			t.Errorf("%s version: %q, %v", name, out, err)
		}
	}
	// seine-cni answers VERSION per the CNI spec.
	cmd := exec.Command(filepath.Join(bin, "seine-cni"))
	cmd.Env = append(os.Environ(), "CNI_COMMAND=VERSION")
	cmd.Stdin = strings.NewReader(`{"cniVersion":"1.1.0"}`)
	out, err := cmd.Output()
	if err != nil || !strings.Contains(string(out), `"supportedVersions"`) || !strings.Contains(string(out), "1.1.0") {
		t.Errorf("seine-cni VERSION: %s, %v", out, err)
	}
}
