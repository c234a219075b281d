package quotaapi

import (
	"context"
	"fmt"
	"math"
	"net/netip"
	"strconv"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"

	ratelimitv1 "kurz.dev/gen/kurz/ratelimit/v1"
	"kurz.dev/pkg/clientip"
	"kurz.dev/pkg/ratelimitfields"
	"kurz.dev/pkg/rpcerr"
)

// EnvoyService serves envoy.service.ratelimit.v3.RateLimitService, so Envoy,
// Istio or any gateway speaking that API can use kurz's rules (and its token
// buckets and sliding windows) in place of envoyproxy/ratelimit.
//
// Mapping: the request's domain is a kurz domain; each descriptor's entries
// become one descriptor set (entry key -> value); hits_addend is the cost
// (0 means 1, as in Envoy), a descriptor's own hits_addend its own cost
// (0: checked, nothing consumed, as in Envoy). All descriptors are decided
// together, all or nothing, and each gets a status from the most
// restrictive of its rules; is_negative_hits is refused. The value of a remote_address entry (Envoy's
// RemoteAddress action) that is an IPv6 address is keyed by its prefix
// (KURZ_LIMITER_ENVOY_IPV6_PREFIX), as the gateway and the redirect key
// their clients: one client's /64 is one counter.
type EnvoyService struct {
	rlsv3.UnimplementedRateLimitServiceServer
	engine  Engine
	headers HeaderStyle
	keying  clientip.Keying
}

// RemoteAddressKey is the descriptor entry of Envoy's RemoteAddress action.
const RemoteAddressKey = "remote_address"

// HeaderStyle chooses the rate-limit fields the response asks Envoy to add.
type HeaderStyle string

const (
	// HeadersDraft: RateLimit and RateLimit-Policy, the current IETF draft's
	// fields (as the gateway sends them).
	HeadersDraft HeaderStyle = "draft"
	// HeadersLegacy: RateLimit-Limit, -Remaining and -Reset, an earlier
	// draft's fields, for clients that read those.
	HeadersLegacy HeaderStyle = "legacy"
	// HeadersBoth: all five.
	HeadersBoth HeaderStyle = "both"
)

// ParseHeaderStyle reads a HeaderStyle from configuration.
func ParseHeaderStyle(s string) (HeaderStyle, error) {
	switch h := HeaderStyle(s); h {
	case HeadersDraft, HeadersLegacy, HeadersBoth:
		return h, nil
	}
	return "", fmt.Errorf("rate-limit header style %q: want draft, legacy or both", s)
}

// NewEnvoy returns Envoy's rate-limit service over engine, adding the
// rate-limit fields of style to responses.
func NewEnvoy(engine Engine, style HeaderStyle, keying clientip.Keying) *EnvoyService {
	return &EnvoyService{engine: engine, headers: style, keying: keying}
}

