// Package app wires the limiter service: configuration, Redis Cluster, and
// the kurz.ratelimit.v1.RateLimitService on the gRPC server.
package app

import (
	"context"
	"log/slog"

	"github.com/redis/go-redis/v9"

	ratelimitv1 "kurz.dev/gen/kurz/ratelimit/v1"
	"kurz.dev/pkg/redisconn"
	"kurz.dev/pkg/server"
)

// Config is the limiter's configuration, from KURZ_* environment variables.
type Config struct {
	server.Common
	GRPCAddr string `env:"LIMITER_GRPC_ADDR" default:"127.0.0.1:9091"`
	HTTPAddr string `env:"LIMITER_HTTP_ADDR" default:"127.0.0.1:9191"`
	Redis    redisconn.Config
}

// New connects to Redis Cluster and returns the limiter's server, ready to Run.
func New(ctx context.Context, cfg Config, log *slog.Logger) (*server.Server, error) {
	rdb, err := redisconn.New(ctx, cfg.Redis)
	if err != nil {
		return nil, err
	}
	srv, err := server.New(ctx, "limiter", cfg.Config(cfg.GRPCAddr, cfg.HTTPAddr), log)
	if err != nil {
		_ = rdb.Close()
		return nil, err
	}
	srv.OnShutdown(func(context.Context) error { return rdb.Close() })
	srv.AddCheck("redis", func(ctx context.Context) error { return redisconn.Check(ctx, rdb) })
	ratelimitv1.RegisterRateLimitServiceServer(srv.GRPC, &quotaService{rdb: rdb})
	return srv, nil
}

// quotaService answers CheckQuota. The algorithms arrive with the limiter
// issue; until then every call is Unimplemented.
type quotaService struct {
	ratelimitv1.UnimplementedRateLimitServiceServer
	rdb *redis.ClusterClient
}
