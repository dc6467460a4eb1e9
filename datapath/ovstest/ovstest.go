// Package ovstest starts a private Open vSwitch (ovsdb-server plus
// ovs-vswitchd, userspace datapath) for tests that need a real switch.
// Everything lives in a temporary directory and is torn down by t.Cleanup,
// also when the test fails.
package ovstest

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

// SchemaPath is where Debian's openvswitch-common installs the vswitch schema.
const SchemaPath = "/usr/share/openvswitch/vswitch.ovsschema"

// OVS is one running private switch.
type OVS struct {
	// RunDir holds db.sock, the daemons' control sockets and, for each
	// bridge, <bridge>.mgmt (the OpenFlow management socket).
	RunDir string
	t      testing.TB
	lock   *os.File
	ownTap bool // netdevTap did not exist before this switch
}

// netdevTap is the tap device of the userspace datapath.
const netdevTap = "ovs-netdev"

// LockPath is the file whose exclusive flock(2) a running test switch
// holds. Every userspace-datapath ovs-vswitchd of a network namespace
// opens the same tap device, "ovs-netdev", and a second one fails with
// EBUSY; test binaries of different packages run in parallel, so they
// take turns.
const LockPath = "/tmp/seine-ovstest.lock"

// DBSocket is the OVSDB endpoint in libovsdb form ("unix:/path/db.sock").
func (o *OVS) DBSocket() string { return "unix:" + filepath.Join(o.RunDir, "db.sock") }

// MgmtSocket is the path of the OpenFlow management socket of bridge.
func (o *OVS) MgmtSocket(bridge string) string { return filepath.Join(o.RunDir, bridge+".mgmt") }

// Env is the environment that points OVS command-line tools at this switch.
func (o *OVS) Env() []string {
	return append(os.Environ(), "OVS_RUNDIR="+o.RunDir, "OVS_DBDIR="+o.RunDir, "OVS_LOGDIR="+o.RunDir)
}

// Run runs an OVS tool (ovs-vsctl, ovs-ofctl, ovs-appctl) against this
// switch and returns its standard output; it fails the test on error.
func (o *OVS) Run(tool string, args ...string) string {
	o.t.Helper()
	out, err := o.TryRun(tool, args...)
	if err != nil {
		o.t.Fatalf("%s %s: %v", tool, strings.Join(args, " "), err)
	}
	return out
}

// TryRun is Run without failing the test.
func (o *OVS) TryRun(tool string, args ...string) (string, error) {
	switch tool {
	case "ovs-vsctl":
		args = append([]string{"--db=" + o.DBSocket(), "--timeout=10"}, args...)
	case "ovs-appctl":
		args = append([]string{"-t", filepath.Join(o.RunDir, "ovs-vswitchd.ctl")}, args...)
	}
	cmd := exec.Command(tool, args...)
	cmd.Env = o.Env()
	var stderr strings.Builder
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return string(out), fmt.Errorf("%w: %s", err, stderr.String())
	}
	return string(out), nil
}

// Start launches ovsdb-server and ovs-vswitchd in a fresh temporary
// directory. It skips the test when the process is not root and fails it
// when an OVS binary is missing.
func Start(t testing.TB) *OVS {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("needs root to run Open vSwitch")
	}
	for _, bin := range []string{"ovsdb-tool", "ovsdb-server", "ovs-vswitchd"} {
		if _, err := exec.LookPath(bin); err != nil {
			t.Fatalf("%s not found (run `make deps`): %v", bin, err)
		}
	}
	// Unix socket paths are limited to 108 bytes: keep the directory short.
	dir, err := os.MkdirTemp("/tmp", "ovs")
	if err != nil {
		t.Fatal(err)
	}
	lock, err := os.OpenFile(LockPath, os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		t.Fatal(err)
	}
	if err := syscall.Flock(int(lock.Fd()), syscall.LOCK_EX); err != nil {
		lock.Close()
		os.RemoveAll(dir)
		t.Fatalf("lock %s: %v", LockPath, err)
	}
	// The datapath's tap device outlives ovs-vswitchd; remove it at the end
	// unless it was there before (someone else's switch).
	_, err = os.Stat("/sys/class/net/" + netdevTap)
	o := &OVS{RunDir: dir, t: t, lock: lock, ownTap: os.IsNotExist(err)}
	t.Cleanup(func() { o.stop() })

	run := func(name string, args ...string) {
		cmd := exec.Command(name, args...)
		cmd.Env = o.Env()
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("%s %v: %v: %s", name, args, err, out)
		}
	}
	db := filepath.Join(dir, "conf.db")
	run("ovsdb-tool", "create", db, SchemaPath)
	run("ovsdb-server", db,
		"--remote=punix:"+filepath.Join(dir, "db.sock"),
		"--unixctl="+filepath.Join(dir, "ovsdb-server.ctl"),
		"--pidfile="+filepath.Join(dir, "ovsdb-server.pid"),
		"--log-file="+filepath.Join(dir, "ovsdb-server.log"),
		"--detach")
	run("ovs-vsctl", "--db=unix:"+filepath.Join(dir, "db.sock"), "--no-wait", "init")
	run("ovs-vswitchd", o.vswitchdArgs()...)
	return o
}

