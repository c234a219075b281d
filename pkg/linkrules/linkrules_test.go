package linkrules

import (
	"encoding/json"
	"errors"
	"fmt"
	"net/netip"
	"net/url"
	"strings"
	"testing"
	"time"
)

func str(s string) *string { return &s }

// sample is a Set with one rule of each condition kind and two variants.
func sample() *Set {
	return &Set{
		Rules: []Rule{
			{Name: "ios-de", If: []Condition{{Devices: []string{"IOS"}}, {Languages: []string{"de"}}}, URL: "https://example.com/ios-de"},
			{Name: "promo", If: []Condition{{Query: &Query{Param: "utm source", Value: str("news")}}}, URL: "https://example.com/promo"},
			{Name: "debug", If: []Condition{{Query: &Query{Param: "debug"}}}, URL: "https://example.com/debug"},
			{Name: "office", If: []Condition{{CIDRs: []string{"203.0.113.7/24", "2001:db8::/32"}}}, URL: "https://example.com/office"},
			{Name: "germany", If: []Condition{{Countries: []string{"de", "AT"}}}, URL: "https://example.com/dach"},
			{Name: "launch", If: []Condition{{Time: &Window{FromMs: 1000, UntilMs: 2000}}}, URL: "https://example.com/launch"},
		},
		Variants: []Variant{{Name: "a", URL: "https://example.com/a", Weight: 3}, {Name: "b", URL: "https://example.com/b", Weight: 1}},
	}
}

func compiled(t testing.TB) *Set {
	t.Helper()
	s := sample()
	if err := s.Compile(); err != nil {
		t.Fatal(err)
	}
	return s
}

func TestMatchFirstRuleWhoseConditionsAllHold(t *testing.T) {
	s := compiled(t)
	de := func(addr string) netip.Addr { return netip.MustParseAddr(addr) }
	germany := func(netip.Addr) string { return "DE" }
	for _, tc := range []struct {
		name string
		req  Request
		want string
	}{
		{"ios and german", Request{Device: DeviceIOS, AcceptLanguage: "fr;q=0.9, de-AT;q=0.5"}, "ios-de"},
		{"ios without german", Request{Device: DeviceIOS, AcceptLanguage: "fr, en"}, ""},
		{"german at q=0 is excluded", Request{Device: DeviceIOS, AcceptLanguage: "en, de;q=0"}, ""},
		{"german at q=0.000 is excluded", Request{Device: DeviceIOS, AcceptLanguage: "de;q=0.000"}, ""},
		{"range is a prefix up to a hyphen only", Request{Device: DeviceIOS, AcceptLanguage: "deu"}, ""},
		{"wildcard names no language", Request{Device: DeviceIOS, AcceptLanguage: "*"}, ""},
		{"android german", Request{Device: DeviceAndroid, AcceptLanguage: "de"}, ""},
		{"query equal, encoded name", Request{RawQuery: "x=1&utm+source=news"}, "promo"},
		{"query unequal", Request{RawQuery: "utm%20source=other"}, ""},
		{"query present without value", Request{RawQuery: "debug"}, "debug"},
		{"query present with value", Request{RawQuery: "a=b&debug=0"}, "debug"},
		{"cidr v4", Request{Addr: de("203.0.113.200")}, "office"},
		{"cidr v4-mapped", Request{Addr: de("::ffff:203.0.113.9")}, "office"},
		{"cidr v6", Request{Addr: de("2001:db8:1::5")}, "office"},
		{"outside cidr", Request{Addr: de("198.51.100.1")}, ""},
		{"country from geoip", Request{Addr: de("198.51.100.1"), Country: germany}, "germany"},
		{"no geoip database", Request{Addr: de("198.51.100.1")}, ""},
		{"inside time window", Request{NowMs: 1000}, "launch"},
		{"time window end is exclusive", Request{NowMs: 2000}, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			req := tc.req
			_, name, ok := s.Match(&req)
			if name != tc.want || ok != (tc.want != "") {
				t.Fatalf("Match = %q, %v; want %q", name, ok, tc.want)
			}
		})
	}
}

