//go:build integration

package clickstore

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/ClickHouse/clickhouse-go/v2"
	"kurz.dev/pkg/chconn"
	"kurz.dev/pkg/config"
	"kurz.dev/pkg/testkit/servertest"
)

// Every read GetLinkStats makes reports a ClickHouse it cannot reach as
// ErrUnavailable, and an error ClickHouse answered (here: the tables do not
// exist) as something else.
func TestReadsTellAnOutageFromAnAnswer(t *testing.T) {
	addr, err := servertest.FreeAddr()
	if err != nil {
		t.Fatal(err)
	}
	// Nothing listens on addr: Open does not dial, every query does.
	down, err := clickhouse.Open(&clickhouse.Options{Addr: []string{addr}, DialTimeout: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = down.Close() })

	var cfg struct{ ClickHouse chconn.Config }
	if err := config.LoadFrom(servertest.Env(nil), &cfg); err != nil {
		t.Fatal(err)
	}
	// A database New creates and Apply never ran on: no tables.
	cfg.ClickHouse.Database = "kurz_test_empty"
	up, err := chconn.New(context.Background(), cfg.ClickHouse)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = up.Close() })

	r := Range{Tenant: "t", Code: "abcdef", Start: time.Unix(0, 0), End: time.Unix(3600, 0)}
	top := map[string]int{DimReferrer: 10, DimRule: 10}
	reads := map[string]func(*Store) error{
		"Hourly":     func(s *Store) error { _, err := s.Hourly(context.Background(), r); return err },
		"Dims":       func(s *Store) error { _, err := s.Dims(context.Background(), r, top); return err },
		"Owners":     func(s *Store) error { _, err := s.Owners(context.Background(), r.Code); return err },
		"Duplicates": func(s *Store) error { _, err := s.Duplicates(context.Background(), r); return err },
	}
	for name, read := range reads {
		t.Run(name, func(t *testing.T) {
			if err := read(New(down, LayoutOf(cfg.ClickHouse))); !errors.Is(err, ErrUnavailable) {
				t.Errorf("ClickHouse down: %v, want ErrUnavailable", err)
			}
			if err := read(New(up, LayoutOf(cfg.ClickHouse))); err == nil || errors.Is(err, ErrUnavailable) {
				t.Errorf("tables missing: %v, want an error that is not ErrUnavailable", err)
			}
		})
	}
}

// A range ClickHouse's DateTime cannot hold is refused by every read that
// takes one: toDateTime would take it modulo 2^32, and a range 2^32 s after
// a stored click would count that click (the wrong period).
func TestReadsRefuseRangesDateTimeCannotHold(t *testing.T) {
	ctx := context.Background()
	s := appliedStore(t)
	tenant, code := "wrap-"+time.Now().Format("150405.000000"), "wrap1234"
	at := time.Date(2026, 11, 18, 2, 1, 36, 0, time.UTC)
	// A suspect copy, so that Duplicates has an event to find too.
	if err := s.Insert(ctx, []Click{{Tenant: tenant, Code: code, Time: at, EventID: "e1"}}); err != nil {
		t.Fatal(err)
	}
	if err := s.Insert(ctx, []Click{{Tenant: tenant, Code: code, Time: at, EventID: "e1", Suspect: true}}); err != nil {
		t.Fatal(err)
	}
	hour := at.Truncate(time.Hour)
	if got, err := s.Hourly(ctx, Range{Tenant: tenant, Code: code, Start: hour, End: hour.Add(time.Hour)}); err != nil || got[hour.Unix()].Total != 2 {
		t.Fatalf("the click's own hour: %v (%v), want 2 rows", got, err)
	}

	wrap := time.Duration(1<<32) * time.Second
	ranges := map[string]Range{
		"2^32 s after the click": {Tenant: tenant, Code: code, Start: hour.Add(wrap), End: hour.Add(wrap + time.Hour)},
		"end one past Latest":    {Tenant: tenant, Code: code, Start: Latest.Truncate(time.Hour), End: Latest.Add(time.Second)},
		"start before Earliest":  {Tenant: tenant, Code: code, Start: Earliest.Add(-time.Hour), End: Earliest.Add(time.Hour)},
	}
	reads := map[string]func(Range) (any, error){
		"Hourly":     func(r Range) (any, error) { return s.Hourly(ctx, r) },
		"Dims":       func(r Range) (any, error) { return s.Dims(ctx, r, map[string]int{DimReferrer: 10}) },
		"Duplicates": func(r Range) (any, error) { return s.Duplicates(ctx, r) },
	}
	for rname, r := range ranges {
		for name, read := range reads {
			t.Run(rname+"/"+name, func(t *testing.T) {
				if got, err := read(r); !errors.Is(err, ErrRangeOutOfBounds) {
					t.Errorf("got %v (%v), want ErrRangeOutOfBounds", got, err)
				}
			})
		}
	}
}

