// Package server runs the two listeners every kurz service has: a gRPC server
// (health, reflection, OpenTelemetry, keepalive) and an HTTP server for
// /healthz, /readyz and /metrics, plus whatever public routes the service adds.
// A public service moves the ops routes to a third, internal listener
// (Config.OpsAddr). The listener that serves the ops routes answers only
// Host names no web page can rebind to it (opsHosts). It owns graceful shutdown, in a fixed order: readiness
// off, HTTP drained, gRPC drained, ops listener closed, then the service's
// Lifecycle closed (stores, peers, background work, last telemetry).
package server

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/http/pprof"
	"net/netip"
	"runtime"
	"runtime/debug"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/keepalive"
	"google.golang.org/grpc/reflection"
	"google.golang.org/grpc/status"
	"google.golang.org/grpc/tap"

	"kurz.dev/pkg/clientip"
	"kurz.dev/pkg/grpcclient"
	"kurz.dev/pkg/telemetry"
)

// Config is where a service listens, what it reports, and how long it may
// take to stop.
type Config struct {
	GRPCAddr string
	HTTPAddr string
	// OpsAddr, when set, is where /readyz, /metrics, /healthz and pprof are
	// served instead of HTTPAddr, which then answers /healthz only: a public
	// listener must not expose metrics or let strangers probe readiness.
	// Empty keeps them on HTTPAddr (services that are internal already).
	OpsAddr string
	// OpsAllowedHosts are the Host names, besides IP addresses, localhost
	// and Kubernetes Service names, that the listener serving the ops
	// routes answers (see opsHosts): a name, or ".example.internal" for
	// every name under it. Entries are checked by CheckAllowedHosts.
	OpsAllowedHosts []string
	Version         string
	Telemetry       telemetry.Config
	// ShutdownTimeout bounds the drain of in-flight requests on SIGTERM; keep
	// it below the pod's terminationGracePeriodSeconds.
	ShutdownTimeout time.Duration
	// ShutdownDelay is how long a replica keeps serving after SIGTERM while
	// it reports not ready (HTTP /readyz 503, gRPC health NOT_SERVING), so
	// load balancers and clients stop sending before its listeners close.
	// Set it above the balancers' probe period; zero closes at once.
	ShutdownDelay time.Duration
	// ReadinessInterval is how often the readiness checks run, in the
	// background; the gRPC health status and /readyz answer their last
	// result, so probes never ping a dependency themselves.
	ReadinessInterval time.Duration
	// Pprof registers net/http/pprof under /debug/pprof/ (on the ops
	// listener when there is one).
	Pprof bool
	// HTTP bounds what one client can hold on the HTTP listener.
	HTTP HTTPLimits
	// GRPCMaxRecvMsgSize bounds one request message on the gRPC listener;
	// a larger one is refused with RESOURCE_EXHAUSTED. Zero means
	// DefaultGRPCMaxRecvMsgSize.
	GRPCMaxRecvMsgSize int
	// GRPCMaxCalls bounds the gRPC calls the server holds at once, over all
	// its connections; one more is refused with UNAVAILABLE before its
	// goroutine starts. Zero means as many as fit a quarter of the Go
	// memory limit at GRPCMaxRecvMsgSize each (GRPCMaxCallsFor).
	GRPCMaxCalls int
	// GRPCMaxConnections bounds the gRPC listener's open connections (see
	// guardGRPCConns); zero means DefaultGRPCMaxConnections.
	GRPCMaxConnections int
	// GRPCAuthenticate, when set, checks a call's credentials in its
	// headers (svcauth.Keys.Tap) when they arrive, before the call takes a
	// place at the gate (GRPCMaxCalls) or any of its request is read: a
	// call it refuses is answered with its error at once, its request
	// discarded as it arrives, and counted in kurz.grpc.calls.refused
	// (reason unauthenticated). The context it returns is the call's.
	GRPCAuthenticate tap.ServerInHandle
	// StreamWorkers is the number of long-lived goroutines that serve gRPC
	// calls; zero means StreamWorkersPerCore for each core (GOMAXPROCS).
	StreamWorkers int
	// MaxConnectionAge closes each gRPC connection (gracefully) this long
	// after it opened, so clients resolving the service's addresses (a
	// headless Service: dns:///) find new replicas; zero means
	// DefaultMaxConnectionAge.
	MaxConnectionAge time.Duration
}

// DefaultMaxConnectionAge is a gRPC connection's lifetime when Config sets
// none. grpc-go's DNS resolver looks a name up again only when a
// connection ends (at most every 30 s), so this bounds how long a replica
// added by a scale-out waits for its first call from an existing client:
// with the 10 minutes it once was, a limiter scaled out under a surge sat
// idle while the old pods saturated.
const DefaultMaxConnectionAge = time.Minute

