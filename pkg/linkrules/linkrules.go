// Package linkrules is a link's dynamic redirect rules and A/B-test
// variants: their stored form (PostgreSQL jsonb and the linkcache entry, the
// same compact JSON), their bounds, and their evaluation by the redirect
// service.
//
// A link's destination for one visit is, first that applies:
//
//  1. the first rule (in order) whose conditions all hold: its URL;
//  2. the link's device target for the visitor's device (linkcache.Targets);
//  3. a variant, chosen by weight and sticky per visitor: the same visitor
//     (client address; an IPv6 /64) always gets the same variant of one
//     link while the variants and their weights are unchanged;
//  4. the link's long URL.
//
// Conditions: the visitor's device class (ios, android, desktop); a language
// range matched against Accept-Language tags whose quality is not 0 (RFC
// 4647 basic filtering: "de" matches "de" and "de-AT"); a query parameter
// present, or equal to a value; the client address in one of a set of CIDR
// prefixes; the client's country (ISO 3166-1 alpha-2, only when the redirect
// has a GeoIP database: without one a country condition never holds); a time
// window [from, until) in UTC. A condition with several values holds when any
// one does.
//
// A Set is compiled when it is decoded (UnmarshalJSON) or built (Compile):
// prefixes parsed, language ranges and countries normalised, weights summed.
// Evaluating a compiled Set allocates nothing unless a query parameter's name
// or value is percent-encoded in the request.
package linkrules

import (
	"cmp"
	"encoding/json"
	"fmt"
	"net/netip"
	"slices"
	"strings"
	"time"

	"kurz.dev/pkg/textcut"
)

// Bounds of one link's rules and variants.
const (
	// MaxRules is how many rules one link carries at most.
	MaxRules = 20
	// MaxConditions is how many conditions one rule has at most.
	MaxConditions = 8
	// MaxValues bounds the values of one condition (devices, languages,
	// CIDRs, countries).
	MaxValues = 32
	// MaxLinkValues bounds the values of all of one link's conditions
	// together (a query or time condition counts one). The per-part bounds
	// alone allow 5,120, a decoded Set of ~0.5-0.7 MiB that every redirect
	// pod would decode and cache; the shortener refuses more when rules are
	// written (Compile does not, so links stored before still decode).
	MaxLinkValues = 256
	// MaxVariants is how many variants one link carries at most.
	MaxVariants = 10
	// MaxWeight bounds one variant's weight (at least 1).
	MaxWeight = 1000
	// MaxNameLength bounds a rule's or variant's name.
	MaxNameLength = 32
	// MaxParamLength bounds a query condition's parameter name and value.
	MaxParamLength = 128
	// MaxLanguageLength bounds a language range ("de", "en-US", "zh-Hant-TW").
	MaxLanguageLength = 35
)

// Set is one link's rules and variants. Its zero value (or nil) has none.
type Set struct {
	// Rules are tried in order; the first whose conditions all hold wins.
	Rules []Rule `json:"r,omitempty"`
	// Variants share the visits no rule and no device target took.
	Variants []Variant `json:"v,omitempty"`

	prog *program
}

// Rule is a set of conditions, all of which must hold, and a destination.
type Rule struct {
	// Name labels the rule on clicks and in statistics.
	Name string `json:"n"`
	// If are the conditions.
	If []Condition `json:"if"`
	// URL is where a visit the rule matches goes.
	URL string `json:"u"`
}

// Condition is one test of a visit. Exactly one kind is set.
type Condition struct {
	// Devices: the visitor's device class is one of these (ios, android,
	// desktop).
	Devices []string `json:"d,omitempty"`
	// Languages: Accept-Language names, with a quality above 0, a tag in
	// one of these ranges.
	Languages []string `json:"l,omitempty"`
	// Query: the request's query has this parameter (with this value).
	Query *Query `json:"q,omitempty"`
	// CIDRs: the client address is in one of these prefixes.
	CIDRs []string `json:"c,omitempty"`
	// Countries: the client's country is one of these ISO 3166-1 alpha-2
	// codes.
	Countries []string `json:"g,omitempty"`
	// Time: the visit falls in this window.
	Time *Window `json:"t,omitempty"`
}

// Query tests one query parameter.
type Query struct {
	// Param is the parameter's (decoded) name.
	Param string `json:"p"`
	// Value, when set, is the (decoded) value the parameter must have; when
	// nil the parameter only has to be present.
	Value *string `json:"v,omitempty"`
}

// Window is a time window [From, Until) in Unix milliseconds; 0 leaves that
// side open.
type Window struct {
	FromMs  int64 `json:"f,omitempty"`
	UntilMs int64 `json:"u,omitempty"`
}

