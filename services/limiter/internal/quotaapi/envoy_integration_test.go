//go:build integration

package quotaapi

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"strings"
	"testing"
	"time"

	ratelimitcommonv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"go.opentelemetry.io/otel/metric/noop"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/wrapperspb"

	ratelimitv1 "kurz.dev/gen/kurz/ratelimit/v1"
	"kurz.dev/pkg/clientip"
	"kurz.dev/pkg/config"
	"kurz.dev/pkg/redisconn"
	"kurz.dev/services/limiter/internal/ratelimit"
	"kurz.dev/services/limiter/internal/rulestore"
)

// realEngine is a ratelimit.Engine on the stack's Redis Cluster deciding
// rules, whose CheckEach answers are kept in each (in call order).
func realEngine(t testing.TB, rules string) *recordingEngine {
	t.Helper()
	var cfg redisconn.Config
	if err := config.Load(&cfg); err != nil {
		t.Fatal(err)
	}
	rdb, err := redisconn.New(context.Background(), cfg)
	if err != nil {
		t.Fatalf("local Redis Cluster: %v", err)
	}
	t.Cleanup(func() { _ = rdb.Close() })
	c, err := rulestore.Parse([]byte(rules))
	if err != nil {
		t.Fatal(err)
	}
	rs, err := ratelimit.Compile(c)
	if err != nil {
		t.Fatal(err)
	}
	log := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelError}))
	e, err := ratelimit.NewEngine(rdb, rs, ratelimit.Options{Timeout: 5 * time.Second}, log, noop.NewMeterProvider())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(e.Wait)
	return &recordingEngine{Engine: e}
}

// recordingEngine lets a test see how the engine answered each
// ShouldRateLimit: decided on Redis (a decision per rule) or from the
// over-limit cache (the cached rule's decision alone).
type recordingEngine struct {
	*ratelimit.Engine
	each []*ratelimitv1.CheckQuotaResponse
}

func (r *recordingEngine) CheckEach(ctx context.Context, domain string, descs []map[string]string, costs []int64) (*ratelimitv1.CheckQuotaResponse, [][]int) {
	resp, owners := r.Engine.CheckEach(ctx, domain, descs, costs)
	r.each = append(r.each, resp)
	return resp, owners
}

// A denial answered from the over-limit cache gives every descriptor the
// status a denial decided on Redis gives it. The cache answers with the
// denying rules' decisions alone, so the descriptors they belong to must
// come from those rules, not from the first rules of the request (which
// put the per-ip denial on the user descriptor and left the ip one OK).
func TestEnvoyCachedDenialKeepsItsDescriptor(t *testing.T) {
	e := realEngine(t, `
domains:
  envoy:
    rules:
      - {name: per-user-day, key: [user], algorithm: token_bucket, limit: 100, window: 24h, failure_mode: open}
      - {name: per-user, key: [user], algorithm: token_bucket, limit: 1, window: 1h, failure_mode: open}
      - {name: per-ip, key: [ip], algorithm: token_bucket, limit: 1, window: 2h, failure_mode: open}
`)
	s := NewEnvoy(e, HeadersDraft, clientip.Keying{})
	id := fmt.Sprintf("%s-%d", strings.ReplaceAll(t.Name(), "/", "-"), time.Now().UnixNano())
	req := &rlsv3.RateLimitRequest{Domain: "envoy", Descriptors: []*ratelimitcommonv3.RateLimitDescriptor{
		descriptor("user", "u-"+id),
		descriptor("ip", "ip-"+id),
	}}
	call := func() *rlsv3.RateLimitResponse {
		t.Helper()
		resp, err := s.ShouldRateLimit(context.Background(), req)
		if err != nil {
			t.Fatal(err)
		}
		return resp
	}

	if got := call().GetOverallCode(); got != rlsv3.RateLimitResponse_OK {
		t.Fatalf("call 1 (per-user's and per-ip's one unit): %v, want OK", got)
	}
	onRedis, fromCache := call(), call()
	if n := len(e.each[1].GetDecisions()); n != 3 {
		t.Fatalf("call 2 carries %d decisions, want 3 (decided on Redis)", n)
	}
	if n := len(e.each[2].GetDecisions()); n != 2 {
		t.Fatalf("call 3 carries %d decisions, want 2 (answered from the over-limit cache)", n)
	}
	cacheAnswersAsRedis(t, onRedis, fromCache, "per-user", "per-ip")
}

