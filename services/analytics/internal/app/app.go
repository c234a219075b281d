// Package app wires the analytics service: the click consumer (Redis streams
// to ClickHouse) and kurz.analytics.v1.AnalyticsService for link statistics.
package app

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"time"

	"github.com/ClickHouse/clickhouse-go/v2/lib/driver"
	"github.com/redis/go-redis/v9"

	analyticsv1 "kurz.dev/gen/kurz/analytics/v1"
	"kurz.dev/pkg/chconn"
	"kurz.dev/pkg/clickevent"
	"kurz.dev/pkg/config"
	"kurz.dev/pkg/quota"
	"kurz.dev/pkg/redisconn"
	"kurz.dev/pkg/server"
	"kurz.dev/pkg/svcauth"
	"kurz.dev/services/analytics/internal/clickstore"
	"kurz.dev/services/analytics/internal/consumer"
	"kurz.dev/services/analytics/internal/stats"
)

// Config is the analytics service's configuration, from KURZ_* environment
// variables.
type Config struct {
	server.Common
	// GRPCAddr is the analytics gRPC address: where it listens, and where its callers dial it.
	GRPCAddr string `env:"ANALYTICS_GRPC_ADDR" default:"127.0.0.1:9093"`
	// HTTPAddr is the analytics ops HTTP address (/healthz, /readyz, /metrics).
	HTTPAddr   string `env:"ANALYTICS_HTTP_ADDR" default:"127.0.0.1:9193"`
	ClickHouse chconn.Config
	Redis      redisconn.Config
	Streams    clickevent.StreamConfig
	// ServiceAuth verifies the callers' signed tenant assertions: a call
	// without a valid one is refused, whatever tenant its metadata names.
	ServiceAuth svcauth.Config

	// BatchSize flushes a batch into ClickHouse at this many events.
	BatchSize int `env:"ANALYTICS_BATCH_SIZE" default:"5000"`
	// BatchAge flushes a batch this long after its first event.
	BatchAge time.Duration `env:"ANALYTICS_BATCH_AGE" default:"1s"`
	// ClaimIdle is how long an entry may stay pending with a consumer
	// before another takes it over (XAUTOCLAIM).
	ClaimIdle time.Duration `env:"ANALYTICS_CLAIM_IDLE" default:"30s"`
	// MaxDeliveries dead-letters an entry delivered more often than this.
	MaxDeliveries int `env:"ANALYTICS_MAX_DELIVERIES" default:"5"`
	// ConsumerGroup is the Redis consumer group of the click streams.
	ConsumerGroup string `env:"ANALYTICS_CONSUMER_GROUP" default:"analytics"`
	// ReadReplicas is how many Redis replicas must acknowledge a read of
	// the click streams (WAIT, up to 100 ms after each read of new
	// entries) for its clicks to be stored as not suspect. Replication is
	// asynchronous: a failover to a replica that missed a read delivers
	// its clicks again, and a suspect first copy is what lets the stats
	// count them once (a suspect costs the stats a lookup of its key). 0
	// sends no WAIT: for a Redis without replicas, which cannot fail over.
	ReadReplicas int `env:"ANALYTICS_READ_REPLICAS" default:"1"`
	// ConsumerName names this process in the group; empty: host-pid-random.
	// Set it to a stable name (a StatefulSet pod's) to resume the process's
	// own pending entries at once after a restart.
	ConsumerName string `env:"ANALYTICS_CONSUMER_NAME" default:""`
	// InsertTimeout bounds one ClickHouse insert or duplicate lookup.
	InsertTimeout time.Duration `env:"ANALYTICS_INSERT_TIMEOUT" default:"10s"`
	// UnhealthyAfter reports the consumer check degraded on /readyz once
	// flushes have failed this long (the replica stays ready: its stats
	// still answer; alert KurzClickHouseFlushFailing).
	UnhealthyAfter time.Duration `env:"ANALYTICS_UNHEALTHY_AFTER" default:"30s"`

	// LimiterAddr is where the limiter's gRPC listens.
	LimiterAddr string `env:"LIMITER_GRPC_ADDR" default:"127.0.0.1:9091"`
	// LimiterTimeout bounds one CheckQuotas call of up to 100 flood checks.
	// A call that gets no answer in time leaves its clicks, and the rest of
	// its batch's, unchecked (degraded: unflagged up to the rule's last
	// reported limit per visitor); at 50 ms, calls queued behind a
	// backlog's other checks timed out with the limiter healthy.
	LimiterTimeout time.Duration `env:"ANALYTICS_LIMITER_TIMEOUT" default:"500ms"`
	// FloodParallelism bounds the consumer's CheckQuotas calls in flight,
	// over all its batches (each up to consumer.FloodChecksPerCall flood
	// checks); it uses fewer while the limiter answers checks by the rule's
	// failure mode, which checks nothing.
	FloodParallelism int `env:"ANALYTICS_FLOOD_PARALLELISM" default:"16"`
	// Flushers is how many batches one consumer flushes at once.
	Flushers int `env:"ANALYTICS_FLUSHERS" default:"2"`

	// AllowAnonymous serves statistics to calls without a tenant, as tenant
	// "anonymous" (set it where the shortener allows anonymous links).
	AllowAnonymous bool `env:"ANALYTICS_ALLOW_ANONYMOUS" default:"false"`
	// QueryTimeout bounds one GetLinkStats' queries.
	QueryTimeout time.Duration `env:"ANALYTICS_QUERY_TIMEOUT" default:"5s"`
	// MaxStatsRequests bounds the GetLinkStats calls one process serves at
	// once (1 to 256), one tenant's to half of them (at least 1); past
	// that a call is refused at once, UNAVAILABLE STATS_BUSY or
	// RESOURCE_EXHAUSTED STATS_SHARE_IN_USE with a retry delay. The
	// statistics read through a ClickHouse pool of their own, four
	// connections per call, apart from the consumer's and the readiness
	// check's, so that they never wait for each other.
	MaxStatsRequests int `env:"ANALYTICS_MAX_STATS_REQUESTS" default:"4"`

	// RawRetention is how long raw click rows are kept: a month of them is
	// dropped once it ended this long ago (so they live up to one month
	// more); the hourly rollups statistics read are kept. 0 keeps them all;
	// else at least 24h (a minute or an hour is a slip that drops every
	// month but the current one at start).
	RawRetention time.Duration `env:"ANALYTICS_RAW_RETENTION" default:"2160h"`
	// RetentionEvery is how often the expired months are looked for (and
	// once at start), at least 1m: it also bounds each run, a drop on every
	// ClickHouse server, and months expire once a month.
	RetentionEvery time.Duration `env:"ANALYTICS_RETENTION_EVERY" default:"1h"`
}