// Variant is one weighted destination of an A/B test.
type Variant struct {
	// Name labels the variant on clicks and in statistics.
	Name string `json:"n"`
	// URL is where the variant's visits go.
	URL string `json:"u"`
	// Weight is the variant's share: Weight over the sum of all weights.
	Weight int `json:"w"`
}

// Empty reports whether s carries neither rules nor variants.
func (s *Set) Empty() bool { return s == nil || len(s.Rules) == 0 && len(s.Variants) == 0 }

// Error is a refused Set: Field names the offending field in the API's
// terms (e.g. "rules[2].conditions[0].cidrs[1]").
type Error struct {
	Field   string
	Message string
}

func (e *Error) Error() string { return e.Field + ": " + e.Message }

func errorf(field, format string, args ...any) error {
	return &Error{Field: field, Message: fmt.Sprintf(format, args...)}
}

// Validate checks what is refused when rules are written but must not
// be when they are read back (Compile): a stored link keeps decoding,
// whatever a later version refuses. Today: control characters in a query
// condition (NUL among them, which PostgreSQL's jsonb refuses: the link's
// insert failed, a batch's with it; none is a query a link is shared
// with), and country codes no GeoIP database answers (UK, EU, XX: the
// condition would never hold). Links stored before the checks may hold a
// tab there, or UK, and still redirect.
func (s *Set) Validate() error {
	if s == nil {
		return nil
	}
	for i, r := range s.Rules {
		for j, c := range r.If {
			for k, code := range c.Countries {
				// Not two letters: Compile says so.
				u := strings.ToUpper(code)
				if len(u) != 2 || countryAssigned(u) || u[0] < 'A' || u[0] > 'Z' || u[1] < 'A' || u[1] > 'Z' {
					continue
				}
				field := fmt.Sprintf("rules[%d].conditions[%d].countries[%d]", i, j, k)
				if u == "UK" {
					return errorf(field, "%q is not an ISO 3166-1 alpha-2 code: the United Kingdom's is \"GB\"", code)
				}
				return errorf(field, "%q is not an assigned ISO 3166-1 alpha-2 code (such as \"DE\"), so no visit's country is ever it", code)
			}
			if c.Query == nil {
				continue
			}
			field := fmt.Sprintf("rules[%d].conditions[%d].query", i, j)
			if hasControl(c.Query.Param) {
				return errorf(field+".param", "a parameter name has no control characters")
			}
			if c.Query.Value != nil && hasControl(*c.Query.Value) {
				return errorf(field+".value", "a value has no control characters")
			}
		}
	}
	return nil
}

// Compile validates s (every bound and value, not the URLs: the shortener
// checks those like long URLs; Validate what only a write refuses) and
// prepares it for evaluation. Values are
// normalised in place: language ranges and devices to lower case, countries
// to upper case, prefixes to their masked form.
func (s *Set) Compile() error {
	if s == nil {
		return nil
	}
	if len(s.Rules) > MaxRules {
		return errorf("rules", "a link carries at most %d rules", MaxRules)
	}
	if len(s.Variants) > MaxVariants {
		return errorf("variants", "a link carries at most %d variants", MaxVariants)
	}
	p := &program{rules: make([]crule, len(s.Rules))}
	names := make(map[string]bool, len(s.Rules))
	for i := range s.Rules {
		r := &s.Rules[i]
		field := fmt.Sprintf("rules[%d]", i)
		if err := checkName(field+".name", r.Name); err != nil {
			return err
		}
		if names[r.Name] {
			return errorf(field+".name", "rule name %q is used twice", r.Name)
		}
		names[r.Name] = true
		if r.URL == "" {
			return errorf(field+".url", "a rule needs a destination URL")
		}
		if len(r.If) == 0 || len(r.If) > MaxConditions {
			return errorf(field+".conditions", "a rule has 1 to %d conditions", MaxConditions)
		}
		cr := crule{name: r.Name, url: r.URL, conds: make([]ccond, len(r.If))}
		for j := range r.If {
			c, err := compileCondition(fmt.Sprintf("%s.conditions[%d]", field, j), &r.If[j])
			if err != nil {
				return err
			}
			cr.conds[j] = c
			p.needs |= c.kind
		}
		// All must hold, so the order is free: cheapest first, so a rule
		// that fails does so before the costlier tests (the device class
		// reads the User-Agent, the country is a GeoIP lookup).
		slices.SortStableFunc(cr.conds, func(a, b ccond) int { return cmp.Compare(cost[a.kind], cost[b.kind]) })
		p.rules[i] = cr
	}
	clear(names)
	for i := range s.Variants {
		v := &s.Variants[i]
		field := fmt.Sprintf("variants[%d]", i)
		if err := checkName(field+".name", v.Name); err != nil {
			return err
		}
		if names[v.Name] {
			return errorf(field+".name", "variant name %q is used twice", v.Name)
		}
		names[v.Name] = true
		if v.URL == "" {
			return errorf(field+".url", "a variant needs a destination URL")
		}
		if v.Weight < 1 || v.Weight > MaxWeight {
			return errorf(field+".weight", "a weight is 1 to %d", MaxWeight)
		}
		p.total += uint64(v.Weight)
		p.cum = append(p.cum, p.total)
	}
	p.vary, p.varyDevice = vary(p.needs), vary(p.needs|kindDevice)
	s.prog = p
	return nil
}

