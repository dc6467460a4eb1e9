package sandbox

import (
	"context"
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

// netnsEnter says how a detached process enters a Node's network namespace.
type netnsEnter int

const (
	// enterIPNetNS uses `ip netns exec`: a private mount namespace with the
	// namespace's own /sys (right for OVS and the seine daemon).
	enterIPNetNS netnsEnter = iota
	// enterNsenter uses `nsenter --net`: the host's mount namespace, so
	// namespaces the process creates with `ip netns add` are visible to
	// everyone (needed by the kubelet, which creates Pod namespaces; a
	// mount made inside `ip netns exec` would not propagate back).
	enterNsenter
)

// startDetached starts argv in its own session inside netns (how chosen by
// enter; "" = here) with stdout and stderr appended to logPath and the pid
// written to pidPath. Both wrappers exec the program, so the pid is the
// program's own. A goroutine reaps the child if it exits while we live.
func startDetached(netns string, enter netnsEnter, logPath, pidPath string, env []string, argv ...string) (int, error) {
	logf, err := os.OpenFile(logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return 0, fmt.Errorf("open log %s: %w", logPath, err)
	}
	defer logf.Close()
	full := argv
	if netns != "" {
		switch enter {
		case enterNsenter:
			full = append([]string{"nsenter", "--net=" + netnsPath(netns), "--"}, argv...)
		default:
			full = append([]string{"ip", "netns", "exec", netns}, argv...)
		}
	}
	cmd := exec.Command(full[0], full[1:]...)
	cmd.Stdout = logf
	cmd.Stderr = logf
	cmd.Env = append(os.Environ(), env...)
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	if err := cmd.Start(); err != nil {
		return 0, fmt.Errorf("start %s: %w", argv[0], err)
	}
	pid := cmd.Process.Pid
	go func() { _ = cmd.Wait() }()
	if err := os.WriteFile(pidPath, []byte(strconv.Itoa(pid)+"\n"), 0o644); err != nil {
		_ = cmd.Process.Kill()
		return 0, fmt.Errorf("write pidfile %s: %w", pidPath, err)
	}
	return pid, nil
}

// readPid returns the pid in pidPath, 0 if missing or malformed.
func readPid(pidPath string) int {
	b, err := os.ReadFile(pidPath)
	if err != nil {
		return 0
	}
	pid, err := strconv.Atoi(strings.TrimSpace(string(b)))
	if err != nil || pid <= 0 {
		return 0
	}
	return pid
}

// alive reports whether pid exists and is not a zombie.
func alive(pid int) bool {
	if pid <= 0 || syscall.Kill(pid, 0) != nil {
		return false
	}
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return false
	}
	s := string(b)
	i := strings.LastIndexByte(s, ')')
	if i < 0 || i+2 >= len(s) {
		return false
	}
	return s[i+2] != 'Z' && s[i+2] != 'X'
}

// pidfileAlive reports whether the process of pidPath is alive.
func pidfileAlive(pidPath string) bool { return alive(readPid(pidPath)) }

// cmdlineOf returns the argv of pid; nil when gone.
func cmdlineOf(pid int) []string {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
	if err != nil || len(b) == 0 {
		return nil
	}
	return strings.Split(strings.TrimRight(string(b), "\x00"), "\x00")
}

// mentions reports whether an argument names dir or a path below it.
func mentions(argv []string, dir string) bool {
	for _, a := range argv {
		if strings.Contains(a, dir+"/") || strings.HasSuffix(a, dir) {
			return true
		}
	}
	return false
}

// processesMentioning returns the pids whose command line names stateDir
// or a path under it.
func processesMentioning(stateDir string) []int {
	entries, _ := os.ReadDir("/proc")
	var out []int
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		if mentions(cmdlineOf(pid), stateDir) {
			out = append(out, pid)
		}
	}
	return out
}

// protected returns our own pid and its ancestors, never to be signalled.
func protected() map[int]bool {
	out := map[int]bool{}
	for pid := os.Getpid(); pid > 1 && !out[pid]; {
		out[pid] = true
		b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
		if err != nil {
			break
		}
		s := string(b)
		i := strings.LastIndexByte(s, ')')
		f := strings.Fields(s[i+1:])
		if len(f) < 2 {
			break
		}
		pid, _ = strconv.Atoi(f[1])
	}
	return out
}

// terminate sends SIGTERM to pids, SIGKILL after grace, and waits up to 5 s
// more; it returns an error naming the survivors.
func terminate(pids []int, grace time.Duration) error {
	skip := protected()
	var live []int
	for _, pid := range pids {
		if !skip[pid] && alive(pid) {
			live = append(live, pid)
			_ = syscall.Kill(pid, syscall.SIGTERM)
		}
	}
	waitGone := func(d time.Duration) []int {
		deadline := time.Now().Add(d)
		for {
			var rest []int
			for _, pid := range live {
				if alive(pid) {
					rest = append(rest, pid)
				}
			}
			if len(rest) == 0 || time.Now().After(deadline) {
				return rest
			}
			time.Sleep(50 * time.Millisecond)
		}
	}
	rest := waitGone(grace)
	for _, pid := range rest {
		_ = syscall.Kill(pid, syscall.SIGKILL)
	}
	if rest = waitGone(5 * time.Second); len(rest) > 0 {
		return fmt.Errorf("processes %v survive SIGKILL", rest)
	}
	return nil
}

// stopPidfile terminates the process of pidPath (if alive) and removes the
// pidfile.
func stopPidfile(pidPath string, grace time.Duration) error {
	pid := readPid(pidPath)
	if pid > 0 {
		if err := terminate([]int{pid}, grace); err != nil {
			return fmt.Errorf("stop %s: %w", filepath.Base(pidPath), err)
		}
	}
	if err := os.Remove(pidPath); err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("remove pidfile: %w", err)
	}
	return nil
}

// run runs a short command and returns its combined output, with the
// output in the error.
func run(ctx context.Context, env []string, argv ...string) (string, error) {
	cmd := exec.CommandContext(ctx, argv[0], argv[1:]...)
	if env != nil {
		cmd.Env = append(os.Environ(), env...)
	}
	out, err := cmd.CombinedOutput()
	if err != nil {
		return string(out), fmt.Errorf("%s: %w: %s", strings.Join(argv, " "), err, strings.TrimSpace(string(out)))
	}
	return string(out), nil
}

// waitFor polls cond every interval until it returns true, an error, or
// ctx/timeout ends; what names the wait in the timeout error.
func waitFor(ctx context.Context, timeout, interval time.Duration, what string, cond func(context.Context) (bool, error)) error {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	var last error
	for {
		ok, err := cond(ctx)
		if ok {
			return nil
		}
		if err != nil {
			var stop backoffStop
			if errors.As(err, &stop) {
				return err
			}
			last = err
		}
		select {
		case <-ctx.Done():
			if last != nil {
				return fmt.Errorf("waiting for %s: %w (last error: %v)", what, ctx.Err(), last)
			}
			return fmt.Errorf("waiting for %s: %w", what, ctx.Err())
		case <-time.After(interval):
		}
	}
}
