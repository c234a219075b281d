package quota_test

import (
	"context"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"log/slog"
	"net"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"go.opentelemetry.io/otel/metric/noop"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/durationpb"

	ratelimitv1 "kurz.dev/gen/kurz/ratelimit/v1"
	"kurz.dev/pkg/quota"
	"kurz.dev/pkg/ratelimitfields"
	"kurz.dev/pkg/testkit/metrictest"
	"kurz.dev/pkg/testkit/servertest"
)

// fakeLimiter answers CheckQuota with check; it stands in for the limiter,
// whose own tests run against Redis.
type fakeLimiter struct {
	ratelimitv1.UnimplementedRateLimitServiceServer
	check   func(context.Context, *ratelimitv1.CheckQuotaRequest) (*ratelimitv1.CheckQuotaResponse, error)
	batches *atomic.Int64 // CheckQuotas calls
}

func (f *fakeLimiter) CheckQuota(ctx context.Context, req *ratelimitv1.CheckQuotaRequest) (*ratelimitv1.CheckQuotaResponse, error) {
	return f.check(ctx, req)
}

// CheckQuotas answers each check with check; the first error fails the call.
func (f *fakeLimiter) CheckQuotas(ctx context.Context, req *ratelimitv1.CheckQuotasRequest) (*ratelimitv1.CheckQuotasResponse, error) {
	f.batches.Add(1)
	resp := &ratelimitv1.CheckQuotasResponse{}
	for _, c := range req.GetChecks() {
		r, err := f.check(ctx, c)
		if err != nil {
			return nil, err
		}
		resp.Results = append(resp.Results, r)
	}
	return resp, nil
}

// serve runs a fake limiter on a loopback port and returns its address.
func serve(t *testing.T, check func(context.Context, *ratelimitv1.CheckQuotaRequest) (*ratelimitv1.CheckQuotaResponse, error)) string {
	t.Helper()
	addr, _ := serveCounting(t, check)
	return addr
}

// serveCounting is serve that also returns the count of CheckQuotas calls.
func serveCounting(t *testing.T, check func(context.Context, *ratelimitv1.CheckQuotaRequest) (*ratelimitv1.CheckQuotaResponse, error)) (string, *atomic.Int64) {
	t.Helper()
	batches := new(atomic.Int64)
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := grpc.NewServer()
	ratelimitv1.RegisterRateLimitServiceServer(srv, &fakeLimiter{check: check, batches: batches})
	go func() { _ = srv.Serve(lis) }()
	t.Cleanup(srv.Stop)
	return lis.Addr().String(), batches
}

func newClient(t *testing.T, addr string, timeout time.Duration) *quota.Client {
	t.Helper()
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = conn.Close() })
	c, err := quota.New(conn, timeout, slog.New(slog.DiscardHandler), noop.NewMeterProvider())
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// newObservedClient is newClient whose log lines and metrics the test
// reads.
func newObservedClient(t *testing.T, addr string) (*quota.Client, *servertest.SyncBuffer, *sdkmetric.ManualReader) {
	t.Helper()
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = conn.Close() })
	logs := new(servertest.SyncBuffer)
	reader := sdkmetric.NewManualReader()
	c, err := quota.New(conn, 5*time.Second, slog.New(slog.NewJSONHandler(logs, nil)), sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader)))
	if err != nil {
		t.Fatal(err)
	}
	return c, logs, reader
}