// minRawRetention is the shortest KURZ_ANALYTICS_RAW_RETENTION but 0.
const minRawRetention = 24 * time.Hour

// Check runs validate for server.Main, before the service starts.
func (c Config) Check() error {
	_, err := c.validate()
	return errors.Join(err, c.Redis.Check())
}

func (c Config) validate() (*svcauth.Keys, error) {
	keys, err := c.ServiceAuth.Keys()
	errs := []error{err, c.Streams.Validate()}
	if c.BatchSize < 1 || c.BatchAge <= 0 {
		errs = append(errs, errors.New("KURZ_ANALYTICS_BATCH_SIZE and KURZ_ANALYTICS_BATCH_AGE must be positive"))
	}
	if c.ClaimIdle < time.Second {
		errs = append(errs, fmt.Errorf("KURZ_ANALYTICS_CLAIM_IDLE=%s: want at least 1s", c.ClaimIdle))
	}
	if c.MaxDeliveries < 1 || c.FloodParallelism < 1 || c.Flushers < 1 {
		errs = append(errs, errors.New("KURZ_ANALYTICS_MAX_DELIVERIES, KURZ_ANALYTICS_FLOOD_PARALLELISM and KURZ_ANALYTICS_FLUSHERS must be positive"))
	}
	if c.ReadReplicas < 0 {
		errs = append(errs, errors.New("KURZ_ANALYTICS_READ_REPLICAS must be 0 or more"))
	}
	if c.MaxStatsRequests < 1 || c.MaxStatsRequests > 256 {
		errs = append(errs, fmt.Errorf("KURZ_ANALYTICS_MAX_STATS_REQUESTS=%d: want 1 to 256", c.MaxStatsRequests))
	}
	if c.ConsumerGroup == "" {
		errs = append(errs, errors.New("KURZ_ANALYTICS_CONSUMER_GROUP must not be empty"))
	}
	errs = append(errs, config.Period("KURZ_ANALYTICS_RETENTION_EVERY", c.RetentionEvery, time.Minute))
	if c.RawRetention != 0 && c.RawRetention < minRawRetention {
		errs = append(errs, fmt.Errorf("KURZ_ANALYTICS_RAW_RETENTION=%s: want 0 (keep every raw click) or %s or more: "+
			"a month of raw clicks is dropped, for good, once it ended this long ago", c.RawRetention, minRawRetention))
	}
	if c.InsertTimeout <= 0 || c.UnhealthyAfter <= 0 || c.LimiterTimeout <= 0 || c.QueryTimeout <= 0 {
		errs = append(errs, errors.New("KURZ_ANALYTICS_INSERT_TIMEOUT, _UNHEALTHY_AFTER, _LIMITER_TIMEOUT and _QUERY_TIMEOUT must be positive"))
	}
	return keys, errors.Join(errs...)
}

