//go:build integration

package linkstore

import (
	"context"
	"crypto/rand"
	"fmt"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"kurz.dev/pkg/config"
	"kurz.dev/pkg/linkschema"
	"kurz.dev/pkg/pgpool"
)

// connect opens a pool on KURZ_POSTGRES_URL (the local stack's kurz_test in
// `make test`) with the links schema applied; appName, if not empty, names
// its sessions in pg_stat_activity.
func connect(t *testing.T, appName string) *pgxpool.Pool {
	t.Helper()
	var cfg pgpool.Config
	if err := config.Load(&cfg); err != nil {
		t.Fatal(err)
	}
	if appName != "" {
		u, err := url.Parse(cfg.URL)
		if err != nil {
			t.Fatal(err)
		}
		q := u.Query()
		q.Set("application_name", appName)
		u.RawQuery = q.Encode()
		cfg.URL = u.String()
	}
	db, err := pgpool.New(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(db.Close)
	if _, err := linkschema.Apply(context.Background(), db); err != nil {
		t.Fatal(err)
	}
	return db
}

// queuedLink stores a new link and changes it once, so one invalidation of
// its code is queued; the link is removed (its invalidation with it) when
// the test ends.
func queuedLink(t *testing.T, s *Store) (tenant, code string) {
	t.Helper()
	ctx := context.Background()
	suffix := strings.ToLower(rand.Text()[:10])
	tenant, code = "outbox-"+suffix, "ob"+suffix
	if _, err := s.Insert(ctx, Link{Code: code, Tenant: tenant, LongURL: "https://example.com/v1"}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _, _ = s.db.Exec(context.Background(), `DELETE FROM links WHERE code = $1`, code) })
	v2 := "https://example.com/v2"
	if _, err := s.Update(ctx, tenant, code, Changes{LongURL: &v2}); err != nil {
		t.Fatal(err)
	}
	return tenant, code
}