func TestCountryIsLookedUpAtMostOnce(t *testing.T) {
	s := &Set{Rules: []Rule{
		{Name: "a", If: []Condition{{Countries: []string{"FR"}}}, URL: "https://example.com/a"},
		{Name: "b", If: []Condition{{Countries: []string{"DE"}}}, URL: "https://example.com/b"},
	}}
	if err := s.Compile(); err != nil {
		t.Fatal(err)
	}
	calls := 0
	req := Request{Addr: netip.MustParseAddr("198.51.100.1"), Country: func(netip.Addr) string { calls++; return "DE" }}
	if _, name, _ := s.Match(&req); name != "b" || calls != 1 {
		t.Fatalf("matched %q with %d lookups, want b with 1", name, calls)
	}
}

func TestCompileRefusesOutOfBounds(t *testing.T) {
	many := func(n int, v string) []string {
		out := make([]string, n)
		for i := range out {
			out[i] = v
		}
		return out
	}
	rule := func(c Condition) *Set {
		return &Set{Rules: []Rule{{Name: "r", If: []Condition{c}, URL: "https://example.com/"}}}
	}
	tooManyRules := &Set{}
	for i := range MaxRules + 1 {
		tooManyRules.Rules = append(tooManyRules.Rules, Rule{Name: "r" + string(rune('a'+i)), If: []Condition{{Devices: []string{"ios"}}}, URL: "https://example.com/"})
	}
	for _, tc := range []struct {
		name, field string
		set         *Set
	}{
		{"too many rules", "rules", tooManyRules},
		{"no conditions", "rules[0].conditions", &Set{Rules: []Rule{{Name: "r", URL: "https://example.com/"}}}},
		{"two kinds in one condition", "rules[0].conditions[0]", rule(Condition{Devices: []string{"ios"}, Languages: []string{"de"}})},
		{"no kind", "rules[0].conditions[0]", rule(Condition{})},
		{"unknown device", "rules[0].conditions[0].devices[0]", rule(Condition{Devices: []string{"fridge"}})},
		{"too many values", "rules[0].conditions[0].cidrs", rule(Condition{CIDRs: many(MaxValues+1, "10.0.0.0/8")})},
		{"bad cidr", "rules[0].conditions[0].cidrs[0]", rule(Condition{CIDRs: []string{"10.0.0.0/33"}})},
		{"bad language", "rules[0].conditions[0].languages[0]", rule(Condition{Languages: []string{"*"}})},
		{"bad country", "rules[0].conditions[0].countries[0]", rule(Condition{Countries: []string{"DEU"}})},
		{"long param", "rules[0].conditions[0].query.param", rule(Condition{Query: &Query{Param: strings.Repeat("p", MaxParamLength+1)}})},
		{"empty window", "rules[0].conditions[0].time", rule(Condition{Time: &Window{}})},
		{"backwards window", "rules[0].conditions[0].time", rule(Condition{Time: &Window{FromMs: 2, UntilMs: 1}})},
		{"bad name", "rules[0].name", &Set{Rules: []Rule{{Name: "Has Space", If: []Condition{{Devices: []string{"ios"}}}, URL: "https://example.com/"}}}},
		{"no url", "rules[0].url", &Set{Rules: []Rule{{Name: "r", If: []Condition{{Devices: []string{"ios"}}}}}}},
		{"zero weight", "variants[0].weight", &Set{Variants: []Variant{{Name: "a", URL: "https://example.com/", Weight: 0}}}},
		{"heavy weight", "variants[0].weight", &Set{Variants: []Variant{{Name: "a", URL: "https://example.com/", Weight: MaxWeight + 1}}}},
		{"duplicate variant", "variants[1].name", &Set{Variants: []Variant{{Name: "a", URL: "https://example.com/", Weight: 1}, {Name: "a", URL: "https://example.com/", Weight: 1}}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := tc.set.Compile()
			var e *Error
			if !errors.As(err, &e) || e.Field != tc.field {
				t.Fatalf("Compile = %v, want an error on %s", err, tc.field)
			}
		})
	}
}

