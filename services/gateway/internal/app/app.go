// Package app wires the public HTTP gateway: the JSON API in front of the
// shortener, analytics and limiter services, with tenants and API keys in
// PostgreSQL. Its gRPC listener carries health and reflection only.
package app

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/url"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"google.golang.org/grpc"

	analyticsv1 "kurz.dev/gen/kurz/analytics/v1"
	limiterv1 "kurz.dev/gen/kurz/limiter/v1"
	shortenerv1 "kurz.dev/gen/kurz/shortener/v1"
	"kurz.dev/pkg/clientip"
	"kurz.dev/pkg/config"
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

// downstreamMaxRecvMsgSize bounds one response from the shortener or
// analytics, 16 MiB instead of gRPC's default 4 MiB. The shortener ends a
// ListLinks page at 1 MiB (linkapi.MaxPageBytes), so pages never come near
// it; the headroom is for a response that grows (a new field, a replica of
// another version in a rolling update) rather than a limit to reach. It is
// still a bound: one call holds at most this much of the gateway's memory.
const downstreamMaxRecvMsgSize = 16 << 20

// Config is the gateway's configuration, from KURZ_* environment variables.
// The downstream addresses are the same variables the services listen on, so
// one environment configures a whole local stack.
type Config struct {
	server.Common
	// GRPCAddr is the gateway's gRPC address (health and reflection only).
	GRPCAddr string `env:"GATEWAY_GRPC_ADDR" default:"127.0.0.1:9095"`
	// HTTPAddr is the gateway's public HTTP address: the JSON API, the console and /healthz.
	HTTPAddr string `env:"GATEWAY_HTTP_ADDR" default:"127.0.0.1:8080"`
	// OpsAddr serves /readyz, /metrics and pprof, kept off the public
	// listener (which answers /healthz only).
	OpsAddr string `env:"GATEWAY_OPS_ADDR" default:"127.0.0.1:9195"`
	// LimiterAddr is the limiter's gRPC address: where it listens, and where its callers dial it.
	LimiterAddr string `env:"LIMITER_GRPC_ADDR" default:"127.0.0.1:9091"`
	// ShortenerAddr is the shortener's gRPC address: where it listens, and where its callers dial it.
	ShortenerAddr string `env:"SHORTENER_GRPC_ADDR" default:"127.0.0.1:9092"`
	// AnalyticsAddr is the analytics gRPC address: where it listens, and where its callers dial it.
	AnalyticsAddr string `env:"ANALYTICS_GRPC_ADDR" default:"127.0.0.1:9093"`
	// ShortBaseURL is the shortener's base URL, the same variable the shortener reads: its host names the default domain to Shlink's clients (GET /rest/v3/domains), which send it back as a link's domain.
	ShortBaseURL string `env:"SHORTENER_BASE_URL" default:"http://127.0.0.1:8787"`
	// Postgres holds tenants and API keys, and the limiter's plan table the
	// admin API writes.
	Postgres pgpool.Config

	// LimiterTimeout bounds one CheckQuota; past it API quotas fail open
	// (anonymous calls are held to the gateway's own bucket per address)
	// and the auth rule fails closed for IPs with recent failures.
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
	// AnonymousLocalLimit is the refill per minute of the token bucket
	// that holds each anonymous client address, on this replica, while the
	// limiter does not answer within KURZ_GATEWAY_LIMITER_TIMEOUT (the
	// shipped api/anonymous-per-ip rule's rate). Anonymous requests the
	// limiter allows use the bucket up too.
	AnonymousLocalLimit int `env:"GATEWAY_ANONYMOUS_LOCAL_LIMIT" default:"60"`
	// AnonymousLocalBurst is that bucket's capacity (the rule's burst).
	AnonymousLocalBurst int `env:"GATEWAY_ANONYMOUS_LOCAL_BURST" default:"20"`
	// TrustedProxies are CIDRs (or addresses) of the proxies in front of the
	// gateway (the ingress pods): only their forwarding headers are
	// believed, X-Forwarded-For walked from the right (pkg/clientip).
	// A range wider than 10.0.0.0/8 or fc00::/7 (0.0.0.0/0), or a public
	// IPv6 range wider than /16, is warned of at start: every client in it
	// names its own address.
	TrustedProxies []string `env:"GATEWAY_TRUSTED_PROXIES" default:""`
	// ClientIPHeader optionally names a single-value header (X-Real-IP,
	// CF-Connecting-IP) the trusted proxies set, read instead of
	// X-Forwarded-For.
	ClientIPHeader string `env:"GATEWAY_CLIENT_IP_HEADER" default:""`
	// Keying keys IPv6 clients by their prefix (KURZ_CLIENT_IPV6_PREFIX).
	Keying clientip.Keying
	// AdminToken guards /v1/admin/...; empty disables the admin API.
	AdminToken string `env:"GATEWAY_ADMIN_TOKEN" default:""`
	// MaxBulkRequests bounds the large batch and import requests served
	// at once (each may hold tens of MB): those whose body is declared
	// larger than KURZ_GATEWAY_MAX_BODY_BYTES, or not declared (chunked).
	// Past it they are answered 503 with a Retry-After before their body
	// is read. A smaller body takes no slot and is never refused for one.
	// A tenant holds at most half of the slots (at least one): its next
	// large one is answered 429. A large body must arrive at 64 KiB/s or
	// faster after its first 5 s, or it is answered 400 and its slot
	// freed, so a trickled body cannot hold a slot; bodies sent at that
	// rate or faster by other tenants can hold every slot for up to the
	// listener's read timeout (30 s), holding off large requests
	// meanwhile, not small ones.
	MaxBulkRequests int `env:"GATEWAY_MAX_BULK_REQUESTS" default:"2"`
	// ServiceAuth signs, on every call to the shortener and analytics, an
	// assertion of the tenant the gateway authenticated.
	ServiceAuth svcauth.Config
}

