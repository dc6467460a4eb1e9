// Package server is the node daemon's side of the seine CNI protocol
// (package wire): a server on a root-only unix socket that validates each
// invocation the seine CNI plugin forwards, hands it to a Backend, and
// returns the result encoded in the cniVersion the runtime asked for, or a
// CNI error.
package server

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"strconv"
	"sync"
	"time"

	"github.com/containernetworking/cni/pkg/types"
	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"

	"github.com/seine-net/seine/node/cni/wire"
	"github.com/seine-net/seine/node/unixsock"
)

// DefaultShutdownGrace is how long Serve waits for in-flight requests after
// its context ends before cutting them off.
const DefaultShutdownGrace = 10 * time.Second

// Server serves the seine CNI protocol on a unix socket.
type Server struct {
	backend Backend
	log     *zap.Logger
	locks   *opLock
	grace   time.Duration
	watch   Watchdog

	duration *prometheus.HistogramVec
	errors   *prometheus.CounterVec
	waiting  *prometheus.GaugeVec
}

// Option configures a Server.
type Option func(*Server)

// WithRegistry registers the server's metrics on reg:
// seine_cni_request_duration_seconds, a histogram labelled by command (ADD,
// DEL, CHECK, STATUS, GC, or "unknown" for anything else) and result
// ("success", or the CNI error code as a decimal string), and
// seine_cni_errors_total, a counter of failed requests
// labelled by command and code, and seine_cni_requests_waiting, a gauge of
// the requests waiting for their turn (behind another command for the
// same container, or around a GC), by command. Without this option the
// metrics are collected but not exported.
func WithRegistry(reg *prometheus.Registry) Option {
	return func(s *Server) {
		if err := reg.Register(s.waiting); err != nil {
			var are prometheus.AlreadyRegisteredError
			if errors.As(err, &are) {
				if existing, ok := are.ExistingCollector.(*prometheus.GaugeVec); ok {
					s.waiting = existing
				}
			}
		}
		if err := reg.Register(s.errors); err != nil {
			var are prometheus.AlreadyRegisteredError
			if errors.As(err, &are) {
				if existing, ok := are.ExistingCollector.(*prometheus.CounterVec); ok {
					s.errors = existing
				}
			}
		}
		if err := reg.Register(s.duration); err != nil {
			var are prometheus.AlreadyRegisteredError
			if errors.As(err, &are) {
				if existing, ok := are.ExistingCollector.(*prometheus.HistogramVec); ok {
					s.duration = existing
					return
				}
			}
			s.log.Error("cannot register CNI metrics", zap.Error(err))
		}
	}
}

// Watchdog is told of every request from its decoding to its answer
// (health.Watchdog): a request that never ends is a stuck daemon.
type Watchdog interface {
	// Start records the start of the work named what; done its end.
	Start(what string) (done func())
}

// WithWatchdog tells w of every request.
func WithWatchdog(w Watchdog) Option {
	return func(s *Server) { s.watch = w }
}

// WithShutdownGrace sets how long Serve waits for in-flight requests once
// its context ends (default DefaultShutdownGrace).
func WithShutdownGrace(d time.Duration) Option {
	return func(s *Server) { s.grace = d }
}

// New returns a Server that hands requests to backend and logs to log.
func New(backend Backend, log *zap.Logger, opts ...Option) *Server {
	if log == nil {
		log = zap.NewNop()
	}
	s := &Server{
		backend: backend,
		log:     log,
		locks:   newOpLock(),
		grace:   DefaultShutdownGrace,
		duration: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "seine_cni_request_duration_seconds",
			Help:    "Time the daemon took to serve one CNI request, by command and result (success or CNI error code).",
			Buckets: []float64{.005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 30, 60, 120},
		}, []string{"command", "result"}),
		errors: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "seine_cni_errors_total",
			Help: "CNI requests that failed, by command and CNI error code.",
		}, []string{"command", "code"}),
		waiting: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "seine_cni_requests_waiting",
			Help: "CNI requests waiting for their turn: behind another command for the same container, or around a GC. By command.",
		}, []string{"command"}),
	}
	for _, o := range opts {
		o(s)
	}
	return s
}