// MaxConcurrentStreams bounds the calls one gRPC connection carries at
// once (HTTP/2 SETTINGS_MAX_CONCURRENT_STREAMS, net/http's own default);
// a client with more waits for a stream. kurz's clients multiplex far
// fewer on each connection.
const MaxConcurrentStreams = 250

// MaxHeaderListSize bounds a gRPC call's decoded headers (metadata), in
// bytes as HTTP/2 counts them: kurz's calls carry a few hundred.
const MaxHeaderListSize = 16 << 10

// StreamWorkersPerCore is the default number of gRPC stream workers per core.
// A call waits on Redis or a peer for most of its life, so a worker per core
// was busy whenever a call arrived and nearly every call got a fresh
// goroutine whose stack grew on each call.
const StreamWorkersPerCore = 32

// streamWorkers is cfg's number of stream workers.
func (cfg Config) streamWorkers() uint32 {
	if cfg.StreamWorkers > 0 {
		return uint32(cfg.StreamWorkers)
	}
	return uint32(StreamWorkersPerCore * runtime.GOMAXPROCS(0))
}

// HTTPLimits bound the time and memory one client can hold on the HTTP
// listener, so slow or oversized requests cannot pin goroutines and
// connections. Zero fields take the defaults below; tests shorten them.
type HTTPLimits struct {
	// ReadHeaderTimeout bounds reading the request line and header: a client
	// that trickles its header (slowloris) is disconnected after it.
	// Default 5s.
	ReadHeaderTimeout time.Duration
	// ReadTimeout bounds reading the whole request, body included: a body
	// sent a byte at a time is cut after it. Default 30s.
	ReadTimeout time.Duration
	// WriteTimeout bounds the response, from the end of the request header
	// to the last byte written. Default 30s; net/http/pprof extends it by
	// the length of a profile it is asked for.
	WriteTimeout time.Duration
	// IdleTimeout is how long a keep-alive connection may wait for its next
	// request. Default 2m.
	IdleTimeout time.Duration
	// MaxHeaderBytes bounds the request line and header; net/http answers
	// 431 beyond (it reads up to 4 KiB more before deciding). Default
	// DefaultMaxHeaderBytes.
	MaxHeaderBytes int
	// MaxConnections bounds the listener's open connections (see
	// connGuard): at it, a new one closes the oldest quiet one. Default
	// DefaultMaxConnections.
	MaxConnections int
	// MaxConnectionsPerClient bounds one client's open connections (an
	// address; an IPv6 client by its prefix, see KeyClientConnections):
	// past it, its new one is refused. Default
	// DefaultMaxConnectionsPerClient.
	MaxConnectionsPerClient int
}

// Defaults of the listener bounds.
const (
	DefaultReadHeaderTimeout = 5 * time.Second
	DefaultReadTimeout       = 30 * time.Second
	DefaultWriteTimeout      = 30 * time.Second
	DefaultIdleTimeout       = 2 * time.Minute
	// DefaultMaxHeaderBytes is 64 KiB: generous for cookies and tokens, a
	// sixteenth of net/http's own default.
	DefaultMaxHeaderBytes = 64 << 10
	// SmallGRPCMaxRecvMsgSize is the receive bound of the services whose
	// calls are small (analytics' stats queries; the redirect's and the
	// gateway's gRPC listeners serve health and reflection alone): a call
	// held at the gate (GRPCMaxCalls) then holds at most this much of a
	// request arriving, not 4 MiB.
	SmallGRPCMaxRecvMsgSize = 64 << 10
	// DefaultGRPCMaxRecvMsgSize is gRPC's own default, 4 MiB, stated here so
	// the bound does not depend on a library default: the shortener's
	// (BatchCreateLinks carries up to 1,000 links).
	DefaultGRPCMaxRecvMsgSize = 4 << 20
	// LimiterGRPCMaxRecvMsgSize is the limiter's receive bound: a CheckQuota
	// or ExplainQuota at the limiter's own maxima (32 descriptors of a
	// 64-byte name and a 1 KiB value) is ~36 KB; an Envoy ShouldRateLimit
	// carries header values, which Envoy bounds at 60 KiB by default
	// (max_request_headers_kb), so a descriptor of one padded header fits;
	// the analytics consumer's CheckQuotas carry 100 checks (~20 KB), and
	// pkg/quota splits batches at quota.MaxBatch. The limiter serves
	// bursts of concurrent calls, each a decision: the bound is small so
	// that a quarter of a 200 MiB GOMEMLIMIT holds 800 of them (at 256
	// KiB, 200: the notes' race of 500 concurrent calls was refused; at 4
	// MiB, 12).
	LimiterGRPCMaxRecvMsgSize = SmallGRPCMaxRecvMsgSize
)

