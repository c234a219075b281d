package quotaapi

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"

	ratelimitv1 "kurz.dev/gen/kurz/ratelimit/v1"
	gubernatorpb "kurz.dev/gen/pb/gubernator"
	"kurz.dev/services/limiter/internal/ratelimit"
)

// fakeGuberEngine records what the gubernator API asks of the engine and
// answers every check with answer.
type fakeGuberEngine struct {
	mu       sync.Mutex
	calls    []string // "reset KEY", "check KEY"
	rules    []*ratelimit.Rule
	costs    []int64
	answer   *ratelimitv1.CheckQuotaResponse
	resetErr error
}

func (f *fakeGuberEngine) CheckRule(_ context.Context, r *ratelimit.Rule, key string, cost int64) *ratelimitv1.CheckQuotaResponse {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.calls = append(f.calls, "check "+key)
	f.rules = append(f.rules, r)
	f.costs = append(f.costs, cost)
	return f.answer
}

func (f *fakeGuberEngine) ResetRule(_ context.Context, key string) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.calls = append(f.calls, "reset "+key)
	return f.resetErr
}

func guberReq(name, key string, hits, limit, durationMs int64) *gubernatorpb.RateLimitReq {
	return &gubernatorpb.RateLimitReq{Name: name, UniqueKey: key, Hits: hits, Limit: limit, Duration: durationMs}
}

func TestGubernatorRuleMapsEachAlgorithm(t *testing.T) {
	open := ratelimitv1.FailureMode_FAILURE_MODE_OPEN
	for name, tc := range map[string]struct {
		req  *gubernatorpb.RateLimitReq
		want ratelimit.Rule
	}{
		"token bucket: limit per duration, burst ignored": {
			&gubernatorpb.RateLimitReq{Name: "n", UniqueKey: "k", Hits: 1, Limit: 100, Duration: 60_000, Burst: 500},
			ratelimit.Rule{Domain: "gubernator", Name: "token_bucket", Key: []string{"unique_key"}, Algorithm: ratelimitv1.Algorithm_ALGORITHM_TOKEN_BUCKET, Limit: 100, Window: time.Minute, FailureMode: open},
		},
		"leaky bucket: burst is its capacity": {
			&gubernatorpb.RateLimitReq{Name: "n", UniqueKey: "k", Hits: 1, Limit: 10, Duration: 1000, Algorithm: gubernatorpb.Algorithm_LEAKY_BUCKET, Burst: 5},
			ratelimit.Rule{Domain: "gubernator", Name: "leaky_bucket", Key: []string{"unique_key"}, Algorithm: ratelimitv1.Algorithm_ALGORITHM_LEAKY_BUCKET, Limit: 10, Window: time.Second, Burst: 5, FailureMode: open},
		},
		"meaningless behaviours accepted": {
			&gubernatorpb.RateLimitReq{Name: "n", UniqueKey: "k", Limit: 1, Duration: 1, Behavior: gubernatorpb.Behavior_GLOBAL | gubernatorpb.Behavior_NO_BATCHING | gubernatorpb.Behavior_MULTI_REGION | gubernatorpb.Behavior_RESET_REMAINING},
			ratelimit.Rule{Domain: "gubernator", Name: "token_bucket", Key: []string{"unique_key"}, Algorithm: ratelimitv1.Algorithm_ALGORITHM_TOKEN_BUCKET, Limit: 1, Window: time.Millisecond, FailureMode: open},
		},
	} {
		t.Run(name, func(t *testing.T) {
			got, err := GubernatorRule(tc.req, open)
			if err != nil {
				t.Fatal(err)
			}
			if got.Domain != tc.want.Domain || got.Name != tc.want.Name || strings.Join(got.Key, ",") != strings.Join(tc.want.Key, ",") ||
				got.Algorithm != tc.want.Algorithm || got.Limit != tc.want.Limit || got.Window != tc.want.Window || got.Burst != tc.want.Burst || got.FailureMode != tc.want.FailureMode {
				t.Errorf("got %+v, want %+v", *got, tc.want)
			}
		})
	}
}