// The limiter's answer maps onto Decision: allowance and denial with their
// figures, RetryAfter on a denial, and the deciding rule's Delay.
func TestCheckMapsTheLimiterAnswer(t *testing.T) {
	tests := map[string]struct {
		resp *ratelimitv1.CheckQuotaResponse
		want quota.Decision
	}{
		"allowed, with the deciding rule's delay": {
			resp: &ratelimitv1.CheckQuotaResponse{
				Allowed: true, DecidingRule: "queue", Limit: 100, Remaining: 40,
				ResetAfter: durationpb.New(36 * time.Second), RetryAfter: durationpb.New(0),
				Source: ratelimitv1.DecisionSource_DECISION_SOURCE_REDIS,
				Decisions: []*ratelimitv1.RuleDecision{
					{Rule: "other", Allowed: true, Delay: durationpb.New(time.Second), Window: durationpb.New(time.Hour)},
					{Rule: "queue", Allowed: true, Delay: durationpb.New(250 * time.Millisecond), Window: durationpb.New(time.Minute)},
				},
			},
			want: quota.Decision{
				Allowed: true, Rule: "queue", Limit: 100, Window: time.Minute, Remaining: 40, ResetAfter: 36 * time.Second,
				Delay: 250 * time.Millisecond, Source: ratelimitv1.DecisionSource_DECISION_SOURCE_REDIS,
			},
		},
		"denied, with retry-after": {
			resp: &ratelimitv1.CheckQuotaResponse{
				Allowed: false, DecidingRule: "per-tenant", Limit: 3, Remaining: 0,
				ResetAfter: durationpb.New(time.Hour), RetryAfter: durationpb.New(20 * time.Minute),
				Source: ratelimitv1.DecisionSource_DECISION_SOURCE_REDIS,
				Decisions: []*ratelimitv1.RuleDecision{
					{Rule: "per-key", Allowed: true},
					{Rule: "per-tenant", Allowed: false, RetryAfter: durationpb.New(20 * time.Minute)},
				},
			},
			want: quota.Decision{
				Allowed: false, Rule: "per-tenant", Limit: 3, Remaining: 0, ResetAfter: time.Hour,
				RetryAfter: 20 * time.Minute, Source: ratelimitv1.DecisionSource_DECISION_SOURCE_REDIS,
			},
		},
		"denied by the fail-closed mode of a rule": {
			resp: &ratelimitv1.CheckQuotaResponse{
				Allowed: false, DecidingRule: "per-ip", Limit: 10, RetryAfter: durationpb.New(time.Second),
				Source: ratelimitv1.DecisionSource_DECISION_SOURCE_FAIL_CLOSED,
			},
			want: quota.Decision{
				Allowed: false, Rule: "per-ip", Limit: 10, RetryAfter: time.Second,
				Source: ratelimitv1.DecisionSource_DECISION_SOURCE_FAIL_CLOSED,
			},
		},
		"no rule applied": {
			resp: &ratelimitv1.CheckQuotaResponse{Allowed: true, Source: ratelimitv1.DecisionSource_DECISION_SOURCE_NO_RULE},
			want: quota.Decision{Allowed: true, Source: ratelimitv1.DecisionSource_DECISION_SOURCE_NO_RULE},
		},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			addr := serve(t, func(context.Context, *ratelimitv1.CheckQuotaRequest) (*ratelimitv1.CheckQuotaResponse, error) {
				return tc.resp, nil
			})
			c := newClient(t, addr, 5*time.Second)
			for _, policy := range []quota.Policy{quota.FailOpen, quota.FailClosed} {
				if got := c.Check(context.Background(), "api", map[string]string{"tenant": "t"}, 1, policy); got != tc.want {
					t.Errorf("policy %v: got %+v, want %+v", policy, got, tc.want)
				}
			}
		})
	}
}

// A decision's RateLimit quota is its deciding rule's, named domain/rule;
// a decision no rule limited has none.
func TestDecisionFields(t *testing.T) {
	redis := ratelimitv1.DecisionSource_DECISION_SOURCE_REDIS
	decided := quota.Decision{Allowed: false, Rule: "per-ip", Limit: 10, Window: time.Minute, Remaining: 0,
		ResetAfter: 6 * time.Second, RetryAfter: 6 * time.Second, Source: redis}
	want := ratelimitfields.Quota{Policy: "api/per-ip", Limit: 10, Window: time.Minute, ResetAfter: 6 * time.Second,
		RetryAfter: 6 * time.Second}
	if got, ok := decided.Fields("api"); !ok || got != want {
		t.Errorf("got %+v (%v), want %+v", got, ok, want)
	}
	for name, d := range map[string]quota.Decision{
		"limiter did not answer": {Allowed: true, Degraded: true},
		"no rule":                {Allowed: true, Source: ratelimitv1.DecisionSource_DECISION_SOURCE_NO_RULE},
		"unlimited rule":         {Allowed: true, Rule: "vip", Source: ratelimitv1.DecisionSource_DECISION_SOURCE_UNLIMITED},
		"no rule named":          {Allowed: true, Source: redis},
	} {
		if got, ok := d.Fields("api"); ok {
			t.Errorf("%s: fields %+v, want none", name, got)
		}
	}
}

