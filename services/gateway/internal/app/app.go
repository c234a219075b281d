// Package app wires the public HTTP gateway: the JSON API in front of the
// shortener, analytics and limiter services, with tenants and API keys in
// PostgreSQL. Its gRPC listener carries health and reflection only.
package app

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"google.golang.org/grpc"

	analyticsv1 "kurz.dev/gen/kurz/analytics/v1"
	shortenerv1 "kurz.dev/gen/kurz/shortener/v1"
	"kurz.dev/pkg/grpcclient"
	"kurz.dev/pkg/pgpool"
	"kurz.dev/pkg/quota"
	"kurz.dev/pkg/server"
	"kurz.dev/pkg/svcauth"
	"kurz.dev/services/gateway/internal/console"
	"kurz.dev/services/gateway/internal/httpapi"
	"kurz.dev/services/gateway/internal/keystore"
	"kurz.dev/services/gateway/internal/keystore/migrations"
)

// minAdminTokenLen refuses admin tokens short enough to guess.
const minAdminTokenLen = 16

// Config is the gateway's configuration, from KURZ_* environment variables.
// The downstream addresses are the same variables the services listen on, so
// one environment configures a whole local stack.
type Config struct {
	server.Common
	GRPCAddr      string `env:"GATEWAY_GRPC_ADDR" default:"127.0.0.1:9095"`
	HTTPAddr      string `env:"GATEWAY_HTTP_ADDR" default:"127.0.0.1:8080"`
	LimiterAddr   string `env:"LIMITER_GRPC_ADDR" default:"127.0.0.1:9091"`
	ShortenerAddr string `env:"SHORTENER_GRPC_ADDR" default:"127.0.0.1:9092"`
	AnalyticsAddr string `env:"ANALYTICS_GRPC_ADDR" default:"127.0.0.1:9093"`
	// Postgres holds tenants and API keys, and the limiter's plan table the
	// admin API writes.
	Postgres pgpool.Config

	// LimiterTimeout bounds one CheckQuota; past it API quotas fail open and
	// the auth rule fails closed for IPs with recent failures.
	LimiterTimeout time.Duration `env:"GATEWAY_LIMITER_TIMEOUT" default:"50ms"`
	// CallTimeout bounds one call to the shortener or analytics.
	CallTimeout time.Duration `env:"GATEWAY_CALL_TIMEOUT" default:"5s"`
	// MaxBodyBytes bounds request bodies (413 beyond).
	MaxBodyBytes int64 `env:"GATEWAY_MAX_BODY_BYTES" default:"65536"`
	// MaxHeaderBytes bounds the request's header fields (431 beyond).
	MaxHeaderBytes int `env:"GATEWAY_MAX_HEADER_BYTES" default:"16384"`
	// AllowAnonymous lets requests without an API key create links as
	// tenant "anonymous", limited per client IP.
	AllowAnonymous bool `env:"GATEWAY_ALLOW_ANONYMOUS" default:"false"`
	// TrustedProxies are CIDRs of proxies whose X-Forwarded-For is believed.
	TrustedProxies []string `env:"GATEWAY_TRUSTED_PROXIES" default:""`
	// AdminToken guards /v1/admin/...; empty disables the admin API.
	AdminToken string `env:"GATEWAY_ADMIN_TOKEN" default:""`
	// ServiceAuth signs, on every call to the shortener and analytics, an
	// assertion of the tenant the gateway authenticated.
	ServiceAuth svcauth.Config
}

func (c Config) options() (httpapi.Options, *svcauth.Keys, error) {
	keys, err := c.ServiceAuth.Keys()
	errs := []error{err}
	proxies, err := httpapi.ParseTrustedProxies(c.TrustedProxies)
	if err != nil {
		errs = append(errs, fmt.Errorf("KURZ_GATEWAY_TRUSTED_PROXIES: %w", err))
	}
	if c.LimiterTimeout <= 0 || c.CallTimeout <= 0 {
		errs = append(errs, errors.New("KURZ_GATEWAY_LIMITER_TIMEOUT and KURZ_GATEWAY_CALL_TIMEOUT must be positive"))
	}
	if c.MaxBodyBytes < 1024 {
		errs = append(errs, fmt.Errorf("KURZ_GATEWAY_MAX_BODY_BYTES=%d: want at least 1024", c.MaxBodyBytes))
	}
	if c.MaxHeaderBytes < 1024 {
		errs = append(errs, fmt.Errorf("KURZ_GATEWAY_MAX_HEADER_BYTES=%d: want at least 1024", c.MaxHeaderBytes))
	}
	if c.AdminToken != "" && len(c.AdminToken) < minAdminTokenLen {
		errs = append(errs, fmt.Errorf("KURZ_GATEWAY_ADMIN_TOKEN: want at least %d characters (or empty to disable the admin API)", minAdminTokenLen))
	}
	return httpapi.Options{
		MaxBodyBytes:   c.MaxBodyBytes,
		MaxHeaderBytes: c.MaxHeaderBytes,
		AllowAnonymous: c.AllowAnonymous,
		AdminToken:     c.AdminToken,
		TrustedProxies: proxies,
		CallTimeout:    c.CallTimeout,
	}, keys, errors.Join(errs...)
}

