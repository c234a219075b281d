//go:build integration

package app

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"google.golang.org/protobuf/encoding/protojson"

	gubernatorpb "kurz.dev/gen/pb/gubernator"
	"kurz.dev/pkg/testkit/servertest"
)

// startGubernator boots a limiter with the gubernator API on, on the real
// Redis Cluster, and returns it with a gRPC client of that API (gubernator's
// wire format: the same package, service and field numbers).
func startGubernator(t *testing.T) (*servertest.Running, gubernatorpb.V1Client) {
	t.Helper()
	r := startWith(t, map[string]string{
		"KURZ_LIMITER_RULES_SOURCE": "file",
		"KURZ_LIMITER_RULES_FILE":   rulesFile(t),
		"KURZ_LIMITER_GUBERNATOR":   "true",
	})
	return r, gubernatorpb.NewV1Client(r.Conn)
}

// day is a duration over which refill is negligible within a test: one
// unit of a limit of 100 every 864 s.
const day = int64(24 * time.Hour / time.Millisecond)

func guberCheck(t *testing.T, c gubernatorpb.V1Client, reqs ...*gubernatorpb.RateLimitReq) []*gubernatorpb.RateLimitResp {
	t.Helper()
	resp, err := c.GetRateLimits(context.Background(), &gubernatorpb.GetRateLimitsReq{Requests: reqs})
	if err != nil {
		t.Fatal(err)
	}
	if len(resp.GetResponses()) != len(reqs) {
		t.Fatalf("%d responses to %d requests", len(resp.GetResponses()), len(reqs))
	}
	return resp.GetResponses()
}

// A limit of 100: exactly 100 hits UNDER_LIMIT, each with one fewer left,
// then OVER_LIMIT, taking nothing; reset_time is when the bucket would be
// full again, within the duration.
func TestGubernatorTokenBucketAdmitsExactlyTheLimit(t *testing.T) {
	r, c := startGubernator(t)
	req := &gubernatorpb.RateLimitReq{Name: "requests_per_day", UniqueKey: unique(t), Hits: 1, Limit: 100, Duration: day}
	for i := range 100 {
		before := time.Now()
		got := guberCheck(t, c, req)[0]
		if got.GetStatus() != gubernatorpb.Status_UNDER_LIMIT || got.GetRemaining() != int64(99-i) || got.GetLimit() != 100 || got.GetError() != "" {
			t.Fatalf("hit %d: %v, want UNDER_LIMIT with %d left", i+1, got, 99-i)
		}
		// Back to full after (i+1) units at 100 a day: (i+1) × 864 s.
		full := before.Add(time.Duration(i+1) * 864 * time.Second)
		if rt := time.UnixMilli(got.GetResetTime()); rt.Before(full.Add(-time.Second)) || rt.After(time.Now().Add(time.Duration(i+1)*864*time.Second+time.Second)) {
			t.Fatalf("hit %d: reset_time %v, want about %v", i+1, rt, full)
		}
	}
	for range 2 {
		got := guberCheck(t, c, req)[0]
		if got.GetStatus() != gubernatorpb.Status_OVER_LIMIT || got.GetRemaining() != 0 || got.GetMetadata()["retry_after_ms"] == "" {
			t.Fatalf("hit 101: %v, want OVER_LIMIT with 0 left and a retry_after_ms", got)
		}
	}

	// hits 0 reads without taking.
	peek := &gubernatorpb.RateLimitReq{Name: req.Name, UniqueKey: req.UniqueKey, Limit: 100, Duration: day}
	if got := guberCheck(t, c, peek)[0]; got.GetStatus() != gubernatorpb.Status_UNDER_LIMIT || got.GetRemaining() != 0 {
		t.Errorf("hits 0: %v, want UNDER_LIMIT with 0 left", got)
	}
	// RESET_REMAINING starts the limit afresh (the over-limit cache too).
	reset := &gubernatorpb.RateLimitReq{Name: req.Name, UniqueKey: req.UniqueKey, Hits: 1, Limit: 100, Duration: day, Behavior: gubernatorpb.Behavior_RESET_REMAINING}
	if got := guberCheck(t, c, reset)[0]; got.GetStatus() != gubernatorpb.Status_UNDER_LIMIT || got.GetRemaining() != 99 {
		t.Errorf("RESET_REMAINING: %v, want UNDER_LIMIT with 99 left", got)
	}

	var metrics string
	ok, _ := servertest.EventuallyState(5*time.Second, func() (bool, string) {
		_, metrics = r.Get(t, "/metrics")
		return servertest.HasSeries(metrics, "kurz_ratelimit_decisions_total", `domain="gubernator"`, `rule="token_bucket"`, `outcome="denied"`), ""
	})
	if !ok {
		t.Error("/metrics has no kurz_ratelimit_decisions_total series of gubernator/token_bucket, outcome denied")
	}
	if strings.Contains(metrics, "requests_per_day") {
		t.Error("/metrics names a client's limit")
	}
}

