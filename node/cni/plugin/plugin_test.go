package plugin_test

import (
	"bytes"
	"context"
	"encoding/json"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/containernetworking/cni/libcni"
	"github.com/containernetworking/cni/pkg/types"
	current "github.com/containernetworking/cni/pkg/types/100"
	"go.uber.org/zap/zaptest"

	"github.com/seine-net/seine/node/cni/install"
	// Its initializer runs the plugin when this binary is executed as one.
	_ "github.com/seine-net/seine/node/cni/plugin"
	"github.com/seine-net/seine/node/cni/server"
	"github.com/seine-net/seine/node/cni/wire"
)

// The test binary doubles as the plugin: when a runtime (or a test)
// executes it with CNI_COMMAND set, the plugin package's initializer runs
// the invocation and exits, exactly as in the seine binary, so every test
// below goes through a real process, stdin/stdout and the real unix-socket
// path.

// TestImportsStayLight guards the plugin's start-up: the package and all it
// imports must be the standard library (package net excluded) or seine's
// own light packages, or the plugin's initializer would wait for the
// daemon's (see the package documentation).
func TestImportsStayLight(t *testing.T) {
	gobin, err := exec.LookPath("go")
	if err != nil {
		t.Fatalf("go list needs the go command: %v", err)
	}
	out, err := exec.Command(gobin, "list", "-deps", "-f", "{{.ImportPath}} {{.Standard}}", "github.com/seine-net/seine/node/cni/plugin").Output()
	if err != nil {
		t.Fatalf("go list: %v", err)
	}
	allowed := map[string]bool{
		"github.com/seine-net/seine/node/cni/plugin": true,
		"github.com/seine-net/seine/node/cni/wire":   true,
		"github.com/seine-net/seine/node/version":    true,
	}
	n := 0
	for line := range strings.Lines(string(out)) {
		path, std, _ := strings.Cut(strings.TrimSpace(line), " ")
		n++
		if path == "net" || strings.HasPrefix(path, "net/") || strings.HasPrefix(path, "vendor/") {
			t.Errorf("the plugin imports %s, which initialises after the daemon's packages", path)
		}
		if std != "true" && !allowed[path] {
			t.Errorf("the plugin imports %s, outside the standard library and its allowed packages", path)
		}
	}
	if n < 10 {
		t.Fatalf("go list printed %d packages: %s", n, out)
	}
}

// recordingBackend returns a fixed result or error and records calls.
type recordingBackend struct {
	mu     sync.Mutex
	reqs   []*server.Request
	prev   *current.Result
	valid  []types.GCAttachment
	addErr error
	status error
}

func (b *recordingBackend) rec(r *server.Request) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.reqs = append(b.reqs, r)
}

func (b *recordingBackend) requests() []*server.Request {
	b.mu.Lock()
	defer b.mu.Unlock()
	return append([]*server.Request(nil), b.reqs...)
}

func (b *recordingBackend) Add(ctx context.Context, req *server.Request) (*current.Result, error) {
	b.rec(req)
	if b.addErr != nil {
		return nil, b.addErr
	}
	ip, ipn, _ := net.ParseCIDR("10.244.1.5/24")
	ipn.IP = ip
	idx := 0
	return &current.Result{
		CNIVersion: current.ImplementedSpecVersion,
		Interfaces: []*current.Interface{{Name: req.IfName, Mac: "0a:58:0a:f4:01:05", Sandbox: req.Netns}},
		IPs:        []*current.IPConfig{{Interface: &idx, Address: *ipn, Gateway: net.ParseIP("10.244.1.1")}},
	}, nil
}

func (b *recordingBackend) Del(ctx context.Context, req *server.Request) error {
	b.rec(req)
	return nil
}

func (b *recordingBackend) Check(ctx context.Context, req *server.Request, prev *current.Result) error {
	b.rec(req)
	b.mu.Lock()
	b.prev = prev
	b.mu.Unlock()
	return nil
}

func (b *recordingBackend) Status(ctx context.Context) error { return b.status }

