package clickstore

import (
	"context"
	"fmt"
	"slices"
	"strings"

	"github.com/ClickHouse/clickhouse-go/v2/lib/driver"

	"kurz.dev/pkg/chconn"
)

// Table names. The raw table is click_events, not clicks: the skeleton's
// clicks table had another shape, and CREATE ... IF NOT EXISTS would keep an
// old one silently in a development database.
const (
	// EventsTable holds every inserted row, duplicates included (plain
	// MergeTree on purpose: the duplicate correction counts copies).
	EventsTable = "click_events"
	// HourlyTable holds per-link hourly counts (SummingMergeTree).
	HourlyTable = "click_hourly"
	// DimsTable holds per-link hourly counts of human clicks per referrer
	// host, browser, operating system, device class, country, rule and
	// variant (SummingMergeTree).
	DimsTable = "click_dims"
	// OwnersTable maps a code to the tenants that have clicks on it.
	OwnersTable = "click_owners"
	// SuspectsTable holds the keys of rows that may duplicate another row:
	// redelivered entries and retries of an insert whose outcome was unknown.
	SuspectsTable = "click_suspects"
)

// hourOf is the hour bucket of ts, computed on the Unix time so that it does
// not depend on the server's time zone (toStartOfHour does, and some zones
// are not whole hours from UTC).
const hourOf = `toDateTime(intDiv(toUInt32(ts), 3600) * 3600)`

// table is one table of the schema: its columns, the MergeTree engine that
// stores it on one server (the Replicated one on a cluster) and the rest of
// its definition.
type table struct {
	name, columns, engine, keys string
	// shardKey spreads inserted rows over a cluster's shards; only the raw
	// table takes inserts.
	shardKey string
}

// view is a materialized view: rows inserted into from go through query
// into to.
type view struct {
	name, to, from, query string
	// retired are the names this view had before its query changed. A
	// materialized view cannot be altered on ClickHouse 18.16, so a view
	// whose query changes gets a new name and Apply drops the old ones
	// before creating it (see upgradeView).
	retired []string
}

// shardKey keeps each link's rows on one shard: its raw rows, its
// aggregates (the views run where the rows land) and its suspects, so a
// link's queries read one shard's tables.
const shardKey = "cityHash64(tenant, code)"

var tables = []table{{
	name: EventsTable, engine: "MergeTree", shardKey: shardKey,
	columns: `tenant        String,
		code          String,
		ts            DateTime,
		event_id      String,
		eid           UInt64,
		visitor       String,
		referrer      String,
		referrer_host String,
		user_agent    String,
		browser       String,
		os            String,
		device        String,
		is_bot        UInt8,
		is_flood      UInt8,
		new_visitor   UInt8,
		suspect       UInt8,
		inserted_at   DateTime,
		country       String DEFAULT '',
		rule          String DEFAULT '',
		variant       String DEFAULT ''`,
	keys: `PARTITION BY toYYYYMM(ts)
	ORDER BY (tenant, code, ts, eid)`,
}, {
	name: HourlyTable, engine: "SummingMergeTree",
	columns: `tenant   String,
		code     String,
		hour     DateTime,
		total    UInt64,
		human    UInt64,
		bot      UInt64,
		flood    UInt64,
		visitors UInt64`,
	keys: `PARTITION BY toYYYYMM(hour)
	ORDER BY (tenant, code, hour)`,
}, {
	name: DimsTable, engine: "SummingMergeTree",
	columns: `tenant String,
		code   String,
		hour   DateTime,
		dim    String,
		key    String,
		clicks UInt64`,
	keys: `PARTITION BY toYYYYMM(hour)
	ORDER BY (tenant, code, hour, dim, key)`,
}, {
	name: OwnersTable, engine: "ReplacingMergeTree",
	columns: `code   String,
		tenant String`,
	keys: `ORDER BY (code, tenant)`,
}, {
	name: SuspectsTable, engine: "MergeTree",
	columns: `tenant String,
		code   String,
		ts     DateTime,
		eid    UInt64`,
	keys: `PARTITION BY toYYYYMM(ts)
	ORDER BY (tenant, code, ts, eid)`,
}}

