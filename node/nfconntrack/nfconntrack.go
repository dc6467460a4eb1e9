// Package nfconntrack sizes and times the kernel's connection tracker
// (nf_conntrack) the way kube-proxy does, for clusters where Seine's
// Service proxy stands in for kube-proxy (proxy.proxyAll).
//
// Why it matters: the kernel tracks every connection the host forwards or
// NATs (NodePorts, masquerade, and on the kernel datapath every Pod
// connection OVS's ct() action commits). A full table drops new
// connections ("nf_conntrack: table full, dropping packet" in the kernel
// log). The kernel sizes the table from the host's memory alone; kube-proxy
// raises it to 32,768 entries per CPU (at least 131,072, at most
// 1,048,576), keeps the hash table at a quarter of that, and sets the TCP
// established and CLOSE_WAIT timeouts to 24 h and 1 h. A cluster that drops
// kube-proxy for Seine keeps those settings.
//
// The settings live in /proc/sys/net/netfilter (nf_conntrack-sysctl.rst in
// the kernel's documentation). nf_conntrack_max and the module parameter
// hashsize (/sys/module/nf_conntrack/parameters/hashsize) are the host's:
// they can be written only from the initial network namespace. The
// timeouts and tcp_be_liberal belong to each network namespace.
package nfconntrack

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"syscall"
	"time"

	"k8s.io/utils/cpuset"
)

// Defaults, kube-proxy's (KubeProxyConntrackConfiguration).
const (
	DefaultMaxPerCore            = 32768
	DefaultMin                   = 131072
	DefaultTCPEstablishedTimeout = 24 * time.Hour
	DefaultTCPCloseWaitTimeout   = time.Hour
	// MaxCap bounds the nf_conntrack_max Config asks for on hosts with
	// many CPUs (each entry costs about 300 bytes of kernel memory), as
	// kube-proxy bounds it; Config.Min is at most MaxCap.
	MaxCap = 1 << 20
	// MaxTimeout is the longest timeout, in seconds, every kernel accepts:
	// the sysctls hold jiffies in an int, so the kernel refuses more than
	// INT_MAX/HZ seconds (2,147,483 at HZ=1000) with EINVAL.
	MaxTimeout = 2147483
)

// Config says what to set. A zero field leaves its setting as the host has
// it.
type Config struct {
	// MaxPerCore is the number of entries per CPU nf_conntrack_max is
	// raised to, at least Min and at most MaxCap. nf_conntrack_max is
	// never lowered.
	MaxPerCore int
	// Min is the least nf_conntrack_max that MaxPerCore asks for.
	Min int
	// TCPEstablishedTimeout and TCPCloseWaitTimeout set
	// nf_conntrack_tcp_timeout_established and _close_wait (whole seconds).
	TCPEstablishedTimeout time.Duration
	TCPCloseWaitTimeout   time.Duration
	// TCPBeLiberal sets nf_conntrack_tcp_be_liberal to 1: packets outside
	// the TCP window are not marked INVALID.
	TCPBeLiberal bool
	// UDPTimeout and UDPStreamTimeout set nf_conntrack_udp_timeout and
	// nf_conntrack_udp_timeout_stream (whole seconds).
	UDPTimeout       time.Duration
	UDPStreamTimeout time.Duration
}

// Max returns the nf_conntrack_max that c asks for on a host with cpus
// CPUs: MaxPerCore×cpus, at least Min, at most MaxCap; 0 (leave it) when
// MaxPerCore is 0.
func (c Config) Max(cpus int) int {
	if c.MaxPerCore <= 0 {
		return 0
	}
	return min(max(c.MaxPerCore*cpus, c.Min), MaxCap)
}

// Paths are the roots Apply reads and writes; tests point them elsewhere.
type Paths struct {
	// ProcSys is the sysctl tree. Default /proc/sys.
	ProcSys string
	// Hashsize is nf_conntrack's hashsize module parameter. Default
	// /sys/module/nf_conntrack/parameters/hashsize.
	Hashsize string
	// CPUsOnline lists the host's online CPUs ("0-3,6"). Default
	// /sys/devices/system/cpu/online.
	CPUsOnline string
}

func (p Paths) withDefaults() Paths {
	if p.ProcSys == "" {
		p.ProcSys = "/proc/sys"
	}
	if p.Hashsize == "" {
		p.Hashsize = "/sys/module/nf_conntrack/parameters/hashsize"
	}
	if p.CPUsOnline == "" {
		p.CPUsOnline = "/sys/devices/system/cpu/online"
	}
	return p
}

