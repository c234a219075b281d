//go:build integration

package app

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"

	shortenerv1 "kurz.dev/gen/kurz/shortener/v1"
	"kurz.dev/pkg/linkrules"
	"kurz.dev/services/shortener/internal/linkapi"
	"kurz.dev/services/shortener/internal/urlcheck"
)

func ptr(s string) *string { return &s }

// someRules has one condition of each kind but country, and two variants.
func someRules() ([]*shortenerv1.RedirectRule, []*shortenerv1.Variant) {
	return []*shortenerv1.RedirectRule{
			{Name: "ios-de", Url: "HTTPS://Example.com/ios-de", Conditions: []*shortenerv1.RuleCondition{
				{Devices: []string{"iOS"}}, {Languages: []string{"de"}}}},
			{Name: "promo", Url: "https://example.com/promo", Conditions: []*shortenerv1.RuleCondition{
				{Query: &shortenerv1.QueryCondition{Param: "utm_source", Value: ptr("news")}},
				{Time: &shortenerv1.TimeWindow{From: timestamppb.New(time.UnixMilli(1_800_000_000_000))}}}},
			{Name: "office", Url: "https://example.com/office", Conditions: []*shortenerv1.RuleCondition{{Cidrs: []string{"203.0.113.9/24"}}}},
		}, []*shortenerv1.Variant{
			{Name: "a", Url: "https://example.com/a", Weight: 3}, {Name: "b", Url: "https://example.com/b", Weight: 1},
		}
}

// TestRulesAreValidatedStoredAndWrittenThrough: rules and variants come
// back normalised (URLs like long_url, devices lower-cased, prefixes
// masked), are stored in links.rules and reach the Redis entry compiled.
func TestRulesAreValidatedStoredAndWrittenThrough(t *testing.T) {
	tenant := uniq("rul-")
	sh := start(t, map[string]string{"KURZ_SHORTENER_BASE_URL": "https://kurz.example"}, hooks{})
	db, rdb := stores(t, sh.cfg, tenant)
	ctx := as(tenant, "")

	plain, err := sh.api.CreateLink(ctx, &shortenerv1.CreateLinkRequest{LongUrl: "https://example.com/p"})
	if err != nil {
		t.Fatal(err)
	}
	if l := plain.GetLink(); l.GetRules() != nil || l.GetVariants() != nil || cacheEntry(t, rdb, l.GetCode()).Rules != nil {
		t.Fatalf("a plain link has rules %v variants %v", l.GetRules(), l.GetVariants())
	}

	rules, variants := someRules()
	made, err := sh.api.CreateLink(ctx, &shortenerv1.CreateLinkRequest{LongUrl: "https://example.com/", Rules: rules, Variants: variants})
	if err != nil {
		t.Fatal(err)
	}
	l := made.GetLink()
	if len(l.GetRules()) != 3 || l.GetRules()[0].GetUrl() != "https://example.com/ios-de" || l.GetRules()[0].GetConditions()[0].GetDevices()[0] != "ios" ||
		l.GetRules()[2].GetConditions()[0].GetCidrs()[0] != "203.0.113.0/24" || l.GetRules()[1].GetConditions()[0].GetQuery().GetValue() != "news" ||
		l.GetRules()[1].GetConditions()[1].GetTime().GetFrom().AsTime().UnixMilli() != 1_800_000_000_000 || len(l.GetVariants()) != 2 {
		t.Fatalf("created link's rules %v variants %v", l.GetRules(), l.GetVariants())
	}
	got, err := sh.api.GetLink(ctx, &shortenerv1.GetLinkRequest{Code: l.GetCode()})
	if err != nil || len(got.GetLink().GetRules()) != 3 || got.GetLink().GetVariants()[0].GetWeight() != 3 {
		t.Fatalf("GetLink: %v, %v", got.GetLink(), err)
	}
	var stored []byte
	if err := db.QueryRow(context.Background(), `SELECT rules FROM links WHERE code = $1`, l.GetCode()).Scan(&stored); err != nil {
		t.Fatal(err)
	}
	if s, err := linkrules.Parse(stored); err != nil || len(s.Rules) != 3 || len(s.Variants) != 2 {
		t.Fatalf("links.rules %s: %v", stored, err)
	}
	e := cacheEntry(t, rdb, l.GetCode())
	req := linkrules.Request{AcceptLanguage: "de", Device: linkrules.DeviceIOS}
	if u, name, ok := e.Rules.Match(&req); !ok || name != "ios-de" || u != "https://example.com/ios-de" {
		t.Fatalf("redis entry's rules matched %q %q %v", name, u, ok)
	}

	// Update one of the two: the other stays.
	upd, err := sh.api.UpdateLink(ctx, &shortenerv1.UpdateLinkRequest{Link: &shortenerv1.Link{Code: l.GetCode(), Rules: rules[:1]}, UpdateMask: mask("rules")})
	if err != nil || len(upd.GetLink().GetRules()) != 1 || len(upd.GetLink().GetVariants()) != 2 {
		t.Fatalf("update rules: %v, %v", upd.GetLink(), err)
	}
	upd, err = sh.api.UpdateLink(ctx, &shortenerv1.UpdateLinkRequest{Link: &shortenerv1.Link{Code: l.GetCode()}, UpdateMask: mask("variants")})
	if err != nil || len(upd.GetLink().GetRules()) != 1 || upd.GetLink().GetVariants() != nil {
		t.Fatalf("clear variants: %v, %v", upd.GetLink(), err)
	}
	if e := cacheEntry(t, rdb, l.GetCode()); e.Rules == nil || len(e.Rules.Rules) != 1 || e.Rules.HasVariants() {
		t.Fatalf("redis entry after the updates: %+v", e.Rules)
	}
	upd, err = sh.api.UpdateLink(ctx, &shortenerv1.UpdateLinkRequest{Link: &shortenerv1.Link{Code: l.GetCode()}, UpdateMask: mask("rules")})
	if err != nil || upd.GetLink().GetRules() != nil || cacheEntry(t, rdb, l.GetCode()).Rules != nil {
		t.Fatalf("clear rules: %v, %v", upd.GetLink(), err)
	}
}

