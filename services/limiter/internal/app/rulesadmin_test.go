//go:build integration

package app

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"

	limiterv1 "kurz.dev/gen/kurz/limiter/v1"
	ratelimitv1 "kurz.dev/gen/kurz/ratelimit/v1"
	"kurz.dev/pkg/rpcerr"
	"kurz.dev/pkg/testkit/servertest"
	"kurz.dev/services/limiter/internal/rulesadmin"
)

// adminClient dials r's RulesAdminService, signing every call (streams
// too) with the test services' key when signed.
func adminClient(t *testing.T, r *servertest.Running, signed bool) limiterv1.RulesAdminServiceClient {
	t.Helper()
	opts := []grpc.DialOption{grpc.WithTransportCredentials(insecure.NewCredentials())}
	if signed {
		keys := servertest.ServiceAuthKeys()
		opts = append(opts, keys.DialOption(), keys.StreamDialOption())
	}
	conn, err := grpc.NewClient(r.Server.GRPCAddr(), opts...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = conn.Close() })
	return limiterv1.NewRulesAdminServiceClient(conn)
}

// applyRules sends file to ApplyRules in chunks, as the gateway does.
func applyRules(ctx context.Context, c limiterv1.RulesAdminServiceClient, file string, first *limiterv1.ApplyRulesRequest) (*limiterv1.ApplyRulesResponse, error) {
	stream, err := c.ApplyRules(ctx)
	if err != nil {
		return nil, err
	}
	msg := first
	for rest := []byte(file); ; {
		n := min(len(rest), rulesadmin.MaxChunk)
		msg.Chunk, rest = rest[:n], rest[n:]
		if err := stream.Send(msg); err != nil {
			break // the answer says why
		}
		if len(rest) == 0 {
			break
		}
		msg = &limiterv1.ApplyRulesRequest{}
	}
	return stream.CloseAndRecv()
}

// The rules admin API answers only signed calls, while the decisions stay
// open to unsigned ones (Envoy's, the services').
func TestRulesAdminRefusesUnsignedCallers(t *testing.T) {
	r, _ := startFile(t)
	ctx := context.Background()
	unsigned := adminClient(t, r, false)
	if _, err := unsigned.GetRules(ctx, &limiterv1.GetRulesRequest{}); status.Code(err) != codes.Unauthenticated {
		t.Errorf("unsigned GetRules: %v, want UNAUTHENTICATED", err)
	}
	if _, err := applyRules(ctx, unsigned, "domains: {}\n", &limiterv1.ApplyRulesRequest{DryRun: true}); status.Code(err) != codes.Unauthenticated {
		t.Errorf("unsigned ApplyRules: %v, want UNAUTHENTICATED", err)
	}
	conn, err := grpc.NewClient(r.Server.GRPCAddr(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	if _, err := ratelimitv1.NewRateLimitServiceClient(conn).CheckQuota(ctx, &ratelimitv1.CheckQuotaRequest{
		Domain: "quota", Descriptors: map[string]string{"tenant": unique(t), "api_key": "k"}, Cost: ptr(uint32(0)),
	}); err != nil {
		t.Errorf("unsigned CheckQuota: %v, want it decided", err)
	}
	// Signed, a limiter on a rules file shows the file and refuses to
	// change it, naming it.
	signed := adminClient(t, r, true)
	got, err := signed.GetRules(ctx, &limiterv1.GetRulesRequest{})
	if err != nil || got.GetSource() != "file" || !strings.Contains(got.GetYaml(), "domains:") || got.GetEtag() == "" {
		t.Fatalf("signed GetRules of a file limiter: %v, %v", got, err)
	}
	_, err = applyRules(ctx, signed, got.GetYaml(), &limiterv1.ApplyRulesRequest{})
	if info, _, _ := rpcerr.Details(err); status.Code(err) != codes.FailedPrecondition || info.GetReason() != rulesadmin.ReasonRulesFromFile ||
		!strings.Contains(err.Error(), rulesFile(t)+" (KURZ_LIMITER_RULES_SOURCE=file): edit it") {
		t.Errorf("apply to a file limiter: %v; want FAILED_PRECONDITION naming the file", err)
	}
}

// An applied limit is the one the limiter decides by after the tables'
// NOTIFY (the periodic refresh is an hour away); a file over 1 MiB is
// refused whole.
func TestAppliedRuleDecidesAfterTheReload(t *testing.T) {
	r, db := startPostgresServer(t)
	rl := ratelimitv1.NewRateLimitServiceClient(r.Conn)
	ctx := context.Background()
	// A domain of this test's own: the stack's limiters and other tests
	// share the tables.
	domain := strings.ToLower(unique(t))
	t.Cleanup(func() {
		if _, err := db.Exec(context.Background(), `DELETE FROM rl_domains WHERE domain = $1`, domain); err != nil {
			t.Errorf("clean up: %v", err)
		}
	})
	admin := adminClient(t, r, true)
	rules := func(limit int) string {
		return fmt.Sprintf("domains:\n  %s:\n    rules:\n      - {name: per-ip, key: [ip], algorithm: token_bucket, limit: %d, window: 1s, failure_mode: open}\n", domain, limit)
	}
	if _, err := applyRules(ctx, admin, rules(10), &limiterv1.ApplyRulesRequest{}); err != nil {
		t.Fatal(err)
	}
	limitIs := func(want int64) bool {
		return servertest.Eventually(5*time.Second, func() bool {
			resp, err := rl.ExplainQuota(ctx, &ratelimitv1.ExplainQuotaRequest{Domain: domain, Descriptors: map[string]string{"ip": "192.0.2.7"}, Cost: ptr(uint32(0))})
			return err == nil && len(resp.GetRules()) == 1 && resp.GetRules()[0].GetDecision().GetLimit() == want
		})
	}
	if !limitIs(10) {
		t.Fatalf("the applied rule never decided within 5 s")
	}
	res, err := applyRules(ctx, admin, rules(25), &limiterv1.ApplyRulesRequest{})
	if err != nil || len(res.GetChanges()) != 1 || res.GetChanges()[0].GetName() != domain+"/per-ip" || strings.Join(res.GetChanges()[0].GetFields(), ",") != "limit" {
		t.Fatalf("apply of a new limit: %v, %v", res, err)
	}
	if !limitIs(25) {
		t.Errorf("the limit applied was not in force within 5 s")
	}
	_, err = applyRules(ctx, admin, rules(30)+"#"+strings.Repeat("x", 1<<20), &limiterv1.ApplyRulesRequest{})
	if status.Code(err) != codes.InvalidArgument || !strings.Contains(err.Error(), "over 1048576 bytes") {
		t.Errorf("a file over 1 MiB: %v; want INVALID_ARGUMENT", err)
	}
}
