package rpcerr

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

func TestBadRequest(t *testing.T) {
	err := BadRequest("code", "CODE_INVALID", "code \"!\" is not a short code")
	st := status.Convert(err)
	if st.Code() != codes.InvalidArgument || st.Message() != "code \"!\" is not a short code" {
		t.Errorf("status %v %q, want InvalidArgument with the message", st.Code(), st.Message())
	}
	info, br, retry := Details(err)
	if info.GetDomain() != Domain || info.GetReason() != "CODE_INVALID" || info.GetMetadata()["field"] != "code" {
		t.Errorf("ErrorInfo %v, want domain %s, reason CODE_INVALID, field code", info, Domain)
	}
	if v := br.GetFieldViolations(); len(v) != 1 || v[0].GetField() != "code" || v[0].GetReason() != "CODE_INVALID" ||
		v[0].GetDescription() != st.Message() {
		t.Errorf("field violations %v, want one for code with the reason and message", v)
	}
	if retry != nil {
		t.Errorf("RetryInfo %v on a bad request", retry)
	}
}

func TestRetryLater(t *testing.T) {
	tests := map[string]struct {
		after    time.Duration
		wantSecs int64
	}{
		"whole seconds":       {3 * time.Second, 3},
		"rounded up":          {1500 * time.Millisecond, 2},
		"zero is one second":  {0, 1},
		"below one is one":    {time.Millisecond, 1},
		"negative is one too": {-time.Second, 1},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			err := RetryLater(codes.ResourceExhausted, ReasonRateLimited, "too many links", tc.after, map[string]string{"rule": "per-ip"})
			st := status.Convert(err)
			if want := fmt.Sprintf("too many links; retry after %ds", tc.wantSecs); st.Code() != codes.ResourceExhausted || st.Message() != want {
				t.Errorf("status %v %q, want ResourceExhausted %q", st.Code(), st.Message(), want)
			}
			info, br, retry := Details(err)
			if info.GetDomain() != Domain || info.GetReason() != ReasonRateLimited || info.GetMetadata()["rule"] != "per-ip" {
				t.Errorf("ErrorInfo %v, want %s in %s with rule per-ip", info, ReasonRateLimited, Domain)
			}
			if got := retry.GetRetryDelay().AsDuration(); got != time.Duration(tc.wantSecs)*time.Second {
				t.Errorf("RetryInfo delay %v, want %ds", got, tc.wantSecs)
			}
			if br != nil {
				t.Errorf("BadRequest %v on a retry", br)
			}
		})
	}
}

func TestDetailsOfOtherErrors(t *testing.T) {
	for _, err := range []error{nil, errors.New("plain"), status.Error(codes.NotFound, "bare")} {
		if info, br, retry := Details(err); info != nil || br != nil || retry != nil {
			t.Errorf("Details(%v) = %v, %v, %v; want all nil", err, info, br, retry)
		}
	}
}

func TestWithDetails(t *testing.T) {
	err := WithDetails(codes.Unauthenticated, "no tenant", Info(ReasonTenantMissing, nil))
	if st := status.Convert(err); st.Code() != codes.Unauthenticated || st.Message() != "no tenant" {
		t.Errorf("status %v %q, want Unauthenticated \"no tenant\"", st.Code(), st.Message())
	}
	if info, _, _ := Details(err); info.GetReason() != ReasonTenantMissing || info.GetDomain() != Domain {
		t.Errorf("ErrorInfo %v, want %s in %s", info, ReasonTenantMissing, Domain)
	}
}

var (
	errGone  = errors.New("store: gone")
	errDown  = errors.New("store: down at 10.0.0.7")
	errToken = errors.New("store: bad token")
)

var table = []Sentinel{
	{Err: errGone, Code: codes.NotFound, Message: "no such thing"},
	{Err: errDown, Code: codes.Unavailable, Reason: "STORE_UNAVAILABLE", Message: "the store is unavailable", RetryAfter: time.Second},
	{Err: errToken, Code: codes.InvalidArgument, Reason: "TOKEN_INVALID", Field: "page_token", Message: "start again without page_token"},
	{Err: context.DeadlineExceeded, Code: codes.DeadlineExceeded, Reason: "SLOW", Message: "too slow: narrow it"},
}

