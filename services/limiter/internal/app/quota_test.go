//go:build integration

package app

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"math"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	ratelimitv1 "kurz.dev/gen/kurz/ratelimit/v1"
	"kurz.dev/pkg/testkit/servertest"
)

// Cost unset consumes 1, cost 0 looks without consuming, cost n consumes n,
// and a denied cost consumes nothing.
func TestCheckQuotaCost(t *testing.T) {
	_, rl := startFile(t)
	ctx := context.Background()
	desc := map[string]string{"user": unique(t)}
	check := func(cost *uint32) *ratelimitv1.CheckQuotaResponse {
		t.Helper()
		resp, err := rl.CheckQuota(ctx, &ratelimitv1.CheckQuotaRequest{Domain: "cost", Descriptors: desc, Cost: cost})
		if err != nil {
			t.Fatalf("CheckQuota(cost=%v): %v", cost, err)
		}
		return resp
	}
	steps := []struct {
		name          string
		cost          *uint32
		wantAllowed   bool
		wantRemaining int64
	}{
		{"cost unset consumes 1", nil, true, 99},
		{"peek", ptr(uint32(0)), true, 99},
		{"peek again", ptr(uint32(0)), true, 99},
		{"peek a third time", ptr(uint32(0)), true, 99},
		{"cost 1", ptr(uint32(1)), true, 98},
		{"cost 7", ptr(uint32(7)), true, 91},
		{"peek after cost 7", ptr(uint32(0)), true, 91},
		{"cost 92 is more than is left: denied", ptr(uint32(92)), false, 91},
		{"peek after the denial: nothing consumed", ptr(uint32(0)), true, 91},
		{"cost 91 takes the rest", ptr(uint32(91)), true, 0},
		{"peek when empty", ptr(uint32(0)), true, 0},
	}
	for _, s := range steps {
		got := check(s.cost)
		d := decisionOf(t, got, "per-user")
		if got.GetAllowed() != s.wantAllowed || d.GetRemaining() != s.wantRemaining || got.GetRemaining() != s.wantRemaining {
			t.Errorf("%s: allowed=%v remaining=%d (response %d), want allowed=%v remaining=%d",
				s.name, got.GetAllowed(), d.GetRemaining(), got.GetRemaining(), s.wantAllowed, s.wantRemaining)
		}
		if got.GetSource() != ratelimitv1.DecisionSource_DECISION_SOURCE_REDIS {
			t.Errorf("%s: source %v, want REDIS", s.name, got.GetSource())
		}
		if !got.GetAllowed() && got.GetRetryAfter().AsDuration() <= 0 {
			t.Errorf("%s: denied with retry_after %v, want > 0", s.name, got.GetRetryAfter().AsDuration())
		}
	}
}

