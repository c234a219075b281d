package httpapi

import (
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
)

// A write that asks for a precondition is refused 412 before it reaches a
// route: the API sends no validators, so it could not hold, and the write
// was applied regardless. If-Match: * and reads pass.
func TestWritesWithPreconditionsAreRefused(t *testing.T) {
	for _, tc := range []struct {
		method, header, value string
		refused               bool
	}{
		{"PATCH", "If-Match", `"v1"`, true},
		{"DELETE", "If-Match", `W/"v1"`, true},
		{"POST", "If-Unmodified-Since", "Mon, 01 Jan 1990 00:00:00 GMT", true},
		{"PATCH", "If-Match", "*", false},
		{"GET", "If-Match", `"v1"`, false},
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
