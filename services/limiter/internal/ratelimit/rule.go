// Package ratelimit decides rate-limit requests: rules matched against a
// request's descriptors, evaluated atomically by Lua scripts on Redis Cluster
// (Redis TIME as the clock), with a failure mode per rule when Redis is slow
// or down.
package ratelimit

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"maps"
	"math"
	"slices"
	"strings"
	"time"

	ratelimitv1 "kurz.dev/gen/kurz/ratelimit/v1"
)

// Rule is one limit. Limit per Window is the long-run rate for every
// algorithm; Burst is the capacity of the token and leaky buckets (Limit when
// zero).
type Rule struct {
	Domain string
	Name   string
	// Key lists the descriptors whose values form the rule's key; a request
	// lacking any of them is not subject to the rule.
	Key []string
	// Match restricts the rule to requests whose descriptors have these
	// values (e.g. route = "POST /v1/links"); a value ending in '*' is a
	// prefix ("/api/*": every value starting with "/api/").
	Match     map[string]string
	Algorithm ratelimitv1.Algorithm
	Limit     int64
	Window    time.Duration
	Burst     int64
	// Queue makes a leaky bucket admit with a delay instead of only metering.
	Queue       bool
	FailureMode ratelimitv1.FailureMode
	// Shadow rules are evaluated and reported but never deny.
	Shadow bool
	// ShardByTenant stores the rule's state under the tenant's hash tag, so
	// it is decided in one script with the tenant's other such rules. Off,
	// the rule's own key is the hash tag and a big tenant's keys spread over
	// the cluster.
	ShardByTenant bool
	// Lease, when its Size is set, lets each replica take up to Size units
	// of a key from Redis at once and hand them out in memory (lease.go).
	Lease Lease
	// Share counts every value a prefix of Match matches as one: the key
	// holds the prefix where it would hold the value (envoyproxy/
	// ratelimit's share_threshold). Off, each value has its own counter.
	Share bool
	// Unlimited rules limit nothing: matched like any rule, so their
	// specificity keeps less specific rules off a descriptor, but decided
	// in memory, always allowed, with no key and no Redis call
	// (envoyproxy/ratelimit's unlimited: true). They have no algorithm,
	// limit, window or failure mode.
	Unlimited bool
}

// ID is "domain/name", unique across domains.
func (r *Rule) ID() string { return r.Domain + "/" + r.Name }

// capacity is the most the rule ever holds: Burst for the buckets, else Limit.
func (r *Rule) capacity() int64 {
	if (r.Algorithm == ratelimitv1.Algorithm_ALGORITHM_TOKEN_BUCKET || r.Algorithm == ratelimitv1.Algorithm_ALGORITHM_LEAKY_BUCKET) && r.Burst > 0 {
		return r.Burst
	}
	return r.Limit
}

// Validate reports the first problem with the rule, in words an operator can
// act on.
func (r *Rule) Validate() error {
	switch {
	case !validName(r.Domain):
		return fmt.Errorf("rule %q: domain %q: want letters, digits, '.', '_' or '-'", r.Name, r.Domain)
	case !validName(r.Name):
		return fmt.Errorf("rule %q in domain %s: name: want letters, digits, '.', '_' or '-'", r.Name, r.Domain)
	case len(r.Key) == 0:
		return fmt.Errorf("rule %s: key: name at least one descriptor", r.ID())
	case r.Unlimited:
		return r.validateUnlimited()
	case r.Algorithm == ratelimitv1.Algorithm_ALGORITHM_UNSPECIFIED:
		return fmt.Errorf("rule %s: algorithm: want token_bucket, fixed_window, sliding_window_counter, sliding_log or leaky_bucket", r.ID())
	case r.Limit <= 0:
		return fmt.Errorf("rule %s: limit must be positive", r.ID())
	case r.Window < time.Millisecond:
		return fmt.Errorf("rule %s: window must be at least 1ms", r.ID())
	case r.Burst < 0:
		return fmt.Errorf("rule %s: burst must not be negative", r.ID())
	case r.FailureMode == ratelimitv1.FailureMode_FAILURE_MODE_UNSPECIFIED:
		return fmt.Errorf("rule %s: failure_mode: want open, closed or local", r.ID())
	}
	if err := r.validateSize(); err != nil {
		return fmt.Errorf("rule %s: %w", r.ID(), err)
	}
	if err := r.validateMatch(); err != nil {
		return err
	}
	if r.ShardByTenant && !containsString(r.Key, "tenant") {
		return fmt.Errorf("rule %s: shard: tenant needs \"tenant\" among the key descriptors", r.ID())
	}
	if r.Share && !slices.ContainsFunc(slices.Collect(maps.Values(r.Match)), isPrefix) {
		return fmt.Errorf("rule %s: share: counts the values of a prefix together, and no match value ends in '*'", r.ID())
	}
	return r.validateLease()
}