func (b *recordingBackend) GC(ctx context.Context, req *server.Request, valid []types.GCAttachment) error {
	b.rec(req)
	b.mu.Lock()
	b.valid = valid
	b.mu.Unlock()
	return nil
}

// shortTempDir returns a temporary directory with a path short enough for a
// unix socket (108 bytes), removed when the test ends.
func shortTempDir(t *testing.T) string {
	t.Helper()
	dir, err := os.MkdirTemp("", "seine-cni")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	return dir
}

// startDaemon serves backend on a fresh socket until the test ends.
func startDaemon(t *testing.T, backend server.Backend) string {
	t.Helper()
	sock := filepath.Join(shortTempDir(t), "run", "cni.sock")
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- server.New(backend, zaptest.NewLogger(t)).Serve(ctx, sock) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Serve: %v", err)
		}
	})
	deadline := time.Now().Add(5 * time.Second)
	for {
		if c, err := net.Dial("unix", sock); err == nil {
			c.Close()
			return sock
		}
		if time.Now().After(deadline) {
			t.Fatalf("daemon socket %s never came up", sock)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

type invocation struct {
	cmd, containerID, netns, args, conf string
}

// runPlugin executes the plugin binary like a runtime would and returns its
// stdout and whether it exited 0.
func runPlugin(t *testing.T, in invocation) (stdout []byte, ok bool) {
	t.Helper()
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, exe)
	netns := in.netns
	if netns == "" {
		netns = "/var/run/netns/seine-test-absent"
	}
	cmd.Env = append(os.Environ(),
		"CNI_COMMAND="+in.cmd,
		"CNI_CONTAINERID="+in.containerID,
		"CNI_NETNS="+netns,
		"CNI_IFNAME=eth0",
		"CNI_ARGS="+in.args,
		"CNI_PATH=/opt/cni/bin",
	)
	cmd.Stdin = strings.NewReader(in.conf)
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	err = cmd.Run()
	if _, isExit := err.(*exec.ExitError); err != nil && !isExit {
		t.Fatalf("running plugin: %v", err)
	}
	if errb.Len() > 0 {
		t.Logf("plugin stderr: %s", errb.String())
	}
	return out.Bytes(), err == nil
}

// cniError decodes the CNI error object a failed plugin printed.
func cniError(t *testing.T, out []byte) types.Error {
	t.Helper()
	var e types.Error
	if err := json.Unmarshal(out, &e); err != nil {
		t.Fatalf("plugin stdout is not a CNI error object: %v: %q", err, out)
	}
	return e
}

func conf(version, sock string) string {
	return `{"cniVersion":"` + version + `","name":"seine","type":"seine","socketPath":"` + sock + `"}`
}

func TestAddResultVersionConversion(t *testing.T) {
	be := &recordingBackend{}
	sock := startDaemon(t, be)
	for _, v := range []string{"0.3.1", "0.4.0", "1.0.0", "1.1.0"} {
		t.Run(v, func(t *testing.T) {
			out, ok := runPlugin(t, invocation{
				cmd: "ADD", containerID: "ctr-" + v, conf: conf(v, sock),
				args: "IgnoreUnknown=1;K8S_POD_NAMESPACE=default;K8S_POD_NAME=web-0;K8S_POD_UID=uid-1",
			})
			if !ok {
				t.Fatalf("ADD failed: %s", out)
			}
			var res map[string]any
			if err := json.Unmarshal(out, &res); err != nil {
				t.Fatalf("result not JSON: %v: %s", err, out)
			}
			if res["cniVersion"] != v {
				t.Errorf("result cniVersion = %v, want %s", res["cniVersion"], v)
			}
			ips, _ := res["ips"].([]any)
			if len(ips) != 1 {
				t.Fatalf("ips = %v", res["ips"])
			}
			ip := ips[0].(map[string]any)
			if ip["address"] != "10.244.1.5/24" || ip["gateway"] != "10.244.1.1" {
				t.Errorf("ip = %v", ip)
			}
			// 0.3.x/0.4.0 results carry "version" per IP; 1.x dropped it.
			_, hasVersion := ip["version"]
			if want := strings.HasPrefix(v, "0."); hasVersion != want {
				t.Errorf("ip has version field = %v, want %v (%s)", hasVersion, want, out)
			}
		})
	}
	reqs := be.requests()
	if len(reqs) != 4 {
		t.Fatalf("backend got %d requests, want 4", len(reqs))
	}
	r := reqs[0]
	if r.Command != "ADD" || r.ContainerID != "ctr-0.3.1" || r.IfName != "eth0" ||
		r.PodNamespace != "default" || r.PodName != "web-0" || r.PodUID != "uid-1" ||
		r.NetConf.SocketPath != sock || !strings.Contains(string(r.RawConf), sock) {
		t.Errorf("backend request = %+v", r)
	}
}

func TestBackendErrorCodePropagates(t *testing.T) {
	be := &recordingBackend{addErr: &server.Error{Code: server.ErrCodeIPAMExhausted, Msg: "pod address pool exhausted", Details: "10.244.1.0/24 has 0 free"}}
	sock := startDaemon(t, be)
	out, ok := runPlugin(t, invocation{cmd: "ADD", containerID: "c1", conf: conf("1.0.0", sock)})
	if ok {
		t.Fatalf("ADD succeeded despite backend error: %s", out)
	}
	e := cniError(t, out)
	if e.Code != server.ErrCodeIPAMExhausted || e.Msg != "pod address pool exhausted" || e.Details != "10.244.1.0/24 has 0 free" {
		t.Errorf("error = %+v", e)
	}

	// A plain error becomes the internal code with its text.
	be.addErr = context.DeadlineExceeded
	out, ok = runPlugin(t, invocation{cmd: "ADD", containerID: "c2", conf: conf("1.0.0", sock)})
	if e := cniError(t, out); ok || e.Code != server.ErrCodeInternal || e.Msg != context.DeadlineExceeded.Error() {
		t.Errorf("plain error: ok=%v error=%+v", ok, e)
	}
}

func TestConfigErrors(t *testing.T) {
	sock := startDaemon(t, &recordingBackend{})
	cases := []struct {
		name string
		conf string
		code uint
	}{
		{"bad json", `{"cniVersion":"1.0.0","name":`, types.ErrDecodingFailure},
		{"unsupported version", conf("0.2.0", sock), types.ErrIncompatibleCNIVersion},
		{"missing name", `{"cniVersion":"1.0.0","type":"seine","socketPath":"` + sock + `"}`, types.ErrInvalidNetworkConfig},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			out, ok := runPlugin(t, invocation{cmd: "ADD", containerID: "c1", conf: tc.conf})
			if ok {
				t.Fatalf("ADD succeeded: %s", out)
			}
			if e := cniError(t, out); e.Code != tc.code {
				t.Errorf("code = %d (%s), want %d", e.Code, e.Msg, tc.code)
			}
		})
	}
}