func (o *OVS) vswitchdArgs() []string {
	return []string{"unix:" + filepath.Join(o.RunDir, "db.sock"),
		"--unixctl=" + filepath.Join(o.RunDir, "ovs-vswitchd.ctl"),
		"--pidfile=" + filepath.Join(o.RunDir, "ovs-vswitchd.pid"),
		"--log-file=" + filepath.Join(o.RunDir, "ovs-vswitchd.log"),
		"--disable-system",
		"--detach"}
}

// Restart stops ovs-vswitchd and starts it again with the same arguments,
// as after a crash or upgrade: the database (bridges, ports) is kept, the
// OpenFlow tables start empty and OpenFlow connections are dropped. It
// fails the test on error.
func (o *OVS) Restart() {
	o.t.Helper()
	o.stopDaemon("ovs-vswitchd")
	cmd := exec.Command("ovs-vswitchd", o.vswitchdArgs()...)
	cmd.Env = o.Env()
	if out, err := cmd.CombinedOutput(); err != nil {
		o.t.Fatalf("restart ovs-vswitchd: %v: %s", err, out)
	}
}

func (o *OVS) stop() {
	// A bridge's internal ports are tap devices that outlive ovs-vswitchd
	// (netdev datapath): delete the bridges first, so that it removes them.
	vsctl := func(args ...string) (string, error) {
		cmd := exec.Command("ovs-vsctl", append([]string{"--db=unix:" + filepath.Join(o.RunDir, "db.sock"), "--timeout=10"}, args...)...)
		cmd.Env = o.Env()
		out, err := cmd.Output()
		return string(out), err
	}
	if out, err := vsctl("list-br"); err == nil {
		for _, br := range strings.Fields(out) {
			_, _ = vsctl("--if-exists", "del-br", br)
		}
	}
	for _, name := range []string{"ovs-vswitchd", "ovsdb-server"} {
		o.stopDaemon(name)
	}
	if o.t.Failed() {
		for _, log := range []string{"ovs-vswitchd.log", "ovsdb-server.log"} {
			if b, err := os.ReadFile(filepath.Join(o.RunDir, log)); err == nil {
				o.t.Logf("%s:\n%s", log, lastLines(string(b), 40))
			}
		}
	}
	_ = os.RemoveAll(o.RunDir)
	if o.ownTap {
		_ = exec.Command("ip", "link", "del", netdevTap).Run()
	}
	o.lock.Close() // releases the flock
}

// stopDaemon terminates the daemon whose pid file is RunDir/<name>.pid and
// waits up to 5s for it to exit before killing it.
func (o *OVS) stopDaemon(name string) {
	b, err := os.ReadFile(filepath.Join(o.RunDir, name+".pid"))
	if err != nil {
		return
	}
	var pid int
	if _, err := fmt.Sscanf(strings.TrimSpace(string(b)), "%d", &pid); err != nil || pid <= 0 {
		return
	}
	_ = syscall.Kill(pid, syscall.SIGTERM)
	for i := 0; i < 50; i++ {
		if syscall.Kill(pid, 0) != nil {
			return
		}
		time.Sleep(100 * time.Millisecond)
	}
	_ = syscall.Kill(pid, syscall.SIGKILL)
}

func lastLines(s string, n int) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}