func TestToStatus(t *testing.T) {
	onPurpose := BadRequest("f", "F_INVALID", "f is wrong")
	tests := map[string]struct {
		err        error
		table      []Sentinel
		wantCode   codes.Code
		wantMsg    string
		wantReason string
		wantLogged bool
	}{
		"nil":                        {nil, table, codes.OK, "", "", false},
		"sentinel":                   {errGone, table, codes.NotFound, "no such thing", "", false},
		"wrapped sentinel":           {fmt.Errorf("get 42: %w", errGone), table, codes.NotFound, "no such thing", "", false},
		"joined sentinel":            {errors.Join(errors.New("other"), errGone), table, codes.NotFound, "no such thing", "", false},
		"retryable sentinel, logged": {fmt.Errorf("query: %w", errDown), table, codes.Unavailable, "the store is unavailable; retry after 1s", "STORE_UNAVAILABLE", true},
		"field sentinel":             {errToken, table, codes.InvalidArgument, "start again without page_token", "TOKEN_INVALID", false},
		"cancelled":                  {fmt.Errorf("query: %w", context.Canceled), table, codes.Canceled, msgCanceled, "", false},
		"deadline":                   {fmt.Errorf("query: %w", context.DeadlineExceeded), nil, codes.DeadlineExceeded, msgDeadline, "", false},
		"deadline reworded by table": {fmt.Errorf("query: %w", context.DeadlineExceeded), table, codes.DeadlineExceeded, "too slow: narrow it", "SLOW", true},
		"wrapped invalid argument":   {fmt.Errorf("create: %w", Invalidf("alias", "ALIAS_INVALID", "alias %q is reserved", "api")), table, codes.InvalidArgument, `alias "api" is reserved`, "ALIAS_INVALID", false},
		"status passes":              {onPurpose, table, codes.InvalidArgument, "f is wrong", "F_INVALID", false},
		"unknown is internal":        {errors.New("pq: relation links does not exist"), table, codes.Internal, msgInternal, "", true},
		"unknown, no table":          {errors.New("boom at 10.0.0.7"), nil, codes.Internal, msgInternal, "", true},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			var logged bytes.Buffer
			log := slog.New(slog.NewTextHandler(&logged, nil))
			got := ToStatus(context.Background(), log, tc.err, tc.table)
			if tc.err == nil {
				if got != nil {
					t.Errorf("ToStatus(nil) = %v, want nil", got)
				}
				return
			}
			st, ok := status.FromError(got)
			if !ok || st.Code() != tc.wantCode || st.Message() != tc.wantMsg {
				t.Errorf("ToStatus = %v, want %v %q", got, tc.wantCode, tc.wantMsg)
			}
			info, _, _ := Details(got)
			if info.GetReason() != tc.wantReason || (tc.wantReason != "" && info.GetDomain() != Domain) {
				t.Errorf("ErrorInfo %v, want reason %q in %s", info, tc.wantReason, Domain)
			}
			if _, br, _ := Details(got); tc.err == errToken &&
				(len(br.GetFieldViolations()) != 1 || br.GetFieldViolations()[0].GetField() != "page_token") {
				t.Errorf("field violations %v, want one for page_token", br.GetFieldViolations())
			}
			if _, br, _ := Details(got); tc.wantReason == "ALIAS_INVALID" &&
				(len(br.GetFieldViolations()) != 1 || br.GetFieldViolations()[0].GetField() != "alias") {
				t.Errorf("field violations %v, want one for alias", br.GetFieldViolations())
			}
			if tc.err == onPurpose && got != onPurpose {
				t.Errorf("a status came back as %v, want it unchanged", got)
			}
			// The real error goes to the log when the answer is a fault of
			// the server, and never to the client unless it was a status.
			if l := logged.String(); strings.Contains(l, tc.err.Error()) != tc.wantLogged {
				t.Errorf("log %q: holds the error %v, want %v", l, !tc.wantLogged, tc.wantLogged)
			}
			if _, isStatus := status.FromError(tc.err); !isStatus && strings.Contains(st.Message(), tc.err.Error()) {
				t.Errorf("message %q leaks the error %q", st.Message(), tc.err)
			}
		})
	}
}
