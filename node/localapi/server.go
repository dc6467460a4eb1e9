package localapi

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/pprof"
	"sync/atomic"
	"time"

	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"

	"github.com/seine-net/seine/node/unixsock"
	cpv1alpha1 "github.com/seine-net/seine/policy/apis/controlplane/v1alpha1"
)

// Backend answers the API's questions (node/inspect implements it over the
// daemon's components).
type Backend interface {
	Version(ctx context.Context) (Version, error)
	AgentInfo(ctx context.Context) (AgentInfo, error)
	PodInterfaces() []PodInterface
	NetworkPolicies() []AgentPolicy
	AppliedToGroups() []*cpv1alpha1.AppliedToGroup
	AddressGroups() []*cpv1alpha1.AddressGroup
	// Services are the Service proxy's frontends (empty when the proxy
	// is off).
	Services(ctx context.Context) ([]ServiceFrontend, error)
	Flows(ctx context.Context, q FlowQuery) ([]Flow, error)
	TracePacket(ctx context.Context, req TraceRequest) (TraceResult, error)
	// SupportBundle writes a gzipped tar archive to w.
	SupportBundle(ctx context.Context, w io.Writer) error
}

// StatusError is an error with the HTTP status the API answers it with.
type StatusError struct {
	Code int
	Err  error
}

func (e *StatusError) Error() string { return e.Err.Error() }
func (e *StatusError) Unwrap() error { return e.Err }

// BadRequest is a StatusError 400.
func BadRequest(format string, a ...any) error {
	return &StatusError{Code: http.StatusBadRequest, Err: fmt.Errorf(format, a...)}
}

// NotFound is a StatusError 404.
func NotFound(format string, a ...any) error {
	return &StatusError{Code: http.StatusNotFound, Err: fmt.Errorf(format, a...)}
}

// Server serves the local API.
type Server struct {
	backend  atomic.Pointer[Backend]
	starting atomic.Pointer[func() string]
	level    zap.AtomicLevel
	probes   http.Handler
	log      *zap.Logger
}

// NewServer returns a server over backend; level is the daemon's logger
// level (changed by PUT /v1/loglevel), probes serves /healthz and /readyz.
// backend may be nil while the daemon starts (SetBackend gives it later):
// until then the log level, the probes and pprof are served, and every
// other route answers 503 Service Unavailable, saying what the daemon is
// doing (SetStarting).
func NewServer(backend Backend, level zap.AtomicLevel, probes http.Handler, log *zap.Logger) *Server {
	s := &Server{level: level, probes: probes, log: log}
	if backend != nil {
		s.SetBackend(backend)
	}
	return s
}

// SetBackend makes the server answer every route from b.
func (s *Server) SetBackend(b Backend) { s.backend.Store(&b) }

// SetStarting sets what a 503 says while there is no backend: fn returns
// what the daemon is doing, e.g. "start-up step ovsdb".
func (s *Server) SetStarting(fn func() string) { s.starting.Store(&fn) }

// errStarting is the 503 of a route that needs the backend.
func (s *Server) errStarting() error {
	what := "starting"
	if fn := s.starting.Load(); fn != nil {
		what = "starting: " + (*fn)()
	}
	return &StatusError{Code: http.StatusServiceUnavailable, Err: fmt.Errorf("the seine daemon is %s; "+
		"only log-level and its probes answer until it has started", what)}
}

// Serve listens on socket (mode 0600) and serves until ctx ends.
func (s *Server) Serve(ctx context.Context, socket string) error {
	lis, err := unixsock.Listen(ctx, socket, "API socket")
	if err != nil {
		return err
	}
	srv := &http.Server{Handler: s.Handler(), ReadHeaderTimeout: 10 * time.Second, WriteTimeout: ReadTimeout}
	go func() { <-ctx.Done(); _ = srv.Close() }()
	s.log.Info("local API listening", zap.String("socket", socket))
	if err := srv.Serve(lis); err != nil && !errors.Is(err, http.ErrServerClosed) {
		return fmt.Errorf("local API on %s: %w", socket, err)
	}
	return nil
}

