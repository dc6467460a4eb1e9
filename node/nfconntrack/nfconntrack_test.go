package nfconntrack

import (
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/seine-net/seine/tests/netnstest"
)

func TestMax(t *testing.T) {
	for _, tc := range []struct {
		perCore, min, cpus, want int
	}{
		{0, DefaultMin, 8, 0},                        // leave it
		{DefaultMaxPerCore, DefaultMin, 2, 131072},   // the floor
		{DefaultMaxPerCore, DefaultMin, 8, 262144},   // scaled
		{DefaultMaxPerCore, DefaultMin, 64, MaxCap},  // capped
		{DefaultMaxPerCore, 0, 1, DefaultMaxPerCore}, // no floor
	} {
		if got := (Config{MaxPerCore: tc.perCore, Min: tc.min}).Max(tc.cpus); got != tc.want {
			t.Errorf("Max(%d) with maxPerCore %d, min %d = %d, want %d", tc.cpus, tc.perCore, tc.min, got, tc.want)
		}
	}
}

// fakeTree writes a sysctl tree with the given net/netfilter values, a
// hashsize and a CPU list under a temporary directory.
func fakeTree(t *testing.T, sysctls map[string]int, hashsize int, cpus string) Paths {
	t.Helper()
	root := t.TempDir()
	dir := filepath.Join(root, "proc", "net", "netfilter")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	for k, v := range sysctls {
		if err := os.WriteFile(filepath.Join(dir, k), []byte(strconv.Itoa(v)+"\n"), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	p := Paths{ProcSys: filepath.Join(root, "proc"), Hashsize: filepath.Join(root, "hashsize"), CPUsOnline: filepath.Join(root, "online")}
	if err := os.WriteFile(p.Hashsize, []byte(strconv.Itoa(hashsize)+"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(p.CPUsOnline, []byte(cpus+"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	return p
}

func readInt(t *testing.T, path string) int {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	v, err := strconv.Atoi(strings.TrimSpace(string(b)))
	if err != nil {
		t.Fatal(err)
	}
	return v
}

// TestApplyRules checks, on a tree of plain files, that nf_conntrack_max
// and hashsize are only raised (from the host's online CPUs, not this
// process's), timeouts are set in either direction, and what is already
// in force is not written.
func TestApplyRules(t *testing.T) {
	kube := Config{MaxPerCore: DefaultMaxPerCore, Min: DefaultMin, TCPEstablishedTimeout: DefaultTCPEstablishedTimeout,
		TCPCloseWaitTimeout: DefaultTCPCloseWaitTimeout, TCPBeLiberal: true, UDPTimeout: 45 * time.Second}
	p := fakeTree(t, map[string]int{
		"nf_conntrack_max":                     65536,
		"nf_conntrack_tcp_timeout_established": 432000,
		"nf_conntrack_tcp_timeout_close_wait":  60,
		"nf_conntrack_tcp_be_liberal":          0,
		"nf_conntrack_udp_timeout":             30,
		"nf_conntrack_udp_timeout_stream":      120,
	}, 16384, "0-3,6-9") // 8 CPUs: 262,144 entries, 65,536 buckets
	changes, err := Apply(kube, p)
	if err != nil {
		t.Fatal(err)
	}
	want := []Change{
		{"nf_conntrack_max", 65536, 262144},
		{"hashsize", 16384, 65536},
		{"nf_conntrack_tcp_timeout_established", 432000, 86400},
		{"nf_conntrack_tcp_timeout_close_wait", 60, 3600},
		{"nf_conntrack_udp_timeout", 30, 45},
		{"nf_conntrack_tcp_be_liberal", 0, 1},
	}
	if !slices.Equal(changes, want) {
		t.Fatalf("changes %v, want %v", changes, want)
	}
	dir := filepath.Join(p.ProcSys, "net", "netfilter")
	if v := readInt(t, filepath.Join(dir, "nf_conntrack_udp_timeout_stream")); v != 120 {
		t.Errorf("udp_timeout_stream changed to %d though not configured", v)
	}
	if changes, err := Apply(kube, p); err != nil || len(changes) != 0 {
		t.Fatalf("second Apply: %v, %v; want nothing to change", changes, err)
	}

	// A larger table and hash than asked for stay; a timeout above the
	// configured one is lowered to it.
	p = fakeTree(t, map[string]int{"nf_conntrack_max": 1 << 21, "nf_conntrack_tcp_timeout_established": 999999}, 1<<20, "0-1")
	changes, err = Apply(Config{MaxPerCore: DefaultMaxPerCore, Min: DefaultMin, TCPEstablishedTimeout: time.Hour}, p)
	if err != nil {
		t.Fatal(err)
	}
	if want := []Change{{"nf_conntrack_tcp_timeout_established", 999999, 3600}}; !slices.Equal(changes, want) {
		t.Fatalf("changes %v, want %v", changes, want)
	}
	if v := readInt(t, filepath.Join(p.ProcSys, "net", "netfilter", "nf_conntrack_max")); v != 1<<21 {
		t.Errorf("nf_conntrack_max lowered to %d", v)
	}

	// Without the module there is nothing to tune, and the error says so.
	p.ProcSys = t.TempDir()
	if _, err := Apply(Config{MaxPerCore: 1}, p); !errors.Is(err, ErrNotLoaded) {
		t.Fatalf("Apply without nf_conntrack: %v, want ErrNotLoaded", err)
	}
}

// TestApplyNetworkNamespace runs Apply against the kernel in a fresh network
// namespace: the timeouts and tcp_be_liberal, which are the namespace's,
// are set; raising nf_conntrack_max, which is the host's, fails with an
// error naming it and the initial namespace, changes nothing, and does not
// stop the other settings.
func TestApplyNetworkNamespace(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root")
	}
	if _, err := os.Stat("/proc/sys/net/netfilter/nf_conntrack_max"); err != nil {
		t.Skipf("nf_conntrack not loaded: %v", err)
	}
	netnstest.Run(t, func() {
		const dir = "/proc/sys/net/netfilter/"
		hostMax := readInt(t, dir+"nf_conntrack_max")
		cfg := Config{TCPEstablishedTimeout: 24 * time.Hour, TCPCloseWaitTimeout: time.Hour, TCPBeLiberal: true,
			UDPStreamTimeout: 100 * time.Second}
		if hostMax < MaxCap {
			cfg.MaxPerCore, cfg.Min = 1, hostMax+1 // one more than the host has
		}
		changes, err := Apply(cfg, Paths{})
		if hostMax < MaxCap {
			if err == nil || !strings.Contains(err.Error(), "nf_conntrack_max") || !strings.Contains(err.Error(), "initial network namespace") {
				t.Errorf("raising nf_conntrack_max from a network namespace: %v; want an error naming it and the initial namespace", err)
			}
			if v := readInt(t, dir+"nf_conntrack_max"); v != hostMax {
				t.Errorf("nf_conntrack_max changed from %d to %d", hostMax, v)
			}
		} else if err != nil {
			t.Error(err)
		}
		for name, want := range map[string]int{
			"nf_conntrack_tcp_timeout_established": 86400,
			"nf_conntrack_tcp_timeout_close_wait":  3600,
			"nf_conntrack_tcp_be_liberal":          1,
			"nf_conntrack_udp_timeout_stream":      100,
		} {
			if v := readInt(t, dir+name); v != want {
				t.Errorf("%s = %d after Apply, want %d", name, v, want)
			}
			if !slices.ContainsFunc(changes, func(c Change) bool { return c.Name == name && c.After == want }) {
				t.Errorf("changes %v do not report %s", changes, name)
			}
		}
	})
}
