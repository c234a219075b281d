// Package app wires the limiter service: configuration, Redis Cluster, the
// rule source (PostgreSQL or a YAML file) and the gRPC APIs.
package app

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"runtime/debug"
	"time"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/redis/go-redis/v9"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"
	"google.golang.org/grpc"

	limiterv1 "kurz.dev/gen/kurz/limiter/v1"
	ratelimitv1 "kurz.dev/gen/kurz/ratelimit/v1"
	gubernatorpb "kurz.dev/gen/pb/gubernator"
	"kurz.dev/pkg/clientip"
	"kurz.dev/pkg/config"
	"kurz.dev/pkg/pgpool"
	"kurz.dev/pkg/redisconn"
	"kurz.dev/pkg/server"
	"kurz.dev/pkg/svcauth"
	"kurz.dev/services/limiter/internal/quotaapi"
	"kurz.dev/services/limiter/internal/ratelimit"
	"kurz.dev/services/limiter/internal/rulesadmin"
	"kurz.dev/services/limiter/internal/rulestore"
	"kurz.dev/services/limiter/internal/rulestore/migrations"
)

// Config is the limiter's configuration, from KURZ_* environment variables.
type Config struct {
	server.Common
	// GRPCAddr is the limiter's gRPC address: where it listens, and where its callers dial it.
	GRPCAddr string `env:"LIMITER_GRPC_ADDR" default:"127.0.0.1:9091"`
	// HTTPAddr is the limiter's ops HTTP address (/healthz, /readyz, /metrics).
	HTTPAddr string `env:"LIMITER_HTTP_ADDR" default:"127.0.0.1:9191"`
	Redis    redisconn.Config
	Postgres pgpool.Config
	// RulesSource is "postgres" (rules in the database, seeded from the
	// bootstrap file, reloaded on NOTIFY) or "file" (the YAML file only).
	RulesSource string `env:"LIMITER_RULES_SOURCE" default:"postgres"`
	// RulesFile is the bootstrap / rules YAML; empty means the one built in.
	// An envoyproxy/ratelimit configuration file (top-level domain), or a
	// directory of them (its runtime config directory, a mounted
	// ConfigMap), is translated as is (services/limiter/README.md, "Coming
	// from envoyproxy/ratelimit"). At most 1 MiB, a ConfigMap's bound, in
	// either format (a directory's files together).
	RulesFile string `env:"LIMITER_RULES_FILE" default:""`
	// EnvoyMergeDomains is envoyproxy/ratelimit's MERGE_DOMAIN_CONFIG for
	// a directory of its files in KURZ_LIMITER_RULES_FILE: several files
	// may hold one domain, their top-level descriptors merged (the same
	// top-level descriptor in two of them is refused, as it refuses it).
	// Off, one domain in two files is refused. `kurzctl rules apply DIR
	// --merge-domains` is the same choice for an apply.
	EnvoyMergeDomains bool `env:"LIMITER_ENVOY_MERGE_DOMAINS" default:"false"`
	// RulesRefresh is how often the rules are reloaded (a PostgreSQL NOTIFY reloads them at once; tenants' plans, which a NOTIFY names, every 30th time), at least 1s.
	RulesRefresh time.Duration `env:"LIMITER_RULES_REFRESH" default:"10s"`
	// RedisTimeout bounds every decision's Redis call; past it the rule's
	// failure mode decides. 10 ms: at 32 callers on a 2-core machine
	// shared with Redis, 5 ms decided 98.8% of answers on Redis, 10 ms
	// 99.8%, 20 ms all; Envoy's rate-limit filter gives up at 20 ms by
	// default, and the rule's failure mode must answer before it does.
	RedisTimeout time.Duration `env:"LIMITER_REDIS_TIMEOUT" default:"10ms"`
	// Replicas is the number of limiter replicas when the live count is
	// off (KURZ_LIMITER_FLEET_HEARTBEAT=0): the local fallback admits
	// limit/replicas per key on each, rounded down. With it on (the
	// default), it is KURZ_LIMITER_MAX_REPLICAS's default.
	Replicas int `env:"LIMITER_REPLICAS" default:"1"`
	// RedisKeyPrefix goes before every Redis key the limiter uses (the
	// rules' counters, tenants' too, the leases' and the fleet's
	// heartbeats): <prefix>rl:{...}, outside the hash tag, so keys stay on
	// their slots. Limiters sharing a Redis Cluster (the stack's and an
	// Envoy-only one, two installs, staging and prod) then count apart even
	// on domains of the same name, as envoyproxy/ratelimit's
	// CACHE_KEY_PREFIX does. Empty: the keys as they always were. Changing
	// it starts every counter afresh (the old keys expire unread). At most
	// 64 printable ASCII characters, no whitespace, no { or }.
	RedisKeyPrefix string `env:"LIMITER_REDIS_KEY_PREFIX" default:""`
	// Fleet names the limiter replicas that share the rules: each one
	// heartbeats into the Redis key rl:fleet:{<name>} (after
	// KURZ_LIMITER_REDIS_KEY_PREFIX) and the local
	// fallback and lease shares divide by the live count. 1 to 64
	// characters of A-Z a-z 0-9 . _ -.
	Fleet string `env:"LIMITER_FLEET" default:"default"`
	// MaxReplicas is the most limiter replicas there may be (the
	// autoscaler's maximum): the count assumed by a replica that has not
	// read the live one yet, the conservative end. 0 means
	// KURZ_LIMITER_REPLICAS.
	MaxReplicas int `env:"LIMITER_MAX_REPLICAS" default:"0"`
	// FleetHeartbeat is how often a replica renews its fleet entry and
	// reads the live count; a replica that dies stops counting three
	// heartbeats later, one that shuts down at once. 0 turns the live
	// count off: KURZ_LIMITER_REPLICAS is the count, fixed. Otherwise at
	// least 100ms: each heartbeat runs a script on Redis.
	FleetHeartbeat time.Duration `env:"LIMITER_FLEET_HEARTBEAT" default:"2s"`
	// BreakerThreshold is the consecutive failures that open a Redis node's breaker.
	BreakerThreshold int `env:"LIMITER_BREAKER_THRESHOLD" default:"3"`
	// BreakerCooldown is how long a breaker that has just opened skips its
	// Redis node before it probes it again; each failed probe doubles it.
	BreakerCooldown time.Duration `env:"LIMITER_BREAKER_COOLDOWN" default:"100ms"`
	// BreakerMaxCooldown is the longest an open breaker skips its node
	// between probes while the node stays down; 0 means the larger of 1s
	// and KURZ_LIMITER_BREAKER_COOLDOWN.
	BreakerMaxCooldown time.Duration `env:"LIMITER_BREAKER_MAX_COOLDOWN" default:"0s"`
	// AllowLogEvery logs one allowed decision in this many (0: none);
	// denials are logged up to ten a second per rule
	// (ratelimit.DenyLogsPerSecond), the next line counting the rest.
	AllowLogEvery int `env:"LIMITER_ALLOW_LOG_EVERY" default:"1000"`
	// AutoPipeline batches concurrent decisions into one pipeline per Redis
	// node.
	AutoPipeline bool `env:"LIMITER_AUTOPIPELINE" default:"true"`
	// NearLimitRatio is envoyproxy/ratelimit's NEAR_LIMIT_RATIO: an allowed
	// decision that leaves its rule with more than this share of its
	// capacity used (burst for buckets, else limit; of a limit of 10 at
	// 0.8, the 9th and 10th request) is counted in
	// kurz_ratelimit_near_limit_total{domain,rule}. More than 0, at most 1.
	NearLimitRatio float64 `env:"LIMITER_NEAR_LIMIT_RATIO" default:"0.8"`
	// EnvoyHeaders are the rate-limit fields Envoy's rate-limit API asks
	// Envoy to add to responses: draft (RateLimit and RateLimit-Policy, the
	// current IETF draft's, as the gateway sends), legacy (RateLimit-Limit,
	// -Remaining and -Reset, an earlier draft's) or both.
	EnvoyHeaders string `env:"LIMITER_ENVOY_HEADERS" default:"draft"`
	// EnvoyIPv6Prefix is how many leading bits of an IPv6 address in Envoy's
	// remote_address descriptor entry (and in the forward auth's
	// remote_address source) name one client (48..128): a client
	// usually holds a whole /64 and could otherwise pick a new address for
	// every request. IPv4 addresses are kept whole; 128 keeps IPv6 whole.
	EnvoyIPv6Prefix int `env:"LIMITER_ENVOY_IPV6_PREFIX" default:"64"`
	// EnvoyHTTP serves envoyproxy/ratelimit's HTTP endpoints on the HTTP
	// listener (KURZ_LIMITER_HTTP_ADDR): POST /json, a RateLimitRequest as
	// JSON decided as ShouldRateLimit decides it (200 OK, 429 over the
	// limit), and GET /healthcheck, the readiness (200 OK, else 500). Off
	// by default: that listener is the ops port (/metrics, /readyz), which
	// the Kubernetes NetworkPolicies open to the metrics scraper only;
	// open it to the callers too (services/limiter/README.md, "Coming from
	// envoyproxy/ratelimit").
	EnvoyHTTP bool `env:"LIMITER_ENVOY_HTTP" default:"false"`
	// ForwardAuth serves /forward-auth/{domain} on the HTTP listener
	// (KURZ_LIMITER_HTTP_ADDR), for the forward-auth of nginx
	// (auth_request), ingress-nginx (auth-url), Traefik (ForwardAuth) and
	// Caddy (forward_auth): the descriptors its URL names, taken from the
	// forwarded request, decided as ShouldRateLimit decides them (200 to
	// let the request through; 429, or the URL's deny_status, with
	// Retry-After to refuse it). Off by default, as
	// KURZ_LIMITER_ENVOY_HTTP and for the same reason: open port http to
	// the proxies (services/limiter/README.md, "Forward auth").
	ForwardAuth bool `env:"LIMITER_FORWARD_AUTH" default:"false"`
	// Gubernator serves gubernator's V1 API, for its clients unchanged:
	// pb.gubernator.V1/GetRateLimits and HealthCheck on the gRPC listener,
	// and its HTTP gateway (POST /v1/GetRateLimits, GET /v1/HealthCheck)
	// on the HTTP listener. Each request carries its own limit, decided
	// exactly on Redis (services/limiter/README.md, "Coming from
	// gubernator"). Off by default: anyone reaching the port could then
	// set limits of their own in Redis.
	Gubernator bool `env:"LIMITER_GUBERNATOR" default:"false"`
	// GubernatorFailureMode is what the gubernator API's limits answer
	// when Redis fails or is slower than KURZ_LIMITER_REDIS_TIMEOUT, as a
	// rule's failure_mode: open (UNDER_LIMIT), closed (OVER_LIMIT) or
	// local (this replica's share of each limit, in memory).
	GubernatorFailureMode string `env:"LIMITER_GUBERNATOR_FAILURE_MODE" default:"open"`
	// GubernatorMaxDuration bounds how long a gubernator limit's state
	// lasts in Redis: a request whose duration (or leaky bucket's time to
	// drain its burst) is longer is refused in its error. Each (name,
	// unique_key) is a Redis key for that long, where gubernator keeps an
	// LRU of GUBER_CACHE_SIZE: a client sending new keys fills Redis at
	// its rate times this. At most 400 days, whole milliseconds.
	GubernatorMaxDuration time.Duration `env:"LIMITER_GUBERNATOR_MAX_DURATION" default:"24h"`
	// ServiceAuth verifies the gateway's signed calls of the rules admin
	// API (RulesAdminService: GET and PUT /v1/admin/rules), the gateway's
	// key. Without KURZ_SERVICE_AUTH_KEY that API is off; the decisions
	// (CheckQuota, Envoy's ShouldRateLimit) never need it.
	ServiceAuth svcauth.Config
}

