package server

import (
	"context"
	"encoding/json"
	"errors"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/containernetworking/cni/pkg/types"
	current "github.com/containernetworking/cni/pkg/types/100"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"go.uber.org/zap/zaptest"

	"github.com/seine-net/seine/node/cni/wire"
	"github.com/seine-net/seine/node/health"
)

// blockingBackend lets a test hold an ADD open and see which calls reached
// the backend, in order.
type blockingBackend struct {
	mu      sync.Mutex
	calls   []string // "ADD c1", "DEL c1", ...
	release map[string]chan struct{}
	entered chan string
}

func (b *blockingBackend) record(cmd, id string) {
	b.mu.Lock()
	b.calls = append(b.calls, cmd+" "+id)
	ch := b.release[cmd+" "+id]
	b.mu.Unlock()
	if b.entered != nil {
		b.entered <- cmd + " " + id
	}
	if ch != nil {
		<-ch
	}
}

func (b *blockingBackend) Add(ctx context.Context, req *Request) (*current.Result, error) {
	b.record(CmdAdd, req.ContainerID)
	return &current.Result{CNIVersion: current.ImplementedSpecVersion}, nil
}
func (b *blockingBackend) Del(ctx context.Context, req *Request) error {
	b.record(CmdDel, req.ContainerID)
	return nil
}
func (b *blockingBackend) Check(ctx context.Context, req *Request, prev *current.Result) error {
	b.record(CmdCheck, req.ContainerID)
	return nil
}
func (b *blockingBackend) Status(ctx context.Context) error {
	b.record(CmdStatus, "")
	return nil
}
func (b *blockingBackend) GC(ctx context.Context, req *Request, valid []types.GCAttachment) error {
	b.record(CmdGC, "")
	return nil
}

func (b *blockingBackend) snapshot() []string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return append([]string(nil), b.calls...)
}

// startServer serves s on a fresh socket and returns its path; the server is
// stopped when the test ends.
func startServer(t *testing.T, s *Server) string {
	t.Helper()
	dir, err := os.MkdirTemp("", "seine-cni-srv")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	sock := filepath.Join(dir, "run", "cni.sock")
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- s.Serve(ctx, sock) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Serve returned %v", err)
		}
	})
	waitForSocket(t, sock, done)
	return sock
}

func waitForSocket(t *testing.T, sock string, done chan error) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for time.Now().Before(deadline) {
		if c, err := net.Dial("unix", sock); err == nil {
			c.Close()
			return
		}
		select {
		case err := <-done:
			t.Fatalf("Serve exited early: %v", err)
		case <-time.After(10 * time.Millisecond):
		}
	}
	t.Fatalf("socket %s never came up", sock)
}

// testClient sends requests as the plugin does.
type testClient struct{ sock string }

func client(t *testing.T, sock string) testClient { return testClient{sock} }

// call sends req as command cmd.
func (c testClient) call(ctx context.Context, cmd string, req *wire.Request) (*wire.Response, error) {
	r := *req
	r.Command = cmd
	return wire.Call(ctx, c.sock, &r)
}

// code is the response's CNI error code, 0 for success.
func code(resp *wire.Response) uint {
	if resp == nil || resp.Error == nil {
		return 0
	}
	return resp.Error.Code
}

const goodConf = `{"cniVersion":"1.1.0","name":"seine","type":"seine","socketPath":"/x"}`

// gcConf is goodConf as a GC gets it: with the attachments to keep.
const gcConf = `{"cniVersion":"1.1.0","name":"seine","type":"seine","socketPath":"/x","cni.dev/valid-attachments":[]}`

func addReq(id, conf string) *wire.Request {
	return &wire.Request{ContainerID: id, Netns: "/var/run/netns/" + id, IfName: "eth0", Config: []byte(conf)}
}

