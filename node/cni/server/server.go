// Package server is the node daemon's side of the seine CNI protocol: a gRPC
// server on a root-only unix socket that validates each invocation the seine
// CNI plugin forwards, hands it to a Backend, and returns the result encoded
// in the cniVersion the runtime asked for, or a CNI error.
package server

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/containernetworking/cni/pkg/types"
	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"
	"google.golang.org/grpc"

	"github.com/seine-net/seine/node/cni/cnipb"
	"github.com/seine-net/seine/node/unixsock"
)

// DefaultShutdownGrace is how long Serve waits for in-flight requests after
// its context ends before cutting them off.
const DefaultShutdownGrace = 10 * time.Second

// Server serves the gRPC CNI service (seine.cni.v1.CNI) on a unix socket.
type Server struct {
	cnipb.UnimplementedCNIServer

	backend Backend
	log     *zap.Logger
	locks   *opLock
	grace   time.Duration

	duration *prometheus.HistogramVec
	errors   *prometheus.CounterVec
}

// Option configures a Server.
type Option func(*Server)

// WithRegistry registers the server's metrics on reg:
// seine_cni_request_duration_seconds, a histogram labelled by command (ADD,
// DEL, CHECK, STATUS, GC) and result ("success", or the CNI error code as a
// decimal string), and seine_cni_errors_total, a counter of failed requests
// labelled by command and code. Without this option the metrics are
// collected but not exported.
func WithRegistry(reg *prometheus.Registry) Option {
	return func(s *Server) {
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
	}
	for _, o := range opts {
		o(s)
	}
	return s
}

// Serve listens on socketPath and serves until ctx ends, then stops
// gracefully (waiting at most the shutdown grace for in-flight requests) and
// returns nil. It creates the socket's parent directory with mode 0750,
// removes a stale socket left by a previous daemon (but fails if a live
// server still answers on it, or if the path is not a socket), and sets the
// socket's mode to 0600 so that only root can connect.
func (s *Server) Serve(ctx context.Context, socketPath string) error {
	lis, err := unixsock.Listen(ctx, socketPath, "CNI socket")
	if err != nil {
		return err
	}
	gs := grpc.NewServer()
	cnipb.RegisterCNIServer(gs, s)

	errc := make(chan error, 1)
	go func() { errc <- gs.Serve(lis) }()
	s.log.Info("cni server listening", zap.String("socket", socketPath))

	select {
	case err := <-errc:
		return fmt.Errorf("serving CNI on %s: %w", socketPath, err)
	case <-ctx.Done():
	}
	stopped := make(chan struct{})
	go func() {
		gs.GracefulStop()
		close(stopped)
	}()
	select {
	case <-stopped:
	case <-time.After(s.grace):
		s.log.Warn("cni server: in-flight requests did not finish in time, stopping", zap.Duration("grace", s.grace))
		gs.Stop()
		<-stopped
	}
	<-errc
	s.log.Info("cni server stopped", zap.String("socket", socketPath))
	return nil
}

// CmdAdd implements cnipb.CNIServer.
func (s *Server) CmdAdd(ctx context.Context, in *cnipb.CmdRequest) (*cnipb.CmdResponse, error) {
	return s.handle(ctx, CmdAdd, in), nil
}

// CmdDel implements cnipb.CNIServer.
func (s *Server) CmdDel(ctx context.Context, in *cnipb.CmdRequest) (*cnipb.CmdResponse, error) {
	return s.handle(ctx, CmdDel, in), nil
}

// CmdCheck implements cnipb.CNIServer.
func (s *Server) CmdCheck(ctx context.Context, in *cnipb.CmdRequest) (*cnipb.CmdResponse, error) {
	return s.handle(ctx, CmdCheck, in), nil
}

// CmdGC implements cnipb.CNIServer.
func (s *Server) CmdGC(ctx context.Context, in *cnipb.CmdRequest) (*cnipb.CmdResponse, error) {
	return s.handle(ctx, CmdGC, in), nil
}

// CmdStatus implements cnipb.CNIServer.
func (s *Server) CmdStatus(ctx context.Context, in *cnipb.StatusRequest) (*cnipb.CmdResponse, error) {
	return s.handle(ctx, CmdStatus, &cnipb.CmdRequest{NetworkConfiguration: in.GetNetworkConfiguration()}), nil
}

// handle runs one command end to end and never fails at the gRPC level: CNI
// errors travel in the response.
func (s *Server) handle(ctx context.Context, cmd string, in *cnipb.CmdRequest) *cnipb.CmdResponse {
	start := time.Now()
	req, perr := parseRequest(cmd, in)
	var out []byte
	var err error
	if perr != nil {
		err = perr
	} else {
		out, err = s.dispatch(ctx, req)
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
		zap.String("container_id", in.GetContainerId()),
		zap.Float64("duration_ms", float64(elapsed.Microseconds())/1000),
	}
	if req != nil && req.PodName != "" {
		fields = append(fields, zap.String("pod", req.PodNamespace+"/"+req.PodName))
	}
	if cerr == nil {
		s.log.Info("cni request", append(fields, zap.String("result", "success"))...)
		return &cnipb.CmdResponse{CniResult: out}
	}
	msg, details := cerr.wireMsgDetails()
	s.log.Warn("cni request", append(fields,
		zap.String("result", "error"),
		zap.Uint("error_code", cerr.Code),
		zap.String("error", msg),
		zap.String("error_details", details))...)
	return &cnipb.CmdResponse{Error: &cnipb.Error{Code: uint32(cerr.Code), Msg: msg, Details: details}}
}

// dispatch takes the ordering lock for req and calls the backend; it
// returns the encoded result for ADD and nil otherwise.
func (s *Server) dispatch(ctx context.Context, req *Request) ([]byte, error) {
	var unlock func()
	var err error
	switch req.Command {
	case CmdGC:
		unlock, err = s.locks.lockExclusive(ctx)
	case CmdStatus:
		unlock = func() {}
	default:
		unlock, err = s.locks.lockKey(ctx, req.ContainerID)
	}
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
	return nil, &Error{Code: types.ErrInvalidEnvironmentVariables, Msg: fmt.Sprintf("unknown CNI command %q", req.Command)}
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