// Existing answers for a thousand of the longest keys (a custom domain's)
// on ClickHouse itself, and finds the one inserted.
func TestExistingTakesTheLongestKeys(t *testing.T) {
	ctx := context.Background()
	s := appliedStore(t)
	rows := longKeyClicks(1000)
	for i := range rows {
		rows[i].EventID = fmt.Sprintf("%d-%d", time.Now().UnixMilli(), i)
	}
	if err := s.Insert(ctx, rows[500:501]); err != nil {
		t.Fatal(err)
	}
	found, err := s.Existing(ctx, rows)
	if err != nil {
		t.Fatalf("Existing of 1,000 long keys: %v", err)
	}
	if len(found) != 1 || !found[rows[500].EventID] {
		t.Errorf("found %v, want only %s", found, rows[500].EventID)
	}
}

// appliedStore is a Store on the test environment's ClickHouse, its
// schema applied.
func appliedStore(t *testing.T) *Store {
	t.Helper()
	var cfg struct{ ClickHouse chconn.Config }
	if err := config.LoadFrom(servertest.Env(nil), &cfg); err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	ch, err := chconn.New(ctx, cfg.ClickHouse)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = ch.Close() })
	l := LayoutOf(cfg.ClickHouse)
	if err := Apply(ctx, ch, l); err != nil {
		t.Fatal(err)
	}
	return New(ch, l)
}

// Dims sends the n keys of each dimension asked for with the most clicks,
// ties by key, picked by ClickHouse: a link with more referrer hosts than n
// (as a stranger sending a new Referer with every click makes) sends n of
// them. The clicks no rule or variant chose are left out before the pick.
func TestDimsSendsTheTopKeysOfEachDimension(t *testing.T) {
	ctx := context.Background()
	s := appliedStore(t)
	tenant, code := "top-"+rnd(), "top"+rnd()
	at := time.Date(2025, 5, 6, 7, 0, 0, 0, time.UTC)
	var rows []Click
	for host := 1; host <= 25; host++ {
		for i := range host {
			c := Click{Tenant: tenant, Code: code, Time: at, EventID: fmt.Sprintf("h%02d-%d", host, i),
				ReferrerHost: fmt.Sprintf("h%02d.example", host), Browser: "Firefox"}
			if host <= 20 {
				c.Rule = fmt.Sprintf("rule%02d", host) // the other 75 clicks: no rule
			}
			rows = append(rows, c)
		}
	}
	// A tie at the edge: the lower key is listed.
	for i := range 16 {
		rows = append(rows, Click{Tenant: tenant, Code: code, Time: at, EventID: fmt.Sprintf("tie-%d", i),
			ReferrerHost: "h16a.example", Browser: "Firefox"})
	}
	if err := s.Insert(ctx, rows); err != nil {
		t.Fatal(err)
	}
	dims, err := s.Dims(ctx, Range{Tenant: tenant, Code: code, Start: at, End: at.Add(time.Hour)},
		map[string]int{DimReferrer: 10, DimRule: 5, DimBrowser: 10})
	if err != nil {
		t.Fatal(err)
	}
	list := func(m map[string]int64) string {
		var out []string
		for k, n := range m {
			out = append(out, fmt.Sprintf("%s=%d", k, n))
		}
		slices.Sort(out)
		return strings.Join(out, " ")
	}
	for dim, want := range map[string]string{
		DimReferrer: "h16.example=16 h17.example=17 h18.example=18 h19.example=19 h20.example=20 " +
			"h21.example=21 h22.example=22 h23.example=23 h24.example=24 h25.example=25",
		DimRule:    "rule16=16 rule17=17 rule18=18 rule19=19 rule20=20",
		DimBrowser: "Firefox=341",
		DimOS:      "", // not asked for
	} {
		if got := list(dims[dim]); got != want {
			t.Errorf("%s: %d keys %s, want %s", dim, len(dims[dim]), got, want)
		}
	}
}