// Size returns the number of s's conditions and of their values (a query
// or time condition counts one value): what its compiled form weighs in
// memory, ~300 bytes a condition and ~70 a further value, is mostly theirs.
func (s *Set) Size() (conditions, values int) {
	if s == nil {
		return 0, 0
	}
	for _, r := range s.Rules {
		conditions += len(r.If)
		for _, c := range r.If {
			values += max(1, len(c.Devices)+len(c.Languages)+len(c.CIDRs)+len(c.Countries))
		}
	}
	return conditions, values
}

// UnmarshalJSON decodes and compiles a Set.
func (s *Set) UnmarshalJSON(b []byte) error {
	type plain Set
	var v plain
	if err := json.Unmarshal(b, &v); err != nil {
		return err
	}
	*s = Set(v)
	return s.Compile()
}

// Parse decodes and compiles a stored Set; nil (not an error) when b is
// empty or JSON null, or the Set is empty.
func Parse(b []byte) (*Set, error) {
	if len(b) == 0 || string(b) == "null" {
		return nil, nil
	}
	var s Set
	if err := json.Unmarshal(b, &s); err != nil {
		return nil, fmt.Errorf("linkrules: %w", err)
	}
	if s.Empty() {
		return nil, nil
	}
	return &s, nil
}

// Marshal encodes s for storage; nil for an empty Set.
func (s *Set) Marshal() []byte {
	if s.Empty() {
		return nil
	}
	b, _ := json.Marshal(s) // cannot fail: strings, integers, slices
	return b
}

// hasControl reports whether s holds a C0 control character or DEL.
func hasControl(s string) bool {
	return strings.IndexFunc(s, func(r rune) bool { return r < 0x20 || r == 0x7f }) >= 0
}

func checkName(field, name string) error {
	if name == "" || len(name) > MaxNameLength {
		return errorf(field, "a name has 1 to %d characters", MaxNameLength)
	}
	for i := 0; i < len(name); i++ {
		c := name[i]
		if !(c >= 'a' && c <= 'z' || c >= '0' && c <= '9' || c == '.' || c == '_' || c == '-') {
			return errorf(field, "%q: a name uses only a-z, 0-9, '.', '_' and '-'", name)
		}
	}
	return nil
}

// kind is a condition kind, as a bit so a program can say which inputs it
// needs.
type kind uint8

const (
	kindDevice kind = 1 << iota
	kindLanguage
	kindQuery
	kindCIDR
	kindCountry
	kindTime
)

// cost orders a rule's conditions for evaluation, cheapest first.
var cost = map[kind]int{kindTime: 0, kindCIDR: 1, kindQuery: 2, kindLanguage: 3, kindDevice: 4, kindCountry: 5}

type ccond struct {
	kind     kind
	devices  uint8 // bit per Device
	values   []string
	prefixes []netip.Prefix
	param    string
	value    string
	hasValue bool
	from     int64
	until    int64
}

