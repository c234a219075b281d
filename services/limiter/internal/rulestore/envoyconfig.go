package rulestore

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"

	yamlv2 "go.yaml.in/yaml/v2"
	"go.yaml.in/yaml/v3"

	"kurz.dev/pkg/envoydir"
	"kurz.dev/services/limiter/internal/ratelimit"
)

// Bounds on what envoyproxy/ratelimit configuration kurz translates. Its
// files together hold at most maxRulesBytes, as one rules file does;
// a request descriptor has at most 32 entries (quotaapi's bound), so a
// deeper path could never apply; and the check that kurz's matching gives
// what envoyproxy/ratelimit's does walks every branch of a domain, so both
// are bounded.
const (
	maxEnvoyDepth  = 32
	maxEnvoyLimits = 10_000
	// maxEnvoyBranches bounds the descriptors the check walks per domain.
	maxEnvoyBranches = 1_000_000
)

// EnvoyFile is one envoyproxy/ratelimit configuration file: its name (for
// errors) and content.
type EnvoyFile struct {
	Name string
	Data []byte
}

// envoyRoot, envoyDescriptor and envoyRateLimit are envoyproxy/ratelimit's
// configuration (src/config/config_impl.go's YAML types), every field it
// knows, so that one kurz has no equivalent for is refused by name rather
// than taken for a typo, and a typo is refused as envoyproxy/ratelimit
// refuses it.
type envoyRoot struct {
	Domain      string            `yaml:"domain"`
	Descriptors []envoyDescriptor `yaml:"descriptors"`
}

type envoyDescriptor struct {
	Key            string            `yaml:"key"`
	Value          string            `yaml:"value"`
	RateLimit      *envoyRateLimit   `yaml:"rate_limit"`
	Descriptors    []envoyDescriptor `yaml:"descriptors"`
	ShadowMode     bool              `yaml:"shadow_mode"`
	DetailedMetric bool              `yaml:"detailed_metric"`
	ValueToMetric  bool              `yaml:"value_to_metric"`
	ShareThreshold bool              `yaml:"share_threshold"`
}

type envoyRateLimit struct {
	RequestsPerUnit uint32 `yaml:"requests_per_unit"`
	Unit            string `yaml:"unit"`
	Unlimited       bool   `yaml:"unlimited"`
	Name            string `yaml:"name"`
	Replaces        []struct {
		Name string `yaml:"name"`
	} `yaml:"replaces"`
}

// envoyUnits are envoyproxy/ratelimit's units (case does not matter to
// it) as kurz windows: a week is 7 days, a month 30, a year 365, as
// envoyproxy/ratelimit counts them (utils.UnitToDivider).
var envoyUnits = map[string]string{
	"second": "1s", "minute": "1m", "hour": "1h", "day": "24h",
	"week": "168h", "month": "720h", "year": "8760h",
}

// envoyNode is one descriptor of a domain's tree.
type envoyNode struct {
	id       int
	key      string
	value    string // "" for a key alone
	limit    *envoyRateLimit
	shadow   bool
	share    bool                  // share_threshold, on a wildcard
	children map[string]*envoyNode // by envoyproxy/ratelimit's composite key
	path     []*envoyNode          // from the top level to this node
	rule     *ratelimit.RuleSpec   // what kurz makes of limit; nil for none
	// wild are the children with a wildcard value, in file order: the
	// order envoyproxy/ratelimit tries them in (wildcardKeys).
	wild []*envoyNode
}

// compositeKey is envoyproxy/ratelimit's map key for a descriptor: key, or
// key_value.
func compositeKey(key, value string) string {
	if value == "" {
		return key
	}
	return key + "_" + value
}

// wildcard reports whether the node's value is a wildcard: it ends in '*'
// (and a '*' before the end is refused).
func (n *envoyNode) wildcard() bool { return strings.HasSuffix(n.value, "*") }

// wildPrefix is what a request entry's key_value must start with for
// envoyproxy/ratelimit to take the wildcard node n: its composite key
// without the '*'. The key's '_' is in it, so the prefix of one key's
// wildcard can be another key's spelling (user_* takes user_agent=x).
func (n *envoyNode) wildPrefix() string {
	return strings.TrimSuffix(compositeKey(n.key, n.value), "*")
}