// A request matching two rules passes only if both allow; the denying rule
// decides, and the other rule keeps what it had, whether the two rules are
// decided in one script (same hash slot) or in two (different slots, where
// the consumed unit is given back).
func TestCheckQuotaTwoRulesAllOrNothing(t *testing.T) {
	_, rl := startFile(t)
	ctx := context.Background()
	for _, tc := range []struct {
		domain string
		// sameSlot: the per-key rule must be unchanged right after the
		// denial; across slots the refund lands shortly after the answer.
		sameSlot bool
	}{
		{"quota", false},
		{"quota.tenant", true},
	} {
		t.Run(tc.domain, func(t *testing.T) {
			desc := map[string]string{"tenant": unique(t) + "-t", "api_key": unique(t) + "-k"}
			perKeyTokens := func() int64 {
				t.Helper()
				resp, err := rl.ExplainQuota(ctx, &ratelimitv1.ExplainQuotaRequest{Domain: tc.domain, Descriptors: desc, Cost: ptr(uint32(0))})
				if err != nil {
					t.Fatalf("ExplainQuota: %v", err)
				}
				return explanationOf(t, resp, "per-key").GetDecision().GetRemaining()
			}
			for i := range 3 {
				resp, err := rl.CheckQuota(ctx, &ratelimitv1.CheckQuotaRequest{Domain: tc.domain, Descriptors: desc})
				if err != nil {
					t.Fatal(err)
				}
				if !resp.GetAllowed() {
					t.Fatalf("request %d denied by %s, want allowed (per-tenant allows 3)", i+1, resp.GetDecidingRule())
				}
				if len(resp.GetDecisions()) != 2 {
					t.Fatalf("request %d: %d decisions, want 2 (per-key, per-tenant)", i+1, len(resp.GetDecisions()))
				}
				for _, want := range []struct {
					rule  string
					limit int64
				}{{"per-key", 5}, {"per-tenant", 3}} {
					d := decisionOf(t, resp, want.rule)
					if d.GetAlgorithm() != ratelimitv1.Algorithm_ALGORITHM_TOKEN_BUCKET || d.GetLimit() != want.limit || d.GetCapacity() != want.limit ||
						d.GetWindow().AsDuration() != time.Hour || !d.GetAllowed() {
						t.Errorf("request %d, %s: algorithm %v limit %d capacity %d window %v allowed %v; want TOKEN_BUCKET %d %[8]d 1h true",
							i+1, want.rule, d.GetAlgorithm(), d.GetLimit(), d.GetCapacity(), d.GetWindow().AsDuration(), d.GetAllowed(), want.limit)
					}
				}
				// Least headroom decides an allowance: per-tenant (2/3, 1/3,
				// 0/3) is always below per-key (4/5, 3/5, 2/5).
				if resp.GetDecidingRule() != "per-tenant" || resp.GetRemaining() != int64(2-i) || resp.GetLimit() != 3 {
					t.Errorf("request %d: deciding %s limit %d remaining %d, want per-tenant 3 %d",
						i+1, resp.GetDecidingRule(), resp.GetLimit(), resp.GetRemaining(), 2-i)
				}
			}
			if got := perKeyTokens(); got != 2 {
				t.Fatalf("per-key remaining before the denial: %d, want 2", got)
			}

			resp, err := rl.CheckQuota(ctx, &ratelimitv1.CheckQuotaRequest{Domain: tc.domain, Descriptors: desc})
			if err != nil {
				t.Fatal(err)
			}
			if resp.GetAllowed() || resp.GetDecidingRule() != "per-tenant" || resp.GetRetryAfter().AsDuration() <= 0 {
				t.Fatalf("4th request: allowed=%v deciding=%q retry_after=%v, want denied by per-tenant with retry_after > 0",
					resp.GetAllowed(), resp.GetDecidingRule(), resp.GetRetryAfter().AsDuration())
			}
			if resp.GetLimit() != 3 || resp.GetRemaining() != 0 || resp.GetSource() != ratelimitv1.DecisionSource_DECISION_SOURCE_REDIS {
				t.Errorf("4th request: limit %d remaining %d source %v, want 3 0 REDIS", resp.GetLimit(), resp.GetRemaining(), resp.GetSource())
			}
			if d := decisionOf(t, resp, "per-tenant"); d.GetAllowed() {
				t.Errorf("4th request: per-tenant decision allowed, want denied")
			}
			if tc.sameSlot {
				if got := perKeyTokens(); got != 2 {
					t.Errorf("per-key remaining right after the denial: %d, want 2 (one script: nothing written)", got)
				}
			} else {
				// The per-key script consumed before per-tenant denied; the
				// refund must bring it back. With a 1 h window nothing else
				// would.
				var got int64
				if !servertest.Eventually(2*time.Second, func() bool { got = perKeyTokens(); return got == 2 }) {
					t.Errorf("per-key remaining after the denial: %d, want 2 within 2 s (refund)", got)
				}
			}
		})
	}
}

