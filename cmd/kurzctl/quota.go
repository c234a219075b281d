package main

import (
	"context"
	"errors"
	"fmt"
	"github.com/spf13/pflag"
	"io"
	"strings"
	"text/tabwriter"
	"time"

	metricnoop "go.opentelemetry.io/otel/metric/noop"
	tracenoop "go.opentelemetry.io/otel/trace/noop"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"

	ratelimitv1 "kurz.dev/gen/kurz/ratelimit/v1"
	"kurz.dev/pkg/grpcclient"
	"kurz.dev/pkg/telemetry"
)

func quotaCheckCommand() *command {
	return &command{
		name: "quota check", summary: "ask the limiter for a decision (consumes quota)", maxArgs: 0,
		help: `Asks the limiter whether a request may proceed, as a service would: the hits
are consumed from every rule that matches (--hits 0 only looks). Prints the
verdict, the deciding rule and every rule's decision.

Examples:
  kurzctl quota check --domain api --descriptor tenant=acme --descriptor api_key=k1
  kurzctl quota check --domain links.create --descriptor tenant=acme --hits 0`,
		setup: func(c *cli, fs *pflag.FlagSet) func([]string) error { return setupQuota(c, fs, "quota check") },
	}
}

func quotaExplainCommand() *command {
	return &command{
		name: "quota explain", summary: "show which limiter rule decides, and why (consumes nothing)", maxArgs: 0,
		help: `Shows every rule of the domain that matches the descriptors, with its limits
after the tenant's plan, its state right now and what it would decide for
--hits; marks the deciding rule (▶) and says why it decides. Nothing is
consumed: how to answer "why was I throttled?".

Examples:
  kurzctl quota explain --domain api --descriptor tenant=acme
  kurzctl quota explain --domain links.create --descriptor tenant=acme \
      --descriptor ip=203.0.113.7 --hits 20`,
		setup: func(c *cli, fs *pflag.FlagSet) func([]string) error { return setupQuota(c, fs, "quota explain") },
	}
}

func setupQuota(c *cli, fs *pflag.FlagSet, cmd string) func([]string) error {
	domain := fs.String("domain", "", "the rule `domain`, e.g. api, links.create, auth (required)")
	descs := fs.StringArray("descriptor", nil, "a descriptor `name=value`, e.g. tenant=acme (repeat for several)")
	hits := fs.Uint("hits", 1, "the request's cost in `units`")
	return func([]string) error {
		if *domain == "" {
			return usagef(cmd, "--domain is required, e.g. --domain api")
		}
		desc := map[string]string{}
		for _, d := range *descs {
			k, v, ok := strings.Cut(d, "=")
			if !ok || k == "" {
				return usagef(cmd, "--descriptor %q: want name=value, e.g. tenant=acme", d)
			}
			desc[k] = v
		}
		cost := uint32(*hits)
		if uint(cost) != *hits {
			return usagef(cmd, "--hits %d is too large", *hits)
		}
		conn, err := grpcclient.Dial(c.g.limiter, &telemetry.Telemetry{
			TracerProvider: tracenoop.NewTracerProvider(), MeterProvider: metricnoop.NewMeterProvider()})
		if err != nil {
			return usagef(cmd, "--limiter %q: %v", c.g.limiter, err)
		}
		defer conn.Close()
		client := ratelimitv1.NewRateLimitServiceClient(conn)
		ctx, cancel := c.callContext()
		defer cancel()
		if cmd == "quota check" {
			resp, err := client.CheckQuota(ctx, &ratelimitv1.CheckQuotaRequest{Domain: *domain, Descriptors: desc, Cost: &cost}, grpc.WaitForReady(true))
			if err != nil {
				return c.limiterError(err)
			}
			if c.json() {
				return writeProtoJSON(c.stdout, resp)
			}
			return printCheck(c.stdout, *domain, cost, resp)
		}
		resp, err := client.ExplainQuota(ctx, &ratelimitv1.ExplainQuotaRequest{Domain: *domain, Descriptors: desc, Cost: &cost}, grpc.WaitForReady(true))
		if err != nil {
			return c.limiterError(err)
		}
		if c.json() {
			return writeProtoJSON(c.stdout, resp)
		}
		return printExplain(c.stdout, *domain, cost, resp)
	}
}