// envoyNext is the node envoyproxy/ratelimit's GetLimit goes to from at
// for the request entry key=v: key_v's own, else the first wildcard of at
// (in file order) whose prefix key_v starts with, else key's alone; nil
// where its walk stops.
func envoyNext(at *envoyNode, key, v string) *envoyNode {
	if at == nil {
		return nil
	}
	full := key + "_" + v
	if n := at.children[full]; n != nil {
		return n
	}
	for _, w := range at.wild {
		if strings.HasPrefix(full, w.wildPrefix()) {
			return w
		}
	}
	return at.children[key]
}

// describe names the node's path for errors: generic_key=api > remote_address.
func (n *envoyNode) describe() string {
	parts := make([]string, len(n.path))
	for i, p := range n.path {
		parts[i] = p.key
		if p.value != "" {
			parts[i] += "=" + p.value
		}
	}
	return strings.Join(parts, " > ")
}

// keys returns the keys along the node's path, in order.
func (n *envoyNode) keys() []string {
	keys := make([]string, len(n.path))
	for i, p := range n.path {
		keys[i] = p.key
	}
	return keys
}

// FromEnvoy translates envoyproxy/ratelimit configuration files, one
// domain each, into kurz's rules. Each descriptor with a rate_limit is
// one fixed_window rule (what envoyproxy/ratelimit counts with), failing
// open: its key the path's keys, its match the path's values (a wildcard
// value, "/api/*", a prefix; share_threshold on one is the rule's share).
// What kurz cannot decide as envoyproxy/ratelimit would is refused, naming
// the file, domain and descriptor: replaces, a '*' before a value's end,
// requests_per_unit 0, a key of a level spelt as another of its keys and
// a value (user_vip beside user), and trees whose rules kurz's matching (the most
// specific win, rules as specific as each other all apply) would
// combine otherwise than envoyproxy/ratelimit's walk (a value's branch
// before its key's, never going back).
func FromEnvoy(files []EnvoyFile) (ratelimit.Config, error) {
	return translateEnvoy(files, EnvoyOptions{})
}

// EnvoyOptions are the choices envoyproxy/ratelimit's own settings make
// of how its files are read.
type EnvoyOptions struct {
	// MergeDomains is its MERGE_DOMAIN_CONFIG: several files may hold
	// one domain, their top-level descriptors loaded into it in file
	// order (one composite key twice at the top level is refused, as it
	// refuses it). Without it, one domain in two files is refused.
	MergeDomains bool
}

// envoyDomain is one domain's files, in the order they were given.
type envoyDomain struct {
	name  string
	files []string
	roots []envoyRoot
}

func translateEnvoy(files []EnvoyFile, opts EnvoyOptions) (ratelimit.Config, error) {
	cfg := ratelimit.Config{Domains: map[string]ratelimit.DomainSpec{}}
	var domains []*envoyDomain
	byName := map[string]*envoyDomain{}
	total, limits := 0, 0
	for _, f := range files {
		total += len(f.Data)
		if total > maxRulesBytes {
			return ratelimit.Config{}, fmt.Errorf("envoy rules %s: the files come to over %d bytes (a ConfigMap's bound): split the domains over several limiters", f.Name, maxRulesBytes)
		}
		root, err := decodeEnvoy(f)
		if err != nil {
			return ratelimit.Config{}, err
		}
		d := byName[root.Domain]
		switch {
		case d == nil:
			d = &envoyDomain{name: root.Domain}
			byName[root.Domain] = d
			domains = append(domains, d)
		case !opts.MergeDomains:
			return ratelimit.Config{}, fmt.Errorf("envoy rules %s: duplicate domain %q, also in %s (envoyproxy/ratelimit refuses it too, unless MERGE_DOMAIN_CONFIG: KURZ_LIMITER_ENVOY_MERGE_DOMAINS, or kurzctl rules apply --merge-domains): put its descriptors in one file", f.Name, root.Domain, d.files[0])
		}
		d.files = append(d.files, f.Name)
		d.roots = append(d.roots, root)
	}
	for _, d := range domains {
		t := &envoyTranslation{domain: d.name}
		spec, err := t.translate(d.files, d.roots)
		if err != nil {
			return ratelimit.Config{}, err
		}
		limits += len(spec.Rules)
		if limits > maxEnvoyLimits {
			return ratelimit.Config{}, fmt.Errorf("envoy rules %s: over %d rate limits in all", t.file, maxEnvoyLimits)
		}
		cfg.Domains[d.name] = spec
	}
	return cfg, nil
}

