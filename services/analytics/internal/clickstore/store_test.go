//go:build integration

package clickstore

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/ClickHouse/clickhouse-go/v2/lib/driver"

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

// TestApplyRefusesANewerVersionsDatabase: a database holding a click view
// this build does not know (a newer build's) fails the start, naming it,
// and this build's own older view is not created beside it: both would
// break every click down into the same table.
func TestApplyRefusesANewerVersionsDatabase(t *testing.T) {
	ctx := context.Background()
	ch, l, on, qual := scratchDatabase(t, "_newer_")
	if err := Apply(ctx, ch, l); err != nil {
		t.Fatal(err)
	}
	// As a newer build would: its view under a new name, ours dropped.
	const newer = DimsTable + "_v99_mv"
	if err := ch.Exec(ctx, `CREATE MATERIALIZED VIEW `+qual+newer+on+` TO `+qual+l.Local(HourlyTable)+
		` AS SELECT tenant, code, ts AS hour, count() AS total FROM `+qual+l.Local(EventsTable)+` GROUP BY tenant, code, hour`); err != nil {
		t.Fatal(err)
	}
	if err := ch.Exec(ctx, `DROP TABLE `+qual+dimsView(t).name+on); err != nil {
		t.Fatal(err)
	}
	// An operator's own view, into a table of theirs, is none of kurz's
	// business.
	if err := ch.Exec(ctx, `CREATE TABLE `+qual+`clicks_by_day`+on+` (d Date, n UInt64) ENGINE = SummingMergeTree() ORDER BY d`); err != nil {
		t.Fatal(err)
	}
	if err := ch.Exec(ctx, `CREATE MATERIALIZED VIEW `+qual+`clicks_by_day_mv`+on+` TO `+qual+`clicks_by_day`+
		` AS SELECT toDate(ts) AS d, count() AS n FROM `+qual+l.Local(EventsTable)+` GROUP BY d`); err != nil {
		t.Fatal(err)
	}
	err := Apply(ctx, ch, l)
	if err == nil || !strings.Contains(err.Error(), newer) || strings.Contains(err.Error(), "clicks_by_day") {
		t.Fatalf("Apply over a newer build's database: %v; want a refusal naming %s alone", err, newer)
	}
	var n uint64
	if err := ch.QueryRow(ctx, "SELECT count() FROM system.tables WHERE database = currentDatabase() AND name = ?", dimsView(t).name).Scan(&n); err != nil || n != 0 {
		t.Errorf("this build's view was created beside the newer one (%d, %v)", n, err)
	}
	if err := ch.Exec(ctx, `DROP TABLE `+qual+newer+on); err != nil {
		t.Fatal(err)
	}
	if err := Apply(ctx, ch, l); err != nil {
		t.Errorf("Apply beside an operator's own view: %v", err)
	}
}

// TestApplyUpgradesAnEarlierVersion: a database an earlier version created
// (click_events without the columns added since, a view under a retired
// name) gets the missing columns, on the replicated and the Distributed
// tables of a cluster too, keeps its rows, and loses the retired view.
func TestApplyUpgradesAnEarlierVersion(t *testing.T) {
	ctx := context.Background()
	ch, l, on, qual := scratchDatabase(t, "_upgrade_")
	if err := Apply(ctx, ch, l); err != nil {
		t.Fatal(err)
	}

	// Make it the earlier version's database.
	events, _ := tableOf(l, EventsTable)
	var added []string
	for _, c := range events.declared() {
		if strings.Contains(c.decl, " DEFAULT ") {
			added = append(added, c.name)
		}
	}
	if len(added) == 0 {
		t.Fatal("click_events declares no column with a DEFAULT: nothing to upgrade")
	}
	for _, c := range added {
		if err := ch.Exec(ctx, `ALTER TABLE `+qual+l.Local(EventsTable)+on+` DROP COLUMN `+c); err != nil {
			t.Fatal(err)
		}
	}
	var retired []string
	for _, v := range views {
		retired = append(retired, v.retired...)
	}
	if l.Cluster != "" {
		for _, d := range Schema(l) {
			if d.Object == EventsTable && strings.Contains(d.Stmt, "Distributed(") {
				if err := chconn.ApplyDDL(ctx, ch, []string{`DROP TABLE ` + qual + EventsTable + on, d.Stmt}); err != nil {
					t.Fatal(err)
				}
			}
		}
	}
	for _, name := range retired {
		if err := ch.Exec(ctx, `CREATE MATERIALIZED VIEW `+qual+name+on+` TO `+qual+l.Local(HourlyTable)+
			` AS SELECT tenant, code, ts AS hour, count() AS total FROM `+qual+l.Local(EventsTable)+` GROUP BY tenant, code, hour`); err != nil {
			t.Fatal(err)
		}
	}
	for _, obj := range []string{l.Local(EventsTable), EventsTable} {
		have, err := columns(ctx, ch, obj)
		if err != nil {
			t.Fatal(err)
		}
		for _, c := range added {
			if slices.Contains(have, c) {
				t.Fatalf("%s still has %s after the drop", obj, c)
			}
		}
	}

	if err := Apply(ctx, ch, l); err != nil {
		t.Fatalf("Apply over the earlier version: %v", err)
	}
	for _, obj := range []string{l.Local(EventsTable), EventsTable} {
		have, err := columns(ctx, ch, obj)
		if err != nil {
			t.Fatal(err)
		}
		for _, c := range added {
			if !slices.Contains(have, c) {
				t.Errorf("%s lacks %s after Apply", obj, c)
			}
		}
	}
	for _, name := range retired {
		var n uint64
		if err := ch.QueryRow(ctx, "SELECT count() FROM system.tables WHERE database = currentDatabase() AND name = ?", name).Scan(&n); err != nil {
			t.Fatal(err)
		}
		if n != 0 {
			t.Errorf("retired view %s is still there", name)
		}
	}
	t.Logf("added %v; dropped retired views %v", added, retired)
}

