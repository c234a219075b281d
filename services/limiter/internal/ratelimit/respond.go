package ratelimit

import (
	"slices"
	"time"

	"google.golang.org/protobuf/types/known/durationpb"

	ratelimitv1 "kurz.dev/gen/kurz/ratelimit/v1"
)

// respond combines the rules' results: allowed only if every enforced rule
// allows; the deciding rule is the denying rule with the longest retry-after,
// or, when allowed, the rule with the least headroom.
func (e *Engine) respond(domain string, rules []Applied, results []result) *ratelimitv1.CheckQuotaResponse {
	// The response's messages in two allocations instead of six per rule:
	// this runs on every decision, and a hot key's answers from the
	// over-limit cache are little else.
	blk := &struct {
		resp  ratelimitv1.CheckQuotaResponse
		zero  durationpb.Duration
		one   [1]*ratelimitv1.RuleDecision
		first decisionBlock
	}{}
	resp := &blk.resp
	resp.Allowed = true
	blocks := []decisionBlock(nil)
	if len(rules) == 1 {
		resp.Decisions = blk.one[:]
	} else {
		resp.Decisions = make([]*ratelimitv1.RuleDecision, len(rules))
		blocks = make([]decisionBlock, len(rules))
	}
	deciding := -1
	for i, a := range rules {
		r, res := a.Rule, results[i]
		b := &blk.first
		if blocks != nil {
			b = &blocks[i]
		}
		b.window.Seconds, b.window.Nanos = durationParts(r.Window)
		b.resetAfter.Seconds, b.resetAfter.Nanos = durationParts(res.resetAfter)
		b.retryAfter.Seconds, b.retryAfter.Nanos = durationParts(res.retryAfter)
		b.delay.Seconds, b.delay.Nanos = durationParts(res.delay)
		d := &b.d
		d.Rule, d.Algorithm, d.Allowed = r.Name, r.Algorithm, res.allowed
		d.Limit, d.Remaining = res.limit, res.remaining
		d.Window, d.ResetAfter, d.RetryAfter, d.Delay = &b.window, &b.resetAfter, &b.retryAfter, &b.delay
		d.Source, d.Capacity = res.source, r.capacity()
		resp.Decisions[i] = d
		if r.Shadow || r.Unlimited {
			// Neither limits: an enforced rule beside them decides.
			continue
		}
		if !res.allowed {
			if resp.Allowed || res.retryAfter > results[deciding].retryAfter {
				deciding = i
			}
			resp.Allowed = false
			continue
		}
		if resp.Allowed && (deciding < 0 || headroom(res, r) < headroom(results[deciding], rules[deciding].Rule)) {
			deciding = i
		}
	}
	if deciding < 0 {
		// Only shadow or unlimited rules applied: a shadow rule tells
		// the request, whatever the rules' order, as envoyproxy/ratelimit
		// takes its headers from a shadow limit and never from an
		// unlimited one, which has none to tell.
		deciding = max(0, slices.IndexFunc(rules, func(a Applied) bool { return !a.Rule.Unlimited }))
	}
	d := resp.Decisions[deciding]
	resp.DecidingRule = d.Rule
	resp.Limit, resp.Remaining = d.Limit, d.Remaining
	resp.ResetAfter, resp.RetryAfter = d.ResetAfter, d.RetryAfter
	resp.Source = d.Source
	if resp.Allowed {
		resp.RetryAfter = &blk.zero
	}
	return resp
}

// decisionBlock is one rule's decision and its durations, allocated
// together.
type decisionBlock struct {
	d                                     ratelimitv1.RuleDecision
	window, resetAfter, retryAfter, delay durationpb.Duration
}

// durationParts is durationpb.New's seconds and nanoseconds, without the
// allocation.
func durationParts(d time.Duration) (int64, int32) {
	return int64(d / time.Second), int32(d % time.Second)
}

// headroom is the share of the rule's capacity still available: remaining
// over the burst for buckets (which hold at most the burst, not the limit),
// over the limit otherwise.
func headroom(res result, r *Rule) float64 {
	c := r.capacity()
	if res.source == ratelimitv1.DecisionSource_DECISION_SOURCE_LOCAL_FALLBACK {
		c = res.limit // the local share
	}
	if c <= 0 {
		return 0
	}
	return float64(res.remaining) / float64(c)
}