var views = []view{{
	name: HourlyTable + "_mv", to: HourlyTable, from: EventsTable,
	query: `SELECT tenant, code, ` + hourOf + ` AS hour,
		count() AS total,
		sum(is_bot = 0 AND is_flood = 0) AS human,
		sum(is_bot) AS bot,
		sum(is_bot = 0 AND is_flood = 1) AS flood,
		sum(new_visitor) AS visitors
	FROM %s
	GROUP BY tenant, code, hour`,
}, {
	// v2: the country dimension; v3: the rule and variant dimensions; v4:
	// human clicks only. The earlier views are dropped (retired).
	//
	// Bots and floods are left out: they are counted in click_hourly
	// already, and broken down they let one client fill a link's
	// breakdowns (a new Referer host per request made a row per host and
	// hour, 39,581 in 5 s from one curl) and tilt its A/B variants (one
	// flooder is sticky to one variant).
	name: DimsTable + "_v4_mv", to: DimsTable, from: EventsTable,
	retired: []string{DimsTable + "_mv", DimsTable + "_v2_mv", DimsTable + "_v3_mv"},
	query: `SELECT tenant, code, ` + hourOf + ` AS hour,
		tupleElement(d, 1) AS dim, tupleElement(d, 2) AS key, count() AS clicks
	FROM %s
	ARRAY JOIN [('` + DimReferrer + `', referrer_host), ('` + DimBrowser + `', browser),
		('` + DimOS + `', os), ('` + DimDevice + `', device), ('` + DimCountry + `', country),
		('` + DimRule + `', rule), ('` + DimVariant + `', variant)] AS d
	WHERE is_bot = 0 AND is_flood = 0
	GROUP BY tenant, code, hour, dim, key`,
}, {
	name: OwnersTable + "_mv", to: OwnersTable, from: EventsTable,
	query: `SELECT code, tenant FROM %s GROUP BY code, tenant`,
}, {
	name: SuspectsTable + "_mv", to: SuspectsTable, from: EventsTable,
	query: `SELECT tenant, code, ts, eid FROM %s WHERE suspect = 1`,
}}

// LocalSuffix names a cluster's per-server tables: click_events_local is
// the ReplicatedMergeTree each server holds of its shard, click_events the
// Distributed table over all shards that inserts and queries go through.
const LocalSuffix = "_local"

// Layout says where the tables live: on one server (Cluster empty) or on
// every server of a ClickHouse cluster.
type Layout struct {
	// Database holds the tables (on a cluster, on every server).
	Database string
	// Cluster is the remote_servers cluster; empty: one server.
	Cluster string
}

// LayoutOf is the layout cfg selects.
func LayoutOf(cfg chconn.Config) Layout {
	return Layout{Database: cfg.Database, Cluster: cfg.Cluster}
}

// Local is the name of table's rows on one server: table itself on one
// server, its replicated per-shard table on a cluster.
func (l Layout) Local(table string) string {
	if l.Cluster == "" {
		return table
	}
	return table + LocalSuffix
}

// LocalQualified is Local(table) with its database on a cluster: a query
// sent to the other shards resolves unqualified names in their default
// database, not the connection's.
func (l Layout) LocalQualified(table string) string {
	if l.Cluster == "" {
		return table
	}
	return l.Database + "." + l.Local(table)
}

// DDL is one idempotent statement of the schema and the table or view it
// creates.
type DDL struct {
	Object, Stmt string
}