// Check sends its cost (0 meaning 1), Peek sends cost 0, and the domain and
// descriptors go through unchanged.
func TestCheckSendsTheRequest(t *testing.T) {
	got := make(chan *ratelimitv1.CheckQuotaRequest, 1)
	addr := serve(t, func(_ context.Context, req *ratelimitv1.CheckQuotaRequest) (*ratelimitv1.CheckQuotaResponse, error) {
		got <- req
		return &ratelimitv1.CheckQuotaResponse{Allowed: true}, nil
	})
	c := newClient(t, addr, 5*time.Second)
	ctx := context.Background()
	desc := map[string]string{"tenant": "acme", "api_key": "k1"}
	tests := map[string]struct {
		call     func()
		wantCost uint32
	}{
		"Check cost 0 means 1": {func() { c.Check(ctx, "api", desc, 0, quota.FailOpen) }, 1},
		"Check cost 1":         {func() { c.Check(ctx, "api", desc, 1, quota.FailOpen) }, 1},
		"Check cost 5":         {func() { c.Check(ctx, "api", desc, 5, quota.FailOpen) }, 5},
		"Peek":                 {func() { c.Peek(ctx, "api", desc, quota.FailOpen) }, 0},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			tc.call()
			req := <-got
			want := &ratelimitv1.CheckQuotaRequest{Domain: "api", Descriptors: desc, Cost: proto.Uint32(tc.wantCost)}
			if !proto.Equal(req, want) {
				t.Errorf("sent %v, want %v", req, want)
			}
		})
	}
}

// When the limiter cannot answer (nothing listens, or it fails), the caller's
// policy decides and the decision says so.
func TestUnavailableLimiterAppliesThePolicy(t *testing.T) {
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	nothing := lis.Addr().String()
	if err := lis.Close(); err != nil {
		t.Fatal(err)
	}
	failing := serve(t, func(context.Context, *ratelimitv1.CheckQuotaRequest) (*ratelimitv1.CheckQuotaResponse, error) {
		return nil, status.Error(codes.Unavailable, "redis is down")
	})
	for name, addr := range map[string]string{"nothing listens": nothing, "limiter fails": failing} {
		c := newClient(t, addr, 5*time.Second)
		for policy, wantAllowed := range map[quota.Policy]bool{quota.FailOpen: true, quota.FailClosed: false} {
			t.Run(name+"/"+policy.String(), func(t *testing.T) {
				got := c.Check(context.Background(), "auth", map[string]string{"ip": "192.0.2.1"}, 1, policy)
				want := quota.Decision{Allowed: wantAllowed, Degraded: true}
				if got != want {
					t.Errorf("got %+v, want %+v", got, want)
				}
				if peek := c.Peek(context.Background(), "auth", map[string]string{"ip": "192.0.2.1"}, policy); peek != want {
					t.Errorf("Peek: got %+v, want %+v", peek, want)
				}
				for i, d := range c.CheckMany(context.Background(), []quota.Request{{Domain: "auth"}, {Domain: "auth", Cost: 3}}, policy) {
					if d != want {
						t.Errorf("CheckMany decision %d: got %+v, want %+v", i, d, want)
					}
				}
			})
		}
	}
}