// One call of 150 hits of one limit of 100, decided concurrently: exactly
// 100 pass, where gubernator's GLOBAL mode over-admits.
func TestGubernatorBatchIsExact(t *testing.T) {
	_, c := startGubernator(t)
	key := unique(t)
	reqs := make([]*gubernatorpb.RateLimitReq, 150)
	for i := range reqs {
		reqs[i] = &gubernatorpb.RateLimitReq{Name: "batch", UniqueKey: key, Hits: 1, Limit: 100, Duration: day, Behavior: gubernatorpb.Behavior_GLOBAL}
	}
	under := 0
	for _, got := range guberCheck(t, c, reqs...) {
		if got.GetStatus() == gubernatorpb.Status_UNDER_LIMIT {
			under++
		}
	}
	if under != 100 {
		t.Errorf("%d of 150 UNDER_LIMIT, want exactly 100", under)
	}
}

// LEAKY_BUCKET with a burst of 5: 5 pass, the 6th is over the limit.
func TestGubernatorLeakyBucket(t *testing.T) {
	_, c := startGubernator(t)
	req := &gubernatorpb.RateLimitReq{Name: "leaky", UniqueKey: unique(t), Hits: 1, Limit: 10, Duration: day, Algorithm: gubernatorpb.Algorithm_LEAKY_BUCKET, Burst: 5}
	for i := range 5 {
		if got := guberCheck(t, c, req)[0]; got.GetStatus() != gubernatorpb.Status_UNDER_LIMIT || got.GetRemaining() != int64(4-i) {
			t.Fatalf("hit %d: %v, want UNDER_LIMIT with %d left", i+1, got, 4-i)
		}
	}
	if got := guberCheck(t, c, req)[0]; got.GetStatus() != gubernatorpb.Status_OVER_LIMIT {
		t.Errorf("hit 6: %v, want OVER_LIMIT", got)
	}
}

// gubernator keys ("a_b", "c") and ("a", "b_c") as one limit; kurz keeps
// them apart. An invalid request of the batch has its own error.
func TestGubernatorLimitsAreTheirsAndErrorsPerRequest(t *testing.T) {
	_, c := startGubernator(t)
	u := unique(t)
	one := func(name, key string) *gubernatorpb.RateLimitReq {
		return &gubernatorpb.RateLimitReq{Name: name, UniqueKey: key, Hits: 1, Limit: 1, Duration: day}
	}
	got := guberCheck(t, c, one(u+"_b", "c"), one(u, "b_c"), one(u, ""),
		&gubernatorpb.RateLimitReq{Name: u, UniqueKey: "g", Hits: 1, Limit: 1, Duration: day, Behavior: gubernatorpb.Behavior_DURATION_IS_GREGORIAN})
	if got[0].GetStatus() != gubernatorpb.Status_UNDER_LIMIT || got[1].GetStatus() != gubernatorpb.Status_UNDER_LIMIT {
		t.Errorf("(%s_b, c) %v and (%s, b_c) %v: want both UNDER_LIMIT, each its own limit of 1", u, got[0], u, got[1])
	}
	if got[2].GetError() != "field 'unique_key' cannot be empty" || !strings.Contains(got[3].GetError(), "DURATION_IS_GREGORIAN is not supported") {
		t.Errorf("errors %q, %q; want the empty key's and the Gregorian duration's", got[2].GetError(), got[3].GetError())
	}
}

