// Package quota is the client every kurz service uses to ask the limiter
// whether a request may proceed. It bounds each call with a deadline and, when
// the limiter itself is unreachable or slow, applies the caller's own policy:
// fail-open for business quotas, fail-closed for brute-force protection.
package quota

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"
	"unicode/utf8"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	ratelimitv1 "kurz.dev/gen/kurz/ratelimit/v1"
	"kurz.dev/pkg/grpcclient"
	"kurz.dev/pkg/logging"
	"kurz.dev/pkg/ratelimitfields"
	"kurz.dev/pkg/telemetry"
)

// Policy is what a caller does when the limiter cannot answer in time.
type Policy int

const (
	// FailOpen lets the request through (logged and counted): a broken
	// limiter must not take the product down with it.
	FailOpen Policy = iota
	// FailClosed denies the request: for login, OTP and other endpoints where
	// letting everything through is what an attacker wants.
	FailClosed
)

// String returns "open" or "closed".
func (p Policy) String() string {
	if p == FailClosed {
		return "closed"
	}
	return "open"
}

// ParsePolicy reads "open" or "closed" (as written in configuration).
func ParsePolicy(s string) (Policy, error) {
	switch s {
	case "open":
		return FailOpen, nil
	case "closed":
		return FailClosed, nil
	}
	return 0, fmt.Errorf("unknown limiter failure policy %q: want open or closed", s)
}

// Decision is the limiter's answer, or the caller's policy standing in for it.
type Decision struct {
	Allowed bool
	// Rule is the deciding rule; empty when no rule applied or when Degraded.
	Rule  string
	Limit int64
	// Window is the deciding rule's window (0 when no rule decided): the
	// w of a RateLimit-Policy field.
	Window     time.Duration
	Remaining  int64
	ResetAfter time.Duration
	// RetryAfter is positive on a denial the limiter decided.
	RetryAfter time.Duration
	// Delay is how long to wait before acting (leaky bucket in queue mode).
	Delay  time.Duration
	Source ratelimitv1.DecisionSource
	// Degraded is true when the limiter did not answer and Policy decided.
	Degraded bool
	// Abandoned is set with Degraded when the call ended because the
	// caller's own context did (its client hung up, its deadline passed):
	// the limiter is not at fault, so it is counted as outcome "abandoned",
	// not "degraded", and not logged. A caller serving a stranger should
	// answer nothing useful then: a client that half-closes its connection
	// still reads the answer, and a policy that fails open would otherwise
	// let it past every limit for free.
	Abandoned bool
	// Invalid is set with Degraded when the limiter refused the check as
	// INVALID_ARGUMENT: a descriptor name it does not take, a domain it
	// does not know, a cost over its bound; or when the check could not
	// be sent at all, its domain or a descriptor not valid UTF-8 (which
	// protobuf cannot carry). The caller's own mistake, not
	// an outage: counted as outcome "invalid" and logged as an error, it
	// fails every check alike until the caller or the rules are mended.
	// The policy still decides: a rules change on the limiter must not
	// take a fail-open caller down.
	Invalid bool
	// MaxCost, when positive, is the capacity of a rule that denied the
	// request for costing more than that rule ever holds: the request is
	// never allowed as it is, however long its caller waits; one of at
	// most MaxCost units may be.
	MaxCost int64
}

// Unchecked reports whether d says nothing of the rule's count: the
// limiter did not answer, or answered by the rule's failure mode because
// its Redis did not (fail open or fail closed). A charge in an unchecked
// decision was not counted.
func (d Decision) Unchecked() bool {
	return d.Degraded || d.Source == ratelimitv1.DecisionSource_DECISION_SOURCE_FAIL_OPEN ||
		d.Source == ratelimitv1.DecisionSource_DECISION_SOURCE_FAIL_CLOSED
}

// Fields is the IETF RateLimit quota of d for its RateLimit and
// RateLimit-Policy fields, the deciding rule as the policy (named
// domain/rule). ok is false when no rule limited: none matched, only an
// unlimited one did, or the limiter did not answer.
func (d Decision) Fields(domain string) (q ratelimitfields.Quota, ok bool) {
	if d.Degraded || d.Rule == "" || d.Source == ratelimitv1.DecisionSource_DECISION_SOURCE_NO_RULE ||
		d.Source == ratelimitv1.DecisionSource_DECISION_SOURCE_UNLIMITED {
		return ratelimitfields.Quota{}, false
	}
	return ratelimitfields.Quota{
		Policy: domain + "/" + d.Rule, Limit: d.Limit, Window: d.Window,
		Remaining: d.Remaining, ResetAfter: d.ResetAfter, Allowed: d.Allowed, RetryAfter: d.RetryAfter,
	}, true
}