func TestServeSocketModeAndStaleSocket(t *testing.T) {
	s := New(&blockingBackend{}, zaptest.NewLogger(t))
	sock := startServer(t, s)
	fi, err := os.Stat(sock)
	if err != nil {
		t.Fatal(err)
	}
	if got := fi.Mode().Perm(); got != 0o600 {
		t.Errorf("socket mode = %o, want 600", got)
	}
	di, err := os.Stat(filepath.Dir(sock))
	if err != nil {
		t.Fatal(err)
	}
	if got := di.Mode().Perm(); got != 0o750 {
		t.Errorf("socket dir mode = %o, want 750", got)
	}
	// A second server must refuse a socket a live server answers on.
	err = New(&blockingBackend{}, zaptest.NewLogger(t)).Serve(context.Background(), sock)
	if err == nil || !strings.Contains(err.Error(), "in use") {
		t.Errorf("second Serve on live socket: err = %v, want 'in use'", err)
	}
}

// A serving daemon keeps its heartbeat fresh, and leaves it behind when
// it stops (a restart is what it covers).
func TestServeWritesHeartbeat(t *testing.T) {
	s := New(&blockingBackend{}, zaptest.NewLogger(t))
	sock := startServer(t, s)
	var fi os.FileInfo
	deadline := time.Now().Add(5 * time.Second)
	for {
		var err error
		if fi, err = os.Stat(wire.AlivePath(sock)); err == nil || time.Now().After(deadline) {
			break
		}
		time.Sleep(10 * time.Millisecond)
	}
	if fi == nil || !wire.RecentlyAlive(sock, time.Now()) {
		t.Fatalf("no recent heartbeat beside %s: %v", sock, fi)
	}
	if wire.RecentlyAlive(sock, fi.ModTime().Add(wire.AliveGrace)) {
		t.Error("a heartbeat AliveGrace old still counts")
	}
}

func TestServeReplacesStaleSocketAndRejectsNonSocket(t *testing.T) {
	dir, err := os.MkdirTemp("", "seine-cni-stale")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })

	// A socket file nobody listens on, as left by a crashed daemon.
	sock := filepath.Join(dir, "cni.sock")
	l, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	l.(*net.UnixListener).SetUnlinkOnClose(false)
	l.Close()
	if _, err := os.Stat(sock); err != nil {
		t.Fatalf("stale socket not left behind: %v", err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- New(&blockingBackend{}, zaptest.NewLogger(t)).Serve(ctx, sock) }()
	waitForSocket(t, sock, done)
	cancel()
	if err := <-done; err != nil {
		t.Fatalf("Serve: %v", err)
	}

	// A regular file must not be deleted.
	file := filepath.Join(dir, "not-a-socket")
	if err := os.WriteFile(file, []byte("x"), 0o600); err != nil {
		t.Fatal(err)
	}
	err = New(&blockingBackend{}, zaptest.NewLogger(t)).Serve(context.Background(), file)
	if err == nil || !strings.Contains(err.Error(), "not a socket") {
		t.Errorf("Serve on regular file: err = %v, want 'not a socket'", err)
	}
	if _, err := os.Stat(file); err != nil {
		t.Errorf("regular file was removed: %v", err)
	}
}

