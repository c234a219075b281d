// Package app wires the shortener service: PostgreSQL (with its schema
// migrations), Redis Cluster for write-through, and
// kurz.shortener.v1.ShortenerService on the gRPC server.
package app

import (
	"context"
	"log/slog"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/redis/go-redis/v9"

	shortenerv1 "kurz.dev/gen/kurz/shortener/v1"
	"kurz.dev/pkg/pgpool"
	"kurz.dev/pkg/redisconn"
	"kurz.dev/pkg/server"
	"kurz.dev/services/shortener/internal/app/migrations"
)

// Config is the shortener's configuration, from KURZ_* environment variables.
type Config struct {
	server.Common
	GRPCAddr string `env:"SHORTENER_GRPC_ADDR" default:"127.0.0.1:9092"`
	HTTPAddr string `env:"SHORTENER_HTTP_ADDR" default:"127.0.0.1:9192"`
	Postgres pgpool.Config
	Redis    redisconn.Config
}

// New connects to PostgreSQL (applying migrations) and Redis, and returns the
// shortener's server, ready to Run.
func New(ctx context.Context, cfg Config, log *slog.Logger) (*server.Server, error) {
	db, err := pgpool.New(ctx, cfg.Postgres)
	if err != nil {
		return nil, err
	}
	applied, err := pgpool.Migrate(ctx, db, "shortener", migrations.FS)
	if err != nil {
		db.Close()
		return nil, err
	}
	if len(applied) > 0 {
		log.Info("migrations applied", "names", applied)
	}
	rdb, err := redisconn.New(ctx, cfg.Redis)
	if err != nil {
		db.Close()
		return nil, err
	}
	srv, err := server.New(ctx, "shortener", cfg.Config(cfg.GRPCAddr, cfg.HTTPAddr), log)
	if err != nil {
		db.Close()
		_ = rdb.Close()
		return nil, err
	}
	srv.OnShutdown(func(context.Context) error { db.Close(); return nil })
	srv.OnShutdown(func(context.Context) error { return rdb.Close() })
	srv.AddCheck("postgres", db.Ping)
	srv.AddCheck("redis", func(ctx context.Context) error { return redisconn.Check(ctx, rdb) })
	shortenerv1.RegisterShortenerServiceServer(srv.GRPC, &linkService{db: db, rdb: rdb})
	return srv, nil
}

// linkService serves the link API. Code generation and the handlers arrive
// with the shortener issue; until then every call is Unimplemented.
type linkService struct {
	shortenerv1.UnimplementedShortenerServiceServer
	db  *pgxpool.Pool
	rdb *redis.ClusterClient
}
