//go:build integration

package app

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"math"
	"strings"
	"testing"
	"time"

	ratelimitcommonv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"github.com/redis/go-redis/v9"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/types/known/wrapperspb"

	ratelimitv1 "kurz.dev/gen/kurz/ratelimit/v1"
	"kurz.dev/pkg/redisconn"
)

// Every bad request on the limiter's gRPC APIs (CheckQuota, ExplainQuota,
// Envoy's ShouldRateLimit; for Envoy, not the values and hits_addend a
// client can size: TestEnvoyDecidesWhatAClientCanSize) is refused with
// INVALID_ARGUMENT (a message over
// the receive bound with RESOURCE_EXHAUSTED; a message that is not valid
// protobuf with gRPC's INTERNAL "failed to unmarshal"), nothing panics, the
// server goes on serving, and no Redis key is made from the bad input: every
// request below carries, in a descriptor a rule keys on, a value holding a
// marker (or a long value whose hashed form is known), and no key on any
// master holds one afterwards. A valid request with the marker is the
// control: its key is found.
func TestBadInputIsRefusedBeforeAnyRedisKeyIsMade(t *testing.T) {
	r, rl := startFile(t)
	rls := rlsv3.NewRateLimitServiceClient(r.Conn)
	ctx := context.Background()
	marker := fmt.Sprintf("badinput%d", time.Now().UnixNano())
	// needles are what a key made from the bad input would hold: the
	// marker, or the hashed form of a value too long to keep readable.
	needles := []string{marker}
	long := func(n int) string {
		v := marker + strings.Repeat("v", n-len(marker))
		needles = append(needles, hashedValue(v))
		return v
	}
	user := func(tag string) string { return marker + "-" + tag }
	many := func(n int, v string) map[string]string {
		m := map[string]string{"user": v}
		for i := len(m); i < n; i++ {
			m[fmt.Sprintf("d%05d", i)] = "x"
		}
		return m
	}

	quotaCases := map[string]struct {
		domain   string
		desc     map[string]string
		cost     *uint32
		wantCode codes.Code
		wantMsg  string
	}{
		"empty domain":                {"", map[string]string{"user": user("a")}, nil, codes.InvalidArgument, "domain is required"},
		"unknown domain":              {"no-such-domain", map[string]string{"user": user("b")}, nil, codes.InvalidArgument, "unknown domain"},
		"33 descriptors":              {"cost", many(33, user("c")), nil, codes.InvalidArgument, "33 descriptors: at most 32"},
		"2,000 descriptors":           {"cost", many(2_000, user("d")), nil, codes.InvalidArgument, "2000 descriptors: at most 32"},
		"empty descriptor name":       {"cost", map[string]string{"user": user("e"), "": "x"}, nil, codes.InvalidArgument, "descriptor name"},
		"65-byte descriptor name":     {"cost", map[string]string{"user": user("f"), strings.Repeat("n", 65): "x"}, nil, codes.InvalidArgument, "want 1 to 64 bytes"},
		"32 KiB descriptor name":      {"cost", map[string]string{"user": user("g"), strings.Repeat("n", 32<<10): "x"}, nil, codes.InvalidArgument, "want 1 to 64 bytes"},
		"1025-byte value":             {"cost", map[string]string{"user": long(1025)}, nil, codes.InvalidArgument, "value of 1025 bytes, at most 1024"},
		"32 KiB value":                {"cost", map[string]string{"user": long(32 << 10)}, nil, codes.InvalidArgument, "at most 1024"},
		"cost 1,000,001":              {"cost", map[string]string{"user": user("h")}, ptr(uint32(1_000_001)), codes.InvalidArgument, "cost 1000001: at most 1000000"},
		"cost 4,294,967,295":          {"cost", map[string]string{"user": user("i")}, ptr(uint32(math.MaxUint32)), codes.InvalidArgument, "at most 1000000"},
		"5 MiB request":               {"cost", map[string]string{"user": user("j"), "big": strings.Repeat("b", 5<<20)}, nil, codes.ResourceExhausted, "larger than max"},
		"5 MiB request, unknown name": {"cost", map[string]string{"user": user("k"), strings.Repeat("n", 5<<20): "x"}, nil, codes.ResourceExhausted, "larger than max"},
	}
	for name, tc := range quotaCases {
		t.Run("CheckQuota/"+name, func(t *testing.T) {
			_, checkErr := rl.CheckQuota(ctx, &ratelimitv1.CheckQuotaRequest{Domain: tc.domain, Descriptors: tc.desc, Cost: tc.cost})
			_, explainErr := rl.ExplainQuota(ctx, &ratelimitv1.ExplainQuotaRequest{Domain: tc.domain, Descriptors: tc.desc, Cost: tc.cost})
			for rpc, err := range map[string]error{"CheckQuota": checkErr, "ExplainQuota": explainErr} {
				if got, msg := status.Code(err), status.Convert(err).Message(); got != tc.wantCode || !strings.Contains(msg, tc.wantMsg) {
					t.Errorf("%s: %v %.200q; want %v with %q", rpc, got, msg, tc.wantCode, tc.wantMsg)
				}
			}
		})
	}

	// Bytes no protobuf library would marshal, sent as they are.
	rawCases := map[string]struct {
		req      []byte
		wantCode codes.Code
		wantMsg  string
	}{
		// A uint32 sent as the ten-byte varint of -1 decodes as 2^32-1.
		"cost -1 on the wire": {rawCheckQuota("cost", map[string]string{"user": user("l")}, protowire.AppendVarint(nil, uint64(math.MaxUint64))),
			codes.InvalidArgument, "cost 4294967295: at most 1000000"},
		// gRPC's status-code spec answers a request that does not parse
		// with INTERNAL; the message is gRPC's, nothing of the service's.
		"invalid UTF-8 in a value": {rawCheckQuota("cost", map[string]string{"user": user("m") + "\xff"}, nil),
			codes.Internal, "grpc: failed to unmarshal the received message"},
		"truncated message": {rawCheckQuota("cost", map[string]string{"user": user("n")}, nil)[:20],
			codes.Internal, "grpc: failed to unmarshal the received message"},
	}
	for name, tc := range rawCases {
		t.Run("raw CheckQuota/"+name, func(t *testing.T) {
			var resp []byte
			err := r.Conn.Invoke(ctx, ratelimitv1.RateLimitService_CheckQuota_FullMethodName, tc.req, &resp, grpc.ForceCodec(rawCodec{}))
			if got, msg := status.Code(err), status.Convert(err).Message(); got != tc.wantCode || !strings.Contains(msg, tc.wantMsg) {
				t.Errorf("%v %.200q; want %v with %q", got, msg, tc.wantCode, tc.wantMsg)
			}
		})
	}

	entries := func(kv ...string) *ratelimitcommonv3.RateLimitDescriptor {
		d := &ratelimitcommonv3.RateLimitDescriptor{}
		for i := 0; i+1 < len(kv); i += 2 {
			d.Entries = append(d.Entries, &ratelimitcommonv3.RateLimitDescriptor_Entry{Key: kv[i], Value: kv[i+1]})
		}
		return d
	}
	key := func(tag string) *ratelimitcommonv3.RateLimitDescriptor { return entries("api_key", user(tag)) }
	wide := func(n int, tag string) *ratelimitcommonv3.RateLimitDescriptor {
		d := key(tag)
		for i := 1; i < n; i++ {
			d.Entries = append(d.Entries, &ratelimitcommonv3.RateLimitDescriptor_Entry{Key: fmt.Sprintf("d%05d", i), Value: "x"})
		}
		return d
	}
	var thirtyThree []*ratelimitcommonv3.RateLimitDescriptor
	for i := range 33 {
		thirtyThree = append(thirtyThree, key(fmt.Sprintf("env-c%d", i)))
	}
	withHits := func(d *ratelimitcommonv3.RateLimitDescriptor, hits uint64, negative bool) *ratelimitcommonv3.RateLimitDescriptor {
		d.HitsAddend, d.IsNegativeHits = wrapperspb.UInt64(hits), negative
		return d
	}
	envoyCases := map[string]struct {
		req      *rlsv3.RateLimitRequest
		wantCode codes.Code
		wantMsg  string
	}{
		"empty domain":               {&rlsv3.RateLimitRequest{Descriptors: descs(key("env-a"))}, codes.InvalidArgument, "domain is required"},
		"no descriptors":             {&rlsv3.RateLimitRequest{Domain: "envoy"}, codes.InvalidArgument, "at least one descriptor"},
		"33 descriptors":             {&rlsv3.RateLimitRequest{Domain: "envoy", Descriptors: thirtyThree}, codes.InvalidArgument, "33 descriptors: at most 32"},
		"33 entries in a descriptor": {&rlsv3.RateLimitRequest{Domain: "envoy", Descriptors: descs(wide(33, "env-d"))}, codes.InvalidArgument, "33 descriptors: at most 32"},
		"2,000 entries":              {&rlsv3.RateLimitRequest{Domain: "envoy", Descriptors: descs(wide(2_000, "env-e"))}, codes.InvalidArgument, "at most 32"},
		"empty entry key":            {&rlsv3.RateLimitRequest{Domain: "envoy", Descriptors: descs(entries("api_key", user("env-f"), "", "x"))}, codes.InvalidArgument, "descriptor name"},
		"65-byte entry key":          {&rlsv3.RateLimitRequest{Domain: "envoy", Descriptors: descs(entries("api_key", user("env-g"), strings.Repeat("n", 65), "x"))}, codes.InvalidArgument, "want 1 to 64 bytes"},
		"32 KiB entry key":           {&rlsv3.RateLimitRequest{Domain: "envoy", Descriptors: descs(entries("api_key", user("env-h"), strings.Repeat("n", 32<<10), "x"))}, codes.InvalidArgument, "want 1 to 64 bytes"},
		"is_negative_hits":           {&rlsv3.RateLimitRequest{Domain: "envoy", Descriptors: descs(withHits(key("env-k"), 1, true))}, codes.InvalidArgument, "is_negative_hits is not supported"},
		"5 MiB request":              {&rlsv3.RateLimitRequest{Domain: "envoy", Descriptors: descs(entries("api_key", user("env-n"), "big", strings.Repeat("b", 5<<20)))}, codes.ResourceExhausted, "larger than max"},
	}
	for name, tc := range envoyCases {
		t.Run("ShouldRateLimit/"+name, func(t *testing.T) {
			_, err := rls.ShouldRateLimit(ctx, tc.req)
			if got, msg := status.Code(err), status.Convert(err).Message(); got != tc.wantCode || !strings.Contains(msg, tc.wantMsg) {
				t.Errorf("%v %.200q; want %v with %q", got, msg, tc.wantCode, tc.wantMsg)
			}
		})
	}

	rdb := clusterClient(t)
	for _, n := range needles {
		if keys := scanCluster(t, rdb, n); len(keys) > 0 {
			t.Errorf("keys made from refused input (holding %q): %q", n, keys)
		}
	}

	// The server still serves, and the scan does see keys it writes.
	control := user("control")
	resp, err := rl.CheckQuota(ctx, &ratelimitv1.CheckQuotaRequest{Domain: "cost", Descriptors: map[string]string{"user": control}})
	if err != nil || !resp.GetAllowed() {
		t.Fatalf("valid request after the bad ones: %v %v; want allowed", resp, err)
	}
	if keys, want := scanCluster(t, rdb, marker), "rl:{cost:per-user:"+control+"}"; len(keys) != 1 || keys[0] != want {
		t.Errorf("keys holding the marker after the control request: %q; want [%q]", keys, want)
	}
}

