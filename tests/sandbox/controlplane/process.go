package controlplane

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// componentNames are the executable base names this package starts; the
// /proc scan of Stop only considers processes whose argv[0] has one of them.
// "v3" and "server" are the names `go build` gives the etcd server main
// package (go.etcd.io/etcd/server/v3).
var componentNames = []string{"etcd", "v3", "server", "kube-apiserver", "kube-controller-manager", "kube-scheduler"}

// stopGrace is how long Stop waits after SIGTERM before sending SIGKILL.
const stopGrace = 10 * time.Second

// process is a component started by this process.
type process struct {
	name    string
	logPath string
	pid     int
	exited  chan struct{} // closed when the process has exited and been reaped
	waitErr error         // valid after exited is closed
}

// startDetached starts bin with args as a component called name: in its own
// session (so it outlives the caller and its terminal), inside network
// namespace netns via `ip netns exec` when netns != "", with stdout and stderr
// appended to logs/NAME.log and its pid written to run/NAME.pid under
// stateDir. A goroutine reaps the child if it exits while the caller lives.
func startDetached(stateDir, netns, name, bin string, args []string) (*process, error) {
	logPath := filepath.Join(stateDir, "logs", name+".log")
	logf, err := os.OpenFile(logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return nil, fmt.Errorf("open log of %s: %w", name, err)
	}
	defer logf.Close()
	var cmd *exec.Cmd
	if netns != "" {
		// ip-netns(8): "ip netns exec NAME cmd" execs cmd (no fork), so the
		// pid below is the component's own pid.
		cmd = exec.Command("ip", append([]string{"netns", "exec", netns, bin}, args...)...)
	} else {
		cmd = exec.Command(bin, args...)
	}
	cmd.Dir = stateDir
	cmd.Stdout = logf
	cmd.Stderr = logf
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("start %s (%s): %w", name, bin, err)
	}
	p := &process{name: name, logPath: logPath, pid: cmd.Process.Pid, exited: make(chan struct{})}
	go func() {
		p.waitErr = cmd.Wait()
		close(p.exited)
	}()
	pidPath := filepath.Join(stateDir, "run", name+".pid")
	if err := os.WriteFile(pidPath, []byte(strconv.Itoa(p.pid)+"\n"), 0o644); err != nil {
		_ = cmd.Process.Kill()
		return nil, fmt.Errorf("write pidfile of %s: %w", name, err)
	}
	return p, nil
}

// ComponentError reports that a control plane component failed to start or
// become ready. Its message names the component and ends with the last 25
// lines of the component's log file.
type ComponentError struct {
	Component string // e.g. "kube-apiserver"
	PID       int
	LogPath   string
	LogTail   string
	Err       error // the cause
}

func (e *ComponentError) Error() string {
	return fmt.Sprintf("%s (pid %d) failed: %v; last lines of %s:\n%s", e.Component, e.PID, e.Err, e.LogPath, e.LogTail)
}

func (e *ComponentError) Unwrap() error { return e.Err }

// failure returns a *ComponentError for p with cause, unless cause already
// is one (for any component), which is returned as is.
func (p *process) failure(cause error) error {
	var ce *ComponentError
	if errors.As(cause, &ce) {
		return cause
	}
	return &ComponentError{Component: p.name, PID: p.pid, LogPath: p.logPath, LogTail: logTail(p.logPath, 25), Err: cause}
}

