package health

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"
)

func TestProbeAnswers(t *testing.T) {
	var p Probes
	g := NewGate("pipeline not installed yet")
	p.Ready.Add(CheckPipeline, g.Check)
	p.Ready.Add(CheckOVSConnected, func() error { return nil })
	p.Live.Add("ping", func() error { return nil })
	h := p.Handler(nil)
	get := func(path string) (int, string) {
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, httptest.NewRequest("GET", path, nil))
		return rec.Code, rec.Body.String()
	}
	if code, body := get("/readyz"); code != 503 || !strings.Contains(body, "[-]pipeline-installed failed: pipeline not installed yet") {
		t.Fatalf("/readyz with a closed gate: %d %q", code, body)
	}
	if code, body := get("/healthz"); code != 200 || body != "ok\n" {
		t.Fatalf("/healthz: %d %q", code, body)
	}
	g.Open()
	if code, body := get("/readyz"); code != 200 || body != "ok\n" {
		t.Fatalf("/readyz with an open gate: %d %q", code, body)
	}
	if code, body := get("/readyz?verbose"); code != 200 || !strings.Contains(body, "[+]ovs-connected ok") {
		t.Fatalf("/readyz?verbose: %d %q", code, body)
	}
	p.Ready.Add(CheckOVSConnected, func() error { return errors.New("openflow disconnected") })
	if err := p.Ready.Err(); err == nil || !strings.Contains(err.Error(), "ovs-connected: openflow disconnected") {
		t.Fatalf("Err() = %v", err)
	}
}

func TestResolveAddress(t *testing.T) {
	ip := net.ParseIP("198.18.0.10")
	for in, want := range map[string]string{":9345": "198.18.0.10:9345", "0.0.0.0:9345": "0.0.0.0:9345", "": ""} {
		if got, err := ResolveAddress(in, ip); err != nil || got != want {
			t.Errorf("ResolveAddress(%q) = %q, %v; want %q", in, got, err, want)
		}
	}
	if _, err := ResolveAddress("9345", ip); err == nil {
		t.Error("a port without a colon was accepted")
	}
}

// A client that keeps its connection open after an answer without asking
// again is cut off after the idle timeout: idle keep-alive connections do
// not pile up on the daemon.
func TestServerClosesIdleConnection(t *testing.T) {
	var p Probes
	p.Live.Add("ping", func() error { return nil })
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		// The other timeouts are longer than the test waits for EOF
		// (net/http falls back to them when IdleTimeout is zero): only
		// the idle timeout can close the connection in time.
		done <- serve(ctx, lis, p.Handler(nil), Timeouts{ReadHeader: 2 * time.Minute, Read: 2 * time.Minute,
			Write: 2 * time.Minute, Idle: 100 * time.Millisecond})
	}()
	defer func() {
		cancel()
		if err := <-done; err != nil {
			t.Error(err)
		}
	}()
	conn, err := net.Dial("tcp", lis.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	if _, err := fmt.Fprint(conn, "GET /healthz HTTP/1.1\r\nHost: probe\r\n\r\n"); err != nil {
		t.Fatal(err)
	}
	r := bufio.NewReader(conn)
	resp, err := http.ReadResponse(r, nil)
	if err != nil {
		t.Fatal(err)
	}
	body, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	if err != nil || resp.StatusCode != http.StatusOK || string(body) != "ok\n" || resp.Close {
		t.Fatalf("/healthz: %d %q %v (close %v)", resp.StatusCode, body, err, resp.Close)
	}
	// The deadline only bounds the test; the server closes long before.
	if err := conn.SetReadDeadline(time.Now().Add(30 * time.Second)); err != nil {
		t.Fatal(err)
	}
	if _, err := r.ReadByte(); !errors.Is(err, io.EOF) {
		t.Fatalf("idle kept-alive connection: read %v, want EOF (closed by the server)", err)
	}
}

// The daemon's timeouts are all set (zero would mean none), and a scrape
// of a large Node's metrics has minutes to be written.
func TestDefaultTimeouts(t *testing.T) {
	d := DefaultTimeouts()
	if d.ReadHeader <= 0 || d.Read <= 0 || d.Idle <= 0 || d.Write < time.Minute {
		t.Errorf("DefaultTimeouts() = %+v", d)
	}
}
