package quotaapi

import (
	"context"
	"fmt"
	"strconv"
	"sync"
	"time"

	"google.golang.org/grpc/codes"

	ratelimitv1 "kurz.dev/gen/kurz/ratelimit/v1"
	gubernatorpb "kurz.dev/gen/pb/gubernator"
	"kurz.dev/pkg/rpcerr"
	"kurz.dev/services/limiter/internal/ratelimit"
)

// GubernatorEngine is what the gubernator API needs of the engine: ad-hoc
// rules, each request carrying its own limit.
type GubernatorEngine interface {
	CheckRule(ctx context.Context, r *ratelimit.Rule, key string, cost int64) *ratelimitv1.CheckQuotaResponse
	ResetRule(ctx context.Context, key string) error
}

// GubernatorService serves gubernator's pb.gubernator.V1 API: each
// RateLimitReq is decided as an ad-hoc rule (GubernatorRule) at a key of
// its own namespace (GubernatorKey), exactly, on Redis. A request kurz
// cannot decide gets its own `error`, as gubernator answers it; only a
// batch over GubernatorMaxBatch fails the call (OUT_OF_RANGE, as in
// gubernator).
type GubernatorService struct {
	gubernatorpb.UnimplementedV1Server
	engine  GubernatorEngine
	failure ratelimitv1.FailureMode
	ready   func() bool
	now     func() time.Time
	// deciding holds a token per decision in flight, whichever call it is
	// of (gubernatorDecidingAtOnce).
	deciding chan struct{}
	// maxDuration bounds how long a limit's state lasts in Redis
	// (WithMaxDuration).
	maxDuration time.Duration
}

// NewGubernator returns the gubernator API over engine; its limits answer
// by failure when Redis fails, and HealthCheck tells ready(). A limit's
// state lasts at most DefaultGubernatorMaxDuration unless WithMaxDuration
// says otherwise.
func NewGubernator(engine GubernatorEngine, failure ratelimitv1.FailureMode, ready func() bool) *GubernatorService {
	return &GubernatorService{
		engine: engine, failure: failure, ready: ready, now: time.Now,
		deciding:    make(chan struct{}, gubernatorDecidingAtOnce),
		maxDuration: DefaultGubernatorMaxDuration,
	}
}

// WithMaxDuration sets how long a limit's state may last in Redis (the
// time its bucket takes to refill or drain: a token bucket's duration, a
// leaky bucket's burst at its rate), d at most ratelimit.MaxWindow; a
// request past it is refused in its `error`. It returns s.
func (s *GubernatorService) WithMaxDuration(d time.Duration) *GubernatorService {
	s.maxDuration = d
	return s
}

// DefaultGubernatorMaxDuration is KURZ_LIMITER_GUBERNATOR_MAX_DURATION's
// default. Every (name, unique_key) is a Redis key that lives as long as
// its limit takes to refill; gubernator keeps its limits in an LRU of
// GUBER_CACHE_SIZE, kurz in Redis, so a client sending unique keys fills
// Redis at the rate it sends them times this lifetime.
const DefaultGubernatorMaxDuration = 24 * time.Hour

// Bounds on a gubernator request. The batch is gubernator's own limit; the
// rest bound what a stranger who reaches the port can make the limiter
// hold or Redis store (a unique_key past 64 bytes is hashed in the key).
const (
	GubernatorMaxBatch = 1000
	maxGubernatorName  = 256
	maxGubernatorKey   = 1024
	// gubernatorDecidingAtOnce bounds the decisions in flight of all the
	// calls together: the gRPC bound counts calls, and each may hold
	// 1,000 requests, so a bound per call would let a full server put
	// 1,024 x the bound on Redis. The engine pipelines them per Redis
	// node: 256 at about a millisecond each is far more than a Redis
	// Cluster node decides a second.
	gubernatorDecidingAtOnce = 256
)

// GubernatorDomain is the domain the gubernator API's decisions are counted
// under in kurz_ratelimit_decisions_total, their rule the algorithm: a
// fixed set of labels, whatever names the clients send.
const GubernatorDomain = "gubernator"

// The behaviours kurz accepts and ignores: it has no batching to tune and
// decides every request on the one Redis Cluster, exactly.
const gubernatorIgnored = gubernatorpb.Behavior_NO_BATCHING | gubernatorpb.Behavior_GLOBAL | gubernatorpb.Behavior_MULTI_REGION

// GubernatorKey is the Redis key of a gubernator limit (name, unique_key),
// without the key prefix: "gb:{<name>:<unique_key>}", each part escaped,
// so no two pairs share a key (gubernator joins them with "_", which
// ("a_b", "c") and ("a", "b_c") would) and none is a kurz rule's ("rl:").
func GubernatorKey(name, uniqueKey string) string {
	return ratelimit.AdHocKey("gb", name, uniqueKey)
}