// Bad requests are refused at the boundary with InvalidArgument and a
// message saying what is wrong; requests at the bounds pass.
func TestValidation(t *testing.T) {
	_, rl := startFile(t)
	ctx := context.Background()
	user := unique(t)
	many := func(n int) map[string]string {
		m := map[string]string{"user": user}
		for i := len(m); i < n; i++ {
			m[fmt.Sprintf("d%02d", i)] = "x"
		}
		return m
	}
	tests := map[string]struct {
		domain   string
		desc     map[string]string
		cost     *uint32
		wantCode codes.Code
		wantMsg  string
	}{
		"empty domain":             {"", map[string]string{"user": user}, nil, codes.InvalidArgument, "domain is required"},
		"unknown domain":           {"no-such-domain", map[string]string{"user": user}, nil, codes.InvalidArgument, `unknown domain "no-such-domain"`},
		"33 descriptors":           {"cost", many(33), nil, codes.InvalidArgument, "33 descriptors: at most 32"},
		"empty descriptor name":    {"cost", map[string]string{"user": user, "": "x"}, nil, codes.InvalidArgument, "descriptor name"},
		"65-byte descriptor name":  {"cost", map[string]string{"user": user, strings.Repeat("n", 65): "x"}, nil, codes.InvalidArgument, "descriptor name"},
		"2 KB value":               {"cost", map[string]string{"user": user, "big": strings.Repeat("v", 2048)}, nil, codes.InvalidArgument, "value of 2048 bytes, at most 1024"},
		"cost 2,000,000":           {"cost", map[string]string{"user": user}, ptr(uint32(2_000_000)), codes.InvalidArgument, "cost 2000000: at most 1000000"},
		"32 descriptors":           {"cost", many(32), ptr(uint32(0)), codes.OK, ""},
		"1 KB value":               {"cost", map[string]string{"user": user, "big": strings.Repeat("v", 1024)}, ptr(uint32(0)), codes.OK, ""},
		"cost 1,000,000":           {"cost", map[string]string{"user": user}, ptr(uint32(1_000_000)), codes.OK, ""},
		"no descriptor matches":    {"cost", map[string]string{"other": "x"}, nil, codes.OK, ""},
		"64-byte descriptor name":  {"cost", map[string]string{"user": user, strings.Repeat("n", 64): "x"}, ptr(uint32(0)), codes.OK, ""},
		"no descriptors at all":    {"cost", nil, nil, codes.OK, ""},
		"unknown domain, no descs": {"nope", nil, nil, codes.InvalidArgument, "configured domains: ["},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			_, checkErr := rl.CheckQuota(ctx, &ratelimitv1.CheckQuotaRequest{Domain: tc.domain, Descriptors: tc.desc, Cost: tc.cost})
			_, explainErr := rl.ExplainQuota(ctx, &ratelimitv1.ExplainQuotaRequest{Domain: tc.domain, Descriptors: tc.desc, Cost: tc.cost})
			// In a batch, behind a valid check: the whole call fails, naming it.
			_, batchErr := rl.CheckQuotas(ctx, &ratelimitv1.CheckQuotasRequest{Checks: []*ratelimitv1.CheckQuotaRequest{
				{Domain: "cost", Descriptors: map[string]string{"user": user}, Cost: ptr(uint32(0))},
				{Domain: tc.domain, Descriptors: tc.desc, Cost: tc.cost},
			}})
			if tc.wantCode != codes.OK {
				if msg := status.Convert(batchErr).Message(); !strings.HasPrefix(msg, "checks[1]: ") {
					t.Errorf("CheckQuotas: message %q, want it to name checks[1]", msg)
				}
			}
			for rpc, err := range map[string]error{"CheckQuota": checkErr, "ExplainQuota": explainErr, "CheckQuotas": batchErr} {
				if got := status.Code(err); got != tc.wantCode {
					t.Errorf("%s: code %v (%v), want %v", rpc, got, err, tc.wantCode)
					continue
				}
				if msg := status.Convert(err).Message(); tc.wantMsg != "" && !strings.Contains(msg, tc.wantMsg) {
					t.Errorf("%s: message %q, want it to contain %q", rpc, msg, tc.wantMsg)
				}
			}
		})
	}
}