// Schema is the ClickHouse DDL, applied at every start. Every statement is
// idempotent and runs on ClickHouse 18.16 as well as 24.x: MergeTree family
// engines, materialized views with TO, plain integer and string columns.
//
// On one server the tables are plain MergeTree family tables. On a cluster
// each server holds its shard in Replicated tables (<name>_local, their
// ZooKeeper path /clickhouse/tables/{shard}/<database>/<name>_local, the
// {shard} and {replica} macros from each server's configuration), the views
// run on the server where rows land, and a Distributed table of the plain
// name spans the shards: the raw rows sharded by link (shardKey), so the
// queries are the same in both layouts.
func Schema(l Layout) []DDL {
	var out []DDL
	on, qual := "", ""
	if l.Cluster != "" {
		on, qual = " ON CLUSTER "+l.Cluster, l.Database+"."
	}
	for _, t := range tables {
		engine := t.engine + "()"
		if l.Cluster != "" {
			engine = fmt.Sprintf("Replicated%s('/clickhouse/tables/{shard}/%s/%s', '{replica}')",
				t.engine, l.Database, l.Local(t.name))
		}
		out = append(out, DDL{l.Local(t.name), `CREATE TABLE IF NOT EXISTS ` + qual + l.Local(t.name) + on + ` (
		` + t.columns + `
	) ENGINE = ` + engine + `
	` + t.keys})
	}
	for _, v := range views {
		out = append(out, DDL{v.name, `CREATE MATERIALIZED VIEW IF NOT EXISTS ` + qual + v.name + on +
			` TO ` + qual + l.Local(v.to) + ` AS
	` + fmt.Sprintf(v.query, qual+l.Local(v.from))})
	}
	if l.Cluster == "" {
		return out
	}
	for _, t := range tables {
		args := l.Cluster + ", " + l.Database + ", " + l.Local(t.name)
		if t.shardKey != "" {
			args += ", " + t.shardKey
		}
		out = append(out, DDL{t.name, `CREATE TABLE IF NOT EXISTS ` + qual + t.name + on +
			` AS ` + qual + l.Local(t.name) + ` ENGINE = Distributed(` + args + `)`})
	}
	return out
}

// Dimensions of DimsTable.
const (
	DimReferrer = "referrer"
	DimBrowser  = "browser"
	DimOS       = "os"
	DimDevice   = "device"
	DimCountry  = "country"
	// DimRule and DimVariant are the link's redirect rule or A/B-test
	// variant that chose the destination ("" when none did).
	DimRule    = "rule"
	DimVariant = "variant"
)

// eventColumns are the columns Insert writes, in order.
var eventColumns = []string{
	"tenant", "code", "ts", "event_id", "eid", "visitor", "referrer", "referrer_host", "user_agent",
	"browser", "os", "device", "is_bot", "is_flood", "new_visitor", "suspect", "inserted_at", "country",
	"rule", "variant",
}

// requiredColumns are the columns this version reads or writes, per table
// whose shape changed during development.
var requiredColumns = map[string][]string{
	EventsTable:   eventColumns,
	SuspectsTable: {"tenant", "code", "ts", "eid"},
}

// Apply runs Schema(l). Right after each CREATE TABLE of a table whose
// shape changed during development it checks the columns: a table of the
// same name left by an older build fails the start with a message, instead
// of failing a view, every insert or every query.
//
// On a cluster a statement runs only when this server lacks its object: ON
// CLUSTER waits for every server, and a start must not wait for one that is
// down (the DDL queue in ZooKeeper brings it the statements it missed when
// it returns).
func Apply(ctx context.Context, conn driver.Conn, l Layout) error {
	if err := refuseNewerViews(ctx, conn, l); err != nil {
		return err
	}
	for _, d := range Schema(l) {
		if err := retireViews(ctx, conn, l, d.Object); err != nil {
			return err
		}
		if l.Cluster != "" {
			var have uint64
			if err := conn.QueryRow(ctx, "SELECT count() FROM system.tables WHERE database = currentDatabase() AND name = ?",
				d.Object).Scan(&have); err != nil {
				return fmt.Errorf("clickhouse: tables: %w", err)
			}
			if have > 0 {
				if err := addColumns(ctx, conn, l, d.Object); err != nil {
					return err
				}
				if err := checkColumns(ctx, conn, l, d.Object); err != nil {
					return err
				}
				continue
			}
		}
		if err := chconn.ApplyDDL(ctx, conn, []string{d.Stmt}); err != nil {
			return err
		}
		if err := addColumns(ctx, conn, l, d.Object); err != nil {
			return err
		}
		if err := checkColumns(ctx, conn, l, d.Object); err != nil {
			return err
		}
	}
	return nil
}

// column is one declared column: its name and the rest of its declaration
// (type, default).
type column struct {
	name, decl string
}

