//go:build integration

package app

import (
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/protobuf/encoding/protojson"
)

// readmeJSONRequest is the body of the README's curl example of POST /json
// ("Coming from envoyproxy/ratelimit"), word for word.
const readmeJSONRequest = `{"domain": "demo", "descriptors": [{"entries": [{"key": "user", "value": "alice"}]}]}`

// The README's POST /json example, on the shipped rules and the real Redis
// Cluster, answers what the README shows: 200, OK, the demo domain's token
// bucket as 100 a minute with 99 left, and its rate-limit fields in the
// body. The value is the test's own, so that no earlier call has spent any.
func TestEnvoyJSONReadmeExample(t *testing.T) {
	readme, err := os.ReadFile(filepath.Join("..", "..", "README.md"))
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(readme), "-d '"+readmeJSONRequest+"'") {
		t.Fatalf("services/limiter/README.md has no curl example sending %s", readmeJSONRequest)
	}
	r := startWith(t, map[string]string{
		"KURZ_LIMITER_RULES_SOURCE": "file", // the shipped rules, built in
		"KURZ_LIMITER_ENVOY_HTTP":   "true",
	})

	code, body := post(t, r.HTTP+"/json", "application/json", strings.Replace(readmeJSONRequest, `"alice"`, `"`+unique(t)+`"`, 1))
	t.Logf("%d %s", code, body)
	var resp rlsv3.RateLimitResponse
	if err := protojson.Unmarshal([]byte(body), &resp); err != nil {
		t.Fatalf("%d %q: %v", code, body, err)
	}
	if code != http.StatusOK || resp.GetOverallCode() != rlsv3.RateLimitResponse_OK || len(resp.GetStatuses()) != 1 {
		t.Fatalf("%d %v, want 200 OK with one status", code, &resp)
	}
	st := resp.GetStatuses()[0]
	if lim := st.GetCurrentLimit(); st.GetCode() != rlsv3.RateLimitResponse_OK || lim.GetName() != "token_bucket" ||
		lim.GetRequestsPerUnit() != 100 || lim.GetUnit() != rlsv3.RateLimitResponse_RateLimit_MINUTE || st.GetLimitRemaining() != 99 {
		t.Errorf("status %v, want OK, token_bucket at 100 a minute, 99 left", st)
	}
	headers := map[string]string{}
	for _, h := range resp.GetResponseHeadersToAdd() {
		headers[h.GetKey()] = h.GetValue()
	}
	if headers["RateLimit-Policy"] != `"demo/token_bucket";q=100;w=60` || !strings.HasPrefix(headers["RateLimit"], `"demo/token_bucket";r=99;t=`) {
		t.Errorf("response_headers_to_add %v, want the demo token bucket's RateLimit-Policy and RateLimit", headers)
	}
}
