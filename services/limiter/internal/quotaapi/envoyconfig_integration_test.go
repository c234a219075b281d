//go:build integration

package quotaapi

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	ratelimitcommonv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"github.com/redis/go-redis/v9"
	"go.opentelemetry.io/otel/metric/noop"

	"kurz.dev/pkg/clientip"
	"kurz.dev/pkg/config"
	"kurz.dev/pkg/redisconn"
	"kurz.dev/services/limiter/internal/ratelimit"
	"kurz.dev/services/limiter/internal/rulestore"
)

// An envoyproxy/ratelimit configuration, loaded as is through the file
// source (a ConfigMap-style directory), is enforced by ShouldRateLimit on
// the stack's Redis Cluster as envoyproxy/ratelimit enforces it: a nested
// descriptor and its parent each count their own descriptor; a value's
// limit replaces its key's; unlimited is unlimited; shadow mode never
// denies; every limit exactly (3 an hour: the 4th is OVER_LIMIT). The same
// requests against envoyproxy/ratelimit's own service_cmd (v1.4.1-pre,
// by hand) gave the same codes and remaining counts.
func TestEnvoyConfigFileIsEnforcedAsEnvoyproxyRatelimitEnforcesIt(t *testing.T) {
	// A domain of its own: every counter starts at zero.
	domain := fmt.Sprintf("envoyconf-%d", time.Now().UnixNano())
	s := envoyFileService(t, `domain: `+domain+`
descriptors:
  - key: generic_key
    value: api
    rate_limit: {unit: hour, requests_per_unit: 5}
    descriptors:
      - key: remote_address
        rate_limit: {unit: hour, requests_per_unit: 3}
  - key: user
    rate_limit: {unit: hour, requests_per_unit: 2}
  - key: user
    value: vip
    detailed_metric: true
    rate_limit: {unit: hour, requests_per_unit: 4}
  - key: user
    value: free
    rate_limit: {unlimited: true}
  - key: plan
    value: trial
    shadow_mode: true
    rate_limit: {unit: hour, requests_per_unit: 1}
`)

	type entry = ratelimitcommonv3.RateLimitDescriptor_Entry
	// expect sends one descriptor and checks its code, current limit
	// (0: none) and remaining.
	expect := func(step string, entries []*entry, code rlsv3.RateLimitResponse_Code, limit, remaining uint32) {
		t.Helper()
		resp, err := s.ShouldRateLimit(context.Background(), &rlsv3.RateLimitRequest{Domain: domain,
			Descriptors: []*ratelimitcommonv3.RateLimitDescriptor{{Entries: entries}}})
		if err != nil {
			t.Fatalf("%s: %v", step, err)
		}
		st := resp.GetStatuses()[0]
		if resp.GetOverallCode() != code || st.GetCurrentLimit().GetRequestsPerUnit() != limit || code == rlsv3.RateLimitResponse_OK && st.GetLimitRemaining() != remaining {
			t.Fatalf("%s: %v, limit %d, remaining %d; want %v, limit %d, remaining %d", step,
				resp.GetOverallCode(), st.GetCurrentLimit().GetRequestsPerUnit(), st.GetLimitRemaining(), code, limit, remaining)
		}
		if limit > 0 && st.GetCurrentLimit().GetUnit() != rlsv3.RateLimitResponse_RateLimit_HOUR {
			t.Fatalf("%s: unit %v, want HOUR", step, st.GetCurrentLimit().GetUnit())
		}
	}
	ok, over := rlsv3.RateLimitResponse_OK, rlsv3.RateLimitResponse_OVER_LIMIT
	api := &entry{Key: "generic_key", Value: "api"}
	ip := func(a string) []*entry { return []*entry{api, {Key: "remote_address", Value: a}} }

	for i := range uint32(3) {
		expect(fmt.Sprintf("api, 10.0.0.9, request %d", i+1), ip("10.0.0.9"), ok, 3, 2-i)
	}
	expect("api, 10.0.0.9, request 4", ip("10.0.0.9"), over, 3, 0)
	expect("api, 10.0.0.10: a counter of its own", ip("10.0.0.10"), ok, 3, 2)
	expect("api alone: its own descriptor, untouched by the nested ones", []*entry{api}, ok, 5, 4)

	for i := range uint32(2) {
		expect(fmt.Sprintf("user alice, request %d", i+1), []*entry{{Key: "user", Value: "alice"}}, ok, 2, 1-i)
	}
	expect("user alice, request 3", []*entry{{Key: "user", Value: "alice"}}, over, 2, 0)
	for i := range uint32(4) {
		expect(fmt.Sprintf("user vip, request %d: its value's limit, not its key's", i+1), []*entry{{Key: "user", Value: "vip"}}, ok, 4, 3-i)
	}
	expect("user vip, request 5", []*entry{{Key: "user", Value: "vip"}}, over, 4, 0)
	for i := range 5 {
		resp, err := s.ShouldRateLimit(context.Background(), &rlsv3.RateLimitRequest{Domain: domain,
			Descriptors: []*ratelimitcommonv3.RateLimitDescriptor{{Entries: []*entry{{Key: "user", Value: "free"}}}}})
		if err != nil || resp.GetOverallCode() != ok {
			t.Fatalf("user free (unlimited), request %d: %v, %v; want OK", i+1, resp.GetOverallCode(), err)
		}
	}
	for i := range 3 {
		expect(fmt.Sprintf("plan trial (shadow), request %d", i+1), []*entry{{Key: "plan", Value: "trial"}}, ok, 1, 0)
	}
	expect("a descriptor no path of the file has", []*entry{{Key: "plan", Value: "pro"}}, ok, 0, 0)
}