func TestDaemonNotRunning(t *testing.T) {
	sock := filepath.Join(shortTempDir(t), "absent.sock")
	for _, tc := range []struct {
		cmd  string
		code uint
	}{
		{"ADD", types.ErrTryAgainLater},
		{"DEL", types.ErrTryAgainLater},
		{"CHECK", types.ErrTryAgainLater},
		{"GC", types.ErrTryAgainLater},
		{"STATUS", types.ErrPluginNotAvailable},
	} {
		t.Run(tc.cmd, func(t *testing.T) {
			out, ok := runPlugin(t, invocation{cmd: tc.cmd, containerID: "c1", conf: conf("1.1.0", sock)})
			if ok {
				t.Fatalf("%s succeeded with no daemon: %s", tc.cmd, out)
			}
			e := cniError(t, out)
			if e.Code != tc.code {
				t.Errorf("code = %d, want %d (%s)", e.Code, tc.code, e.Msg)
			}
			if !strings.Contains(e.Msg, "not running") || !strings.Contains(e.Msg, sock) || !strings.Contains(e.Msg, "no such file") {
				t.Errorf("msg = %q, want 'not running', the socket and the cause", e.Msg)
			}
		})
	}
}

// A daemon that served lately and whose socket is gone is restarting:
// STATUS succeeds (kubelet keeps the Node Ready) while ADD is told to try
// again later; once the heartbeat is older than wire.AliveGrace, STATUS
// fails with 50.
func TestStatusWhileRestarting(t *testing.T) {
	sock := filepath.Join(shortTempDir(t), "absent.sock")
	if err := os.WriteFile(wire.AlivePath(sock), nil, 0o600); err != nil {
		t.Fatal(err)
	}
	if out, ok := runPlugin(t, invocation{cmd: "STATUS", conf: conf("1.1.0", sock)}); !ok {
		t.Errorf("STATUS with a recent heartbeat: %s", out)
	}
	out, ok := runPlugin(t, invocation{cmd: "ADD", containerID: "c1", conf: conf("1.1.0", sock)})
	if e := cniError(t, out); ok || e.Code != types.ErrTryAgainLater {
		t.Errorf("ADD while restarting: ok=%v %+v, want 11", ok, e)
	}
	old := time.Now().Add(-wire.AliveGrace - time.Second)
	if err := os.Chtimes(wire.AlivePath(sock), old, old); err != nil {
		t.Fatal(err)
	}
	out, ok = runPlugin(t, invocation{cmd: "STATUS", conf: conf("1.1.0", sock)})
	if e := cniError(t, out); ok || e.Code != types.ErrPluginNotAvailable {
		t.Errorf("STATUS with a stale heartbeat: ok=%v %+v, want 50", ok, e)
	}
}

