package app

import (
	"context"
	"slices"
	"strings"
	"testing"

	"kurz.dev/pkg/config"
	"kurz.dev/pkg/pgpool"
	"kurz.dev/pkg/server/servertest"
)

func load(t *testing.T, overrides map[string]string) Config {
	t.Helper()
	base := map[string]string{"KURZ_SHORTENER_GRPC_ADDR": "127.0.0.1:0", "KURZ_SHORTENER_HTTP_ADDR": "127.0.0.1:0"}
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
	r.AwaitServing(t, "kurz.shortener.v1.ShortenerService")
	r.AssertOps(t, "postgres", "redis")
	if got := r.GRPCServices(t); !slices.Contains(got, "kurz.shortener.v1.ShortenerService") {
		t.Errorf("reflection lists %v, want kurz.shortener.v1.ShortenerService", got)
	}

	db, err := pgpool.New(context.Background(), cfg.Postgres)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	var links, block bool
	if err := db.QueryRow(context.Background(),
		"SELECT to_regclass('links') IS NOT NULL, to_regclass('link_block') IS NOT NULL").Scan(&links, &block); err != nil {
		t.Fatal(err)
	}
	if !links || !block {
		t.Errorf("after boot: links table %v, link_block sequence %v; want both", links, block)
	}
	if err := r.Stop(); err != nil {
		t.Errorf("graceful stop: %v", err)
	}
}

func TestFailsFastNamingTheMissingDependency(t *testing.T) {
	cfg := load(t, map[string]string{"KURZ_POSTGRES_URL": "postgres://kurz:kurz@127.0.0.1:1/kurz?sslmode=disable"})
	_, err := New(context.Background(), cfg, servertest.Logger(t))
	if err == nil || !strings.Contains(err.Error(), "KURZ_POSTGRES_URL") {
		t.Fatalf("got %v, want an error naming KURZ_POSTGRES_URL", err)
	}
}
