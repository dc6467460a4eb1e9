// Package ovsdaemon runs a Node's Open vSwitch daemons, ovsdb-server and
// ovs-vswitchd, in the foreground and keeps them running: the job of the
// seine-ovs DaemonSet's openvswitch container (`seine ovs run`), whose
// liveness probe is Health (`seine ovs health`).
//
// Run prepares what the daemons need (the openvswitch kernel module for the
// system datapath, the database created or converted to the installed
// schema), starts both daemons as children logging to its own standard
// error, restarts a child that exits, and stops both when its context ends:
// ovs-vswitchd first, through its "exit" command, which leaves the kernel
// datapath and its flows in place (ovs-vswitchd(8), "exit"), so a restarted
// container picks up a datapath that kept forwarding.
package ovsdaemon

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"time"

	"go.uber.org/zap"

	"github.com/seine-net/seine/datapath/ovsctl"
)

// Datapath types (ovs-vswitchd.conf.db(5), Bridge table, datapath_type).
const (
	DatapathSystem = "system"
	DatapathNetdev = "netdev"
)

// Config says where the daemons keep their files and which datapath the
// bridges use.
type Config struct {
	// RunDir holds db.sock, the pidfiles and the control sockets (OVS_RUNDIR;
	// seine's ovsRunDir). Default /var/run/openvswitch.
	RunDir string
	// DBFile is the database; created when missing. Default
	// /var/lib/seine/ovsdb/conf.db.
	DBFile string
	// Schema is the vswitch schema the database is created from or
	// converted to. Default /usr/share/openvswitch/vswitch.ovsschema.
	Schema string
	// Datapath is DatapathSystem or DatapathNetdev.
	Datapath string
	// UserspaceTSO, with DatapathNetdev, starts ovs-vswitchd with
	// other_config:userspace-tso-enable=true (read only at its start;
	// see datapath/offload).
	UserspaceTSO bool
	// MaxRestarts is how many restarts of the children, counted
	// together, may happen within RestartWindow before Run gives up and returns an error (so the
	// container restarts and the failure shows). Default 5 in 5 minutes.
	MaxRestarts   int
	RestartWindow time.Duration
	// BeforeStop, when set, runs while both daemons still run, before Run
	// stops them (e.g. to wait for the daemon that uses them, then hand a
	// device back to the kernel), with up to a minute. Its error is
	// logged; the daemons stop anyway.
	BeforeStop func(ctx context.Context) error
}

func (c *Config) defaults() error {
	if c.RunDir == "" {
		c.RunDir = "/var/run/openvswitch"
	}
	if c.DBFile == "" {
		c.DBFile = "/var/lib/seine/ovsdb/conf.db"
	}
	if c.Schema == "" {
		c.Schema = "/usr/share/openvswitch/vswitch.ovsschema"
	}
	if c.MaxRestarts == 0 {
		c.MaxRestarts = 5
	}
	if c.RestartWindow == 0 {
		c.RestartWindow = 5 * time.Minute
	}
	switch c.Datapath {
	case DatapathSystem, DatapathNetdev:
	default:
		return fmt.Errorf("datapath type %q: want %s or %s", c.Datapath, DatapathSystem, DatapathNetdev)
	}
	return nil
}

// DBSocket is the path of ovsdb-server's unix socket.
func (c Config) DBSocket() string { return filepath.Join(c.RunDir, "db.sock") }