func queued(t *testing.T, db *pgxpool.Pool, code string) int {
	t.Helper()
	var n int
	if err := db.QueryRow(context.Background(), `SELECT count(*) FROM link_invalidations WHERE code = $1`, code).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

// The queue holds one invalidation per link however often it changes, dated
// by the oldest change not yet in Redis: its size is bounded by the number
// of links, not by the number of calls.
func TestInvalidationsAreOnePerLink(t *testing.T) {
	ctx := context.Background()
	db := connect(t, "")
	s := New(db, 10*time.Second)
	tenant, code := queuedLink(t, s)
	var first time.Time
	if err := db.QueryRow(ctx, `SELECT created_at FROM link_invalidations WHERE code = $1`, code).Scan(&first); err != nil {
		t.Fatal(err)
	}
	for i := range 3 {
		u := fmt.Sprintf("https://example.com/v%d", i+3)
		if _, err := s.Update(ctx, tenant, code, Changes{LongURL: &u}); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := s.Delete(ctx, tenant, code, nil); err != nil {
		t.Fatal(err)
	}
	var n int
	var oldest time.Time
	if err := db.QueryRow(ctx, `SELECT count(*), min(created_at) FROM link_invalidations WHERE code = $1`, code).Scan(&n, &oldest); err != nil {
		t.Fatal(err)
	}
	if n != 1 || !oldest.Equal(first) {
		t.Errorf("after 5 changes: %d invalidations from %v, want 1 from the first change (%v)", n, oldest, first)
	}
}

// A change made while a refresh of its link is under way waits for the
// refresh, and its invalidation survives it: Refresh deletes only what it
// wrote. The change runs from a pool with its own application_name, and the
// refresh's write returns only once pg_stat_activity shows that session
// waiting for a lock; the next refresh then writes the change.
func TestRefreshKeepsTheInvalidationOfAChangeItDidNotWrite(t *testing.T) {
	ctx := context.Background()
	db := connect(t, "")
	appName := "refresh-test-" + strings.ToLower(rand.Text()[:10])
	s, other := New(db, 10*time.Second), New(connect(t, appName), 10*time.Second)
	tenant, code := queuedLink(t, s)
	if n := queued(t, db, code); n != 1 {
		t.Fatalf("invalidations queued by one update: %d, want 1", n)
	}

	var wrote []string
	v3 := "https://example.com/v3"
	changed := make(chan error, 1)
	err := s.Refresh(ctx, code, func(_ context.Context, l Link) error {
		wrote = append(wrote, l.LongURL)
		go func() { _, err := other.Update(ctx, tenant, code, Changes{LongURL: &v3}); changed <- err }()
		deadline := time.Now().Add(10 * time.Second)
		for {
			var waiting bool
			if err := db.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM pg_stat_activity
				WHERE application_name = $1 AND wait_event_type = 'Lock')`, appName).Scan(&waiting); err != nil {
				return err
			}
			if waiting {
				return nil
			}
			select {
			case err := <-changed:
				t.Errorf("the change did not wait for the refresh (err %v)", err)
				return nil
			default:
			}
			if time.Now().After(deadline) {
				t.Errorf("the change is not waiting for a lock after 10s")
				return nil
			}
			time.Sleep(5 * time.Millisecond)
		}
	})
	if err != nil {
		t.Fatal(err)
	}
	if t.Failed() {
		return
	}
	if err := <-changed; err != nil {
		t.Fatal(err)
	}
	if n := queued(t, db, code); n != 1 {
		t.Errorf("invalidations after the refresh: %d, want 1 (the change made meanwhile)", n)
	}
	if err := s.Refresh(ctx, code, func(_ context.Context, l Link) error { wrote = append(wrote, l.LongURL); return nil }); err != nil {
		t.Fatal(err)
	}
	if want := []string{"https://example.com/v2", v3}; strings.Join(wrote, " ") != strings.Join(want, " ") {
		t.Errorf("states written: %q, want %q", wrote, want)
	}
	if n := queued(t, db, code); n != 0 {
		t.Errorf("invalidations after the second refresh: %d, want 0", n)
	}
}

// A failed write keeps the invalidation, and each failure doubles the delay
// before the next attempt, up to the bound: base 1h, bound 3h gives 1h, 2h,
// then 3h (not 4h) after the queuing.
func TestFailedRefreshBacksOffWithinTheBound(t *testing.T) {
	ctx := context.Background()
	db := connect(t, "")
	s := New(db, 10*time.Second)
	_, code := queuedLink(t, s)
	failed := s.Refresh(ctx, code, func(context.Context, Link) error { return context.DeadlineExceeded })
	if failed == nil {
		t.Fatal("Refresh with a failing write returned nil")
	}
	if n := queued(t, db, code); n != 1 {
		t.Fatalf("invalidations after a failed refresh: %d, want 1", n)
	}
	for i, want := range []string{"1 hour", "2 hours", "3 hours"} {
		if err := s.Postpone(ctx, code, time.Hour, 3*time.Hour); err != nil {
			t.Fatal(err)
		}
		// created_at <= the time of each Postpone <= now(): the delay is
		// at least want after the queuing and at most want from now.
		var atLeast, atMost bool
		var attempts int
		if err := db.QueryRow(ctx, `SELECT next_try_at >= created_at + $2::interval, next_try_at <= now() + $2::interval, attempts
			FROM link_invalidations WHERE code = $1`, code, want).Scan(&atLeast, &atMost, &attempts); err != nil {
			t.Fatal(err)
		}
		if !atLeast || !atMost || attempts != i+1 {
			t.Errorf("after %d failures: next try at least %s after queuing %v, at most %s from now %v, attempts %d",
				i+1, want, atLeast, want, atMost, attempts)
		}
	}
	due, err := s.DueInvalidations(ctx, 1_000_000)
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range due {
		if c == code {
			t.Errorf("DueInvalidations returned %s, postponed by 3 hours", code)
		}
	}
}
