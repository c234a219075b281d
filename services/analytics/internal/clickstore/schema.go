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
	// DimsTable holds per-link hourly counts per referrer host, browser,
	// operating system and device class (SummingMergeTree).
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

// Schema is the ClickHouse DDL, applied at every start. Every statement is
// idempotent and runs on ClickHouse 18.16 as well as 24.x: MergeTree family
// engines, materialized views with TO, plain integer and string columns.
var Schema = []string{
	`CREATE TABLE IF NOT EXISTS ` + EventsTable + ` (
		tenant        String,
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
		inserted_at   DateTime
	) ENGINE = MergeTree()
	PARTITION BY toYYYYMM(ts)
	ORDER BY (tenant, code, ts, eid)`,

	`CREATE TABLE IF NOT EXISTS ` + HourlyTable + ` (
		tenant   String,
		code     String,
		hour     DateTime,
		total    UInt64,
		human    UInt64,
		bot      UInt64,
		flood    UInt64,
		visitors UInt64
	) ENGINE = SummingMergeTree()
	PARTITION BY toYYYYMM(hour)
	ORDER BY (tenant, code, hour)`,
	`CREATE MATERIALIZED VIEW IF NOT EXISTS ` + HourlyTable + `_mv TO ` + HourlyTable + ` AS
	SELECT tenant, code, ` + hourOf + ` AS hour,
		count() AS total,
		sum(is_bot = 0 AND is_flood = 0) AS human,
		sum(is_bot) AS bot,
		sum(is_bot = 0 AND is_flood = 1) AS flood,
		sum(new_visitor) AS visitors
	FROM ` + EventsTable + `
	GROUP BY tenant, code, hour`,

	`CREATE TABLE IF NOT EXISTS ` + DimsTable + ` (
		tenant String,
		code   String,
		hour   DateTime,
		dim    String,
		key    String,
		clicks UInt64
	) ENGINE = SummingMergeTree()
	PARTITION BY toYYYYMM(hour)
	ORDER BY (tenant, code, hour, dim, key)`,
	`CREATE MATERIALIZED VIEW IF NOT EXISTS ` + DimsTable + `_mv TO ` + DimsTable + ` AS
	SELECT tenant, code, ` + hourOf + ` AS hour,
		tupleElement(d, 1) AS dim, tupleElement(d, 2) AS key, count() AS clicks
	FROM ` + EventsTable + `
	ARRAY JOIN [('` + DimReferrer + `', referrer_host), ('` + DimBrowser + `', browser),
		('` + DimOS + `', os), ('` + DimDevice + `', device)] AS d
	GROUP BY tenant, code, hour, dim, key`,

	`CREATE TABLE IF NOT EXISTS ` + OwnersTable + ` (
		code   String,
		tenant String
	) ENGINE = ReplacingMergeTree()
	ORDER BY (code, tenant)`,
	`CREATE MATERIALIZED VIEW IF NOT EXISTS ` + OwnersTable + `_mv TO ` + OwnersTable + ` AS
	SELECT code, tenant FROM ` + EventsTable + ` GROUP BY code, tenant`,

	`CREATE TABLE IF NOT EXISTS ` + SuspectsTable + ` (
		tenant String,
		code   String,
		ts     DateTime,
		eid    UInt64
	) ENGINE = MergeTree()
	PARTITION BY toYYYYMM(ts)
	ORDER BY (tenant, code, ts, eid)`,
	`CREATE MATERIALIZED VIEW IF NOT EXISTS ` + SuspectsTable + `_mv TO ` + SuspectsTable + ` AS
	SELECT tenant, code, ts, eid FROM ` + EventsTable + ` WHERE suspect = 1`,
}

// Dimensions of DimsTable.
const (
	DimReferrer = "referrer"
	DimBrowser  = "browser"
	DimOS       = "os"
	DimDevice   = "device"
)

// eventColumns are the columns Insert writes, in order.
var eventColumns = []string{
	"tenant", "code", "ts", "event_id", "eid", "visitor", "referrer", "referrer_host", "user_agent",
	"browser", "os", "device", "is_bot", "is_flood", "new_visitor", "suspect", "inserted_at",
}

// requiredColumns are the columns this version reads or writes, per table
// whose shape changed during development.
var requiredColumns = map[string][]string{
	EventsTable:   eventColumns,
	SuspectsTable: {"tenant", "code", "ts", "eid"},
}

// Apply runs Schema. Right after each CREATE TABLE of a table whose shape
// changed during development it checks the columns: a table of the same
// name left by an older build fails the start with a message, instead of
// failing a view, every insert or every query.
func Apply(ctx context.Context, conn driver.Conn) error {
	for _, stmt := range Schema {
		if err := chconn.ApplyDDL(ctx, conn, []string{stmt}); err != nil {
			return err
		}
		for table, want := range requiredColumns {
			if !strings.HasPrefix(stmt, "CREATE TABLE IF NOT EXISTS "+table+" ") {
				continue
			}
			have, err := columns(ctx, conn, table)
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
					"or point KURZ_CLICKHOUSE_DATABASE elsewhere", table, strings.Join(missing, ", "))
			}
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