// GRPCStrangerRecvSize is the request size a caller without credentials
// can make a server hold per call, the size its derived call bound counts
// (GRPCMaxCallsFor): its receive bound, unless it authenticates calls in
// their headers (Config.GRPCAuthenticate), which refuses such a caller
// before any of its request is read. Only kurz's own services, holding the
// service key, then send requests, and those that can be large (the
// gateway's batches and imports to the shortener) are bounded by their
// sender (KURZ_GATEWAY_MAX_BULK_REQUESTS per gateway replica); the rest
// are small. Counted at the receive bound, the shortener held 12 calls.
func GRPCStrangerRecvSize(recvSize int, authenticated bool) int {
	if authenticated {
		return min(recvSize, SmallGRPCMaxRecvMsgSize)
	}
	return recvSize
}

// withDefaults fills the zero fields.
func (l HTTPLimits) withDefaults() HTTPLimits {
	orDefault := func(d *time.Duration, def time.Duration) {
		if *d <= 0 {
			*d = def
		}
	}
	orDefault(&l.ReadHeaderTimeout, DefaultReadHeaderTimeout)
	orDefault(&l.ReadTimeout, DefaultReadTimeout)
	orDefault(&l.WriteTimeout, DefaultWriteTimeout)
	orDefault(&l.IdleTimeout, DefaultIdleTimeout)
	if l.MaxHeaderBytes <= 0 {
		l.MaxHeaderBytes = DefaultMaxHeaderBytes
	}
	if l.MaxConnections <= 0 {
		l.MaxConnections = DefaultMaxConnections
	}
	if l.MaxConnectionsPerClient <= 0 {
		l.MaxConnectionsPerClient = DefaultMaxConnectionsPerClient
	}
	return l
}

// Check reports whether one dependency is usable; nil means ready.
type Check func(ctx context.Context) error

type namedCheck struct {
	name  string
	check Check
	soft  bool
}

// readiness is the result of one run of the readiness checks.
type readiness struct {
	checks map[string]string
	ok     bool
}

// Server is one service's listeners. Register gRPC services through it
// (RegisterService: it is a grpc.ServiceRegistrar) and HTTP routes on Mux
// before calling Run.
type Server struct {
	// GRPC is the gRPC server; health and reflection are already
	// registered. Services register through the Server (a
	// grpc.ServiceRegistrar; see RegisterService), not on GRPC: Run refuses
	// to start with a service registered on GRPC directly.
	GRPC *grpc.Server
	// Mux is the HTTP router; /healthz is already on it, and /readyz and
	// /metrics too unless they have their own listener (Config.OpsAddr).
	Mux *http.ServeMux
	// Telemetry holds the tracer and meter providers for the service's own
	// instruments.
	Telemetry *telemetry.Telemetry

	name     string
	cfg      Config
	log      *slog.Logger
	health   *health.Server
	grpcLis  net.Listener
	httpLis  net.Listener
	httpSrv  *http.Server
	hosts    opsHosts
	conns    *connGuard
	opsLis   net.Listener // nil: the ops routes are on httpLis
	opsSrv   *http.Server
	checks   []namedCheck
	lc       *Lifecycle
	draining atomic.Bool
	// ready is the last result of the readiness checks; nil before the first.
	ready atomic.Pointer[readiness]
	// inner is the HTTP handler the telemetry wraps; traceTrust, when set,
	// tells the requests whose trace headers are believed.
	inner      http.Handler
	traceTrust func(*http.Request) bool
	// gate bounds the gRPC calls held at once; calls times them. Both wrap
	// every service registered through the Server (registered, by name).
	gate       *callGate
	calls      *telemetry.ServerCalls
	registered map[string]bool
}