// An unlimited descriptor is decided without Redis: OK, no current
// limit, 4294967295 remaining (envoyproxy/ratelimit's status), and no key
// written for it, where the shadow rule it used to be translated into
// wrote rl:{<domain>:user_free:free} for a second at every request. A
// descriptor beside it in the request is limited as ever.
func TestEnvoyUnlimitedDescriptorWritesNoRedisKey(t *testing.T) {
	domain := fmt.Sprintf("envoyconf-unlimited-%d", time.Now().UnixNano())
	s := envoyFileService(t, `domain: `+domain+`
descriptors:
  - key: user
    rate_limit: {unit: hour, requests_per_unit: 2}
  - key: user
    value: free
    rate_limit: {unlimited: true}
`)
	type entry = ratelimitcommonv3.RateLimitDescriptor_Entry
	free := &ratelimitcommonv3.RateLimitDescriptor{Entries: []*entry{{Key: "user", Value: "free"}}}
	bob := &ratelimitcommonv3.RateLimitDescriptor{Entries: []*entry{{Key: "user", Value: "bob"}}}
	for i := range 3 {
		resp, err := s.ShouldRateLimit(context.Background(), &rlsv3.RateLimitRequest{Domain: domain,
			Descriptors: []*ratelimitcommonv3.RateLimitDescriptor{free, bob}})
		if err != nil {
			t.Fatal(err)
		}
		st, other := resp.GetStatuses()[0], resp.GetStatuses()[1]
		if st.GetCode() != rlsv3.RateLimitResponse_OK || st.GetCurrentLimit() != nil || st.GetLimitRemaining() != 1<<32-1 {
			t.Errorf("request %d, user free: %v; want OK, no current limit, 4294967295 remaining", i+1, st)
		}
		// bob's limit of 2 an hour decides the request: the third is over.
		wantCode := rlsv3.RateLimitResponse_OK
		if i == 2 {
			wantCode = rlsv3.RateLimitResponse_OVER_LIMIT
		}
		if resp.GetOverallCode() != wantCode || other.GetCode() != wantCode || other.GetCurrentLimit().GetRequestsPerUnit() != 2 {
			t.Errorf("request %d: %v, user bob %v; want %v, bob limited at 2 an hour", i+1, resp.GetOverallCode(), other, wantCode)
		}
	}
	var rc redisconn.Config
	if err := config.Load(&rc); err != nil {
		t.Fatal(err)
	}
	// The look below scans every master's keyspace, which a `make bench`
	// before leaves with a million keys: on a busy machine one SCAN took
	// longer than the service's 100 ms read timeout.
	rc.ReadTimeout = max(rc.ReadTimeout, 5*time.Second)
	rdb, err := redisconn.New(context.Background(), rc)
	if err != nil {
		t.Fatal(err)
	}
	defer rdb.Close()
	ctx := context.Background()
	if n, err := rdb.Exists(ctx, "rl:{"+domain+":user_free:free}").Result(); err != nil || n != 0 {
		t.Errorf("EXISTS the shadow rule's old key: %d, %v; want 0", n, err)
	}
	// Nothing else of the domain but bob's counter either.
	var mu sync.Mutex
	var keys []string
	if err := rdb.ForEachMaster(ctx, func(ctx context.Context, node *redis.Client) error {
		iter := node.Scan(ctx, 0, "rl:{"+domain+":*", 1000).Iterator()
		for iter.Next(ctx) {
			mu.Lock()
			keys = append(keys, iter.Val())
			mu.Unlock()
		}
		return iter.Err()
	}); err != nil {
		t.Fatal(err)
	}
	if want := "rl:{" + domain + ":user:bob}"; len(keys) != 1 || keys[0] != want {
		t.Errorf("the domain's keys: %v; want %s alone", keys, want)
	}
}

