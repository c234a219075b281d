package app

import (
	"context"
	"slices"
	"strings"
	"testing"

	"kurz.dev/pkg/pgpool"
	"kurz.dev/pkg/testkit/servertest"
)

func TestBootsHealthyWithSchemaApplied(t *testing.T) {
	sh := start(t, nil, hooks{})
	sh.AssertOps(t, "postgres", "redis")
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

func TestFailsFastNamingTheMissingDependency(t *testing.T) {
	cfg := load(t, map[string]string{"KURZ_POSTGRES_URL": "postgres://kurz:kurz@127.0.0.1:1/kurz?sslmode=disable"})
	_, err := New(context.Background(), cfg, servertest.Logger(t))
	if err == nil || !strings.Contains(err.Error(), "KURZ_POSTGRES_URL") {
		t.Fatalf("got %v, want an error naming KURZ_POSTGRES_URL", err)
	}
}

func TestRejectsBadConfigurationNamingEachVariable(t *testing.T) {
	cfg := load(t, map[string]string{
		"KURZ_SHORTENER_BLOCK_SIZE":             "0",
		"KURZ_SHORTENER_RANDOM_CODE_LENGTH":     "2",
		"KURZ_SHORTENER_LIMITER_FAILURE_POLICY": "maybe",
		"KURZ_SHORTENER_BASE_URL":               "ftp://x",
		"KURZ_SHORTENER_INVALIDATION_RETRY":     "0s",
		"KURZ_SERVICE_AUTH_KEY":                 "",
	})
	_, err := New(context.Background(), cfg, servertest.Logger(t))
	for _, name := range []string{"KURZ_SHORTENER_BLOCK_SIZE", "KURZ_SHORTENER_RANDOM_CODE_LENGTH",
		"KURZ_SHORTENER_LIMITER_FAILURE_POLICY", "KURZ_SHORTENER_BASE_URL", "KURZ_SHORTENER_INVALIDATION_RETRY", "KURZ_SERVICE_AUTH_KEY"} {
		if err == nil || !strings.Contains(err.Error(), name) {
			t.Errorf("got %v, want it to name %s", err, name)
		}
	}
}

// TestRefusesToStartWithoutACodeKey: without KURZ_SHORTENER_CODE_KEY, or
// with one too short to be a secret, the shortener does not start (it would
// otherwise hand out codes anyone could walk), and says which variable.
func TestRefusesToStartWithoutACodeKey(t *testing.T) {
	for _, key := range []string{"", "too-short-a-key"} {
		cfg := load(t, map[string]string{"KURZ_SHORTENER_CODE_KEY": key})
		srv, err := New(context.Background(), cfg, servertest.Logger(t))
		if err == nil {
			_ = srv.Close(context.Background())
			t.Fatalf("key of %d characters: the shortener started", len(key))
		}
		if !strings.Contains(err.Error(), "KURZ_SHORTENER_CODE_KEY") {
			t.Errorf("key of %d characters: got %v, want an error naming KURZ_SHORTENER_CODE_KEY", len(key), err)
		}
	}
}