// declared parses t.columns, one column per line.
func (t table) declared() []column {
	var out []column
	for line := range strings.Lines(t.columns) {
		line = strings.TrimSuffix(strings.TrimSpace(line), ",")
		name, decl, ok := strings.Cut(line, " ")
		if !ok {
			continue
		}
		out = append(out, column{name, strings.TrimSpace(decl)})
	}
	return out
}

// tableOf is the declared table whose rows object holds: the table itself on
// one server, its _local table or its Distributed table on a cluster.
func tableOf(l Layout, object string) (table, bool) {
	for _, t := range tables {
		if object == t.name || object == l.Local(t.name) {
			return t, true
		}
	}
	return table{}, false
}

// addColumns is the upgrade path of a table created by an earlier version:
// a declared column with a DEFAULT that object lacks is added (ClickHouse
// 18.16 has no ADD COLUMN IF NOT EXISTS, so the columns are compared
// first). Rows written before read the default. On a cluster the
// replicated table is altered ON CLUSTER (ClickHouse runs it on one replica
// per shard and replication does the rest); a Distributed table cannot be
// altered ON CLUSTER on 18.16 ("isn't replicated"), so it is dropped and
// created again over the altered tables: inserts through it fail for that
// moment and are redelivered. A column without a DEFAULT is never added:
// checkColumns reports it.
func addColumns(ctx context.Context, conn driver.Conn, l Layout, object string) error {
	t, ok := tableOf(l, object)
	if !ok {
		return nil
	}
	have, err := columns(ctx, conn, object)
	if err != nil {
		return err
	}
	var missing []column
	for _, c := range t.declared() {
		if !slices.Contains(have, c.name) && strings.Contains(c.decl, " DEFAULT ") {
			missing = append(missing, c)
		}
	}
	if len(missing) == 0 {
		return nil
	}
	on, qual := "", ""
	if l.Cluster != "" {
		on, qual = " ON CLUSTER "+l.Cluster, l.Database+"."
	}
	if l.Cluster != "" && object == t.name {
		// Only a Distributed table is dropped: a table of this name with
		// rows of its own (left by another layout) is checkColumns' to
		// report.
		var engine string
		if err := conn.QueryRow(ctx, "SELECT engine FROM system.tables WHERE database = currentDatabase() AND name = ?",
			object).Scan(&engine); err != nil {
			return fmt.Errorf("clickhouse: engine of %s: %w", object, err)
		}
		if engine != "Distributed" {
			return nil
		}
		for _, d := range Schema(l) {
			if d.Object == object && strings.Contains(d.Stmt, "ENGINE = Distributed(") {
				return chconn.ApplyDDL(ctx, conn, []string{`DROP TABLE IF EXISTS ` + qual + object + on, d.Stmt})
			}
		}
		return fmt.Errorf("clickhouse: no Distributed table %s in the schema", object)
	}
	for _, c := range missing {
		err := chconn.ApplyDDL(ctx, conn, []string{`ALTER TABLE ` + qual + object + on + ` ADD COLUMN ` + c.name + ` ` + c.decl})
		if err == nil {
			continue
		}
		// Another replica of the analytics service may have added it
		// meanwhile.
		if now, cerr := columns(ctx, conn, object); cerr == nil && slices.Contains(now, c.name) {
			continue
		}
		return fmt.Errorf("clickhouse: add column %s to %s: %w", c.name, object, err)
	}
	return nil
}

