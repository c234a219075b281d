package linkapi

import (
	"context"
	"errors"
	"fmt"

	"google.golang.org/protobuf/types/known/timestamppb"

	shortenerv1 "kurz.dev/gen/kurz/shortener/v1"
	"kurz.dev/pkg/linkrules"
	"kurz.dev/pkg/rpcerr"
	"kurz.dev/services/shortener/internal/linkstore"
)

// ReasonRulesInvalid refuses rules or variants beyond linkrules' bounds or
// with a value that cannot be tested (a bad CIDR, language range, weight).
const ReasonRulesInvalid = "RULES_INVALID"

// rulesOf converts a request's rules and variants to a compiled Set with
// every destination normalised like long_url (urlcheck: schemes, loops to
// kurz itself, private hosts); nil when there are none.
func (s *Service) rulesOf(rules []*shortenerv1.RedirectRule, variants []*shortenerv1.Variant) (*linkrules.Set, error) {
	if len(rules) == 0 && len(variants) == 0 {
		return nil, nil
	}
	// Bounds first, before converting (or normalising) a huge list.
	if len(rules) > linkrules.MaxRules {
		return nil, rpcerr.Invalidf("rules", ReasonRulesInvalid, "rules: a link carries at most %d rules", linkrules.MaxRules)
	}
	if len(variants) > linkrules.MaxVariants {
		return nil, rpcerr.Invalidf("variants", ReasonRulesInvalid, "variants: a link carries at most %d variants", linkrules.MaxVariants)
	}
	set := &linkrules.Set{}
	for i, r := range rules {
		rule := linkrules.Rule{Name: r.GetName(), URL: r.GetUrl()}
		if len(r.GetConditions()) > linkrules.MaxConditions {
			return nil, rpcerr.Invalidf(fmt.Sprintf("rules[%d].conditions", i), ReasonRulesInvalid,
				"rules[%d].conditions: a rule has 1 to %d conditions", i, linkrules.MaxConditions)
		}
		for j, c := range r.GetConditions() {
			cond, err := conditionOf(fmt.Sprintf("rules[%d].conditions[%d]", i, j), c)
			if err != nil {
				return nil, err
			}
			rule.If = append(rule.If, cond)
		}
		set.Rules = append(set.Rules, rule)
	}
	for _, v := range variants {
		set.Variants = append(set.Variants, linkrules.Variant{Name: v.GetName(), URL: v.GetUrl(), Weight: int(v.GetWeight())})
	}
	// Converting touched no value (the lists are shared), so the bound of
	// them all is counted before any is parsed.
	if _, values := set.Size(); values > linkrules.MaxLinkValues {
		return nil, rpcerr.Invalidf("rules", ReasonRulesInvalid,
			"rules: a link's conditions hold at most %d values together (these hold %d)", linkrules.MaxLinkValues, values)
	}
	err := set.Validate()
	if err == nil {
		err = set.Compile()
	}
	if err != nil {
		var le *linkrules.Error
		if errors.As(err, &le) {
			return nil, rpcerr.Invalidf(le.Field, ReasonRulesInvalid, "%s: %s", le.Field, le.Message)
		}
		return nil, err
	}
	for i := range set.Rules {
		n, err := s.policy.Normalize(set.Rules[i].URL)
		if err != nil {
			s.countRefused(err)
			return nil, targetError(fmt.Sprintf("rules[%d].url", i), err)
		}
		set.Rules[i].URL = n
	}
	for i := range set.Variants {
		n, err := s.policy.Normalize(set.Variants[i].URL)
		if err != nil {
			s.countRefused(err)
			return nil, targetError(fmt.Sprintf("variants[%d].url", i), err)
		}
		set.Variants[i].URL = n
	}
	// Compile again: the program holds the destinations it returns.
	if err := set.Compile(); err != nil {
		return nil, err
	}
	return set, nil
}