func TestStatusAndVersion(t *testing.T) {
	be := &recordingBackend{}
	sock := startDaemon(t, be)
	if out, ok := runPlugin(t, invocation{cmd: "STATUS", conf: conf("1.1.0", sock)}); !ok {
		t.Fatalf("STATUS failed: %s", out)
	}
	be.status = &server.Error{Code: types.ErrPluginNotAvailable, Msg: "datapath not ready"}
	out, ok := runPlugin(t, invocation{cmd: "STATUS", conf: conf("1.1.0", sock)})
	if e := cniError(t, out); ok || e.Code != types.ErrPluginNotAvailable || e.Msg != "datapath not ready" {
		t.Errorf("STATUS not ready: ok=%v %+v", ok, e)
	}
	// VERSION is answered without the daemon.
	out, ok = runPlugin(t, invocation{cmd: "VERSION", conf: conf("1.1.0", "/nonexistent.sock")})
	var vi struct {
		Supported []string `json:"supportedVersions"`
	}
	if err := json.Unmarshal(out, &vi); !ok || err != nil || strings.Join(vi.Supported, ",") != "0.3.0,0.3.1,0.4.0,1.0.0,1.1.0" {
		t.Errorf("VERSION: ok=%v err=%v out=%s", ok, err, out)
	}
}

// TestVersionIgnoresStdin: VERSION answers at once even when stdin never
// ends (a terminal, or a runtime that keeps the pipe open).
func TestVersionIgnoresStdin(t *testing.T) {
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	defer w.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, exe)
	cmd.Env = append(os.Environ(), "CNI_COMMAND=VERSION")
	cmd.Stdin = r
	out, err := cmd.Output()
	if err != nil || !strings.Contains(string(out), "supportedVersions") {
		t.Fatalf("VERSION with an open stdin: %v: %s", err, out)
	}
}