// decodeEnvoy decodes one file strictly: one document, known fields only.
func decodeEnvoy(f EnvoyFile) (envoyRoot, error) {
	var root envoyRoot
	dec := yaml.NewDecoder(bytes.NewReader(f.Data))
	dec.KnownFields(true)
	if err := dec.Decode(&root); err != nil {
		if errors.Is(err, io.EOF) {
			return root, fmt.Errorf("envoy rules %s: empty file", f.Name)
		}
		return root, fmt.Errorf("envoy rules %s: %w", f.Name, err)
	}
	if err := dec.Decode(&struct{}{}); !errors.Is(err, io.EOF) {
		return root, fmt.Errorf("envoy rules %s: more than one document (---): envoyproxy/ratelimit reads only the first; one domain per file", f.Name)
	}
	var doc yaml.Node
	if err := yaml.Unmarshal(f.Data, &doc); err != nil {
		return root, fmt.Errorf("envoy rules %s: %w", f.Name, err)
	}
	if err := envoyScalars(f.Name, &doc); err != nil {
		return root, err
	}
	if root.Domain == "" {
		return root, fmt.Errorf("envoy rules %s: no domain (envoyproxy/ratelimit refuses an empty one too)", f.Name)
	}
	if !ratelimit.ValidName(root.Domain) {
		return root, fmt.Errorf("envoy rules %s: domain %q: kurz domains are 1 to 64 letters, digits, '.', '_' or '-'", f.Name, root.Domain)
	}
	return root, nil
}

// envoyScalars refuses a value envoyproxy/ratelimit refuses the whole file
// for ("error checking config"): before decoding, it reads the file with
// YAML 1.1's types (yaml.v2) and takes only strings, ints, bools and
// nulls as values, so an unquoted 1.0, 1e3 or .inf (a float to it) or an
// int over 2^63 (unsigned) makes it keep its last configuration, where
// kurz would read the text and enforce the file. Only plain scalars that
// could be numbers are resolved: the others are strings to both.
func envoyScalars(file string, n *yaml.Node) error {
	if n.Kind == yaml.MappingNode {
		for i := 1; i < len(n.Content); i += 2 {
			v := n.Content[i]
			if v.Kind != yaml.ScalarNode {
				if err := envoyScalars(file, v); err != nil {
					return err
				}
				continue
			}
			if v.Style&^yaml.TaggedStyle != 0 || v.Value == "" || !strings.ContainsRune("+-.0123456789", rune(v.Value[0])) && v.Style&yaml.TaggedStyle == 0 {
				continue
			}
			text := v.Value
			if v.Style&yaml.TaggedStyle != 0 {
				text = v.Tag + " " + text
			}
			var got any
			if err := yamlv2.Unmarshal([]byte(text), &got); err != nil {
				continue // what v3 read, the translation judges
			}
			switch got.(type) {
			case string, int, bool, nil:
			default:
				return fmt.Errorf("envoy rules %s: line %d: %s: %s is a %T to envoyproxy/ratelimit, which refuses the whole file for it (\"error checking config\"): quote it (\"%s\")",
					file, v.Line, n.Content[i-1].Value, v.Value, got, v.Value)
			}
		}
		return nil
	}
	for _, c := range n.Content {
		if err := envoyScalars(file, c); err != nil {
			return err
		}
	}
	return nil
}

// envoyTranslation translates one domain.
type envoyTranslation struct {
	file, domain string
	nodes        []*envoyNode // every descriptor, in file order
	root         *envoyNode
}

func (t *envoyTranslation) errorf(n *envoyNode, format string, args ...any) error {
	return fmt.Errorf("envoy rules %s, domain %s, descriptor %s: %s", t.file, t.domain, n.describe(), fmt.Sprintf(format, args...))
}

