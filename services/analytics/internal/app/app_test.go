package app

import (
	"context"
	"slices"
	"strings"
	"testing"

	"kurz.dev/pkg/chconn"
	"kurz.dev/pkg/config"
	"kurz.dev/pkg/server/servertest"
)

func load(t *testing.T, overrides map[string]string) Config {
	t.Helper()
	base := map[string]string{"KURZ_ANALYTICS_GRPC_ADDR": "127.0.0.1:0", "KURZ_ANALYTICS_HTTP_ADDR": "127.0.0.1:0"}
	for k, v := range overrides {
		base[k] = v
	}
	var cfg Config
	if err := config.LoadFrom(servertest.Env(base), &cfg); err != nil {
		t.Fatal(err)
	}
	return cfg
}

func TestBootsHealthyWithSchemaApplied(t *testing.T) {
	cfg := load(t, nil)
	srv, err := New(context.Background(), cfg, servertest.Logger(t))
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	r := servertest.Start(t, srv)
	r.AwaitServing(t, "kurz.analytics.v1.AnalyticsService")
	r.AssertOps(t, "clickhouse", "redis")
	if got := r.GRPCServices(t); !slices.Contains(got, "kurz.analytics.v1.AnalyticsService") {
		t.Errorf("reflection lists %v, want kurz.analytics.v1.AnalyticsService", got)
	}

	ch, err := chconn.New(context.Background(), cfg.ClickHouse)
	if err != nil {
		t.Fatal(err)
	}
	defer ch.Close()
	var n uint64
	if err := ch.QueryRow(context.Background(),
		"SELECT count() FROM system.tables WHERE database = ? AND name = 'clicks'", cfg.ClickHouse.Database).Scan(&n); err != nil {
		t.Fatal(err)
	}
	if n != 1 {
		t.Errorf("clicks table in %s: found %d, want 1", cfg.ClickHouse.Database, n)
	}
	if err := r.Stop(); err != nil {
		t.Errorf("graceful stop: %v", err)
	}
}

func TestFailsFastNamingTheMissingDependency(t *testing.T) {
	cfg := load(t, map[string]string{"KURZ_CLICKHOUSE_ADDRS": "127.0.0.1:1", "KURZ_CLICKHOUSE_DIAL_TIMEOUT": "200ms"})
	_, err := New(context.Background(), cfg, servertest.Logger(t))
	if err == nil || !strings.Contains(err.Error(), "KURZ_CLICKHOUSE_ADDRS") {
		t.Fatalf("got %v, want an error naming KURZ_CLICKHOUSE_ADDRS", err)
	}
}