// CheckQuotas decides each check as CheckQuota would, answering in the
// checks' order: 150 concurrent unit checks of one user against the cost
// domain's limit of 100 admit exactly 100; an exhausted and a fresh user
// interleaved get denial, admission, denial, admission. More than 1,000
// checks, or one invalid check, fail the call and consume nothing.
func TestCheckQuotas(t *testing.T) {
	_, rl := startFile(t)
	ctx := context.Background()
	check := func(user string, cost uint32) *ratelimitv1.CheckQuotaRequest {
		return &ratelimitv1.CheckQuotaRequest{Domain: "cost", Descriptors: map[string]string{"user": user}, Cost: &cost}
	}
	remaining := func(user string) int64 {
		t.Helper()
		resp, err := rl.CheckQuota(ctx, check(user, 0))
		if err != nil {
			t.Fatal(err)
		}
		return resp.GetRemaining()
	}

	one := unique(t) + "-one"
	batch := make([]*ratelimitv1.CheckQuotaRequest, 150)
	for i := range batch {
		batch[i] = check(one, 1)
	}
	resp, err := rl.CheckQuotas(ctx, &ratelimitv1.CheckQuotasRequest{Checks: batch})
	if err != nil {
		t.Fatal(err)
	}
	allowed := 0
	for i, r := range resp.GetResults() {
		if r.GetSource() != ratelimitv1.DecisionSource_DECISION_SOURCE_REDIS {
			t.Errorf("result %d: source %v, want REDIS", i, r.GetSource())
		}
		if r.GetAllowed() {
			allowed++
		}
	}
	if len(resp.GetResults()) != 150 || allowed != 100 {
		t.Errorf("150 checks of one user: %d results, %d allowed; want 150 results, 100 allowed", len(resp.GetResults()), allowed)
	}

	spent, fresh := unique(t)+"-spent", unique(t)+"-fresh"
	if _, err := rl.CheckQuota(ctx, check(spent, 100)); err != nil {
		t.Fatal(err)
	}
	resp, err = rl.CheckQuotas(ctx, &ratelimitv1.CheckQuotasRequest{Checks: []*ratelimitv1.CheckQuotaRequest{
		check(spent, 1), check(fresh, 1), check(spent, 1), check(fresh, 1)}})
	if err != nil {
		t.Fatal(err)
	}
	var got []bool
	for _, r := range resp.GetResults() {
		got = append(got, r.GetAllowed())
	}
	if want := []bool{false, true, false, true}; !slices.Equal(got, want) {
		t.Errorf("spent, fresh, spent, fresh: allowed %v, want %v", got, want)
	}

	untouched := unique(t) + "-untouched"
	tooMany := make([]*ratelimitv1.CheckQuotaRequest, 1001)
	for i := range tooMany {
		tooMany[i] = check(untouched, 1)
	}
	if _, err := rl.CheckQuotas(ctx, &ratelimitv1.CheckQuotasRequest{Checks: tooMany}); status.Code(err) != codes.InvalidArgument ||
		!strings.Contains(status.Convert(err).Message(), "1001 checks: at most 1000") {
		t.Errorf("1,001 checks: %v, want INVALID_ARGUMENT naming the bound", err)
	}
	if _, err := rl.CheckQuotas(ctx, &ratelimitv1.CheckQuotasRequest{Checks: []*ratelimitv1.CheckQuotaRequest{
		check(untouched, 5), {Domain: "no-such-domain"}}}); status.Code(err) != codes.InvalidArgument {
		t.Errorf("a batch with an unknown domain: %v, want INVALID_ARGUMENT", err)
	}
	if r := remaining(untouched); r != 100 {
		t.Errorf("after two refused batches the untouched user has %d left, want all 100", r)
	}
	if resp, err := rl.CheckQuotas(ctx, &ratelimitv1.CheckQuotasRequest{}); err != nil || len(resp.GetResults()) != 0 {
		t.Errorf("empty batch: %v, %d results; want no error, no results", err, len(resp.GetResults()))
	}
}