func TestValidationErrors(t *testing.T) {
	reg := prometheus.NewRegistry()
	be := &blockingBackend{}
	sock := startServer(t, New(be, zaptest.NewLogger(t), WithRegistry(reg)))
	c := client(t, sock)
	ctx := context.Background()

	cases := []struct {
		name string
		req  *wire.Request
		code uint
	}{
		{"bad json", addReq("c1", `{"cniVersion":`), types.ErrDecodingFailure},
		{"no name", addReq("c1", `{"cniVersion":"1.0.0","type":"seine"}`), types.ErrInvalidNetworkConfig},
		{"bad mtu", addReq("c1", `{"cniVersion":"1.0.0","name":"n","type":"seine","mtu":70000}`), types.ErrInvalidNetworkConfig},
		{"mtu below IPv4's minimum", addReq("c1", `{"cniVersion":"1.0.0","name":"n","type":"seine","mtu":40}`), types.ErrInvalidNetworkConfig},
		{"old version", addReq("c1", `{"cniVersion":"0.2.0","name":"n","type":"seine"}`), types.ErrIncompatibleCNIVersion},
		{"future version", addReq("c1", `{"cniVersion":"2.0.0","name":"n","type":"seine"}`), types.ErrIncompatibleCNIVersion},
		{"no version", addReq("c1", `{"name":"n","type":"seine"}`), types.ErrIncompatibleCNIVersion},
		{"no container id", addReq("", goodConf), types.ErrInvalidEnvironmentVariables},
		{"slash in container id", addReq("c/1", goodConf), types.ErrInvalidEnvironmentVariables},
		{"long ifname", &wire.Request{ContainerID: "c1", Netns: "/n", IfName: "eth0-much-too-long", Config: []byte(goodConf)}, types.ErrInvalidEnvironmentVariables},
		{"bad network name", addReq("c1", `{"cniVersion":"1.0.0","name":"a b","type":"seine"}`), types.ErrInvalidNetworkConfig},
		{"bad args", &wire.Request{ContainerID: "c1", Netns: "/n", IfName: "eth0", Args: "K8S_POD_NAME", Config: []byte(goodConf)}, types.ErrInvalidEnvironmentVariables},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			resp, err := c.call(ctx, CmdAdd, tc.req)
			if err != nil {
				t.Fatalf("call: %v", err)
			}
			if code(resp) != tc.code {
				t.Errorf("code = %d (%+v), want %d", code(resp), resp.Error, tc.code)
			}
			if len(resp.Result) != 0 {
				t.Errorf("error response carries a result: %s", resp.Result)
			}
		})
	}
	// GC and STATUS need a 1.1.0 configuration.
	resp, err := c.call(ctx, CmdGC, &wire.Request{Config: []byte(`{"cniVersion":"1.0.0","name":"n","type":"seine"}`)})
	if err != nil || code(resp) != types.ErrIncompatibleCNIVersion {
		t.Errorf("GC on 1.0.0 conf: resp %v err %v, want code 1", resp, err)
	}
	if got := be.snapshot(); len(got) != 0 {
		t.Errorf("invalid requests reached the backend: %v", got)
	}
	// Every request was observed, keyed by its error code.
	m, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	found, series, errCount := false, 0, 0.0
	for _, mf := range m {
		if mf.GetName() == "seine_cni_errors_total" {
			for _, metric := range mf.GetMetric() {
				errCount += metric.GetCounter().GetValue()
			}
		}
		if mf.GetName() != "seine_cni_request_duration_seconds" {
			continue
		}
		for _, metric := range mf.GetMetric() {
			series++
			labels := map[string]string{}
			for _, l := range metric.GetLabel() {
				labels[l.GetName()] = l.GetValue()
			}
			if labels["command"] == "ADD" && labels["result"] == "6" && metric.GetHistogram().GetSampleCount() == 1 {
				found = true
			}
		}
	}
	if series < 4 {
		t.Errorf("histogram series = %d, want at least 4 (codes 1, 4, 6, 7)", series)
	}
	if !found {
		t.Errorf("no ADD/6 histogram sample with count 1 in %v", m)
	}
	if errCount < 4 {
		t.Errorf("seine_cni_errors_total sums to %v, want at least 4", errCount)
	}
}