// Check runs validate for server.Main, before the service starts.
func (c Config) Check() error {
	errs := []error{c.validate(), c.Redis.Check()}
	if c.RulesSource == "postgres" { // the only use of PostgreSQL
		errs = append(errs, c.Postgres.Check())
	}
	return errors.Join(errs...)
}

func (c Config) validate() error {
	var errs []error
	if c.RulesSource != "postgres" && c.RulesSource != "file" {
		errs = append(errs, fmt.Errorf("KURZ_LIMITER_RULES_SOURCE=%q: want postgres or file", c.RulesSource))
	}
	if c.RedisTimeout <= 0 {
		errs = append(errs, errors.New("KURZ_LIMITER_REDIS_TIMEOUT must be positive"))
	}
	errs = append(errs,
		config.Period("KURZ_LIMITER_RULES_REFRESH", c.RulesRefresh, time.Second),
		config.PeriodOrOff("KURZ_LIMITER_FLEET_HEARTBEAT", c.FleetHeartbeat, 100*time.Millisecond))
	if c.BreakerCooldown <= 0 || (c.BreakerMaxCooldown > 0 && c.BreakerMaxCooldown < c.BreakerCooldown) {
		errs = append(errs, fmt.Errorf("KURZ_LIMITER_BREAKER_COOLDOWN=%s, KURZ_LIMITER_BREAKER_MAX_COOLDOWN=%s: want 0 < cooldown <= max cooldown (or max 0)", c.BreakerCooldown, c.BreakerMaxCooldown))
	}
	if c.Replicas < 1 {
		errs = append(errs, errors.New("KURZ_LIMITER_REPLICAS must be at least 1"))
	}
	if c.BreakerThreshold < 1 || c.BreakerThreshold > 1000 {
		errs = append(errs, fmt.Errorf("KURZ_LIMITER_BREAKER_THRESHOLD=%d: want 1 to 1000", c.BreakerThreshold))
	}
	if !(c.NearLimitRatio > 0 && c.NearLimitRatio <= 1) {
		errs = append(errs, fmt.Errorf("KURZ_LIMITER_NEAR_LIMIT_RATIO=%v: want more than 0 and at most 1 (0.8: envoyproxy/ratelimit's default)", c.NearLimitRatio))
	}
	if c.AllowLogEvery < 0 {
		errs = append(errs, fmt.Errorf("KURZ_LIMITER_ALLOW_LOG_EVERY=%d: want 0 (none logged) or more", c.AllowLogEvery))
	}
	if _, err := quotaapi.ParseHeaderStyle(c.EnvoyHeaders); err != nil {
		errs = append(errs, fmt.Errorf("KURZ_LIMITER_ENVOY_HEADERS: %w", err))
	}
	if err := (clientip.Keying{IPv6Prefix: c.EnvoyIPv6Prefix}).Check(); err != nil {
		errs = append(errs, fmt.Errorf("KURZ_LIMITER_ENVOY_IPV6_PREFIX=%d: want 48..128", c.EnvoyIPv6Prefix))
	}
	if c.MaxReplicas != 0 && c.MaxReplicas < c.Replicas {
		errs = append(errs, fmt.Errorf("KURZ_LIMITER_MAX_REPLICAS=%d: below KURZ_LIMITER_REPLICAS=%d (0 means the same)", c.MaxReplicas, c.Replicas))
	}
	if _, err := ratelimit.ParseFailureMode(c.GubernatorFailureMode); err != nil {
		errs = append(errs, fmt.Errorf("KURZ_LIMITER_GUBERNATOR_FAILURE_MODE: %w", err))
	}
	if d := c.GubernatorMaxDuration; d < time.Millisecond || d > ratelimit.MaxWindow || d%time.Millisecond != 0 {
		errs = append(errs, fmt.Errorf("KURZ_LIMITER_GUBERNATOR_MAX_DURATION=%v: want whole milliseconds, 1ms to %v", d, ratelimit.MaxWindow))
	}
	if err := ratelimit.ValidKeyPrefix(c.RedisKeyPrefix); err != nil {
		errs = append(errs, fmt.Errorf("KURZ_LIMITER_REDIS_KEY_PREFIX: %w", err))
	}
	if err := ratelimit.ValidFleetName(c.Fleet); err != nil {
		errs = append(errs, fmt.Errorf("KURZ_LIMITER_FLEET: %w", err))
	}
	if _, err := c.adminKeys(); err != nil {
		errs = append(errs, err)
	}
	return errors.Join(errs...)
}