func TestGubernatorRuleRefusesWhatKurzCannotDecide(t *testing.T) {
	long := strings.Repeat("x", 1025)
	for name, tc := range map[string]struct {
		req  *gubernatorpb.RateLimitReq
		want string
	}{
		"no name":        {guberReq("", "k", 1, 1, 1000), "field 'name' cannot be empty"},
		"no unique_key":  {guberReq("n", "", 1, 1, 1000), "field 'unique_key' cannot be empty"},
		"long name":      {guberReq(long[:257], "k", 1, 1, 1000), "name of 257 bytes: at most 256"},
		"long key":       {guberReq("n", long, 1, 1, 1000), "unique_key of 1025 bytes: at most 1024"},
		"negative hits":  {guberReq("n", "k", -1, 1, 1000), "hits -1: want 0"},
		"too many hits":  {guberReq("n", "k", 1_000_001, 1, 1000), "hits 1000001: want 0"},
		"no limit":       {guberReq("n", "k", 1, 0, 1000), "limit 0: want 1 to"},
		"huge limit":     {guberReq("n", "k", 1, 1<<41, 1000), "limit 2199023255552: want 1 to"},
		"no duration":    {guberReq("n", "k", 1, 1, 0), "duration 0 ms: want 1 to"},
		"long duration":  {guberReq("n", "k", 1, 1, 401*24*3600*1000), "duration 34646400000 ms: want 1 to 34560000000"},
		"negative burst": {&gubernatorpb.RateLimitReq{Name: "n", UniqueKey: "k", Limit: 1, Duration: 1, Burst: -1}, "burst -1"},
		"gregorian":      {&gubernatorpb.RateLimitReq{Name: "n", UniqueKey: "k", Limit: 1, Duration: 1, Behavior: gubernatorpb.Behavior_DURATION_IS_GREGORIAN}, "DURATION_IS_GREGORIAN is not supported"},
		"drain":          {&gubernatorpb.RateLimitReq{Name: "n", UniqueKey: "k", Limit: 1, Duration: 1, Behavior: gubernatorpb.Behavior_DRAIN_OVER_LIMIT}, "DRAIN_OVER_LIMIT is not supported"},
		"unknown flag":   {&gubernatorpb.RateLimitReq{Name: "n", UniqueKey: "k", Limit: 1, Duration: 1, Behavior: 66}, "behavior 66: unknown flags 64"},
		"unknown algo":   {&gubernatorpb.RateLimitReq{Name: "n", UniqueKey: "k", Limit: 1, Duration: 1, Algorithm: 2}, "algorithm 2: want TOKEN_BUCKET (0) or LEAKY_BUCKET (1)"},
		"slow drain": {
			&gubernatorpb.RateLimitReq{Name: "n", UniqueKey: "k", Limit: 1, Duration: 24 * 3600 * 1000, Algorithm: gubernatorpb.Algorithm_LEAKY_BUCKET, Burst: 1000},
			"limit 1 per 86400000 ms, burst 1000: rule gubernator/leaky_bucket: burst 1000 refills in",
		},
	} {
		t.Run(name, func(t *testing.T) {
			_, err := GubernatorRule(tc.req, ratelimitv1.FailureMode_FAILURE_MODE_OPEN)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("err %v, want one saying %q", err, tc.want)
			}
		})
	}
}

// gubernator joins name and unique_key with "_"; kurz's keys keep them
// apart, and outside the rules' "rl:" keys.
func TestGubernatorKeysNeverCollide(t *testing.T) {
	pairs := [][2]string{{"a_b", "c"}, {"a", "b_c"}, {"a:b", "c"}, {"a", "b:c"}, {"a}", "{c"}, {"a", "%3Ac"}, {"a:", "c"}}
	seen := map[string][2]string{}
	for _, p := range pairs {
		k := GubernatorKey(p[0], p[1])
		if q, dup := seen[k]; dup {
			t.Errorf("%q and %q share key %q", p, q, k)
		}
		seen[k] = p
		if !strings.HasPrefix(k, "gb:{") || !strings.HasSuffix(k, "}") || strings.Count(k, "{") != 1 || strings.Count(k, "}") != 1 {
			t.Errorf("key %q: want gb:{...} with one hash tag", k)
		}
	}
}