// conditionOf converts one condition. Empty lists count as unset, so that
// linkrules refuses a condition with no kind.
func conditionOf(field string, c *shortenerv1.RuleCondition) (linkrules.Condition, error) {
	nonEmpty := func(v []string) []string {
		if len(v) == 0 {
			return nil
		}
		return v
	}
	out := linkrules.Condition{Devices: nonEmpty(c.GetDevices()), Languages: nonEmpty(c.GetLanguages()),
		CIDRs: nonEmpty(c.GetCidrs()), Countries: nonEmpty(c.GetCountries())}
	if q := c.GetQuery(); q != nil {
		out.Query = &linkrules.Query{Param: q.GetParam(), Value: q.Value}
	}
	if w := c.GetTime(); w != nil {
		var win linkrules.Window
		for _, b := range []struct {
			name string
			ts   *timestamppb.Timestamp
			ms   *int64
		}{{"from", w.GetFrom(), &win.FromMs}, {"until", w.GetUntil(), &win.UntilMs}} {
			if b.ts == nil {
				continue
			}
			if err := b.ts.CheckValid(); err != nil || b.ts.AsTime().UnixMilli() <= 0 {
				return linkrules.Condition{}, rpcerr.Invalidf(field+".time."+b.name, ReasonRulesInvalid, "%s.time.%s is not a valid time after 1970", field, b.name)
			}
			*b.ms = b.ts.AsTime().UnixMilli()
		}
		out.Time = &win
	}
	return out, nil
}

// scanRules runs the scanner (blocklist) over every destination of set.
func (s *Service) scanRules(ctx context.Context, set *linkrules.Set) error {
	if set == nil {
		return nil
	}
	for i, r := range set.Rules {
		if err := s.scan(ctx, r.URL); err != nil {
			return targetError(fmt.Sprintf("rules[%d].url", i), err)
		}
	}
	for i, v := range set.Variants {
		if err := s.scan(ctx, v.URL); err != nil {
			return targetError(fmt.Sprintf("variants[%d].url", i), err)
		}
	}
	return nil
}

// rulesProto converts a stored Set back to the API's messages.
func rulesProto(set *linkrules.Set) ([]*shortenerv1.RedirectRule, []*shortenerv1.Variant) {
	if set.Empty() {
		return nil, nil
	}
	var rules []*shortenerv1.RedirectRule
	for _, r := range set.Rules {
		pr := &shortenerv1.RedirectRule{Name: r.Name, Url: r.URL}
		for _, c := range r.If {
			pc := &shortenerv1.RuleCondition{Devices: c.Devices, Languages: c.Languages, Cidrs: c.CIDRs, Countries: c.Countries}
			if c.Query != nil {
				pc.Query = &shortenerv1.QueryCondition{Param: c.Query.Param, Value: c.Query.Value}
			}
			if c.Time != nil {
				pc.Time = &shortenerv1.TimeWindow{}
				if c.Time.FromMs != 0 {
					pc.Time.From = timestamppb.New(linkrules.TimeOf(c.Time.FromMs))
				}
				if c.Time.UntilMs != 0 {
					pc.Time.Until = timestamppb.New(linkrules.TimeOf(c.Time.UntilMs))
				}
			}
			pr.Conditions = append(pr.Conditions, pc)
		}
		rules = append(rules, pr)
	}
	var variants []*shortenerv1.Variant
	for _, v := range set.Variants {
		variants = append(variants, &shortenerv1.Variant{Name: v.Name, Url: v.URL, Weight: int32(v.Weight)})
	}
	return rules, variants
}

// rulesChanges validates the rules and variants an update mask names into
// ch: each replaces the link's own (empty clears them) and leaves the other
// as it is.
func (s *Service) rulesChanges(link *shortenerv1.Link, paths []string, ch *linkstore.Changes) error {
	var setRules, setVariants bool
	for _, p := range paths {
		setRules = setRules || p == "rules"
		setVariants = setVariants || p == "variants"
	}
	if !setRules && !setVariants {
		return nil
	}
	var rules []*shortenerv1.RedirectRule
	var variants []*shortenerv1.Variant
	if setRules {
		rules = link.GetRules()
	}
	if setVariants {
		variants = link.GetVariants()
	}
	set, err := s.rulesOf(rules, variants)
	if err != nil {
		return err
	}
	if set == nil {
		set = &linkrules.Set{}
	}
	if setRules {
		r := set.Rules
		if r == nil {
			r = []linkrules.Rule{}
		}
		ch.Rules = &r
	}
	if setVariants {
		v := set.Variants
		if v == nil {
			v = []linkrules.Variant{}
		}
		ch.Variants = &v
	}
	return nil
}

func deref[T any](p *[]T) []T {
	if p == nil {
		return nil
	}
	return *p
}