// Run prepares and runs both daemons until ctx ends, then stops them and
// returns nil. It returns an error when preparing fails (with the cause:
// a missing kernel module, an unusable database) or when a daemon keeps
// exiting (MaxRestarts within RestartWindow).
func Run(ctx context.Context, cfg Config, log *zap.Logger) error {
	if err := cfg.defaults(); err != nil {
		return err
	}
	for _, d := range []string{cfg.RunDir, filepath.Dir(cfg.DBFile)} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			return fmt.Errorf("creating %s: %w", d, err)
		}
	}
	if cfg.Datapath == DatapathSystem {
		if err := loadModule(ctx, log); err != nil {
			return err
		}
	}
	existed, err := prepareDB(ctx, cfg, log)
	if err != nil {
		return err
	}
	s := &supervisor{cfg: cfg, log: log, env: append(os.Environ(), "OVS_RUNDIR="+cfg.RunDir)}
	db := s.child("ovsdb-server", cfg.DBFile,
		"--remote=punix:"+cfg.DBSocket(),
		"--remote=db:Open_vSwitch,Open_vSwitch,manager_options",
		"--pidfile="+filepath.Join(cfg.RunDir, "ovsdb-server.pid"))
	if err := db.start(); err != nil {
		return err
	}
	defer db.stop(log)
	if err := waitSocket(ctx, cfg.DBSocket(), 30*time.Second); err != nil {
		return fmt.Errorf("ovsdb-server: %w", err)
	}
	if err := s.vsctl(ctx, "--no-wait", "init"); err != nil {
		return err
	}
	// With the kernel datapath, a restarted ovs-vswitchd keeps forwarding
	// the connections the datapath knows until seine has put its flows
	// back and clears the key (datapath/ovsdb ClearFlowRestoreWait). The
	// userspace datapath restarts empty anyway, and the key would also
	// hold back the transport bridge that carries the Node's own address.
	if existed && cfg.Datapath == DatapathSystem {
		if err := s.vsctl(ctx, "--no-wait", "set", "Open_vSwitch", ".", "other_config:flow-restore-wait=true"); err != nil {
			return err
		}
	}
	if cfg.Datapath == DatapathNetdev {
		if err := s.vsctl(ctx, "--no-wait", "set", "Open_vSwitch", ".",
			fmt.Sprintf("other_config:userspace-tso-enable=%t", cfg.UserspaceTSO)); err != nil {
			return err
		}
	}
	vsArgs := []string{"unix:" + cfg.DBSocket(), "--pidfile=" + filepath.Join(cfg.RunDir, "ovs-vswitchd.pid")}
	if cfg.Datapath == DatapathNetdev {
		vsArgs = append(vsArgs, "--disable-system")
	}
	vs := s.child("ovs-vswitchd", vsArgs...)
	if err := vs.start(); err != nil {
		return err
	}
	defer vs.stopVswitchd(cfg.RunDir, log)
	if cfg.BeforeStop != nil {
		defer func() {
			bctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			if err := cfg.BeforeStop(bctx); err != nil {
				log.Error("before stopping Open vSwitch", zap.Error(err))
			}
		}()
	}
	log.Info("Open vSwitch running", zap.String("datapath", cfg.Datapath), zap.String("db", cfg.DBFile),
		zap.String("run_dir", cfg.RunDir))
	return s.supervise(ctx, db, vs)
}

// loadModule makes sure the openvswitch kernel module is loaded (modprobe
// reads the host's /lib/modules, mounted into the container).
func loadModule(ctx context.Context, log *zap.Logger) error {
	if _, err := os.Stat("/sys/module/openvswitch"); err == nil {
		return nil
	}
	out, err := exec.CommandContext(ctx, "modprobe", "openvswitch").CombinedOutput()
	if err != nil {
		return fmt.Errorf("ovsDatapathType system needs the openvswitch kernel module, and modprobe openvswitch failed "+
			"(%w: %s); load it on the host, or set ovsDatapathType: netdev for the userspace datapath", err, strings.TrimSpace(string(out)))
	}
	log.Info("loaded the openvswitch kernel module")
	return nil
}

