package ratelimit

import (
	"fmt"
	"maps"
	"slices"
	"strings"
	"time"

	ratelimitv1 "kurz.dev/gen/kurz/ratelimit/v1"
)

// Config is the whole rule configuration as written in YAML (bootstrap file)
// and stored in PostgreSQL.
type Config struct {
	Domains map[string]DomainSpec `yaml:"domains" json:"domains"`
	// Plans maps a plan name to overrides keyed by rule ID ("domain/name").
	Plans map[string]map[string]LimitSpec `yaml:"plans" json:"plans"`
	// Tenants maps a tenant to its plan.
	Tenants map[string]string `yaml:"tenants" json:"tenants"`
}

// DomainSpec is one rule namespace.
type DomainSpec struct {
	// Defaults fill descriptors a request leaves out (e.g. algo: token_bucket).
	Defaults map[string]string `yaml:"defaults,omitempty" json:"defaults,omitempty"`
	Rules    []RuleSpec        `yaml:"rules" json:"rules"`
}

// RuleSpec is a rule as written in configuration.
type RuleSpec struct {
	Name        string            `yaml:"name" json:"name"`
	Key         []string          `yaml:"key" json:"key"`
	Match       map[string]string `yaml:"match,omitempty" json:"match,omitempty"`
	Algorithm   string            `yaml:"algorithm,omitempty" json:"algorithm,omitempty"`
	Limit       int64             `yaml:"limit,omitempty" json:"limit,omitempty"`
	Window      string            `yaml:"window,omitempty" json:"window,omitempty"`
	Burst       int64             `yaml:"burst,omitempty" json:"burst,omitempty"`
	Queue       bool              `yaml:"queue,omitempty" json:"queue,omitempty"`
	FailureMode string            `yaml:"failure_mode,omitempty" json:"failure_mode,omitempty"`
	Shadow      bool              `yaml:"shadow,omitempty" json:"shadow,omitempty"`
	// Shard is "key" (default) or "tenant".
	Shard string `yaml:"shard,omitempty" json:"shard,omitempty"`
	// Lease lets each replica take units of a hot key in advance.
	Lease *LeaseSpec `yaml:"lease,omitempty" json:"lease,omitempty"`
	// Share counts every value a match prefix ("/api/*") matches under one
	// key, instead of a key per value.
	Share bool `yaml:"share,omitempty" json:"share,omitempty"`
	// Unlimited makes a rule that limits nothing, decided in memory
	// without Redis: it is matched like any rule, so it keeps less
	// specific rules off its descriptors (envoyproxy/ratelimit's
	// unlimited: true). It takes a name, key and match only.
	Unlimited bool `yaml:"unlimited,omitempty" json:"unlimited,omitempty"`
}

// LeaseSpec is a rule's lease as written in configuration: up to Size units
// per replica and key, handed out for at most TTL (a duration such as 1s).
type LeaseSpec struct {
	Size int64  `yaml:"size" json:"size"`
	TTL  string `yaml:"ttl" json:"ttl"`
}

// LimitSpec overrides a rule's numbers for one plan; zero fields keep the
// rule's own.
type LimitSpec struct {
	Limit  int64  `yaml:"limit,omitempty" json:"limit,omitempty"`
	Window string `yaml:"window,omitempty" json:"window,omitempty"`
	Burst  int64  `yaml:"burst,omitempty" json:"burst,omitempty"`
}

var algorithms = map[string]ratelimitv1.Algorithm{
	"token_bucket":           ratelimitv1.Algorithm_ALGORITHM_TOKEN_BUCKET,
	"fixed_window":           ratelimitv1.Algorithm_ALGORITHM_FIXED_WINDOW,
	"sliding_window_counter": ratelimitv1.Algorithm_ALGORITHM_SLIDING_WINDOW,
	"sliding_log":            ratelimitv1.Algorithm_ALGORITHM_SLIDING_LOG,
	"leaky_bucket":           ratelimitv1.Algorithm_ALGORITHM_LEAKY_BUCKET,
}

// algorithmName is a's name in rules, or "unknown".
func algorithmName(a ratelimitv1.Algorithm) string {
	for name, v := range algorithms {
		if v == a {
			return name
		}
	}
	return "unknown"
}

var failureModes = map[string]ratelimitv1.FailureMode{
	"open":   ratelimitv1.FailureMode_FAILURE_MODE_OPEN,
	"closed": ratelimitv1.FailureMode_FAILURE_MODE_CLOSED,
	"local":  ratelimitv1.FailureMode_FAILURE_MODE_LOCAL,
}

