package clickstore

import (
	"strings"
	"testing"
	"time"
)

// longKeyClicks are n clicks of a 63-character tenant on a custom domain's
// longest code (a 253-character domain, a 32-character alias).
func longKeyClicks(n int) []Click {
	tenant := strings.Repeat("t", 63)
	code := strings.Repeat("d", 63) + "." + strings.Repeat("o", 63) + "." + strings.Repeat("m", 63) + "." +
		strings.Repeat("n", 61) + "/" + strings.Repeat("a", 32)
	at := time.Date(2026, 12, 5, 4, 0, 0, 0, time.UTC)
	out := make([]Click, n)
	for i := range out {
		out[i] = Click{Tenant: tenant, Code: code, Time: at, EventID: "1733371200000-" + strings.Repeat("9", 6) + string(rune('0'+i%10))}
	}
	return out
}

// Existing's lookups stay under ClickHouse's max_query_size (256 KiB by
// default) whatever the keys' length, and ask for every row once: a
// thousand long keys in one query were refused (code 62), a failure the
// consumer retried for ever.
func TestExistingQueriesFitTheQuerySize(t *testing.T) {
	for _, n := range []int{1, 999, 1000, 1001, 2500} {
		rows := longKeyClicks(n)
		qs := existingQueries(rows)
		keys := 0
		for _, q := range qs {
			if len(q) > 256<<10-1024 {
				t.Errorf("%d rows: a query of %d bytes", n, len(q))
			}
			if !strings.HasSuffix(q, "))") {
				t.Errorf("%d rows: a query ends %q", n, q[len(q)-10:])
			}
			keys += strings.Count(q, "toDateTime(")
		}
		if keys != n {
			t.Errorf("%d rows: %d keys asked for in %d queries", n, keys, len(qs))
		}
	}
	if qs := existingQueries(nil); len(qs) != 0 {
		t.Errorf("no rows: %d queries", len(qs))
	}
}