// prepareDB creates the database when missing, converts it when the
// installed schema is newer (ovsdb-tool(1), needs-conversion and convert,
// keeping a copy of the old file), and reports whether it existed.
func prepareDB(ctx context.Context, cfg Config, log *zap.Logger) (bool, error) {
	if _, err := os.Stat(cfg.DBFile); errors.Is(err, os.ErrNotExist) {
		if out, err := exec.CommandContext(ctx, "ovsdb-tool", "create", cfg.DBFile, cfg.Schema).CombinedOutput(); err != nil {
			return false, fmt.Errorf("ovsdb-tool create %s: %w: %s", cfg.DBFile, err, out)
		}
		log.Info("created the OVS database", zap.String("db", cfg.DBFile))
		return false, nil
	} else if err != nil {
		return false, fmt.Errorf("OVS database %s: %w", cfg.DBFile, err)
	}
	out, err := exec.CommandContext(ctx, "ovsdb-tool", "needs-conversion", cfg.DBFile, cfg.Schema).CombinedOutput()
	if err != nil {
		return true, fmt.Errorf("ovsdb-tool needs-conversion %s: %w: %s", cfg.DBFile, err, out)
	}
	if strings.TrimSpace(string(out)) == "yes" {
		backup := cfg.DBFile + ".backup-" + time.Now().UTC().Format("20060102T150405Z")
		if b, err := os.ReadFile(cfg.DBFile); err != nil || os.WriteFile(backup, b, 0o600) != nil {
			return true, fmt.Errorf("backing up %s before converting it: %v", cfg.DBFile, err)
		}
		if out, err := exec.CommandContext(ctx, "ovsdb-tool", "convert", cfg.DBFile, cfg.Schema).CombinedOutput(); err != nil {
			return true, fmt.Errorf("ovsdb-tool convert %s: %w: %s", cfg.DBFile, err, out)
		}
		log.Info("converted the OVS database to the installed schema", zap.String("db", cfg.DBFile), zap.String("backup", backup))
	}
	return true, nil
}

type supervisor struct {
	cfg Config
	log *zap.Logger
	env []string
}

func (s *supervisor) vsctl(ctx context.Context, args ...string) error {
	cmd := exec.CommandContext(ctx, "ovs-vsctl", append([]string{"--db=unix:" + s.cfg.DBSocket(), "--timeout=30"}, args...)...)
	cmd.Env = s.env
	if out, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("ovs-vsctl %s: %w: %s", strings.Join(args, " "), err, strings.TrimSpace(string(out)))
	}
	return nil
}

// child is one supervised daemon.
type child struct {
	name string
	argv []string
	env  []string

	mu   sync.Mutex
	cmd  *exec.Cmd
	done chan struct{} // closed when cmd has exited
	err  error         // cmd.Wait's result, valid once done is closed
}

// child returns a daemon that logs to the console in a format naming it,
// and to neither syslog nor a file (the container runtime keeps the log).
func (s *supervisor) child(name string, args ...string) *child {
	pattern := "-vPATTERN:console:%D{%Y-%m-%dT%H:%M:%S.###Z}|" + name + "|%05N|%c%T|%p|%m"
	argv := append([]string{name}, args...)
	argv = append(argv, "-vconsole:info", "-vsyslog:off", "-vfile:off", pattern)
	return &child{name: name, argv: argv, env: s.env}
}

func (c *child) start() error {
	cmd := exec.Command(c.argv[0], c.argv[1:]...)
	cmd.Env = c.env
	cmd.Stdout, cmd.Stderr = os.Stderr, os.Stderr
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("starting %s: %w", c.name, err)
	}
	done := make(chan struct{})
	c.mu.Lock()
	c.cmd, c.done = cmd, done
	c.mu.Unlock()
	go func() {
		err := cmd.Wait()
		c.mu.Lock()
		c.err = err
		c.mu.Unlock()
		close(done)
	}()
	return nil
}

func (c *child) exited() <-chan struct{} {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.done
}

// stop asks the daemon to exit (SIGTERM), and kills it after 10 s.
func (c *child) stop(log *zap.Logger) {
	c.mu.Lock()
	cmd, done := c.cmd, c.done
	c.mu.Unlock()
	if cmd == nil {
		return
	}
	_ = cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		log.Warn("daemon ignored SIGTERM, killing it", zap.String("daemon", c.name))
		_ = cmd.Process.Kill()
		<-done
	}
}

