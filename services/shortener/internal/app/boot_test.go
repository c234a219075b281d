//go:build integration

package app

import (
	"context"
	"log/slog"
	"net/http"
	"slices"
	"strings"
	"testing"

	"kurz.dev/pkg/pgpool"
	"kurz.dev/pkg/testkit/limitertest"
	"kurz.dev/pkg/testkit/servertest"
)

func TestBootsHealthyWithSchemaApplied(t *testing.T) {
	sh := start(t, nil, hooks{})
	// The default KURZ_SHORTENER_CACHE_REPLICAS (1) on the test cluster,
	// one replica per master.
	sh.AssertOps(t, "postgres", "redis", "redis_replicas")
	if got := sh.GRPCServices(t); !slices.Contains(got, "kurz.shortener.v1.ShortenerService") {
		t.Errorf("reflection lists %v, want kurz.shortener.v1.ShortenerService", got)
	}

	db, err := pgpool.New(context.Background(), sh.cfg.Postgres)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	var links, block, deletedAt bool
	if err := db.QueryRow(context.Background(), `
		SELECT to_regclass('links') IS NOT NULL, to_regclass('link_block') IS NOT NULL,
		       EXISTS (SELECT 1 FROM information_schema.columns WHERE table_name = 'links' AND column_name = 'deleted_at')`,
	).Scan(&links, &block, &deletedAt); err != nil {
		t.Fatal(err)
	}
	if !links || !block || !deletedAt {
		t.Errorf("after boot: links table %v, link_block sequence %v, links.deleted_at %v; want all", links, block, deletedAt)
	}
	if err := sh.Stop(); err != nil {
		t.Errorf("graceful stop: %v", err)
	}
}

// A KURZ_SHORTENER_CACHE_REPLICAS above the cluster's replicas per master
// would keep every change of a link queued (the redirects serving its
// previous state) while the shortener looks healthy: the start warns,
// naming the variable, and /readyz reports the check degraded while the
// shortener stays ready.
func TestCacheReplicasBeyondTheClusterWarnedAndDegraded(t *testing.T) {
	var logs servertest.SyncBuffer
	cfg := load(t, map[string]string{"KURZ_SHORTENER_CACHE_REPLICAS": "100",
		"KURZ_LIMITER_GRPC_ADDR": limitertest.Start(t, limitertest.AllowAll).Addr()})
	srv, err := build(context.Background(), cfg, slog.New(slog.NewJSONHandler(&logs, nil)), hooks{})
	if err != nil {
		t.Fatalf("build: %v", err)
	}
	if out := logs.String(); !strings.Contains(out, "KURZ_SHORTENER_CACHE_REPLICAS=100") {
		t.Errorf("start log names no KURZ_SHORTENER_CACHE_REPLICAS=100:\n%s", out)
	}
	r := servertest.Start(t, srv)
	r.AwaitServing(t, "kurz.shortener.v1.ShortenerService")
	if code, body := r.AwaitReadyz(t); code != http.StatusOK || !strings.Contains(body, `"redis_replicas":"degraded"`) {
		t.Errorf("/readyz: %d %s, want 200 with redis_replicas degraded", code, body)
	}
}
