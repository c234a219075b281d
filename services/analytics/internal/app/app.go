// Package app wires the analytics service: the click consumer (Redis streams
// to ClickHouse) and kurz.analytics.v1.AnalyticsService for link statistics.
package app

import (
	"context"
	"log/slog"

	"github.com/ClickHouse/clickhouse-go/v2/lib/driver"

	analyticsv1 "kurz.dev/gen/kurz/analytics/v1"
	"kurz.dev/pkg/chconn"
	"kurz.dev/pkg/redisconn"
	"kurz.dev/pkg/server"
)

// Config is the analytics service's configuration, from KURZ_* environment
// variables.
type Config struct {
	server.Common
	GRPCAddr   string `env:"ANALYTICS_GRPC_ADDR" default:"127.0.0.1:9093"`
	HTTPAddr   string `env:"ANALYTICS_HTTP_ADDR" default:"127.0.0.1:9193"`
	ClickHouse chconn.Config
	Redis      redisconn.Config
}

// New connects to ClickHouse (applying the schema) and Redis, and returns the
// analytics server, ready to Run.
func New(ctx context.Context, cfg Config, log *slog.Logger) (*server.Server, error) {
	ch, err := chconn.New(ctx, cfg.ClickHouse)
	if err != nil {
		return nil, err
	}
	if err := chconn.ApplyDDL(ctx, ch, schema); err != nil {
		_ = ch.Close()
		return nil, err
	}
	rdb, err := redisconn.New(ctx, cfg.Redis)
	if err != nil {
		_ = ch.Close()
		return nil, err
	}
	srv, err := server.New(ctx, "analytics", cfg.Config(cfg.GRPCAddr, cfg.HTTPAddr), log)
	if err != nil {
		_ = ch.Close()
		_ = rdb.Close()
		return nil, err
	}
	srv.OnShutdown(func(context.Context) error { return ch.Close() })
	srv.OnShutdown(func(context.Context) error { return rdb.Close() })
	srv.AddCheck("clickhouse", ch.Ping)
	srv.AddCheck("redis", func(ctx context.Context) error { return redisconn.Check(ctx, rdb) })
	analyticsv1.RegisterAnalyticsServiceServer(srv.GRPC, &statsService{ch: ch})
	return srv, nil
}

// statsService answers GetLinkStats. The queries arrive with the analytics
// issue; until then every call is Unimplemented.
type statsService struct {
	analyticsv1.UnimplementedAnalyticsServiceServer
	ch driver.Conn
}
