//go:build integration

package app

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/ClickHouse/clickhouse-go/v2/lib/driver"

	"kurz.dev/services/analytics/internal/clickstore"
)

// With every connection of the statistics' pool held by reads in progress,
// the consumer's inserts and the readiness check still go through, and one
// more statistics read fails as busy, not as ClickHouse unavailable.
func TestStatsHoldingEveryConnectionLeaveInsertsAndReadinessAlone(t *testing.T) {
	cfg := load(t, map[string]string{"KURZ_ANALYTICS_MAX_STATS_REQUESTS": "1", "KURZ_CLICKHOUSE_DIAL_TIMEOUT": "500ms"})
	ctx := context.Background()
	writes, reads, err := openClickHouse(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer writes.Close()
	defer reads.Close()
	layout := clickstore.LayoutOf(cfg.ClickHouse)
	if err := clickstore.Apply(ctx, writes, layout); err != nil {
		t.Fatal(err)
	}

	// A read holds its connection until its rows are closed; these stream
	// for as long as nobody reads them. Closing rows drains them, so the
	// reads are cancelled first.
	hctx, cancel := context.WithCancel(ctx)
	var held []driver.Rows
	defer func() {
		cancel()
		for _, rows := range held {
			_ = rows.Close()
		}
	}()
	for i := range reads.Stats().MaxOpenConns {
		rows, err := reads.Query(hctx, "SELECT number FROM system.numbers LIMIT 1000000000")
		if err != nil {
			t.Fatalf("read %d of the statistics' pool: %v", i+1, err)
		}
		held = append(held, rows)
	}

	tenant := "t-" + rnd()
	click := clickstore.Click{Tenant: tenant, Code: "pool1", Time: time.Now().UTC().Truncate(time.Second), EventID: "e-" + rnd()}
	if err := clickstore.New(writes, layout).Insert(ctx, []clickstore.Click{click}); err != nil {
		t.Errorf("insert with the statistics' connections all held: %v", err)
	}
	if err := pingCheck(writes)(ctx); err != nil {
		t.Errorf("readiness check with the statistics' connections all held: %v", err)
	}
	hour := click.Time.Truncate(time.Hour)
	_, err = clickstore.New(reads, layout).Hourly(ctx, clickstore.Range{Tenant: tenant, Code: click.Code, Start: hour, End: hour.Add(time.Hour)})
	if !errors.Is(err, clickstore.ErrBusy) || errors.Is(err, clickstore.ErrUnavailable) {
		t.Errorf("statistics read with every connection held = %v, want ErrBusy", err)
	}
}