// envoyFileService serves ShouldRateLimit on the stack's Redis Cluster with
// the envoyproxy/ratelimit file, loaded through the file source as a
// ConfigMap-style directory.
func envoyFileService(t *testing.T, file string) *EnvoyService {
	t.Helper()
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "config.yaml"), []byte(file), 0o644); err != nil {
		t.Fatal(err)
	}
	cfg, err := rulestore.FileSource{Path: dir}.Load(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	rs, err := ratelimit.Compile(cfg)
	if err != nil {
		t.Fatal(err)
	}
	var rc redisconn.Config
	if err := config.Load(&rc); err != nil {
		t.Fatal(err)
	}
	rdb, err := redisconn.New(context.Background(), rc)
	if err != nil {
		t.Fatalf("local Redis Cluster: %v", err)
	}
	t.Cleanup(func() { _ = rdb.Close() })
	e, err := ratelimit.NewEngine(rdb, rs, ratelimit.Options{Timeout: 5 * time.Second},
		slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelError})), noop.NewMeterProvider())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(e.Wait)
	return NewEnvoy(e, HeadersDraft, clientip.Keying{})
}

// A descriptor with a key twice is limited by nothing, as
// envoyproxy/ratelimit's walk limits it (no path of its files has a key
// twice), while the other descriptors of the request keep their limits.
// Folded into one value per key, (user=a, user=b) was limited as user b.
func TestEnvoyDescriptorWithAKeyTwiceIsNotLimited(t *testing.T) {
	domain := fmt.Sprintf("envoyconf-twice-%d", time.Now().UnixNano())
	s := envoyFileService(t, `domain: `+domain+`
descriptors:
  - key: user
    rate_limit: {unit: hour, requests_per_unit: 1}
`)
	type entry = ratelimitcommonv3.RateLimitDescriptor_Entry
	twice := &ratelimitcommonv3.RateLimitDescriptor{Entries: []*entry{{Key: "user", Value: "a"}, {Key: "user", Value: "b"}}}
	once := &ratelimitcommonv3.RateLimitDescriptor{Entries: []*entry{{Key: "user", Value: "c"}}}
	for i := range 3 {
		resp, err := s.ShouldRateLimit(context.Background(), &rlsv3.RateLimitRequest{Domain: domain,
			Descriptors: []*ratelimitcommonv3.RateLimitDescriptor{twice, once}})
		if err != nil {
			t.Fatal(err)
		}
		st := resp.GetStatuses()
		if st[0].GetCode() != rlsv3.RateLimitResponse_OK || st[0].GetCurrentLimit() != nil {
			t.Fatalf("request %d: (user=a, user=b) %v, limit %v; want OK, no limit", i+1, st[0].GetCode(), st[0].GetCurrentLimit())
		}
		want := rlsv3.RateLimitResponse_OK
		if i > 0 {
			want = rlsv3.RateLimitResponse_OVER_LIMIT
		}
		if st[1].GetCode() != want || st[1].GetCurrentLimit().GetRequestsPerUnit() != 1 || resp.GetOverallCode() != want {
			t.Fatalf("request %d: (user=c) %v, limit %v, overall %v; want %v, limit 1", i+1, st[1].GetCode(), st[1].GetCurrentLimit(), resp.GetOverallCode(), want)
		}
	}
	resp, err := s.ShouldRateLimit(context.Background(), &rlsv3.RateLimitRequest{Domain: domain,
		Descriptors: []*ratelimitcommonv3.RateLimitDescriptor{{Entries: []*entry{{Key: "user", Value: "b"}}}}})
	if err != nil {
		t.Fatal(err)
	}
	if st := resp.GetStatuses()[0]; st.GetCode() != rlsv3.RateLimitResponse_OK || st.GetLimitRemaining() != 0 || st.GetCurrentLimit().GetRequestsPerUnit() != 1 {
		t.Fatalf("user b alone after (user=a, user=b) three times: %v, remaining %d; want OK, remaining 0 (its first hit)", st.GetCode(), st.GetLimitRemaining())
	}
}