// callContext bounds one call by --timeout.
func (c *cli) callContext() (context.Context, context.CancelFunc) {
	if c.g.timeout == 0 {
		return context.WithCancel(c.ctx)
	}
	return context.WithTimeout(c.ctx, c.g.timeout)
}

// limiterError is the limiter's message, or what to check when it could
// not be reached.
func (c *cli) limiterError(err error) error {
	st := status.Convert(err)
	switch st.Code() {
	case codes.Unavailable, codes.DeadlineExceeded:
		return fmt.Errorf("cannot reach the limiter at %s (set --limiter or KURZ_LIMITER_ADDR): %s", c.g.limiter, st.Message())
	case codes.Canceled:
		return context.Canceled
	}
	return errors.New(st.Message())
}

// printCheck shows a CheckQuota answer.
func printCheck(w io.Writer, domain string, cost uint32, r *ratelimitv1.CheckQuotaResponse) error {
	if len(r.GetDecisions()) == 0 {
		_, err := fmt.Fprintf(w, "allowed: no rule of domain %s matches these descriptors\n", domain)
		return err
	}
	if r.GetAllowed() {
		fmt.Fprintf(w, "allowed %d hits in %s; deciding rule %s: %d of %d left, full again in %s\n",
			cost, domain, r.GetDecidingRule(), r.GetRemaining(), r.GetLimit(), formatDuration(r.GetResetAfter()))
	} else {
		fmt.Fprintf(w, "denied %d hits in %s by rule %s: retry after %s\n",
			cost, domain, r.GetDecidingRule(), formatDuration(r.GetRetryAfter()))
	}
	fmt.Fprintln(w)
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "  RULE\tALGORITHM\tLIMIT\tREMAINING\tRESET\tRETRY AFTER\tSOURCE\tVERDICT")
	for _, d := range r.GetDecisions() {
		mark := " "
		if d.GetRule() == r.GetDecidingRule() {
			mark = "▶"
		}
		fmt.Fprintf(tw, "%s %s\t%s\t%s\t%d\t%s\t%s\t%s\t%s\n", mark, d.GetRule(), algorithmName(d.GetAlgorithm()),
			limitText(d), d.GetRemaining(), formatDuration(d.GetResetAfter()), retryText(d), sourceName(d.GetSource()), verdict(d.GetAllowed()))
	}
	return tw.Flush()
}

// printExplain shows an ExplainQuota answer: the verdict, the deciding rule
// and why, then every matching rule.
func printExplain(w io.Writer, domain string, cost uint32, r *ratelimitv1.ExplainQuotaResponse) error {
	rules := r.GetRules()
	if len(rules) == 0 {
		_, err := fmt.Fprintf(w, "%d hits in %s would be allowed: no rule of the domain matches these descriptors\n", cost, domain)
		return err
	}
	v := "allowed"
	if !r.GetAllowed() {
		v = "denied"
	}
	match := fmt.Sprintf("%d rules match", len(rules))
	if len(rules) == 1 {
		match = "1 rule matches"
	}
	fmt.Fprintf(w, "%d hits in %s would be %s; %s\n", cost, domain, v, match)
	deciding, why := decidingRule(rules, cost)
	fmt.Fprintf(w, "%s\n\n", why)
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "  RULE\tALGORITHM\tPLAN\tLIMIT\tBURST\tREMAINING\tRESET\tRETRY AFTER\tFAILURE MODE\tVERDICT")
	for i, e := range rules {
		d := e.GetDecision()
		mark := " "
		if i == deciding {
			mark = "▶"
		}
		v := verdict(d.GetAllowed())
		if e.GetShadow() {
			v += " (shadow)"
		}
		fmt.Fprintf(tw, "%s %s\t%s\t%s\t%s\t%d\t%d\t%s\t%s\t%s\t%s\n", mark, d.GetRule(), algorithmName(d.GetAlgorithm()),
			orDash(e.GetPlan()), limitText(d), e.GetBurst(), d.GetRemaining(), formatDuration(d.GetResetAfter()),
			retryText(d), failureModeName(e.GetFailureMode()), v)
	}
	return tw.Flush()
}

