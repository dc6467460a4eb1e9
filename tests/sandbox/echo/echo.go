// Package echo holds the tiny servers and the probe the sandbox uses to
// test connectivity between network namespaces.
//
// A server answers every TCP connection and every UDP datagram with a fixed
// reply line (in the sandbox: "<pod name>\n") and, for TCP, closes the
// connection. A probe connects from inside a network namespace, reads that
// line and classifies the outcome as connected, refused or timed out, or
// as failed when the probe itself could not be made.
//
// Sockets are created inside the target namespace by switching the calling
// OS thread into it (github.com/containernetworking/plugins/pkg/ns); a
// socket keeps the namespace it was created in, so servers keep working
// after the thread has switched back.
package echo

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/containernetworking/plugins/pkg/ns"
	"go.uber.org/zap"
	corev1 "k8s.io/api/core/v1"
)

// Port is one port a server listens on.
type Port struct {
	// Port is the TCP/UDP port number (1..65535).
	Port int32
	// Protocol is TCP, UDP or SCTP (SCTP is skipped where the kernel has no
	// SCTP support).
	Protocol corev1.Protocol
}

// ParsePort parses "80", "80/TCP", "53/udp" (protocol defaults to TCP).
func ParsePort(s string) (Port, error) {
	num, proto, found := strings.Cut(s, "/")
	p := Port{Protocol: corev1.ProtocolTCP}
	if found {
		p.Protocol = corev1.Protocol(strings.ToUpper(proto))
	}
	switch p.Protocol {
	case corev1.ProtocolTCP, corev1.ProtocolUDP, corev1.ProtocolSCTP:
	default:
		return Port{}, fmt.Errorf("port %q: unknown protocol %q (want TCP, UDP or SCTP)", s, proto)
	}
	n, err := strconv.Atoi(num)
	if err != nil || n < 1 || n > 65535 {
		return Port{}, fmt.Errorf("port %q: want a number in 1..65535", s)
	}
	p.Port = int32(n)
	return p, nil
}

// Servers is a set of running listeners; Close stops all of them.
type Servers struct {
	mu      sync.Mutex
	closers []func() error
	wg      sync.WaitGroup
}

// Serve starts one server per port inside the network namespace at
// netnsPath ("" means the caller's current namespace), each answering with
// reply+"\n". Listeners bind to all addresses of that namespace. SCTP ports
// are skipped with a log line when the kernel refuses SCTP sockets. On error
// the servers started so far are closed.
func Serve(netnsPath, reply string, ports []Port, log *zap.Logger) (*Servers, error) {
	s := &Servers{}
	line := []byte(reply + "\n")
	for _, p := range ports {
		var err error
		inNS(netnsPath, func() error {
			err = s.start(p, line, log)
			return nil
		}, &err)
		if err != nil {
			s.Close()
			return nil, err
		}
	}
	return s, nil
}

// inNS runs f in the namespace at path (or here when path is ""); a failure
// to enter the namespace is stored in *errp.
func inNS(path string, f func() error, errp *error) {
	if path == "" {
		if err := f(); err != nil {
			*errp = err
		}
		return
	}
	if err := ns.WithNetNSPath(path, func(ns.NetNS) error { return f() }); err != nil && *errp == nil {
		*errp = fmt.Errorf("enter netns %s: %w", path, err)
	}
}