// New connects to PostgreSQL (applying the gateway's migrations), dials the
// downstream services and returns the gateway server, ready to Run. Dialing
// does not wait for the services: readiness reports them.
func New(ctx context.Context, cfg Config, log *slog.Logger) (_ *server.Server, err error) {
	opts, keys, err := cfg.options()
	if err != nil {
		return nil, fmt.Errorf("configuration:\n%w", err)
	}
	var closers []func()
	defer func() {
		if err != nil {
			for i := len(closers) - 1; i >= 0; i-- {
				closers[i]()
			}
		}
	}()

	db, err := pgpool.New(ctx, cfg.Postgres)
	if err != nil {
		return nil, err
	}
	closers = append(closers, db.Close)
	applied, err := pgpool.Migrate(ctx, db, migrations.Component, migrations.FS)
	if err != nil {
		return nil, err
	}
	if len(applied) > 0 {
		log.Info("migrations applied", "names", applied)
	}

	srvCfg := cfg.Config(cfg.GRPCAddr, cfg.HTTPAddr)
	// net/http's own header bound must stay well above the gateway's, so a
	// client over KURZ_GATEWAY_MAX_HEADER_BYTES gets the gateway's 431 with
	// its JSON body rather than net/http's bare one.
	srvCfg.HTTP.MaxHeaderBytes = max(srvCfg.HTTP.MaxHeaderBytes, server.DefaultMaxHeaderBytes, 4*cfg.MaxHeaderBytes)
	srv, err := server.New(ctx, "gateway", srvCfg, log)
	if err != nil {
		return nil, err
	}
	closers = append(closers, func() { _ = srv.Close(context.Background()) })
	conns := map[string]*grpc.ClientConn{}
	// The limiter and analytics have fallbacks (quotas fail open, stats
	// answer 503): without them the gateway still serves, so they do not
	// take it out of rotation.
	// Calls to the shortener and analytics wait for a ready replica within
	// their deadline (KURZ_GATEWAY_CALL_TIMEOUT); limiter calls fail fast.
	// They carry the tenant's signed assertion; the limiter takes no tenant
	// from metadata and needs none.
	for _, d := range []struct {
		name, addr, variable string
		soft                 bool
		opts                 []grpc.DialOption
	}{
		{"limiter", cfg.LimiterAddr, "KURZ_LIMITER_GRPC_ADDR", true, nil},
		{"shortener", cfg.ShortenerAddr, "KURZ_SHORTENER_GRPC_ADDR", false, []grpc.DialOption{grpcclient.WaitForReplica, keys.DialOption()}},
		{"analytics", cfg.AnalyticsAddr, "KURZ_ANALYTICS_GRPC_ADDR", true, []grpc.DialOption{grpcclient.WaitForReplica, keys.DialOption()}},
	} {
		conn, err := grpcclient.Dial(d.addr, srv.Telemetry, d.opts...)
		if err != nil {
			return nil, fmt.Errorf("%s (%s): %w", d.name, d.variable, err)
		}
		closers = append(closers, func() { _ = conn.Close() })
		conns[d.name] = conn
		if d.soft {
			srv.AddSoftCheck(d.name, grpcclient.HealthCheck(conn))
		} else {
			srv.AddCheck(d.name, grpcclient.HealthCheck(conn))
		}
	}
	quotaClient, err := quota.New(httpapi.RecordWindows(conns["limiter"]), cfg.LimiterTimeout, log, srv.Telemetry.MeterProvider)
	if err != nil {
		return nil, err
	}
	api, err := httpapi.New(opts, httpapi.Deps{
		Shortener: shortenerv1.NewShortenerServiceClient(conns["shortener"]),
		Analytics: analyticsv1.NewAnalyticsServiceClient(conns["analytics"]),
		Quota:     quotaClient,
		Keys:      keystore.New(db, cfg.Postgres.QueryTimeout),
		Log:       log,
		Meter:     srv.Telemetry.MeterProvider.Meter("kurz.dev/services/gateway"),
	})
	if err != nil {
		return nil, err
	}
	api.Register(srv.Mux)
	web, err := console.New()
	if err != nil {
		return nil, err
	}
	web.Register(srv.Mux)
	srv.SetHandler(api.Wrap(srv.Mux))
	srv.AddCheck("postgres", db.Ping)

	// Closers run in reverse: connections first, the pool last.
	srv.OnShutdown(func(context.Context) error { db.Close(); return nil })
	for _, conn := range conns {
		srv.OnShutdown(func(context.Context) error { return conn.Close() })
	}
	log.Info("gateway configured", "anonymous", cfg.AllowAnonymous, "admin_api", cfg.AdminToken != "",
		"trusted_proxies", cfg.TrustedProxies, "limiter_timeout", cfg.LimiterTimeout, "max_body_bytes", cfg.MaxBodyBytes)
	return srv, nil
}