// Build wires the analytics service within lc: ClickHouse (with its schema)
// and Redis, then its server, the click consumer (and its limiter client)
// and the statistics API. The main passes it to server.Main.
func Build(ctx context.Context, cfg Config, lc *server.Lifecycle, log *slog.Logger) (*server.Server, error) {
	return hooks{}.wire(ctx, cfg, lc, log)
}

// New starts the analytics service in process, as server.Main does before
// Run; the click consumer starts with it.
func New(ctx context.Context, cfg Config, log *slog.Logger) (*server.Server, error) {
	return server.Start(ctx, cfg, log, Build)
}

// build is New with test hooks.
func build(ctx context.Context, cfg Config, log *slog.Logger, h hooks) (*server.Server, error) {
	return server.Start(ctx, cfg, log, h.wire)
}

// hooks let in-package tests run the service on their own streams.
type hooks struct {
	streamPrefix string
	groupStart   string
}

// wire is Build with test hooks.
func (h hooks) wire(ctx context.Context, cfg Config, lc *server.Lifecycle, log *slog.Logger) (*server.Server, error) {
	keys, err := cfg.validate()
	if err != nil {
		return nil, fmt.Errorf("configuration:\n%w", err)
	}
	ch, reads, rdb, err := openStores(ctx, cfg, lc)
	if err != nil {
		return nil, err
	}
	srvCfg := cfg.Config(cfg.GRPCAddr, cfg.HTTPAddr)
	srvCfg.GRPCMaxRecvMsgSize = server.SmallGRPCMaxRecvMsgSize // a stats query
	// A call without a valid assertion is refused when its headers arrive,
	// before any of its request is read.
	srvCfg.GRPCAuthenticate = keys.Tap
	srv, err := server.New(ctx, "analytics", srvCfg, lc, log, keys.ServerOptions()...)
	if err != nil {
		return nil, err
	}
	store := clickstore.New(ch, clickstore.LayoutOf(cfg.ClickHouse))
	cons, err := h.startConsumer(cfg, rdb, store, srv, lc, log)
	if err != nil {
		return nil, err
	}
	analyticsv1.RegisterAnalyticsServiceServer(srv, stats.New(clickstore.New(reads, clickstore.LayoutOf(cfg.ClickHouse)), log, stats.Options{
		AllowAnonymous: cfg.AllowAnonymous, QueryTimeout: cfg.QueryTimeout, MaxRequests: cfg.MaxStatsRequests,
		Meter: srv.Telemetry.MeterProvider.Meter("kurz.dev/services/analytics/stats"),
	}))
	srv.Mux.HandleFunc("GET /consumerz", func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		_ = json.NewEncoder(w).Encode(cons.Status())
	})
	if cfg.RawRetention > 0 {
		lc.Go("click retention", func(ctx context.Context) {
			expireRaw(ctx, store, cfg.RawRetention, cfg.RetentionEvery, log)
		})
	}
	srv.AddCheck("clickhouse", pingCheck(ch))
	// Without Redis the consumer waits (the clicks wait in the streams) and
	// the stats are still served.
	srv.AddSoftCheck("redis", func(ctx context.Context) error { return redisconn.Check(ctx, rdb) })
	// Failing flushes (ClickHouse refusing inserts, Redis gone mid-batch)
	// leave the stats to serve: degraded, alerted by
	// KurzClickHouseFlushFailing. A hard check would take every replica
	// out of rotation at once in a shared outage.
	srv.AddSoftCheck("consumer", cons.Ready)
	if cfg.ReadReplicas > 0 {
		// Fewer replicas online than WAIT asks for: every read on those
		// masters waits out the WAIT and its clicks are stored as suspect.
		// Nothing is lost or counted twice, but reads slow down and every
		// stats query of those clicks looks their keys up.
		srv.AddSoftCheck("redis_replicas", redisconn.WarnReplicasHeld(ctx, log, rdb, "KURZ_ANALYTICS_READ_REPLICAS", cfg.ReadReplicas,
			"every read of the click streams there waits 100 ms and stores its clicks as suspect",
			"click stream reads will all be stored as suspect"))
	}
	log.Info("analytics configured", "click_streams", cfg.Streams.Shards, "group", cfg.ConsumerGroup,
		"consumer", cons.Name(), "batch_size", cfg.BatchSize, "batch_age", cfg.BatchAge,
		"claim_idle", cfg.ClaimIdle, "limiter", cfg.LimiterAddr)
	return srv, nil
}