// Check runs options for server.Main, before the service starts.
func (c Config) Check() error {
	_, _, err := c.options()
	return errors.Join(err, c.Postgres.Check())
}

func (c Config) options() (httpapi.Options, *svcauth.Keys, error) {
	keys, err := c.ServiceAuth.Keys()
	errs := []error{err}
	clients, err := clientip.New(c.TrustedProxies, c.ClientIPHeader)
	if err != nil {
		errs = append(errs, fmt.Errorf("KURZ_GATEWAY_TRUSTED_PROXIES / KURZ_GATEWAY_CLIENT_IP_HEADER: %w", err))
	}
	if err := c.Keying.Check(); err != nil {
		errs = append(errs, err)
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
	if c.MaxBulkRequests < 1 || c.MaxBulkRequests > 1000 {
		errs = append(errs, fmt.Errorf("KURZ_GATEWAY_MAX_BULK_REQUESTS=%d: want 1 to 1000", c.MaxBulkRequests))
	}
	if c.AnonymousLocalLimit < 1 || c.AnonymousLocalLimit > 1_000_000 || c.AnonymousLocalBurst < 1 || c.AnonymousLocalBurst > 1_000_000 {
		errs = append(errs, fmt.Errorf("KURZ_GATEWAY_ANONYMOUS_LOCAL_LIMIT=%d / KURZ_GATEWAY_ANONYMOUS_LOCAL_BURST=%d: want 1 to 1000000 each",
			c.AnonymousLocalLimit, c.AnonymousLocalBurst))
	}
	if c.AdminToken != "" && len(c.AdminToken) < minAdminTokenLen {
		errs = append(errs, fmt.Errorf("KURZ_GATEWAY_ADMIN_TOKEN: want at least %d characters (or empty to disable the admin API)", minAdminTokenLen))
	}
	errs = append(errs, config.NotPublished("KURZ_GATEWAY_ADMIN_TOKEN", c.AdminToken, c.ServiceAuth.AllowPublishedSecrets))
	base, err := url.Parse(c.ShortBaseURL)
	if err != nil || (base.Scheme != "http" && base.Scheme != "https") || base.Host == "" {
		errs = append(errs, fmt.Errorf("KURZ_SHORTENER_BASE_URL=%q: want the shortener's base URL, an http(s) URL such as https://kurz.example", c.ShortBaseURL))
		base = &url.URL{}
	}
	return httpapi.Options{
		MaxBodyBytes:    c.MaxBodyBytes,
		MaxHeaderBytes:  c.MaxHeaderBytes,
		AllowAnonymous:  c.AllowAnonymous,
		AnonymousLocal:  httpapi.LocalRule{Limit: c.AnonymousLocalLimit, Burst: c.AnonymousLocalBurst},
		AdminToken:      c.AdminToken,
		Clients:         clients,
		Keying:          c.Keying,
		CallTimeout:     c.CallTimeout,
		MaxBulkRequests: c.MaxBulkRequests,
		ReadTimeout:     cmp.Or(c.HTTP.ReadTimeout, server.DefaultReadTimeout),
		DefaultDomain:   base.Host,
	}, keys, errors.Join(errs...)
}

// Build wires the gateway within lc: PostgreSQL (migrated), then its
// server, the downstream services and the HTTP API. Dialing does not wait
// for the services: readiness reports them. The main passes it to
// server.Main.
func Build(ctx context.Context, cfg Config, lc *server.Lifecycle, log *slog.Logger) (*server.Server, error) {
	opts, keys, err := cfg.options()
	if err != nil {
		return nil, fmt.Errorf("configuration:\n%w", err)
	}
	db, err := openPostgres(ctx, cfg, lc, log)
	if err != nil {
		return nil, err
	}
	srvCfg := cfg.Config(cfg.GRPCAddr, cfg.HTTPAddr)
	srvCfg.OpsAddr = cfg.OpsAddr
	srvCfg.GRPCMaxRecvMsgSize = server.SmallGRPCMaxRecvMsgSize // health and reflection alone
	// net/http's own header bound must stay well above the gateway's, so a
	// client over KURZ_GATEWAY_MAX_HEADER_BYTES gets the gateway's 431 with
	// its JSON body rather than net/http's bare one.
	srvCfg.HTTP.MaxHeaderBytes = max(srvCfg.HTTP.MaxHeaderBytes, server.DefaultMaxHeaderBytes, 4*cfg.MaxHeaderBytes)
	srv, err := server.New(ctx, "gateway", srvCfg, lc, log)
	if err != nil {
		return nil, err
	}
	conns, err := dialDownstream(cfg, keys, srv, lc)
	if err != nil {
		return nil, err
	}
	if err := registerAPI(cfg, opts, db, conns, srv, log); err != nil {
		return nil, err
	}
	srv.AddCheck("postgres", db.Ping)
	if w := opts.Clients.Warning(); w != "" {
		log.Warn(w, "variable", "KURZ_GATEWAY_TRUSTED_PROXIES")
	}
	log.Info("gateway configured", "anonymous", cfg.AllowAnonymous, "admin_api", cfg.AdminToken != "",
		"client_ip", opts.Clients.String(), "client_ipv6_prefix", cfg.Keying.IPv6Prefix, "limiter_timeout", cfg.LimiterTimeout, "max_body_bytes", cfg.MaxBodyBytes)
	return srv, nil
}

// New starts the gateway in process, as server.Main does before Run.
func New(ctx context.Context, cfg Config, log *slog.Logger) (*server.Server, error) {
	return server.Start(ctx, cfg, log, Build)
}

// openPostgres connects to PostgreSQL and applies the gateway's migrations.
func openPostgres(ctx context.Context, cfg Config, lc *server.Lifecycle, log *slog.Logger) (*pgxpool.Pool, error) {
	db, err := pgpool.New(ctx, cfg.Postgres)
	if err != nil {
		return nil, err
	}
	lc.Own("postgres", func(context.Context) error { db.Close(); return nil })
	applied, err := pgpool.Migrate(ctx, db, migrations.Component, migrations.FS)
	if err != nil {
		return nil, err
	}
	if len(applied) > 0 {
		log.Info("migrations applied", "names", applied)
	}
	return db, nil
}

// dialDownstream connects to the limiter, the shortener and analytics, by
// name, each with its readiness check.
func dialDownstream(cfg Config, keys *svcauth.Keys, srv *server.Server, lc *server.Lifecycle) (map[string]*grpc.ClientConn, error) {
	conns := map[string]*grpc.ClientConn{}
	// The limiter and analytics have fallbacks (quotas fail open, stats
	// answer 503): without them the gateway still serves, so they do not
	// take it out of rotation.
	// Calls to the shortener and analytics wait for a ready replica within
	// their deadline (KURZ_GATEWAY_CALL_TIMEOUT); limiter calls fail fast.
	bigAnswers := grpc.WithDefaultCallOptions(grpc.MaxCallRecvMsgSize(downstreamMaxRecvMsgSize))
	rulesKeys := keys.Only(limiterv1.RulesAdminService_ServiceDesc.ServiceName)
	// They carry the tenant's signed assertion; the limiter takes no tenant
	// from metadata and needs none.
	for _, d := range []struct {
		name, addr, variable string
		soft                 bool
		opts                 []grpc.DialOption
	}{
		// Of the limiter's calls, those of its rules admin API are signed.
		{"limiter", cfg.LimiterAddr, "KURZ_LIMITER_GRPC_ADDR", true, []grpc.DialOption{rulesKeys.DialOption(), rulesKeys.StreamDialOption()}},
		{"shortener", cfg.ShortenerAddr, "KURZ_SHORTENER_GRPC_ADDR", false, []grpc.DialOption{grpcclient.WaitForReplica, bigAnswers, keys.DialOption()}},
		{"analytics", cfg.AnalyticsAddr, "KURZ_ANALYTICS_GRPC_ADDR", true, []grpc.DialOption{grpcclient.WaitForReplica, bigAnswers, keys.DialOption()}},
	} {
		conn, err := grpcclient.Dial(d.addr, srv.Telemetry, d.opts...)
		if err != nil {
			return nil, fmt.Errorf("%s (%s): %w", d.name, d.variable, err)
		}
		lc.OwnCloser(d.name+" connection", conn)
		conns[d.name] = conn
		if d.soft {
			srv.AddSoftCheck(d.name, grpcclient.HealthCheck(conn))
		} else {
			srv.AddCheck(d.name, grpcclient.HealthCheck(conn))
		}
	}
	return conns, nil
}

// registerAPI puts the JSON API and the console on the server's HTTP
// listener.
func registerAPI(cfg Config, opts httpapi.Options, db *pgxpool.Pool, conns map[string]*grpc.ClientConn, srv *server.Server, log *slog.Logger) error {
	quotaClient, err := quota.New(conns["limiter"], cfg.LimiterTimeout, log, srv.Telemetry.MeterProvider)
	if err != nil {
		return err
	}
	api, err := httpapi.New(opts, httpapi.Deps{
		Shortener:  shortenerv1.NewShortenerServiceClient(conns["shortener"]),
		Webhooks:   shortenerv1.NewWebhookServiceClient(conns["shortener"]),
		Analytics:  analyticsv1.NewAnalyticsServiceClient(conns["analytics"]),
		RulesAdmin: limiterv1.NewRulesAdminServiceClient(conns["limiter"]),
		Quota:      quotaClient,
		Keys:       keystore.New(db, cfg.Postgres.QueryTimeout),
		Log:        log,
		Meter:      srv.Telemetry.MeterProvider.Meter("kurz.dev/services/gateway"),
		Ready:      srv.Ready,
	})
	if err != nil {
		return err
	}
	api.Register(srv.Mux)
	web, err := console.New()
	if err != nil {
		return err
	}
	web.Register(srv.Mux)
	srv.SetHandler(api.Wrap(srv.Mux))
	// A public listener: trace context only through the trusted proxies.
	srv.TrustTraceContextFrom(opts.Clients.FromTrustedProxy)
	// ... and a client's connections counted as its limits count it, the
	// proxies' not at all.
	srv.KeyClientConnections(cfg.Keying, opts.Clients.Trusted)
	return nil
}