// TestRulesAreRefusedLikeLongURLs: every destination of a rule or variant
// is checked like long_url (scheme, loop to kurz itself, private host,
// blocklist), bounds are enforced, and the error names the field; a refused
// update changes nothing.
func TestRulesAreRefusedLikeLongURLs(t *testing.T) {
	tenant := uniq("rul-")
	path := filepath.Join(t.TempDir(), "blocklist")
	if err := os.WriteFile(path, []byte("phish.example\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	sh := start(t, map[string]string{"KURZ_SHORTENER_BASE_URL": "https://kurz.example", "KURZ_SHORTENER_BLOCKLIST_FILE": path}, hooks{})
	_, rdb := stores(t, sh.cfg, tenant)
	ctx := as(tenant, "")
	rules, variants := someRules()
	made, err := sh.api.CreateLink(ctx, &shortenerv1.CreateLinkRequest{LongUrl: "https://example.com/", Rules: rules, Variants: variants})
	if err != nil {
		t.Fatal(err)
	}
	code := made.GetLink().GetCode()
	rule := func(url string, c ...*shortenerv1.RuleCondition) []*shortenerv1.RedirectRule {
		if c == nil {
			c = []*shortenerv1.RuleCondition{{Languages: []string{"de"}}}
		}
		return []*shortenerv1.RedirectRule{{Name: "r", Url: url, Conditions: c}}
	}
	many := make([]*shortenerv1.Variant, linkrules.MaxVariants+1)
	for i := range many {
		many[i] = &shortenerv1.Variant{Name: string(rune('a' + i)), Url: "https://example.com/", Weight: 1}
	}
	// rulesOfValues makes n rules of one condition of 32 CIDRs each.
	rulesOfValues := func(n int) []*shortenerv1.RedirectRule {
		var out []*shortenerv1.RedirectRule
		for i := range n {
			cidrs := make([]string, linkrules.MaxValues)
			for j := range cidrs {
				cidrs[j] = fmt.Sprintf("10.%d.%d.0/24", i, j)
			}
			out = append(out, &shortenerv1.RedirectRule{Name: fmt.Sprint("r", i), Url: "https://example.com/",
				Conditions: []*shortenerv1.RuleCondition{{Cidrs: cidrs}}})
		}
		return out
	}
	full := linkrules.MaxLinkValues / linkrules.MaxValues
	if _, err := sh.api.CreateLink(ctx, &shortenerv1.CreateLinkRequest{LongUrl: "https://example.com/full", Rules: rulesOfValues(full)}); err != nil {
		t.Fatalf("a link with %d condition values: %v", linkrules.MaxLinkValues, err)
	}
	for name, tc := range map[string]struct {
		rules         []*shortenerv1.RedirectRule
		variants      []*shortenerv1.Variant
		field, reason string
	}{
		"too many values":   {rules: rulesOfValues(full + 1), field: "rules", reason: linkapi.ReasonRulesInvalid},
		"javascript rule":   {rules: rule("javascript:alert(1)"), field: "rules[0].url", reason: urlcheck.ReasonScheme},
		"loop variant":      {variants: []*shortenerv1.Variant{{Name: "a", Url: "https://kurz.example/abc", Weight: 1}}, field: "variants[0].url", reason: urlcheck.ReasonLoop},
		"private rule":      {rules: rule("http://10.0.0.1/"), field: "rules[0].url", reason: urlcheck.ReasonPrivateHost},
		"blocked variant":   {variants: []*shortenerv1.Variant{{Name: "a", Url: "https://login.phish.example/", Weight: 1}}, field: "variants[0].url", reason: urlcheck.ReasonBlocked},
		"bad cidr":          {rules: rule("https://example.com/", &shortenerv1.RuleCondition{Cidrs: []string{"10.0.0.0/99"}}), field: "rules[0].conditions[0].cidrs[0]", reason: linkapi.ReasonRulesInvalid},
		"empty condition":   {rules: rule("https://example.com/", &shortenerv1.RuleCondition{Devices: []string{}}), field: "rules[0].conditions[0]", reason: linkapi.ReasonRulesInvalid},
		"negative weight":   {variants: []*shortenerv1.Variant{{Name: "a", Url: "https://example.com/", Weight: -1}}, field: "variants[0].weight", reason: linkapi.ReasonRulesInvalid},
		"too many variants": {variants: many, field: "variants", reason: linkapi.ReasonRulesInvalid},
		"NUL in a query value": {rules: rule("https://example.com/", &shortenerv1.RuleCondition{Query: &shortenerv1.QueryCondition{Param: "p", Value: proto.String("a\x00")}}),
			field: "rules[0].conditions[0].query.value", reason: linkapi.ReasonRulesInvalid},
		"time before 1970": {rules: rule("https://example.com/", &shortenerv1.RuleCondition{Time: &shortenerv1.TimeWindow{Until: &timestamppb.Timestamp{Seconds: -5}}}),
			field: "rules[0].conditions[0].time.until", reason: linkapi.ReasonRulesInvalid},
	} {
		t.Run(name, func(t *testing.T) {
			_, err := sh.api.CreateLink(ctx, &shortenerv1.CreateLinkRequest{LongUrl: "https://example.com/ok", Rules: tc.rules, Variants: tc.variants})
			if reason, _ := wantStatus(t, err, codes.InvalidArgument); reason != tc.reason {
				t.Errorf("create: reason %q, want %s", reason, tc.reason)
			}
			if f := fieldOf(t, err); f != tc.field {
				t.Errorf("create: field %q, want %s", f, tc.field)
			}
			_, err = sh.api.UpdateLink(ctx, &shortenerv1.UpdateLinkRequest{Link: &shortenerv1.Link{Code: code, Rules: tc.rules, Variants: tc.variants},
				UpdateMask: mask("rules", "variants")})
			if f := fieldOf(t, err); f != tc.field {
				t.Errorf("update: field %q, want %s", f, tc.field)
			}
		})
	}
	if e := cacheEntry(t, rdb, code); e.Rules == nil || len(e.Rules.Rules) != 3 || len(e.Rules.Variants) != 2 {
		t.Fatalf("refused updates changed the entry: %+v", e.Rules)
	}
}
