package app

// schema is the ClickHouse DDL, applied at every start. Every statement is
// idempotent and runs on ClickHouse 18.16 as well as 24.x.
var schema = []string{
	`CREATE TABLE IF NOT EXISTS clicks (
		event_id   String,
		code       String,
		ts         DateTime,
		visitor    String,
		referrer   String,
		user_agent String,
		is_bot     UInt8,
		is_flood   UInt8
	) ENGINE = ReplacingMergeTree()
	PARTITION BY toYYYYMM(ts)
	ORDER BY (code, ts, event_id)`,
}
