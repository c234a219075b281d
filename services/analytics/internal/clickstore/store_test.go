//go:build integration

package clickstore

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"strings"
	"testing"

	"kurz.dev/pkg/chconn"
	"kurz.dev/pkg/config"
	"kurz.dev/pkg/testkit/servertest"
)

func TestApplyIsIdempotentAndRefusesAnOldShape(t *testing.T) {
	var cfg struct{ ClickHouse chconn.Config }
	if err := config.LoadFrom(servertest.Env(nil), &cfg); err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	ch, err := chconn.New(ctx, cfg.ClickHouse)
	if err != nil {
		t.Fatal(err)
	}
	defer ch.Close()
	for range 2 {
		if err := Apply(ctx, ch, LayoutOf(cfg.ClickHouse)); err != nil {
			t.Fatalf("Apply: %v", err)
		}
	}

	var b [4]byte
	_, _ = rand.Read(b[:])
	old := cfg.ClickHouse
	old.Database += "_shape_" + hex.EncodeToString(b[:])
	och, err := chconn.New(ctx, old)
	if err != nil {
		t.Fatal(err)
	}
	defer func() {
		_ = och.Exec(ctx, "DROP DATABASE IF EXISTS "+old.Database)
		_ = och.Close()
	}()
	if err := och.Exec(ctx, `CREATE TABLE `+EventsTable+` (event_id String, code String, ts DateTime)
		ENGINE = MergeTree() ORDER BY (code, ts)`); err != nil {
		t.Fatal(err)
	}
	err = Apply(ctx, och, LayoutOf(old))
	if err == nil || !strings.Contains(err.Error(), "without columns tenant") || !strings.Contains(err.Error(), "KURZ_CLICKHOUSE_DATABASE") {
		t.Fatalf("Apply over an old click_events = %v, want an error naming the missing columns and what to do", err)
	}
}