// adminKeys verify the calls of the rules admin API, and only those; nil
// (the API off) without KURZ_SERVICE_AUTH_KEY.
func (c Config) adminKeys() (*svcauth.Keys, error) {
	if c.ServiceAuth.Key == "" {
		return nil, nil
	}
	keys, err := c.ServiceAuth.Keys()
	if err != nil {
		return nil, err
	}
	return keys.Only(limiterv1.RulesAdminService_ServiceDesc.ServiceName), nil
}

// httpDecisionTimeout bounds a decision of POST /json or of the forward
// auth, whose callers send no deadline, as Envoy's (20 ms by default)
// bounds a ShouldRateLimit: far above the Redis deadline
// (KURZ_LIMITER_REDIS_TIMEOUT), past which a rule's failure mode decides,
// so it only cuts a call that waits on something else.
const httpDecisionTimeout = time.Second

// leaseReturnTimeout bounds giving the leases back at shutdown.
const leaseReturnTimeout = 2 * time.Second

// Build wires the limiter within lc: its stores and rules, then its server,
// the decision engine and the gRPC APIs. The main passes it to server.Main.
func Build(ctx context.Context, cfg Config, lc *server.Lifecycle, log *slog.Logger) (*server.Server, error) {
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	st, err := openStores(ctx, cfg, lc, log)
	if err != nil {
		return nil, err
	}
	srvCfg := cfg.Config(cfg.GRPCAddr, cfg.HTTPAddr)
	// Envoy and the services call it unauthenticated: the receive bound,
	// times the calls held, is what a stranger can make it buffer.
	srvCfg.GRPCMaxRecvMsgSize = server.LimiterGRPCMaxRecvMsgSize
	keys, _ := cfg.adminKeys() // validated above
	var authOpts []grpc.ServerOption
	if keys != nil {
		srvCfg.GRPCAuthenticate = keys.Tap
		authOpts = keys.ServerOptions()
	}
	srv, err := server.New(ctx, "limiter", srvCfg, lc, log, authOpts...)
	if err != nil {
		return nil, err
	}
	engine, err := startEngine(cfg, st, srv, lc, log)
	if err != nil {
		return nil, err
	}
	// Without Redis every rule answers by its failure mode, without
	// PostgreSQL the rules loaded last hold: the limiter keeps deciding.
	srv.AddSoftCheck("redis", func(ctx context.Context) error { return redisconn.Check(ctx, st.rdb) })
	if st.db != nil {
		srv.AddSoftCheck("postgres", st.db.Ping)
	}
	ratelimitv1.RegisterRateLimitServiceServer(srv, quotaapi.New(engine))
	style, _ := quotaapi.ParseHeaderStyle(cfg.EnvoyHeaders) // validated above
	keying := clientip.Keying{IPv6Prefix: cfg.EnvoyIPv6Prefix}
	envoy := quotaapi.NewEnvoy(engine, style, keying)
	rlsv3.RegisterRateLimitServiceServer(srv, envoy)
	// The HTTP endpoints decide through the same handler as gRPC's, within
	// gRPC's bounds on a request and on the requests held at once (a share
	// of GOMEMLIMIT), which they share.
	inFlight := quotaapi.NewInFlight(server.GRPCMaxCallsFor(debug.SetMemoryLimit(-1), server.LimiterGRPCMaxRecvMsgSize))
	if cfg.EnvoyHTTP {
		srv.Mux.Handle("/json", quotaapi.NewEnvoyJSON(envoy, server.LimiterGRPCMaxRecvMsgSize, inFlight, httpDecisionTimeout, log))
		srv.Mux.Handle("GET /healthcheck", quotaapi.EnvoyHealthcheck(srv.Ready))
	}
	if cfg.ForwardAuth {
		srv.Mux.Handle(quotaapi.ForwardAuthRoute, quotaapi.NewForwardAuth(envoy, keying, inFlight, httpDecisionTimeout, log))
		// The proxies pass their clients' headers on, traceparent
		// included: a forward-auth request starts a trace of its own.
		srv.TrustTraceContextFrom(func(r *http.Request) bool { return !quotaapi.IsForwardAuth(r) })
	}
	if cfg.Gubernator {
		failure, _ := ratelimit.ParseFailureMode(cfg.GubernatorFailureMode) // validated above
		guber := quotaapi.NewGubernator(engine, failure, srv.Ready).WithMaxDuration(cfg.GubernatorMaxDuration)
		gubernatorpb.RegisterV1Server(srv, guber)
		quotaapi.NewGubernatorHTTP(guber, server.LimiterGRPCMaxRecvMsgSize, inFlight, httpDecisionTimeout, log).Register(srv.Mux)
	}
	if keys != nil {
		limiterv1.RegisterRulesAdminServiceServer(srv, rulesadmin.New(st.db, rulestore.FileSource{Path: cfg.RulesFile, Envoy: rulestore.EnvoyOptions{MergeDomains: cfg.EnvoyMergeDomains}}, log))
	} else {
		log.Info("rules admin API off (GET and PUT /v1/admin/rules answer 503): give the limiter KURZ_SERVICE_AUTH_KEY, the gateway's, to turn it on")
	}
	return srv, nil
}

