//go:build integration

package stats

import (
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	analyticsv1 "kurz.dev/gen/kurz/analytics/v1"
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
