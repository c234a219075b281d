package clickstore

import (
	"context"
	"fmt"
	"slices"
	"time"

	"kurz.dev/pkg/chconn"
)

// rawTables are the tables whose rows expire: the raw rows and their
// suspects, both partitioned by the month of ts. The rollups (HourlyTable,
// DimsTable) and OwnersTable are kept.
var rawTables = []string{EventsTable, SuspectsTable}

// ExpireRaw drops the raw rows (and their suspects) of every month that
// ended before cutoff, a whole partition at a time (ALTER TABLE ... DROP
// PARTITION, ON CLUSTER on a cluster): ClickHouse 18.16 has no table TTL
// (it came in 19.6). A month is the server's calendar month, the one
// toYYYYMM(ts) partitions by, so raw rows live between the retention and
// the retention plus one month. It returns the months (YYYYMM) it dropped,
// in order. The aggregates are untouched: statistics past the retention
// still come from them.
func (s *Store) ExpireRaw(ctx context.Context, cutoff time.Time) ([]uint32, error) {
	var dropped []uint32
	for _, table := range rawTables {
		months, err := s.expiredMonths(ctx, table, cutoff)
		if err != nil {
			return dropped, err
		}
		for _, m := range months {
			stmt := fmt.Sprintf("ALTER TABLE %s%s DROP PARTITION %d", s.layout.LocalQualified(table), s.onCluster(), m)
			// Through ApplyDDL: on a cluster with a server down, the
			// servers that are up drop the month and the one down drops it
			// from its queue when it returns, instead of every pass
			// waiting ClickHouse's 180 s for it and failing.
			if err := chconn.ApplyDDL(ctx, s.conn, []string{stmt}); err != nil {
				return dropped, fmt.Errorf("clickhouse drop %s month %d: %w", table, m, err)
			}
			if !slices.Contains(dropped, m) {
				dropped = append(dropped, m)
			}
		}
	}
	slices.Sort(dropped)
	return dropped, nil
}

// expiredMonths lists table's months that ended before cutoff and still
// hold rows. Only rows before the start of cutoff's month qualify, so the
// partition index skips every month that is kept: once the old months are
// dropped, the query reads nothing.
func (s *Store) expiredMonths(ctx context.Context, table string, cutoff time.Time) ([]uint32, error) {
	rows, err := s.conn.Query(ctx, `SELECT DISTINCT toYYYYMM(ts) FROM `+table+`
		WHERE ts < toDateTime(toStartOfMonth(toDateTime(?)))`, cutoff.Unix())
	if err != nil {
		return nil, fmt.Errorf("clickhouse expired months of %s: %w", table, err)
	}
	defer rows.Close()
	var out []uint32
	for rows.Next() {
		var m uint32
		if err := rows.Scan(&m); err != nil {
			return nil, fmt.Errorf("clickhouse expired months of %s: %w", table, err)
		}
		out = append(out, m)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("clickhouse expired months of %s: %w", table, err)
	}
	return out, nil
}

func (s *Store) onCluster() string {
	if s.layout.Cluster == "" {
		return ""
	}
	return " ON CLUSTER " + s.layout.Cluster
}