// ExplainQuota reports every matching rule: its decision, the exact Redis
// key, the key descriptors, failure mode, burst and raw state, and consumes
// nothing.
func TestExplainQuota(t *testing.T) {
	_, rl := startFile(t)
	ctx := context.Background()
	tenant, key := unique(t)+"-t", unique(t)+"-k"
	desc := map[string]string{"tenant": tenant, "api_key": key}
	for range 2 {
		if resp, err := rl.CheckQuota(ctx, &ratelimitv1.CheckQuotaRequest{Domain: "quota", Descriptors: desc}); err != nil || !resp.GetAllowed() {
			t.Fatalf("CheckQuota: %v %v, want allowed", resp, err)
		}
	}
	type want struct {
		key       string
		keyDescs  []string
		mode      ratelimitv1.FailureMode
		burst     int64
		limit     int64
		tokens    int64 // floor of the stored tokens
		remaining int64 // after a hypothetical request of cost 1
	}
	wants := map[string]want{
		"per-key":    {"rl:{quota:per-key:" + key + "}", []string{"api_key"}, ratelimitv1.FailureMode_FAILURE_MODE_CLOSED, 5, 5, 3, 2},
		"per-tenant": {"rl:{quota:per-tenant:" + tenant + "}", []string{"tenant"}, ratelimitv1.FailureMode_FAILURE_MODE_OPEN, 3, 3, 1, 0},
	}
	for round := range 2 {
		got, err := rl.ExplainQuota(ctx, &ratelimitv1.ExplainQuotaRequest{Domain: "quota", Descriptors: desc})
		if err != nil {
			t.Fatalf("ExplainQuota: %v", err)
		}
		if !got.GetAllowed() || len(got.GetRules()) != 2 {
			t.Fatalf("round %d: allowed=%v with %d rules, want allowed with 2", round, got.GetAllowed(), len(got.GetRules()))
		}
		now := got.GetRedisTimeUnixMs()
		if d := time.Since(time.UnixMilli(now)); d < -time.Minute || d > time.Minute {
			t.Errorf("redis_time_unix_ms %d is %v away from now", now, d)
		}
		for rule, w := range wants {
			e := explanationOf(t, got, rule)
			d := e.GetDecision()
			if !slices.Equal(e.GetKeys(), []string{w.key}) {
				t.Errorf("%s: keys %q, want [%q]", rule, e.GetKeys(), w.key)
			}
			if !slices.Equal(e.GetKeyDescriptors(), w.keyDescs) || e.GetFailureMode() != w.mode || e.GetBurst() != w.burst || e.GetShadow() || e.GetPlan() != "" {
				t.Errorf("%s: key descriptors %v failure mode %v burst %d shadow %v plan %q; want %v %v %d false \"\"",
					rule, e.GetKeyDescriptors(), e.GetFailureMode(), e.GetBurst(), e.GetShadow(), e.GetPlan(), w.keyDescs, w.mode, w.burst)
			}
			if !d.GetAllowed() || d.GetLimit() != w.limit || d.GetRemaining() != w.remaining || d.GetWindow().AsDuration() != time.Hour ||
				d.GetAlgorithm() != ratelimitv1.Algorithm_ALGORITHM_TOKEN_BUCKET || d.GetSource() != ratelimitv1.DecisionSource_DECISION_SOURCE_REDIS {
				t.Errorf("round %d, %s: decision %v; want allowed, TOKEN_BUCKET, limit %d, remaining %d, window 1h, REDIS", round, rule, d, w.limit, w.remaining)
			}
			st := e.GetState()
			if len(st) != 4 || st["b"] != strconv.FormatInt(w.burst, 10) {
				t.Errorf("%s: state %v, want exactly tokens, ts, b (the burst, %d), pttl_ms", rule, st, w.burst)
			}
			tokens, err := strconv.ParseFloat(st["tokens"], 64)
			if err != nil || int64(math.Floor(tokens)) != w.tokens {
				t.Errorf("round %d, %s: state tokens %q, want %d.x", round, rule, st["tokens"], w.tokens)
			}
			ts, err := strconv.ParseInt(st["ts"], 10, 64)
			if err != nil || ts > now || ts < now-time.Minute.Milliseconds() {
				t.Errorf("%s: state ts %q, want the Redis time of the last check (<= %d)", rule, st["ts"], now)
			}
			// TTL = time to refill the whole burst (1 h) + 1 s, minus the
			// time since the last write.
			pttl, err := strconv.ParseInt(st["pttl_ms"], 10, 64)
			if full := (time.Hour + time.Second).Milliseconds(); err != nil || pttl > full || pttl < full-time.Minute.Milliseconds() {
				t.Errorf("%s: state pttl_ms %q, want just under %d", rule, st["pttl_ms"], full)
			}
		}
	}
	// A hypothetical cost 2 is more than per-tenant holds: reported, not
	// consumed.
	got, err := rl.ExplainQuota(ctx, &ratelimitv1.ExplainQuotaRequest{Domain: "quota", Descriptors: desc, Cost: ptr(uint32(2))})
	if err != nil {
		t.Fatal(err)
	}
	if got.GetAllowed() || explanationOf(t, got, "per-tenant").GetDecision().GetAllowed() || !explanationOf(t, got, "per-key").GetDecision().GetAllowed() {
		t.Errorf("explain cost 2: allowed=%v, want denied by per-tenant only", got.GetAllowed())
	}
	peek, err := rl.CheckQuota(ctx, &ratelimitv1.CheckQuotaRequest{Domain: "quota", Descriptors: desc, Cost: ptr(uint32(0))})
	if err != nil {
		t.Fatal(err)
	}
	if k, tn := decisionOf(t, peek, "per-key").GetRemaining(), decisionOf(t, peek, "per-tenant").GetRemaining(); k != 3 || tn != 1 {
		t.Errorf("after three explains: per-key %d per-tenant %d left, want 3 and 1 (explain consumes nothing)", k, tn)
	}

	// Rules sharded by tenant live under the tenant's hash tag.
	tdesc := map[string]string{"tenant": tenant, "api_key": key}
	got, err = rl.ExplainQuota(ctx, &ratelimitv1.ExplainQuotaRequest{Domain: "quota.tenant", Descriptors: tdesc})
	if err != nil {
		t.Fatal(err)
	}
	for rule, want := range map[string]string{
		"per-key":    "rl:{t:" + tenant + "}:quota.tenant:per-key:" + tenant + ":" + key,
		"per-tenant": "rl:{t:" + tenant + "}:quota.tenant:per-tenant:" + tenant,
	} {
		e := explanationOf(t, got, rule)
		if !slices.Equal(e.GetKeys(), []string{want}) {
			t.Errorf("quota.tenant %s: keys %q, want [%q]", rule, e.GetKeys(), want)
		}
		if len(e.GetState()) != 0 {
			t.Errorf("quota.tenant %s: state %v of a key never written, want empty", rule, e.GetState())
		}
	}
}