// New starts the limiter in process, as server.Main does before Run.
func New(ctx context.Context, cfg Config, log *slog.Logger) (*server.Server, error) {
	return server.Start(ctx, cfg, log, Build)
}

// stores are the limiter's connections and the rules it starts with.
type stores struct {
	rdb *redis.ClusterClient
	// db is nil when the rules come from the file only.
	db     *pgxpool.Pool
	source rulestore.Source
	rules  *ratelimit.Ruleset
	// partial is the first load's PartialError, if any: counted as a
	// failed refresh once the counter exists.
	partial error
}

// newRedis is the limiter's Redis Cluster client. It never sends a command
// twice (redisconn.NoRetries): every limiter write consumes or returns
// units, and one resent after a broken connection (its reply lost, the
// script run) counts twice; a refund or a lease's give-back run twice
// hands back units that were used, and admits past the limit. A decision
// whose call fails answers by its rule's failure mode instead. A replica
// started during a Redis outage serves by the rules' failure modes (the
// fleet's count is then KURZ_LIMITER_MAX_REPLICAS) rather than
// crash-looping while its peers fall back.
func newRedis(ctx context.Context, cfg redisconn.Config, log *slog.Logger, opts ...redisconn.Option) (*redis.ClusterClient, error) {
	return redisconn.New(ctx, cfg, append([]redisconn.Option{redisconn.NoRetries, redisconn.StartUnreachable(func(err error) {
		log.Error("starting without Redis: decisions follow each rule's failure mode until it answers", "err", err)
	})}, opts...)...)
}