// Descriptors that are empty or missing are not bad input but leave the
// request outside the rules that key on them, as the README promises ("a
// request without one is not subject to the rule"): allowed with source
// NO_RULE, no decision, and no key, whether the empty value is the user of
// a per-user rule or the tenant of a rule sharded by tenant. Through
// Envoy's API an entry given empty is given (a header present but empty):
// limited under "", as envoyproxy/ratelimit limits it.
func TestEmptyOrMissingDescriptorLeavesTheRequestOutsideTheRule(t *testing.T) {
	r, rl := startFile(t)
	rls := rlsv3.NewRateLimitServiceClient(r.Conn)
	ctx := context.Background()
	marker := unique(t)
	for name, tc := range map[string]struct {
		domain string
		desc   map[string]string
	}{
		"empty user":                            {"cost", map[string]string{"user": ""}},
		"no user":                               {"cost", map[string]string{"other": marker}},
		"no tenant, rules keyed by tenant":      {"quota.tenant", map[string]string{"api_key": marker}},
		"empty tenant, rules keyed by tenant":   {"quota.tenant", map[string]string{"tenant": "", "api_key": marker}},
		"no descriptors, rules keyed by tenant": {"quota.tenant", nil},
		"empty tenant and api_key":              {"quota", map[string]string{"tenant": "", "api_key": ""}},
	} {
		t.Run(name, func(t *testing.T) {
			for range 3 {
				resp, err := rl.CheckQuota(ctx, &ratelimitv1.CheckQuotaRequest{Domain: tc.domain, Descriptors: tc.desc})
				if err != nil {
					t.Fatalf("CheckQuota: %v", err)
				}
				if !resp.GetAllowed() || resp.GetSource() != ratelimitv1.DecisionSource_DECISION_SOURCE_NO_RULE || len(resp.GetDecisions()) != 0 {
					t.Errorf("allowed=%v source %v with %d decisions; want allowed, NO_RULE, none", resp.GetAllowed(), resp.GetSource(), len(resp.GetDecisions()))
				}
			}
		})
	}
	t.Run("Envoy: empty value, and no entries", func(t *testing.T) {
		// Every run's empty api_key shares one counter: start it afresh.
		const emptyKey = "rl:{envoy:per-api-key:}"
		rdb := clusterClient(t)
		if err := rdb.Del(ctx, emptyKey).Err(); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = rdb.Del(context.Background(), emptyKey).Err() })
		resp, err := rls.ShouldRateLimit(ctx, &rlsv3.RateLimitRequest{Domain: "envoy", Descriptors: []*ratelimitcommonv3.RateLimitDescriptor{
			{Entries: []*ratelimitcommonv3.RateLimitDescriptor_Entry{{Key: "api_key", Value: ""}}},
			{},
		}})
		if err != nil {
			t.Fatalf("ShouldRateLimit: %v", err)
		}
		if resp.GetOverallCode() != rlsv3.RateLimitResponse_OK || len(resp.GetStatuses()) != 2 {
			t.Fatalf("overall %v with %d statuses; want OK with 2", resp.GetOverallCode(), len(resp.GetStatuses()))
		}
		if st := resp.GetStatuses()[0]; st.GetCode() != rlsv3.RateLimitResponse_OK || st.GetCurrentLimit().GetName() != "per-api-key" {
			t.Errorf("status 0 (api_key empty): %v limit %v; want OK by per-api-key", st.GetCode(), st.GetCurrentLimit())
		}
		if st := resp.GetStatuses()[1]; st.GetCode() != rlsv3.RateLimitResponse_OK || st.GetCurrentLimit() != nil {
			t.Errorf("status 1 (no entries): %v limit %v; want OK with no limit (no rule applies)", st.GetCode(), st.GetCurrentLimit())
		}
	})
	rdb := clusterClient(t)
	if keys := scanCluster(t, rdb, marker); len(keys) > 0 {
		t.Errorf("keys made for requests no rule applies to: %q", keys)
	}
	for _, k := range []string{"rl:{cost:per-user:}", "rl:{quota:per-key:}", "rl:{quota:per-tenant:}"} {
		if n, err := rdb.Exists(ctx, k).Result(); err != nil || n != 0 {
			t.Errorf("EXISTS %s: %d %v; want 0 (an empty value keys nothing)", k, n, err)
		}
	}
}