// decidingRule picks the rule the limiter's CheckQuota would name (the
// enforced rule that denies with the longest retry-after or, when all
// allow, the one with the least headroom) and says why; -1 when only shadow
// rules match.
func decidingRule(rules []*ratelimitv1.RuleExplanation, cost uint32) (int, string) {
	deciding, denials := -1, 0
	headroom := func(e *ratelimitv1.RuleExplanation) float64 {
		if e.GetBurst() <= 0 {
			return 0
		}
		return float64(e.GetDecision().GetRemaining()) / float64(e.GetBurst())
	}
	for i, e := range rules {
		if e.GetShadow() {
			continue
		}
		d := e.GetDecision()
		switch {
		case !d.GetAllowed():
			if denials == 0 || d.GetRetryAfter().AsDuration() > rules[deciding].GetDecision().GetRetryAfter().AsDuration() {
				deciding = i
			}
			denials++
		case denials == 0 && (deciding < 0 || headroom(e) < headroom(rules[deciding])):
			deciding = i
		}
	}
	if deciding < 0 {
		return -1, "only shadow rules match: they are evaluated and logged, never enforced"
	}
	e := rules[deciding]
	d := e.GetDecision()
	name := d.GetRule()
	if e.GetPlan() != "" {
		name += fmt.Sprintf(" (plan %s)", e.GetPlan())
	}
	if denials == 0 {
		return deciding, fmt.Sprintf("%s decides: it has the least headroom, %d of %d left (%.0f%%)",
			name, d.GetRemaining(), e.GetBurst(), 100*headroom(e))
	}
	why := fmt.Sprintf("%s decides: it denies", name)
	if denials > 1 {
		why += ", with the longest retry-after of the rules that deny"
	}
	if int64(cost) > e.GetBurst() {
		return deciding, why + fmt.Sprintf(": %d hits exceed its capacity of %d, so they never pass at once", cost, e.GetBurst())
	}
	return deciding, why + fmt.Sprintf(": %d hits, %d left; retry after %s", cost, d.GetRemaining(), formatDuration(d.GetRetryAfter()))
}

func verdict(allowed bool) string {
	if allowed {
		return "allow"
	}
	return "deny"
}

// limitText is "limit/window", e.g. 60/1m.
func limitText(d *ratelimitv1.RuleDecision) string {
	return fmt.Sprintf("%d/%s", d.GetLimit(), formatDuration(d.GetWindow()))
}

func retryText(d *ratelimitv1.RuleDecision) string {
	if d.GetAllowed() || d.GetRetryAfter().AsDuration() <= 0 {
		return "-"
	}
	return formatDuration(d.GetRetryAfter())
}

// formatDuration writes whole units compactly (1m, 15m, 1h, 2.5s, 120ms).
func formatDuration(p *durationpb.Duration) string {
	d := p.AsDuration()
	switch {
	case d == 0:
		return "0s"
	case d%time.Hour == 0:
		return fmt.Sprintf("%dh", d/time.Hour)
	case d%time.Minute == 0:
		return fmt.Sprintf("%dm", d/time.Minute)
	case d < time.Second:
		return d.Round(time.Millisecond).String()
	}
	return d.Round(100 * time.Millisecond).String()
}

// enumName is an enum value's name without its prefix, in lower case:
// ALGORITHM_TOKEN_BUCKET is token_bucket.
func enumName(s, prefix string) string {
	return strings.ToLower(strings.TrimPrefix(s, prefix))
}

func algorithmName(a ratelimitv1.Algorithm) string { return enumName(a.String(), "ALGORITHM_") }

func failureModeName(f ratelimitv1.FailureMode) string {
	return enumName(f.String(), "FAILURE_MODE_")
}

func sourceName(s ratelimitv1.DecisionSource) string {
	return strings.ReplaceAll(enumName(s.String(), "DECISION_SOURCE_"), "_", " ")
}