// openStores connects to Redis Cluster (and PostgreSQL in postgres mode) and
// loads the rules.
func openStores(ctx context.Context, cfg Config, lc *server.Lifecycle, log *slog.Logger) (stores, error) {
	// The per-decision deadline (RedisTimeout) must be what cuts a slow
	// call: a shorter socket timeout would fail a call (and close its
	// connection) that the decision's own budget still allows.
	cfg.Redis.ReadTimeout = max(cfg.Redis.ReadTimeout, 10*cfg.RedisTimeout)
	cfg.Redis.WriteTimeout = max(cfg.Redis.WriteTimeout, 10*cfg.RedisTimeout)
	rdb, err := newRedis(ctx, cfg.Redis, log)
	if err != nil {
		return stores{}, err
	}
	lc.OwnCloser("redis", rdb)
	st := stores{rdb: rdb, source: rulestore.FileSource{Path: cfg.RulesFile, Envoy: rulestore.EnvoyOptions{MergeDomains: cfg.EnvoyMergeDomains}}}
	if cfg.RulesSource == "postgres" {
		var seeded ratelimit.Config
		if st.db, seeded, err = openRulesDB(ctx, cfg, lc, log); err != nil {
			return stores{}, err
		}
		st.source = &rulestore.PostgresSource{Pool: st.db, Log: log, Shipped: seeded}
	}
	first, err := st.source.Load(ctx)
	if partial := (*rulestore.PartialError)(nil); errors.As(err, &partial) {
		// Start with the rest: a bad row must not keep every limiter down.
		log.Error("rule rows that do not compile are held at the shipped version or left out: fix them", "err", err)
		st.partial = err
	} else if err != nil {
		return stores{}, err
	}
	st.rules, err = ratelimit.Compile(first)
	return st, err
}