func TestSameContainerSerializedOthersConcurrent(t *testing.T) {
	be := &blockingBackend{
		release: map[string]chan struct{}{"ADD c1": make(chan struct{})},
		entered: make(chan string, 10),
	}
	srv := New(be, zaptest.NewLogger(t))
	c := client(t, startServer(t, srv))
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()

	addDone := make(chan error, 1)
	go func() { _, err := c.call(ctx, CmdAdd, addReq("c1", goodConf)); addDone <- err }()
	if got := <-be.entered; got != "ADD c1" {
		t.Fatalf("first call = %q", got)
	}
	delDone := make(chan error, 1)
	go func() { _, err := c.call(ctx, CmdDel, addReq("c1", goodConf)); delDone <- err }()

	// Another container is not held up by c1.
	if _, err := c.call(ctx, CmdAdd, addReq("c2", goodConf)); err != nil {
		t.Fatal(err)
	}
	if got := <-be.entered; got != "ADD c2" {
		t.Fatalf("second backend call = %q, want ADD c2 (DEL c1 must wait)", got)
	}
	// DEL c1 has reached the server and waits (it has not reached the
	// backend: ADD c2 was the next call there).
	waitWaiting(t, ctx, srv, CmdDel, delDone)
	close(be.release["ADD c1"])
	if err := <-addDone; err != nil {
		t.Fatal(err)
	}
	if err := <-delDone; err != nil {
		t.Fatal(err)
	}
	<-be.entered
	want := []string{"ADD c1", "ADD c2", "DEL c1"}
	if got := be.snapshot(); strings.Join(got, ",") != strings.Join(want, ",") {
		t.Errorf("backend calls = %v, want %v", got, want)
	}
}

func TestGCExcludesContainerCommands(t *testing.T) {
	be := &blockingBackend{
		release: map[string]chan struct{}{"ADD c1": make(chan struct{})},
		entered: make(chan string, 10),
	}
	srv := New(be, zaptest.NewLogger(t))
	c := client(t, startServer(t, srv))
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	addDone := make(chan error, 1)
	go func() { _, err := c.call(ctx, CmdAdd, addReq("c1", goodConf)); addDone <- err }()
	<-be.entered
	gcDone := make(chan error, 1)
	go func() {
		_, err := c.call(ctx, CmdGC, &wire.Request{Config: []byte(gcConf)})
		gcDone <- err
	}()
	waitWaiting(t, ctx, srv, CmdGC, gcDone)
	select {
	case got := <-be.entered:
		t.Fatalf("%s reached the backend while ADD c1 was in flight", got)
	default:
	}
	close(be.release["ADD c1"])
	if got := <-be.entered; got != "GC " {
		t.Fatalf("after ADD, backend got %q, want GC", got)
	}
	if err := errors.Join(<-addDone, <-gcDone); err != nil {
		t.Fatal(err)
	}
}

func TestParseRequestPodArgsAndPrevResult(t *testing.T) {
	conf := `{"cniVersion":"1.0.0","name":"n","type":"seine","mtu":1400,"runtimeConfig":{"portMappings":[]},
	  "prevResult":{"cniVersion":"1.0.0","ips":[{"address":"10.1.2.3/24"}]}}`
	req, perr := parseRequest(&wire.Request{
		Version: wire.ProtocolVersion, Command: CmdCheck, ContainerID: "c1", Netns: "/n", IfName: "eth0",
		Args:   "IgnoreUnknown=1;K8S_POD_NAMESPACE=kube-system;K8S_POD_NAME=dns-1;K8S_POD_INFRA_CONTAINER_ID=c1;K8S_POD_UID=u-1",
		Config: []byte(conf),
	})
	if perr != nil {
		t.Fatal(perr)
	}
	if req.PodNamespace != "kube-system" || req.PodName != "dns-1" || req.PodUID != "u-1" || req.InfraContainerID != "c1" {
		t.Errorf("pod fields = %+v", req)
	}
	if req.NetConf.MTU != 1400 || string(req.NetConf.RuntimeConfig["portMappings"]) != "[]" {
		t.Errorf("seine fields = mtu %d runtimeConfig %v", req.NetConf.MTU, req.NetConf.RuntimeConfig)
	}
	prev, perr := prevResult(req)
	if perr != nil {
		t.Fatal(perr)
	}
	if len(prev.IPs) != 1 || prev.IPs[0].Address.String() != "10.1.2.3/24" {
		t.Errorf("prevResult = %+v", prev)
	}
}