// New sets up telemetry, listens on the addresses (":0" picks a free port;
// see GRPCAddr, HTTPAddr and OpsAddr) and builds the servers, all owned by
// lc: the listeners close with it and the telemetry is flushed after
// everything else in it. Nothing is served until Run, which closes lc after
// the drain; a service that gives up before Run closes lc instead.
func New(ctx context.Context, name string, cfg Config, lc *Lifecycle, log *slog.Logger, opts ...grpc.ServerOption) (*Server, error) {
	if cfg.ShutdownTimeout <= 0 {
		cfg.ShutdownTimeout = 20 * time.Second
	}
	if cfg.ReadinessInterval <= 0 {
		cfg.ReadinessInterval = 5 * time.Second
	}
	if cfg.Version == "" {
		cfg.Version = "dev"
	}
	if cfg.GRPCMaxRecvMsgSize <= 0 {
		cfg.GRPCMaxRecvMsgSize = DefaultGRPCMaxRecvMsgSize
	}
	if cfg.GRPCMaxCalls <= 0 {
		cfg.GRPCMaxCalls = GRPCMaxCallsFor(debug.SetMemoryLimit(-1), GRPCStrangerRecvSize(cfg.GRPCMaxRecvMsgSize, cfg.GRPCAuthenticate != nil))
	}
	cfg.HTTP = cfg.HTTP.withDefaults()
	tel, err := telemetry.Setup(ctx, cfg.Telemetry, name, cfg.Version)
	if err != nil {
		return nil, err
	}
	lc.flushLast(tel.Shutdown, cfg.Telemetry.FlushTimeout)
	grpcLis, err := listen(lc, "gRPC", cfg.GRPCAddr, addrVar(name, "GRPC"))
	if err != nil {
		return nil, err
	}
	httpLis, err := listen(lc, "HTTP", cfg.HTTPAddr, addrVar(name, "HTTP"))
	if err != nil {
		return nil, err
	}
	var opsLis net.Listener
	if cfg.OpsAddr != "" {
		if opsLis, err = listen(lc, "ops HTTP", cfg.OpsAddr, addrVar(name, "OPS")); err != nil {
			return nil, err
		}
	}
	s := &Server{
		name:      name,
		cfg:       cfg,
		log:       log,
		health:    health.NewServer(),
		grpcLis:   grpcLis,
		httpLis:   httpLis,
		opsLis:    opsLis,
		hosts:     newOpsHosts(cfg.OpsAllowedHosts),
		Mux:       http.NewServeMux(),
		Telemetry: tel,
		lc:        lc,
	}
	gate, err := newCallGate(cfg.GRPCMaxCalls, cfg.GRPCAuthenticate, tel.MeterProvider.Meter("kurz.dev/pkg/server"))
	if err != nil {
		return nil, err
	}
	connsClosed, err := connsClosedCounter(tel.MeterProvider.Meter("kurz.dev/pkg/server"))
	if err != nil {
		return nil, err
	}
	s.conns = newConnGuard(cfg.HTTP.MaxConnections, cfg.HTTP.MaxConnectionsPerClient, connsClosed)
	grpcClosed, err := grpcConnsClosedCounter(tel.MeterProvider.Meter("kurz.dev/pkg/server"))
	if err != nil {
		return nil, err
	}
	maxConns := cmp.Or(cfg.GRPCMaxConnections, DefaultGRPCMaxConnections)
	s.grpcLis = guardGRPCConns(s.grpcLis, newConnGuard(maxConns, maxConns, grpcClosed), grpcKeepaliveTimeout)
	s.gate, s.calls, s.registered = gate, tel.GRPCServer(), map[string]bool{}
	base := []grpc.ServerOption{
		// Long-lived workers serve the streams, their stacks already grown:
		// a fresh goroutine per call grew its stack twice per decision
		// (runtime.newstack/copystack, ~9% of the limiter's CPU). A busy
		// pool falls back to a new goroutine; it is not a concurrency limit.
		// Calls block on I/O, so the pool is sized for calls in flight,
		// not for cores (streamWorkers).
		grpc.NumStreamWorkers(cfg.streamWorkers()),
		grpc.KeepaliveParams(keepalive.ServerParameters{
			MaxConnectionIdle: 5 * time.Minute,
			// Clients reconnect now and then, so new replicas behind a
			// Kubernetes Service get their share of long-lived connections.
			MaxConnectionAge:      cmp.Or(cfg.MaxConnectionAge, DefaultMaxConnectionAge),
			MaxConnectionAgeGrace: cfg.ShutdownTimeout,
			Time:                  30 * time.Second,
			Timeout:               grpcKeepaliveTimeout,
		}),
		grpc.KeepaliveEnforcementPolicy(keepalive.EnforcementPolicy{MinTime: 10 * time.Second, PermitWithoutStream: true}),
		grpc.ChainUnaryInterceptor(s.recoverUnary),
		grpc.MaxRecvMsgSize(cfg.GRPCMaxRecvMsgSize),
		// A stream's headers are decoded, and its goroutine started, before
		// any interceptor can refuse the call: without these bounds one
		// connection held 100,000 streams (1.2 GB) or 40 streams of
		// HPACK-compressed headers (430 MB of heap from 272 KB sent).
		grpc.MaxConcurrentStreams(MaxConcurrentStreams),
		grpc.MaxHeaderListSize(MaxHeaderListSize),
		// ... and MaxConcurrentStreams bounds one connection, not how many
		// a caller opens: 40 connections of 250 silent streams held 10,000
		// goroutines and 117 MB. The gate bounds the server's calls.
		grpc.InTapHandle(gate.tap),
		// Fixed flow-control windows, the clients' own (pkg/grpcclient):
		// with gRPC's dynamic ones the server pings its client after a
		// request arrives alone to estimate the bandwidth, a write and a
		// read more per call at low load. They do not bound what a client
		// can make the server buffer (gRPC grants connection credit as
		// data arrives and grows a call's window to the message it reads):
		// the gate's calls times the receive size does.
		grpc.StaticStreamWindowSize(grpcclient.StreamWindow),
		grpc.StaticConnWindowSize(grpcclient.ConnWindow),
	}
	// Spans only when they are exported: a server with any stats handler
	// pays for it on every call (see telemetry.GRPCServer).
	if h := s.calls.StatsHandler(); h != nil {
		base = append(base, grpc.StatsHandler(h))
	}
	if err := s.observeReadiness(); err != nil {
		return nil, err
	}
	s.GRPC = grpc.NewServer(append(base, opts...)...)
	healthpb.RegisterHealthServer(s, s.health)
	reflection.Register(s)
	s.health.SetServingStatus("", healthpb.HealthCheckResponse_NOT_SERVING)

	// Liveness stays on the public listener: it pings nothing and tells
	// nothing, and load balancers outside the cluster probe that port.
	healthz := func(w http.ResponseWriter, _ *http.Request) {
		writeJSON(w, http.StatusOK, map[string]string{"status": "ok"})
	}
	s.Mux.HandleFunc("GET /healthz", healthz)
	ops := s.Mux
	if opsLis != nil {
		ops = http.NewServeMux()
		ops.HandleFunc("GET /healthz", healthz)
		// Probes and scrapes only: no spans, no request metrics.
		s.opsSrv = s.httpServer(s.hosts.guard(ops))
	}
	ops.HandleFunc("GET /readyz", s.serveReadyz)
	ops.Handle("GET /metrics", tel.Metrics)
	if cfg.Pprof {
		ops.HandleFunc("GET /debug/pprof/", pprof.Index)
		ops.HandleFunc("GET /debug/pprof/profile", pprof.Profile)
		ops.HandleFunc("GET /debug/pprof/trace", pprof.Trace)
		ops.HandleFunc("GET /debug/pprof/symbol", pprof.Symbol)
	}
	s.inner = s.Mux
	s.httpSrv = s.httpServer(s.httpHandler(s.Mux))
	s.httpLis = guardConns(s.httpSrv, s.httpLis, s.conns)
	return s, nil
}

