// Package app wires the limiter service: configuration, Redis Cluster, the
// rule source (PostgreSQL or a YAML file) and the gRPC APIs.
package app

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync/atomic"
	"time"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"github.com/jackc/pgx/v5/pgxpool"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"

	ratelimitv1 "kurz.dev/gen/kurz/ratelimit/v1"
	"kurz.dev/pkg/pgpool"
	"kurz.dev/pkg/redisconn"
	"kurz.dev/pkg/server"
	"kurz.dev/services/limiter/internal/quotaapi"
	"kurz.dev/services/limiter/internal/ratelimit"
	"kurz.dev/services/limiter/internal/rulestore"
	"kurz.dev/services/limiter/internal/rulestore/migrations"
)

// Config is the limiter's configuration, from KURZ_* environment variables.
type Config struct {
	server.Common
	GRPCAddr string `env:"LIMITER_GRPC_ADDR" default:"127.0.0.1:9091"`
	HTTPAddr string `env:"LIMITER_HTTP_ADDR" default:"127.0.0.1:9191"`
	Redis    redisconn.Config
	Postgres pgpool.Config
	// RulesSource is "postgres" (rules in the database, seeded from the
	// bootstrap file, reloaded on NOTIFY) or "file" (the YAML file only).
	RulesSource string `env:"LIMITER_RULES_SOURCE" default:"postgres"`
	// RulesFile is the bootstrap / rules YAML; empty means the one built in.
	RulesFile    string        `env:"LIMITER_RULES_FILE" default:""`
	RulesRefresh time.Duration `env:"LIMITER_RULES_REFRESH" default:"10s"`
	// RedisTimeout bounds every decision's Redis call; past it the rule's
	// failure mode decides. 10 ms: at 32 callers on a 2-core machine
	// shared with Redis, 5 ms decided 98.8% of answers on Redis, 10 ms
	// 99.8%, 20 ms all; Envoy's rate-limit filter gives up at 20 ms by
	// default, and the rule's failure mode must answer before it does.
	RedisTimeout     time.Duration `env:"LIMITER_REDIS_TIMEOUT" default:"10ms"`
	Replicas         int           `env:"LIMITER_REPLICAS" default:"1"`
	BreakerThreshold int           `env:"LIMITER_BREAKER_THRESHOLD" default:"3"`
	BreakerCooldown  time.Duration `env:"LIMITER_BREAKER_COOLDOWN" default:"1s"`
	// AllowLogEvery logs one allowed decision in this many; every denial is
	// logged.
	AllowLogEvery int `env:"LIMITER_ALLOW_LOG_EVERY" default:"1000"`
	// AutoPipeline batches concurrent decisions into one pipeline per Redis
	// node.
	AutoPipeline bool `env:"LIMITER_AUTOPIPELINE" default:"true"`
}

func (c Config) validate() error {
	var errs []error
	if c.RulesSource != "postgres" && c.RulesSource != "file" {
		errs = append(errs, fmt.Errorf("KURZ_LIMITER_RULES_SOURCE=%q: want postgres or file", c.RulesSource))
	}
	if c.RedisTimeout <= 0 {
		errs = append(errs, errors.New("KURZ_LIMITER_REDIS_TIMEOUT must be positive"))
	}
	if c.RulesRefresh <= 0 {
		errs = append(errs, errors.New("KURZ_LIMITER_RULES_REFRESH must be positive"))
	}
	if c.Replicas < 1 {
		errs = append(errs, errors.New("KURZ_LIMITER_REPLICAS must be at least 1"))
	}
	return errors.Join(errs...)
}

// leaseReturnTimeout bounds giving the leases back at shutdown.
const leaseReturnTimeout = 2 * time.Second