// validateMatch checks the rule's key descriptors and its match. A name no
// request can send (CheckQuota refuses it) would make a rule that never
// applies, silently: a fail-closed login rule protecting nothing.
func (r *Rule) validateMatch() error {
	for _, k := range r.Key {
		if !validName(k) {
			return fmt.Errorf("rule %s: key descriptor %q: want letters, digits, '.', '_' or '-'", r.ID(), k)
		}
	}
	for _, k := range slices.Sorted(maps.Keys(r.Match)) {
		if !validName(k) {
			return fmt.Errorf("rule %s: match descriptor %q: want letters, digits, '.', '_' or '-', a name a request can send", r.ID(), k)
		}
		v := r.Match[k]
		if i := strings.IndexByte(v, '*'); i >= 0 && i < len(v)-1 {
			return fmt.Errorf("rule %s: match %s: %q: '*' may only end a value (a prefix, as in \"/api/*\"); kurz has no other wildcard", r.ID(), k, v)
		}
	}
	return nil
}

// validateUnlimited checks an unlimited rule: its key and match, and
// nothing of a limit, which it would silently ignore (it decides in
// memory, never on Redis).
func (r *Rule) validateUnlimited() error {
	var set []string
	for _, f := range []struct {
		name string
		set  bool
	}{
		{"algorithm", r.Algorithm != ratelimitv1.Algorithm_ALGORITHM_UNSPECIFIED},
		{"limit", r.Limit != 0}, {"window", r.Window != 0}, {"burst", r.Burst != 0},
		{"queue", r.Queue}, {"failure_mode", r.FailureMode != ratelimitv1.FailureMode_FAILURE_MODE_UNSPECIFIED},
		{"shadow", r.Shadow}, {"shard", r.ShardByTenant}, {"lease", r.Lease != (Lease{})}, {"share", r.Share},
	} {
		if f.set {
			set = append(set, f.name)
		}
	}
	if len(set) > 0 {
		return fmt.Errorf("rule %s: unlimited: limits nothing and never reaches Redis, so %s would mean nothing: remove %s (or unlimited)", r.ID(), strings.Join(set, ", "), strings.Join(set, ", "))
	}
	return r.validateMatch()
}

// Bounds on a rule's figures. The scripts compute in Lua numbers (doubles,
// exact to 2^53) and return integers; a state's TTL is a window, or the
// time a bucket takes to refill, in milliseconds.
const (
	// MaxLimit bounds limit and burst: with a cost of up to a million
	// they stay exact.
	MaxLimit = 1 << 40
	// MaxSlidingLogLimit bounds a sliding log, which keeps one Redis
	// entry per unit in its window: about 1 MiB for a full key, and a
	// decision that adds them all holds its Redis node ~20 ms (a million
	// held it 5 s, every other key of the node waiting).
	MaxSlidingLogLimit = 10_000
	// MaxWindow bounds a window, and a bucket's time to refill from empty.
	MaxWindow = 400 * 24 * time.Hour
)

// validateSize checks the rule's figures against the bounds above (a plan
// override is checked on the rule it makes).
func (r *Rule) validateSize() error {
	switch {
	case r.Limit > MaxLimit || r.Burst > MaxLimit:
		return fmt.Errorf("limit and burst must be at most %d", int64(MaxLimit))
	case r.Algorithm == ratelimitv1.Algorithm_ALGORITHM_SLIDING_LOG && r.Limit > MaxSlidingLogLimit:
		return fmt.Errorf("limit %d: a sliding log keeps one entry per unit in its window, at most %d", r.Limit, MaxSlidingLogLimit)
	case r.Window > MaxWindow:
		return fmt.Errorf("window %v: at most %v", r.Window, MaxWindow)
	case r.Window%time.Millisecond != 0:
		// The scripts count in whole milliseconds: 1500us would be
		// decided as 1ms on Redis and as 1.5ms by the local fallback.
		return fmt.Errorf("window %v: want a whole number of milliseconds", r.Window)
	case r.Limit > 0 && float64(r.capacity())*float64(r.Window)/float64(r.Limit) > float64(MaxWindow):
		refill := float64(r.capacity()) * float64(r.Window) / float64(r.Limit)
		took := "over 290 years" // past what a Duration holds
		if refill < float64(math.MaxInt64) {
			took = time.Duration(refill).Round(time.Hour).String()
		}
		return fmt.Errorf("burst %d refills in %s at %d per %v: at most %v", r.capacity(), took, r.Limit, r.Window, MaxWindow)
	}
	return nil
}

