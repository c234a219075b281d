package quotaapi

import (
	"bufio"
	"context"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/types/known/durationpb"

	ratelimitv1 "kurz.dev/gen/kurz/ratelimit/v1"
	"kurz.dev/pkg/clientip"
	"kurz.dev/pkg/testkit/servertest"
)

// testMaxBody is the body bound of the handler under test.
const testMaxBody = 1 << 10

// postJSON sends body to an EnvoyJSON over engine as method with content
// type ct, and returns the recorded answer.
func postJSON(t *testing.T, engine *fakeEngine, method, ct, body string) *httptest.ResponseRecorder {
	t.Helper()
	h := NewEnvoyJSON(NewEnvoy(engine, HeadersDraft, clientip.Keying{}), testMaxBody, NewInFlight(8), time.Second, servertest.Logger(t))
	r := httptest.NewRequest(method, "/json", strings.NewReader(body))
	if ct != "" {
		r.Header.Set("Content-Type", ct)
	}
	w := httptest.NewRecorder()
	h.ServeHTTP(w, r)
	return w
}

// decodeResponse reads a /json answer's body as a RateLimitResponse.
func decodeResponse(t *testing.T, w *httptest.ResponseRecorder) *rlsv3.RateLimitResponse {
	t.Helper()
	if ct := w.Header().Get("Content-Type"); ct != "application/json" {
		t.Errorf("Content-Type %q, want application/json", ct)
	}
	var resp rlsv3.RateLimitResponse
	if err := protojson.Unmarshal(w.Body.Bytes(), &resp); err != nil {
		t.Fatalf("body %q: %v", w.Body, err)
	}
	return &resp
}

const userA = `{"domain": "cost", "descriptors": [{"entries": [{"key": "user", "value": "a"}]}], "hits_addend": 2}`

// An allowed request is 200 with the RateLimitResponse as protojson, the
// descriptors decided by the gRPC handler (the cost is hits_addend), and
// the rate-limit fields left in the body, as envoyproxy/ratelimit leaves
// them.
func TestEnvoyJSONAllowedIs200WithTheResponse(t *testing.T) {
	engine := newFake(t)
	engine.each = &ratelimitv1.CheckQuotaResponse{Allowed: true, DecidingRule: "per-user", Limit: 100, Remaining: 98,
		ResetAfter: durationpb.New(time.Minute), Decisions: []*ratelimitv1.RuleDecision{decision("per-user", true, 100, 98, time.Hour, 0)}}
	engine.owners = [][]int{{0}}
	w := postJSON(t, engine, http.MethodPost, "application/json; charset=utf-8", userA)
	if w.Code != http.StatusOK {
		t.Fatalf("status %d (%s), want 200", w.Code, w.Body)
	}
	resp := decodeResponse(t, w)
	if resp.GetOverallCode() != rlsv3.RateLimitResponse_OK || len(resp.GetStatuses()) != 1 ||
		resp.GetStatuses()[0].GetLimitRemaining() != 98 || resp.GetStatuses()[0].GetCurrentLimit().GetName() != "per-user" {
		t.Errorf("response %v, want OK with one status of per-user, 98 remaining", resp)
	}
	if len(resp.GetResponseHeadersToAdd()) == 0 {
		t.Errorf("response %v, want the rate-limit fields in response_headers_to_add", resp)
	}
	if w.Header().Get("RateLimit") != "" {
		t.Errorf("header RateLimit %q, want none: envoyproxy/ratelimit leaves them in the body", w.Header().Get("RateLimit"))
	}
	if len(engine.descs) != 1 || engine.descs[0]["user"] != "a" || engine.eachCosts[0][0] != 2 {
		t.Errorf("engine asked about %v at costs %v, want user=a at 2", engine.descs, engine.eachCosts)
	}
}

// A denied request is 429 with the response, as envoyproxy/ratelimit
// answers OVER_LIMIT.
func TestEnvoyJSONOverLimitIs429(t *testing.T) {
	engine := newFake(t)
	engine.each = &ratelimitv1.CheckQuotaResponse{Allowed: false, DecidingRule: "per-user", Limit: 100,
		ResetAfter: durationpb.New(time.Minute), RetryAfter: durationpb.New(time.Second),
		Decisions: []*ratelimitv1.RuleDecision{decision("per-user", false, 100, 0, time.Hour, time.Second)}}
	engine.owners = [][]int{{0}}
	w := postJSON(t, engine, http.MethodPost, "application/json", userA)
	if w.Code != http.StatusTooManyRequests {
		t.Fatalf("status %d (%s), want 429", w.Code, w.Body)
	}
	if resp := decodeResponse(t, w); resp.GetOverallCode() != rlsv3.RateLimitResponse_OVER_LIMIT {
		t.Errorf("overall %v, want OVER_LIMIT", resp.GetOverallCode())
	}
}