// A repeated denial of one descriptor beside another the over-limit cache
// holds nothing of reports the other's limit and remaining, as the denial
// on Redis did and as envoyproxy/ratelimit does on every request (the
// cache's answer, its denial alone, had left it a bare OK); a request of
// the denied descriptor alone is still answered from the cache.
func TestEnvoyCachedDenialReportsEveryDescriptorsLimit(t *testing.T) {
	e := realEngine(t, `
domains:
  envoy:
    rules:
      - {name: per-user, key: [user], algorithm: token_bucket, limit: 100, window: 1h, failure_mode: open}
      - {name: per-ip, key: [ip], algorithm: token_bucket, limit: 1, window: 1h, failure_mode: open}
`)
	s := NewEnvoy(e, HeadersDraft, clientip.Keying{})
	id := fmt.Sprintf("%s-%d", t.Name(), time.Now().UnixNano())
	user, ip := descriptor("user", "u-"+id), descriptor("ip", "ip-"+id)
	call := func(descs ...*ratelimitcommonv3.RateLimitDescriptor) *rlsv3.RateLimitResponse {
		t.Helper()
		resp, err := s.ShouldRateLimit(context.Background(), &rlsv3.RateLimitRequest{Domain: "envoy", Descriptors: descs})
		if err != nil {
			t.Fatal(err)
		}
		// The user and ip keys may sit in different slots: a denial's
		// refund of per-user's unit then runs after the answer is sent.
		e.Wait()
		return resp
	}

	if got := call(user, ip).GetOverallCode(); got != rlsv3.RateLimitResponse_OK {
		t.Fatalf("call 1 (per-ip's one unit): %v, want OK", got)
	}
	first, again := call(user, ip), call(user, ip)
	for name, resp := range map[string]*rlsv3.RateLimitResponse{"denied": first, "denied again": again} {
		if got := resp.GetOverallCode(); got != rlsv3.RateLimitResponse_OVER_LIMIT {
			t.Errorf("%s: overall %v, want OVER_LIMIT", name, got)
		}
		u, i := resp.GetStatuses()[0], resp.GetStatuses()[1]
		if u.GetCode() != rlsv3.RateLimitResponse_OK || u.GetCurrentLimit().GetName() != "per-user" || u.GetLimitRemaining() != 99 {
			t.Errorf("%s: user descriptor %v, limit %v, remaining %d; want OK by per-user, remaining 99", name, u.GetCode(), u.GetCurrentLimit(), u.GetLimitRemaining())
		}
		if i.GetCode() != rlsv3.RateLimitResponse_OVER_LIMIT || i.GetCurrentLimit().GetName() != "per-ip" {
			t.Errorf("%s: ip descriptor %v (limit %q), want OVER_LIMIT by per-ip", name, i.GetCode(), i.GetCurrentLimit().GetName())
		}
	}
	call(ip)
	if src := e.each[len(e.each)-1].GetSource(); src != ratelimitv1.DecisionSource_DECISION_SOURCE_OVER_LIMIT_CACHE {
		t.Errorf("the ip descriptor alone: source %v, want the over-limit cache", src)
	}
}