// Handler routes the API.
func (s *Server) Handler() http.Handler {
	mux := http.NewServeMux()
	// get serves a route from the backend, or 503 while there is none.
	get := func(path string, fn func(r *http.Request, b Backend) (any, error)) {
		mux.HandleFunc("GET "+path, func(w http.ResponseWriter, r *http.Request) {
			b := s.backend.Load()
			if b == nil {
				s.reply(w, nil, s.errStarting())
				return
			}
			v, err := fn(r, *b)
			s.reply(w, v, err)
		})
	}
	get("/v1/version", func(r *http.Request, b Backend) (any, error) { return b.Version(r.Context()) })
	get("/v1/agentinfo", func(r *http.Request, b Backend) (any, error) { return b.AgentInfo(r.Context()) })
	get("/v1/podinterfaces", func(_ *http.Request, b Backend) (any, error) { return b.PodInterfaces(), nil })
	get("/v1/networkpolicies", func(_ *http.Request, b Backend) (any, error) { return b.NetworkPolicies(), nil })
	get("/v1/appliedtogroups", func(_ *http.Request, b Backend) (any, error) { return b.AppliedToGroups(), nil })
	get("/v1/addressgroups", func(_ *http.Request, b Backend) (any, error) { return b.AddressGroups(), nil })
	get("/v1/services", func(r *http.Request, b Backend) (any, error) { return b.Services(r.Context()) })
	get("/v1/ovsflows", func(r *http.Request, b Backend) (any, error) {
		q := r.URL.Query()
		return b.Flows(r.Context(), FlowQuery{Pod: q.Get("pod"), NetworkPolicy: q.Get("networkpolicy"),
			Service: q.Get("service"), Table: q.Get("table")})
	})
	mux.HandleFunc("GET /v1/loglevel", func(w http.ResponseWriter, _ *http.Request) {
		s.reply(w, LogLevel{Level: s.level.Level().String()}, nil)
	})
	mux.HandleFunc("PUT /v1/loglevel", func(w http.ResponseWriter, r *http.Request) {
		var in LogLevel
		if err := json.NewDecoder(r.Body).Decode(&in); err != nil {
			s.reply(w, nil, BadRequest("log level: %v", err))
			return
		}
		lvl, err := zapcore.ParseLevel(in.Level)
		if err != nil || lvl < zapcore.DebugLevel || lvl > zapcore.ErrorLevel {
			s.reply(w, nil, BadRequest("log level %q: want debug, info, warn or error", in.Level))
			return
		}
		old := s.level.Level()
		s.level.SetLevel(lvl)
		s.log.Warn("log level changed", zap.Stringer("from", old), zap.Stringer("to", lvl))
		s.reply(w, LogLevel{Level: lvl.String()}, nil)
	})
	mux.HandleFunc("POST /v1/trace-packet", func(w http.ResponseWriter, r *http.Request) {
		var in TraceRequest
		if err := json.NewDecoder(r.Body).Decode(&in); err != nil {
			s.reply(w, nil, BadRequest("trace request: %v", err))
			return
		}
		b := s.backend.Load()
		if b == nil {
			s.reply(w, nil, s.errStarting())
			return
		}
		res, err := (*b).TracePacket(r.Context(), in)
		s.reply(w, res, err)
	})
	mux.HandleFunc("GET /v1/supportbundle", func(w http.ResponseWriter, r *http.Request) {
		b := s.backend.Load()
		if b == nil {
			s.reply(w, nil, s.errStarting())
			return
		}
		w.Header().Set("Content-Type", "application/gzip")
		if err := (*b).SupportBundle(r.Context(), w); err != nil {
			// The archive may be half written; the client sees a broken
			// gzip stream and this log line says why.
			s.log.Error("support bundle failed", zap.Error(err))
		}
	})
	if s.probes != nil {
		mux.Handle("/healthz", s.probes)
		mux.Handle("/readyz", s.probes)
	}
	mux.HandleFunc("/debug/pprof/", pprof.Index)
	mux.HandleFunc("/debug/pprof/profile", pprof.Profile)
	mux.HandleFunc("/debug/pprof/symbol", pprof.Symbol)
	mux.HandleFunc("/debug/pprof/trace", pprof.Trace)
	return mux
}

func (s *Server) reply(w http.ResponseWriter, v any, err error) {
	w.Header().Set("Content-Type", "application/json")
	if err != nil {
		code := http.StatusInternalServerError
		var se *StatusError
		if errors.As(err, &se) {
			code = se.Code
		}
		w.WriteHeader(code)
		_ = json.NewEncoder(w).Encode(Error{Error: err.Error()})
		return
	}
	_ = json.NewEncoder(w).Encode(v)
}