// logTail returns at most n last lines of the file at path, or a note
// saying why it could not be read.
func logTail(path string, n int) string {
	b, err := os.ReadFile(path)
	if err != nil {
		return fmt.Sprintf("(cannot read log: %v)", err)
	}
	lines := strings.Split(strings.TrimRight(string(b), "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}

// Stop ends a control plane started with Start under stateDir and removes
// stateDir. It signals the pids recorded in stateDir/run/*.pid and any
// process whose argv[0] names a component binary and whose arguments mention
// a path under stateDir (this finds processes from a crashed run whose
// pidfiles are stale or gone), with SIGTERM and, after a 10 s grace period,
// SIGKILL. Stop is idempotent: a missing stateDir and no matching processes
// is success. The caller's own process and its ancestors are never signalled.
func Stop(stateDir string) error {
	abs, err := filepath.Abs(stateDir)
	if err != nil {
		return fmt.Errorf("resolve state dir %q: %w", stateDir, err)
	}
	if err := stopProcesses(abs); err != nil {
		return err
	}
	if err := os.RemoveAll(abs); err != nil {
		return fmt.Errorf("remove state dir %s: %w", abs, err)
	}
	return nil
}

// stopProcesses is Stop without removing the state directory.
func stopProcesses(stateDir string) error {
	pids := map[int]bool{}
	for _, pid := range pidfilePIDs(stateDir) {
		// A pidfile may be stale and the pid reused by an unrelated
		// process: only trust it if the process still looks like ours.
		if ownedBy(pid, stateDir) {
			pids[pid] = true
		}
	}
	for _, pid := range scanProc(stateDir) {
		pids[pid] = true
	}
	for pid := range protectedPIDs() {
		delete(pids, pid)
	}
	// kube-apiserver shuts down slowly once etcd is gone, so etcd is
	// stopped last.
	first, last := map[int]bool{}, map[int]bool{}
	for pid := range pids {
		if isEtcd(cmdline(pid)) {
			last[pid] = true
		} else {
			first[pid] = true
		}
	}
	var survivors []int
	for _, group := range []map[int]bool{first, last} {
		survivors = append(survivors, terminate(group)...)
	}
	if len(survivors) > 0 {
		return fmt.Errorf("processes %v of control plane %s survive SIGKILL", survivors, stateDir)
	}
	return nil
}

// terminate sends SIGTERM to pids, SIGKILL to those still alive after
// stopGrace, and returns those still alive 5 s after that.
func terminate(pids map[int]bool) []int {
	for pid := range pids {
		_ = syscall.Kill(pid, syscall.SIGTERM)
	}
	deadline := time.Now().Add(stopGrace)
	for len(alive(pids)) > 0 && time.Now().Before(deadline) {
		time.Sleep(50 * time.Millisecond)
	}
	for _, pid := range alive(pids) {
		_ = syscall.Kill(pid, syscall.SIGKILL)
	}
	deadline = time.Now().Add(5 * time.Second)
	for len(alive(pids)) > 0 && time.Now().Before(deadline) {
		time.Sleep(50 * time.Millisecond)
	}
	return alive(pids)
}

// binaryOf returns the base name of the program argv runs, looking through
// an `ip netns exec NAME` wrapper.
func binaryOf(argv []string) string {
	if len(argv) == 0 {
		return ""
	}
	if filepath.Base(argv[0]) == "ip" && len(argv) > 4 && argv[1] == "netns" && argv[2] == "exec" {
		return filepath.Base(argv[4])
	}
	return filepath.Base(argv[0])
}

// isEtcd reports whether argv runs the etcd server.
func isEtcd(argv []string) bool {
	switch binaryOf(argv) {
	case "etcd", "v3", "server":
		return true
	}
	return false
}

// pidfilePIDs returns the pids in stateDir/run/*.pid, ignoring unreadable
// or malformed files.
func pidfilePIDs(stateDir string) []int {
	files, _ := filepath.Glob(filepath.Join(stateDir, "run", "*.pid"))
	var pids []int
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			continue
		}
		if pid, err := strconv.Atoi(strings.TrimSpace(string(b))); err == nil && pid > 0 {
			pids = append(pids, pid)
		}
	}
	return pids
}

// cmdline returns the argv of pid from /proc/PID/cmdline; nil if the
// process is gone or a zombie.
func cmdline(pid int) []string {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
	if err != nil || len(b) == 0 {
		return nil
	}
	return strings.Split(strings.TrimRight(string(b), "\x00"), "\x00")
}

// ownedBy reports whether pid runs a component binary (or `ip netns exec`
// about to exec one) with an argument naming a path under stateDir.
func ownedBy(pid int, stateDir string) bool {
	argv := cmdline(pid)
	if len(argv) == 0 {
		return false
	}
	base := binaryOf(argv)
	known := false
	for _, n := range componentNames {
		known = known || base == n
	}
	if !known {
		return false
	}
	prefix := stateDir + string(filepath.Separator)
	for _, a := range argv[1:] {
		if strings.Contains(a, prefix) {
			return true
		}
	}
	return false
}

// scanProc returns every pid in /proc that ownedBy stateDir.
func scanProc(stateDir string) []int {
	entries, err := os.ReadDir("/proc")
	if err != nil {
		return nil
	}
	var pids []int
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		if ownedBy(pid, stateDir) {
			pids = append(pids, pid)
		}
	}
	return pids
}

// protectedPIDs is the caller's pid and all its ancestors.
func protectedPIDs() map[int]bool {
	out := map[int]bool{}
	pid := os.Getpid()
	for pid > 1 && !out[pid] {
		out[pid] = true
		pid = parentPID(pid)
	}
	return out
}

// procStat returns the state letter and parent pid from /proc/PID/stat
// (proc(5)); ok is false if the process does not exist.
func procStat(pid int) (state byte, ppid int, ok bool) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0, 0, false
	}
	// The command name is in parentheses and may contain spaces; the
	// fields after the last ')' are "state ppid ...".
	i := bytes.LastIndexByte(b, ')')
	if i < 0 {
		return 0, 0, false
	}
	f := strings.Fields(string(b[i+1:]))
	if len(f) < 2 || len(f[0]) == 0 {
		return 0, 0, false
	}
	ppid, _ = strconv.Atoi(f[1])
	return f[0][0], ppid, true
}

func parentPID(pid int) int {
	_, ppid, _ := procStat(pid)
	return ppid
}

// isAlive reports whether pid exists and is not a zombie or dead.
func isAlive(pid int) bool {
	state, _, ok := procStat(pid)
	if !ok {
		return false
	}
	if state == 'Z' || state == 'X' {
		return false
	}
	err := syscall.Kill(pid, 0)
	return err == nil || errors.Is(err, syscall.EPERM)
}

// alive returns the members of pids that are still running.
func alive(pids map[int]bool) []int {
	var out []int
	for pid := range pids {
		if isAlive(pid) {
			out = append(out, pid)
		}
	}
	return out
}
