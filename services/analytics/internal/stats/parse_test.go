package stats

import (
	"log/slog"
	"strings"
	"testing"
	"time"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/timestamppb"

	analyticsv1 "kurz.dev/gen/kurz/analytics/v1"
	"kurz.dev/pkg/rpcerr"
)

// Times ClickHouse's DateTime cannot hold are refused, naming the field,
// before a query would wrap them modulo 2^32 and count another period; the
// edges of what it holds, in whole hours, are served.
func TestParseRefusesTimesClickHouseCannotHold(t *testing.T) {
	// The repro's range: 2^32 s after a 2026 day, which ClickHouse 18.16
	// read as that day.
	wrapped := time.Date(2163, 1, 10, 6, 28, 16, 0, time.UTC)
	epoch := time.Unix(0, 0).UTC()
	last := time.Date(2106, 2, 7, 6, 0, 0, 0, time.UTC) // the last whole hour DateTime holds
	tests := map[string]struct {
		start, end time.Time // zero: unset
		wantField  string    // "": served
		wantInMsg  string
	}{
		"a range past 2106, as in the report": {start: wrapped, end: wrapped.Add(48 * time.Hour), wantField: "end_time", wantInMsg: "2163-01-12T06:28:16Z is outside"},
		"start past 2106, end unset":          {start: wrapped, wantField: "start_time", wantInMsg: "2163-01-10T06:28:16Z is outside"},
		"end within the last hour it holds":   {start: last.Add(-time.Hour), end: last.Add(28 * time.Minute), wantField: "end_time", wantInMsg: "2106-02-07T06:00:00Z"},
		"end a second past the last hour":     {start: last.Add(-time.Hour), end: last.Add(time.Second), wantField: "end_time", wantInMsg: "is outside the times statistics cover"},
		"start before 1970":                   {start: epoch.Add(-time.Second), end: epoch.Add(time.Hour), wantField: "start_time", wantInMsg: "1969-12-31T23:59:59Z is outside"},
		"start far before 1970":               {start: time.Date(1, 1, 1, 0, 0, 0, 0, time.UTC), end: epoch.Add(time.Hour), wantField: "start_time", wantInMsg: "1970-01-01T00:00:00Z to 2106-02-07T06:00:00Z"},
		"default start before 1970":           {end: epoch.Add(24 * time.Hour), wantField: "start_time", wantInMsg: "when unset, 30 days before end_time"},
		"from 1970":                           {start: epoch, end: epoch.Add(24 * time.Hour)},
		"up to the last hour":                 {start: last.Add(-24 * time.Hour), end: last},
	}
	svc := New(nil, slog.New(slog.DiscardHandler), Options{})
	svc.opts.now = func() time.Time { return time.Date(2026, 11, 18, 2, 1, 36, 0, time.UTC) }
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			req := &analyticsv1.GetLinkStatsRequest{Code: "abcd1234", Interval: analyticsv1.Interval_INTERVAL_DAY}
			if !tc.start.IsZero() {
				req.StartTime = timestamppb.New(tc.start)
			}
			if !tc.end.IsZero() {
				req.EndTime = timestamppb.New(tc.end)
			}
			q, err := svc.parse(req)
			if tc.wantField == "" {
				if err != nil {
					t.Fatalf("refused: %v", err)
				}
				if q.r.Start.Before(EarliestTime) || q.r.End.After(LatestTime) {
					t.Errorf("range [%s, %s) reaches past [%s, %s]", q.r.Start, q.r.End, EarliestTime, LatestTime)
				}
				return
			}
			st := status.Convert(err)
			if st.Code() != codes.InvalidArgument || !strings.Contains(st.Message(), tc.wantInMsg) {
				t.Fatalf("got %v %q, want InvalidArgument containing %q", st.Code(), st.Message(), tc.wantInMsg)
			}
			var field, reason string
			for _, d := range st.Details() {
				switch d := d.(type) {
				case *errdetails.BadRequest:
					if v := d.GetFieldViolations(); len(v) > 0 {
						field = v[0].GetField()
					}
				case *errdetails.ErrorInfo:
					if d.GetDomain() == rpcerr.Domain {
						reason = d.GetReason()
					}
				}
			}
			if field != tc.wantField || reason != ReasonRangeInvalid {
				t.Errorf("field %q, reason %q; want %q, %q", field, reason, tc.wantField, ReasonRangeInvalid)
			}
		})
	}
}