// A limiter outage leaves every check of the caller unanswered: one line
// a second about them, not one each (a busy caller wrote thousands a
// second), and every one counted degraded.
func TestUnansweredChecksAreLoggedOncePerBurst(t *testing.T) {
	addr := serve(t, func(context.Context, *ratelimitv1.CheckQuotaRequest) (*ratelimitv1.CheckQuotaResponse, error) {
		return nil, status.Error(codes.Unavailable, "redis is down")
	})
	c, logs, reader := newObservedClient(t, addr)
	start := time.Now()
	for range 50 {
		if d := c.Check(context.Background(), "auth", map[string]string{"ip": "192.0.2.1"}, 1, quota.FailOpen); !d.Degraded {
			t.Fatalf("a check the limiter failed: %+v, want Degraded", d)
		}
	}
	// One line a second: a loaded machine may take more than one.
	most := int(time.Since(start)/time.Second) + 1
	if lines := strings.Count(logs.String(), "limiter unavailable"); lines < 1 || lines > most {
		t.Errorf("%d lines about 50 unanswered checks, want 1 to %d:\n%s", lines, most, logs.String())
	}
	if n := metrictest.Counter(t, reader, "kurz.quota.calls", "outcome", "degraded"); n != 50 {
		t.Errorf("%d calls counted degraded, want 50", n)
	}
}

// A limiter slower than the client's timeout: the call gives up at the
// timeout (the limiter sees its context cancelled) and the policy decides.
func TestSlowLimiterDegradesAtTheTimeout(t *testing.T) {
	seen := make(chan error, 4)
	addr := serve(t, func(ctx context.Context, _ *ratelimitv1.CheckQuotaRequest) (*ratelimitv1.CheckQuotaResponse, error) {
		<-ctx.Done()
		seen <- ctx.Err()
		return nil, ctx.Err()
	})
	const timeout = 100 * time.Millisecond
	c := newClient(t, addr, timeout)
	for policy, wantAllowed := range map[quota.Policy]bool{quota.FailOpen: true, quota.FailClosed: false} {
		t.Run(policy.String(), func(t *testing.T) {
			returned := make(chan quota.Decision, 1)
			go func() { returned <- c.Check(context.Background(), "api", map[string]string{"tenant": "t"}, 1, policy) }()
			// Bounds generous enough for a loaded machine: the point is that
			// the call ends because of the client's timeout, not the server.
			var got quota.Decision
			select {
			case got = <-returned:
			case <-time.After(10 * time.Second):
				t.Fatalf("Check still blocked 10 s after a %v timeout", timeout)
			}
			if want := (quota.Decision{Allowed: wantAllowed, Degraded: true}); got != want {
				t.Errorf("got %+v, want %+v", got, want)
			}
			select {
			case err := <-seen:
				if err == nil {
					t.Errorf("the limiter's context ended with no error")
				}
			case <-time.After(10 * time.Second):
				t.Fatal("the limiter's context was never cancelled")
			}
		})
	}
}

// A caller's context that ends first also ends the call.
func TestCallerDeadlineIsKept(t *testing.T) {
	addr := serve(t, func(ctx context.Context, _ *ratelimitv1.CheckQuotaRequest) (*ratelimitv1.CheckQuotaResponse, error) {
		<-ctx.Done()
		return nil, ctx.Err()
	})
	c := newClient(t, addr, time.Hour)
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	if got := c.Check(ctx, "auth", map[string]string{"ip": "192.0.2.1"}, 1, quota.FailClosed); got.Allowed || !got.Degraded {
		t.Errorf("got %+v, want denied and degraded", got)
	}
}