func compileCondition(field string, c *Condition) (ccond, error) {
	var out ccond
	n := 0
	count := func(k kind, set bool) {
		if set {
			n++
			out.kind = k
		}
	}
	count(kindDevice, c.Devices != nil)
	count(kindLanguage, c.Languages != nil)
	count(kindQuery, c.Query != nil)
	count(kindCIDR, c.CIDRs != nil)
	count(kindCountry, c.Countries != nil)
	count(kindTime, c.Time != nil)
	if n != 1 {
		return ccond{}, errorf(field, "a condition is exactly one of devices, languages, query, cidrs, countries, time")
	}
	values := func(name string, vs []string) error {
		if len(vs) == 0 || len(vs) > MaxValues {
			return errorf(field+"."+name, "1 to %d values", MaxValues)
		}
		return nil
	}
	switch out.kind {
	case kindDevice:
		if err := values("devices", c.Devices); err != nil {
			return ccond{}, err
		}
		for i, d := range c.Devices {
			d = strings.ToLower(d)
			dev, ok := deviceNames[d]
			if !ok {
				return ccond{}, errorf(fmt.Sprintf("%s.devices[%d]", field, i), "%q: a device is ios, android or desktop", trim(d))
			}
			c.Devices[i] = d
			out.devices |= 1 << dev
		}
	case kindLanguage:
		if err := values("languages", c.Languages); err != nil {
			return ccond{}, err
		}
		for i, l := range c.Languages {
			if !languageRange(l) {
				return ccond{}, errorf(fmt.Sprintf("%s.languages[%d]", field, i),
					"%q is not a language range such as \"de\" or \"en-US\"", trim(l))
			}
			c.Languages[i] = strings.ToLower(l)
		}
		out.values = c.Languages
	case kindQuery:
		q := c.Query
		if q.Param == "" || len(q.Param) > MaxParamLength {
			return ccond{}, errorf(field+".query.param", "a parameter name has 1 to %d bytes", MaxParamLength)
		}
		out.param = q.Param
		if q.Value != nil {
			if len(*q.Value) > MaxParamLength {
				return ccond{}, errorf(field+".query.value", "a value has at most %d bytes", MaxParamLength)
			}
			out.value, out.hasValue = *q.Value, true
		}
	case kindCIDR:
		if err := values("cidrs", c.CIDRs); err != nil {
			return ccond{}, err
		}
		out.prefixes = make([]netip.Prefix, len(c.CIDRs))
		for i, s := range c.CIDRs {
			p, err := netip.ParsePrefix(s)
			if err != nil || p.Addr().Zone() != "" {
				return ccond{}, errorf(fmt.Sprintf("%s.cidrs[%d]", field, i), "%q is not a CIDR prefix such as 203.0.113.0/24", trim(s))
			}
			if p.Addr().Is4In6() {
				p = netip.PrefixFrom(p.Addr().Unmap(), max(0, p.Bits()-96))
			}
			p = p.Masked()
			out.prefixes[i] = p
			c.CIDRs[i] = p.String()
		}
	case kindCountry:
		if err := values("countries", c.Countries); err != nil {
			return ccond{}, err
		}
		for i, s := range c.Countries {
			u := strings.ToUpper(s)
			if len(u) != 2 || u[0] < 'A' || u[0] > 'Z' || u[1] < 'A' || u[1] > 'Z' {
				return ccond{}, errorf(fmt.Sprintf("%s.countries[%d]", field, i), "%q is not an ISO 3166-1 alpha-2 code such as \"DE\"", trim(s))
			}
			c.Countries[i] = u
		}
		out.values = c.Countries
	case kindTime:
		w := c.Time
		if w.FromMs < 0 || w.UntilMs < 0 || w.FromMs == 0 && w.UntilMs == 0 {
			return ccond{}, errorf(field+".time", "a time window needs a from or an until time (or both)")
		}
		if w.UntilMs != 0 && w.UntilMs <= w.FromMs {
			return ccond{}, errorf(field+".time", "until must be after from")
		}
		out.from, out.until = w.FromMs, w.UntilMs
	}
	return out, nil
}

// trim cuts a refused value for an error message.
func trim(s string) string { return textcut.Echo(s, 40) }

// languageRange reports whether s is a language range: 1 to 8 letters, then
// subtags of 1 to 8 letters or digits, each after a '-'.
func languageRange(s string) bool {
	if s == "" || len(s) > MaxLanguageLength {
		return false
	}
	for i, sub := range strings.Split(s, "-") {
		if len(sub) == 0 || len(sub) > 8 {
			return false
		}
		for j := 0; j < len(sub); j++ {
			c := sub[j] | 0x20
			if !(c >= 'a' && c <= 'z' || i > 0 && sub[j] >= '0' && sub[j] <= '9') {
				return false
			}
		}
	}
	return true
}

// Device classes, in the order of the redirect's classification.
const (
	DeviceDesktop = iota
	DeviceIOS
	DeviceAndroid
)

var deviceNames = map[string]int{"desktop": DeviceDesktop, "ios": DeviceIOS, "android": DeviceAndroid}

// TimeOf converts a stored millisecond time to a time.Time (0: the zero
// Time).
func TimeOf(ms int64) time.Time {
	if ms == 0 {
		return time.Time{}
	}
	return time.UnixMilli(ms).UTC()
}