// dimsV3Query is the query of click_dims_v3_mv, the breakdowns' view
// before they left bots and floods out: every click, per dimension.
const dimsV3Query = `SELECT tenant, code, ` + hourOf + ` AS hour,
		tupleElement(d, 1) AS dim, tupleElement(d, 2) AS key, count() AS clicks
	FROM %s
	ARRAY JOIN [('referrer', referrer_host), ('browser', browser), ('os', os), ('device', device),
		('country', country), ('rule', rule), ('variant', variant)] AS d
	GROUP BY tenant, code, hour, dim, key`

// TestApplyReplacesTheV3DimsView: a database whose breakdowns the v3 view
// fills (bots and floods included) gets this version's view, which counts
// human clicks only, and loses v3, on a cluster too; what v3 stored stays.
func TestApplyReplacesTheV3DimsView(t *testing.T) {
	ctx := context.Background()
	ch, l, on, qual := scratchDatabase(t, "_dimsv3_")
	if err := Apply(ctx, ch, l); err != nil {
		t.Fatal(err)
	}
	const v3 = DimsTable + "_v3_mv"
	current := dimsView(t)
	if current.name == v3 || !slices.Contains(current.retired, v3) {
		t.Fatalf("the breakdowns' view is %s, retiring %v: want a later one that retires %s", current.name, current.retired, v3)
	}
	// Make it the v3 build's database.
	if err := chconn.ApplyDDL(ctx, ch, []string{
		`DROP TABLE ` + qual + current.name + on,
		`CREATE MATERIALIZED VIEW ` + qual + v3 + on + ` TO ` + qual + l.Local(DimsTable) + ` AS ` +
			fmt.Sprintf(dimsV3Query, qual+l.Local(EventsTable)),
	}); err != nil {
		t.Fatal(err)
	}
	s := New(ch, l)
	tenant, code := "v3-"+rnd(), "v3code"
	at := time.Date(2025, 4, 1, 9, 0, 0, 0, time.UTC)
	clicks := func(prefix string) []Click {
		return []Click{
			{Tenant: tenant, Code: code, Time: at, EventID: prefix + "-human", Browser: "Firefox"},
			{Tenant: tenant, Code: code, Time: at, EventID: prefix + "-bot", Browser: "Bot", Bot: true},
			{Tenant: tenant, Code: code, Time: at, EventID: prefix + "-flood", Browser: "Chrome", Flood: true},
		}
	}
	if err := s.Insert(ctx, clicks("before")); err != nil {
		t.Fatal(err)
	}

	if err := Apply(ctx, ch, l); err != nil {
		t.Fatalf("Apply over the v3 database: %v", err)
	}
	for name, want := range map[string]uint64{v3: 0, current.name: 1} {
		var n uint64
		if err := ch.QueryRow(ctx, "SELECT count() FROM system.tables WHERE database = currentDatabase() AND name = ?", name).Scan(&n); err != nil {
			t.Fatal(err)
		}
		if n != want {
			t.Errorf("%d views named %s after Apply, want %d", n, name, want)
		}
	}
	if err := s.Insert(ctx, clicks("after")); err != nil {
		t.Fatal(err)
	}
	var got []string
	rows, err := ch.Query(ctx, `SELECT key, sum(clicks) AS n FROM `+DimsTable+`
		WHERE tenant = ? AND code = ? AND dim = ? GROUP BY key ORDER BY key`, tenant, code, DimBrowser)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	for rows.Next() {
		var key string
		var n uint64
		if err := rows.Scan(&key, &n); err != nil {
			t.Fatal(err)
		}
		got = append(got, fmt.Sprintf("%s=%d", key, n))
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	// v3 broke down the first three clicks, this version the later human.
	if want := []string{"Bot=1", "Chrome=1", "Firefox=2"}; !slices.Equal(got, want) {
		t.Errorf("browsers %v, want %v", got, want)
	}
}

// dimsView is the view this version fills the breakdowns with.
func dimsView(t *testing.T) view {
	t.Helper()
	for _, v := range views {
		if v.to == DimsTable {
			return v
		}
	}
	t.Fatal("no view into " + DimsTable)
	return view{}
}

func rnd() string {
	var b [6]byte
	_, _ = rand.Read(b[:])
	return hex.EncodeToString(b[:])
}

// scratchDatabase is a ClickHouse database of the test's own (the
// configured one's name, suffix and random hex), dropped when the test
// ends, with its layout and the ON CLUSTER clause and qualifier its DDL
// needs.
func scratchDatabase(t *testing.T, suffix string) (ch driver.Conn, l Layout, on, qual string) {
	t.Helper()
	var cfg struct{ ClickHouse chconn.Config }
	if err := config.LoadFrom(servertest.Env(nil), &cfg); err != nil {
		t.Fatal(err)
	}
	var b [4]byte
	_, _ = rand.Read(b[:])
	scratch := cfg.ClickHouse
	scratch.Database += suffix + hex.EncodeToString(b[:])
	l = LayoutOf(scratch)
	if l.Cluster != "" {
		on, qual = " ON CLUSTER "+l.Cluster, l.Database+"."
	}
	ch, err := chconn.New(context.Background(), scratch)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = ch.Exec(context.Background(), "DROP DATABASE IF EXISTS "+scratch.Database+on)
		_ = ch.Close()
	})
	return ch, l, on, qual
}