// When two descriptors' rules both deny, the cached repeat gives each its
// own OVER_LIMIT status and limit, as the denial on Redis did: the cache
// answers with every rule it holds a denial of, not the deciding one alone
// (which left the other descriptor OK).
func TestEnvoyCachedDenialKeepsEveryDeniedDescriptor(t *testing.T) {
	e := realEngine(t, `
domains:
  envoy:
    rules:
      - {name: per-user, key: [user], algorithm: token_bucket, limit: 1, window: 1h, failure_mode: open}
      - {name: per-ip, key: [ip], algorithm: token_bucket, limit: 1, window: 2h, failure_mode: open}
`)
	s := NewEnvoy(e, HeadersDraft, clientip.Keying{})
	id := fmt.Sprintf("%s-%d", t.Name(), time.Now().UnixNano())
	req := &rlsv3.RateLimitRequest{Domain: "envoy", Descriptors: []*ratelimitcommonv3.RateLimitDescriptor{
		descriptor("user", "u-"+id),
		descriptor("ip", "ip-"+id),
	}}
	var resps []*rlsv3.RateLimitResponse
	for range 3 {
		resp, err := s.ShouldRateLimit(context.Background(), req)
		if err != nil {
			t.Fatal(err)
		}
		resps = append(resps, resp)
	}
	if got := resps[0].GetOverallCode(); got != rlsv3.RateLimitResponse_OK {
		t.Fatalf("call 1: %v, want OK", got)
	}
	if src := e.each[2].GetSource(); src != ratelimitv1.DecisionSource_DECISION_SOURCE_OVER_LIMIT_CACHE || e.each[2].GetDecidingRule() != "per-ip" {
		t.Fatalf("call 3: source %v, deciding %q; want the over-limit cache, per-ip (the longer retry)", src, e.each[2].GetDecidingRule())
	}
	onRedis, fromCache := resps[1], resps[2]
	cacheAnswersAsRedis(t, onRedis, fromCache, "per-user", "per-ip")
}

// Each descriptor is charged its own hits_addend, as Envoy charges it: a
// rule matched by two descriptors is charged the sum of theirs.
func TestEnvoyDescriptorsAreChargedTheirOwnHits(t *testing.T) {
	e := realEngine(t, `
domains:
  envoy:
    rules:
      - {name: per-user, key: [user], algorithm: fixed_window, limit: 5, window: 1h, failure_mode: closed}
`)
	s := NewEnvoy(e, HeadersDraft, clientip.Keying{})
	id := fmt.Sprintf("%s-%d", t.Name(), time.Now().UnixNano())
	hits := func(v string, n uint64) *ratelimitcommonv3.RateLimitDescriptor {
		d := descriptor("user", v)
		d.HitsAddend = wrapperspb.UInt64(n)
		return d
	}
	check := func(step string, want rlsv3.RateLimitResponse_Code, wantRemaining uint32, descs ...*ratelimitcommonv3.RateLimitDescriptor) {
		t.Helper()
		resp, err := s.ShouldRateLimit(context.Background(), &rlsv3.RateLimitRequest{Domain: "envoy", Descriptors: descs})
		if err != nil {
			t.Fatalf("%s: %v", step, err)
		}
		if got := resp.GetStatuses()[0]; resp.GetOverallCode() != want || got.GetLimitRemaining() != wantRemaining {
			t.Fatalf("%s: %v, remaining %d; want %v, remaining %d", step, resp.GetOverallCode(), got.GetLimitRemaining(), want, wantRemaining)
		}
	}
	a, b := "a-"+id, "b-"+id
	check("a, hits 3", rlsv3.RateLimitResponse_OK, 2, hits(a, 3))
	check("a, hits 3 again", rlsv3.RateLimitResponse_OVER_LIMIT, 2, hits(a, 3))
	check("a, hits 2", rlsv3.RateLimitResponse_OK, 0, hits(a, 2))
	// b twice in one request, 2 and 3 hits: the rule is charged 5.
	check("b, hits 2 and 3", rlsv3.RateLimitResponse_OK, 0, hits(b, 2), hits(b, 3))
	check("b, hits 1", rlsv3.RateLimitResponse_OVER_LIMIT, 0, hits(b, 1))
}