// Crafted descriptor values cannot reach another request's key or steer the
// hash slot: values that differ only by ':', braces or escapes have
// independent limits, and the keys hold no braces besides the hash tag's.
func TestCraftedValuesCannotCollide(t *testing.T) {
	_, rl := startFile(t)
	ctx := context.Background()
	u := unique(t)
	long := u + strings.Repeat("x", 199-len(u))
	sum := sha256.Sum256([]byte(long + "3"))
	tests := map[string]struct{ a, b map[string]string }{
		"colon moves between values": {
			map[string]string{"a": u + ":x", "b": "y"},
			map[string]string{"a": u, "b": "x:y"},
		},
		"colon vs its escape":  {map[string]string{"v": u + "a:b"}, map[string]string{"v": u + "a%3Ab"}},
		"escape vs colon":      {map[string]string{"v": u + "%3A"}, map[string]string{"v": u + ":"}},
		"braces":               {map[string]string{"v": u + "{x}"}, map[string]string{"v": u + "x"}},
		"opening brace":        {map[string]string{"v": "{" + u}, map[string]string{"v": u}},
		"closing brace":        {map[string]string{"v": u + "}"}, map[string]string{"v": u + "%7D"}},
		"brace ends the tag":   {map[string]string{"v": u + "}:x"}, map[string]string{"v": u + "%7D:x"}},
		"200 bytes, last byte": {map[string]string{"v": long + "1"}, map[string]string{"v": long + "2"}},
		"200 bytes vs its hash": {
			map[string]string{"v": long + "3"},
			map[string]string{"v": "#" + hex.EncodeToString(sum[:16])},
		},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			check := func(desc map[string]string) bool {
				t.Helper()
				resp, err := rl.CheckQuota(ctx, &ratelimitv1.CheckQuotaRequest{Domain: "crafted", Descriptors: desc})
				if err != nil {
					t.Fatalf("CheckQuota(%q): %v", desc, err)
				}
				if len(resp.GetDecisions()) != 1 {
					t.Fatalf("CheckQuota(%q): %d decisions, want 1", desc, len(resp.GetDecisions()))
				}
				return resp.GetAllowed()
			}
			if !check(tc.a) {
				t.Fatalf("first request of %q denied, want allowed", tc.a)
			}
			if check(tc.a) {
				t.Fatalf("second request of %q allowed, want denied (limit 1)", tc.a)
			}
			if !check(tc.b) {
				t.Errorf("request of %q denied after %q was exhausted: the two share a key", tc.b, tc.a)
			}
			var keys []string
			for _, desc := range []map[string]string{tc.a, tc.b} {
				resp, err := rl.ExplainQuota(ctx, &ratelimitv1.ExplainQuotaRequest{Domain: "crafted", Descriptors: desc})
				if err != nil {
					t.Fatal(err)
				}
				if len(resp.GetRules()) != 1 || len(resp.GetRules()[0].GetKeys()) != 1 {
					t.Fatalf("explain %q: %v, want one rule with one key", desc, resp.GetRules())
				}
				k := resp.GetRules()[0].GetKeys()[0]
				if !strings.HasPrefix(k, "rl:{crafted:") || !strings.HasSuffix(k, "}") || strings.Count(k, "{") != 1 || strings.Count(k, "}") != 1 {
					t.Errorf("key %q: want rl:{crafted:...} with no other brace", k)
				}
				if len(k) > 120 {
					t.Errorf("key %q is %d bytes: long values should be hashed", k, len(k))
				}
				keys = append(keys, k)
			}
			if keys[0] == keys[1] {
				t.Errorf("both requests use key %q", keys[0])
			}
		})
	}
}