// translate builds the domain's tree from its files' roots (one, or with
// MergeDomains several, each loaded into the same top level in order, as
// envoyproxy/ratelimit patches a domain), its rules, and checks that kurz
// decides them as envoyproxy/ratelimit does. What a file brings is
// refused naming that file; what the whole tree makes, naming them all.
func (t *envoyTranslation) translate(files []string, roots []envoyRoot) (ratelimit.DomainSpec, error) {
	t.root = &envoyNode{id: -1, children: map[string]*envoyNode{}}
	for i, root := range roots {
		t.file = files[i]
		if err := t.load(t.root, root.Descriptors); err != nil {
			return ratelimit.DomainSpec{}, err
		}
	}
	t.file = strings.Join(files, " + ")
	var limited []*envoyNode
	for _, n := range t.nodes {
		if n.limit != nil {
			limited = append(limited, n)
		}
	}
	if len(limited) > maxEnvoyLimits {
		return ratelimit.DomainSpec{}, fmt.Errorf("envoy rules %s, domain %s: over %d rate limits", t.file, t.domain, maxEnvoyLimits)
	}
	if err := t.rules(limited); err != nil {
		return ratelimit.DomainSpec{}, err
	}
	if err := t.check(limited); err != nil {
		return ratelimit.DomainSpec{}, err
	}
	spec := ratelimit.DomainSpec{Rules: []ratelimit.RuleSpec{}}
	for _, n := range limited {
		if n.rule != nil {
			spec.Rules = append(spec.Rules, *n.rule)
		}
	}
	return spec, nil
}

// load adds descs under parent, refusing what kurz cannot do.
func (t *envoyTranslation) load(parent *envoyNode, descs []envoyDescriptor) error {
	for _, d := range descs {
		n := &envoyNode{
			id: len(t.nodes), key: d.Key, value: d.Value, limit: d.RateLimit, shadow: d.ShadowMode,
			share: d.ShareThreshold, children: map[string]*envoyNode{},
		}
		n.path = append(slices.Clone(parent.path), n)
		t.nodes = append(t.nodes, n)
		if len(t.nodes) > maxEnvoyLimits*10 {
			return fmt.Errorf("envoy rules %s, domain %s: over %d descriptors", t.file, t.domain, maxEnvoyLimits*10)
		}
		switch {
		case d.Key == "":
			return t.errorf(n, "descriptor has an empty key (envoyproxy/ratelimit refuses it too)")
		case len(n.path) > maxEnvoyDepth:
			return t.errorf(n, "over %d levels deep: a request descriptor has at most %d entries in kurz", maxEnvoyDepth, maxEnvoyDepth)
		case d.Value == "" && strings.HasSuffix(d.Key, "*"):
			return t.errorf(n, "key %q with no value: envoyproxy/ratelimit takes it as a wildcard over every key and value spelt %s..., which kurz cannot match (its keys take no '*'); give the key a value ending in '*' instead", d.Key, strings.TrimSuffix(d.Key, "*"))
		case strings.Contains(strings.TrimSuffix(d.Value, "*"), "*"):
			return t.errorf(n, "value %q: envoyproxy/ratelimit takes a '*' before the end as the character itself, kurz takes '*' only as a wildcard's end; drop it", d.Value)
		case d.ShareThreshold && !n.wildcard():
			return t.errorf(n, "share_threshold on value %q: only a wildcard value (ending in '*') shares (envoyproxy/ratelimit refuses it too)", d.Value)
		case !ratelimit.ValidName(d.Key):
			return t.errorf(n, "key %q: kurz descriptor keys are 1 to 64 letters, digits, '.', '_' or '-'", d.Key)
		}
		for _, p := range parent.path {
			if p.key == d.Key {
				return t.errorf(n, "key %s twice on one path: kurz keeps one value per key of a descriptor", d.Key)
			}
		}
		ck := compositeKey(d.Key, d.Value)
		if _, dup := parent.children[ck]; dup {
			return t.errorf(n, "duplicate descriptor composite key %q (envoyproxy/ratelimit refuses it too)", ck)
		}
		parent.children[ck] = n
		if n.wildcard() {
			parent.wild = append(parent.wild, n)
		}
		if err := t.rateLimit(n); err != nil {
			return err
		}
		if err := t.load(n, d.Descriptors); err != nil {
			return err
		}
	}
	return t.spellings(parent)
}

// spellings refuses a descriptor whose composite key is also another key's
// of its level with a value: envoyproxy/ratelimit looks a request entry up
// by key_value, so with user and user_vip side by side, the entry
// user=vip finds user_vip (its limit, its branch) where kurz, matching key
// and value apart, applies user's rule. It covers wildcards too: a
// wildcard user_* that takes another key's entries (user_agent=curl) has
// that key (user_agent) spelt as one of its keys and a value (user=agent).
func (t *envoyTranslation) spellings(parent *envoyNode) error {
	keys := map[string]bool{}
	for _, c := range parent.children {
		keys[c.key] = true
	}
	for _, ck := range slices.Sorted(maps.Keys(parent.children)) {
		c := parent.children[ck]
		for i := range len(ck) {
			if ck[i] != '_' || ck[:i] == c.key || !keys[ck[:i]] {
				continue
			}
			return t.errorf(c, "envoyproxy/ratelimit finds this descriptor for a request entry %s=%s too (it looks entries up by key_value, %q), where kurz matches key %s; rename key %s (or %s)",
				ck[:i], ck[i+1:], ck, ck[:i], c.key, ck[:i])
		}
	}
	return nil
}

