package httpapi

import (
	"context"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"

	limiterv1 "kurz.dev/gen/kurz/limiter/v1"
)

// A write that asks for a precondition no route evaluates is refused 412
// before it reaches a route: it could not hold, and the write was applied
// regardless. If-Match is the route's (TestIfMatchOnlyWhereTheServiceChecksIt);
// reads pass.
func TestWritesWithPreconditionsAreRefused(t *testing.T) {
	for _, tc := range []struct {
		method, header, value string
		refused               bool
	}{
		{"POST", "If-Unmodified-Since", "Mon, 01 Jan 1990 00:00:00 GMT", true},
		{"PATCH", "If-None-Match", `"v1"`, true},
		{"POST", "If-None-Match", "*", true},
		{"PATCH", "If-Match", `"v1"`, false},
		{"GET", "If-None-Match", `"v1"`, false},
		{"GET", "If-Unmodified-Since", "Mon, 01 Jan 1990 00:00:00 GMT", false},
		{"PATCH", "", "", false},
	} {
		r := httptest.NewRequest(tc.method, "/v1/links/abc1234", nil)
		if tc.header != "" {
			r.Header.Set(tc.header, tc.value)
		}
		e := checkPreconditions(r)
		if (e != nil) != tc.refused {
			t.Errorf("%s with %s %q: refused %v, want %v", tc.method, tc.header, tc.value, e != nil, tc.refused)
			continue
		}
		if e != nil && (e.status != http.StatusPreconditionFailed || e.code != codePreconditionFailed || !strings.Contains(e.message, tc.header)) {
			t.Errorf("%s with %s: %d %s %q, want 412 %s naming the header", tc.method, tc.header, e.status, e.code, e.message, codePreconditionFailed)
		}
	}
}

// If-Match's tags reach the service of a route that checks them (a link's
// PATCH and DELETE); on any other write a tag is refused 412, * passes,
// and a malformed field is 400 (* beside tags too: RFC 9110 has it alone).
func TestIfMatchOnlyWhereTheServiceChecksIt(t *testing.T) {
	conditional := route{rpc: &mapping{conditional: true}}
	other := route{rpc: &mapping{}}
	for _, tc := range []struct {
		rt     route
		method string
		fields []string
		status int // 0: passes
		tags   []string
	}{
		{conditional, "PATCH", []string{`"AbCd1234eFgH5678"`}, 0, []string{"AbCd1234eFgH5678"}},
		{conditional, "DELETE", []string{`"a", W/"b"`, `c`}, 0, []string{"a", "W/b", "c"}},
		{conditional, "PATCH", []string{"*"}, 0, nil},
		{conditional, "PATCH", []string{`*, "a"`}, http.StatusBadRequest, nil},
		{conditional, "PATCH", []string{`"a"`, "*"}, http.StatusBadRequest, nil},
		{conditional, "PATCH", []string{`"a b"`}, http.StatusBadRequest, nil},
		{conditional, "PATCH", []string{`""`}, http.StatusBadRequest, nil},
		{conditional, "PATCH", []string{`"` + strings.Repeat("x", maxETag+1) + `"`}, http.StatusBadRequest, nil},
		{conditional, "PATCH", []string{strings.Repeat(`"a",`, 17)}, http.StatusBadRequest, nil},
		{other, "DELETE", []string{`"a"`}, http.StatusPreconditionFailed, nil},
		{other, "DELETE", []string{"*"}, 0, nil},
		{other, "GET", []string{`"a"`}, 0, nil},
	} {
		r := httptest.NewRequest(tc.method, "/v1/links/abc1234", nil)
		r.Header["If-Match"] = tc.fields
		c := &call{r: r}
		err := ifMatch(c, tc.rt)
		status := 0
		if err != nil {
			status = err.(*apiError).status
		}
		if status != tc.status || !slices.Equal(c.ifMatch, tc.tags) {
			t.Errorf("%s If-Match %q (conditional %v): status %d, tags %q; want %d, %q",
				tc.method, tc.fields, tc.rt.rpc.conditional, status, c.ifMatch, tc.status, tc.tags)
		}
	}
}