// openRulesDB connects to PostgreSQL, migrates the rules schema and seeds
// it from the bootstrap file.
func openRulesDB(ctx context.Context, cfg Config, lc *server.Lifecycle, log *slog.Logger) (*pgxpool.Pool, ratelimit.Config, error) {
	db, err := pgpool.New(ctx, cfg.Postgres)
	if err != nil {
		return nil, ratelimit.Config{}, err
	}
	lc.Own("postgres", func(context.Context) error { db.Close(); return nil })
	if _, err := pgpool.Migrate(ctx, db, "limiter", migrations.FS); err != nil {
		return nil, ratelimit.Config{}, err
	}
	boot, err := rulestore.ReadFileWith(cfg.RulesFile, rulestore.EnvoyOptions{MergeDomains: cfg.EnvoyMergeDomains})
	if err != nil {
		return nil, ratelimit.Config{}, err
	}
	n, err := rulestore.Seed(ctx, db, boot)
	if err != nil {
		return nil, ratelimit.Config{}, err
	}
	if n > 0 {
		log.Info("bootstrap rules seeded into postgres", "items", n, "file", cfg.RulesFile)
	}
	return db, boot, nil
}

// startEngine builds the decision engine on the stores' rules and starts its
// background work: the rules refresh (woken by NOTIFY in postgres mode) and
// the cluster slot map's.
func startEngine(cfg Config, st stores, srv *server.Server, lc *server.Lifecycle, log *slog.Logger) (*ratelimit.Engine, error) {
	fleet := ratelimit.StaticFleet(cfg.Replicas)
	if cfg.FleetHeartbeat > 0 {
		var err error
		fleet, err = ratelimit.NewFleet(st.rdb, ratelimit.FleetOptions{
			Name: cfg.Fleet, KeyPrefix: cfg.RedisKeyPrefix, Heartbeat: cfg.FleetHeartbeat, MaxReplicas: cmp.Or(cfg.MaxReplicas, cfg.Replicas),
		}, log, srv.Telemetry.MeterProvider)
		if err != nil {
			return nil, err
		}
	}
	engine, err := ratelimit.NewEngine(st.rdb, st.rules, ratelimit.Options{
		Timeout:            cfg.RedisTimeout,
		Fleet:              fleet,
		BreakerThreshold:   cfg.BreakerThreshold,
		BreakerCooldown:    cfg.BreakerCooldown,
		BreakerMaxCooldown: cfg.BreakerMaxCooldown,
		AllowLogEvery:      int64(cfg.AllowLogEvery),
		AutoPipeline:       cfg.AutoPipeline,
		KeyPrefix:          cfg.RedisKeyPrefix,
		NearLimitRatio:     cfg.NearLimitRatio,
	}, log, srv.Telemetry.MeterProvider)
	if err != nil {
		return nil, err
	}
	refresher, err := newRefresher(cfg, st.source, engine, srv.Telemetry.MeterProvider.Meter("kurz.dev/services/limiter"), log)
	if err != nil {
		return nil, err
	}
	if st.partial != nil {
		refresher.OnResult(st.partial)
	}
	// Closed in reverse: the background work stops, then the leases go
	// back, then the refunds drain, then the stores close.
	lc.Own("refunds", func(context.Context) error { engine.Wait(); return nil })
	lc.Own("leases", func(ctx context.Context) error {
		// Unused leased units back to Redis, so a rolling restart strands
		// none; past the bound they return when their window or bucket
		// refills, which is not worth failing the shutdown for.
		ctx, cancel := context.WithTimeout(ctx, leaseReturnTimeout)
		defer cancel()
		if err := engine.ReturnLeases(ctx); err != nil {
			log.Warn("leases not all returned; their units come back when their windows or buckets refill", "err", err)
		}
		return nil
	})
	var changes *rulestore.Changes
	if st.db != nil {
		changes = rulestore.NewChanges()
		lc.Go("rules listener", func(ctx context.Context) { rulestore.Listen(ctx, st.db, changes, log) })
	}
	lc.Go("rules refresh", func(ctx context.Context) { refresher.Run(ctx, changes) })
	lc.Go("slot map refresh", engine.Run)
	// Stopped after the drain: the replica leaves the fleet once it no
	// longer answers, and the others' shares grow.
	lc.Go("fleet heartbeat", fleet.Run)
	return engine, nil
}