// grpcKeepaliveTimeout is how long the server waits for a keepalive
// ping's answer, and the TCP_USER_TIMEOUT of its connections.
const grpcKeepaliveTimeout = 10 * time.Second

// addrVar names the variable of a service's listen address, as every
// service's Config spells it: KURZ_<SERVICE>_<GRPC|HTTP|OPS>_ADDR.
func addrVar(service, kind string) string {
	return "KURZ_" + strings.ToUpper(service) + "_" + kind + "_ADDR"
}

// listen listens on addr and gives lc the listener, for a server that never
// ran: Run's drain closes it otherwise, and then closing it again is a no-op.
func listen(lc *Lifecycle, what, addr, variable string) (net.Listener, error) {
	lis, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("listen %s on %s (set %s): %w", what, addr, variable, err)
	}
	lc.Own(what+" listener", func(context.Context) error {
		if err := lis.Close(); err != nil && !errors.Is(err, net.ErrClosed) {
			return err
		}
		return nil
	})
	return lis, nil
}

// httpServer is an HTTP server of h within the listener bounds.
func (s *Server) httpServer(h http.Handler) *http.Server {
	return &http.Server{
		Handler:           s.closeUnreadBodies(h),
		ReadHeaderTimeout: s.cfg.HTTP.ReadHeaderTimeout,
		ReadTimeout:       s.cfg.HTTP.ReadTimeout,
		WriteTimeout:      s.cfg.HTTP.WriteTimeout,
		IdleTimeout:       s.cfg.HTTP.IdleTimeout,
		MaxHeaderBytes:    s.cfg.HTTP.MaxHeaderBytes,
		ErrorLog:          slog.NewLogLogger(s.log.Handler(), slog.LevelWarn),
	}
}