func (s *Servers) start(p Port, line []byte, log *zap.Logger) error {
	addr := fmt.Sprintf(":%d", p.Port)
	switch p.Protocol {
	case corev1.ProtocolTCP, "":
		ln, err := net.Listen("tcp", addr)
		if err != nil {
			return fmt.Errorf("listen tcp %s: %w", addr, err)
		}
		s.add(ln.Close)
		s.wg.Add(1)
		go func() {
			defer s.wg.Done()
			for {
				c, err := ln.Accept()
				if err != nil {
					return
				}
				_ = c.SetWriteDeadline(time.Now().Add(2 * time.Second))
				_, _ = c.Write(withClient(line, c.RemoteAddr()))
				_ = c.Close()
			}
		}()
	case corev1.ProtocolUDP:
		pc, err := net.ListenPacket("udp", addr)
		if err != nil {
			return fmt.Errorf("listen udp %s: %w", addr, err)
		}
		s.add(pc.Close)
		s.wg.Add(1)
		go func() {
			defer s.wg.Done()
			buf := make([]byte, maxDatagram)
			for {
				n, from, err := pc.ReadFrom(buf)
				if err != nil {
					return
				}
				_, _ = pc.WriteTo(padTo(withClient(line, from), n), from)
			}
		}()
	case corev1.ProtocolSCTP:
		fd, err := syscall.Socket(syscall.AF_INET, syscall.SOCK_STREAM, syscall.IPPROTO_SCTP)
		if err == nil {
			_ = syscall.Close(fd)
			err = errors.New("SCTP servers are not implemented")
		}
		log.Info("skipping SCTP port", zap.Int32("port", p.Port), zap.Error(err))
	default:
		return fmt.Errorf("port %d: unknown protocol %q", p.Port, p.Protocol)
	}
	return nil
}

// withClient appends the second reply line, "client <ip:port>": the
// address the server saw the connection come from (after any NAT).
func withClient(line []byte, from net.Addr) []byte {
	return append(append([]byte(nil), line...), []byte("client "+from.String()+"\n")...)
}

// maxDatagram is the largest UDP payload over IPv4 (RFC 768 length,
// minus the IPv4 and UDP headers).
const maxDatagram = 65507

// padTo extends a UDP reply to the size n of the datagram it answers (a
// third line of dots), so that a large probe is answered as large: both
// directions then cross the path in IP fragments. Small probes get the
// reply as it is.
func padTo(reply []byte, n int) []byte {
	if n <= len(reply)+1 {
		return reply
	}
	pad := make([]byte, n-len(reply))
	for i := range pad {
		pad[i] = '.'
	}
	pad[len(pad)-1] = '\n'
	return append(reply, pad...)
}

func (s *Servers) add(c func() error) {
	s.mu.Lock()
	s.closers = append(s.closers, c)
	s.mu.Unlock()
}

// Close stops all listeners and waits for their goroutines to end.
func (s *Servers) Close() {
	if s == nil {
		return
	}
	s.mu.Lock()
	closers := s.closers
	s.closers = nil
	s.mu.Unlock()
	for _, c := range closers {
		_ = c()
	}
	s.wg.Wait()
}

// Outcome classifies a probe.
type Outcome string

const (
	// Connected: the server answered (Reply holds its line without "\n").
	Connected Outcome = "connected"
	// Refused: TCP RST or ICMP port/host unreachable came back.
	Refused Outcome = "refused"
	// TimedOut: nothing came back within the timeout.
	TimedOut Outcome = "timed out"
	// Failed: the probe could not be made (its namespace could not be
	// entered, a protocol or size it does not support); Err says why. It
	// says nothing about the network, so it is neither of the above.
	Failed Outcome = "probe failed"
)

// Result is the outcome of one probe.
type Result struct {
	Outcome Outcome
	// Reply is the first line the server sent, without the newline.
	Reply string
	// Client is the address ("ip:port") the server saw the probe come
	// from, after any NAT on the way; empty if the server did not say.
	Client string
	// Err is the underlying error for Refused, TimedOut and Failed.
	Err error
	// Bytes is the size of a UDP answer in bytes.
	Bytes int
}

// String renders the result as the CLI prints it: "connected <reply>",
// "refused", "timed out" or "probe failed".
func (r Result) String() string {
	if r.Outcome == Connected {
		return "connected " + r.Reply
	}
	return string(r.Outcome)
}

// Probe connects from the network namespace at netnsPath ("" for the
// current one) to host:port over proto, waits up to timeout for the reply
// line and classifies the outcome. For UDP it sends one datagram ("probe")
// and waits for the answer; an ICMP port unreachable surfaces as Refused.
func Probe(ctx context.Context, netnsPath, host string, port int, proto corev1.Protocol, timeout time.Duration) Result {
	return probeIn(ctx, netnsPath, host, port, proto, 0, timeout)
}