// Stricter reports whether d, one rule's decision on a request, leaves
// less room than o, another rule's on the same request: a denial before
// an allowance, of two denials the later return (ComeBackAfter), of two
// allowances the one with less remaining for its limit. An answer charged
// to two rules tells of the stricter, as the limiter's deciding rule is
// the one with the least headroom.
func (d Decision) Stricter(o Decision) bool {
	switch {
	case d.Allowed != o.Allowed:
		return !d.Allowed
	case !d.Allowed:
		return d.ComeBackAfter() > o.ComeBackAfter()
	}
	return float64(d.Remaining)*float64(o.Limit) < float64(o.Remaining)*float64(d.Limit)
}

// ComeBackAfter is when a request d denied may come back: the limiter's
// retry-after, else the rule's reset, at least a second from now
// (Retry-After counts whole seconds, and a retryAfterMs must not say
// less), as every kurz 429 says it.
func (d Decision) ComeBackAfter() time.Duration {
	retry := d.RetryAfter
	if retry <= 0 {
		retry = d.ResetAfter
	}
	return max(retry, time.Second)
}

// WithinWait returns d refused when the turn it gives (Delay) is further
// off than maxWait: each request waiting holds a goroutine and a
// connection, and a rule's queue may hold more than its author meant, or
// be keyed on a value a client varies to queue as many as it likes. The
// request is told to come back when its turn would have come (RetryAfter);
// the place the limiter gave it goes unused, as that of a client that
// hangs up.
func (d Decision) WithinWait(maxWait time.Duration) Decision {
	if d.Allowed && d.Delay > maxWait {
		d.Allowed, d.RetryAfter, d.Delay = false, d.Delay, 0
	}
	return d
}