// expireRaw drops the raw clicks older than retention at start and every
// interval, until ctx ends. A failure is logged and tried again at the
// next tick: expiring late keeps rows a little longer, nothing else.
func expireRaw(ctx context.Context, store *clickstore.Store, retention, every time.Duration, log *slog.Logger) {
	tick := time.NewTicker(every)
	defer tick.Stop()
	for {
		// A drop ON CLUSTER waits for every server; bound it by the
		// interval so one unreachable server delays, never piles up, runs.
		rctx, cancel := context.WithTimeout(ctx, every)
		months, err := store.ExpireRaw(rctx, time.Now().Add(-retention))
		cancel()
		switch {
		case err != nil && ctx.Err() == nil:
			log.Warn("raw click retention failed; trying again later", "retry_in", every, "err", err)
		case len(months) > 0:
			log.Info("raw clicks expired", "months", months, "retention", retention)
		}
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
	}
}

// openStores connects to ClickHouse, applying its schema, and to Redis
// Cluster, where the click streams are.
func openStores(ctx context.Context, cfg Config, lc *server.Lifecycle) (writes, reads driver.Conn, rdb *redis.ClusterClient, err error) {
	writes, reads, err = openClickHouse(ctx, cfg)
	if err != nil {
		return nil, nil, nil, err
	}
	lc.OwnCloser("clickhouse", writes)
	lc.OwnCloser("clickhouse statistics", reads)
	if err := clickstore.Apply(ctx, writes, clickstore.LayoutOf(cfg.ClickHouse)); err != nil {
		return nil, nil, nil, err
	}
	rdb, err = redisconn.New(ctx, cfg.Redis)
	if err != nil {
		return nil, nil, nil, err
	}
	lc.OwnCloser("redis", rdb)
	return writes, reads, rdb, nil
}

// openClickHouse opens two pools: writes, for the consumer (a connection
// per flusher), the retention and the readiness check (one each), which
// then always find a connection free; and reads, for the statistics, a
// connection for each query the admitted calls run at once. On one shared
// pool, a tenant's long-range statistics held every connection: an insert
// failed with "acquire conn timeout" and /readyz reported ClickHouse down.
func openClickHouse(ctx context.Context, cfg Config) (writes, reads driver.Conn, err error) {
	writes, err = chconn.NewPool(ctx, cfg.ClickHouse, cfg.Flushers+2)
	if err != nil {
		return nil, nil, err
	}
	reads, err = chconn.NewPool(ctx, cfg.ClickHouse, cfg.MaxStatsRequests*stats.QueriesPerRequest)
	if err != nil {
		_ = writes.Close()
		return nil, nil, err
	}
	return writes, reads, nil
}

// pingCheck is the readiness check of ClickHouse over conn: a pool whose
// connections are all in use is busy, not down (the work holding them
// reports its own failures).
func pingCheck(conn driver.Conn) server.Check {
	return func(ctx context.Context) error {
		if err := conn.Ping(ctx); err != nil && !chconn.Busy(conn, err) {
			return err
		}
		return nil
	}
}

// startConsumer dials the limiter (for the consumer's flood checks) and
// starts the click consumer, which runs until shutdown.
func (h hooks) startConsumer(cfg Config, rdb *redis.ClusterClient, store *clickstore.Store, srv *server.Server, lc *server.Lifecycle, log *slog.Logger) (*consumer.Consumer, error) {
	quotaClient, closeLimiter, err := quota.Dial(cfg.LimiterAddr, srv.Telemetry, cfg.LimiterTimeout, log)
	if err != nil {
		return nil, err
	}
	lc.Own("limiter connection", func(context.Context) error { return closeLimiter() })
	cons, err := consumer.New(rdb, store, quotaClient, log, srv.Telemetry.MeterProvider, consumer.Options{
		Shards: cfg.Streams.Shards, StreamPrefix: h.streamPrefix, Group: cfg.ConsumerGroup,
		GroupStart: h.groupStart, Name: cfg.ConsumerName,
		BatchSize: cfg.BatchSize, BatchAge: cfg.BatchAge, ClaimIdle: cfg.ClaimIdle,
		MaxDeliveries: cfg.MaxDeliveries, InsertTimeout: cfg.InsertTimeout, ReadReplicas: cfg.ReadReplicas,
		FloodParallelism: cfg.FloodParallelism, Flushers: cfg.Flushers, UnhealthyAfter: cfg.UnhealthyAfter,
		TracerProvider: srv.Telemetry.TracerProvider,
		// The last batch is stored and acknowledged within the bound on
		// the consumer's stop, half of it, so it ends on its own, while
		// ClickHouse and Redis are still open (they close after it).
		DrainTimeout: cfg.CloseTimeout / 2,
	})
	if err != nil {
		return nil, err
	}
	lc.Go("click consumer", cons.Run)
	return cons, nil
}
