package echo

import (
	"context"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"go.uber.org/zap/zaptest"
	corev1 "k8s.io/api/core/v1"
)

func TestParsePort(t *testing.T) {
	for in, want := range map[string]Port{
		"80":       {80, corev1.ProtocolTCP},
		"53/udp":   {53, corev1.ProtocolUDP},
		"9/SCTP":   {9, corev1.ProtocolSCTP},
		"8080/TCP": {8080, corev1.ProtocolTCP},
	} {
		got, err := ParsePort(in)
		if err != nil || got != want {
			t.Errorf("ParsePort(%q) = %+v, %v; want %+v", in, got, err, want)
		}
	}
	for _, bad := range []string{"", "0", "65536", "80/icmp", "x/TCP"} {
		if _, err := ParsePort(bad); err == nil {
			t.Errorf("ParsePort(%q): want error", bad)
		}
	}
}

// TestServeAndProbe runs servers in a fresh network namespace and probes
// them from inside it: connected with the reply, refused on closed ports.
func TestServeAndProbe(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root for a network namespace")
	}
	const ns = "seine-echotest"
	_ = exec.Command("ip", "netns", "del", ns).Run()
	if out, err := exec.Command("ip", "netns", "add", ns).CombinedOutput(); err != nil {
		t.Fatalf("ip netns add: %v: %s", err, out)
	}
	t.Cleanup(func() { _ = exec.Command("ip", "netns", "del", ns).Run() })
	if out, err := exec.Command("ip", "-n", ns, "link", "set", "lo", "up").CombinedOutput(); err != nil {
		t.Fatalf("lo up: %v: %s", err, out)
	}
	path := "/run/netns/" + ns
	srv, err := Serve(path, "pod-x", []Port{{7000, corev1.ProtocolTCP}, {7000, corev1.ProtocolUDP}, {7001, corev1.ProtocolSCTP}}, zaptest.NewLogger(t))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(srv.Close)
	ctx := context.Background()
	for _, tc := range []struct {
		port  int
		proto corev1.Protocol
		want  Outcome
	}{
		{7000, corev1.ProtocolTCP, Connected},
		{7000, corev1.ProtocolUDP, Connected},
		{7002, corev1.ProtocolTCP, Refused},
		{7002, corev1.ProtocolUDP, Refused},
	} {
		r := Probe(ctx, path, "127.0.0.1", tc.port, tc.proto, time.Second)
		if r.Outcome != tc.want || (tc.want == Connected && r.Reply != "pod-x") {
			t.Errorf("probe %d/%s: %+v; want %s", tc.port, tc.proto, r, tc.want)
		}
	}
	// A large datagram is answered as large; a small one as it is.
	if r := ProbeDatagram(ctx, path, "127.0.0.1", 7000, 9000, time.Second); r.Outcome != Connected || r.Reply != "pod-x" || r.Bytes != 9000 || r.Client == "" {
		t.Errorf("9,000-byte datagram: %+v; want the reply, the client and 9,000 bytes", r)
	}
	if r := ProbeDatagram(ctx, path, "127.0.0.1", 7000, 6, time.Second); r.Outcome != Connected || r.Bytes >= 100 {
		t.Errorf("6-byte datagram: %+v; want a short reply", r)
	}
	if r := ProbeDatagram(ctx, path, "127.0.0.1", 7000, 70000, time.Second); r.Err == nil || !strings.Contains(r.Err.Error(), "size") {
		t.Errorf("70,000-byte datagram: %+v; want a size error", r)
	}
	// The servers live in the namespace, not here (something else of
	// the host's may listen on the port: only our server's reply counts).
	if r := Probe(ctx, "", "127.0.0.1", 7000, corev1.ProtocolTCP, time.Second); r.Outcome == Connected && r.Reply == "pod-x" {
		t.Errorf("probe from the host namespace reached the server: %+v", r)
	}
	// A destination whose packets vanish, as a policy's drop makes them:
	// routed into a veth whose peer takes nothing, the neighbour entry
	// fixed so that no ARP failure ends the wait. The probe times out.
	for _, argv := range [][]string{
		{"ip", "-n", ns, "link", "add", "sink0", "type", "veth", "peer", "name", "sink1"},
		{"ip", "-n", ns, "link", "set", "sink0", "up"},
		{"ip", "-n", ns, "link", "set", "sink1", "up"},
		{"ip", "-n", ns, "route", "add", "198.18.200.0/24", "dev", "sink0"},
		{"ip", "-n", ns, "neigh", "add", "198.18.200.1", "lladdr", "02:00:00:00:00:01", "dev", "sink0", "nud", "permanent"},
	} {
		if out, err := exec.Command(argv[0], argv[1:]...).CombinedOutput(); err != nil {
			t.Fatalf("%v: %v: %s", argv, err, out)
		}
	}
	if r := Probe(ctx, path, "198.18.200.1", 80, corev1.ProtocolTCP, 300*time.Millisecond); r.Outcome != TimedOut {
		t.Errorf("probe into a sink: %+v; want timed out", r)
	}
	srv.Close()
	if r := Probe(ctx, path, "127.0.0.1", 7000, corev1.ProtocolTCP, time.Second); r.Outcome != Refused {
		t.Errorf("probe after Close: %+v; want refused", r)
	}
}
