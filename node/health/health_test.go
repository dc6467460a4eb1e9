package health

import (
	"errors"
	"net"
	"net/http/httptest"
	"strings"
	"testing"
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