// GRPCAddr is the address the gRPC server listens on.
func (s *Server) GRPCAddr() string { return s.grpcLis.Addr().String() }

// HTTPAddr is the address the HTTP server listens on.
func (s *Server) HTTPAddr() string { return s.httpLis.Addr().String() }

// OpsAddr is the address /readyz and /metrics are served on: the ops
// listener's, or HTTPAddr without one.
func (s *Server) OpsAddr() string {
	if s.opsLis == nil {
		return s.HTTPAddr()
	}
	return s.opsLis.Addr().String()
}

// SetHandler replaces the HTTP handler, e.g. to wrap Mux in middleware. The
// ops routes stay on Mux (/healthz; all of them without an ops listener).
// The server wraps h in its OpenTelemetry middleware, so every request (but
// the ops routes) gets one server span; h must not start another.
func (s *Server) SetHandler(h http.Handler) {
	s.inner = h
	s.httpSrv.Handler = s.closeUnreadBodies(s.httpHandler(h))
}

// httpHandler is h as the HTTP listener serves it: instrumented and, when
// that listener serves the ops routes (no ops listener: the internal
// services), behind their Host check. A public listener is not checked:
// its clients name it as they like (custom domains, proxies).
func (s *Server) httpHandler(h http.Handler) http.Handler {
	h = s.instrument(h)
	if s.opsLis == nil {
		h = s.hosts.guard(h)
	}
	return h
}

// TrustTraceContextFrom makes the HTTP listener continue a caller's trace
// (traceparent, tracestate, baggage) only for the requests trusted says
// so, such as those through the service's trusted proxies; the others'
// trace headers are dropped before anything reads them. A public
// listener's strangers would otherwise choose which of their requests are
// sampled (a sampled parent is followed whatever the ratio) and put trace
// IDs of their choosing into the service's log lines.
func (s *Server) TrustTraceContextFrom(trusted func(*http.Request) bool) {
	s.traceTrust = trusted
	s.httpSrv.Handler = s.closeUnreadBodies(s.httpHandler(s.inner))
}

// KeyClientConnections makes the HTTP listener's per-client bound
// (HTTPLimits.MaxConnectionsPerClient) count an IPv6 client by keying's
// prefix, as the service's limits do (without it: by
// clientip.DefaultIPv6Prefix), and leave out the peers proxy says are the
// service's trusted proxies, whose connections carry many clients'. Call it
// before Run.
func (s *Server) KeyClientConnections(keying clientip.Keying, proxy func(netip.Addr) bool) {
	s.conns.keyClients(keying, proxy)
}

// closeUnreadBodies is the package's closeUnreadBodies, counted in the
// server's MetricHTTPConnectionsClosed.
func (s *Server) closeUnreadBodies(h http.Handler) http.Handler {
	return closeUnreadBodies(h, s.conns.closed)
}

// instrument gives h the http.server.request.duration metric and, when
// traces are recorded, a server span per request (continuing the caller's
// trace from traceparent), on the service's own providers. Probes, scrapes
// and profiles are left out: they would drown the traces and skew the
// latency histograms.
func (s *Server) instrument(h http.Handler) http.Handler {
	traced := s.Telemetry.HTTPServer(s.name, h, func(r *http.Request) bool {
		switch r.URL.Path {
		// /healthcheck: the limiter's envoyproxy/ratelimit probe route.
		case "/healthz", "/readyz", "/metrics", "/healthcheck":
			return true
		}
		return strings.HasPrefix(r.URL.Path, "/debug/pprof/")
	})
	trusted := s.traceTrust
	if trusted == nil {
		return traced
	}
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if !trusted(r) {
			for _, k := range traceHeaders {
				if _, ok := r.Header[k]; ok {
					delete(r.Header, k)
				}
			}
		}
		traced.ServeHTTP(w, r)
	})
}

// traceHeaders are the W3C trace context and baggage headers, canonical.
var traceHeaders = []string{"Traceparent", "Tracestate", "Baggage"}

// AddCheck adds a readiness check, run every Config.ReadinessInterval in the
// background: when it fails, the replica is not ready (gRPC health and
// /readyz).
func (s *Server) AddCheck(name string, check Check) {
	s.checks = append(s.checks, namedCheck{name: name, check: check})
}

// AddSoftCheck adds a check of a dependency the service has a fallback for
// (a rule's failure mode, a cache, a caller's policy): its failure is
// reported as "degraded" by /readyz but leaves the replica ready. A shared
// dependency's outage makes every replica fail its checks at once; taking
// them all out of rotation would turn a degraded service into no service.
func (s *Server) AddSoftCheck(name string, check Check) {
	s.checks = append(s.checks, namedCheck{name: name, check: check, soft: true})
}