func TestErrorMapping(t *testing.T) {
	cause := errors.New("no free address in 10.0.0.0/24")
	e := toCNIError(Errorf(ErrCodeIPAMExhausted, "allocating address: %w", cause))
	if e.Code != ErrCodeIPAMExhausted || !errors.Is(e, cause) {
		t.Errorf("Errorf: %+v", e)
	}
	msg, details := e.wireMsgDetails()
	if msg != "allocating address: no free address in 10.0.0.0/24" || details != "" {
		t.Errorf("wire = %q / %q", msg, details)
	}
	e = toCNIError(&Error{Code: ErrCodeDatapath, Msg: "creating veth", Err: cause})
	if msg, details := e.wireMsgDetails(); msg != "creating veth" || details != cause.Error() {
		t.Errorf("wire = %q / %q", msg, details)
	}
	if got := e.Error(); got != "creating veth; "+cause.Error() {
		t.Errorf("Error() = %q", got)
	}
	e = toCNIError(errors.New("boom"))
	if e.Code != ErrCodeInternal || e.Msg != "boom" {
		t.Errorf("plain error mapped to %+v", e)
	}
	e = toCNIError(types.NewError(types.ErrTryAgainLater, "busy", "d"))
	if e.Code != types.ErrTryAgainLater || e.Details != "d" {
		t.Errorf("types.Error mapped to %+v", e)
	}
}

func TestEncodeResultVersions(t *testing.T) {
	res := &current.Result{CNIVersion: "1.1.0", IPs: []*current.IPConfig{{Address: mustCIDR(t, "10.1.2.3/24")}}}
	for _, v := range wire.SupportedVersions() {
		out, perr := encodeResult(res, v)
		if perr != nil {
			t.Fatalf("%s: %v", v, perr)
		}
		var got struct {
			CNIVersion string `json:"cniVersion"`
		}
		if err := json.Unmarshal(out, &got); err != nil || got.CNIVersion != v {
			t.Errorf("%s: encoded %s", v, out)
		}
	}
}

func mustCIDR(t *testing.T, s string) net.IPNet {
	t.Helper()
	ip, n, err := net.ParseCIDR(s)
	if err != nil {
		t.Fatal(err)
	}
	n.IP = ip
	return *n
}

// ctxBackend's Add waits for its context to end and reports that it did.
type ctxBackend struct {
	blockingBackend
	started, cancelled chan struct{}
}

func (b *ctxBackend) Add(ctx context.Context, req *Request) (*current.Result, error) {
	close(b.started)
	<-ctx.Done()
	close(b.cancelled)
	return nil, ctx.Err()
}

// TestAbandonedRequestIsCancelled: a plugin that goes away before the
// answer (the runtime killed it) cancels the work, as the protocol says.
func TestAbandonedRequestIsCancelled(t *testing.T) {
	be := &ctxBackend{started: make(chan struct{}), cancelled: make(chan struct{})}
	sock := startServer(t, New(be, zaptest.NewLogger(t)))
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { _, err := client(t, sock).call(ctx, CmdAdd, addReq("c1", goodConf)); done <- err }()
	select {
	case <-be.started:
	case <-time.After(10 * time.Second):
		t.Fatal("ADD never reached the backend")
	}
	cancel() // the plugin's call ends and closes its connection
	if err := <-done; !errors.Is(err, context.Canceled) {
		t.Errorf("call returned %v, want context.Canceled", err)
	}
	select {
	case <-be.cancelled:
	case <-time.After(10 * time.Second):
		t.Fatal("the backend's context was not cancelled after the plugin left")
	}
}

