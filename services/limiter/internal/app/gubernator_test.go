package app

import (
	"context"
	"net/http"
	"strings"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	gubernatorpb "kurz.dev/gen/pb/gubernator"
)

// A gubernator request of one hit of a limit of 10 a second.
func gubernatorOne(key string) *gubernatorpb.GetRateLimitsReq {
	return &gubernatorpb.GetRateLimitsReq{Requests: []*gubernatorpb.RateLimitReq{{Name: "test", UniqueKey: key, Hits: 1, Limit: 10, Duration: 1000}}}
}

// Off by default: neither the gRPC service nor the HTTP gateway is there
// unless asked for, since anyone reaching the port could set limits.
func TestGubernatorIsOffByDefault(t *testing.T) {
	r := startNoRedis(t, nil)
	_, err := gubernatorpb.NewV1Client(r.Conn).GetRateLimits(context.Background(), gubernatorOne("k"))
	if status.Code(err) != codes.Unimplemented {
		t.Errorf("GetRateLimits: %v, want UNIMPLEMENTED", err)
	}
	if code, body := post(t, r.HTTP+"/v1/GetRateLimits", "application/json", `{"requests": []}`); code != http.StatusNotFound {
		t.Errorf("POST /v1/GetRateLimits: %d %q, want 404", code, body)
	}
}

// With Redis unreachable the gubernator API's limits answer by
// KURZ_LIMITER_GUBERNATOR_FAILURE_MODE: open by default, closed when
// asked, and the response's metadata says so.
func TestGubernatorFollowsItsFailureMode(t *testing.T) {
	for _, tc := range []struct {
		mode   string
		status gubernatorpb.Status
		source string
	}{
		{"", gubernatorpb.Status_UNDER_LIMIT, "fail_open"},
		{"closed", gubernatorpb.Status_OVER_LIMIT, "fail_closed"},
	} {
		env := map[string]string{"KURZ_LIMITER_GUBERNATOR": "true"}
		if tc.mode != "" {
			env["KURZ_LIMITER_GUBERNATOR_FAILURE_MODE"] = tc.mode
		}
		r := startNoRedis(t, env)
		resp, err := gubernatorpb.NewV1Client(r.Conn).GetRateLimits(context.Background(), gubernatorOne("k"))
		if err != nil {
			t.Fatal(err)
		}
		got := resp.GetResponses()[0]
		if got.GetStatus() != tc.status || got.GetMetadata()["source"] != tc.source || got.GetError() != "" {
			t.Errorf("mode %q: %v, want %v from %s", tc.mode, got, tc.status, tc.source)
		}
	}
}

func TestGubernatorFailureModeIsValidated(t *testing.T) {
	err := load(t, map[string]string{"KURZ_LIMITER_GUBERNATOR_FAILURE_MODE": "deny"}).validate()
	if err == nil || !strings.Contains(err.Error(), "KURZ_LIMITER_GUBERNATOR_FAILURE_MODE") {
		t.Errorf("got %v, want an error naming KURZ_LIMITER_GUBERNATOR_FAILURE_MODE", err)
	}
}

// KURZ_LIMITER_GUBERNATOR_MAX_DURATION reaches the API: a week's duration,
// refused by the default day, is decided under a bound of 8 days; a bound
// past 400 days or under a millisecond does not start.
func TestGubernatorMaxDurationIsConfigured(t *testing.T) {
	week := &gubernatorpb.GetRateLimitsReq{Requests: []*gubernatorpb.RateLimitReq{{Name: "test", UniqueKey: "k", Hits: 1, Limit: 10, Duration: 7 * 24 * 3600 * 1000}}}
	for bound, want := range map[string]string{"": "KURZ_LIMITER_GUBERNATOR_MAX_DURATION", "192h": ""} {
		env := map[string]string{"KURZ_LIMITER_GUBERNATOR": "true"}
		if bound != "" {
			env["KURZ_LIMITER_GUBERNATOR_MAX_DURATION"] = bound
		}
		r := startNoRedis(t, env)
		resp, err := gubernatorpb.NewV1Client(r.Conn).GetRateLimits(context.Background(), week)
		if err != nil {
			t.Fatal(err)
		}
		if got := resp.GetResponses()[0].GetError(); (want == "") != (got == "") || !strings.Contains(got, want) {
			t.Errorf("bound %q: a week's duration answered error %q, want %q", bound, got, want)
		}
	}
	for _, bad := range []string{"9700h", "500us", "0s"} {
		err := load(t, map[string]string{"KURZ_LIMITER_GUBERNATOR_MAX_DURATION": bad}).validate()
		if err == nil || !strings.Contains(err.Error(), "KURZ_LIMITER_GUBERNATOR_MAX_DURATION") {
			t.Errorf("%s: got %v, want an error naming KURZ_LIMITER_GUBERNATOR_MAX_DURATION", bad, err)
		}
	}
}