// rateLimit checks a node's rate_limit.
func (t *envoyTranslation) rateLimit(n *envoyNode) error {
	l := n.limit
	if l == nil {
		return nil
	}
	_, validUnit := envoyUnits[strings.ToLower(l.Unit)]
	switch {
	case len(l.Replaces) > 0:
		return t.errorf(n, "replaces: kurz has no equivalent (a rule that removes another descriptor's limit); drop the replaced limit from the other descriptor instead")
	case l.Unlimited && l.Unit != "":
		return t.errorf(n, "unit %q with unlimited (envoyproxy/ratelimit refuses it too)", l.Unit)
	case l.Unlimited:
		return nil
	case !validUnit:
		return t.errorf(n, "invalid rate limit unit %q: want second, minute, hour, day, week, month or year", l.Unit)
	case l.RequestsPerUnit == 0:
		return t.errorf(n, "requests_per_unit 0 denies every request in envoyproxy/ratelimit; a kurz rule's limit is at least 1")
	}
	return nil
}

// rules makes each limited node's rule (nil for an unlimited one that no
// other rule of its keys would limit: nothing is then what it means).
func (t *envoyTranslation) rules(limited []*envoyNode) error {
	names := map[string]*envoyNode{}
	for _, n := range limited {
		if n.limit.Name == "" {
			continue
		}
		if !ratelimit.ValidName(n.limit.Name) {
			return t.errorf(n, "name %q: kurz rule names are 1 to 64 letters, digits, '.', '_' or '-' (rename it, or leave it out for a name made of the path)", n.limit.Name)
		}
		if prev, dup := names[n.limit.Name]; dup {
			return t.errorf(n, "name %q is also descriptor %s's: kurz rule names are unique within a domain", n.limit.Name, prev.describe())
		}
		names[n.limit.Name] = n
	}
	// Which key sets have a rule that limits: an unlimited descriptor
	// beside one needs a rule of its own to be kept from it.
	limiting := map[string]bool{}
	for _, n := range limited {
		if !n.limit.Unlimited {
			limiting[keySet(n.keys())] = true
		}
	}
	for _, n := range limited {
		if n.limit.Unlimited && !limiting[keySet(n.keys())] {
			continue
		}
		name := n.limit.Name
		if name == "" {
			name = derivedName(n, names)
			names[name] = n
		}
		r := ratelimit.RuleSpec{Name: name, Key: n.keys()}
		var shared, own *envoyNode // a wildcard of the path that shares, one that does not
		for _, p := range n.path {
			if p.value != "" {
				if r.Match == nil {
					r.Match = map[string]string{}
				}
				r.Match[p.key] = p.value
			}
			switch {
			case p.wildcard() && p.share:
				shared = p
			case p.wildcard():
				own = p
			}
		}
		switch {
		case n.limit.Unlimited:
			// As specific as the descriptor, it keeps the less specific
			// rules off it; it counts nothing, so neither sharing nor
			// shadow mode means anything to it.
			r.Unlimited = true
		case shared != nil && own != nil:
			// kurz's share is the rule's: every prefix of its match, or none.
			return t.errorf(n, "wildcards %s (share_threshold) and %s (not) on one path: a kurz rule shares all its wildcards' counters or none; set share_threshold on both or neither", shared.describe(), own.describe())
		default:
			r.Algorithm, r.FailureMode, r.Shadow, r.Share = "fixed_window", "open", n.shadow, shared != nil
			r.Limit, r.Window = int64(n.limit.RequestsPerUnit), envoyUnits[strings.ToLower(n.limit.Unit)]
		}
		if _, err := r.Rule(t.domain); err != nil {
			return t.errorf(n, "%v", err)
		}
		n.rule = &r
	}
	return nil
}