func TestGetRateLimitsRefusesOverAThousand(t *testing.T) {
	f := &fakeGuberEngine{answer: &ratelimitv1.CheckQuotaResponse{Allowed: true}}
	s := NewGubernator(f, ratelimitv1.FailureMode_FAILURE_MODE_OPEN, func() bool { return true })
	reqs := make([]*gubernatorpb.RateLimitReq, 1001)
	for i := range reqs {
		reqs[i] = guberReq("n", "k", 1, 10, 1000)
	}
	_, err := s.GetRateLimits(context.Background(), &gubernatorpb.GetRateLimitsReq{Requests: reqs})
	if got := status.Code(err); got != codes.OutOfRange || !strings.Contains(err.Error(), "1001 requests: at most 1000") {
		t.Errorf("1,001 requests: %v, want OUT_OF_RANGE naming the bound", err)
	}
	if len(f.calls) != 0 {
		t.Errorf("the engine was asked %d times, want none", len(f.calls))
	}
	resp, err := s.GetRateLimits(context.Background(), &gubernatorpb.GetRateLimitsReq{Requests: reqs[:1000]})
	if err != nil || len(resp.GetResponses()) != 1000 || len(f.calls) != 1000 {
		t.Errorf("1,000 requests: %d responses, %d checks, %v; want 1,000 of each", len(resp.GetResponses()), len(f.calls), err)
	}
}

// An invalid request has its error in its own response; the others of the
// batch are decided, in order.
func TestGetRateLimitsAnswersErrorsPerRequest(t *testing.T) {
	f := &fakeGuberEngine{answer: &ratelimitv1.CheckQuotaResponse{
		Allowed: false, Remaining: 0, ResetAfter: durationpb.New(30 * time.Second), RetryAfter: durationpb.New(600 * time.Millisecond),
		Source: ratelimitv1.DecisionSource_DECISION_SOURCE_REDIS,
	}}
	s := NewGubernator(f, ratelimitv1.FailureMode_FAILURE_MODE_OPEN, func() bool { return true })
	at := time.UnixMilli(1_800_000_000_000)
	s.now = func() time.Time { return at }
	resp, err := s.GetRateLimits(context.Background(), &gubernatorpb.GetRateLimitsReq{Requests: []*gubernatorpb.RateLimitReq{
		guberReq("n", "", 1, 10, 1000),
		guberReq("n", "k", 3, 50, 60_000),
	}})
	if err != nil {
		t.Fatal(err)
	}
	got := resp.GetResponses()
	if len(got) != 2 || got[0].GetError() != "field 'unique_key' cannot be empty" || got[1].GetError() != "" {
		t.Fatalf("responses %v, want the first refused, the second decided", got)
	}
	d := got[1]
	if d.GetStatus() != gubernatorpb.Status_OVER_LIMIT || d.GetLimit() != 50 || d.GetRemaining() != 0 ||
		d.GetResetTime() != at.Add(30*time.Second).UnixMilli() || d.GetMetadata()["retry_after_ms"] != "600" || d.GetMetadata()["source"] != "redis" {
		t.Errorf("decision %v, want OVER_LIMIT, limit 50, reset in 30 s, retry after 600 ms, from redis", d)
	}
	if len(f.costs) != 1 || f.costs[0] != 3 || f.calls[0] != "check "+GubernatorKey("n", "k") {
		t.Errorf("engine asked %v at costs %v, want one check of 3 at n/k's key", f.calls, f.costs)
	}
}

func TestGetRateLimitsResetsBeforeDeciding(t *testing.T) {
	req := &gubernatorpb.RateLimitReq{Name: "n", UniqueKey: "k", Hits: 1, Limit: 10, Duration: 1000, Behavior: gubernatorpb.Behavior_RESET_REMAINING}
	f := &fakeGuberEngine{answer: &ratelimitv1.CheckQuotaResponse{Allowed: true, Remaining: 9}}
	s := NewGubernator(f, ratelimitv1.FailureMode_FAILURE_MODE_OPEN, func() bool { return true })
	resp, err := s.GetRateLimits(context.Background(), &gubernatorpb.GetRateLimitsReq{Requests: []*gubernatorpb.RateLimitReq{req}})
	key := GubernatorKey("n", "k")
	if err != nil || strings.Join(f.calls, ",") != "reset "+key+",check "+key || resp.GetResponses()[0].GetRemaining() != 9 {
		t.Errorf("calls %v, %v %v; want a reset then a check", f.calls, resp, err)
	}

	f = &fakeGuberEngine{resetErr: errors.New("redis del: timeout")}
	s = NewGubernator(f, ratelimitv1.FailureMode_FAILURE_MODE_OPEN, func() bool { return true })
	resp, _ = s.GetRateLimits(context.Background(), &gubernatorpb.GetRateLimitsReq{Requests: []*gubernatorpb.RateLimitReq{req}})
	if e := resp.GetResponses()[0].GetError(); !strings.Contains(e, "RESET_REMAINING") || strings.Contains(e, "timeout") || len(f.calls) != 1 {
		t.Errorf("a failed reset: error %q after %v, want RESET_REMAINING's error without the internal cause, nothing decided", e, f.calls)
	}
}

