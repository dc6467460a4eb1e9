package localapi

import (
	"bytes"
	"context"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"go.uber.org/zap"
	"go.uber.org/zap/zaptest"

	cpv1alpha1 "github.com/seine-net/seine/policy/apis/controlplane/v1alpha1"
)

type stubBackend struct{ lastQuery FlowQuery }

func (stubBackend) Version(context.Context) (Version, error) {
	return Version{Node: "n1", Daemon: "v1", OVS: "3.1.0", Datapath: "netdev"}, nil
}
func (stubBackend) AgentInfo(context.Context) (AgentInfo, error) { return AgentInfo{PodCount: 2}, nil }
func (stubBackend) PodInterfaces() []PodInterface {
	return []PodInterface{{Namespace: "a", Name: "b", OFPort: 5}}
}
func (stubBackend) NetworkPolicies() []AgentPolicy { return nil }
func (stubBackend) AppliedToGroups() []*cpv1alpha1.AppliedToGroup {
	return nil
}
func (stubBackend) AddressGroups() []*cpv1alpha1.AddressGroup { return nil }
func (stubBackend) Services(context.Context) ([]ServiceFrontend, error) {
	return []ServiceFrontend{{Namespace: "a", Name: "web", Port: "http/TCP", Kind: "internal", ID: 7,
		Addresses: []string{"10.96.0.10:80"}, Action: "balance", Endpoints: []string{"10.244.1.5:8080"}}}, nil
}
func (b *stubBackend) Flows(_ context.Context, q FlowQuery) ([]Flow, error) {
	b.lastQuery = q
	if q.Table == "Nowhere" {
		return nil, BadRequest("no table %q", q.Table)
	}
	return []Flow{{Table: "Output", State: FlowInstalled}}, nil
}
func (stubBackend) TracePacket(_ context.Context, r TraceRequest) (TraceResult, error) {
	return TraceResult{}, NotFound("pod %s is not attached", r.Source)
}
func (stubBackend) SupportBundle(_ context.Context, w io.Writer) error {
	_, err := w.Write([]byte("archive"))
	return err
}

// The client and server agree on every route, errors keep their message,
// and the socket is root-only.
func TestServerAndClient(t *testing.T) {
	sock := filepath.Join(t.TempDir(), "run", "api.sock")
	level := zap.NewAtomicLevelAt(zap.InfoLevel)
	b := &stubBackend{}
	ctx := serve(t, NewServer(b, level, nil, zaptest.NewLogger(t)), sock)
	cl := NewClient(sock)
	var v Version
	until(t, func() error { return cl.Get(ctx, "/v1/version", nil, &v) })
	if v.OVS != "3.1.0" {
		t.Fatalf("version %+v", v)
	}
	if fi, err := os.Stat(sock); err != nil || fi.Mode().Perm() != 0o600 {
		t.Fatalf("socket mode %v (%v)", fi.Mode(), err)
	}
	var flows []Flow
	if err := cl.Get(ctx, "/v1/ovsflows", map[string][]string{"pod": {"a/b"}, "table": {"Output"}}, &flows); err != nil || len(flows) != 1 {
		t.Fatalf("flows %v %v", flows, err)
	}
	if b.lastQuery != (FlowQuery{Pod: "a/b", Table: "Output"}) {
		t.Errorf("query %+v", b.lastQuery)
	}
	if err := cl.Get(ctx, "/v1/ovsflows", map[string][]string{"service": {"a/web"}}, &flows); err != nil || b.lastQuery != (FlowQuery{Service: "a/web"}) {
		t.Errorf("flows of a Service: query %+v (%v)", b.lastQuery, err)
	}
	var svcs []ServiceFrontend
	if err := cl.Get(ctx, "/v1/services", nil, &svcs); err != nil || len(svcs) != 1 || svcs[0].ID != 7 || svcs[0].Endpoints[0] != "10.244.1.5:8080" {
		t.Errorf("services %+v (%v)", svcs, err)
	}
	if err := cl.Get(ctx, "/v1/ovsflows", map[string][]string{"table": {"Nowhere"}}, &flows); err == nil || err.Error() != `no table "Nowhere"` {
		t.Errorf("bad table: %v", err)
	}
	var res TraceResult
	if err := cl.Post(ctx, "/v1/trace-packet", TraceRequest{Source: "x/y"}, &res); err == nil || !strings.Contains(err.Error(), "x/y is not attached") {
		t.Errorf("trace: %v", err)
	}
	var l LogLevel
	if err := cl.Put(ctx, "/v1/loglevel", LogLevel{Level: "debug"}, &l); err != nil || l.Level != "debug" || level.Level() != zap.DebugLevel {
		t.Errorf("set debug: %v %+v level %v", err, l, level.Level())
	}
	if err := cl.Put(ctx, "/v1/loglevel", LogLevel{Level: "fatal"}, &l); err == nil || level.Level() != zap.DebugLevel {
		t.Errorf("fatal accepted: %v", err)
	}
	var buf bytes.Buffer
	if err := cl.Stream(ctx, "/v1/supportbundle", &buf); err != nil || buf.String() != "archive" {
		t.Errorf("bundle %q %v", buf.String(), err)
	}
	if err := NewClient(filepath.Join(t.TempDir(), "none.sock")).Get(ctx, "/v1/version", nil, &v); err == nil ||
		!strings.Contains(err.Error(), "cannot reach the seine daemon") {
		t.Errorf("no daemon: %v", err)
	}
}

// A daemon still starting answers seinectl: the log level can be changed,
// and every route that needs the datapath says what the daemon is doing
// (503); once it has a backend, those routes answer from it.
func TestServerWhileStarting(t *testing.T) {
	sock := filepath.Join(t.TempDir(), "api.sock")
	level := zap.NewAtomicLevelAt(zap.InfoLevel)
	srv := NewServer(nil, level, nil, zaptest.NewLogger(t))
	srv.SetStarting(func() string { return "start-up step ovsdb" })
	ctx := serve(t, srv, sock)
	cl := NewClient(sock)
	var l LogLevel
	until(t, func() error { return cl.Put(ctx, "/v1/loglevel", LogLevel{Level: "debug"}, &l) })
	if level.Level() != zap.DebugLevel {
		t.Errorf("log level %v after PUT debug", level.Level())
	}
	var pods []PodInterface
	for _, call := range []func() error{
		func() error { return cl.Get(ctx, "/v1/podinterfaces", nil, &pods) },
		func() error { return cl.Post(ctx, "/v1/trace-packet", TraceRequest{Source: "x/y"}, &TraceResult{}) },
		func() error { return cl.Stream(ctx, "/v1/supportbundle", io.Discard) },
	} {
		if err := call(); err == nil || !strings.Contains(err.Error(), "starting: start-up step ovsdb") {
			t.Errorf("a route that needs the datapath while starting: %v, want the step named", err)
		}
	}
	srv.SetBackend(&stubBackend{})
	if err := cl.Get(ctx, "/v1/podinterfaces", nil, &pods); err != nil || len(pods) != 1 {
		t.Errorf("after SetBackend: %v %v", pods, err)
	}
}

// serve runs srv on sock until the test ends, and returns the context it
// serves under.
func serve(t *testing.T, srv *Server, sock string) context.Context {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- srv.Serve(ctx, sock) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Error(err)
		}
	})
	return ctx
}

// until calls call until it succeeds (the server is up), failing the test
// after 5 s.
func until(t *testing.T, call func() error) {
	t.Helper()
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		err := call()
		if err == nil {
			return
		}
		if time.Now().After(deadline) {
			t.Fatal(err)
		}
	}
}