// derivedName names a rule after its path as envoyproxy/ratelimit's stats
// do (generic_key_api.remote_address), unique within the domain: a path
// with characters kurz names do not take, too long, or whose name is taken
// gets a digest of the path appended.
func derivedName(n *envoyNode, taken map[string]*envoyNode) string {
	parts := make([]string, len(n.path))
	for i, p := range n.path {
		parts[i] = compositeKey(p.key, p.value)
	}
	raw := strings.Join(parts, ".")
	name := strings.Map(func(c rune) rune {
		if c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '.' || c == '_' || c == '-' {
			return c
		}
		return '-'
	}, raw)
	if _, dup := taken[name]; !dup && name == raw && len(name) <= 64 {
		return name
	}
	sum := sha256.Sum256([]byte(strings.Join(parts, "\x00")))
	return name[:min(len(name), 64-9)] + "-" + hex.EncodeToString(sum[:4])
}

// keySet is keys in a canonical order.
func keySet(keys []string) string {
	return strings.Join(slices.Sorted(slices.Values(keys)), "\x00")
}

// check proves that kurz, given the rules, limits every request
// descriptor exactly as envoyproxy/ratelimit limits it with the tree.
// For each sequence of keys a rule has, it walks every class of request
// descriptor of those keys (at each level: each value some descriptor
// names there, a value under each wildcard's prefix that none names, or
// any other value) as envoyproxy/ratelimit's GetLimit walks the tree (a
// value's branch, else the first wildcard's it starts with, else its
// key's, stopping where none is; the limit of the node the last entry
// reaches), beside the rules kurz would apply (the ones whose values and
// prefixes it has, the most specific of them: MatchEnvoy's order), and
// refuses the first descriptor where they differ.
// Request descriptors with the keys in another order than the file's are
// not limited by envoyproxy/ratelimit and are by kurz (a stated
// difference), so two paths of the same keys in different orders would
// both limit one descriptor: refused.
func (t *envoyTranslation) check(limited []*envoyNode) error {
	bySet := map[string]*envoyNode{}
	bySeq := map[string][]*envoyNode{}
	var seqs []string
	for _, n := range limited {
		set, seq := keySet(n.keys()), strings.Join(n.keys(), "\x00")
		if other, ok := bySet[set]; ok && !slices.Equal(other.keys(), n.keys()) {
			return t.errorf(n, "has the keys of descriptor %s in another order: kurz matches a descriptor's entries in any order, so both would limit it; keep one order", other.describe())
		}
		bySet[set] = n
		if _, ok := bySeq[seq]; !ok {
			seqs = append(seqs, seq)
		}
		bySeq[seq] = append(bySeq[seq], n)
	}
	budget := maxEnvoyBranches
	for _, seq := range seqs {
		w := &envoyWalk{t: t, keys: bySeq[seq][0].keys(), seen: map[string]bool{}, budget: &budget}
		var rules []*envoyNode
		for _, n := range bySeq[seq] {
			if n.rule != nil {
				rules = append(rules, n)
			}
		}
		if err := w.walk(0, t.root, rules, nil); err != nil {
			return err
		}
	}
	return nil
}

// envoyWalk walks the request descriptors of one sequence of keys.
type envoyWalk struct {
	t      *envoyTranslation
	keys   []string
	seen   map[string]bool
	budget *int
}

// otherValue stands for any value no descriptor names at a level.
const otherValue = "\x00other"

