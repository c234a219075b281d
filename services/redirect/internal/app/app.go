// Package app wires the redirect service: the public HTTP hot path (short
// code to 302), reading Redis Cluster first and PostgreSQL on a miss. Its gRPC
// listener carries health and reflection only.
package app

import (
	"context"
	"log/slog"

	"kurz.dev/pkg/pgpool"
	"kurz.dev/pkg/redisconn"
	"kurz.dev/pkg/server"
)

// Config is the redirect service's configuration, from KURZ_* environment
// variables.
type Config struct {
	server.Common
	GRPCAddr string `env:"REDIRECT_GRPC_ADDR" default:"127.0.0.1:9094"`
	// HTTPAddr is the public listener: short codes are served at its root.
	HTTPAddr string `env:"REDIRECT_HTTP_ADDR" default:"127.0.0.1:8787"`
	Postgres pgpool.Config
	Redis    redisconn.Config
}

// New connects to Redis and PostgreSQL and returns the redirect server, ready
// to Run.
func New(ctx context.Context, cfg Config, log *slog.Logger) (*server.Server, error) {
	rdb, err := redisconn.New(ctx, cfg.Redis)
	if err != nil {
		return nil, err
	}
	db, err := pgpool.New(ctx, cfg.Postgres)
	if err != nil {
		_ = rdb.Close()
		return nil, err
	}
	srv, err := server.New(ctx, "redirect", cfg.Config(cfg.GRPCAddr, cfg.HTTPAddr), log)
	if err != nil {
		db.Close()
		_ = rdb.Close()
		return nil, err
	}
	srv.OnShutdown(func(context.Context) error { db.Close(); return nil })
	srv.OnShutdown(func(context.Context) error { return rdb.Close() })
	srv.AddCheck("redis", func(ctx context.Context) error { return redisconn.Check(ctx, rdb) })
	srv.AddCheck("postgres", db.Ping)
	return srv, nil
}