// AlgorithmName is the configuration name of an algorithm.
func AlgorithmName(a ratelimitv1.Algorithm) string {
	for name, v := range algorithms {
		if v == a {
			return name
		}
	}
	return "unspecified"
}

// Rule converts the spec into a validated Rule of domain.
func (s RuleSpec) Rule(domain string) (*Rule, error) {
	// An unlimited rule leaves these out; one it gives anyway is parsed,
	// for Validate to name.
	algo, ok := algorithms[s.Algorithm]
	if !ok && (!s.Unlimited || s.Algorithm != "") {
		return nil, fmt.Errorf("rule %s/%s: algorithm %q: want one of %s", domain, s.Name, s.Algorithm, strings.Join(slices.Sorted(maps.Keys(algorithms)), ", "))
	}
	mode, ok := failureModes[s.FailureMode]
	if !ok && (!s.Unlimited || s.FailureMode != "") {
		return nil, fmt.Errorf("rule %s/%s: failure_mode %q: want open, closed or local", domain, s.Name, s.FailureMode)
	}
	var window time.Duration
	if !s.Unlimited || s.Window != "" {
		var err error
		if window, err = time.ParseDuration(s.Window); err != nil {
			return nil, fmt.Errorf("rule %s/%s: window %q: want a duration such as 1s, 60s, 1h", domain, s.Name, s.Window)
		}
	}
	if s.Shard != "" && s.Shard != "key" && s.Shard != "tenant" {
		return nil, fmt.Errorf("rule %s/%s: shard %q: want key or tenant", domain, s.Name, s.Shard)
	}
	var lease Lease
	if s.Lease != nil {
		ttl, err := time.ParseDuration(s.Lease.TTL)
		if err != nil {
			return nil, fmt.Errorf("rule %s/%s: lease: ttl %q: want a duration such as 500ms or 5s", domain, s.Name, s.Lease.TTL)
		}
		lease = Lease{Size: s.Lease.Size, TTL: ttl}
	}
	r := &Rule{
		Domain: domain, Name: s.Name, Key: slices.Clone(s.Key), Match: maps.Clone(s.Match),
		Algorithm: algo, Limit: s.Limit, Window: window, Burst: s.Burst, Queue: s.Queue,
		FailureMode: mode, Shadow: s.Shadow, ShardByTenant: s.Shard == "tenant", Lease: lease,
		Share: s.Share, Unlimited: s.Unlimited,
	}
	if err := r.Validate(); err != nil {
		return nil, err
	}
	return r, nil
}

// Ruleset is an immutable, validated snapshot of the configuration, shared
// by every request until the next refresh replaces it.
type Ruleset struct {
	domains map[string]*domainRules
	plans   map[string]map[string]override
	tenants *TenantPlans
	// keyPrefix goes before every state key (Options.KeyPrefix): the
	// engine sets it on the rules it is given.
	keyPrefix string
}

type domainRules struct {
	defaults map[string]string
	rules    []*Rule
	matchers []matcher // matchers[i] is rules[i]'s
}

type override struct {
	limit  int64
	window time.Duration
	burst  int64
}

// apply returns a copy of r with o's figures (those o sets).
func (o override) apply(r *Rule) *Rule {
	c := *r
	if o.limit > 0 {
		c.Limit = o.limit
	}
	if o.window > 0 {
		c.Window = o.window
	}
	if o.burst > 0 {
		c.Burst = o.burst
	}
	return &c
}