func TestGubernatorHealthCheck(t *testing.T) {
	ready := false
	s := NewGubernator(&fakeGuberEngine{}, ratelimitv1.FailureMode_FAILURE_MODE_OPEN, func() bool { return ready })
	h := gubernatorMux(s)
	for _, tc := range []struct {
		ready bool
		want  string
	}{{false, `"status":"unhealthy"`}, {true, `"status":"healthy"`}} {
		ready = tc.ready
		resp, err := s.HealthCheck(context.Background(), &gubernatorpb.HealthCheckReq{})
		if err != nil || !strings.Contains(tc.want, resp.GetStatus()) {
			t.Errorf("ready %v: %v %v, want %s", tc.ready, resp, err, tc.want)
		}
		code, body := httpDo(h, http.MethodGet, "/v1/HealthCheck", "", "")
		if code != http.StatusOK || !strings.Contains(body, tc.want) || !strings.Contains(body, `"peer_count":1`) {
			t.Errorf("ready %v: GET /v1/HealthCheck %d %s, want 200 with %s", tc.ready, code, body, tc.want)
		}
	}
}

func gubernatorMux(s *GubernatorService) *http.ServeMux {
	mux := http.NewServeMux()
	NewGubernatorHTTP(s, 64<<10, NewInFlight(4), time.Second, slog.New(slog.DiscardHandler)).Register(mux)
	return mux
}

// httpDo serves one request through mux and returns its status and its
// body, compacted.
func httpDo(mux http.Handler, method, path, ct, body string) (int, string) {
	req := httptest.NewRequest(method, path, strings.NewReader(body))
	if ct != "" {
		req.Header.Set("Content-Type", ct)
	}
	w := httptest.NewRecorder()
	mux.ServeHTTP(w, req)
	return w.Code, compactJSON(w.Body.Bytes())
}

// compactJSON is body without the spaces protojson puts at random between
// tokens (so that no one compares its output byte for byte), when it is
// JSON; else body as it is.
func compactJSON(body []byte) string {
	var buf bytes.Buffer
	if json.Compact(&buf, body) != nil {
		return string(body)
	}
	return buf.String()
}

// The gateway reads and writes gubernator's JSON (proto names, int64s as
// strings, every field), and refuses what POST /json refuses.
func TestGubernatorHTTPGateway(t *testing.T) {
	f := &fakeGuberEngine{answer: &ratelimitv1.CheckQuotaResponse{Allowed: true, Remaining: 99, ResetAfter: durationpb.New(600 * time.Millisecond)}}
	s := NewGubernator(f, ratelimitv1.FailureMode_FAILURE_MODE_OPEN, func() bool { return true })
	h := gubernatorMux(s)
	many := `{"requests": [` + strings.TrimSuffix(strings.Repeat(`{"name":"n","unique_key":"k","hits":1,"limit":1,"duration":1},`, 1001), ",") + `]}`
	for name, tc := range map[string]struct {
		method, ct, body string
		code             int
		want             []string
	}{
		"decided": {http.MethodPost, "application/json", `{"requests": [{"name": "n", "unique_key": "k", "hits": "1", "limit": 100, "duration": 60000, "unknown": 1}]}`, 200,
			[]string{`"status":"UNDER_LIMIT"`, `"limit":"100"`, `"remaining":"99"`, `"reset_time":"`, `"error":""`, `"source":"unspecified"`}},
		"refused per request": {http.MethodPost, "application/json", `{"requests": [{"name": "n", "limit": 1, "duration": 1}]}`, 200,
			[]string{`"error":"field 'unique_key' cannot be empty"`}},
		"over a thousand": {http.MethodPost, "application/json", many, 400, []string{`"code":11`, `1001 requests: at most 1000`}},
		"not JSON":        {http.MethodPost, "application/json", `{"requests": 1}`, 400, []string{`"code":3`, `invalid GetRateLimitsReq JSON`}},
		"a form":          {http.MethodPost, "application/x-www-form-urlencoded", `{}`, 415, []string{`Content-Type must be application/json`}},
		"GET":             {http.MethodGet, "", "", 405, []string{`POST a GetRateLimitsReq as JSON`}},
		"too large":       {http.MethodPost, "application/json", `{"requests": [{"name": "` + strings.Repeat("n", 64<<10) + `"}]}`, 413, []string{"request body over 65536 bytes"}},
	} {
		t.Run(name, func(t *testing.T) {
			code, body := httpDo(h, tc.method, "/v1/GetRateLimits", tc.ct, tc.body)
			if code != tc.code {
				t.Errorf("%d %s, want %d", code, body, tc.code)
			}
			for _, w := range tc.want {
				if !strings.Contains(body, w) {
					t.Errorf("body %s lacks %s", body, w)
				}
			}
		})
	}
}

