// Package app wires the public HTTP gateway: the JSON API in front of the
// shortener, analytics and limiter services. Its gRPC listener carries health
// and reflection only.
package app

import (
	"context"
	"errors"
	"log/slog"

	"google.golang.org/grpc"

	"kurz.dev/pkg/grpcclient"
	"kurz.dev/pkg/server"
)

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
}

// New dials the downstream services and returns the gateway server, ready to
// Run. Dialing does not wait for the services: readiness reports them.
func New(ctx context.Context, cfg Config, log *slog.Logger) (*server.Server, error) {
	srv, err := server.New(ctx, "gateway", cfg.Config(cfg.GRPCAddr, cfg.HTTPAddr), log)
	if err != nil {
		return nil, err
	}
	downstream := []struct{ name, addr string }{
		{"limiter", cfg.LimiterAddr},
		{"shortener", cfg.ShortenerAddr},
		{"analytics", cfg.AnalyticsAddr},
	}
	var conns []*grpc.ClientConn
	for _, d := range downstream {
		conn, err := grpcclient.Dial(d.addr, srv.Telemetry)
		if err != nil {
			for _, c := range conns {
				_ = c.Close()
			}
			return nil, errors.Join(err, srv.Close(ctx))
		}
		conns = append(conns, conn)
		srv.AddCheck(d.name, grpcclient.HealthCheck(conn))
		srv.OnShutdown(func(context.Context) error { return conn.Close() })
	}
	return srv, nil
}
