// Package wire is the protocol between the seine CNI plugin and the node
// daemon, and the plugin's side of it.
//
// The plugin connects to the daemon's root-only unix stream socket, writes
// one Request as a JSON object and reads one Response, a JSON object the
// daemon writes before closing the connection. One connection carries one
// CNI invocation. The plugin keeps its side open until it has read the
// answer and sends nothing more: closing the connection, or shutting down
// its write side, before then abandons the request, and the daemon cancels
// the work in progress (an ADD rolls back). Both messages are at most MaxMessageBytes long. To
// ask a daemon by hand whether it serves ADDs (config is the plugin's
// network configuration, base64-encoded):
//
//	conf=$(printf '{"cniVersion":"1.1.0","name":"seine","type":"seine"}' | base64 -w0)
//	echo '{"version":1,"command":"STATUS","config":"'$conf'"}' |
//	  socat -t5 - UNIX-CONNECT:/var/run/seine/cni.sock,shut-none
//
// The package imports nothing but a few standard packages that initialise
// early, none that pull in package net: the plugin runs from a package
// initializer of the seine binary, before the daemon's initializers (see
// package plugin), and everything it imports must be initialised by then.
package wire

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"syscall"
	"time"
)

// Size limits. A network configuration with a prevResult and
// runtimeConfig is a few KiB.
const (
	// MaxConfigBytes bounds the network configuration, 1 MiB.
	MaxConfigBytes = 1 << 20
	// MaxMessageBytes bounds a Request or a Response on the wire, 4 MiB
	// (a Request carries the configuration in base64).
	MaxMessageBytes = 4 << 20
)

// ProtocolVersion is the version of this protocol, sent in every Request.
// A daemon refuses a request of another version with CNI error 11 (try
// again later): plugin and daemon differ only while an upgrade replaces
// them.
const ProtocolVersion = 1

// Request is one CNI invocation: the CNI_* parameters and stdin (CNI spec,
// section "Parameters").
type Request struct {
	// Version is the sender's ProtocolVersion.
	Version int `json:"version"`
	// Command is CNI_COMMAND: ADD, DEL, CHECK, STATUS or GC (VERSION is
	// answered by the plugin itself).
	Command string `json:"command"`
	// ContainerID is CNI_CONTAINERID; empty for STATUS and GC.
	ContainerID string `json:"containerID,omitempty"`
	// Netns is CNI_NETNS, a path such as /var/run/netns/cni-1234.
	Netns string `json:"netns,omitempty"`
	// IfName is CNI_IFNAME, the interface name inside the container.
	IfName string `json:"ifName,omitempty"`
	// Args is CNI_ARGS unparsed, "K1=V1;K2=V2".
	Args string `json:"args,omitempty"`
	// Path is CNI_PATH, the colon-separated plugin search path.
	Path string `json:"path,omitempty"`
	// Config is the network configuration exactly as read from stdin,
	// byte for byte (base64 in JSON), at most MaxConfigBytes.
	Config []byte `json:"config"`
}

// Response is the daemon's answer: a result (ADD), an error, or neither
// (success with no output: DEL, CHECK, STATUS, GC).
type Response struct {
	// Result is the ADD result, already in the request's cniVersion.
	Result json.RawMessage `json:"result,omitempty"`
	// Error is set when the command failed.
	Error *Error `json:"error,omitempty"`
}

// Error is a CNI error object (CNI spec, section "Error").
type Error struct {
	// Code is 1-99 for the spec's well-known codes, 100 and above for
	// seine's own.
	Code uint `json:"code"`
	// Msg is a short message.
	Msg string `json:"msg"`
	// Details is optional longer text.
	Details string `json:"details,omitempty"`
}

// Error returns "msg; details", or msg alone.
func (e *Error) Error() string {
	if e.Details == "" {
		return e.Msg
	}
	return e.Msg + "; " + e.Details
}

// ForwardedCommands returns the commands the plugin forwards to the
// daemon: ADD, DEL, CHECK, STATUS and GC (CNI spec, section "Parameters";
// VERSION the plugin answers itself).
func ForwardedCommands() []string { return []string{"ADD", "DEL", "CHECK", "STATUS", "GC"} }

// Forwarded reports whether command is one of ForwardedCommands.
func Forwarded(command string) bool {
	for _, c := range ForwardedCommands() {
		if c == command {
			return true
		}
	}
	return false
}

// SupportedVersions returns the CNI spec versions whose configurations and
// results seine accepts and produces, newest first.
func SupportedVersions() []string {
	return []string{"1.1.0", "1.0.0", "0.4.0", "0.3.1", "0.3.0"}
}

// The daemon's heartbeat: while it serves CNI it rewrites AlivePath(socket)
// every AliveInterval. When the socket cannot be reached, STATUS answers
// success as long as the heartbeat is younger than AliveGrace: a daemon
// restarting (a DaemonSet rollout, a crash and its restart) must not fail
// STATUS, which kubelet reports as "network not ready" and so the Node as
// NotReady, upon which the node lifecycle controller marks every Pod of
// the Node NotReady and Services drop them, while the bridge keeps
// forwarding their traffic. ADDs meanwhile get 11 (try again later). A
// daemon gone for longer, or never started, fails STATUS with 50 (CNI
// spec, section "STATUS").
const (
	AliveInterval = 10 * time.Second
	AliveGrace    = 60 * time.Second
)