// ProbeDatagram is Probe over UDP with a datagram of size bytes (the
// "probe" line and padding; 6..65507), which an echo server answers with
// as many bytes (Result.Bytes). Datagrams above the path MTU travel in IP
// fragments both ways.
func ProbeDatagram(ctx context.Context, netnsPath, host string, port, size int, timeout time.Duration) Result {
	if size < len(probeLine) || size > maxDatagram {
		return Result{Outcome: Failed, Err: fmt.Errorf("probe: datagram size %d outside %d..%d", size, len(probeLine), maxDatagram)}
	}
	return probeIn(ctx, netnsPath, host, port, corev1.ProtocolUDP, size, timeout)
}

// probeLine starts every UDP probe.
const probeLine = "probe\n"

// probeIn runs probeHere inside the network namespace at netnsPath.
func probeIn(ctx context.Context, netnsPath, host string, port int, proto corev1.Protocol, size int, timeout time.Duration) Result {
	if timeout <= 0 {
		timeout = 2 * time.Second
	}
	var res Result
	var nsErr error
	inNS(netnsPath, func() error {
		res = probeHere(ctx, host, port, proto, size, timeout)
		return nil
	}, &nsErr)
	if nsErr != nil {
		return Result{Outcome: Failed, Err: nsErr}
	}
	return res
}

// probeHere probes from the current namespace; size is the UDP datagram's
// size (0: just the probe line).
func probeHere(ctx context.Context, host string, port int, proto corev1.Protocol, size int, timeout time.Duration) Result {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	deadline, _ := ctx.Deadline()
	addr := net.JoinHostPort(host, strconv.Itoa(port))
	var network string
	switch proto {
	case corev1.ProtocolTCP, "":
		network = "tcp"
	case corev1.ProtocolUDP:
		network = "udp"
	default:
		return Result{Outcome: Failed, Err: fmt.Errorf("probe: protocol %q not supported", proto)}
	}
	var d net.Dialer
	c, err := d.DialContext(ctx, network, addr)
	if err != nil {
		return classify(err)
	}
	defer c.Close()
	_ = c.SetDeadline(deadline)
	if network == "udp" {
		msg := make([]byte, max(size, len(probeLine)))
		copy(msg, probeLine)
		for i := len(probeLine); i < len(msg); i++ {
			msg[i] = 'x'
		}
		if _, err := c.Write(msg); err != nil {
			return classify(err)
		}
		// One read takes the whole answer: a datagram.
		buf := make([]byte, maxDatagram)
		n, err := c.Read(buf)
		if err != nil {
			return classify(err)
		}
		lines := strings.SplitN(string(buf[:n]), "\n", 3)
		res := Result{Outcome: Connected, Reply: strings.TrimRight(lines[0], "\r"), Bytes: n}
		if len(lines) > 1 && strings.HasPrefix(lines[1], "client ") {
			res.Client = strings.TrimSpace(strings.TrimPrefix(lines[1], "client "))
		}
		return res
	}
	r := bufio.NewReader(c)
	line, err := r.ReadString('\n')
	if err != nil && line == "" && !errors.Is(err, io.EOF) {
		return classify(err)
	}
	res := Result{Outcome: Connected, Reply: strings.TrimRight(line, "\r\n")}
	if second, _ := r.ReadString('\n'); strings.HasPrefix(second, "client ") {
		res.Client = strings.TrimSpace(strings.TrimPrefix(second, "client "))
	}
	return res
}

func classify(err error) Result {
	switch {
	case errors.Is(err, syscall.ECONNREFUSED), errors.Is(err, syscall.EHOSTUNREACH),
		errors.Is(err, syscall.ENETUNREACH), errors.Is(err, syscall.ECONNRESET):
		return Result{Outcome: Refused, Err: err}
	default:
		return Result{Outcome: TimedOut, Err: err}
	}
}