// matcher is a rule's key and match compiled for the walk every request
// descriptor makes over its domain's rules: slices, where ranging over the
// rule's Match map would start an iterator (a random start, then hashing)
// per rule per descriptor, which was most of MatchEnvoy's time.
type matcher struct {
	key   []string
	match []matchEntry // by descriptor name, sorted
	// named is every descriptor the rule names, in its key or its match,
	// each once.
	named []string
}

type matchEntry struct {
	desc, want string
	prefix     bool // want ends in '*': it takes the values starting with want[:len(want)-1]
}

func newMatcher(r *Rule) matcher {
	m := matcher{key: r.Key}
	for _, k := range slices.Sorted(maps.Keys(r.Match)) {
		m.match = append(m.match, matchEntry{desc: k, want: r.Match[k], prefix: isPrefix(r.Match[k])})
		m.named = append(m.named, k)
	}
	for _, k := range r.Key {
		if !slices.Contains(m.named, k) {
			m.named = append(m.named, k)
		}
	}
	return m
}

// matches reports whether the rule applies to a request with these
// descriptors: the request has every descriptor of the rule's key, and
// the values of its match. A descriptor with an empty value counts as
// given only if given is true (Envoy's entries: a present header sent
// empty is counted under "", as envoyproxy/ratelimit counts it); in
// CheckQuota it is one left out.
//
// A match value ending in '*' takes every value of a descriptor given that
// starts with what precedes it; only a value that differs pays for that
// test.
func (m *matcher) matches(desc map[string]string, given bool) bool {
	for _, k := range m.key {
		if missing(desc, k, given) {
			return false
		}
	}
	for _, e := range m.match {
		if v := desc[e.desc]; v != e.want && (!e.prefix || missing(desc, e.desc, given) || !strings.HasPrefix(v, e.want[:len(e.want)-1])) {
			return false
		}
	}
	return true
}

// isPrefix reports whether a match value is a prefix: it ends in '*'.
func isPrefix(want string) bool { return len(want) > 0 && want[len(want)-1] == '*' }

// names reports whether the rule names every one of desc's descriptors
// (in its key or its match): as many of the descriptors it names are in
// desc as desc has.
func (m *matcher) names(desc map[string]string) bool {
	n := 0
	for _, k := range m.named {
		if _, ok := desc[k]; ok {
			n++
		}
	}
	return n == len(desc)
}

// specificity is how closely a rule fits a request descriptor it matches:
// the values it matches exactly, then those it matches by a prefix, then
// the length of those prefixes together. So, as in envoyproxy/ratelimit's
// walk, an exact value beats a prefix, which beats the key alone; and of
// two prefixes of one value the longer wins.
type specificity struct{ exact, prefixes, prefixLen int }

func (s specificity) compare(o specificity) int {
	switch {
	case s.exact != o.exact:
		return s.exact - o.exact
	case s.prefixes != o.prefixes:
		return s.prefixes - o.prefixes
	}
	return s.prefixLen - o.prefixLen
}

// specificityIn is the rule's specificity for desc: only its match values
// of descriptors desc has count.
func (m *matcher) specificityIn(desc map[string]string) specificity {
	var s specificity
	for _, e := range m.match {
		if _, ok := desc[e.desc]; !ok {
			continue
		}
		if e.prefix {
			s.prefixes++
			s.prefixLen += len(e.want) - 1
		} else {
			s.exact++
		}
	}
	return s
}

// CompareMatches compares two rules' matches as MatchEnvoy does for a
// request descriptor that has every descriptor of both: positive when a's
// rule is the more specific (it applies, not b's), zero when both apply.
func CompareMatches(a, b map[string]string) int {
	ma, mb := newMatcher(&Rule{Match: a}), newMatcher(&Rule{Match: b})
	return ma.specificityIn(a).compare(mb.specificityIn(b))
}

// stateKey is the Redis key of the rule's state for this request, without a
// key prefix: rl:{t:<tenant>}:<domain>:<rule>:<values> when sharded by
// tenant, else rl:{<domain>:<rule>:<values>}.
func (r *Rule) stateKey(desc map[string]string) string {
	key, _ := r.keyAndTag(desc, "")
	return key
}

