// Package pgtest gives a test a PostgreSQL schema of its own in the test
// database (KURZ_POSTGRES_URL), its tables made by the test's own
// migrations, dropped when the test ends: what the test writes, no other
// test (nor the stack's services) reads, and the reverse.
package pgtest

import (
	"context"
	"crypto/rand"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"

	"kurz.dev/pkg/config"
	"kurz.dev/pkg/pgpool"
)

// Schema creates a schema named prefix and a random suffix, runs migrate
// on a pool whose connections have it as their search_path, and returns
// that pool. The pool is closed and the schema dropped at the test's end.
func Schema(t testing.TB, prefix string, migrate func(context.Context, *pgxpool.Pool) error) *pgxpool.Pool {
	t.Helper()
	var cfg pgpool.Config
	if err := config.Load(&cfg); err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	admin, err := pgpool.New(ctx, cfg)
	if err != nil {
		t.Fatalf("the test database: %v", err)
	}
	t.Cleanup(admin.Close)
	schema := prefix + "_" + strings.ToLower(rand.Text()[:10])
	if _, err := admin.Exec(ctx, "CREATE SCHEMA "+schema); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if _, err := admin.Exec(context.Background(), "DROP SCHEMA "+schema+" CASCADE"); err != nil {
			t.Errorf("drop the test schema %s: %v", schema, err)
		}
	})
	pc, err := pgxpool.ParseConfig(cfg.URL)
	if err != nil {
		t.Fatal(err)
	}
	pc.ConnConfig.RuntimeParams["search_path"] = schema
	pool, err := pgxpool.NewWithConfig(ctx, pc)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	if err := migrate(ctx, pool); err != nil {
		t.Fatalf("migrate the test schema %s: %v", schema, err)
	}
	return pool
}