// descs lists descriptors.
func descs(ds ...*ratelimitcommonv3.RateLimitDescriptor) []*ratelimitcommonv3.RateLimitDescriptor {
	return ds
}

// hashedValue is how a key holds a descriptor value over 64 bytes (see
// TestCraftedValuesCannotCollide): '#' and the first 16 bytes of its
// SHA-256 in hex.
func hashedValue(v string) string {
	sum := sha256.Sum256([]byte(v))
	return "#" + hex.EncodeToString(sum[:16])
}

// clusterClient connects to the Redis Cluster the limiter under test uses,
// with socket timeouts roomy enough for a SCAN of a whole master.
func clusterClient(t *testing.T) *redis.ClusterClient {
	t.Helper()
	cfg := load(t, nil).Redis
	cfg.ReadTimeout, cfg.WriteTimeout = 5*time.Second, 5*time.Second
	rdb, err := redisconn.New(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = rdb.Close() })
	return rdb
}

// scanCluster returns every key on every master that contains needle
// (letters, digits, '-' and '#' only: no glob characters).
func scanCluster(t *testing.T, rdb *redis.ClusterClient, needle string) []string {
	t.Helper()
	var found []string
	ch := make(chan []string, 16)
	err := rdb.ForEachMaster(context.Background(), func(ctx context.Context, m *redis.Client) error {
		var keys []string
		iter := m.Scan(ctx, 0, "*"+needle+"*", 1000).Iterator()
		for iter.Next(ctx) {
			keys = append(keys, iter.Val())
		}
		ch <- keys
		return iter.Err()
	})
	close(ch)
	if err != nil {
		t.Fatalf("scan for %q: %v", needle, err)
	}
	for keys := range ch {
		found = append(found, keys...)
	}
	return found
}

// rawCheckQuota encodes a CheckQuotaRequest by hand; cost, when not nil, is
// the encoded varint of field 3.
func rawCheckQuota(domain string, desc map[string]string, cost []byte) []byte {
	b := protowire.AppendTag(nil, 1, protowire.BytesType)
	b = protowire.AppendString(b, domain)
	for k, v := range desc {
		var e []byte
		e = protowire.AppendTag(e, 1, protowire.BytesType)
		e = protowire.AppendString(e, k)
		e = protowire.AppendTag(e, 2, protowire.BytesType)
		e = protowire.AppendString(e, v)
		b = protowire.AppendTag(b, 2, protowire.BytesType)
		b = protowire.AppendBytes(b, e)
	}
	if cost != nil {
		b = protowire.AppendTag(b, 3, protowire.VarintType)
		b = append(b, cost...)
	}
	return b
}

// rawCodec sends and receives messages as the bytes they are, under the
// proto content type.
type rawCodec struct{}

func (rawCodec) Marshal(v any) ([]byte, error) { return v.([]byte), nil }

func (rawCodec) Unmarshal(data []byte, v any) error {
	*v.(*[]byte) = append([]byte(nil), data...)
	return nil
}

func (rawCodec) Name() string { return "proto" }