// Close closes the lifecycle of a server that never ran: its listeners,
// everything the service owned, then its telemetry.
func (s *Server) Close(ctx context.Context) error { return s.lc.Close(ctx) }

// RegisterService registers a service on GRPC, each of its handlers timed
// (telemetry.ServerCalls) and giving its call's place at the gate back
// when it returns (KURZ_GRPC_MAX_CALLS; see callGate). It makes the Server
// a grpc.ServiceRegistrar: pb.RegisterFooServer(srv, impl).
func (s *Server) RegisterService(desc *grpc.ServiceDesc, impl any) {
	s.GRPC.RegisterService(s.gate.wrap(s.calls.Wrap(desc)), impl)
	s.registered[desc.ServiceName] = true
}

// GetServiceInfo returns GRPC's services (reflection lists them).
func (s *Server) GetServiceInfo() map[string]grpc.ServiceInfo { return s.GRPC.GetServiceInfo() }

// Run serves until ctx ends, then shuts down gracefully. It returns nil after
// a clean shutdown, or the first serve error. It refuses to start with a
// service registered on GRPC directly: its calls would go untimed, and
// hold their places at the gate on a goroutine each until they end.
func (s *Server) Run(ctx context.Context) error {
	for svc := range s.GRPC.GetServiceInfo() {
		if !s.registered[svc] {
			return errors.Join(fmt.Errorf("gRPC service %s was registered on Server.GRPC: register it through the Server (RegisterService)", svc),
				s.Close(context.WithoutCancel(ctx)))
		}
	}
	serveErr := make(chan error, 3)
	go func() {
		if err := s.GRPC.Serve(s.grpcLis); err != nil {
			serveErr <- fmt.Errorf("serve gRPC: %w", err)
		}
	}()
	go func() {
		if err := s.httpSrv.Serve(s.httpLis); err != nil && !errors.Is(err, http.ErrServerClosed) {
			serveErr <- fmt.Errorf("serve HTTP: %w", err)
		}
	}()
	if s.opsSrv != nil {
		go func() {
			if err := s.opsSrv.Serve(s.opsLis); err != nil && !errors.Is(err, http.ErrServerClosed) {
				serveErr <- fmt.Errorf("serve ops HTTP: %w", err)
			}
		}()
	}
	refreshCtx, stopRefresh := context.WithCancel(ctx)
	var refreshing sync.WaitGroup
	refreshing.Go(func() { s.refreshHealth(refreshCtx) })
	s.log.Info("serving", "grpc", s.GRPCAddr(), "http", s.HTTPAddr(), "ops", s.OpsAddr())

	var runErr error
	select {
	case <-ctx.Done():
	case runErr = <-serveErr:
	}
	stopRefresh()
	refreshing.Wait()
	return errors.Join(runErr, s.shutdown())
}

func (s *Server) shutdown() error {
	s.log.Info("shutting down", "timeout", s.cfg.ShutdownTimeout)
	s.draining.Store(true)
	s.health.Shutdown() // every service NOT_SERVING: load balancers stop sending
	if d := s.cfg.ShutdownDelay; d > 0 {
		s.log.Info("not ready; serving on while balancers notice", "delay", d)
		time.Sleep(d) // the delay itself: requests keep arriving and are answered
	}
	ctx, cancel := context.WithTimeout(context.Background(), s.cfg.ShutdownTimeout)
	defer cancel()

	var errs []error
	if err := s.httpSrv.Shutdown(ctx); err != nil {
		errs = append(errs, fmt.Errorf("drain HTTP: %w", err))
	}
	stopped := make(chan struct{})
	go func() { s.GRPC.GracefulStop(); close(stopped) }()
	select {
	case <-stopped:
	case <-ctx.Done():
		s.GRPC.Stop()
		errs = append(errs, errors.New("drain gRPC: timed out; in-flight calls cancelled"))
	}
	// Last of the listeners: probes see "draining" until the others closed.
	if s.opsSrv != nil {
		if err := s.opsSrv.Shutdown(ctx); err != nil {
			errs = append(errs, fmt.Errorf("drain ops HTTP: %w", err))
		}
	}
	// Not ctx: the closes and the telemetry flush have bounds of their own,
	// so a drain that used all of its time does not cut them short.
	errs = append(errs, s.lc.Close(context.Background()))
	err := errors.Join(errs...)
	if err != nil {
		s.log.Error("shutdown", "err", err)
	} else {
		s.log.Info("stopped")
	}
	return err
}