// TestOversizedConfig: a configuration beyond wire.MaxConfigBytes is
// refused as invalid (7), not retried as if the daemon were away.
func TestOversizedConfig(t *testing.T) {
	sock := startDaemon(t, &recordingBackend{})
	big := `{"cniVersion":"1.0.0","name":"seine","type":"seine","socketPath":"` + sock + `","pad":"` + strings.Repeat("x", wire.MaxConfigBytes) + `"}`
	out, ok := runPlugin(t, invocation{cmd: "ADD", containerID: "c1", conf: big})
	if e := cniError(t, out); ok || e.Code != types.ErrInvalidNetworkConfig || !strings.Contains(e.Msg, "exceeds") {
		t.Errorf("oversized config: ok=%v %+v", ok, e)
	}
}

// TestLibcniAgainstInstalledConfList drives ADD, CHECK, GC, STATUS and DEL
// the way a container runtime does: libcni loads the conflist Install wrote
// and executes the installed binary from the bin dir.
func TestLibcniAgainstInstalledConfList(t *testing.T) {
	be := &recordingBackend{}
	sock := startDaemon(t, be)
	root := shortTempDir(t)
	binDir, confDir, cacheDir := filepath.Join(root, "bin"), filepath.Join(root, "net.d"), filepath.Join(root, "cache")
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	if err := install.Install(install.Options{BinDir: binDir, ConfDir: confDir, SocketPath: sock, MTU: 1400, Binary: exe}); err != nil {
		t.Fatal(err)
	}
	list, err := libcni.LoadNetworkConf(confDir, "seine")
	if err != nil {
		t.Fatal(err)
	}
	cni := libcni.NewCNIConfigWithCacheDir([]string{binDir}, cacheDir, nil)
	rt := &libcni.RuntimeConf{
		ContainerID: "libcni-ctr",
		NetNS:       "/var/run/netns/seine-test-absent",
		IfName:      "eth0",
		Args:        [][2]string{{"K8S_POD_NAMESPACE", "ns1"}, {"K8S_POD_NAME", "pod1"}},
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()

	res, err := cni.AddNetworkList(ctx, list, rt)
	if err != nil {
		t.Fatalf("AddNetworkList: %v", err)
	}
	cur, err := current.NewResultFromResult(res)
	if err != nil {
		t.Fatal(err)
	}
	if cur.CNIVersion != "1.1.0" || len(cur.IPs) != 1 || cur.IPs[0].Address.String() != "10.244.1.5/24" {
		t.Errorf("ADD result = %+v", cur)
	}
	if err := cni.CheckNetworkList(ctx, list, rt); err != nil {
		t.Fatalf("CheckNetworkList: %v", err)
	}
	be.mu.Lock()
	prev := be.prev
	be.mu.Unlock()
	if prev == nil || len(prev.IPs) != 1 || prev.IPs[0].Address.String() != "10.244.1.5/24" {
		t.Errorf("CHECK prevResult = %+v, want the ADD result", prev)
	}
	if err := cni.GetStatusNetworkList(ctx, list); err != nil {
		t.Fatalf("GetStatusNetworkList: %v", err)
	}
	if err := cni.GCNetworkList(ctx, list, &libcni.GCArgs{ValidAttachments: []types.GCAttachment{{ContainerID: "libcni-ctr", IfName: "eth0"}}}); err != nil {
		t.Fatalf("GCNetworkList: %v", err)
	}
	be.mu.Lock()
	valid := be.valid
	be.mu.Unlock()
	if len(valid) != 1 || valid[0].ContainerID != "libcni-ctr" || valid[0].IfName != "eth0" {
		t.Errorf("GC valid attachments = %+v", valid)
	}
	if err := cni.DelNetworkList(ctx, list, rt); err != nil {
		t.Fatalf("DelNetworkList: %v", err)
	}

	var cmds []string
	for _, r := range be.requests() {
		cmds = append(cmds, r.Command)
		if r.Command != "GC" && (r.PodName != "pod1" || r.PodNamespace != "ns1" || r.NetConf.MTU != 1400) {
			t.Errorf("%s request lost pod args or mtu: %+v", r.Command, r)
		}
	}
	if got := strings.Join(cmds, ","); got != "ADD,CHECK,GC,DEL" {
		t.Errorf("backend commands = %s, want ADD,CHECK,GC,DEL", got)
	}
}
