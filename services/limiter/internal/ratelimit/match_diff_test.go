package ratelimit

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"
)

// TestCompiledMatchersDecideAsTheRulesDo checks MatchEnvoy and Match,
// which walk the matchers Compile builds, against the walk over each
// rule's Key and Match they replaced, over random domains of rules (keys
// with a descriptor twice, descriptors both in the key and the match,
// empty, exact and prefix match values, defaults) and random requests
// (descriptors left out, given empty, or named by no rule).
func TestCompiledMatchersDecideAsTheRulesDo(t *testing.T) {
	descs := []string{"a", "b", "c", "tenant"}
	values := []string{"", "x", "xy", "y"}
	wants := []string{"x", "xy", "y", "x*", "xy*", "*"}
	rnd := rand.New(rand.NewPCG(1, 2))
	pick := func(from []string) string { return from[rnd.IntN(len(from))] }
	randomDesc := func() map[string]string {
		d := map[string]string{}
		for _, k := range descs {
			if rnd.IntN(2) == 0 {
				d[k] = pick(values)
			}
		}
		return d
	}
	checked := 0
	for range 2000 {
		spec := DomainSpec{}
		if rnd.IntN(3) == 0 {
			spec.Defaults = map[string]string{pick(descs): pick(values[1:])}
		}
		for i := range 1 + rnd.IntN(6) {
			r := RuleSpec{Name: fmt.Sprintf("r%d", i), Algorithm: "fixed_window", Limit: 1 + int64(rnd.IntN(3)), Window: "1m", FailureMode: "open"}
			for range 1 + rnd.IntN(3) {
				r.Key = append(r.Key, pick(descs))
			}
			for range rnd.IntN(3) {
				if r.Match == nil {
					r.Match = map[string]string{}
				}
				r.Match[pick(descs)] = pick(wants)
			}
			spec.Rules = append(spec.Rules, r)
		}
		plans := map[string]map[string]LimitSpec{"pro": {"d/r0": {Limit: 100}}}
		rs, err := Compile(Config{Domains: map[string]DomainSpec{"d": spec}, Plans: plans, Tenants: map[string]string{"x": "pro"}})
		if err != nil {
			t.Fatalf("Compile: %v", err)
		}
		for range 20 {
			desc := randomDesc()
			if got, want := appliedIDs(rs.MatchEnvoy("d", desc)), appliedIDs(oldMatchEnvoy(rs, "d", desc)); got != want {
				t.Fatalf("rules %+v, defaults %v: MatchEnvoy(%v) = %s, the rules' own walk %s", spec.Rules, spec.Defaults, desc, got, want)
			}
			_, got := rs.Match("d", desc)
			if got, want := appliedIDs(got), appliedIDs(oldMatch(rs, "d", desc)); got != want {
				t.Fatalf("rules %+v, defaults %v: Match(%v) = %s, the rules' own walk %s", spec.Rules, spec.Defaults, desc, got, want)
			}
			checked++
		}
	}
	if checked < 10_000 {
		t.Fatalf("checked %d requests, want at least 10000", checked)
	}
}

// appliedIDs lists the rules, plans and keys of as.
func appliedIDs(as []Applied) string {
	var b strings.Builder
	for _, a := range as {
		fmt.Fprintf(&b, "[%s plan=%q limit=%d key=%s]", a.Rule.ID(), a.Plan, a.Rule.Limit, a.Key)
	}
	return b.String()
}

// The matching as it was before Compile built matchers: over each rule's
// Key and Match (fe9d280^).

func oldMatch(rs *Ruleset, domain string, desc map[string]string) []Applied {
	d, desc := rs.fill(domain, desc, false)
	if d == nil {
		return nil
	}
	var out []Applied
	plan := rs.tenants.Plan(desc["tenant"])
	for _, r := range d.rules {
		if oldMatches(r, desc, false) {
			out = append(out, rs.apply(r, plan, desc))
		}
	}
	return out
}

func oldMatchEnvoy(rs *Ruleset, domain string, desc map[string]string) []Applied {
	d, filled := rs.fill(domain, desc, true)
	if d == nil {
		return nil
	}
	var best specificity
	found := false
	for _, r := range d.rules {
		if oldMatches(r, filled, true) && oldNames(r, desc) {
			if s := oldSpecificityIn(r, desc); !found || s.compare(best) > 0 {
				best, found = s, true
			}
		}
	}
	if !found {
		return nil
	}
	var out []Applied
	plan := rs.tenants.Plan(filled["tenant"])
	for _, r := range d.rules {
		if oldMatches(r, filled, true) && oldNames(r, desc) && oldSpecificityIn(r, desc) == best {
			out = append(out, rs.apply(r, plan, filled))
		}
	}
	return out
}

func oldMatches(r *Rule, desc map[string]string, given bool) bool {
	for _, k := range r.Key {
		if missing(desc, k, given) {
			return false
		}
	}
	for k, want := range r.Match {
		if v := desc[k]; v != want && (!isPrefix(want) || missing(desc, k, given) || !strings.HasPrefix(v, want[:len(want)-1])) {
			return false
		}
	}
	return true
}

func oldNames(r *Rule, desc map[string]string) bool {
	for k := range desc {
		if _, ok := r.Match[k]; !ok && !slices.Contains(r.Key, k) {
			return false
		}
	}
	return true
}

func oldSpecificityIn(r *Rule, desc map[string]string) specificity {
	var s specificity
	for k, want := range r.Match {
		if _, ok := desc[k]; !ok {
			continue
		}
		if isPrefix(want) {
			s.prefixes++
			s.prefixLen += len(want) - 1
		} else {
			s.exact++
		}
	}
	return s
}