// The nested configuration envoyproxy/ratelimit users write, a global
// limit and a per-IP one under it, gets Envoy's answers: the global
// descriptor counts against the global rule alone and the per-IP one
// against the per-IP rule alone (the global rule applied to both had
// denied from the 4th request, at 3 where Envoy allows 6); a value's own
// rule replaces its key's (a VIP user's 10 where others have 5).
func TestEnvoyNestedLimitsAsEnvoyDecidesThem(t *testing.T) {
	id := fmt.Sprintf("%d", time.Now().UnixNano())
	e := realEngine(t, fmt.Sprintf(`
domains:
  envoy:
    rules:
      - {name: api-global, key: [generic_key], match: {generic_key: api-%[1]s}, algorithm: fixed_window, limit: 6, window: 1h, failure_mode: closed}
      - {name: api-per-ip, key: [generic_key, remote_address], match: {generic_key: api-%[1]s}, algorithm: fixed_window, limit: 3, window: 1h, failure_mode: closed}
      - {name: per-user, key: [user], algorithm: fixed_window, limit: 5, window: 1h, failure_mode: closed}
      - {name: user-vip, key: [user], match: {user: vip-%[1]s}, algorithm: fixed_window, limit: 10, window: 1h, failure_mode: closed}
`, id))
	s := NewEnvoy(e, HeadersDraft, clientip.Keying{})
	ask := func(descs ...*ratelimitcommonv3.RateLimitDescriptor) *rlsv3.RateLimitResponse {
		t.Helper()
		resp, err := s.ShouldRateLimit(context.Background(), &rlsv3.RateLimitRequest{Domain: "envoy", Descriptors: descs})
		if err != nil {
			t.Fatal(err)
		}
		return resp
	}
	for i := 1; i <= 7; i++ {
		ip := &ratelimitcommonv3.RateLimitDescriptor{Entries: []*ratelimitcommonv3.RateLimitDescriptor_Entry{
			{Key: "generic_key", Value: "api-" + id}, {Key: "remote_address", Value: fmt.Sprintf("10.0.0.%d", i)}}}
		resp := ask(descriptor("generic_key", "api-"+id), ip)
		want := rlsv3.RateLimitResponse_OK
		if i == 7 {
			want = rlsv3.RateLimitResponse_OVER_LIMIT
		}
		global, perIP := resp.GetStatuses()[0], resp.GetStatuses()[1]
		if resp.GetOverallCode() != want || global.GetCurrentLimit().GetName() != "api-global" || perIP.GetCurrentLimit().GetName() != "api-per-ip" {
			t.Fatalf("request %d: %v, limits %q and %q; want %v, api-global and api-per-ip", i, resp.GetOverallCode(),
				global.GetCurrentLimit().GetName(), perIP.GetCurrentLimit().GetName(), want)
		}
		if i < 7 && (global.GetLimitRemaining() != uint32(6-i) || perIP.GetLimitRemaining() != 2) {
			t.Fatalf("request %d: remaining %d and %d, want %d and 2", i, global.GetLimitRemaining(), perIP.GetLimitRemaining(), 6-i)
		}
	}
	for i := 1; i <= 7; i++ {
		resp := ask(descriptor("user", "vip-"+id))
		if st := resp.GetStatuses()[0]; resp.GetOverallCode() != rlsv3.RateLimitResponse_OK || st.GetCurrentLimit().GetRequestsPerUnit() != 10 {
			t.Fatalf("VIP request %d: %v at %d per unit, want OK at 10", i, resp.GetOverallCode(), st.GetCurrentLimit().GetRequestsPerUnit())
		}
	}
	// A descriptor deeper than any rule is limited by none.
	if resp := ask(&ratelimitcommonv3.RateLimitDescriptor{Entries: []*ratelimitcommonv3.RateLimitDescriptor_Entry{
		{Key: "user", Value: "u-" + id}, {Key: "path", Value: "/p"}}}); resp.GetStatuses()[0].GetCurrentLimit() != nil {
		t.Errorf("user and path: limited by %q, want no limit", resp.GetStatuses()[0].GetCurrentLimit().GetName())
	}
}