// GubernatorRule maps a RateLimitReq onto kurz's engine: TOKEN_BUCKET is
// kurz's token bucket (limit per duration, capacity limit), LEAKY_BUCKET
// kurz's leaky bucket as a meter (drains limit per duration, capacity
// burst, limit when 0). A request kurz refuses returns an error whose text
// is the response's `error`.
func GubernatorRule(req *gubernatorpb.RateLimitReq, failure ratelimitv1.FailureMode) (*ratelimit.Rule, error) {
	switch {
	case req.GetName() == "":
		return nil, fmt.Errorf("field 'name' cannot be empty")
	case req.GetUniqueKey() == "":
		return nil, fmt.Errorf("field 'unique_key' cannot be empty")
	case len(req.GetName()) > maxGubernatorName:
		return nil, fmt.Errorf("name of %d bytes: at most %d", len(req.GetName()), maxGubernatorName)
	case len(req.GetUniqueKey()) > maxGubernatorKey:
		return nil, fmt.Errorf("unique_key of %d bytes: at most %d", len(req.GetUniqueKey()), maxGubernatorKey)
	case req.GetHits() < 0 || req.GetHits() > maxCost:
		return nil, fmt.Errorf("hits %d: want 0 (read without taking) to %d", req.GetHits(), maxCost)
	case req.GetLimit() < 1 || req.GetLimit() > ratelimit.MaxLimit:
		return nil, fmt.Errorf("limit %d: want 1 to %d", req.GetLimit(), int64(ratelimit.MaxLimit))
	case req.GetDuration() < 1 || req.GetDuration() > ratelimit.MaxWindow.Milliseconds():
		return nil, fmt.Errorf("duration %d ms: want 1 to %d (%v)", req.GetDuration(), ratelimit.MaxWindow.Milliseconds(), ratelimit.MaxWindow)
	case req.GetBurst() < 0 || req.GetBurst() > ratelimit.MaxLimit:
		return nil, fmt.Errorf("burst %d: want 0 (the limit) to %d", req.GetBurst(), int64(ratelimit.MaxLimit))
	}
	b := req.GetBehavior()
	switch {
	case b&gubernatorpb.Behavior_DURATION_IS_GREGORIAN != 0:
		return nil, fmt.Errorf("behavior DURATION_IS_GREGORIAN is not supported: kurz's windows are durations; send duration in milliseconds")
	case b&gubernatorpb.Behavior_DRAIN_OVER_LIMIT != 0:
		return nil, fmt.Errorf("behavior DRAIN_OVER_LIMIT is not supported: a request kurz denies takes nothing")
	case b&^(gubernatorIgnored|gubernatorpb.Behavior_RESET_REMAINING) != 0:
		return nil, fmt.Errorf("behavior %d: unknown flags %d", b, b&^(gubernatorIgnored|gubernatorpb.Behavior_RESET_REMAINING))
	}
	r := &ratelimit.Rule{
		Domain:      GubernatorDomain,
		Key:         []string{"unique_key"},
		Limit:       req.GetLimit(),
		Window:      time.Duration(req.GetDuration()) * time.Millisecond,
		FailureMode: failure,
	}
	switch req.GetAlgorithm() {
	case gubernatorpb.Algorithm_TOKEN_BUCKET:
		// gubernator's token bucket has no burst: it holds the limit.
		r.Name, r.Algorithm = "token_bucket", ratelimitv1.Algorithm_ALGORITHM_TOKEN_BUCKET
	case gubernatorpb.Algorithm_LEAKY_BUCKET:
		r.Name, r.Algorithm, r.Burst = "leaky_bucket", ratelimitv1.Algorithm_ALGORITHM_LEAKY_BUCKET, req.GetBurst()
	default:
		return nil, fmt.Errorf("algorithm %d: want TOKEN_BUCKET (0) or LEAKY_BUCKET (1)", req.GetAlgorithm())
	}
	if err := r.Validate(); err != nil {
		// The rule's own bounds (a leaky bucket's burst that takes over
		// 400 days to drain): said of the request, not of a rule.
		return nil, fmt.Errorf("limit %d per %d ms, burst %d: %w", r.Limit, req.GetDuration(), r.Burst, err)
	}
	return r, nil
}

// GetRateLimits implements gubernatorpb.V1Server.
func (s *GubernatorService) GetRateLimits(ctx context.Context, req *gubernatorpb.GetRateLimitsReq) (*gubernatorpb.GetRateLimitsResp, error) {
	reqs := req.GetRequests()
	if len(reqs) > GubernatorMaxBatch {
		return nil, rpcerr.WithDetails(codes.OutOfRange,
			fmt.Sprintf("%d requests: at most %d in one GetRateLimits call, gubernator's batch limit", len(reqs), GubernatorMaxBatch),
			rpcerr.Info(ReasonBatchSizeInvalid, nil))
	}
	out := make([]*gubernatorpb.RateLimitResp, len(reqs))
	var wg sync.WaitGroup
	for i, r := range reqs {
		// A slot of the server's first, so that a call waits for room
		// without holding a goroutine per request. A call whose context
		// ends while it waits (its deadline, its client gone) decides no
		// more: checked after a slot is had too, as select picks at random
		// when both are ready.
		took := false
		select {
		case s.deciding <- struct{}{}:
			took = true
		case <-ctx.Done():
		}
		if ctx.Err() != nil {
			if took {
				<-s.deciding
			}
			wg.Wait()
			for j := i; j < len(reqs); j++ {
				out[j] = &gubernatorpb.RateLimitResp{Error: "not decided: the call ended (its deadline, or its client went) while it waited for the limiter's other decisions"}
			}
			return &gubernatorpb.GetRateLimitsResp{Responses: out}, nil
		}
		if len(reqs) == 1 {
			out[0] = s.decide(ctx, r)
			<-s.deciding
			break
		}
		wg.Go(func() {
			defer func() { <-s.deciding }()
			out[i] = s.decide(ctx, r)
		})
	}
	wg.Wait()
	return &gubernatorpb.GetRateLimitsResp{Responses: out}, nil
}