// newRefresher reloads the rules into engine every RulesRefresh (and when
// notified), counting the reloads by outcome and by the rules' source
// (postgres or file): a refused rules file stays refused until someone
// edits it, and the alerts page on it (KurzLimiterRulesFileRefused) where
// a PostgreSQL row that does not compile only warns.
func newRefresher(cfg Config, source rulestore.Source, engine *ratelimit.Engine, meter metric.Meter, log *slog.Logger) (*rulestore.Refresher, error) {
	refreshes, err := meter.Int64Counter(
		"kurz.ratelimit.rules.refreshes", metric.WithUnit("{refresh}"),
		metric.WithDescription("Rule reloads by outcome and rules source; a failed one keeps the last good rules"))
	if err != nil {
		return nil, err
	}
	ok := metric.WithAttributeSet(attribute.NewSet(attribute.Bool("ok", true), attribute.String("source", cfg.RulesSource)))
	failed := metric.WithAttributeSet(attribute.NewSet(attribute.Bool("ok", false), attribute.String("source", cfg.RulesSource)))
	return &rulestore.Refresher{
		Source: source, Interval: cfg.RulesRefresh, Apply: engine.SetRules, Log: log,
		OnResult: func(err error) {
			if err != nil {
				refreshes.Add(context.Background(), 1, failed)
				return
			}
			refreshes.Add(context.Background(), 1, ok)
		},
	}, nil
}
