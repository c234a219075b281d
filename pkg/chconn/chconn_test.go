//go:build integration

package chconn_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"kurz.dev/pkg/chconn"
	"kurz.dev/pkg/config"
)

func TestBatchInsertAndQuery(t *testing.T) {
	var cfg chconn.Config
	if err := config.Load(&cfg); err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	conn, err := chconn.New(ctx, cfg)
	if err != nil {
		t.Fatalf("local ClickHouse (make up): %v", err)
	}
	defer conn.Close()

	table := fmt.Sprintf("probe_%d", time.Now().UnixNano())
	ddl := []string{`CREATE TABLE IF NOT EXISTS ` + table + ` (
		ts   DateTime,
		code String,
		n    UInt32
	) ENGINE = MergeTree() PARTITION BY toYYYYMM(ts) ORDER BY (code, ts)`}
	// Applying twice proves the DDL is idempotent.
	for range 2 {
		if err := chconn.ApplyDDL(ctx, conn, ddl); err != nil {
			t.Fatal(err)
		}
	}
	defer func() { _ = conn.Exec(ctx, "DROP TABLE IF EXISTS "+table) }()

	batch, err := conn.PrepareBatch(ctx, "INSERT INTO "+table+" (ts, code, n)")
	if err != nil {
		t.Fatalf("prepare batch: %v", err)
	}
	now := time.Now().Truncate(time.Second)
	var count, sum [3]uint64
	for i := range 100 {
		if err := batch.Append(now, fmt.Sprintf("c%d", i%3), uint32(i)); err != nil {
			t.Fatalf("append: %v", err)
		}
		count[i%3]++
		sum[i%3] += uint64(i)
	}
	if err := batch.Send(); err != nil {
		t.Fatalf("send: %v", err)
	}

	rows, err := conn.Query(ctx, "SELECT code, count() AS c, sum(n) AS s FROM "+table+" GROUP BY code ORDER BY code")
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	var got []string
	for rows.Next() {
		var code string
		var c, s uint64
		if err := rows.Scan(&code, &c, &s); err != nil {
			t.Fatal(err)
		}
		got = append(got, fmt.Sprintf("%s:%d:%d", code, c, s))
	}
	var want []string
	for i := range 3 {
		want = append(want, fmt.Sprintf("c%d:%d:%d", i, count[i], sum[i]))
	}
	if strings.Join(got, " ") != strings.Join(want, " ") {
		t.Errorf("got %q, want %q", got, want)
	}
}

// A refused password was reported as "unreachable (set
// KURZ_CLICKHOUSE_ADDRS)": the operator was sent to the addresses.
func TestNewNamesTheCredentialsWhenRefused(t *testing.T) {
	var cfg chconn.Config
	if err := config.Load(&cfg); err != nil {
		t.Fatal(err)
	}
	cfg.Password = "not-the-password-" + fmt.Sprint(time.Now().UnixNano())
	conn, err := chconn.New(context.Background(), cfg)
	if err == nil {
		conn.Close()
		t.Fatal("connected with a wrong password")
	}
	msg := err.Error()
	if !strings.Contains(msg, "KURZ_CLICKHOUSE_USER") || !strings.Contains(msg, "KURZ_CLICKHOUSE_PASSWORD") || strings.Contains(msg, "unreachable") {
		t.Errorf("got %q, want an error naming KURZ_CLICKHOUSE_USER and _PASSWORD, not unreachable", msg)
	}
	if strings.Contains(msg, cfg.Password) {
		t.Errorf("error holds the password: %q", msg)
	}
}