// Control characters in a query condition, and country codes no GeoIP
// database answers, are refused when rules are written (Validate), not
// when they are read back (Compile, Parse): links an earlier version
// stored with a tab or UK there still decode, and redirect.
func TestUntestableValuesRefusedOnWriteOnly(t *testing.T) {
	rule := func(q Query) *Set {
		return &Set{Rules: []Rule{{Name: "r", If: []Condition{{Query: &q}}, URL: "https://example.com/"}}}
	}
	country := func(code string) *Set {
		return &Set{Rules: []Rule{{Name: "r", If: []Condition{{Countries: []string{code}}}, URL: "https://example.com/"}}}
	}
	for _, tc := range []struct {
		name, field string
		set         *Set
	}{
		{"NUL in a param", "rules[0].conditions[0].query.param", rule(Query{Param: "\x00"})},
		{"control in a value", "rules[0].conditions[0].query.value", rule(Query{Param: "p", Value: ptr("x\x00")})},
		{"DEL in a value", "rules[0].conditions[0].query.value", rule(Query{Param: "p", Value: ptr("\x7f")})},
		{"tab in a value", "rules[0].conditions[0].query.value", rule(Query{Param: "p", Value: ptr("spring\tsale")})},
		{"UK, not GB", "rules[0].conditions[1].countries[1]", &Set{Rules: []Rule{{Name: "r", URL: "https://example.com/",
			If: []Condition{{Countries: []string{"DE"}}, {Countries: []string{"gb", "uk"}}}}}}},
		{"EU is no country", "rules[0].conditions[0].countries[0]", country("EU")},
		{"unassigned XX", "rules[0].conditions[0].countries[0]", country("xx")},
		{"user-assigned ZZ", "rules[0].conditions[0].countries[0]", country("ZZ")},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var e *Error
			if err := tc.set.Validate(); !errors.As(err, &e) || e.Field != tc.field {
				t.Fatalf("Validate = %v, want an error on %s", err, tc.field)
			}
			if err := tc.set.Compile(); err != nil {
				t.Fatalf("Compile = %v, want a stored link's rules to compile", err)
			}
		})
	}
	for _, code := range []string{"GB", "de", "XK", "AQ", "ZW"} {
		if err := country(code).Validate(); err != nil {
			t.Errorf("Validate refused country %s: %v", code, err)
		}
	}
	var e *Error
	if err := country("UK").Validate(); !errors.As(err, &e) || !strings.Contains(e.Message, `"GB"`) {
		t.Errorf("Validate(UK) = %v, want a message naming GB", err)
	}
	stored := []byte(`{"r":[{"n":"r","if":[{"q":{"p":"utm_campaign","v":"spring\tsale"}},{"g":["UK"]}],"u":"https://example.com/sale"}]}`)
	s, err := Parse(stored)
	if err != nil || s == nil {
		t.Fatalf("Parse(%s) = %v, %v: want the stored rules back", stored, s, err)
	}
}

func TestCompileNormalises(t *testing.T) {
	s := compiled(t)
	if got := s.Rules[0].If[0].Devices[0]; got != "ios" {
		t.Errorf("device %q, want ios", got)
	}
	if got := s.Rules[3].If[0].CIDRs[0]; got != "203.0.113.0/24" {
		t.Errorf("cidr %q, want 203.0.113.0/24", got)
	}
	if got := s.Rules[4].If[0].Countries[0]; got != "DE" {
		t.Errorf("country %q, want DE", got)
	}
	if got := s.Vary(false); len(got) != 1 || got[0] != "User-Agent, Accept-Language" {
		t.Errorf("Vary %q", got)
	}
}