// A header Envoy sends present but empty is an entry with value "": it is
// limited as any value, all empty values sharing one counter, where it
// used to escape every rule keyed on it.
func TestEnvoyEmptyValueIsLimited(t *testing.T) {
	e := realEngine(t, `
domains:
  envoy:
    rules:
      - {name: per-user, key: [run, user], algorithm: fixed_window, limit: 1, window: 1h, failure_mode: open}
`)
	s := NewEnvoy(e, HeadersDraft, clientip.Keying{})
	run := fmt.Sprintf("%s-%d", t.Name(), time.Now().UnixNano())
	call := func(user string) rlsv3.RateLimitResponse_Code {
		t.Helper()
		resp, err := s.ShouldRateLimit(context.Background(), &rlsv3.RateLimitRequest{Domain: "envoy", Descriptors: []*ratelimitcommonv3.RateLimitDescriptor{
			{Entries: []*ratelimitcommonv3.RateLimitDescriptor_Entry{{Key: "run", Value: run}, {Key: "user", Value: user}}},
		}})
		if err != nil {
			t.Fatal(err)
		}
		return resp.GetOverallCode()
	}
	for i, want := range []rlsv3.RateLimitResponse_Code{rlsv3.RateLimitResponse_OK, rlsv3.RateLimitResponse_OVER_LIMIT} {
		if got := call(""); got != want {
			t.Errorf("call %d with user empty: %v, want %v", i+1, got, want)
		}
	}
	if got := call("alice"); got != rlsv3.RateLimitResponse_OK {
		t.Errorf("alice after the empty user's limit: %v, want OK (a counter of her own)", got)
	}
}