// ShouldRateLimit implements rlsv3.RateLimitServiceServer.
func (s *EnvoyService) ShouldRateLimit(ctx context.Context, req *rlsv3.RateLimitRequest) (*rlsv3.RateLimitResponse, error) {
	if req.GetDomain() == "" {
		return nil, rpcerr.Invalidf("domain", ReasonDomainRequired, "domain is required").Status()
	}
	if len(req.GetDescriptors()) == 0 {
		return nil, rpcerr.Invalidf("descriptors", ReasonDescriptorsInvalid, "at least one descriptor is required").Status()
	}
	// Each descriptor is decided against every rule of the domain: bound
	// them as CheckQuota bounds its descriptors.
	if n := len(req.GetDescriptors()); n > maxDescriptors {
		return nil, rpcerr.Invalidf("descriptors", ReasonDescriptorsInvalid, "%d descriptors: at most %d", n, maxDescriptors).Status()
	}
	cost := uint32(1)
	if req.GetHitsAddend() > 0 {
		cost = req.GetHitsAddend()
	}
	n := len(req.GetDescriptors())
	costs := make([]int64, n)
	// descs are the descriptors that can match a rule; once one is left
	// out, live holds their indices in the request (nil until then, which
	// is every request but a rare one).
	descs := make([]map[string]string, 0, n)
	var live []int
	for j, d := range req.GetDescriptors() {
		// is_negative_hits asks for a refund, which would otherwise consume.
		if d.GetIsNegativeHits() {
			return nil, rpcerr.Invalidf(fmt.Sprintf("descriptors[%d].is_negative_hits", j), ReasonCostInvalid,
				"descriptor %d: is_negative_hits is not supported", j).Status()
		}
		// A descriptor's own hits_addend is its cost, as in Envoy, where a
		// route can take it from a request header: refused, it would have
		// let the request through. A set 0 checks without consuming, as
		// envoyproxy/ratelimit does (a route checks on the request and
		// charges on stream done); CheckEach denies it when its rules have
		// not one unit left, since a charge kurz denies consumes nothing.
		costs[j] = int64(cost)
		if h := d.GetHitsAddend(); h != nil {
			costs[j] = int64(min(h.GetValue(), math.MaxUint32))
		}
		m := make(map[string]string, len(d.GetEntries()))
		repeated := false
		for _, e := range d.GetEntries() {
			if _, dup := m[e.GetKey()]; dup {
				repeated = true
			}
			v := e.GetValue()
			if e.GetKey() == RemoteAddressKey {
				if a, err := netip.ParseAddr(v); err == nil {
					v = s.keying.Key(a)
				}
			}
			m[e.GetKey()] = v
		}
		// A domain with no rules limits nothing, as in envoyproxy/ratelimit:
		// every descriptor is OK, so a reload that drops a domain does
		// not turn into errors (and denials under failure_mode_deny).
		// Neither the values nor the cost are bounded as CheckQuota's
		// are: Envoy takes values from request headers, which a client can
		// pad, and lets a request through on any error unless
		// failure_mode_deny is set, so the longer a value or the larger a
		// hits_addend the surer it would pass. The gRPC message bound
		// (server.LimiterGRPCMaxRecvMsgSize, 64 KiB: a descriptor of a
		// header at Envoy's default bound of 60 KiB) bounds them; a rule's key holds a value over 64 bytes as its
		// digest, and a cost over a rule's capacity is denied by the rule.
		if _, inv := validateDescriptors(m, nil, false); inv != nil {
			return nil, envoyField(inv, j).Status()
		}
		// A descriptor with a key twice is a path with that key twice,
		// which no limit has (envoyproxy/ratelimit's walk never reaches
		// one; its files cannot repeat a key on a path, nor can a rule's
		// key): it is limited by nothing, OK. Folded into one value per
		// key it would have been limited by the rules of the last value.
		if repeated {
			if live == nil {
				live = make([]int, len(descs), n)
				for k := range live {
					live[k] = k
				}
			}
			continue
		}
		descs = append(descs, m)
		if live != nil {
			live = append(live, j)
		}
	}

	resp, owners := &ratelimitv1.CheckQuotaResponse{Allowed: true}, [][]int(nil)
	switch {
	case len(descs) == n:
		resp, owners = s.engine.CheckEach(ctx, req.GetDomain(), descs, costs)
	case len(descs) > 0:
		// The engine numbers the live descriptors from 0: its owners are
		// renumbered as the request's.
		liveCosts := make([]int64, len(live))
		for i, j := range live {
			liveCosts[i] = costs[j]
		}
		resp, owners = s.engine.CheckEach(ctx, req.GetDomain(), descs, liveCosts)
		for i := range owners {
			remapped := make([]int, len(owners[i]))
			for k, j := range owners[i] {
				remapped[k] = live[j]
			}
			owners[i] = remapped
		}
	}
	out := &rlsv3.RateLimitResponse{
		OverallCode: rlsv3.RateLimitResponse_OK,
		Statuses:    make([]*rlsv3.RateLimitResponse_DescriptorStatus, n),
	}
	// Each descriptor's status and limit, allocated together.
	type status struct {
		st    rlsv3.RateLimitResponse_DescriptorStatus
		limit rlsv3.RateLimitResponse_RateLimit
	}
	statuses := make([]status, n)
	if !resp.GetAllowed() {
		out.OverallCode = rlsv3.RateLimitResponse_OVER_LIMIT
	}
	// The deciding decision of each descriptor: its denial with the longest
	// retry-after, else its rule with the least headroom.
	deciding := make([]*ratelimitv1.RuleDecision, n)
	for i, d := range resp.GetDecisions() {
		if s := d.GetSource(); s == ratelimitv1.DecisionSource_DECISION_SOURCE_SHADOW || s == ratelimitv1.DecisionSource_DECISION_SOURCE_UNLIMITED {
			continue
		}
		for _, j := range owners[i] {
			if moreRestrictive(d, deciding[j]) {
				deciding[j] = d
			}
		}
	}
	// A descriptor whose rules are all shadow rules reports the tightest of
	// them, OK whatever it decided, as envoyproxy/ratelimit reports a
	// limit in shadow mode (Envoy's X-RateLimit headers read it).
	for i, d := range resp.GetDecisions() {
		if d.GetSource() != ratelimitv1.DecisionSource_DECISION_SOURCE_SHADOW {
			continue
		}
		for _, j := range owners[i] {
			if s := deciding[j]; s == nil || s.GetSource() == ratelimitv1.DecisionSource_DECISION_SOURCE_SHADOW && moreRestrictive(d, s) {
				deciding[j] = d
			}
		}
	}
	// A descriptor whose rules are unlimited reports what
	// envoyproxy/ratelimit does for one: OK, no current limit (so no
	// X-RateLimit headers from it), the most a uint32 holds remaining.
	for i, d := range resp.GetDecisions() {
		if d.GetSource() != ratelimitv1.DecisionSource_DECISION_SOURCE_UNLIMITED {
			continue
		}
		for _, j := range owners[i] {
			if deciding[j] == nil {
				deciding[j] = d
			}
		}
	}
	for j := range n {
		st := &statuses[j].st
		st.Code = rlsv3.RateLimitResponse_OK
		if d := deciding[j]; d.GetSource() == ratelimitv1.DecisionSource_DECISION_SOURCE_UNLIMITED {
			st.LimitRemaining = math.MaxUint32
		} else if d != nil {
			if !d.GetAllowed() && d.GetSource() != ratelimitv1.DecisionSource_DECISION_SOURCE_SHADOW {
				st.Code = rlsv3.RateLimitResponse_OVER_LIMIT
			}
			st.CurrentLimit = &statuses[j].limit
			setEnvoyLimit(st.CurrentLimit, d)
			st.LimitRemaining = uint32(max(0, min(d.GetRemaining(), int64(^uint32(0)))))
			st.DurationUntilReset = d.GetResetAfter()
		}
		out.Statuses[j] = st
	}
	// An unlimited rule decides only a request no other rule limits: it
	// has no limit to tell.
	if resp.GetDecidingRule() != "" && resp.GetSource() != ratelimitv1.DecisionSource_DECISION_SOURCE_UNLIMITED {
		out.ResponseHeadersToAdd = rateLimitHeaders(req.GetDomain(), resp, s.headers, never(resp, owners, costs))
	}
	return out, nil
}