// Compile validates cfg and builds a Ruleset. Every problem is reported, not
// only the first, so a bad file is fixed in one pass.
func Compile(cfg Config) (*Ruleset, error) {
	rs := &Ruleset{
		domains: make(map[string]*domainRules, len(cfg.Domains)),
		plans:   make(map[string]map[string]override, len(cfg.Plans)),
		tenants: NewTenantPlans(cfg.Tenants),
	}
	var errs []string
	ids := map[string]*Rule{}
	for _, domain := range slices.Sorted(maps.Keys(cfg.Domains)) {
		spec := cfg.Domains[domain]
		d := &domainRules{defaults: maps.Clone(spec.Defaults)}
		for _, k := range slices.Sorted(maps.Keys(spec.Defaults)) {
			switch {
			case !validName(k):
				errs = append(errs, fmt.Sprintf("domain %s: defaults: descriptor %q: want letters, digits, '.', '_' or '-', a name a request can send", domain, k))
			case spec.Defaults[k] == "":
				errs = append(errs, fmt.Sprintf("domain %s: defaults: descriptor %s has an empty value, which is the descriptor left out: give it a value or drop it", domain, k))
			}
		}
		for _, s := range spec.Rules {
			r, err := s.Rule(domain)
			if err != nil {
				errs = append(errs, err.Error())
				continue
			}
			if ids[r.ID()] != nil {
				errs = append(errs, fmt.Sprintf("rule %s is defined twice", r.ID()))
				continue
			}
			ids[r.ID()] = r
			d.rules = append(d.rules, r)
			d.matchers = append(d.matchers, newMatcher(r))
		}
		rs.domains[domain] = d
	}
	for _, plan := range slices.Sorted(maps.Keys(cfg.Plans)) {
		o := map[string]override{}
		for id, l := range cfg.Plans[plan] {
			base := ids[id]
			if base == nil {
				errs = append(errs, fmt.Sprintf("plan %s: no rule %q (write domain/name)", plan, id))
				continue
			}
			if base.Unlimited {
				errs = append(errs, fmt.Sprintf("plan %s, rule %s: the rule is unlimited: a plan has nothing of it to override (drop the override)", plan, id))
				continue
			}
			var window time.Duration
			if l.Window != "" {
				w, err := time.ParseDuration(l.Window)
				if err != nil || w < time.Millisecond {
					errs = append(errs, fmt.Sprintf("plan %s, rule %s: window %q: want a duration of at least 1ms", plan, id, l.Window))
					continue
				}
				window = w
			}
			if l.Limit < 0 || l.Burst < 0 {
				errs = append(errs, fmt.Sprintf("plan %s, rule %s: limit and burst must not be negative", plan, id))
				continue
			}
			ov := override{limit: l.Limit, window: window, burst: l.Burst}
			if err := ov.apply(base).validateSize(); err != nil {
				errs = append(errs, fmt.Sprintf("plan %s, rule %s: %v", plan, id, err))
				continue
			}
			o[id] = ov
		}
		rs.plans[plan] = o
	}
	for tenant, plan := range cfg.Tenants {
		if _, ok := rs.plans[plan]; !ok {
			errs = append(errs, fmt.Sprintf("tenant %s: unknown plan %q", tenant, plan))
		}
	}
	if len(errs) > 0 {
		slices.Sort(errs)
		return nil, fmt.Errorf("rule configuration: %s", strings.Join(errs, "; "))
	}
	return rs, nil
}

// Applied is a rule resolved for one request: the tenant's plan applied, its
// state key computed.
type Applied struct {
	Rule *Rule
	// Plan is the plan whose override applied, or "".
	Plan string
	Key  string
	tag  string
	// weight multiplies the request's cost for this rule (1 when zero):
	// CheckEach decides at cost 1 with each rule weighted by the costs of
	// the descriptor sets that match it (a key several sets match is
	// decided once, at their sum).
	weight int64
	// checkOnly: the rule is decided as if for one unit but consumes
	// nothing (the descriptor sets of an Envoy request that match it all
	// have hits_addend 0): it denies when not one unit is left.
	checkOnly bool
}

// cost is what the rule consumes of a request of cost units.
func (a *Applied) cost(cost int64) int64 {
	if a.checkOnly {
		return 0
	}
	if a.weight > 1 {
		return cost * a.weight
	}
	return cost
}

// units is the cost the rule is decided at: what it consumes, or one unit
// for a check-only rule.
func (a *Applied) units(cost int64) int64 {
	if a.checkOnly {
		return 1
	}
	return a.cost(cost)
}

// Match returns the request's descriptors with the domain's defaults filled
// in, and every rule of domain that applies, in configuration order.
func (rs *Ruleset) Match(domain string, desc map[string]string) (map[string]string, []Applied) {
	d, desc := rs.fill(domain, desc, false)
	if d == nil {
		return desc, nil
	}
	var out []Applied
	plan := rs.tenants.Plan(desc["tenant"])
	for i, r := range d.rules {
		if d.matchers[i].matches(desc, false) {
			out = append(out, rs.apply(r, plan, desc))
		}
	}
	return desc, out
}