// New connects to Redis Cluster (and PostgreSQL in postgres mode), loads the
// rules, and returns the limiter's server, ready to Run.
func New(ctx context.Context, cfg Config, log *slog.Logger) (*server.Server, error) {
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	var closers []func()
	fail := func(err error) (*server.Server, error) {
		for _, c := range closers {
			c()
		}
		return nil, err
	}

	// The per-decision deadline (RedisTimeout) must be what cuts a slow
	// call: a socket timeout that fires first makes go-redis retry the
	// script, and a retried decision can consume twice.
	cfg.Redis.ReadTimeout = max(cfg.Redis.ReadTimeout, 10*cfg.RedisTimeout)
	cfg.Redis.WriteTimeout = max(cfg.Redis.WriteTimeout, 10*cfg.RedisTimeout)
	rdb, err := redisconn.New(ctx, cfg.Redis)
	if err != nil {
		return nil, err
	}
	closers = append(closers, func() { _ = rdb.Close() })

	var db *pgxpool.Pool
	var source rulestore.Source = rulestore.FileSource{Path: cfg.RulesFile}
	if cfg.RulesSource == "postgres" {
		if db, err = pgpool.New(ctx, cfg.Postgres); err != nil {
			return fail(err)
		}
		closers = append(closers, db.Close)
		if _, err := pgpool.Migrate(ctx, db, "limiter", migrations.FS); err != nil {
			return fail(err)
		}
		boot, err := rulestore.ReadFile(cfg.RulesFile)
		if err != nil {
			return fail(err)
		}
		if n, err := rulestore.Seed(ctx, db, boot); err != nil {
			return fail(err)
		} else if n > 0 {
			log.Info("bootstrap rules seeded into postgres", "items", n, "file", cfg.RulesFile)
		}
		source = rulestore.PostgresSource{Pool: db}
	}
	first, err := source.Load(ctx)
	if err != nil {
		return fail(err)
	}
	rules, err := ratelimit.Compile(first)
	if err != nil {
		return fail(err)
	}

	srv, err := server.New(ctx, "limiter", cfg.Config(cfg.GRPCAddr, cfg.HTTPAddr), log)
	if err != nil {
		return fail(err)
	}
	engine, err := ratelimit.NewEngine(rdb, rules, ratelimit.Options{
		Timeout:          cfg.RedisTimeout,
		Replicas:         cfg.Replicas,
		BreakerThreshold: cfg.BreakerThreshold,
		BreakerCooldown:  cfg.BreakerCooldown,
		AllowLogEvery:    int64(cfg.AllowLogEvery),
		AutoPipeline:     cfg.AutoPipeline,
	}, log, srv.Telemetry.MeterProvider)
	if err != nil {
		return fail(errors.Join(err, srv.Close(ctx)))
	}

	refreshes, err := srv.Telemetry.MeterProvider.Meter("kurz.dev/services/limiter").Int64Counter(
		"kurz.ratelimit.rules.refreshes", metric.WithUnit("{refresh}"),
		metric.WithDescription("Rule reloads by outcome; a failed one keeps the last good rules"))
	if err != nil {
		return fail(errors.Join(err, srv.Close(ctx)))
	}
	var lastRefreshErr atomic.Pointer[error]
	refresher := &rulestore.Refresher{
		Source: source, Interval: cfg.RulesRefresh, Apply: engine.SetRules, Log: log,
		OnResult: func(err error) {
			lastRefreshErr.Store(&err)
			refreshes.Add(context.Background(), 1, metric.WithAttributes(attribute.Bool("ok", err == nil)))
		},
	}
	bg, stopBG := context.WithCancel(context.Background())
	notify := make(chan struct{}, 1)
	if db != nil {
		go rulestore.Listen(bg, db, notify, log)
	}
	go refresher.Run(bg, notify)
	go engine.Run(bg)

	// Order matters: closers run in reverse, so background work stops first,
	// then leases go back, then refunds drain, then the stores close.
	for _, c := range closers {
		srv.OnShutdown(func(context.Context) error { c(); return nil })
	}
	srv.OnShutdown(func(context.Context) error { engine.Wait(); return nil })
	srv.OnShutdown(func(ctx context.Context) error {
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
	srv.OnShutdown(func(context.Context) error { stopBG(); return nil })
	// Without Redis every rule answers by its failure mode, without
	// PostgreSQL the rules loaded last hold: the limiter keeps deciding.
	srv.AddSoftCheck("redis", func(ctx context.Context) error { return redisconn.Check(ctx, rdb) })
	if db != nil {
		srv.AddSoftCheck("postgres", db.Ping)
	}
	ratelimitv1.RegisterRateLimitServiceServer(srv.GRPC, quotaapi.New(engine))
	rlsv3.RegisterRateLimitServiceServer(srv.GRPC, quotaapi.NewEnvoy(engine))
	return srv, nil
}