// Wildcard values, loaded from an envoyproxy/ratelimit file, are enforced
// by ShouldRateLimit on the stack's Redis Cluster as envoyproxy/ratelimit
// enforces them: two values under one wildcard each have their own
// counter (its cache key holds the value), unless the wildcard has
// share_threshold, and then they share one (its cache key holds the
// pattern); an exact value beside the wildcard keeps its own limit. Both
// wildcards were refused before kurz had prefixes.
func TestEnvoyWildcardValuesCountPerValueUnlessTheyShareThreshold(t *testing.T) {
	domain := fmt.Sprintf("envoyconf-wild-%d", time.Now().UnixNano())
	s := envoyFileService(t, `domain: `+domain+`
descriptors:
  - key: path
    value: /api/special
    rate_limit: {unit: hour, requests_per_unit: 5}
  - key: path
    value: /api/*
    rate_limit: {unit: hour, requests_per_unit: 2}
  - key: path
    value: /files/*
    share_threshold: true
    rate_limit: {unit: hour, requests_per_unit: 2}
`)
	code := func(path string) rlsv3.RateLimitResponse_Code {
		t.Helper()
		resp, err := s.ShouldRateLimit(context.Background(), &rlsv3.RateLimitRequest{Domain: domain,
			Descriptors: []*ratelimitcommonv3.RateLimitDescriptor{{Entries: []*ratelimitcommonv3.RateLimitDescriptor_Entry{{Key: "path", Value: path}}}}})
		if err != nil {
			t.Fatalf("%s: %v", path, err)
		}
		return resp.GetOverallCode()
	}
	ok, over := rlsv3.RateLimitResponse_OK, rlsv3.RateLimitResponse_OVER_LIMIT
	for i, step := range []struct {
		path string
		want rlsv3.RateLimitResponse_Code
	}{
		// Per value: /api/a's 2 an hour leave /api/b's untouched.
		{"/api/a", ok}, {"/api/a", ok}, {"/api/a", over},
		{"/api/b", ok}, {"/api/b", ok}, {"/api/b", over},
		// The exact value beats the wildcard: its own 5.
		{"/api/special", ok}, {"/api/special", ok}, {"/api/special", ok},
		// Shared: a.pdf and b.csv draw on one 2 an hour.
		{"/files/a.pdf", ok}, {"/files/b.csv", ok}, {"/files/c.txt", over}, {"/files/a.pdf", over},
		// A path under no wildcard is limited by nothing.
		{"/other", ok}, {"/other", ok}, {"/other", ok},
	} {
		if got := code(step.path); got != step.want {
			t.Fatalf("step %d, %s: %v, want %v", i, step.path, got, step.want)
		}
	}
}