func TestJSONRoundTripCompiles(t *testing.T) {
	b := compiled(t).Marshal()
	s, err := Parse(b)
	if err != nil {
		t.Fatal(err)
	}
	req := Request{RawQuery: "debug"}
	if _, name, _ := s.Match(&req); name != "debug" {
		t.Fatalf("decoded set matched %q, want debug", name)
	}
	if _, err := Parse([]byte(`{"v":[{"n":"a","u":"https://example.com/","w":0}]}`)); err == nil {
		t.Fatal("Parse accepted a zero weight")
	}
	if s, err := Parse([]byte("null")); s != nil || err != nil {
		t.Fatalf("Parse(null) = %v, %v", s, err)
	}
	var empty *Set
	if empty.Marshal() != nil {
		t.Fatal("an empty set marshals to something")
	}
	if _, err := json.Marshal(s); err != nil {
		t.Fatal(err)
	}
}

func TestPickIsStickyAndWeighted(t *testing.T) {
	s := compiled(t)
	st := NewSticky([]byte("salt"))
	counts := map[string]int{}
	for i := range 4000 {
		visitor := netip.AddrFrom4([4]byte{10, 0, byte(i >> 8), byte(i)}).String()
		_, first, _ := s.Pick(st.Bucket(visitor, "code1"))
		for range 3 {
			if _, again, _ := s.Pick(st.Bucket(visitor, "code1")); again != first {
				t.Fatalf("visitor %s got %s then %s", visitor, first, again)
			}
		}
		counts[first]++
	}
	// Weights 3:1 over 4000 visitors: 3000 expected for a. A spread this
	// far off (more than 10 standard deviations) means a broken hash.
	if counts["a"] < 2700 || counts["a"] > 3300 {
		t.Fatalf("variant a got %d of 4000 visitors at weight 3 of 4", counts["a"])
	}
	if NewSticky([]byte("salt")).Bucket("v", "c") == NewSticky([]byte("other")).Bucket("v", "c") {
		t.Fatal("the salt does not change the bucket")
	}
}

func TestEvaluationAllocatesNothing(t *testing.T) {
	s := compiled(t)
	st := NewSticky([]byte("salt"))
	req := Request{NowMs: time.Now().UnixMilli(), Device: DeviceAndroid, AcceptLanguage: "en-US,en;q=0.9,de;q=0",
		RawQuery: "utm_source=x&debug2=1", Addr: netip.MustParseAddr("198.51.100.1"), Country: func(netip.Addr) string { return "US" }}
	allocs := testing.AllocsPerRun(100, func() {
		r := req
		if _, _, ok := s.Match(&r); ok {
			t.Fatal("matched")
		}
		s.Pick(st.Bucket("198.51.100.1", "abc"))
	})
	if allocs != 0 {
		t.Fatalf("%v allocations per evaluation", allocs)
	}
}

// BenchmarkEvaluate is what a rule-carrying link adds to a redirect: the
// sample's rules, none of which match, then a sticky variant.
func BenchmarkEvaluate(b *testing.B) {
	s := compiled(b)
	st := NewSticky([]byte("salt"))
	addr := netip.MustParseAddr("198.51.100.1")
	b.ReportAllocs()
	for b.Loop() {
		req := Request{NowMs: 5000, Device: DeviceDesktop, AcceptLanguage: "en-US,en;q=0.9,de;q=0", RawQuery: "utm_source=x", Addr: addr}
		if _, _, ok := s.Match(&req); ok {
			b.Fatal("matched")
		}
		s.Pick(st.Bucket("198.51.100.1", "abcdefg"))
	}
}

func TestZeroQuality(t *testing.T) {
	for params, want := range map[string]bool{
		"": false, ";q=0": true, "; q=0.000": true, ";Q=0.0": true, ";q=0.5": false, ";q=1": false,
		";level=1;q=0": true, ";q=0;x=1": true, ";xq=0": false, ";q=": false, ";q=0.01": false, ";q=00": false,
	} {
		if got := zeroQuality(params); got != want {
			t.Errorf("zeroQuality(%q) = %v, want %v", params, got, want)
		}
	}
}

func ptr(s string) *string { return &s }

