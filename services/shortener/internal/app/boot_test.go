//go:build integration

package app

import (
	"context"
	"slices"
	"testing"

	"kurz.dev/pkg/pgpool"
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