// The HTTP gateway: gubernator's JSON in and out, the limit exact, over
// 1,000 requests refused, HealthCheck healthy.
func TestGubernatorHTTPGatewayOnRedis(t *testing.T) {
	r, _ := startGubernator(t)
	body := fmt.Sprintf(`{"requests": [{"name": "http", "unique_key": %q, "hits": 1, "limit": 3, "duration": %d}]}`, unique(t), day)
	for i := range 4 {
		code, out := post(t, r.HTTP+"/v1/GetRateLimits", "application/json", body)
		out = compactJSON(out)
		var resp gubernatorpb.GetRateLimitsResp
		if err := protojson.Unmarshal([]byte(out), &resp); err != nil || code != http.StatusOK || len(resp.GetResponses()) != 1 {
			t.Fatalf("hit %d: %d %s (%v), want 200 with one response", i+1, code, out, err)
		}
		want := gubernatorpb.Status_UNDER_LIMIT
		if i == 3 {
			want = gubernatorpb.Status_OVER_LIMIT
		}
		if got := resp.GetResponses()[0]; got.GetStatus() != want || !strings.Contains(out, `"reset_time":"`) {
			t.Errorf("hit %d: %s, want %v with gubernator's field names", i+1, out, want)
		}
	}
	many := `{"requests": [` + strings.TrimSuffix(strings.Repeat(`{"name":"n","unique_key":"k","hits":1,"limit":1,"duration":1},`, 1001), ",") + `]}`
	if code, out := post(t, r.HTTP+"/v1/GetRateLimits", "application/json", many); code != http.StatusBadRequest || !strings.Contains(compactJSON(out), `"code":11`) {
		t.Errorf("1,001 requests: %d %s, want 400 OUT_OF_RANGE", code, out)
	}
	if code, out := r.Get(t, "/v1/HealthCheck"); code != http.StatusOK || !strings.Contains(compactJSON(out), `"status":"healthy"`) {
		t.Errorf("GET /v1/HealthCheck: %d %s, want 200 healthy", code, out)
	}
}

// compactJSON is body without the spaces protojson puts at random between
// tokens, when it is JSON; else body as it is.
func compactJSON(body string) string {
	var buf bytes.Buffer
	if json.Compact(&buf, []byte(body)) != nil {
		return body
	}
	return buf.String()
}

// readmeGubernatorRequest is the body of the README's curl example of POST
// /v1/GetRateLimits ("Coming from gubernator"), word for word.
const readmeGubernatorRequest = `{"requests": [{"name": "requests_per_sec", "unique_key": "account:12345", "hits": 1, "limit": 10, "duration": 1000}]}`

// readmeGubernatorAnswer is the README's answer to it, reset_time aside.
var readmeGubernatorAnswer = []string{`{"responses":[{"status":"UNDER_LIMIT","limit":"10","remaining":"9","reset_time":"`, `","error":"","metadata":{"source":"redis"}}]}`}

// The README's example, on the real Redis Cluster, answers what the README
// shows: UNDER_LIMIT, 9 of 10 left, reset_time 100 ms on. The key is the
// test's own, so that no earlier call has spent any.
func TestGubernatorReadmeExample(t *testing.T) {
	readme, err := os.ReadFile(filepath.Join("..", "..", "README.md"))
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(readme), "-d '"+readmeGubernatorRequest+"'") {
		t.Fatalf("services/limiter/README.md has no curl example sending %s", readmeGubernatorRequest)
	}
	if !strings.Contains(string(readme), readmeGubernatorAnswer[0]) || !strings.Contains(string(readme), readmeGubernatorAnswer[1]) {
		t.Fatalf("services/limiter/README.md does not answer it with %s…%s", readmeGubernatorAnswer[0], readmeGubernatorAnswer[1])
	}
	r, _ := startGubernator(t)
	before := time.Now()
	code, out := post(t, r.HTTP+"/v1/GetRateLimits", "application/json", strings.Replace(readmeGubernatorRequest, "account:12345", unique(t), 1))
	out = compactJSON(out)
	t.Logf("%d %s", code, out)
	head, tail, ok := strings.Cut(out, readmeGubernatorAnswer[0])
	if code != http.StatusOK || !ok || head != "" {
		t.Fatalf("%d %s, want 200 %s…", code, out, readmeGubernatorAnswer[0])
	}
	ms, rest, _ := strings.Cut(tail, `"`)
	if `"`+rest != readmeGubernatorAnswer[1] {
		t.Errorf("answer ends %s, want %s", rest, readmeGubernatorAnswer[1])
	}
	reset, err := strconv.ParseInt(ms, 10, 64)
	if err != nil || reset < before.Add(100*time.Millisecond).UnixMilli()-1 || reset > time.Now().Add(100*time.Millisecond).UnixMilli()+1 {
		t.Errorf("reset_time %s, want 100 ms after the request", ms)
	}
}