// stopVswitchd stops ovs-vswitchd through its "exit" command, which keeps
// the kernel datapath and its flows (a SIGTERM would too, but "exit" is the
// documented way, and waits for the daemon to finish), falling back to stop.
func (c *child) stopVswitchd(runDir string, log *zap.Logger) {
	select {
	case <-c.exited():
		return
	default:
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := ovsctl.New(runDir).Run(ctx, "exit"); err != nil {
		log.Warn("ovs-vswitchd exit command failed, signalling it", zap.Error(err))
	}
	select {
	case <-c.exited():
	case <-ctx.Done():
	}
	c.stop(log)
}

// supervise restarts a daemon that exits until ctx ends, giving up when
// the daemons together exit more than MaxRestarts times within
// RestartWindow.
func (s *supervisor) supervise(ctx context.Context, children ...*child) error {
	var restarts []time.Time
	for {
		var exited *child
		select {
		case <-ctx.Done():
			return nil
		case <-children[0].exited():
			exited = children[0]
		case <-children[1].exited():
			exited = children[1]
		}
		exited.mu.Lock()
		werr := exited.err
		exited.mu.Unlock()
		now := time.Now()
		restarts = append(restarts, now)
		for len(restarts) > 0 && now.Sub(restarts[0]) > s.cfg.RestartWindow {
			restarts = restarts[1:]
		}
		if len(restarts) > s.cfg.MaxRestarts {
			return fmt.Errorf("%s exited %d times within %s (last: %v); giving up", exited.name, len(restarts), s.cfg.RestartWindow, werr)
		}
		backoff := time.Duration(1<<min(len(restarts)-1, 4)) * time.Second
		s.log.Warn("daemon exited; restarting it", zap.String("daemon", exited.name), zap.NamedError("exit", werr),
			zap.Duration("backoff", backoff), zap.Int("recent_restarts", len(restarts)))
		select {
		case <-ctx.Done():
			return nil
		case <-time.After(backoff):
		}
		if err := exited.start(); err != nil {
			return err
		}
	}
}

// waitSocket waits until a unix socket accepts connections.
func waitSocket(ctx context.Context, path string, timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	for {
		c, err := net.DialTimeout("unix", path, time.Second)
		if err == nil {
			c.Close()
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%s did not accept connections within %s: %w", path, timeout, err)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// Health checks that both daemons answer: ovsdb-server a JSON-RPC echo on
// its socket (RFC 7047 section 4.1.11), ovs-vswitchd its "version" command
// on its control socket. The error names the daemon that does not.
func Health(ctx context.Context, runDir string) error {
	if err := echo(ctx, filepath.Join(runDir, "db.sock")); err != nil {
		return fmt.Errorf("ovsdb-server: %w", err)
	}
	if _, err := ovsctl.New(runDir).Run(ctx, "version"); err != nil {
		return fmt.Errorf("ovs-vswitchd: %w", err)
	}
	return nil
}

func echo(ctx context.Context, sock string) error {
	var d net.Dialer
	conn, err := d.DialContext(ctx, "unix", sock)
	if err != nil {
		return err
	}
	defer conn.Close()
	if dl, ok := ctx.Deadline(); ok {
		_ = conn.SetDeadline(dl)
	}
	if err := json.NewEncoder(conn).Encode(map[string]any{"method": "echo", "params": []string{"seine"}, "id": 1}); err != nil {
		return fmt.Errorf("sending echo: %w", err)
	}
	var reply struct {
		Result []string `json:"result"`
		Error  any      `json:"error"`
	}
	if err := json.NewDecoder(conn).Decode(&reply); err != nil {
		return fmt.Errorf("reading the echo reply: %w", err)
	}
	if reply.Error != nil || len(reply.Result) != 1 || reply.Result[0] != "seine" {
		return fmt.Errorf("unexpected echo reply %+v", reply)
	}
	return nil
}