// Change is one setting Apply wrote: its name (a sysctl under
// net/netfilter, or "hashsize") with the values before and after.
type Change struct {
	Name          string
	Before, After int
}

// ErrNotLoaded is returned (wrapped) when the nf_conntrack module is not
// loaded: its settings do not exist yet. Seine's nftables rules load it.
var ErrNotLoaded = errors.New("the nf_conntrack module is not loaded")

// Apply brings the settings to what c asks for and returns what it
// changed. It counts the host's online CPUs (not this process's CPU
// affinity: the table is the host's). It goes on past a setting it cannot
// write and returns every failure, each naming its setting and cause; a
// value already in force is not written, so a host-wide setting already
// large enough needs no privilege.
func Apply(c Config, p Paths) ([]Change, error) {
	p = p.withDefaults()
	dir := filepath.Join(p.ProcSys, "net", "netfilter")
	if _, err := os.Stat(filepath.Join(dir, "nf_conntrack_max")); errors.Is(err, os.ErrNotExist) {
		return nil, fmt.Errorf("%s: %w", dir, ErrNotLoaded)
	}
	var changes []Change
	var errs []error
	set := func(path, name string, v int, raiseOnly bool) {
		ch, err := write(path, name, v, raiseOnly)
		if err != nil {
			errs = append(errs, err)
		} else if ch != nil {
			changes = append(changes, *ch)
		}
	}
	if want := c.Max(onlineCPUs(p.CPUsOnline)); want > 0 {
		set(filepath.Join(dir, "nf_conntrack_max"), "nf_conntrack_max", want, true)
		// At least one hash bucket per four entries, kube-proxy's ratio.
		set(p.Hashsize, "hashsize", want/4, true)
	}
	for _, s := range []struct {
		name string
		d    time.Duration
	}{
		{"nf_conntrack_tcp_timeout_established", c.TCPEstablishedTimeout},
		{"nf_conntrack_tcp_timeout_close_wait", c.TCPCloseWaitTimeout},
		{"nf_conntrack_udp_timeout", c.UDPTimeout},
		{"nf_conntrack_udp_timeout_stream", c.UDPStreamTimeout},
	} {
		if secs := int(s.d / time.Second); secs > 0 {
			set(filepath.Join(dir, s.name), s.name, secs, false)
		}
	}
	if c.TCPBeLiberal {
		set(filepath.Join(dir, "nf_conntrack_tcp_be_liberal"), "nf_conntrack_tcp_be_liberal", 1, false)
	}
	return changes, errors.Join(errs...)
}

// write sets the integer file path (named name in errors) to v, or only
// raises it to v when raiseOnly. It returns the change, nil when the value
// was already in force.
func write(path, name string, v int, raiseOnly bool) (*Change, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("reading %s: %w", name, err)
	}
	before, err := strconv.Atoi(strings.TrimSpace(string(b)))
	if err != nil {
		return nil, fmt.Errorf("%s holds %q: %w", name, strings.TrimSpace(string(b)), err)
	}
	if before == v || (raiseOnly && before > v) {
		return nil, nil
	}
	if err := os.WriteFile(path, []byte(strconv.Itoa(v)), 0o644); err != nil {
		hint := ""
		if errors.Is(err, os.ErrPermission) || errors.Is(err, syscall.EOPNOTSUPP) || errors.Is(err, syscall.EROFS) {
			if raiseOnly { // nf_conntrack_max and hashsize: the host's
				hint = " (it is the host's: it can be written only from the initial network namespace, with CAP_NET_ADMIN and /proc/sys and /sys writable)"
			} else {
				hint = " (it needs CAP_NET_ADMIN in this network namespace and a writable /proc/sys)"
			}
		}
		return nil, fmt.Errorf("setting %s from %d to %d%s: %w", name, before, v, hint, err)
	}
	return &Change{Name: name, Before: before, After: v}, nil
}

// onlineCPUs counts the host's online CPUs from a CPU list file
// ("0-3,6"), falling back to runtime.NumCPU.
func onlineCPUs(path string) int {
	if b, err := os.ReadFile(path); err == nil {
		if s, err := cpuset.Parse(strings.TrimSpace(string(b))); err == nil && s.Size() > 0 {
			return s.Size()
		}
	}
	return runtime.NumCPU()
}
