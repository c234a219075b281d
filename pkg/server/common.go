package server

import (
	"errors"
	"fmt"
	"time"

	"kurz.dev/pkg/config"
	"kurz.dev/pkg/telemetry"
)

// Common holds the settings every service shares; embed it in a service's
// Config next to its own listen addresses.
type Common struct {
	// ShutdownTimeout bounds the drain on SIGTERM; keep it below the pod's grace period.
	ShutdownTimeout time.Duration `env:"SHUTDOWN_TIMEOUT" default:"20s"`
	// CloseTimeout bounds the closes after the drain, all together: the
	// stores, peer connections and background workers' stops (see
	// Lifecycle). A shutdown takes at most the drain (ShutdownTimeout), this
	// and the telemetry flush (KURZ_TELEMETRY_FLUSH_TIMEOUT).
	CloseTimeout time.Duration `env:"CLOSE_TIMEOUT" default:"10s"`
	// ShutdownDelay keeps a replica serving, not ready, this long after
	// SIGTERM before it drains (see Config.ShutdownDelay).
	ShutdownDelay time.Duration `env:"SHUTDOWN_DELAY" default:"0s"`
	// Version is the service's version, reported in telemetry resources.
	Version string `env:"VERSION" default:"dev"`
	// ReadinessInterval is how often the readiness checks run in the
	// background; /readyz and gRPC health answer the last result, so it is
	// also how stale they may be. At least 100ms: each round pings every
	// dependency, and no probe asks more than once a second.
	ReadinessInterval time.Duration `env:"READINESS_INTERVAL" default:"5s"`
	// Pprof serves net/http/pprof under /debug/pprof/ on the ops listener
	// (the HTTP listener of a service without one). Off by default.
	Pprof bool `env:"PPROF" default:"false"`
	// OpsAllowedHosts lists Host names, comma-separated, that the ops
	// routes (/metrics, /readyz, pprof; the limiter's POST /json) answer
	// besides IP addresses, localhost and Kubernetes Service names (no dot,
	// or ending in .svc or .cluster.local): a name
	// ("metrics.example.internal"), or one with a leading dot for every
	// name under it (".svc.example.internal", for a cluster domain of its
	// own). A request for another name is refused (421), so that a web
	// page cannot rebind its own name to a forwarded ops port and read it.
	// The public listeners (the redirect's and the gateway's HTTP) take any
	// name.
	OpsAllowedHosts []string `env:"OPS_ALLOWED_HOSTS" default:""`
	// GRPCStreamWorkers is the number of long-lived goroutines that serve
	// gRPC calls; a call that finds them all busy gets a goroutine of its
	// own (it is not a concurrency limit). 0: 32 per core.
	GRPCStreamWorkers int `env:"GRPC_STREAM_WORKERS" default:"0"`
	// GRPCMaxConnectionAge closes each gRPC connection this long after it
	// opened (gracefully, ±10%): its client reconnects, looks its service's
	// addresses up again, and so finds replicas added since (a scale-out).
	GRPCMaxConnectionAge time.Duration `env:"GRPC_MAX_CONNECTION_AGE" default:"1m"`
	// GRPCMaxCalls bounds the gRPC calls a replica holds at once, over all
	// its connections (each connection carries at most 250): one more is
	// refused with UNAVAILABLE before the server starts its goroutine
	// or reads its request, and counted in kurz.grpc.calls.refused. Every
	// call held costs a goroutine and its headers, and up to the service's
	// receive size while its request arrives (4 MiB for the shortener, 64
	// KiB for the others). 0: as many as fit a
	// quarter of GOMEMLIMIT at that size, at most 1024 (without GOMEMLIMIT,
	// 1024); the shortener and analytics, which refuse a call without the
	// service key before reading its request, count 64 KiB (their large
	// requests come from the gateway, which bounds them). A health check
	// (the readiness probe) is answered past it: busy is not down. Set it
	// only with the pod's memory in mind.
	GRPCMaxCalls int `env:"GRPC_MAX_CALLS" default:"0"`
	// GRPCMaxConnections bounds the open connections of the gRPC listener:
	// a connection that comes while this many are open closes the oldest
	// one that has sent nothing yet, or else is refused; one that has
	// spoken is never closed for another. Each holds ~17-20 KiB idle; count
	// the service's callers' connections (a fleet of Envoys: a few each)
	// when raising or lowering it.
	GRPCMaxConnections int `env:"GRPC_MAX_CONNECTIONS" default:"4096"`
	// HTTPMaxConnections bounds the open connections of the HTTP listener
	// (the public one of the redirect and the gateway): a connection that
	// comes while this many are open is served, and the oldest one that
	// has sent no request yet is closed for it, or else the oldest idle for
	// a second or more between requests, or else the newcomer (never a
	// request being served), so strangers' silent or idle connections can
	// neither keep others out nor grow the process's memory and file
	// descriptors. Requests being served are bounded otherwise: one whose
	// body the service does not read is answered at once and its
	// connection closed, a body read is cut at the read timeout (30 s),
	// and one client holds at most KURZ_HTTP_MAX_CONNECTIONS_PER_CLIENT.
	HTTPMaxConnections int `env:"HTTP_MAX_CONNECTIONS" default:"4096"`
	// HTTPMaxConnectionsPerClient bounds one client's open connections on
	// the HTTP listener: its next one is refused (closed at once) and
	// counted in kurz.http.connections.closed. A connection serving a
	// request is never closed for a newcomer, so without it one client
	// holding requests open could fill the listener. A client is an
	// address, an IPv6 one its KURZ_CLIENT_IPV6_PREFIX; the service's
	// trusted proxies are not bounded (list the proxies in front of the
	// gateway and the redirect, or each proxy is one client).
	HTTPMaxConnectionsPerClient int `env:"HTTP_MAX_CONNECTIONS_PER_CLIENT" default:"256"`
	Telemetry                   telemetry.Config
	// HTTP bounds the HTTP listener; its other fields have no variables
	// (zero fields take the server's defaults), so only code and tests set
	// them.
	HTTP HTTPLimits
}