// A caller that gives up first (its client hung up) is not the limiter
// failing: the decision is Abandoned (and Degraded, for callers that do not
// look further), counted as outcome "abandoned", and logged not at all.
func TestCallerGoneIsAbandonedNotDegraded(t *testing.T) {
	addr := serve(t, func(ctx context.Context, _ *ratelimitv1.CheckQuotaRequest) (*ratelimitv1.CheckQuotaResponse, error) {
		<-ctx.Done()
		return nil, ctx.Err()
	})
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = conn.Close() })
	var logs strings.Builder
	reader := sdkmetric.NewManualReader()
	c, err := quota.New(conn, time.Hour, slog.New(slog.NewJSONHandler(&logs, nil)), sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader)))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	time.AfterFunc(20*time.Millisecond, cancel)
	got := c.Check(ctx, "redirect.miss", map[string]string{"ip": "192.0.2.1"}, 1, quota.FailOpen)
	if !got.Abandoned || !got.Degraded {
		t.Errorf("a call whose caller gave up: %+v, want Abandoned", got)
	}
	for i, d := range c.CheckMany(ctx, []quota.Request{{Domain: "clicks"}, {Domain: "clicks"}}, quota.FailOpen) {
		if !d.Abandoned {
			t.Errorf("CheckMany decision %d of a caller gone: %+v, want Abandoned", i, d)
		}
	}
	if n := metrictest.Counter(t, reader, "kurz.quota.calls", "outcome", "abandoned"); n != 3 {
		t.Errorf("%d calls counted abandoned, want 3", n)
	}
	if n := metrictest.Counter(t, reader, "kurz.quota.calls", "outcome", "degraded"); n != 0 {
		t.Errorf("%d calls counted degraded, want 0", n)
	}
	if logs.Len() != 0 {
		t.Errorf("a caller gone was logged: %s", logs.String())
	}
}

func TestParsePolicy(t *testing.T) {
	tests := map[string]struct {
		want    quota.Policy
		wantErr bool
	}{
		"open":      {want: quota.FailOpen},
		"closed":    {want: quota.FailClosed},
		"":          {wantErr: true},
		"Open":      {wantErr: true},
		"fail-open": {wantErr: true},
		" closed":   {wantErr: true},
	}
	for in, tc := range tests {
		t.Run(in, func(t *testing.T) {
			got, err := quota.ParsePolicy(in)
			if tc.wantErr {
				if err == nil || !strings.Contains(err.Error(), "want open or closed") {
					t.Errorf("ParsePolicy(%q) = %v, %v; want an error saying what is accepted", in, got, err)
				}
				return
			}
			if err != nil || got != tc.want {
				t.Fatalf("ParsePolicy(%q) = %v, %v; want %v", in, got, err, tc.want)
			}
			if got.String() != in {
				t.Errorf("%v.String() = %q, want %q (round trip)", got, got.String(), in)
			}
		})
	}
}

// CheckMany sends its requests in CheckQuotas calls of at most MaxBatch checks
// (cost 0 sent as 1) and returns the limiter's answers in the requests'
// order: 2,500 requests make 13 calls (quota.MaxBatch, 200, a call).
func TestCheckManyBatchesInOrder(t *testing.T) {
	addr, batches := serveCounting(t, func(_ context.Context, req *ratelimitv1.CheckQuotaRequest) (*ratelimitv1.CheckQuotaResponse, error) {
		// Allowed when the cost is even; Remaining echoes the cost.
		return &ratelimitv1.CheckQuotaResponse{Allowed: req.GetCost()%2 == 0, Remaining: int64(req.GetCost()), DecidingRule: req.GetDescriptors()["n"],
			Source: ratelimitv1.DecisionSource_DECISION_SOURCE_REDIS}, nil
	})
	c := newClient(t, addr, 5*time.Second)
	reqs := make([]quota.Request, 2500)
	for i := range reqs {
		reqs[i] = quota.Request{Domain: "clicks", Descriptors: map[string]string{"n": strconv.Itoa(i)}, Cost: uint32(i % 7)}
	}
	got := c.CheckMany(context.Background(), reqs, quota.FailOpen)
	if len(got) != len(reqs) {
		t.Fatalf("%d decisions for %d requests", len(got), len(reqs))
	}
	for i, d := range got {
		cost := int64(max(i%7, 1))
		if d.Rule != strconv.Itoa(i) || d.Remaining != cost || d.Allowed != (cost%2 == 0) || d.Degraded {
			t.Fatalf("decision %d: %+v, want the answer to request %d (cost %d)", i, d, i, cost)
		}
	}
	if n, want := batches.Load(), int64((len(reqs)+quota.MaxBatch-1)/quota.MaxBatch); n != want {
		t.Errorf("%d CheckQuotas calls for 2,500 requests, want %d", n, want)
	}
	if d := c.CheckMany(context.Background(), nil, quota.FailOpen); len(d) != 0 {
		t.Errorf("no requests: %d decisions", len(d))
	}
	if n, want := batches.Load(), int64((len(reqs)+quota.MaxBatch-1)/quota.MaxBatch); n != want {
		t.Errorf("no requests made a call (%d calls in all)", n)
	}
}

