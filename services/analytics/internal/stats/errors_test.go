//go:build integration

package stats

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	analyticsv1 "kurz.dev/gen/kurz/analytics/v1"
	"kurz.dev/pkg/chconn"
	"kurz.dev/pkg/rpcerr"
	"kurz.dev/pkg/testkit/servertest"
	"kurz.dev/services/analytics/internal/clickstore"
)

// A ClickHouse outage is UNAVAILABLE, worth retrying, with kurz's
// ErrorInfo and a RetryInfo; a failure ClickHouse answered (here: its tables
// do not exist) is INTERNAL with a generic message that names nothing of it.
func TestStoreFailures(t *testing.T) {
	// A closed pool fails every query as one whose server went away does
	// (clickstore's tests dial a port nothing listens on).
	gone, l := connect(t, "")
	if err := gone.Close(); err != nil {
		t.Fatal(err)
	}
	empty, _ := connect(t, "kurz_test_empty") // created, never migrated: no tables

	tests := map[string]struct {
		store      *clickstore.Store
		wantCode   codes.Code
		wantReason string
		wantRetry  time.Duration
	}{
		"clickhouse gone":  {clickstore.New(gone, l), codes.Unavailable, ReasonStoreDown, time.Second},
		"a query it fails": {clickstore.New(empty, l), codes.Internal, "", 0},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			svc := New(tc.store, servertest.Logger(t), Options{})
			_, err := svc.GetLinkStats(as("tenant-"+rnd()), &analyticsv1.GetLinkStatsRequest{Code: "abc" + rnd()})
			st := status.Convert(err)
			if st.Code() != tc.wantCode {
				t.Fatalf("code %v (%v), want %v", st.Code(), err, tc.wantCode)
			}
			info, _, retryInfo := rpcerr.Details(err)
			if info != nil && info.GetDomain() != rpcerr.Domain {
				t.Errorf("ErrorInfo domain %q, want %q", info.GetDomain(), rpcerr.Domain)
			}
			reason, retry := info.GetReason(), retryInfo.GetRetryDelay().AsDuration()
			if reason != tc.wantReason || retry != tc.wantRetry {
				t.Errorf("reason %q, retry %v; want %q, %v", reason, retry, tc.wantReason, tc.wantRetry)
			}
			for _, leak := range []string{"clickhouse", "Table", "kurz_test_empty"} {
				if strings.Contains(st.Message(), leak) {
					t.Errorf("message %q names %q", st.Message(), leak)
				}
			}
		})
	}
}

// TestQueryTimeoutStopsTheReads: reads that pass QueryTimeout answer
// DEADLINE_EXCEEDED (not UNAVAILABLE, not a late OK), and ClickHouse stops
// them too instead of computing on for nobody. click_dims is replaced by a
// view that never ends (a second per block of numbers, none of them the
// link's).
func TestQueryTimeoutStopsTheReads(t *testing.T) {
	ctx := context.Background()
	database := "kurz_test_slow_" + rnd()
	ch, l := connect(t, database)
	on, qual := "", ""
	if l.Cluster != "" {
		on, qual = " ON CLUSTER "+l.Cluster, database+"."
	}
	t.Cleanup(func() { _ = ch.Exec(context.Background(), "DROP DATABASE IF EXISTS "+database+on) })
	if err := clickstore.Apply(ctx, ch, l); err != nil {
		t.Fatal(err)
	}
	if err := chconn.ApplyDDL(ctx, ch, []string{
		`DROP TABLE ` + qual + clickstore.DimsTable + on,
		`CREATE VIEW ` + qual + clickstore.DimsTable + on + ` AS SELECT concat('slow-', toString(number)) AS tenant,
			'' AS code, toDateTime(0) AS hour, '' AS dim, '' AS key, toUInt64(1) AS clicks
		FROM system.numbers WHERE sleep(1) = 0`,
	}); err != nil {
		t.Fatal(err)
	}
	// Three calls at once: how the driver gives up on a read (the socket
	// deadline or the context first, a cancel packet sent or not) varies
	// from call to call, and each must answer and stop the same way.
	const timeout, calls = 2 * time.Second, 3
	svc := New(clickstore.New(ch, l), servertest.Logger(t), Options{QueryTimeout: timeout})
	tenant := "timeout-" + rnd()
	start := time.Now()
	var wg sync.WaitGroup
	var errs [calls]error
	for i := range calls {
		wg.Go(func() {
			_, errs[i] = svc.GetLinkStats(as(fmt.Sprintf("%s-%d", tenant, i)), &analyticsv1.GetLinkStatsRequest{Code: "slow" + rnd()})
		})
	}
	wg.Wait()
	for i, err := range errs {
		if got := status.Code(err); got != codes.DeadlineExceeded {
			t.Errorf("call %d after %v: %v (%v), want DeadlineExceeded", i, time.Since(start), got, err)
		}
	}
	// The reads are found by the tenant their queries name; ClickHouse
	// stops them within the second their limit is rounded up to.
	const grace = time.Second + time.Second/2
	stopped, state := servertest.EventuallyState(grace, func() (bool, string) {
		var n uint64
		if err := ch.QueryRow(ctx, `SELECT count() FROM system.processes WHERE query LIKE ? AND query NOT LIKE '%system.processes%'`,
			"%"+tenant+"%").Scan(&n); err != nil {
			return false, err.Error()
		}
		return n == 0, fmt.Sprintf("%d reads running %v after the calls began", n, time.Since(start).Round(time.Millisecond))
	})
	if !stopped {
		_ = ch.Exec(ctx, `KILL QUERY WHERE query LIKE '%`+tenant+`%' ASYNC`)
		t.Fatalf("ClickHouse did not stop the reads within %v of the %v timeout: %s", grace, timeout, state)
	}
}