// refuseNewerViews fails the start when the database holds a materialized
// view into one of this build's aggregate tables that this build neither
// creates nor retires: a newer build's (a view whose query changed gets a
// new name, <table>_v<N>_mv). Views of other names (an operator's own) are
// not kurz's business. Started anyway,
// this build would create its own older view beside it, and every click
// would be broken down twice into the same table, for good (an analytics
// rolled back across such a change doubled every breakdown).
func refuseNewerViews(ctx context.Context, conn driver.Conn, l Layout) error {
	known := map[string]bool{}
	for _, v := range views {
		known[v.name] = true
		known[l.Local(v.name)] = true
		for _, r := range v.retired {
			known[r], known[l.Local(r)] = true, true
		}
	}
	rows, err := conn.Query(ctx, `SELECT name FROM system.tables
		WHERE database = currentDatabase() AND engine = 'MaterializedView' AND name LIKE 'click%'`)
	if err != nil {
		return fmt.Errorf("clickhouse: views: %w", err)
	}
	defer rows.Close()
	var unknown []string
	for rows.Next() {
		var name string
		if err := rows.Scan(&name); err != nil {
			return fmt.Errorf("clickhouse: views: %w", err)
		}
		if !known[name] && ours(name) {
			unknown = append(unknown, name)
		}
	}
	if err := rows.Err(); err != nil {
		return fmt.Errorf("clickhouse: views: %w", err)
	}
	if len(unknown) > 0 {
		slices.Sort(unknown)
		return fmt.Errorf("clickhouse: the database holds views a newer analytics made (%s): this build would count "+
			"clicks into them twice; run the newer build, or drop those views knowingly", strings.Join(unknown, ", "))
	}
	return nil
}

// ours reports whether a view's name is one kurz's naming gives a view
// into one of its aggregate tables: <table>_mv or <table>_v<N>_mv.
func ours(name string) bool {
	for _, v := range views {
		rest, ok := strings.CutPrefix(name, v.to+"_")
		if !ok {
			continue
		}
		if rest == "mv" {
			return true
		}
		if n, ok := strings.CutSuffix(rest, "_mv"); ok && len(n) > 1 && n[0] == 'v' && strings.Trim(n[1:], "0123456789") == "" {
			return true
		}
	}
	return false
}

// retireViews drops the earlier names of the view named object, before
// Apply creates it: the rows inserted between the drop and the create are
// not broken down by that view (their totals, counted by another view, are
// whole). Dropping first loses those few rows' breakdowns where creating
// first would count them twice.
func retireViews(ctx context.Context, conn driver.Conn, l Layout, object string) error {
	on, qual := "", ""
	if l.Cluster != "" {
		on, qual = " ON CLUSTER "+l.Cluster, l.Database+"."
	}
	for _, v := range views {
		if v.name != object {
			continue
		}
		for _, old := range v.retired {
			var have uint64
			if err := conn.QueryRow(ctx, "SELECT count() FROM system.tables WHERE database = currentDatabase() AND name = ?",
				old).Scan(&have); err != nil {
				return fmt.Errorf("clickhouse: tables: %w", err)
			}
			if have == 0 {
				continue
			}
			if err := chconn.ApplyDDL(ctx, conn, []string{`DROP TABLE IF EXISTS ` + qual + old + on}); err != nil {
				return err
			}
		}
	}
	return nil
}

// checkColumns fails when object is a table whose shape changed during
// development (or, on a cluster, the Distributed table over one) and it
// lacks a column this version needs.
func checkColumns(ctx context.Context, conn driver.Conn, l Layout, object string) error {
	for table, want := range requiredColumns {
		if object != table && object != l.Local(table) {
			continue
		}
		have, err := columns(ctx, conn, object)
		if err != nil {
			return err
		}
		var missing []string
		for _, c := range want {
			if !slices.Contains(have, c) {
				missing = append(missing, c)
			}
		}
		if len(missing) > 0 {
			return fmt.Errorf("clickhouse: table %s exists without columns %s: it was created by another version; "+
				"drop the click_* tables and views of this database (nothing else reads them) "+
				"or point KURZ_CLICKHOUSE_DATABASE elsewhere", object, strings.Join(missing, ", "))
		}
	}
	return nil
}

func columns(ctx context.Context, conn driver.Conn, table string) ([]string, error) {
	rows, err := conn.Query(ctx,
		"SELECT name FROM system.columns WHERE database = currentDatabase() AND table = ?", table)
	if err != nil {
		return nil, fmt.Errorf("clickhouse: columns of %s: %w", table, err)
	}
	defer rows.Close()
	var have []string
	for rows.Next() {
		var name string
		if err := rows.Scan(&name); err != nil {
			return nil, fmt.Errorf("clickhouse: columns of %s: %w", table, err)
		}
		have = append(have, name)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("clickhouse: columns of %s: %w", table, err)
	}
	return have, nil
}