// blockingGuberEngine holds every check until release is closed, telling
// entered of each, so a test sees how many decisions are in flight.
type blockingGuberEngine struct {
	fakeGuberEngine
	entered chan struct{}
	release chan struct{}
}

func (b *blockingGuberEngine) CheckRule(ctx context.Context, r *ratelimit.Rule, key string, cost int64) *ratelimitv1.CheckQuotaResponse {
	resp := b.fakeGuberEngine.CheckRule(ctx, r, key, cost)
	b.entered <- struct{}{}
	<-b.release
	return resp
}

// The bound on decisions in flight is the server's, not each call's: a
// thousand concurrent calls of 1,000 requests must not put a thousand
// times the bound on Redis. A call that waits for room past its deadline
// answers its requests' errors instead of deciding them.
func TestGetRateLimitsBoundsDecisionsAcrossCalls(t *testing.T) {
	f := &blockingGuberEngine{
		fakeGuberEngine: fakeGuberEngine{answer: &ratelimitv1.CheckQuotaResponse{Allowed: true}},
		entered:         make(chan struct{}, 10), release: make(chan struct{}),
	}
	s := NewGubernator(f, ratelimitv1.FailureMode_FAILURE_MODE_OPEN, func() bool { return true })
	s.deciding = make(chan struct{}, 2)
	first := make(chan *gubernatorpb.GetRateLimitsResp, 1)
	go func() {
		resp, _ := s.GetRateLimits(context.Background(), &gubernatorpb.GetRateLimitsReq{Requests: []*gubernatorpb.RateLimitReq{
			guberReq("n", "a", 1, 10, 1000), guberReq("n", "b", 1, 10, 1000),
		}})
		first <- resp
	}()
	<-f.entered
	<-f.entered // the server's two slots are taken
	ctx, cancel := context.WithCancel(context.Background())
	second := make(chan *gubernatorpb.GetRateLimitsResp, 1)
	go func() {
		resp, _ := s.GetRateLimits(ctx, &gubernatorpb.GetRateLimitsReq{Requests: []*gubernatorpb.RateLimitReq{guberReq("n", "c", 1, 10, 1000)}})
		second <- resp
	}()
	cancel()
	close(f.release)
	got := (<-second).GetResponses()
	<-first
	if len(got) != 1 || !strings.Contains(got[0].GetError(), "not decided") {
		t.Errorf("second call's answer %v, want its request's error: the server's slots were all taken until its context ended", got)
	}
	if len(f.calls) != 2 {
		t.Errorf("the engine decided %d requests (%v), want the first call's 2: at most 2 in flight across calls", len(f.calls), f.calls)
	}
}