// A query is split and decoded once per request, whatever the number of
// query conditions: the worst link (every rule's conditions all query
// conditions, all but the last holding) against a query of encoded
// parameters allocates what a link with one query condition does.
func TestQueryIsDecodedOncePerRequest(t *testing.T) {
	var q strings.Builder
	for i := range maxQueryParams {
		if i > 0 {
			q.WriteByte('&')
		}
		fmt.Fprintf(&q, "p%%3%d=v%%20%d", i%10, i) // p0 to p9, encoded
	}
	query := q.String()
	worst := &Set{}
	for i := range MaxRules {
		r := Rule{Name: fmt.Sprintf("r%d", i), URL: "https://example.com/"}
		for j := range MaxConditions - 1 {
			r.If = append(r.If, Condition{Query: &Query{Param: fmt.Sprintf("p%d", j)}})
		}
		r.If = append(r.If, Condition{Query: &Query{Param: "p9", Value: ptr("none")}})
		worst.Rules = append(worst.Rules, r)
	}
	one := &Set{Rules: []Rule{{Name: "r", If: []Condition{{Query: &Query{Param: "p9", Value: ptr("none")}}}, URL: "https://example.com/"}}}
	allocs := func(s *Set) float64 {
		if err := s.Compile(); err != nil {
			t.Fatal(err)
		}
		return testing.AllocsPerRun(20, func() {
			req := Request{RawQuery: query}
			if _, name, ok := s.Match(&req); ok {
				t.Fatalf("matched %s", name)
			}
		})
	}
	if w, o := allocs(worst), allocs(one); w != o {
		t.Fatalf("%d query conditions allocate %v per request, one allocates %v", MaxRules*MaxConditions, w, o)
	}
}

// Only whole parameters of the query's first maxQueryBytes are read: one
// the bound cuts neither matches with its cut value nor at all.
func TestQueryIsReadUpToItsBound(t *testing.T) {
	s := &Set{Rules: []Rule{
		{Name: "cut", If: []Condition{{Query: &Query{Param: "x", Value: ptr("1")}}}, URL: "https://example.com/cut"},
		{Name: "whole", If: []Condition{{Query: &Query{Param: "y"}}}, URL: "https://example.com/whole"},
	}}
	if err := s.Compile(); err != nil {
		t.Fatal(err)
	}
	filler := "f=" + strings.Repeat("a", maxQueryBytes-len("f=")-len("&y=1&x=1"))
	for _, tc := range []struct{ query, want string }{
		{filler + "&y=1&x=1", "cut"},    // ends at the bound
		{filler + "&y=1&x=12", "whole"}, // x=12 crosses it, is not x=1
		{filler + "&x=1" + "a&y=1", ""}, // y is past it
		{strings.Repeat("z", maxQueryBytes+1) + "&y=1", ""},
	} {
		req := Request{RawQuery: tc.query}
		if _, name, _ := s.Match(&req); name != tc.want {
			t.Errorf("query of %d bytes ending %q matched %q, want %q", len(tc.query), tc.query[len(tc.query)-12:], name, tc.want)
		}
	}
}

// A query component decodes as url.QueryUnescape decodes it; one it refuses
// (or longer than any condition's) is not a value.
func TestQueryComponentsDecodeLikeQueryUnescape(t *testing.T) {
	for _, enc := range []string{"", "a", "a+b", "a%20b", "%41%62", "%e2%82%AC", "%", "%4", "%zz", "a%2", "+%2B+",
		strings.Repeat("%41", MaxParamLength), strings.Repeat("%41", MaxParamLength+1), strings.Repeat("a", MaxParamLength+1)} {
		req := Request{RawQuery: "k=" + enc}
		ps := req.queryParams()
		if len(ps) != 1 || !req.equal(ps[0].name, "k") {
			t.Fatalf("%q: params %+v", enc, ps)
		}
		want, err := url.QueryUnescape(enc)
		wantOK := err == nil && len(want) <= MaxParamLength
		if got := ps[0].value; got.ok != wantOK || wantOK && !req.equal(got, want) {
			t.Errorf("%q decoded to %+v, want %q (ok %v)", enc, got, want, wantOK)
		}
	}
}
