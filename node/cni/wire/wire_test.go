package wire

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"net"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

// serve answers each connection on a fresh socket with answer(request).
func serve(t *testing.T, answer func(net.Conn, []byte)) string {
	t.Helper()
	sock := filepath.Join(t.TempDir(), "s.sock")
	lis, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { lis.Close() })
	go func() {
		for {
			c, err := lis.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				var raw json.RawMessage
				if err := json.NewDecoder(c).Decode(&raw); err != nil {
					return
				}
				answer(c, raw)
			}()
		}
	}()
	return sock
}

func TestCallRoundTrip(t *testing.T) {
	var got Request
	sock := serve(t, func(c net.Conn, raw []byte) {
		_ = json.Unmarshal(raw, &got)
		_, _ = c.Write([]byte(`{"result":{"cniVersion":"1.1.0"}}`))
	})
	req := &Request{Command: "ADD", ContainerID: "c1", Netns: "/n", IfName: "eth0", Args: "A=1", Path: "/opt/cni/bin", Config: []byte(`{"not json`)}
	resp, err := Call(context.Background(), sock, req)
	if err != nil {
		t.Fatal(err)
	}
	if string(resp.Result) != `{"cniVersion":"1.1.0"}` || resp.Error != nil {
		t.Errorf("response = %+v", resp)
	}
	if got.Command != "ADD" || got.ContainerID != "c1" || got.Args != "A=1" || !bytes.Equal(got.Config, req.Config) {
		t.Errorf("the daemon read %+v, want %+v (undecodable config kept byte for byte)", got, req)
	}
}

func TestCallConnectErrors(t *testing.T) {
	dir := t.TempDir()
	// A socket file nobody listens on any more.
	stale := filepath.Join(dir, "stale.sock")
	lis, err := net.Listen("unix", stale)
	if err != nil {
		t.Fatal(err)
	}
	lis.(*net.UnixListener).SetUnlinkOnClose(false)
	lis.Close()
	for _, c := range []struct {
		path string
		want error
	}{
		{filepath.Join(dir, "absent.sock"), syscall.ENOENT},
		{stale, syscall.ECONNREFUSED},
	} {
		_, err := Call(context.Background(), c.path, &Request{Command: "ADD"})
		var ce *ConnectError
		if !errors.As(err, &ce) || !errors.Is(err, c.want) || !strings.Contains(err.Error(), c.path) {
			t.Errorf("Call(%s) = %v, want a ConnectError naming the path and %v", c.path, err, c.want)
		}
	}
}

func TestCallBrokenExchanges(t *testing.T) {
	for _, c := range []struct {
		name   string
		answer func(net.Conn, []byte)
		ctx    time.Duration
		want   string
	}{
		{"closed without answer", func(net.Conn, []byte) {}, time.Minute, "without answering"},
		{"not JSON", func(c net.Conn, _ []byte) { _, _ = io.WriteString(c, "oops") }, time.Minute, "decoding response"},
		{"too long", func(c net.Conn, _ []byte) {
			_, _ = c.Write(bytes.Repeat([]byte(" "), MaxMessageBytes+10))
		}, time.Minute, "exceeds"},
		{"no answer before the deadline", func(net.Conn, []byte) { time.Sleep(2 * time.Second) }, 100 * time.Millisecond, "deadline exceeded"},
	} {
		t.Run(c.name, func(t *testing.T) {
			sock := serve(t, c.answer)
			ctx, cancel := context.WithTimeout(context.Background(), c.ctx)
			defer cancel()
			_, err := Call(ctx, sock, &Request{Command: "DEL"})
			var ce *ConnectError
			if err == nil || errors.As(err, &ce) || !strings.Contains(err.Error(), c.want) {
				t.Errorf("Call = %v, want an exchange error with %q", err, c.want)
			}
		})
	}
}