// A check the limiter refuses as invalid (a descriptor name it does not
// take, a domain it does not know) is the caller's mistake, not an
// outage: the policy still decides, but the decision, the log line and the
// count say so, or a FailOpen caller would pass every request past its
// limits under a line blaming the limiter.
func TestRefusedCheckIsInvalidNotUnavailable(t *testing.T) {
	addr := serve(t, func(context.Context, *ratelimitv1.CheckQuotaRequest) (*ratelimitv1.CheckQuotaResponse, error) {
		return nil, status.Error(codes.InvalidArgument, `descriptor name "": want 1 to 64 bytes`)
	})
	c, logs, reader := newObservedClient(t, addr)
	for policy, wantAllowed := range map[quota.Policy]bool{quota.FailOpen: true, quota.FailClosed: false} {
		got := c.Check(context.Background(), "api", map[string]string{"": "x"}, 1, policy)
		if want := (quota.Decision{Allowed: wantAllowed, Degraded: true, Invalid: true}); got != want {
			t.Errorf("%s: got %+v, want %+v", policy, got, want)
		}
	}
	if strings.Contains(logs.String(), "limiter unavailable") || !strings.Contains(logs.String(), `"level":"ERROR","msg":"limiter refused the check as invalid`) {
		t.Errorf("the log blames the limiter, or says nothing of the refused check:\n%s", logs.String())
	}
	if n := metrictest.Counter(t, reader, "kurz.quota.calls", "outcome", "invalid"); n != 2 {
		t.Errorf("%d calls counted invalid, want 2", n)
	}
}

func TestWithinWait(t *testing.T) {
	queued := quota.Decision{Allowed: true, Rule: "q", Delay: 30 * time.Second}
	if got := queued.WithinWait(10 * time.Second); got.Allowed || got.RetryAfter != 30*time.Second || got.Delay != 0 {
		t.Errorf("a turn 30s off, waiting at most 10s: %+v, want refused, retrying after 30s, no delay", got)
	}
	if got := queued.WithinWait(30 * time.Second); got != queued {
		t.Errorf("a turn 30s off, waiting at most 30s: %+v, want it unchanged", got)
	}
	denied := quota.Decision{Rule: "q", RetryAfter: time.Second}
	if got := denied.WithinWait(0); got != denied {
		t.Errorf("a denial: %+v, want it unchanged", got)
	}
}