// A GET of a link answers 304 to an If-None-Match naming its tag (weakly
// or not, or *), 412 to an If-Match that does not.
func TestReadPreconditions(t *testing.T) {
	const etag = `"AbCd1234eFgH5678"`
	for _, tc := range []struct {
		header, value string
		notModified   bool
		status        int
	}{
		{"If-None-Match", etag, true, 0},
		{"If-None-Match", `W/"AbCd1234eFgH5678"`, true, 0},
		{"If-None-Match", `"other", ` + etag, true, 0},
		{"If-None-Match", "*", true, 0},
		{"If-None-Match", `"other"`, false, 0},
		{"If-Match", etag, false, 0},
		{"If-Match", `"other"`, false, http.StatusPreconditionFailed},
		{"If-Match", `W/"AbCd1234eFgH5678"`, false, http.StatusPreconditionFailed},
		{"If-None-Match", `"a b"`, false, http.StatusBadRequest},
		{"If-Match", `*, "other"`, false, http.StatusBadRequest},
	} {
		r := httptest.NewRequest("GET", "/v1/links/abc1234", nil)
		r.Header.Set(tc.header, tc.value)
		notModified, err := checkRead(r, etag, "the link")
		status := 0
		if err != nil {
			status = err.(*apiError).status
		}
		if notModified != tc.notModified || status != tc.status {
			t.Errorf("GET with %s %s: not modified %v, status %d; want %v, %d", tc.header, tc.value, notModified, status, tc.notModified, tc.status)
		}
	}
}

// fixedRules answers GetRules with one file and its etag.
type fixedRules struct {
	limiterv1.RulesAdminServiceClient
}

func (fixedRules) GetRules(context.Context, *limiterv1.GetRulesRequest, ...grpc.CallOption) (*limiterv1.GetRulesResponse, error) {
	return &limiterv1.GetRulesResponse{Yaml: "domains: {}\n", Etag: "AbCd1234eFgH5678", Source: "postgres"}, nil
}

// GET /v1/admin/rules evaluates If-None-Match and If-Match against the
// rules' ETag as a link's GET does: 304 while they are unchanged, 412 to
// an If-Match they no longer hold, the file otherwise.
func TestGetRulesPreconditions(t *testing.T) {
	const etag = `"AbCd1234eFgH5678"`
	a := &API{opts: Options{CallTimeout: time.Second}, rulesAdmin: fixedRules{}, log: slog.New(slog.DiscardHandler)}
	for _, tc := range []struct {
		header, value string
		status        int
	}{
		{"", "", http.StatusOK},
		{"If-None-Match", etag, http.StatusNotModified},
		{"If-None-Match", `"other", W/"AbCd1234eFgH5678"`, http.StatusNotModified},
		{"If-None-Match", `"other"`, http.StatusOK},
		{"If-Match", etag, http.StatusOK},
		{"If-Match", `"other", ` + etag, http.StatusOK},
		{"If-Match", "*", http.StatusOK},
		{"If-Match", `"other"`, http.StatusPreconditionFailed},
	} {
		r := httptest.NewRequest("GET", "/v1/admin/rules", nil)
		if tc.header != "" {
			r.Header.Set(tc.header, tc.value)
		}
		w := httptest.NewRecorder()
		status := 0
		if err := a.getRules(&call{w: w, r: r, st: &reqState{id: "t"}}); err != nil {
			status = err.(*apiError).status
		} else {
			status = w.Code
		}
		body := w.Body.String()
		wantBody := map[int]string{http.StatusOK: "domains: {}\n"}[tc.status]
		if status != tc.status || body != wantBody || w.Header().Get("ETag") != etag {
			t.Errorf("GET /v1/admin/rules with %s %s: %d, ETag %q, body %q; want %d, the ETag, body %q", tc.header, tc.value, status, w.Header().Get("ETag"), body, tc.status, wantBody)
		}
	}
}