// TestShutdownCancelsAfterGrace: stopping the server waits the grace period
// for in-flight requests, then cancels them and returns.
func TestShutdownCancelsAfterGrace(t *testing.T) {
	be := &ctxBackend{started: make(chan struct{}), cancelled: make(chan struct{})}
	dir := t.TempDir()
	sock := filepath.Join(dir, "cni.sock")
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	served := make(chan error, 1)
	go func() {
		served <- New(be, zaptest.NewLogger(t), WithShutdownGrace(200*time.Millisecond)).Serve(ctx, sock)
	}()
	waitForSocket(t, sock, served)
	answered := make(chan *wire.Response, 1)
	go func() {
		resp, _ := client(t, sock).call(context.Background(), CmdAdd, addReq("c1", goodConf))
		answered <- resp
	}()
	<-be.started
	cancel()
	select {
	case err := <-served:
		if err != nil {
			t.Errorf("Serve: %v", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Serve did not return after its grace period")
	}
	<-be.cancelled
	if resp := <-answered; code(resp) != ErrCodeInternal || !strings.Contains(resp.Error.Msg, "canceled") {
		t.Errorf("the cut-off request's answer = %+v, want internal error naming the cancellation", resp)
	}
	if _, err := net.Dial("unix", sock); err == nil {
		t.Error("the socket still accepts connections after Serve returned")
	}
}

// TestMalformedRequests: garbage on the socket and unknown commands get a
// CNI error naming the cause, and the server goes on serving.
func TestMalformedRequests(t *testing.T) {
	be := &blockingBackend{}
	sock := startServer(t, New(be, zaptest.NewLogger(t)))
	conn, err := net.Dial("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	if _, err := conn.Write([]byte("GET / HTTP/1.1\r\n\r\n")); err != nil {
		t.Fatal(err)
	}
	var resp wire.Response
	if err := json.NewDecoder(conn).Decode(&resp); err != nil {
		t.Fatalf("no JSON answer to garbage: %v", err)
	}
	if code(&resp) != types.ErrDecodingFailure || !strings.Contains(resp.Error.Msg, "malformed") {
		t.Errorf("answer to garbage = %+v, want code 6", resp.Error)
	}
	// A request of another protocol version (here none) is refused.
	conn2, err := net.Dial("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	defer conn2.Close()
	if _, err := conn2.Write([]byte(`{"command":"ADD","containerID":"c9","netns":"/n","ifName":"eth0"}`)); err != nil {
		t.Fatal(err)
	}
	resp = wire.Response{}
	if err := json.NewDecoder(conn2).Decode(&resp); err != nil || code(&resp) != types.ErrTryAgainLater || !strings.Contains(resp.Error.Msg, "protocol version 0") {
		t.Errorf("answer to a version 0 request = %+v, %v; want code 11 naming the versions", resp.Error, err)
	}
	c := client(t, sock)
	r, err := c.call(context.Background(), "VERSION", addReq("c1", goodConf))
	if err != nil || code(r) != types.ErrInvalidEnvironmentVariables || !strings.Contains(r.Error.Msg, "VERSION") {
		t.Errorf("unknown command: %+v, %v; want code 4 naming it", r, err)
	}
	if r, err := c.call(context.Background(), CmdAdd, addReq("c1", goodConf)); err != nil || code(r) != 0 || len(r.Result) == 0 {
		t.Errorf("ADD after bad requests: %+v, %v", r, err)
	}
	if got := be.snapshot(); strings.Join(got, ",") != "ADD c1" {
		t.Errorf("backend calls = %v, want only the good ADD", got)
	}
}

// slowBackend's Add takes a while and fails if its context ends first.
type slowBackend struct{ blockingBackend }

func (b *slowBackend) Add(ctx context.Context, req *Request) (*current.Result, error) {
	select {
	case <-time.After(200 * time.Millisecond):
		return &current.Result{CNIVersion: current.ImplementedSpecVersion}, nil
	case <-ctx.Done():
		return nil, ctx.Err()
	}
}

// TestTrailingBytesDoNotCancel: bytes after the request (a client ending it
// with a newline) are not a close; only the end of the connection cancels.
// Unknown commands are counted under "unknown", never under a label the
// client made up.
func TestTrailingBytesDoNotCancel(t *testing.T) {
	reg := prometheus.NewRegistry()
	sock := startServer(t, New(&slowBackend{}, zaptest.NewLogger(t), WithRegistry(reg)))
	conn, err := net.Dial("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	req, _ := json.Marshal(&wire.Request{Version: wire.ProtocolVersion, Command: CmdAdd, ContainerID: "c1", Netns: "/n", IfName: "eth0", Config: []byte(goodConf)})
	if _, err := conn.Write(append(req, '\n')); err != nil {
		t.Fatal(err)
	}
	time.Sleep(50 * time.Millisecond)
	if _, err := conn.Write([]byte("\n")); err != nil {
		t.Fatal(err)
	}
	var resp wire.Response
	if err := json.NewDecoder(conn).Decode(&resp); err != nil || code(&resp) != 0 {
		t.Fatalf("ADD with trailing newlines: %+v, %v", resp.Error, err)
	}
	if _, err := client(t, sock).call(context.Background(), "BOGUS", addReq("c2", goodConf)); err != nil {
		t.Fatal(err)
	}
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	var commands []string
	for _, mf := range mfs {
		if mf.GetName() != "seine_cni_errors_total" {
			continue
		}
		for _, m := range mf.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == "command" {
					commands = append(commands, l.GetValue())
				}
			}
		}
	}
	if strings.Join(commands, ",") != "unknown" {
		t.Errorf("error series by command = %v, want only unknown", commands)
	}
}

// TestDispatch: every command the plugin forwards reaches its backend
// method, and one without a handler (wire.ForwardedCommands out of step
// with dispatch) is an internal error that names it, not the runtime's
// fault.
func TestDispatch(t *testing.T) {
	be := &blockingBackend{}
	s := New(be, zaptest.NewLogger(t))
	ctx := context.Background()
	confs := map[string]string{
		CmdCheck: `{"cniVersion":"1.1.0","name":"seine","type":"seine","prevResult":{"cniVersion":"1.1.0"}}`,
		CmdGC:    gcConf,
	}
	want := map[string]string{CmdAdd: "ADD c1", CmdDel: "DEL c1", CmdCheck: "CHECK c1", CmdStatus: "STATUS ", CmdGC: "GC "}
	for _, cmd := range wire.ForwardedCommands() {
		conf, ok := confs[cmd]
		if !ok {
			conf = goodConf
		}
		in := addReq("c1", conf)
		in.Command, in.Version = cmd, wire.ProtocolVersion // wire.Call sets the version
		req, perr := parseRequest(in)
		if perr != nil {
			t.Fatalf("%s: %v", cmd, perr)
		}
		if _, err := s.dispatch(ctx, req); err != nil {
			t.Errorf("%s: %v", cmd, err)
		}
		if calls := be.snapshot(); len(calls) == 0 || calls[len(calls)-1] != want[cmd] {
			t.Errorf("%s: backend calls %v; want the last to be %q", cmd, calls, want[cmd])
		}
	}
	_, err := s.dispatch(ctx, &Request{Command: "REBOOT"})
	var e *Error
	if !errors.As(err, &e) || e.Code != ErrCodeInternal || !strings.Contains(e.Msg, `"REBOOT"`) {
		t.Errorf("unhandled command: %v; want an internal error naming it", err)
	}
}

// waitWaiting waits until one request of command waits for its turn at
// srv (seine_cni_requests_waiting), failing if done reports the request
// finished first or ctx ends.
func waitWaiting(t *testing.T, ctx context.Context, srv *Server, command string, done <-chan error) {
	t.Helper()
	for testutil.ToFloat64(srv.waiting.WithLabelValues(command)) != 1 {
		select {
		case err := <-done:
			t.Fatalf("%s finished instead of waiting for its turn (err %v)", command, err)
		case <-ctx.Done():
			t.Fatalf("%s never waited for its turn: %v", command, ctx.Err())
		case <-time.After(5 * time.Millisecond):
		}
	}
}

// The watchdog sees a request from the moment it is decoded until its
// answer: a held ADD counts as work in progress, a finished one does not.
func TestWatchdogSeesRequests(t *testing.T) {
	be := &blockingBackend{
		release: map[string]chan struct{}{"ADD c1": make(chan struct{})},
		entered: make(chan string, 10),
	}
	w := health.NewWatchdog(time.Nanosecond) // every request in progress is past it
	srv := New(be, zaptest.NewLogger(t), WithWatchdog(w))
	c := client(t, startServer(t, srv))
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	addDone := make(chan error, 1)
	go func() { _, err := c.call(ctx, CmdAdd, addReq("c1", goodConf)); addDone <- err }()
	defer close(be.release["ADD c1"])
	<-be.entered
	if err := w.Check(); err == nil || !strings.Contains(err.Error(), "cni ADD c1") {
		t.Fatalf("check with ADD c1 held: %v, want it named", err)
	}
	be.release["ADD c1"] <- struct{}{}
	if err := <-addDone; err != nil {
		t.Fatal(err)
	}
	if err := w.Check(); err != nil {
		t.Errorf("check once ADD c1 answered: %v", err)
	}
}

// gcBackend records the attachments each GC was told to keep.
type gcBackend struct {
	blockingBackend
	valid [][]types.GCAttachment
}

func (b *gcBackend) GC(ctx context.Context, req *Request, valid []types.GCAttachment) error {
	b.valid = append(b.valid, valid)
	return nil
}

// A GC keeps what cni.dev/valid-attachments lists, or the older
// cni.dev/attachments (the spec text's first name for it); null keeps nothing; a
// configuration with neither releases nothing and is refused.
func TestGCValidAttachments(t *testing.T) {
	be := &gcBackend{}
	c := client(t, startServer(t, New(be, zaptest.NewLogger(t))))
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	const base = `{"cniVersion":"1.1.0","name":"seine","type":"seine","socketPath":"/x"`
	for _, tc := range []struct {
		name, conf string
		code       uint // 0: success
		want       string
	}{
		{"valid-attachments", base + `,"cni.dev/valid-attachments":[{"containerID":"a","ifname":"eth0"}]}`, 0, "a/eth0"},
		{"the spec's first name", base + `,"cni.dev/attachments":[{"containerID":"b","ifname":"eth0"}]}`, 0, "b/eth0"},
		{"both: valid-attachments wins", base + `,"cni.dev/attachments":[],"cni.dev/valid-attachments":[{"containerID":"c","ifname":"eth0"}]}`, 0, "c/eth0"},
		{"null", base + `,"cni.dev/valid-attachments":null}`, 0, ""},
		{"neither", base + `}`, types.ErrInvalidNetworkConfig, ""},
		{"not a list", base + `,"cni.dev/valid-attachments":"a"}`, types.ErrDecodingFailure, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			before := len(be.valid)
			resp, err := c.call(ctx, CmdGC, &wire.Request{Config: []byte(tc.conf)})
			if err != nil {
				t.Fatal(err)
			}
			if code(resp) != tc.code {
				t.Fatalf("code %d (%v), want %d", code(resp), resp.Error, tc.code)
			}
			if tc.code != 0 {
				if len(be.valid) != before {
					t.Errorf("a refused GC reached the backend")
				}
				return
			}
			if len(be.valid) != before+1 {
				t.Fatalf("GC did not reach the backend")
			}
			var got []string
			for _, a := range be.valid[before] {
				got = append(got, a.ContainerID+"/"+a.IfName)
			}
			if strings.Join(got, ",") != tc.want {
				t.Errorf("kept %v, want %q", got, tc.want)
			}
		})
	}
}