// envoyField names, in Envoy's request, the field of a refusal validate
// made of descriptor j: the cost is the request's hits_addend, a
// descriptor's entries are descriptors[j].entries.
func envoyField(inv *rpcerr.Invalid, j int) *rpcerr.Invalid {
	switch inv.Field {
	case "cost":
		return &rpcerr.Invalid{Field: "hits_addend", Reason: inv.Reason, Message: inv.Message}
	case "descriptors":
		return &rpcerr.Invalid{Field: fmt.Sprintf("descriptors[%d].entries", j), Reason: inv.Reason, Message: inv.Message}
	}
	return inv
}

// moreRestrictive reports whether a should decide over b.
func moreRestrictive(a, b *ratelimitv1.RuleDecision) bool {
	switch {
	case b == nil:
		return true
	case a.GetAllowed() != b.GetAllowed():
		return !a.GetAllowed()
	case !a.GetAllowed():
		return a.GetRetryAfter().AsDuration() > b.GetRetryAfter().AsDuration()
	default:
		return float64(a.GetRemaining())*float64(b.GetLimit()) < float64(b.GetRemaining())*float64(a.GetLimit())
	}
}

// envoyUnits are Envoy's units, shortest first, with the lengths
// envoyproxy/ratelimit gives them (utils.UnitToDivider: a month is 30
// days, a year 365).
var envoyUnits = []struct {
	unit rlsv3.RateLimitResponse_RateLimit_Unit
	d    time.Duration
}{
	{rlsv3.RateLimitResponse_RateLimit_SECOND, time.Second},
	{rlsv3.RateLimitResponse_RateLimit_MINUTE, time.Minute},
	{rlsv3.RateLimitResponse_RateLimit_HOUR, time.Hour},
	{rlsv3.RateLimitResponse_RateLimit_DAY, 24 * time.Hour},
	{rlsv3.RateLimitResponse_RateLimit_WEEK, 7 * 24 * time.Hour},
	{rlsv3.RateLimitResponse_RateLimit_MONTH, 30 * 24 * time.Hour},
	{rlsv3.RateLimitResponse_RateLimit_YEAR, 365 * 24 * time.Hour},
}

// envoyLimit expresses a rule's limit per window in Envoy's units (Envoy
// builds X-RateLimit-Limit from it): exactly when the window is one unit;
// else the same rate as a whole number in the unit nearest the window that
// holds it whole (120 per 2 min: 60 per minute; 3 per 48 h: 45 per month);
// else, when no unit does, rounded to the nearest whole in the unit
// nearest the window that gives at least one (7 per 11 s: 38 per minute),
// and at least 1 per year. Nearest: the longest unit within the window,
// then the shortest beyond it, whose count is closest to the limit's.
func envoyLimit(d *ratelimitv1.RuleDecision) *rlsv3.RateLimitResponse_RateLimit {
	l := &rlsv3.RateLimitResponse_RateLimit{}
	setEnvoyLimit(l, d)
	return l
}