// keyAndTag returns the rule's state key for this request, prefix first,
// and its hash tag, the part between the braces (the tenant for rules
// sharded by tenant, else the rule's key but the prefix): one string, built
// once per decision, the tag a slice of it. The prefix is outside the
// braces, so it leaves the key's slot as it is.
func (r *Rule) keyAndTag(desc map[string]string, prefix string) (key, tag string) {
	var b strings.Builder
	n := len(prefix) + len("rl:{}:") + len(r.Domain) + len(r.Name)
	for _, k := range r.Key {
		if want, ok := r.sharedPrefix(k); ok {
			n += 2 + len(want)
		} else {
			n += 1 + len(desc[k])
		}
	}
	tenant := ""
	if r.ShardByTenant {
		tenant = r.keyValue(desc, "tenant")
		n += len("t:}:") + len(tenant)
	}
	b.Grow(n)
	b.WriteString(prefix)
	b.WriteString("rl:{")
	if r.ShardByTenant {
		b.WriteString("t:")
		b.WriteString(tenant)
		b.WriteString("}:")
	}
	b.WriteString(r.Domain)
	b.WriteByte(':')
	b.WriteString(r.Name)
	for _, k := range r.Key {
		b.WriteByte(':')
		if want, ok := r.sharedPrefix(k); ok {
			// The prefix's counter: written as keyValue has it, without
			// a string of its own per decision.
			b.WriteString(escapeValue(want))
			b.WriteByte('*')
		} else {
			b.WriteString(escapeValue(desc[k]))
		}
	}
	if !r.ShardByTenant {
		b.WriteByte('}')
	}
	key = b.String()
	open := len(prefix) + len("rl:{")
	if r.ShardByTenant {
		return key, key[open : open+len("t:")+len(tenant)]
	}
	return key, key[open : len(key)-1]
}

// MaxKeyPrefixLen bounds a key prefix: it is in every key, so every
// decision sends it and Redis stores it once per counter.
const MaxKeyPrefixLen = 64

// ValidKeyPrefix reports whether prefix can go before every Redis key of the
// limiter: empty (the keys as they always were), or up to MaxKeyPrefixLen
// printable ASCII characters other than a brace (a '{' or '}' would change
// the key's hash tag, Redis Cluster placing it on another slot than its
// rule's others) and whitespace.
func ValidKeyPrefix(prefix string) error {
	if len(prefix) > MaxKeyPrefixLen {
		return fmt.Errorf("key prefix of %d bytes: want at most %d", len(prefix), MaxKeyPrefixLen)
	}
	for i := range len(prefix) {
		if c := prefix[i]; c <= ' ' || c > '~' || c == '{' || c == '}' {
			return fmt.Errorf("key prefix %q: want printable ASCII without whitespace or braces (a { or } would change the keys' hash tags), such as envoy:", prefix)
		}
	}
	return nil
}

// keyValue is descriptor k's part of the rule's key: its value escaped,
// or, for a rule that shares a prefix's counter, the prefix escaped and a
// '*', which no escaped value holds, so no value forges the shared key.
func (r *Rule) keyValue(desc map[string]string, k string) string {
	if want, ok := r.sharedPrefix(k); ok {
		return escapeValue(want) + "*"
	}
	return escapeValue(desc[k])
}

// sharedPrefix is the prefix (its '*' cut; "" for a match of "*") whose
// values share descriptor k's counter; ok is false when each value has
// its own.
func (r *Rule) sharedPrefix(k string) (prefix string, ok bool) {
	if !r.Share {
		return "", false
	}
	if want := r.Match[k]; isPrefix(want) {
		return want[:len(want)-1], true
	}
	return "", false
}

// maxValueLen is the longest descriptor value kept readable in a key; longer
// ones are hashed so keys stay small.
const maxValueLen = 64

// escapeValue makes a descriptor value safe inside a key: it percent-encodes
// every byte outside [A-Za-z0-9._@/-] (so ':', '{' and '}' can neither forge
// another rule's key nor steer the hash slot), and replaces values longer
// than maxValueLen by '#' and a hash. The mapping is injective.
func escapeValue(v string) string {
	if len(v) > maxValueLen {
		sum := sha256.Sum256([]byte(v))
		return "#" + hex.EncodeToString(sum[:16])
	}
	safe := true
	for i := 0; i < len(v); i++ {
		if !safeByte(v[i]) {
			safe = false
			break
		}
	}
	if safe {
		return v
	}
	const hexDigits = "0123456789ABCDEF"
	var b strings.Builder
	b.Grow(len(v) + 8)
	for i := 0; i < len(v); i++ {
		c := v[i]
		if safeByte(c) {
			b.WriteByte(c)
			continue
		}
		b.WriteByte('%')
		b.WriteByte(hexDigits[c>>4])
		b.WriteByte(hexDigits[c&15])
	}
	return b.String()
}

func safeByte(c byte) bool {
	return c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' ||
		c == '.' || c == '_' || c == '-' || c == '@' || c == '/'
}

// ValidName reports whether s is a valid domain, rule or descriptor name:
// 1 to 64 letters, digits, '.', '_' or '-'.
func ValidName(s string) bool { return validName(s) }

func validName(s string) bool {
	if s == "" || len(s) > 64 {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '.' || c == '_' || c == '-') {
			return false
		}
	}
	return true
}

func containsString(list []string, s string) bool {
	for _, x := range list {
		if x == s {
			return true
		}
	}
	return false
}