// Wait holds the caller for d.Delay, the turn a leaky bucket in queue
// mode gave the request (at once when there is none), or until ctx ends,
// returning ctx's error then. The limiter has given the request its place
// and delays the ones behind it past it: going at once would break the
// rate the rule promises, giving up would waste the place. The rule's
// queue (its burst) bounds the wait.
func (d Decision) Wait(ctx context.Context) error {
	if d.Delay <= 0 {
		return nil
	}
	t := time.NewTimer(d.Delay)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// Client wraps the limiter's gRPC client.
type Client struct {
	rl      ratelimitv1.RateLimitServiceClient
	timeout time.Duration
	log     *slog.Logger
	calls   metric.Int64Counter
	// logs lets one line a second through about unanswered checks: a
	// limiter outage leaves every request of the caller unanswered.
	logs logging.Every
	// invalidLogs is logs for checks the limiter refused as invalid: an
	// outage's lines must not hide them.
	invalidLogs logging.Every
}

// New returns a client over conn. timeout bounds every call (a few
// milliseconds: the limiter must not become the caller's latency).
func New(conn grpc.ClientConnInterface, timeout time.Duration, log *slog.Logger, mp metric.MeterProvider) (*Client, error) {
	calls, err := mp.Meter("kurz.dev/pkg/quota").Int64Counter("kurz.quota.calls",
		metric.WithDescription("CheckQuota calls by outcome; outcome=degraded means the caller's policy decided, invalid that it did because the limiter refused the check, abandoned that the caller gave up first"),
		metric.WithUnit("{call}"))
	if err != nil {
		return nil, fmt.Errorf("quota metrics: %w", err)
	}
	return &Client{rl: ratelimitv1.NewRateLimitServiceClient(conn), timeout: timeout, log: log, calls: calls}, nil
}

// DefaultTimeout bounds each call of a client NewDefault makes: the
// gateway's KURZ_GATEWAY_LIMITER_TIMEOUT.
const DefaultTimeout = 50 * time.Millisecond

// NewDefault is New for a program that is not a kurz service (a Go service
// limiting its own API through pkg/quotaguard): calls bounded by
// DefaultTimeout, logs to slog.Default(), metrics to OpenTelemetry's
// global meter provider (a no-op until the program sets one). conn is the
// program's own connection to the limiter (grpc.NewClient, its transport
// credentials and options); kurz's own services use Dial.
func NewDefault(conn grpc.ClientConnInterface) (*Client, error) {
	return New(conn, DefaultTimeout, slog.Default(), otel.GetMeterProvider())
}

// Check asks the limiter about one request of cost units (1 when cost is 0;
// use Peek to look without consuming). It never returns an error: when the
// limiter is unreachable, slow or failing, policy decides and the decision is
// marked Degraded.
func (c *Client) Check(ctx context.Context, domain string, descriptors map[string]string, cost uint32, policy Policy) Decision {
	if cost == 0 {
		cost = 1
	}
	return c.call(ctx, &ratelimitv1.CheckQuotaRequest{Domain: domain, Descriptors: descriptors, Cost: &cost}, policy)
}

// Peek reports the current headroom without consuming anything.
func (c *Client) Peek(ctx context.Context, domain string, descriptors map[string]string, policy Policy) Decision {
	var zero uint32
	return c.call(ctx, &ratelimitv1.CheckQuotaRequest{Domain: domain, Descriptors: descriptors, Cost: &zero}, policy)
}

// Request is one decision of a CheckMany call.
type Request struct {
	Domain      string
	Descriptors map[string]string
	// Cost is the units to consume: 1 when 0.
	Cost uint32
}

// MaxBatch is the most requests one CheckQuotas call carries: the limiter
// takes up to 1,000 a call, but reads at most 64 KiB a request
// (server.LimiterGRPCMaxRecvMsgSize), ~200 checks of ~250 bytes.
const MaxBatch = 200

// CheckMany asks the limiter about independent requests with one
// CheckQuotas call per MaxBatch of them (each decided as Check would, not
// atomically together) and returns their decisions in order. Like Check it
// never fails: when a call does not succeed within the client's timeout,
// policy decides its requests and their decisions are marked Degraded.
func (c *Client) CheckMany(ctx context.Context, reqs []Request, policy Policy) []Decision {
	out := make([]Decision, 0, len(reqs))
	for start := 0; start < len(reqs); start += MaxBatch {
		out = append(out, c.checkBatch(ctx, reqs[start:min(start+MaxBatch, len(reqs))], policy)...)
	}
	return out
}

func (c *Client) checkBatch(ctx context.Context, reqs []Request, policy Policy) []Decision {
	out := make([]Decision, len(reqs))
	// A request that cannot be sent is decided alone: in the batch, it
	// would fail the others' encoding too.
	checks := make([]*ratelimitv1.CheckQuotaRequest, 0, len(reqs))
	sent := make([]int, 0, len(reqs)) // the index in reqs of each check
	for i, r := range reqs {
		if err := unsendable(r.Domain, r.Descriptors); err != nil {
			out[i] = c.unanswered(ctx, r.Domain, 1, policy, err)
			continue
		}
		cost := max(r.Cost, 1)
		checks = append(checks, &ratelimitv1.CheckQuotaRequest{Domain: r.Domain, Descriptors: r.Descriptors, Cost: &cost})
		sent = append(sent, i)
	}
	if len(checks) == 0 {
		return out
	}
	caller := ctx
	ctx, cancel := context.WithTimeout(ctx, c.timeout)
	defer cancel()
	resp, err := c.rl.CheckQuotas(ctx, &ratelimitv1.CheckQuotasRequest{Checks: checks})
	if err == nil && len(resp.GetResults()) != len(checks) {
		err = fmt.Errorf("the limiter answered %d of %d checks", len(resp.GetResults()), len(checks))
	}
	if err != nil {
		d := c.unanswered(caller, checks[0].GetDomain(), len(checks), policy, err)
		for _, i := range sent {
			out[i] = d
		}
		return out
	}
	for j, r := range resp.GetResults() {
		out[sent[j]] = c.decision(ctx, checks[j].GetDomain(), checks[j].GetCost(), r)
	}
	return out
}

func (c *Client) call(ctx context.Context, req *ratelimitv1.CheckQuotaRequest, policy Policy) Decision {
	if err := unsendable(req.GetDomain(), req.GetDescriptors()); err != nil {
		return c.unanswered(ctx, req.GetDomain(), 1, policy, err)
	}
	caller := ctx
	ctx, cancel := context.WithTimeout(ctx, c.timeout)
	defer cancel()
	resp, err := c.rl.CheckQuota(ctx, req)
	if err != nil {
		return c.unanswered(caller, req.GetDomain(), 1, policy, err)
	}
	return c.decision(ctx, req.GetDomain(), req.GetCost(), resp)
}

// unsendable is the INVALID_ARGUMENT the limiter would answer a check of
// domain and descriptors that protobuf cannot encode (text not valid
// UTF-8), or nil: sent, it would fail as INTERNAL, read as the limiter
// unavailable, when it is the caller's bad input. It names the descriptor
// but never repeats its value (a stranger's bytes, maybe a credential).
func unsendable(domain string, descriptors map[string]string) error {
	if !utf8.ValidString(domain) {
		return status.Errorf(codes.InvalidArgument, "domain %q is not valid UTF-8", domain)
	}
	for k, v := range descriptors {
		switch {
		case !utf8.ValidString(k):
			return status.Errorf(codes.InvalidArgument, "descriptor name %q is not valid UTF-8", k)
		case !utf8.ValidString(v):
			return status.Errorf(codes.InvalidArgument, "descriptor %q: the value is not valid UTF-8", k)
		}
	}
	return nil
}

// unanswered is the decision of n checks the limiter did not answer: the
// policy's, Abandoned when the caller's context ended first (counted apart,
// not logged: a client hanging up is not the limiter failing, and a line
// each would let anyone fill the log), Invalid when the limiter refused
// them (the caller's mistake: counted apart and logged as an error, or a
// fail-open caller would let everything past its limits under a line
// blaming the limiter), else counted and logged degraded.
func (c *Client) unanswered(caller context.Context, domain string, n int, policy Policy, err error) Decision {
	d := Decision{Allowed: policy == FailOpen, Degraded: true}
	outcome := "degraded"
	switch {
	case caller.Err() != nil:
		d.Abandoned, outcome = true, "abandoned"
	case status.Code(err) == codes.InvalidArgument:
		d.Invalid, outcome = true, "invalid"
		if left, ok := c.invalidLogs.Allow(); ok {
			c.log.ErrorContext(caller, "limiter refused the check as invalid; caller policy applies to every such check until the caller or the limiter's rules are mended",
				"domain", domain, "checks", n, "policy", policy.String(), "calls_not_logged", left, "err", err)
		}
	default:
		if left, ok := c.logs.Allow(); ok {
			c.log.WarnContext(caller, "limiter unavailable; caller policy applies",
				"domain", domain, "checks", n, "policy", policy.String(), "calls_not_logged", left, "err", err)
		}
	}
	c.calls.Add(context.WithoutCancel(caller), int64(n), metric.WithAttributes(
		attribute.String("domain", domain), attribute.String("outcome", outcome),
		attribute.String("policy", policy.String())))
	return d
}

// decision turns the limiter's answer to a request of cost into a
// Decision, counting it.
func (c *Client) decision(ctx context.Context, domain string, cost uint32, resp *ratelimitv1.CheckQuotaResponse) Decision {
	outcome := "allowed"
	if !resp.GetAllowed() {
		outcome = "denied"
	}
	c.calls.Add(ctx, 1, metric.WithAttributes(
		attribute.String("domain", domain), attribute.String("outcome", outcome)))
	d := Decision{
		Allowed:    resp.GetAllowed(),
		Rule:       resp.GetDecidingRule(),
		Limit:      resp.GetLimit(),
		Remaining:  resp.GetRemaining(),
		ResetAfter: resp.GetResetAfter().AsDuration(),
		RetryAfter: resp.GetRetryAfter().AsDuration(),
		Source:     resp.GetSource(),
	}
	for _, rd := range resp.GetDecisions() {
		if rd.GetRule() == d.Rule {
			d.Delay = rd.GetDelay().AsDuration()
			d.Window = rd.GetWindow().AsDuration()
		}
		if c := rd.GetCapacity(); !rd.GetAllowed() && rd.GetSource() != ratelimitv1.DecisionSource_DECISION_SOURCE_SHADOW &&
			c > 0 && int64(cost) > c && (d.MaxCost == 0 || c < d.MaxCost) {
			d.MaxCost = c
		}
	}
	return d
}

// Dial connects to the limiter at target (the caller's
// KURZ_LIMITER_GRPC_ADDR) with kurz's gRPC client settings and returns a
// client over that connection, and the function that closes it.
func Dial(target string, tel *telemetry.Telemetry, timeout time.Duration, log *slog.Logger) (*Client, func() error, error) {
	conn, err := grpcclient.Dial(target, tel)
	if err != nil {
		return nil, nil, fmt.Errorf("limiter (KURZ_LIMITER_GRPC_ADDR): %w", err)
	}
	c, err := New(conn, timeout, log, tel.MeterProvider)
	if err != nil {
		return nil, nil, errors.Join(err, conn.Close())
	}
	return c, conn.Close, nil
}
