//go:build integration

package clickstore

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"slices"
	"testing"
	"time"

	"kurz.dev/pkg/chconn"
	"kurz.dev/pkg/config"
	"kurz.dev/pkg/testkit/servertest"
)

// ExpireRaw drops whole months of raw rows and suspects that ended before
// the cutoff, keeps the cutoff's month, and leaves the rollups: past the
// retention the series still answers, without the duplicate correction
// (its raw rows are gone). It runs in a database of its own, since it drops
// every link's old months.
func TestExpireRawDropsOldMonthsAndKeepsRollups(t *testing.T) {
	var cfg struct{ ClickHouse chconn.Config }
	if err := config.LoadFrom(servertest.Env(nil), &cfg); err != nil {
		t.Fatal(err)
	}
	var b [4]byte
	_, _ = rand.Read(b[:])
	cfg.ClickHouse.Database += "_retention_" + hex.EncodeToString(b[:])
	ctx := context.Background()
	ch, err := chconn.New(ctx, cfg.ClickHouse)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = ch.Exec(ctx, "DROP DATABASE IF EXISTS "+cfg.ClickHouse.Database+cfg.ClickHouse.OnCluster())
		_ = ch.Close()
	})
	l := LayoutOf(cfg.ClickHouse)
	if err := Apply(ctx, ch, l); err != nil {
		t.Fatal(err)
	}
	s := New(ch, l)

	jan := time.Date(2025, 1, 15, 10, 0, 0, 0, time.UTC)
	feb := time.Date(2025, 2, 28, 23, 0, 0, 0, time.UTC)
	mar := time.Date(2025, 3, 1, 0, 30, 0, 0, time.UTC)
	click := func(id string, at time.Time, suspect bool) Click {
		return Click{Tenant: "t", Code: "ret", Time: at, EventID: id, Suspect: suspect}
	}
	// January holds one event stored twice (a suspect copy): the
	// correction subtracts it while the raw rows are there.
	rows := []Click{click("j1", jan, false), click("j2", jan, false), click("f1", feb, false), click("m1", mar, false)}
	if err := s.Insert(ctx, rows); err != nil {
		t.Fatal(err)
	}
	if err := s.Insert(ctx, []Click{click("j1", jan, true)}); err != nil {
		t.Fatal(err)
	}
	janRange := Range{Tenant: "t", Code: "ret", Start: jan.Truncate(time.Hour), End: jan.Truncate(time.Hour).Add(time.Hour)}
	if d, err := s.Duplicates(ctx, janRange); err != nil || len(d) != 1 {
		t.Fatalf("before expiry: duplicates %v, %v; want the one of j1", d, err)
	}

	cutoff := time.Date(2025, 3, 20, 0, 0, 0, 0, time.UTC)
	dropped, err := s.ExpireRaw(ctx, cutoff)
	if err != nil {
		t.Fatal(err)
	}
	if want := []uint32{202501, 202502}; !slices.Equal(dropped, want) {
		t.Errorf("dropped months %v, want %v", dropped, want)
	}
	again, err := s.ExpireRaw(ctx, cutoff)
	if err != nil || len(again) != 0 {
		t.Errorf("second run dropped %v (%v), want nothing", again, err)
	}

	left := func(table string) []string {
		t.Helper()
		res, err := ch.Query(ctx, fmt.Sprintf("SELECT toString(toYYYYMM(ts)) FROM %s WHERE tenant = 't' AND code = 'ret' ORDER BY ts", table))
		if err != nil {
			t.Fatal(err)
		}
		defer res.Close()
		var out []string
		for res.Next() {
			var m string
			if err := res.Scan(&m); err != nil {
				t.Fatal(err)
			}
			out = append(out, m)
		}
		return out
	}
	if got := left(EventsTable); !slices.Equal(got, []string{"202503"}) {
		t.Errorf("raw rows left in months %v, want only March's", got)
	}
	if got := left(SuspectsTable); len(got) != 0 {
		t.Errorf("suspects left in months %v, want none (January's dropped)", got)
	}

	// The rollups keep every month. Past the retention the duplicate
	// correction has nothing to read: January's hour counts the stored
	// copies, 3 rows for 2 events.
	hourly, err := s.Hourly(ctx, Range{Tenant: "t", Code: "ret", Start: jan.Truncate(24 * time.Hour), End: cutoff})
	if err != nil {
		t.Fatal(err)
	}
	totals := map[string]int64{}
	for h, c := range hourly {
		totals[time.Unix(h, 0).UTC().Format("200601")] += c.Total
	}
	if want := map[string]int64{"202501": 3, "202502": 1, "202503": 1}; fmt.Sprint(totals) != fmt.Sprint(want) {
		t.Errorf("rollup totals by month %v, want %v", totals, want)
	}
	if d, err := s.Duplicates(ctx, janRange); err != nil || len(d) != 0 {
		t.Errorf("past retention: duplicates %v, %v; want none (the raw rows are gone)", d, err)
	}
	dims, err := s.Dims(ctx, janRange, map[string]int{DimBrowser: 10})
	if err != nil || dims[DimBrowser][""] != 3 {
		t.Errorf("past retention: January's browser rollup %v (%v), want 3 clicks", dims[DimBrowser], err)
	}
}