// A check whose domain or descriptors are not valid UTF-8 cannot be sent
// (protobuf refuses to encode it): it is the caller's bad input, marked
// Invalid without a call, not a limiter outage (the log would blame the
// limiter, and a fail-open rule would read it as one). In a CheckMany
// batch it is that request alone: the others are sent and decided.
func TestInvalidUTF8IsInvalidWithoutACall(t *testing.T) {
	var calls atomic.Int64
	addr, batches := serveCounting(t, func(_ context.Context, req *ratelimitv1.CheckQuotaRequest) (*ratelimitv1.CheckQuotaResponse, error) {
		calls.Add(1)
		return &ratelimitv1.CheckQuotaResponse{Allowed: true, DecidingRule: req.GetDescriptors()["n"], Source: ratelimitv1.DecisionSource_DECISION_SOURCE_REDIS}, nil
	})
	c, logs, reader := newObservedClient(t, addr)
	bad := map[string]map[string]string{
		"value": {"ip": "\xff\xfe"},
		"name":  {"\xffip": "203.0.113.5"},
	}
	for name, desc := range bad {
		for policy, wantAllowed := range map[quota.Policy]bool{quota.FailOpen: true, quota.FailClosed: false} {
			got := c.Check(context.Background(), "api", desc, 1, policy)
			if want := (quota.Decision{Allowed: wantAllowed, Degraded: true, Invalid: true}); got != want {
				t.Errorf("%s not UTF-8, %s: got %+v, want %+v", name, policy, got, want)
			}
		}
	}
	if got := c.Peek(context.Background(), "a\xffi", map[string]string{"n": "1"}, quota.FailClosed); !got.Invalid {
		t.Errorf("domain not UTF-8: got %+v, want Invalid", got)
	}
	if n := calls.Load(); n != 0 {
		t.Errorf("%d checks reached the limiter, want none", n)
	}
	if s := logs.String(); strings.Contains(s, "limiter unavailable") || !strings.Contains(s, "limiter refused the check as invalid") || strings.Contains(s, "\\ufffd\\ufffd") {
		t.Errorf("the log blames the limiter, says nothing of the refused check, or repeats the value:\n%s", s)
	}
	if n := metrictest.Counter(t, reader, "kurz.quota.calls", "outcome", "invalid"); n != 5 {
		t.Errorf("%d checks counted invalid, want 5", n)
	}

	got := c.CheckMany(context.Background(), []quota.Request{
		{Domain: "api", Descriptors: map[string]string{"n": "0"}},
		{Domain: "api", Descriptors: map[string]string{"n": "\xff"}},
		{Domain: "api", Descriptors: map[string]string{"n": "2"}},
	}, quota.FailOpen)
	if len(got) != 3 || got[0].Rule != "0" || got[0].Degraded || !got[1].Invalid || got[2].Rule != "2" || got[2].Degraded {
		t.Errorf("batch with one request not UTF-8: %+v; want the other two decided, it Invalid", got)
	}
	if n := batches.Load(); n != 1 {
		t.Errorf("%d CheckQuotas calls, want 1", n)
	}
}

// Of two rules' decisions on one request, the stricter is a denial before
// an allowance, of two denials the later return, of two allowances the one
// with less left for its limit.
func TestDecisionStricter(t *testing.T) {
	tests := map[string]struct {
		d, o quota.Decision
		want bool
	}{
		"denied over allowed":     {quota.Decision{RetryAfter: time.Second}, quota.Decision{Allowed: true, Limit: 10}, true},
		"allowed under denied":    {quota.Decision{Allowed: true, Limit: 10}, quota.Decision{RetryAfter: time.Second}, false},
		"the later denial":        {quota.Decision{RetryAfter: 5 * time.Second}, quota.Decision{RetryAfter: 2 * time.Second}, true},
		"the sooner denial":       {quota.Decision{RetryAfter: 2 * time.Second}, quota.Decision{RetryAfter: 5 * time.Second}, false},
		"less left for its limit": {quota.Decision{Allowed: true, Limit: 20, Remaining: 2}, quota.Decision{Allowed: true, Limit: 600, Remaining: 500}, true},
		"more left for its limit": {quota.Decision{Allowed: true, Limit: 20, Remaining: 19}, quota.Decision{Allowed: true, Limit: 600, Remaining: 6}, false},
		"as much left":            {quota.Decision{Allowed: true, Limit: 20, Remaining: 10}, quota.Decision{Allowed: true, Limit: 600, Remaining: 300}, false},
	}
	for name, tc := range tests {
		if got := tc.d.Stricter(tc.o); got != tc.want {
			t.Errorf("%s: %+v.Stricter(%+v) = %v, want %v", name, tc.d, tc.o, got, tc.want)
		}
	}
}