// A descriptor's hits_addend of 0 checks without consuming, as in
// envoyproxy/ratelimit, where a route checks on the request and charges on
// stream done: under every algorithm, any number of checks leave the limit
// whole; once charges have spent it, the check is OVER_LIMIT (a charge kurz
// denies consumes nothing, so an OK there would let every later request
// through). Beside a charged descriptor, a check decides with it, all or
// nothing, and consumes nothing of its own rule.
func TestEnvoyHitsAddendZeroChecksWithoutConsuming(t *testing.T) {
	algos := []string{"fixed_window", "sliding_log", "sliding_window_counter", "token_bucket", "leaky_bucket"}
	var rules strings.Builder
	for _, a := range algos {
		fmt.Fprintf(&rules, "      - {name: %[1]s, key: [%[1]s], algorithm: %[1]s, limit: 5, window: 1h, failure_mode: closed}\n", a)
	}
	e := realEngine(t, "domains:\n  envoy:\n    rules:\n"+rules.String())
	s := NewEnvoy(e, HeadersDraft, clientip.Keying{})
	id := fmt.Sprintf("%s-%d", t.Name(), time.Now().UnixNano())
	hits := func(key string, n uint64) *ratelimitcommonv3.RateLimitDescriptor {
		d := descriptor(key, id)
		d.HitsAddend = wrapperspb.UInt64(n)
		return d
	}
	ask := func(descs ...*ratelimitcommonv3.RateLimitDescriptor) *rlsv3.RateLimitResponse {
		t.Helper()
		resp, err := s.ShouldRateLimit(context.Background(), &rlsv3.RateLimitRequest{Domain: "envoy", Descriptors: descs})
		if err != nil {
			t.Fatal(err)
		}
		return resp
	}
	for _, a := range algos {
		for i := range 6 {
			if st := ask(hits(a, 0)).GetStatuses()[0]; st.GetCode() != rlsv3.RateLimitResponse_OK || st.GetLimitRemaining() != 5 {
				t.Fatalf("%s: check %d: %v, remaining %d; want OK, remaining 5", a, i+1, st.GetCode(), st.GetLimitRemaining())
			}
		}
		for i := range 5 {
			if got := ask(hits(a, 1)).GetOverallCode(); got != rlsv3.RateLimitResponse_OK {
				t.Fatalf("%s: charge %d after the checks: %v, want OK", a, i+1, got)
			}
		}
		if st := ask(hits(a, 0)).GetStatuses()[0]; st.GetCode() != rlsv3.RateLimitResponse_OVER_LIMIT || st.GetDurationUntilReset() == nil {
			t.Errorf("%s: check once spent: %v, reset %v; want OVER_LIMIT", a, st.GetCode(), st.GetDurationUntilReset())
		}
	}

	// Fresh keys: a check beside a charge; the charge alone is taken.
	id += "-pair"
	resp := ask(hits("fixed_window", 0), hits("token_bucket", 2))
	if checked, charged := resp.GetStatuses()[0], resp.GetStatuses()[1]; resp.GetOverallCode() != rlsv3.RateLimitResponse_OK ||
		checked.GetLimitRemaining() != 5 || charged.GetLimitRemaining() != 3 {
		t.Fatalf("check and charge: %v, remaining %d and %d; want OK, 5 and 3", resp.GetOverallCode(), checked.GetLimitRemaining(), charged.GetLimitRemaining())
	}
	for range 5 {
		ask(hits("fixed_window", 1))
	}
	resp = ask(hits("fixed_window", 0), hits("token_bucket", 2))
	if checked, charged := resp.GetStatuses()[0], resp.GetStatuses()[1]; resp.GetOverallCode() != rlsv3.RateLimitResponse_OVER_LIMIT ||
		checked.GetCode() != rlsv3.RateLimitResponse_OVER_LIMIT || charged.GetCode() != rlsv3.RateLimitResponse_OK {
		t.Fatalf("check of a spent rule and a charge: %v (%v, %v); want OVER_LIMIT (OVER_LIMIT, OK)", resp.GetOverallCode(), checked.GetCode(), charged.GetCode())
	}
	e.Wait() // the denied charge's refund
	if st := ask(hits("token_bucket", 0)).GetStatuses()[0]; st.GetLimitRemaining() != 3 {
		t.Errorf("token_bucket after the denied pair: remaining %d, want 3 (the denied charge given back)", st.GetLimitRemaining())
	}
}

// cacheAnswersAsRedis asserts that descriptor j of onRedis was denied by
// rules[j] on Redis and that fromCache, the over-limit cache's answer to
// the same request, gives each descriptor the same code, limit and
// remaining.
func cacheAnswersAsRedis(t *testing.T, onRedis, fromCache *rlsv3.RateLimitResponse, rules ...string) {
	t.Helper()
	for j, rule := range rules {
		want, got := onRedis.GetStatuses()[j], fromCache.GetStatuses()[j]
		if want.GetCode() != rlsv3.RateLimitResponse_OVER_LIMIT || want.GetCurrentLimit().GetName() != rule {
			t.Fatalf("descriptor %d on Redis: %v by %q, want OVER_LIMIT by %s", j, want.GetCode(), want.GetCurrentLimit().GetName(), rule)
		}
		if got.GetCode() != want.GetCode() || !proto.Equal(got.GetCurrentLimit(), want.GetCurrentLimit()) || got.GetLimitRemaining() != want.GetLimitRemaining() {
			t.Errorf("descriptor %d from the cache: %v, limit %v, remaining %d; on Redis: %v, limit %v, remaining %d",
				j, got.GetCode(), got.GetCurrentLimit(), got.GetLimitRemaining(), want.GetCode(), want.GetCurrentLimit(), want.GetLimitRemaining())
		}
	}
}