// MatchEnvoy is Match for one descriptor of Envoy's rate-limit API, with
// envoyproxy/ratelimit's meaning: a limit applies to the descriptor whose
// entries are its whole path, and a value's own limit replaces its key's.
// So a rule applies only when it names every entry of the descriptor (in
// its key or its match; the domain's defaults fill what the descriptor
// leaves out), and of those rules only the most specific (specificity: the
// most entries matched by exact value, then by prefix, then the longest
// prefixes; a match on a default filled in is not one): beside per-user, a
// rule with match {user: vip} alone limits user vip, and one with match
// {user: "v*"} the other users starting with v. Rules as
// specific as each other all apply (two windows on one key, say). Only
// the rules that apply get their keys built. An entry is given even when
// its value is empty (Envoy sends a header that is present but empty so):
// it is counted under "", one counter for every empty value, not left out,
// which would let a client escape every rule keyed on it by sending the
// header empty.
func (rs *Ruleset) MatchEnvoy(domain string, desc map[string]string) []Applied {
	d, filled := rs.fill(domain, desc, true)
	if d == nil {
		return nil
	}
	// One pass: each rule's match and specificity are evaluated once, the
	// most specific rules so far kept (on the stack for the usual few).
	var best specificity
	var buf [8]*Rule
	most := buf[:0]
	for i, r := range d.rules {
		m := &d.matchers[i]
		if !m.matches(filled, true) || !m.names(desc) {
			continue
		}
		s := m.specificityIn(desc)
		if c := s.compare(best); len(most) == 0 || c > 0 {
			best, most = s, append(most[:0], r)
		} else if c == 0 {
			most = append(most, r)
		}
	}
	if len(most) == 0 {
		return nil
	}
	out := make([]Applied, 0, len(most))
	plan := rs.tenants.Plan(filled["tenant"])
	for _, r := range most {
		out = append(out, rs.apply(r, plan, filled))
	}
	return out
}

// fill returns domain's rules and desc with the domain's defaults filled
// in (a copy only when one is missing), or nil and desc for a domain
// without rules. A descriptor with an empty value is missing unless given
// (matches).
func (rs *Ruleset) fill(domain string, desc map[string]string, given bool) (*domainRules, map[string]string) {
	d := rs.domains[domain]
	if d == nil || !d.fills(desc, given) {
		return d, desc
	}
	filled := maps.Clone(desc)
	if filled == nil {
		filled = map[string]string{}
	}
	for k, v := range d.defaults {
		if missing(filled, k, given) {
			filled[k] = v
		}
	}
	return d, filled
}

// missing reports whether desc leaves descriptor k out.
func missing(desc map[string]string, k string, given bool) bool {
	v, ok := desc[k]
	return !ok || v == "" && !given
}

// apply resolves rule r for a request with descriptors desc: the plan's
// override applied, the state key computed.
func (rs *Ruleset) apply(r *Rule, plan string, desc map[string]string) Applied {
	a := Applied{Rule: r}
	if o, ok := rs.plans[plan][r.ID()]; ok && plan != "" {
		a.Rule, a.Plan = o.apply(r), plan
	}
	if r.Unlimited {
		// Decided in memory: no key to build, and no plan to apply
		// (Compile refuses an override of an unlimited rule).
		return a
	}
	a.Key, a.tag = a.Rule.keyAndTag(desc, rs.keyPrefix)
	return a
}

// fills reports whether desc lacks a descriptor d has a default for: only
// then is desc copied (a map copy per decision otherwise).
func (d *domainRules) fills(desc map[string]string, given bool) bool {
	for k := range d.defaults {
		if missing(desc, k, given) {
			return true
		}
	}
	return false
}

// Tenants returns the tenants' plans rs decides with.
func (rs *Ruleset) Tenants() *TenantPlans { return rs.tenants }

// WithTenants returns a copy of rs deciding with tenants' plans instead. A
// tenant on a plan rs does not have gets the rules' own figures.
func (rs *Ruleset) WithTenants(tenants *TenantPlans) *Ruleset {
	c := *rs
	c.tenants = tenants
	return &c
}

// withKeyPrefix returns rs with its state keys prefixed by prefix: rs
// itself when they already are, else a copy.
func (rs *Ruleset) withKeyPrefix(prefix string) *Ruleset {
	if rs.keyPrefix == prefix {
		return rs
	}
	c := *rs
	c.keyPrefix = prefix
	return &c
}

// HasPlan reports whether plan is configured.
func (rs *Ruleset) HasPlan(plan string) bool {
	_, ok := rs.plans[plan]
	return ok
}

// Domains lists the configured domains.
func (rs *Ruleset) Domains() []string { return slices.Sorted(maps.Keys(rs.domains)) }

// HasDomain reports whether domain is configured.
func (rs *Ruleset) HasDomain(domain string) bool { return rs.domains[domain] != nil }

// Rules lists the rules of domain.
func (rs *Ruleset) Rules(domain string) []*Rule {
	if d := rs.domains[domain]; d != nil {
		return d.rules
	}
	return nil
}
