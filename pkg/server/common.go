package server

import (
	"time"

	"kurz.dev/pkg/telemetry"
)

// Common holds the settings every service shares; embed it in a service's
// Config next to its own listen addresses.
type Common struct {
	ShutdownTimeout time.Duration `env:"SHUTDOWN_TIMEOUT" default:"20s"`
	// ShutdownDelay keeps a replica serving, not ready, this long after
	// SIGTERM before it drains (see Config.ShutdownDelay).
	ShutdownDelay time.Duration `env:"SHUTDOWN_DELAY" default:"0s"`
	Version       string        `env:"VERSION" default:"dev"`
	// Pprof serves net/http/pprof under /debug/pprof/ on the HTTP listener.
	// Off by default: turn it on to profile a replica, not on public ports.
	Pprof     bool `env:"PPROF" default:"false"`
	Telemetry telemetry.Config
	// HTTP bounds the HTTP listener; it has no variables (zero fields take
	// the server's defaults), so only code and tests set it.
	HTTP HTTPLimits
}

// Config returns the server configuration for the given listen addresses.
func (c Common) Config(grpcAddr, httpAddr string) Config {
	return Config{
		GRPCAddr:        grpcAddr,
		HTTPAddr:        httpAddr,
		Version:         c.Version,
		Telemetry:       c.Telemetry,
		ShutdownTimeout: c.ShutdownTimeout,
		ShutdownDelay:   c.ShutdownDelay,
		Pprof:           c.Pprof,
		HTTP:            c.HTTP,
	}
}