// decide answers one RateLimitReq.
func (s *GubernatorService) decide(ctx context.Context, req *gubernatorpb.RateLimitReq) *gubernatorpb.RateLimitResp {
	r, err := GubernatorRule(req, s.failure)
	if err == nil {
		err = s.checkLifetime(r)
	}
	if err != nil {
		return &gubernatorpb.RateLimitResp{Error: err.Error()}
	}
	key := GubernatorKey(req.GetName(), req.GetUniqueKey())
	if req.GetBehavior()&gubernatorpb.Behavior_RESET_REMAINING != 0 {
		if err := s.engine.ResetRule(ctx, key); err != nil {
			// An explicit write that did not happen: the caller must
			// know, whatever the failure mode says of decisions.
			return &gubernatorpb.RateLimitResp{Error: "RESET_REMAINING: the limit's state could not be cleared: Redis did not answer"}
		}
	}
	d := s.engine.CheckRule(ctx, r, key, req.GetHits())
	return gubernatorResp(d, req.GetLimit(), s.now())
}

// checkLifetime refuses a rule whose state would outlast s.maxDuration in
// Redis: its key's TTL is the time its bucket takes to refill (a token
// bucket's window) or drain (a leaky bucket's burst at limit per window).
func (s *GubernatorService) checkLifetime(r *ratelimit.Rule) error {
	if r.Window > s.maxDuration {
		return fmt.Errorf("duration %d ms: at most %d (%v, KURZ_LIMITER_GUBERNATOR_MAX_DURATION)",
			r.Window.Milliseconds(), s.maxDuration.Milliseconds(), s.maxDuration)
	}
	if r.Algorithm != ratelimitv1.Algorithm_ALGORITHM_LEAKY_BUCKET || r.Burst <= r.Limit {
		return nil
	}
	// In float64: burst x window overflows int64 (2^40 x 2^35 ms), and
	// Validate has kept the result within 400 days, exact to the ms.
	drain := time.Duration(float64(r.Window) * float64(r.Burst) / float64(r.Limit))
	if drain > s.maxDuration {
		return fmt.Errorf("burst %d drains at %d per %d ms, in %v: at most %v (KURZ_LIMITER_GUBERNATOR_MAX_DURATION)",
			r.Burst, r.Limit, r.Window.Milliseconds(), drain.Round(time.Millisecond), s.maxDuration)
	}
	return nil
}

// gubernatorResp is the engine's decision as gubernator answers: reset_time
// is when the limit is whole again (the bucket full, or empty for the leaky
// bucket), in Unix milliseconds; metadata says how it was decided
// ("source") and, over the limit, how long until the request's hits fit
// ("retry_after_ms", sooner than reset_time since kurz's buckets refill
// continuously).
func gubernatorResp(d *ratelimitv1.CheckQuotaResponse, limit int64, now time.Time) *gubernatorpb.RateLimitResp {
	out := &gubernatorpb.RateLimitResp{
		Limit:     limit,
		Remaining: d.GetRemaining(),
		ResetTime: now.Add(d.GetResetAfter().AsDuration()).UnixMilli(),
		Metadata:  map[string]string{"source": ratelimit.SourceName(d.GetSource())},
	}
	if !d.GetAllowed() {
		out.Status = gubernatorpb.Status_OVER_LIMIT
		out.Metadata["retry_after_ms"] = strconv.FormatInt(d.GetRetryAfter().AsDuration().Milliseconds(), 10)
	}
	return out
}

// HealthCheck implements gubernatorpb.V1Server: "healthy" while the limiter
// is ready (its /readyz), "unhealthy" otherwise, with a gRPC OK either way,
// as gubernator answers. kurz has no peers: peer_count is 1, this limiter.
func (s *GubernatorService) HealthCheck(context.Context, *gubernatorpb.HealthCheckReq) (*gubernatorpb.HealthCheckResp, error) {
	if !s.ready() {
		return &gubernatorpb.HealthCheckResp{Status: "unhealthy", Message: "the limiter is not ready (starting, draining, or without its rules)", PeerCount: 1}, nil
	}
	return &gubernatorpb.HealthCheckResp{Status: "healthy", PeerCount: 1}, nil
}

// LiveCheck implements gubernatorpb.V1Server: the process answers.
func (s *GubernatorService) LiveCheck(context.Context, *gubernatorpb.LiveCheckReq) (*gubernatorpb.LiveCheckResp, error) {
	return &gubernatorpb.LiveCheckResp{}, nil
}