// AlivePath is the heartbeat file of the daemon serving socket.
func AlivePath(socket string) string { return socket + ".alive" }

// RecentlyAlive reports whether the heartbeat of the daemon serving
// socket was written less than AliveGrace before now.
func RecentlyAlive(socket string, now time.Time) bool {
	fi, err := os.Stat(AlivePath(socket))
	return err == nil && now.Sub(fi.ModTime()) < AliveGrace
}

// ConnectTimeout bounds connecting to the daemon socket while its accept
// queue is full; a missing socket or a socket nobody listens on fails at
// once.
const ConnectTimeout = 3 * time.Second

// ConnectError is the error Call returns when the daemon's socket cannot be
// reached: the daemon is not running, or not accepting connections.
type ConnectError struct {
	// Socket is the path dialled.
	Socket string
	// Err is the cause, such as syscall.ENOENT or syscall.ECONNREFUSED.
	Err error
}

// Error returns "cannot connect to <socket>: <cause>".
func (e *ConnectError) Error() string {
	return fmt.Sprintf("cannot connect to %s: %v", e.Socket, e.Err)
}

// Unwrap returns the cause.
func (e *ConnectError) Unwrap() error { return e.Err }

// Call sends req to the daemon listening on socket and returns its
// response. It fails with a *ConnectError when the socket cannot be
// reached, and with another error when the exchange breaks off (the daemon
// died or restarted mid-request, ctx ended, or the answer is malformed).
//
// Call uses the socket through the runtime's poller (os.NewFile on a
// non-blocking descriptor) rather than package net; see the package
// documentation for why.
func Call(ctx context.Context, socket string, req *Request) (*Response, error) {
	r := *req
	r.Version = ProtocolVersion
	body, err := json.Marshal(&r)
	if err != nil {
		return nil, fmt.Errorf("encoding request: %w", err)
	}
	if len(body) > MaxMessageBytes {
		return nil, fmt.Errorf("request of %d bytes exceeds %d", len(body), MaxMessageBytes)
	}
	conn, err := dial(ctx, socket)
	if err != nil {
		return nil, err
	}
	defer conn.Close()
	// Ending ctx (its deadline included) interrupts a read or write in
	// progress, so the error names ctx's end.
	stop := context.AfterFunc(ctx, func() { _ = conn.SetDeadline(time.Unix(1, 0)) })
	defer stop()

	if _, err := conn.Write(body); err != nil {
		return nil, callError(ctx, "sending request", err)
	}
	raw, err := io.ReadAll(io.LimitReader(conn, MaxMessageBytes+1))
	if err != nil {
		return nil, callError(ctx, "reading response", err)
	}
	if len(raw) > MaxMessageBytes {
		return nil, fmt.Errorf("response exceeds %d bytes", MaxMessageBytes)
	}
	if len(raw) == 0 {
		return nil, errors.New("daemon closed the connection without answering")
	}
	var resp Response
	if err := json.Unmarshal(raw, &resp); err != nil {
		return nil, fmt.Errorf("decoding response: %w", err)
	}
	return &resp, nil
}

// callError names ctx's end as the cause when it interrupted the exchange.
func callError(ctx context.Context, what string, err error) error {
	if ctx.Err() != nil {
		return fmt.Errorf("%s: %w", what, ctx.Err())
	}
	return fmt.Errorf("%s: %w", what, err)
}

// dial connects a non-blocking unix stream socket to path. A non-blocking
// connect to a unix socket completes at once or fails; EAGAIN means the
// listener's accept queue is full (unix(7)), and dial retries it until
// ConnectTimeout or ctx ends.
func dial(ctx context.Context, path string) (*os.File, error) {
	fd, err := syscall.Socket(syscall.AF_UNIX, syscall.SOCK_STREAM|syscall.SOCK_NONBLOCK|syscall.SOCK_CLOEXEC, 0)
	if err != nil {
		return nil, os.NewSyscallError("socket", err)
	}
	deadline := time.Now().Add(ConnectTimeout)
	for pause := time.Millisecond; ; pause = min(2*pause, 50*time.Millisecond) {
		err = syscall.Connect(fd, &syscall.SockaddrUnix{Name: path})
		if err == nil {
			break
		}
		if (err != syscall.EAGAIN && err != syscall.EINTR) || time.Now().After(deadline) || ctx.Err() != nil {
			syscall.Close(fd)
			return nil, &ConnectError{Socket: path, Err: err}
		}
		time.Sleep(pause)
	}
	// A non-blocking descriptor makes os.NewFile register it with the
	// runtime's poller, which gives Read, Write and deadlines.
	return os.NewFile(uintptr(fd), path), nil
}
