//go:build integration

package app

import (
	"context"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	ratelimitv1 "kurz.dev/gen/kurz/ratelimit/v1"
	"kurz.dev/pkg/testkit/servertest"
)

// rulesFile is the absolute path of the test rules (testdata/rules.yaml).
func rulesFile(t testing.TB) string {
	t.Helper()
	p, err := filepath.Abs(filepath.Join("testdata", "rules.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// startFile boots the limiter in-process on the real Redis Cluster with the
// test rules file, and waits until it serves.
func startFile(t *testing.T) (*servertest.Running, ratelimitv1.RateLimitServiceClient) {
	t.Helper()
	r := startWith(t, map[string]string{
		"KURZ_LIMITER_RULES_SOURCE": "file",
		"KURZ_LIMITER_RULES_FILE":   rulesFile(t),
	})
	return r, ratelimitv1.NewRateLimitServiceClient(r.Conn)
}

// startWith boots the limiter in-process on the real Redis Cluster with env
// over a fleet of the test's own and generous Redis timeouts, and waits
// until it serves.
func startWith(t *testing.T, env map[string]string) *servertest.Running {
	t.Helper()
	vars := map[string]string{
		"KURZ_LIMITER_FLEET": fleetName(t),
		// Generous, so the race detector never pushes a decision into the
		// rules' failure modes: these tests are about Redis decisions.
		"KURZ_LIMITER_REDIS_TIMEOUT": "1s",
		"KURZ_REDIS_READ_TIMEOUT":    "1s",
		"KURZ_REDIS_WRITE_TIMEOUT":   "1s",
	}
	maps.Copy(vars, env)
	srv, err := New(context.Background(), load(t, vars), servertest.Logger(t))
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	r := servertest.Start(t, srv)
	r.AwaitServing(t, "kurz.ratelimit.v1.RateLimitService")
	return r
}

// unique returns a descriptor value no other test or test run uses; it holds
// only bytes a key keeps as they are.
func unique(t testing.TB) string {
	return fmt.Sprintf("%s-%d", strings.NewReplacer("/", "-", "#", "-").Replace(t.Name()), time.Now().UnixNano())
}

// fleetName is the limiter fleet of the test's limiters: theirs alone, so
// that neither the stack's limiter nor another test's counts them.
func fleetName(t testing.TB) string {
	name := strings.Map(func(r rune) rune {
		if r == '.' || r == '_' || r == '-' || '0' <= r && r <= '9' || 'a' <= r && r <= 'z' || 'A' <= r && r <= 'Z' {
			return r
		}
		return '-'
	}, t.Name())
	return fmt.Sprintf("%.40s-%d", name, os.Getpid())
}

func ptr[T any](v T) *T { return &v }

// decisionOf returns the decision of rule in resp, failing the test if absent.
func decisionOf(t testing.TB, resp *ratelimitv1.CheckQuotaResponse, rule string) *ratelimitv1.RuleDecision {
	t.Helper()
	for _, d := range resp.GetDecisions() {
		if d.GetRule() == rule {
			return d
		}
	}
	t.Fatalf("no decision for rule %q in %v", rule, resp)
	return nil
}

// explanationOf returns the explanation of rule in resp, failing the test if
// absent.
func explanationOf(t testing.TB, resp *ratelimitv1.ExplainQuotaResponse, rule string) *ratelimitv1.RuleExplanation {
	t.Helper()
	for _, r := range resp.GetRules() {
		if r.GetDecision().GetRule() == rule {
			return r
		}
	}
	t.Fatalf("no explanation for rule %q in %v", rule, resp)
	return nil
}