// minReadinessInterval is the shortest KURZ_READINESS_INTERVAL accepted.
const minReadinessInterval = 100 * time.Millisecond

// common makes every Config that embeds Common a Service.
func (c Common) common() Common { return c }

// check refuses settings whose zero or negative value would otherwise be
// replaced by a default without a word, and periods so short that their
// loop would spin (config.Period).
func (c Common) check() error {
	errs := []error{config.Period("KURZ_READINESS_INTERVAL", c.ReadinessInterval, minReadinessInterval)}
	// New and NewLifecycle take 0 for their defaults, as code and tests
	// that build a Config pass it; from the environment it is refused.
	for _, t := range []struct {
		name string
		d    time.Duration
	}{
		{"KURZ_SHUTDOWN_TIMEOUT", c.ShutdownTimeout},
		{"KURZ_CLOSE_TIMEOUT", c.CloseTimeout},
		{"KURZ_TELEMETRY_FLUSH_TIMEOUT", c.Telemetry.FlushTimeout},
	} {
		if t.d <= 0 {
			errs = append(errs, fmt.Errorf("%s=%s: want more than 0", t.name, t.d))
		}
	}
	if c.GRPCMaxConnectionAge < time.Second {
		errs = append(errs, fmt.Errorf("KURZ_GRPC_MAX_CONNECTION_AGE=%s: want 1s or more", c.GRPCMaxConnectionAge))
	}
	if c.GRPCMaxCalls != 0 && (c.GRPCMaxCalls < 16 || c.GRPCMaxCalls > 1_000_000) {
		errs = append(errs, fmt.Errorf("KURZ_GRPC_MAX_CALLS=%d: want 0 (derived from GOMEMLIMIT) or 16 to 1000000", c.GRPCMaxCalls))
	}
	if c.GRPCMaxConnections < 16 || c.GRPCMaxConnections > 1_000_000 {
		errs = append(errs, fmt.Errorf("KURZ_GRPC_MAX_CONNECTIONS=%d: want 16 to 1000000", c.GRPCMaxConnections))
	}
	if c.HTTPMaxConnections < 16 || c.HTTPMaxConnections > 1_000_000 {
		errs = append(errs, fmt.Errorf("KURZ_HTTP_MAX_CONNECTIONS=%d: want 16 to 1000000", c.HTTPMaxConnections))
	}
	if c.HTTPMaxConnectionsPerClient < 1 || c.HTTPMaxConnectionsPerClient > c.HTTPMaxConnections {
		errs = append(errs, fmt.Errorf("KURZ_HTTP_MAX_CONNECTIONS_PER_CLIENT=%d: want 1 to KURZ_HTTP_MAX_CONNECTIONS (%d)", c.HTTPMaxConnectionsPerClient, c.HTTPMaxConnections))
	}
	errs = append(errs, c.Telemetry.Check(), CheckAllowedHosts("KURZ_OPS_ALLOWED_HOSTS", c.OpsAllowedHosts))
	if c.GRPCStreamWorkers < 0 || c.GRPCStreamWorkers > 10_000 {
		errs = append(errs, fmt.Errorf("KURZ_GRPC_STREAM_WORKERS=%d: want 0 (32 per core) to 10000", c.GRPCStreamWorkers))
	}
	return errors.Join(errs...)
}

// Config returns the server configuration for the given listen addresses.
func (c Common) Config(grpcAddr, httpAddr string) Config {
	http := c.HTTP
	if http.MaxConnections == 0 {
		http.MaxConnections = c.HTTPMaxConnections
	}
	if http.MaxConnectionsPerClient == 0 {
		http.MaxConnectionsPerClient = c.HTTPMaxConnectionsPerClient
	}
	return Config{
		GRPCAddr:           grpcAddr,
		HTTPAddr:           httpAddr,
		Version:            c.Version,
		Telemetry:          c.Telemetry,
		ShutdownTimeout:    c.ShutdownTimeout,
		ShutdownDelay:      c.ShutdownDelay,
		ReadinessInterval:  c.ReadinessInterval,
		Pprof:              c.Pprof,
		OpsAllowedHosts:    c.OpsAllowedHosts,
		StreamWorkers:      c.GRPCStreamWorkers,
		MaxConnectionAge:   c.GRPCMaxConnectionAge,
		GRPCMaxCalls:       c.GRPCMaxCalls,
		GRPCMaxConnections: c.GRPCMaxConnections,
		HTTP:               http,
	}
}