// A limit's state lasts in Redis as long as its bucket takes to refill
// (or drain): GubernatorMaxDuration bounds it, so keys a stranger makes
// do not outlive a day by default (gubernator's cache is an LRU).
func TestGetRateLimitsBoundsStateLifetime(t *testing.T) {
	f := &fakeGuberEngine{answer: &ratelimitv1.CheckQuotaResponse{Allowed: true}}
	s := NewGubernator(f, ratelimitv1.FailureMode_FAILURE_MODE_OPEN, func() bool { return true })
	day := int64(24 * 3600 * 1000)
	resp, err := s.GetRateLimits(context.Background(), &gubernatorpb.GetRateLimitsReq{Requests: []*gubernatorpb.RateLimitReq{
		guberReq("n", "day", 1, 10, day),
		guberReq("n", "week", 1, 10, 7*day),
		{Name: "n", UniqueKey: "slow", Hits: 1, Limit: 10, Duration: day, Algorithm: gubernatorpb.Algorithm_LEAKY_BUCKET, Burst: 20},
	}})
	if err != nil {
		t.Fatal(err)
	}
	got := resp.GetResponses()
	if got[0].GetError() != "" {
		t.Errorf("a day's duration: error %q, want it decided", got[0].GetError())
	}
	if want := "duration 604800000 ms: at most 86400000 (24h0m0s, KURZ_LIMITER_GUBERNATOR_MAX_DURATION)"; got[1].GetError() != want {
		t.Errorf("a week's duration: error %q, want %q", got[1].GetError(), want)
	}
	if want := "burst 20 drains at 10 per 86400000 ms, in 48h0m0s: at most 24h0m0s (KURZ_LIMITER_GUBERNATOR_MAX_DURATION)"; got[2].GetError() != want {
		t.Errorf("a leaky bucket draining in two days: error %q, want %q", got[2].GetError(), want)
	}
	if len(f.calls) != 1 {
		t.Errorf("engine asked %v, want the day's limit only", f.calls)
	}
}

// erringV1 answers every GetRateLimits with err.
type erringV1 struct {
	gubernatorpb.UnimplementedV1Server
	err error
}

func (e erringV1) GetRateLimits(context.Context, *gubernatorpb.GetRateLimitsReq) (*gubernatorpb.GetRateLimitsResp, error) {
	return nil, e.err
}

// An RPC's error is the HTTP status grpc-gateway (gubernator's gateway)
// gives its code, so that a client retries a 503 and a 429 and not a 400;
// only an internal error's text is kept from the client.
func TestGubernatorHTTPMapsCodesAsGRPCGateway(t *testing.T) {
	for name, tc := range map[string]struct {
		err  error
		code int
		want []string
	}{
		"out of range":        {status.Error(codes.OutOfRange, "1001 requests"), 400, []string{`"code":11`, `"message":"1001 requests"`}},
		"invalid argument":    {status.Error(codes.InvalidArgument, "bad"), 400, []string{`"code":3`}},
		"unavailable":         {status.Error(codes.Unavailable, "the limiter is draining"), 503, []string{`"code":14`, `"message":"the limiter is draining"`}},
		"deadline exceeded":   {status.Error(codes.DeadlineExceeded, "too slow"), 504, []string{`"code":4`}},
		"a context deadline":  {context.DeadlineExceeded, 504, []string{`"code":4`}},
		"resource exhausted":  {status.Error(codes.ResourceExhausted, "too many calls"), 429, []string{`"code":8`}},
		"failed precondition": {status.Error(codes.FailedPrecondition, "not ready"), 400, []string{`"code":9`}},
		"unimplemented":       {status.Error(codes.Unimplemented, "no"), 501, []string{`"code":12`}},
		"permission denied":   {status.Error(codes.PermissionDenied, "no"), 403, []string{`"code":7`}},
		"internal":            {status.Error(codes.Internal, "redis at 10.0.0.5:7001 refused"), 500, []string{`"code":13`, `"message":"internal error"`}},
		"not a status":        {errors.New("redis at 10.0.0.5:7001 refused"), 500, []string{`"code":13`, `"message":"internal error"`}},
	} {
		t.Run(name, func(t *testing.T) {
			mux := http.NewServeMux()
			NewGubernatorHTTP(erringV1{err: tc.err}, 64<<10, NewInFlight(4), time.Second, slog.New(slog.DiscardHandler)).Register(mux)
			code, body := httpDo(mux, http.MethodPost, "/v1/GetRateLimits", "application/json", `{"requests": []}`)
			if code != tc.code {
				t.Errorf("%v: HTTP %d %s, want %d", tc.err, code, body, tc.code)
			}
			for _, w := range tc.want {
				if !strings.Contains(body, w) {
					t.Errorf("body %s lacks %s", body, w)
				}
			}
			if strings.Contains(body, "10.0.0.5") {
				t.Errorf("body %s repeats an internal error's text", body)
			}
		})
	}
}