// What is refused is refused before the engine is asked, with the status
// that tells the caller what to fix.
func TestEnvoyJSONRefusals(t *testing.T) {
	tests := map[string]struct {
		method, ct, body string
		want             int
		wantMsg          string
	}{
		"GET":            {http.MethodGet, "", "", http.StatusMethodNotAllowed, "POST"},
		"form":           {http.MethodPost, "application/x-www-form-urlencoded", userA, http.StatusUnsupportedMediaType, "application/json"},
		"text/plain":     {http.MethodPost, "text/plain", userA, http.StatusUnsupportedMediaType, "application/json"},
		"no type":        {http.MethodPost, "", userA, http.StatusUnsupportedMediaType, "application/json"},
		"not JSON":       {http.MethodPost, "application/json", `{"domain": `, http.StatusBadRequest, "invalid RateLimitRequest JSON"},
		"unknown field":  {http.MethodPost, "application/json", `{"domain": "cost", "tenant": "x"}`, http.StatusBadRequest, `unknown field "tenant"`},
		"no domain":      {http.MethodPost, "application/json", `{"descriptors": [{"entries": [{"key": "user", "value": "a"}]}]}`, http.StatusBadRequest, "domain is required"},
		"no descriptors": {http.MethodPost, "application/json", `{"domain": "cost"}`, http.StatusBadRequest, "at least one descriptor is required"},
		"too large": {http.MethodPost, "application/json", `{"domain": "cost", "descriptors": [{"entries": [{"key": "user", "value": "` +
			strings.Repeat("a", testMaxBody) + `"}]}]}`, http.StatusRequestEntityTooLarge, "over 1024 bytes"},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			engine := newFake(t)
			w := postJSON(t, engine, tc.method, tc.ct, tc.body)
			if w.Code != tc.want || !strings.Contains(w.Body.String(), tc.wantMsg) {
				t.Errorf("status %d %q, want %d with %q", w.Code, w.Body, tc.want, tc.wantMsg)
			}
			if tc.want == http.StatusMethodNotAllowed && w.Header().Get("Allow") != http.MethodPost {
				t.Errorf("Allow %q, want POST", w.Header().Get("Allow"))
			}
			if engine.calls != 0 {
				t.Errorf("engine called %d times, want none", engine.calls)
			}
		})
	}
}

// A body sent without a length (chunked) is cut at the bound too, not
// read whole first.
func TestEnvoyJSONBoundsAChunkedBody(t *testing.T) {
	engine := newFake(t)
	h := NewEnvoyJSON(NewEnvoy(engine, HeadersDraft, clientip.Keying{}), testMaxBody, NewInFlight(8), time.Second, servertest.Logger(t))
	big := strings.NewReader(`{"domain": "` + strings.Repeat("a", 1<<20) + `"}`)
	r := httptest.NewRequest(http.MethodPost, "/json", io.MultiReader(big))
	r.ContentLength = -1
	r.Header.Set("Content-Type", "application/json")
	w := httptest.NewRecorder()
	h.ServeHTTP(w, r)
	if w.Code != http.StatusRequestEntityTooLarge {
		t.Errorf("status %d, want 413", w.Code)
	}
	if n := big.Len(); n < 1<<20-testMaxBody {
		t.Errorf("%d bytes left unread, want the rest of the body past the bound", n)
	}
}

// A decoding error names what it could not read, but does not echo a
// stranger's input back whole: an unknown field of 1,000 bytes comes
// back cut.
func TestEnvoyJSONErrorEchoesABoundedPartOfTheInput(t *testing.T) {
	engine := newFake(t)
	field := strings.Repeat("x", 1000)
	w := postJSON(t, engine, http.MethodPost, "application/json", `{"`+field+`": 1}`)
	if w.Code != http.StatusBadRequest {
		t.Fatalf("status %d, want 400", w.Code)
	}
	if body := w.Body.String(); !strings.Contains(body, "unknown field") || len(body) > 300 {
		t.Errorf("body of %d bytes %.80q..., want the error, in at most 300 bytes", len(body), body)
	}
}

// heldService holds its first ShouldRateLimit until release is closed
// (entered closes when it starts) and answers OK to every other at once.
type heldService struct {
	rlsv3.UnimplementedRateLimitServiceServer
	calls            atomic.Int32
	entered, release chan struct{}
}

func (s *heldService) ShouldRateLimit(context.Context, *rlsv3.RateLimitRequest) (*rlsv3.RateLimitResponse, error) {
	if s.calls.Add(1) == 1 {
		close(s.entered)
		<-s.release
	}
	return &rlsv3.RateLimitResponse{OverallCode: rlsv3.RateLimitResponse_OK}, nil
}