// refreshHealth runs the readiness checks every ReadinessInterval and keeps
// their result for /readyz and the gRPC health status. It is the only caller
// of the checks: a flood of probes is not a flood of dependency pings.
func (s *Server) refreshHealth(ctx context.Context) {
	tick := time.NewTicker(s.cfg.ReadinessInterval)
	defer tick.Stop()
	for {
		results, ok := s.runChecks(ctx)
		if ctx.Err() != nil {
			return
		}
		s.ready.Store(&readiness{checks: results, ok: ok})
		st := healthpb.HealthCheckResponse_SERVING
		if !ok {
			st = healthpb.HealthCheckResponse_NOT_SERVING
		}
		s.health.SetServingStatus("", st)
		for svc := range s.GRPC.GetServiceInfo() {
			s.health.SetServingStatus(svc, st)
		}
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
	}
}

func (s *Server) runChecks(ctx context.Context) (map[string]string, bool) {
	results := make(map[string]string, len(s.checks))
	ok := true
	for _, c := range s.checks {
		cctx, cancel := context.WithTimeout(ctx, 2*time.Second)
		err := c.check(cctx)
		cancel()
		if err != nil {
			// The detail goes to the log, not the response.
			if c.soft {
				results[c.name] = "degraded"
				s.log.Warn("dependency degraded; serving on its fallback", "check", c.name, "err", err)
				continue
			}
			ok = false
			results[c.name] = "unavailable"
			s.log.Warn("readiness check failed", "check", c.name, "err", err)
			continue
		}
		results[c.name] = "ok"
	}
	return results, ok
}

// MetricDependencyUp is the gauge of the readiness checks' last results,
// one series per check (attribute check: postgres, redis, clickhouse, a
// peer): 1 when it passed, 0 when it failed, whether the failure takes the
// replica out of rotation or leaves it degraded. The alerts on unreachable
// stores read it (deploy/k8s/monitoring/alerts.yaml).
const MetricDependencyUp = "kurz.dependency.up"

// observeReadiness exports the last readiness results as MetricDependencyUp;
// it reports nothing before the first run of the checks.
func (s *Server) observeReadiness() error {
	_, err := s.Telemetry.MeterProvider.Meter("kurz.dev/pkg/server").Int64ObservableGauge(MetricDependencyUp,
		metric.WithDescription("1 when the last readiness check of a dependency (attribute check) passed, 0 when it failed"),
		metric.WithInt64Callback(func(_ context.Context, o metric.Int64Observer) error {
			rd := s.ready.Load()
			if rd == nil {
				return nil
			}
			for name, st := range rd.checks {
				up := int64(0)
				if st == "ok" {
					up = 1
				}
				o.Observe(up, metric.WithAttributes(attribute.String("check", name)))
			}
			return nil
		}))
	if err != nil {
		return fmt.Errorf("readiness metrics: %w", err)
	}
	return nil
}

// Ready reports what /readyz answers with 200: the readiness checks' last
// result is ready and the server is not draining (false before the first
// run of the checks). For a service's own probe routes, such as the
// limiter's envoyproxy/ratelimit /healthcheck.
func (s *Server) Ready() bool {
	rd := s.ready.Load()
	return !s.draining.Load() && rd != nil && rd.ok
}

// serveReadyz answers the last result of the readiness checks (at most
// ReadinessInterval old); it runs none itself.
func (s *Server) serveReadyz(w http.ResponseWriter, _ *http.Request) {
	if s.draining.Load() {
		writeJSON(w, http.StatusServiceUnavailable, map[string]any{"status": "draining"})
		return
	}
	rd := s.ready.Load()
	if rd == nil {
		writeJSON(w, http.StatusServiceUnavailable, map[string]any{"status": "starting"})
		return
	}
	code, st := http.StatusOK, "ok"
	if !rd.ok {
		code, st = http.StatusServiceUnavailable, "unavailable"
	}
	writeJSON(w, code, map[string]any{"status": st, "checks": rd.checks})
}

func writeJSON(w http.ResponseWriter, code int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(code)
	_ = json.NewEncoder(w).Encode(v)
}

// recoverUnary turns a panic in a handler into an Internal error with a
// generic message, logged with the method, so one bad request cannot take the
// process down. It is a last resort, not control flow.
func (s *Server) recoverUnary(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (resp any, err error) {
	defer func() {
		if p := recover(); p != nil {
			s.log.ErrorContext(ctx, "handler panicked", "method", info.FullMethod, "panic", p)
			err = status.Error(codes.Internal, "internal error")
		}
	}()
	return handler(ctx, req)
}
