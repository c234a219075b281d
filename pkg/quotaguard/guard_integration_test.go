//go:build integration

package quotaguard_test

import (
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	"kurz.dev/pkg/quota"
	"kurz.dev/pkg/quotaguard"
	"kurz.dev/pkg/testkit/servertest"
	"kurz.dev/pkg/testkit/stack"
)

func TestMain(m *testing.M) { stack.Require(m, stack.Redis) }

// guardRules is the rule the test puts in place: 100 per user a day, so
// that nothing refills while the test runs.
const guardRules = `domains:
  guard:
    rules:
      - {name: per-user, key: [user], algorithm: token_bucket, limit: 100, window: 24h, failure_mode: closed}
`

// The middleware in front of a real limiter (its own process, on the
// stack's Redis Cluster, the rule from a file): a user's first 100
// requests pass with the rule's fields counting down, the 101st is a 429
// with Retry-After, and the handler saw 100.
func TestGuardAgainstTheLimiter(t *testing.T) {
	dir := t.TempDir()
	if err := servertest.BuildServices(dir, "limiter"); err != nil {
		t.Fatal(err)
	}
	rules := filepath.Join(dir, "rules.yaml")
	if err := os.WriteFile(rules, []byte(guardRules), 0o600); err != nil {
		t.Fatal(err)
	}
	p := servertest.Run(t, dir, servertest.Spec{Name: "limiter", Service: "kurz.ratelimit.v1.RateLimitService", Env: func(g, h string) []string {
		return []string{"KURZ_LIMITER_GRPC_ADDR=" + g, "KURZ_LIMITER_HTTP_ADDR=" + h,
			"KURZ_LIMITER_RULES_SOURCE=file", "KURZ_LIMITER_RULES_FILE=" + rules,
			"KURZ_LIMITER_REDIS_TIMEOUT=1s", "KURZ_REDIS_READ_TIMEOUT=1s", "KURZ_REDIS_WRITE_TIMEOUT=1s", "KURZ_LOG_LEVEL=warn"}
	}})
	// newClient's deadline is generous: a decision the policy made would
	// not be the limiter's (and FailClosed makes it a 503, not a 429).
	limiter := newClient(t, p.GRPCAddr)
	mw, err := quotaguard.Middleware(limiter, quotaguard.Options{Domain: "guard", Policy: quota.FailClosed,
		Descriptors: quotaguard.Descriptors(map[string]quotaguard.Source{"user": quotaguard.Header("X-User")})})
	if err != nil {
		t.Fatal(err)
	}
	served := 0
	h := mw(http.HandlerFunc(func(http.ResponseWriter, *http.Request) { served++ }))
	// A user of this run alone: the buckets of earlier runs live a day.
	user := "quotaguard-it-" + strconv.FormatInt(time.Now().UnixNano(), 36)
	const policy = `"guard/per-user";q=100;w=86400`
	for i := 1; i <= 101; i++ {
		r := httptest.NewRequest(http.MethodGet, "/items", nil)
		r.Header.Set("X-User", user)
		w := httptest.NewRecorder()
		h.ServeHTTP(w, r)
		wantStatus, wantState := http.StatusOK, fmt.Sprintf(`"guard/per-user";r=%d;`, 100-i)
		if i == 101 {
			wantStatus, wantState = http.StatusTooManyRequests, `"guard/per-user";r=0;`
		}
		state := field1(w.Header(), "RateLimit")
		if w.Code != wantStatus || field1(w.Header(), "RateLimit-Policy") != policy || len(state) < len(wantState) || state[:len(wantState)] != wantState {
			t.Fatalf("request %d: %d, RateLimit-Policy %q, RateLimit %q; want %d, %s, %s…\n%s",
				i, w.Code, field1(w.Header(), "RateLimit-Policy"), state, wantStatus, policy, wantState, w.Body)
		}
		if i == 101 {
			if ra, err := strconv.Atoi(w.Header().Get("Retry-After")); err != nil || ra < 1 {
				t.Errorf("the 429's Retry-After is %q, want whole seconds, at least 1", w.Header().Get("Retry-After"))
			}
		}
	}
	if served != 100 {
		t.Errorf("the handler served %d requests, want 100", served)
	}
}