// setEnvoyLimit sets l to envoyLimit(d).
func setEnvoyLimit(l *rlsv3.RateLimitResponse_RateLimit, d *ratelimitv1.RuleDecision) {
	l.Name = d.GetRule()
	window, limit := d.GetWindow().AsDuration(), d.GetLimit()
	// within is the number of units no longer than the window: the
	// nearest order is within-1 down to 0, then within up.
	within := 0
	for within < len(envoyUnits) && envoyUnits[within].d <= window {
		within++
	}
	if within > 0 && envoyUnits[within-1].d == window {
		l.RequestsPerUnit, l.Unit = uint32(min(max(limit, 0), math.MaxUint32)), envoyUnits[within-1].unit
		return
	}
	nearest := func(k int) int {
		if k < within {
			return within - 1 - k
		}
		return k
	}
	if window > 0 && limit > 0 {
		for k := range envoyUnits {
			u := envoyUnits[nearest(k)]
			// limit*u/window is whole when window/g divides limit, g the
			// units' greatest common divisor: no product that overflows.
			g := gcd(int64(u.d), int64(window))
			w, m := int64(window)/g, int64(u.d)/g
			if limit%w == 0 && limit/w <= math.MaxUint32/m {
				l.RequestsPerUnit, l.Unit = uint32(limit/w*m), u.unit
				return
			}
		}
		for k := range envoyUnits {
			u := envoyUnits[nearest(k)]
			if n := float64(limit) * float64(u.d) / float64(window); n >= 1 {
				l.RequestsPerUnit, l.Unit = uint32(min(math.Round(n), math.MaxUint32)), u.unit
				return
			}
		}
	}
	l.RequestsPerUnit, l.Unit = 1, rlsv3.RateLimitResponse_RateLimit_YEAR
}

// gcd is the greatest common divisor of a and b, both positive.
func gcd(a, b int64) int64 {
	for b != 0 {
		a, b = b, a%b
	}
	return a
}

// never reports whether a rule denied a cost it can never hold: the sum
// of the costs of the descriptor sets that share the rule's key (owners:
// CheckEach decides such a key once, at that sum), over the rule's
// capacity.
func never(resp *ratelimitv1.CheckQuotaResponse, owners [][]int, costs []int64) bool {
	for i, d := range resp.GetDecisions() {
		if d.GetAllowed() || d.GetSource() == ratelimitv1.DecisionSource_DECISION_SOURCE_SHADOW || d.GetCapacity() <= 0 {
			continue
		}
		cost := costs[0]
		if i < len(owners) && len(owners[i]) > 0 {
			cost = 0
			for _, j := range owners[i] {
				cost += costs[j]
			}
		}
		if cost > d.GetCapacity() {
			return true
		}
	}
	return false
}

// rateLimitHeaders are the rate-limit fields of style for the deciding
// rule (its policy named domain/rule), and Retry-After on a denial (whole
// seconds, rounded up, at least 1) unless never: waiting would not help.
func rateLimitHeaders(domain string, resp *ratelimitv1.CheckQuotaResponse, style HeaderStyle, never bool) []*corev3.HeaderValue {
	q := ratelimitfields.Quota{
		Policy: domain + "/" + resp.GetDecidingRule(), Limit: resp.GetLimit(),
		Remaining: resp.GetRemaining(), ResetAfter: resp.GetResetAfter().AsDuration(),
		// A denial no wait can lift is told as the rule stands (its
		// remaining, its reset), not as "empty until retry-after".
		Allowed: resp.GetAllowed() || never, RetryAfter: resp.GetRetryAfter().AsDuration(),
	}
	for _, d := range resp.GetDecisions() {
		if d.GetRule() == resp.GetDecidingRule() {
			q.Window = d.GetWindow().AsDuration()
			break
		}
	}
	// The fields in one allocation and their pointers in another: every
	// answer of a domain with rules carries them.
	n := 0
	if style != HeadersLegacy {
		n += 2
	}
	if style == HeadersLegacy || style == HeadersBoth {
		n += 3
	}
	if !q.Allowed {
		n++
	}
	vals, h := make([]corev3.HeaderValue, n), make([]*corev3.HeaderValue, 0, n)
	add := func(k, v string) {
		i := len(h)
		vals[i].Key, vals[i].Value = k, v
		h = append(h, &vals[i])
	}
	if style != HeadersLegacy {
		policy, state := ratelimitfields.Fields(q)
		add(ratelimitfields.PolicyField, policy)
		add(ratelimitfields.StateField, state)
	}
	if style == HeadersLegacy || style == HeadersBoth {
		for _, f := range ratelimitfields.Legacy(q) {
			add(f[0], f[1])
		}
	}
	if !q.Allowed {
		add("Retry-After", strconv.FormatInt(max(1, ratelimitfields.CeilSeconds(q.RetryAfter)), 10))
	}
	return h
}