// Past maxInFlight requests being served, a request is 503 at once, its
// body unread and nothing decided, as the gRPC server refuses a call past
// its bound: each holds its body and its decoded descriptors, and the
// listener's thousands of connections would otherwise let strangers hold
// more than the process has. The slot is free again once a request ends.
func TestEnvoyJSONRefusesPastItsRequestsInFlight(t *testing.T) {
	svc := &heldService{entered: make(chan struct{}), release: make(chan struct{})}
	h := NewEnvoyJSON(svc, testMaxBody, NewInFlight(1), time.Second, servertest.Logger(t))
	post := func() *httptest.ResponseRecorder {
		r := httptest.NewRequest(http.MethodPost, "/json", strings.NewReader(userA))
		r.Header.Set("Content-Type", "application/json")
		w := httptest.NewRecorder()
		h.ServeHTTP(w, r)
		return w
	}
	held := make(chan *httptest.ResponseRecorder)
	go func() { held <- post() }()
	select {
	case <-svc.entered:
	case w := <-held:
		t.Fatalf("first request: %d (%s) before it was decided", w.Code, w.Body)
	}
	w := post()
	if w.Code != http.StatusServiceUnavailable || w.Header().Get("Retry-After") == "" {
		t.Errorf("second request while the first is served: %d (Retry-After %q), want 503 with a Retry-After", w.Code, w.Header().Get("Retry-After"))
	}
	if n := svc.calls.Load(); n != 1 {
		t.Errorf("%d decisions, want 1: the refused request decides nothing", n)
	}
	close(svc.release)
	if w := <-held; w.Code != http.StatusOK {
		t.Errorf("first request: %d (%s), want 200", w.Code, w.Body)
	}
	if w := post(); w.Code != http.StatusOK {
		t.Errorf("a request after the first ended: %d (%s), want 200", w.Code, w.Body)
	}
}

// /healthcheck answers readiness as envoyproxy/ratelimit does: 200 "OK",
// else 500.
func TestEnvoyHealthcheckFollowsReadiness(t *testing.T) {
	for _, tc := range []struct {
		ready bool
		code  int
		body  string
	}{{true, http.StatusOK, "OK"}, {false, http.StatusInternalServerError, ""}} {
		w := httptest.NewRecorder()
		EnvoyHealthcheck(func() bool { return tc.ready })(w, httptest.NewRequest(http.MethodGet, "/healthcheck", nil))
		if w.Code != tc.code || w.Body.String() != tc.body {
			t.Errorf("ready=%v: %d %q, want %d %q", tc.ready, w.Code, w.Body, tc.code, tc.body)
		}
	}
}

// A body that stalls once its request holds an in-flight slot is answered
// 408 after bodyWait and its slot given back: under the listener's read
// timeout a few stalled bodies held every slot, forward-auth's with them.
func TestEnvoyJSONGivesAStalledBodysSlotBack(t *testing.T) {
	wait := bodyWait
	t.Cleanup(func() { bodyWait = wait })
	bodyWait = 100 * time.Millisecond
	engine := newFake(t)
	engine.each = &ratelimitv1.CheckQuotaResponse{Allowed: true, DecidingRule: "per-user", Limit: 100, Remaining: 98,
		ResetAfter: durationpb.New(time.Minute), Decisions: []*ratelimitv1.RuleDecision{decision("per-user", true, 100, 98, time.Hour, 0)}}
	engine.owners = [][]int{{0}}
	srv := httptest.NewServer(NewEnvoyJSON(NewEnvoy(engine, HeadersDraft, clientip.Keying{}), testMaxBody, NewInFlight(1), time.Second, servertest.Logger(t)))
	t.Cleanup(srv.Close)

	conn, err := net.Dial("tcp", srv.Listener.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	// Headers that promise 100 bytes, and none of them.
	if _, err := io.WriteString(conn, "POST /json HTTP/1.1\r\nHost: limiter\r\nContent-Type: application/json\r\nContent-Length: 100\r\n\r\n"); err != nil {
		t.Fatal(err)
	}
	_ = conn.SetReadDeadline(time.Now().Add(10 * time.Second))
	resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
	if err != nil {
		t.Fatalf("the stalled request had no answer: %v", err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusRequestTimeout {
		t.Errorf("stalled body: %d, want 408", resp.StatusCode)
	}

	post, err := http.Post(srv.URL+"/json", "application/json", strings.NewReader(userA))
	if err != nil {
		t.Fatal(err)
	}
	post.Body.Close()
	if post.StatusCode != http.StatusOK {
		t.Errorf("a request after the stalled one: %d, want 200 (its slot given back)", post.StatusCode)
	}
}