// heartbeat rewrites the heartbeat beside socketPath (wire.AlivePath)
// now and every wire.AliveInterval until ctx ends, so that STATUS keeps
// answering success while the daemon restarts. The file stays when the
// daemon stops: that is what it is for. A failing write is logged once
// until one succeeds again.
func (s *Server) heartbeat(ctx context.Context, socketPath string) {
	path := wire.AlivePath(socketPath)
	t := time.NewTicker(wire.AliveInterval)
	defer t.Stop()
	failing := false
	for {
		now := time.Now()
		err := os.WriteFile(path, nil, 0o600)
		if err == nil {
			err = os.Chtimes(path, now, now) // even when nothing was truncated
		}
		switch {
		case err != nil && !failing:
			s.log.Warn("cni server: writing the heartbeat failed", zap.String("file", path), zap.Error(err))
		case err == nil && failing:
			s.log.Info("cni server: heartbeat written again", zap.String("file", path))
		}
		failing = err != nil
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// Serve listens on socketPath and serves the seine CNI protocol (package
// wire: one JSON request and one JSON response per connection) until ctx
// ends; then it stops accepting, waits the shutdown grace for in-flight
// requests, cancels the rest, waits as long again for them to go, and
// returns nil (or the error that stopped it accepting). It creates the
// socket's parent directory with mode 0750, removes a stale socket left by
// a previous daemon (but fails if a live server still answers on it, or if
// the path is not a socket), and sets the socket's mode to 0600 so that
// only root can connect.
func (s *Server) Serve(ctx context.Context, socketPath string) error {
	lis, err := unixsock.Listen(ctx, socketPath, "CNI socket")
	if err != nil {
		return err
	}
	s.log.Info("cni server listening", zap.String("socket", socketPath))
	stopAccepting := context.AfterFunc(ctx, func() { lis.Close() })
	defer stopAccepting()
	var beating sync.WaitGroup
	beating.Go(func() { s.heartbeat(ctx, socketPath) })
	defer beating.Wait()

	// Requests outlive ctx by the grace period, then are cancelled.
	reqCtx, cancelRequests := context.WithCancel(context.WithoutCancel(ctx))
	defer cancelRequests()
	var inflight sync.WaitGroup
	var serveErr error
	for pause := 5 * time.Millisecond; ; {
		conn, err := lis.Accept()
		if err != nil {
			if ctx.Err() != nil {
				break
			}
			if errors.Is(err, net.ErrClosed) {
				serveErr = fmt.Errorf("serving CNI on %s: %w", socketPath, err)
				break
			}
			// Out of descriptors or memory: back off and retry,
			// until ctx ends.
			s.log.Warn("cni server: accept failed, retrying", zap.Error(err), zap.Duration("pause", pause))
			time.Sleep(pause)
			pause = min(2*pause, time.Second)
			continue
		}
		pause = 5 * time.Millisecond
		inflight.Go(func() { s.serveConn(reqCtx, conn) })
	}
	lis.Close()

	drained := make(chan struct{})
	go func() {
		inflight.Wait()
		close(drained)
	}()
	select {
	case <-drained:
	case <-time.After(s.grace):
		s.log.Warn("cni server: in-flight requests did not finish in time, cancelling them", zap.Duration("grace", s.grace))
		cancelRequests()
		select {
		case <-drained:
		case <-time.After(s.grace):
			// A backend call that ignores its context: leave it.
			s.log.Error("cni server: cancelled requests did not return, stopping without them", zap.Duration("grace", s.grace))
		}
	}
	s.log.Info("cni server stopped", zap.String("socket", socketPath))
	return serveErr
}

// Bounds on one connection's exchange, apart from the work itself: reading
// the request and writing the response.
const (
	readTimeout  = 10 * time.Second
	writeTimeout = 10 * time.Second
)

// serveConn serves the one request conn carries. The request's context
// ends when the plugin closes its side before the answer (the runtime gave
// up on it), so that the backend abandons and rolls back the work.
func (s *Server) serveConn(ctx context.Context, conn net.Conn) {
	defer conn.Close()
	// Cancelling ctx (shutdown) also ends a read still in progress.
	stop := context.AfterFunc(ctx, func() { _ = conn.SetReadDeadline(time.Unix(1, 0)) })
	defer stop()
	var in wire.Request
	_ = conn.SetReadDeadline(time.Now().Add(readTimeout))
	dec := json.NewDecoder(io.LimitReader(conn, wire.MaxMessageBytes))
	derr := dec.Decode(&in)
	if errors.Is(derr, io.EOF) {
		// Connected and closed without a byte: a liveness probe, such
		// as a second daemon's check that this socket is in use.
		s.log.Debug("cni server: connection closed without a request")
		return
	}
	var resp *wire.Response
	if derr != nil {
		resp = s.handle(ctx, &in, derr)
	} else {
		_ = conn.SetReadDeadline(time.Time{})
		ctx, cancel := context.WithCancel(ctx)
		go func() {
			// The plugin sends nothing more: the read fails when it
			// closes or shuts down its side, or when serveConn
			// closes the connection.
			var b [512]byte
			for {
				if _, err := conn.Read(b[:]); err != nil {
					break
				}
			}
			cancel()
		}()
		resp = s.handle(ctx, &in, nil)
		cancel()
	}
	out, err := json.Marshal(resp)
	if err != nil {
		s.log.Error("cni server: encoding response", zap.Error(err))
		return
	}
	_ = conn.SetWriteDeadline(time.Now().Add(writeTimeout))
	if _, err := conn.Write(out); err != nil {
		s.log.Warn("cni server: the plugin left before the answer", zap.String("command", in.Command),
			zap.String("container_id", in.ContainerID), zap.Error(err))
	}
}

// handle runs one command end to end; errors travel in the response.
// decodeErr is why in could not be decoded, if it could not.
func (s *Server) handle(ctx context.Context, in *wire.Request, decodeErr error) *wire.Response {
	start := time.Now()
	var req *Request
	var out []byte
	var err error
	if decodeErr != nil {
		err = &Error{Code: types.ErrDecodingFailure, Msg: "malformed seine CNI request", Err: decodeErr}
	} else if r, perr := parseRequest(in); perr != nil {
		err = perr
	} else {
		req = r
		if s.watch != nil {
			done := s.watch.Start("cni " + in.Command + " " + in.ContainerID)
			out, err = s.dispatch(ctx, req)
			done()
		} else {
			out, err = s.dispatch(ctx, req)
		}
	}
	// The command labels metrics: only the five the spec names, so a
	// client cannot make up label values.
	cmd := in.Command
	if !wire.Forwarded(cmd) {
		cmd = "unknown"
	}
	cerr := toCNIError(err)
	elapsed := time.Since(start)

	result := "success"
	if cerr != nil {
		result = strconv.FormatUint(uint64(cerr.Code), 10)
		s.errors.WithLabelValues(cmd, result).Inc()
	}
	s.duration.WithLabelValues(cmd, result).Observe(elapsed.Seconds())

	fields := []zap.Field{
		zap.String("command", cmd),
		zap.String("container_id", in.ContainerID),
		zap.Float64("duration_ms", float64(elapsed.Microseconds())/1000),
	}
	if req != nil && req.PodName != "" {
		fields = append(fields, zap.String("pod", req.PodNamespace+"/"+req.PodName))
	}
	if cerr == nil {
		s.log.Info("cni request", append(fields, zap.String("result", "success"))...)
		return &wire.Response{Result: out}
	}
	msg, details := cerr.wireMsgDetails()
	s.log.Warn("cni request", append(fields,
		zap.String("result", "error"),
		zap.Uint("error_code", cerr.Code),
		zap.String("error", msg),
		zap.String("error_details", details))...)
	return &wire.Response{Error: &wire.Error{Code: cerr.Code, Msg: msg, Details: details}}
}

// dispatch takes the ordering lock for req and calls the backend; it
// returns the encoded result for ADD and nil otherwise.
func (s *Server) dispatch(ctx context.Context, req *Request) ([]byte, error) {
	var unlock func()
	var err error
	waiting := s.waiting.WithLabelValues(req.Command) // parseRequest admits only the spec's commands
	waiting.Inc()
	switch req.Command {
	case CmdGC:
		unlock, err = s.locks.lockExclusive(ctx)
	case CmdStatus:
		unlock = func() {}
	default:
		unlock, err = s.locks.lockKey(ctx, req.ContainerID)
	}
	waiting.Dec()
	if err != nil {
		return nil, &Error{Code: types.ErrTryAgainLater, Msg: "request abandoned while waiting for another operation on the same container", Err: err}
	}
	defer unlock()

	switch req.Command {
	case CmdAdd:
		res, err := s.backend.Add(ctx, req)
		if err != nil {
			return nil, err
		}
		out, perr := encodeResult(res, req.NetConf.CNIVersion)
		if perr != nil {
			return nil, perr
		}
		return out, nil
	case CmdDel:
		return nil, s.backend.Del(ctx, req)
	case CmdCheck:
		prev, perr := prevResult(req)
		if perr != nil {
			return nil, perr
		}
		return nil, s.backend.Check(ctx, req, prev)
	case CmdStatus:
		return nil, s.backend.Status(ctx)
	case CmdGC:
		return nil, s.backend.GC(ctx, req, req.NetConf.ValidAttachments)
	}
	// parseRequest admits only the commands above (wire.Forwarded): one
	// forwarded without a case here is this daemon's fault, not the
	// runtime's.
	return nil, &Error{Code: ErrCodeInternal, Msg: fmt.Sprintf("CNI command %q is forwarded but has no handler in this daemon", req.Command)}
}

// toCNIError maps err to the error sent back: an *Error (anywhere in the
// chain) keeps its code, a *types.Error keeps its code, and anything else
// becomes ErrCodeInternal with err's text as the message.
func toCNIError(err error) *Error {
	if err == nil {
		return nil
	}
	var e *Error
	if errors.As(err, &e) {
		return e
	}
	var te *types.Error
	if errors.As(err, &te) {
		return &Error{Code: te.Code, Msg: te.Msg, Details: te.Details}
	}
	return &Error{Code: ErrCodeInternal, Msg: err.Error()}
}