// walk goes on from level i, envoyproxy/ratelimit at node at (nil: its
// walk stopped), kurz with the rules whose values the descriptor has so
// far; values are the request's values so far, for the error.
func (w *envoyWalk) walk(i int, at *envoyNode, rules []*envoyNode, values []string) error {
	*w.budget--
	if *w.budget < 0 {
		return fmt.Errorf("envoy rules %s, domain %s: too many combinations of values to check against envoyproxy/ratelimit's matching (over %d); split the domain", w.t.file, w.t.domain, maxEnvoyBranches)
	}
	if at == nil && len(rules) == 0 {
		return nil // neither limits any descriptor from here
	}
	if i == len(w.keys) {
		return w.compare(at, rules, values)
	}
	var b strings.Builder
	b.WriteString(strconv.Itoa(i) + " " + strconv.Itoa(nodeID(at)))
	for _, r := range rules {
		b.WriteString(" " + strconv.Itoa(r.id))
	}
	state := b.String()
	if w.seen[state] {
		return nil
	}
	w.seen[state] = true
	key := w.keys[i]
	// The values to try: each value named at this level (by the tree
	// where envoyproxy/ratelimit is, or by a rule), and for each prefix
	// (a wildcard's) a value under it no one names, and a value under
	// none: all the classes of value the two tell apart.
	named := map[string]bool{}
	prefixes := map[string]bool{}
	if at != nil {
		for _, c := range at.children {
			if c.key == key && c.value != "" && !c.wildcard() {
				named[c.value] = true
			}
		}
		// A wildcard of another key takes this key's entries when its
		// prefix and key_ overlap (then its prefix, past key_, or "").
		for _, c := range at.wild {
			if p, kp := c.wildPrefix(), key+"_"; strings.HasPrefix(p, kp) {
				prefixes[p[len(kp):]] = true
			} else if strings.HasPrefix(kp, p) {
				prefixes[""] = true
			}
		}
	}
	// The rules by their value at this level: each branch takes the
	// key-only ones, its value's and the prefixes' it starts with,
	// without a pass over all of them.
	var keyOnly, byPrefix []*envoyNode
	byValue := map[string][]*envoyNode{}
	for _, r := range rules {
		switch p := r.path[i]; {
		case p.wildcard():
			prefixes[strings.TrimSuffix(p.value, "*")] = true
			byPrefix = append(byPrefix, r)
		case p.value != "":
			named[p.value] = true
			byValue[p.value] = append(byValue[p.value], r)
		default:
			keyOnly = append(keyOnly, r)
		}
	}
	named[otherValue] = true
	for p := range prefixes {
		named[p+otherValue] = true
	}
	for _, v := range slices.Sorted(maps.Keys(named)) {
		still := append(slices.Clip(keyOnly), byValue[v]...)
		for _, r := range byPrefix {
			if strings.HasPrefix(v, strings.TrimSuffix(r.path[i].value, "*")) {
				still = append(still, r)
			}
		}
		if err := w.walk(i+1, envoyNext(at, key, v), still, append(slices.Clip(values), v)); err != nil {
			return err
		}
	}
	return nil
}

func nodeID(n *envoyNode) int {
	if n == nil {
		return -2
	}
	return n.id
}

// compare checks one class of request descriptor: envoyproxy/ratelimit
// applies at's limit (if any), kurz the most specific rules.
func (w *envoyWalk) compare(at *envoyNode, rules []*envoyNode, values []string) error {
	var want *envoyNode // the rule kurz must apply alone, or none
	if at != nil && at.limit != nil && at.rule != nil {
		want = at
	}
	var got []*envoyNode // the most specific rules, as MatchEnvoy takes them
	for _, r := range rules {
		c := 1
		if len(got) > 0 {
			c = ratelimit.CompareMatches(r.rule.Match, got[0].rule.Match)
		}
		switch {
		case c > 0:
			got = append(got[:0], r)
		case c == 0:
			got = append(got, r)
		}
	}
	if want == nil && len(got) == 0 || want != nil && len(got) == 1 && got[0] == want {
		return nil
	}
	entries := make([]string, len(values))
	for i, v := range values {
		if p, other := strings.CutSuffix(v, otherValue); other {
			v = p + "<any other value>"
		}
		entries[i] = w.keys[i] + "=" + v
	}
	envoy := "no limit"
	if want != nil {
		envoy = "only " + want.describe()
	} else if at != nil && at.limit != nil {
		envoy = "unlimited " + at.describe()
	}
	kurz := make([]string, len(got))
	for i, r := range got {
		kurz[i] = r.describe()
	}
	return fmt.Errorf("envoy rules %s, domain %s: for a request descriptor (%s) envoyproxy/ratelimit applies %s (it takes a value's branch, else the first wildcard's it matches, before its key's and never goes back), but kurz would apply %s (the most specific rules: most values matched exactly, then by prefix, then the longest prefixes): kurz cannot decide this tree as envoyproxy/ratelimit does (see the limiter README, \"Coming from envoyproxy/ratelimit\"): restructure it, or move these limits to kurz rules",
		w.t.file, w.t.domain, strings.Join(entries, ", "), envoy, strings.Join(kurz, " and "))
}

// Format of a rules file, found from its content.
const (
	FormatKurz  = "kurz"
	FormatEnvoy = "envoy"
)

// DetectFormat tells kurz's rules file (top-level domains, plans,
// tenants) from an envoyproxy/ratelimit one (top-level domain,
// descriptors). A file with neither is kurz's (an empty file, or one Parse
// names the unknown field of); one with both is refused.
func DetectFormat(data []byte) (string, error) {
	var top struct {
		Domain      present `yaml:"domain"`
		Descriptors present `yaml:"descriptors"`
		Domains     present `yaml:"domains"`
		Plans       present `yaml:"plans"`
		Tenants     present `yaml:"tenants"`
	}
	// A file that is not a mapping is left to the parser to refuse.
	if err := yaml.Unmarshal(data, &top); err != nil {
		return FormatKurz, nil
	}
	kurz := bool(top.Domains || top.Plans || top.Tenants)
	envoy := bool(top.Domain || top.Descriptors)
	switch {
	case kurz && envoy:
		return "", errors.New("the file has both kurz's top-level keys (domains, plans, tenants) and envoyproxy/ratelimit's (domain, descriptors): keep one format per file")
	case envoy:
		return FormatEnvoy, nil
	}
	return FormatKurz, nil
}

// present records that a key is there without decoding its value (a kurz
// file's tenants may be many).
type present bool

func (p *present) UnmarshalYAML(*yaml.Node) error {
	*p = true
	return nil
}

// readBounded reads path, refusing a file over maxRulesBytes, named with
// its size, before reading it (a file that grows meanwhile, or is not a
// regular file, is cut at the bound and refused all the same).
func readBounded(path string) ([]byte, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	tooLarge := func(size string) error {
		return fmt.Errorf("%s: %s bytes, over the %d bytes (1 MiB, a ConfigMap's bound) a rules file may hold", path, size, maxRulesBytes)
	}
	if info, err := f.Stat(); err == nil && info.Size() > maxRulesBytes {
		return nil, tooLarge(fmt.Sprint(info.Size()))
	}
	data, err := io.ReadAll(io.LimitReader(f, maxRulesBytes+1))
	if err != nil {
		return nil, err
	}
	if len(data) > maxRulesBytes {
		return nil, tooLarge("over " + fmt.Sprint(maxRulesBytes))
	}
	return data, nil
}

// FromEnvoyDir translates the files of an envoyproxy/ratelimit runtime
// config directory (envoydir.Read's, named as the errors should name
// them): the file source's directory and an apply of one (`kurzctl rules
// apply DIR`) both, so that they refuse the same. Every one must be an
// envoyproxy/ratelimit file: a kurz rules file among them is refused, as
// envoyproxy/ratelimit would refuse it, rather than half read.
func FromEnvoyDir(files []envoydir.File, opts EnvoyOptions) (ratelimit.Config, error) {
	if len(files) == 0 {
		return ratelimit.Config{}, errors.New("envoy rules: no rule files")
	}
	if len(files) > envoydir.MaxFiles {
		return ratelimit.Config{}, fmt.Errorf("envoy rules: %d files, over %d", len(files), envoydir.MaxFiles)
	}
	named := make([]EnvoyFile, len(files))
	seen := make(map[string]bool, len(files))
	for i, f := range files {
		if seen[f.Name] {
			return ratelimit.Config{}, fmt.Errorf("envoy rules: two files named %s: a directory holds one", f.Name)
		}
		seen[f.Name] = true
		format, err := DetectFormat(f.Data)
		if err != nil {
			return ratelimit.Config{}, fmt.Errorf("envoy rules %s: %w", f.Name, err)
		}
		if format != FormatEnvoy {
			return ratelimit.Config{}, fmt.Errorf("envoy rules %s: not an envoyproxy/ratelimit file (no top-level domain): a directory holds envoyproxy/ratelimit files only; give a kurz rules file on its own", f.Name)
		}
		named[i] = EnvoyFile{Name: f.Name, Data: f.Data}
	}
	return translateEnvoy(named, opts)
}

// ReadEnvoy translates the envoyproxy/ratelimit file, or directory of
// them, at path.
func ReadEnvoy(path string, opts EnvoyOptions) (ratelimit.Config, error) {
	info, err := os.Stat(path)
	if err != nil {
		return ratelimit.Config{}, err
	}
	if info.IsDir() {
		files, err := envoydir.Read(path)
		if err != nil {
			return ratelimit.Config{}, err
		}
		// Named by their paths, as a single file is.
		for i := range files {
			files[i].Name = filepath.Join(path, files[i].Name)
		}
		return FromEnvoyDir(files, opts)
	}
	data, err := readBounded(path)
	if err != nil {
		return ratelimit.Config{}, err
	}
	return FromEnvoy([]EnvoyFile{{Name: path, Data: data}})
}
