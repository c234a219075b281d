// Package rulestore loads the limiter's rules from PostgreSQL or a YAML file,
// seeds PostgreSQL from the bootstrap file, and keeps the engine's rules
// fresh: a periodic refresh plus PostgreSQL LISTEN/NOTIFY, so a plan change
// applies within a second and no request ever reads the database. A
// notification names the tenants whose plans changed, and only theirs are
// read again.
package rulestore

import (
	"bytes"
	"context"
	_ "embed"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"math"
	"os"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"go.yaml.in/yaml/v3"

	"kurz.dev/services/limiter/internal/ratelimit"
)

// Bootstrap is the rule file shipped with the limiter (bootstrap.yaml).
//
//go:embed bootstrap.yaml
var Bootstrap []byte

// Channel is the PostgreSQL NOTIFY channel the rule tables' triggers use.
const Channel = "kurz_ratelimit_rules"

// Parse reads a YAML rule file; unknown fields are errors, so a typo in a
// rule is caught rather than silently ignored.
func Parse(data []byte) (ratelimit.Config, error) {
	var cfg ratelimit.Config
	dec := yaml.NewDecoder(bytes.NewReader(data))
	dec.KnownFields(true)
	if err := dec.Decode(&cfg); err != nil {
		return cfg, fmt.Errorf("rules yaml: %w", err)
	}
	// One document: a second one (after ---) would otherwise be dropped
	// unread, its rules with it.
	if err := dec.Decode(&struct{}{}); !errors.Is(err, io.EOF) {
		return ratelimit.Config{}, errors.New("rules yaml: more than one document (---); put every domain, plan and tenant in one")
	}
	// A plan's figure of 0 reads as "keep the rule's" once decoded: find
	// the ones written out, to refuse them.
	var written struct {
		Plans map[string]map[string]map[string]any `yaml:"plans"`
	}
	if err := yaml.Unmarshal(data, &written); err != nil {
		return ratelimit.Config{}, fmt.Errorf("rules yaml: %w", err)
	}
	for _, plan := range slices.Sorted(maps.Keys(written.Plans)) {
		for _, id := range slices.Sorted(maps.Keys(written.Plans[plan])) {
			if err := zeroFigure(written.Plans[plan][id]); err != nil {
				return ratelimit.Config{}, fmt.Errorf("rules yaml: plan %s, rule %s: %w", plan, id, err)
			}
		}
	}
	return cfg, nil
}

// zeroFigure refuses a plan limit that writes out a limit or burst that
// is not a whole number of at least 1: decoded, 0 keeps the rule's own
// figure, the opposite of what it seems to say (a plan cannot switch a
// rule off), and a fraction is cut (0.5 to 0, the rule's figure again).
// Keys match as the decoders match them, whatever their case.
func zeroFigure(fields map[string]any) error {
	for key, value := range fields {
		name := strings.ToLower(key)
		if name != "limit" && name != "burst" {
			continue
		}
		var v float64
		switch n := value.(type) {
		case int:
			v = float64(n)
		case float64:
			v = n
		default:
			continue
		}
		if v == 0 {
			return fmt.Errorf("%s 0 would keep the rule's own %s, not stop the plan's tenants: leave %s out to keep it, or give a figure of at least 1", name, name, name)
		}
		if v != math.Trunc(v) {
			return fmt.Errorf("%s %v: want a whole number (a fraction would be cut, below 1 to the rule's own %s)", name, v, name)
		}
	}
	return nil
}

// maxRulesBytes bounds a rules file, kurz's or envoyproxy/ratelimit's
// (and an envoyproxy/ratelimit directory's files together): a Kubernetes
// ConfigMap, the usual home of such files, holds at most 1 MiB, and the
// file is read whole at every refresh.
const maxRulesBytes = 1 << 20

// ReadFile parses path, or the embedded Bootstrap when path is empty. A
// file with envoyproxy/ratelimit's top-level domain, or a directory (of
// such files, as envoyproxy/ratelimit's runtime config directory), is
// translated (FromEnvoy). A file over maxRulesBytes is refused.
func ReadFile(path string) (ratelimit.Config, error) {
	return ReadFileWith(path, EnvoyOptions{})
}

// ReadFileWith is ReadFile, envoyproxy/ratelimit files read with envoy
// (KURZ_LIMITER_ENVOY_MERGE_DOMAINS).
func ReadFileWith(path string, envoy EnvoyOptions) (ratelimit.Config, error) {
	if path == "" {
		return Parse(Bootstrap)
	}
	cfg, err := readFile(path, envoy)
	if err != nil {
		return ratelimit.Config{}, fmt.Errorf("rules file (KURZ_LIMITER_RULES_FILE): %w", err)
	}
	return cfg, nil
}

func readFile(path string, envoy EnvoyOptions) (ratelimit.Config, error) {
	if info, err := os.Stat(path); err != nil {
		return ratelimit.Config{}, err
	} else if info.IsDir() {
		return ReadEnvoy(path, envoy)
	}
	data, err := readBounded(path)
	if err != nil {
		return ratelimit.Config{}, err
	}
	format, err := DetectFormat(data)
	if err != nil {
		return ratelimit.Config{}, fmt.Errorf("%s: %w", path, err)
	}
	if format == FormatEnvoy {
		return FromEnvoy([]EnvoyFile{{Name: path, Data: data}})
	}
	return Parse(data)
}

// Source yields the current rule configuration.
type Source interface {
	Load(ctx context.Context) (ratelimit.Config, error)
}

// FileSource reads a YAML file at every refresh (an empty Path is the
// embedded bootstrap file): kurz's rules, or envoyproxy/ratelimit's
// configuration, a file or a directory of them (ReadFile), the latter
// read with Envoy.
type FileSource struct {
	Path  string
	Envoy EnvoyOptions
}

// Load implements Source.
func (f FileSource) Load(context.Context) (ratelimit.Config, error) {
	return ReadFileWith(f.Path, f.Envoy)
}

// PostgresSource reads the rule tables.
type PostgresSource struct {
	Pool *pgxpool.Pool
	// Log, when set, hears of plan limits left out (once per change).
	Log *slog.Logger
	// Shipped is the rules file this deployment seeds the tables from: a
	// rule row that does not compile, and that this process never saw
	// compile, is held at its version there. Empty: the embedded
	// Bootstrap.
	Shipped ratelimit.Config

	mu      sync.Mutex
	dangled string // the plan limits last reported left out, and rules held
	// goodRules and goodLimits are the last version of each rule (by ID)
	// and plan limit (plan, then rule ID) that compiled: a row edited into
	// one that does not is held at it.
	goodRules  map[string]ratelimit.RuleSpec
	goodLimits map[string]ratelimit.LimitSpec
	// goodDefaults is each domain's last defaults that decoded.
	goodDefaults map[string]map[string]string
	// loaded is set once a Load returned rules: from then on a fail-closed
	// rule that never compiled here is left out (no replica of this
	// process enforced it) rather than refused.
	loaded bool
}

// PartialError is Load's error when some rows did not compile: each was
// held at its last good version, or at its version in the rules file the
// tables were seeded from (Shipped) when this process never saw one
// compile, or else left out. The Config
// returned with it is usable, and applied: one bad row must neither stop
// a limiter from starting nor hold back every other change. Refreshes that
// meet one count as failed, so alert KurzLimiterRulesStale names the
// table. One exception: a starting limiter refuses an enforced (not
// shadow) fail-closed rule it could only leave out (Load's error is then
// not a PartialError): a rule that says "deny when unsure" is not silently
// dropped.
type PartialError struct{ Problems []string }

func (e *PartialError) Error() string {
	return "rule rows that do not compile: " + strings.Join(e.Problems, "; ")
}

// Load implements Source. A plan limit whose rule is not in the tables (the
// rule deleted or renamed with SQL, or seeded from a bootstrap file after
// the operator deleted its rule) is left out: the tables have no foreign
// key from rl_plan_limits to rl_rules, and one stale row must not stop
// every reload (and every limiter's start) while the rest of the rules are
// good. A sliding log over MaxSlidingLogLimit (a bound newer than some
// stored rules) is held at it. Both are logged as warnings when what they
// touch changes.
func (p *PostgresSource) Load(ctx context.Context) (ratelimit.Config, error) {
	return p.loadChecked(ctx, true)
}

// LoadRules implements TenantSource: Load without the tenants' plans.
func (p *PostgresSource) LoadRules(ctx context.Context) (ratelimit.Config, error) {
	return p.loadChecked(ctx, false)
}

// LoadTenants implements TenantSource.
func (p *PostgresSource) LoadTenants(ctx context.Context, tenants []string) (map[string]string, error) {
	plans := make(map[string]string, len(tenants))
	rows, err := p.Pool.Query(ctx, `SELECT tenant, plan FROM rl_tenant_plans WHERE tenant = ANY($1)`, tenants)
	if err != nil {
		return nil, fmt.Errorf("load tenant plans from postgres: %w", err)
	}
	var tenant, plan string
	if _, err := pgx.ForEachRow(rows, []any{&tenant, &plan}, func() error {
		plans[tenant] = plan
		return nil
	}); err != nil {
		return nil, fmt.Errorf("load tenant plans from postgres: %w", err)
	}
	return plans, nil
}

func (p *PostgresSource) loadChecked(ctx context.Context, withTenants bool) (ratelimit.Config, error) {
	cfg, broken, err := p.load(ctx, withTenants)
	if err != nil {
		return cfg, err
	}
	// A sliding log stored before its limit was bounded (up to 1,000,000
	// until 2026-12-05, MaxSlidingLogLimit since) is held at the bound:
	// stricter, never looser, rather than a configuration that no longer
	// compiles.
	isLog := map[string]bool{}
	var clamped []string
	for domain, d := range cfg.Domains {
		for i, r := range d.Rules {
			id := domain + "/" + r.Name
			isLog[id] = r.Algorithm == "sliding_log"
			if isLog[id] && r.Limit > ratelimit.MaxSlidingLogLimit {
				d.Rules[i].Limit = ratelimit.MaxSlidingLogLimit
				clamped = append(clamped, id)
			}
		}
	}
	var dangling []string
	for plan, limits := range cfg.Plans {
		for id, l := range limits {
			switch sl, ok := isLog[id]; {
			case !ok:
				dangling = append(dangling, plan+": "+id)
				delete(limits, id)
			case sl && l.Limit > ratelimit.MaxSlidingLogLimit:
				l.Limit = ratelimit.MaxSlidingLogLimit
				limits[id] = l
				clamped = append(clamped, plan+": "+id)
			}
		}
	}
	problems, refused := p.holdBadRows(cfg, broken)
	if refused != nil {
		return ratelimit.Config{}, refused
	}
	slices.Sort(dangling)
	slices.Sort(clamped)
	p.mu.Lock()
	report := strings.Join(dangling, ", ") + "|" + strings.Join(clamped, ", ")
	changed := report != p.dangled
	p.dangled = report
	p.mu.Unlock()
	if changed && p.Log != nil {
		if len(dangling) > 0 {
			p.Log.Warn("rules: plan limits of rules that do not exist are left out (delete them from rl_plan_limits)", "limits", dangling)
		}
		if len(clamped) > 0 {
			p.Log.Warn(fmt.Sprintf("rules: sliding logs over %d units are held at %d (lower them in rl_rules or rl_plan_limits)",
				ratelimit.MaxSlidingLogLimit, ratelimit.MaxSlidingLogLimit), "rules", clamped)
		}
	}
	if len(problems) > 0 {
		return cfg, &PartialError{Problems: problems}
	}
	return cfg, nil
}

// holdBadRows replaces in cfg every rule and plan limit that does not
// compile (each compiled alone, as Compile would), or whose row did not
// decode (broken, by rule ID or planLimitKey), with its last good
// version, the shipped one, or nothing, and remembers the good ones. It
// returns what it held or left out, and why; refused is set when a starting
// limiter would leave out a fail-closed rule.
func (p *PostgresSource) holdBadRows(cfg ratelimit.Config, broken map[string]error) (problems []string, refused error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.goodRules == nil {
		p.goodRules, p.goodLimits = map[string]ratelimit.RuleSpec{}, map[string]ratelimit.LimitSpec{}
		p.goodDefaults = map[string]map[string]string{}
	}
	bad := func(what string, err error, fate string) {
		problems = append(problems, fmt.Sprintf("%s %s (%v)", what, fate, err))
	}
	rules := map[string]ratelimit.RuleSpec{} // the rules in force, by ID
	for _, domain := range slices.Sorted(maps.Keys(cfg.Domains)) {
		d := cfg.Domains[domain]
		if err := broken[domainKey(domain)]; err != nil {
			if good, ok := p.goodDefaults[domain]; ok {
				bad("domain "+domain, err, "held at its last good defaults")
				d.Defaults = good
			} else if shipped, ok := p.shippedDomain(domain); ok {
				bad("domain "+domain, err, "held at the defaults of the rules file the tables were seeded from")
				d.Defaults = shipped.Defaults
			} else {
				bad("domain "+domain, err, "without defaults")
			}
		} else {
			p.goodDefaults[domain] = d.Defaults
		}
		kept := d.Rules[:0]
		for _, r := range d.Rules {
			id := domain + "/" + r.Name
			err := broken[id]
			if err == nil {
				_, err = r.Rule(domain)
			}
			if err != nil {
				if good, ok := p.goodRules[id]; ok {
					bad("rule "+id, err, "held at its last good version")
					r = good
				} else if shipped, ok := p.shippedRule(domain, r.Name); ok {
					bad("rule "+id, err, "held at the version of the rules file the tables were seeded from")
					r = shipped
				} else if r.FailureMode == "closed" && !r.Shadow && !p.loaded {
					refused = fmt.Errorf("rule %s fails closed and does not compile (%v): mend the row; a limiter does not start without it", id, err)
					continue
				} else {
					bad("rule "+id, err, "left out")
					continue
				}
			}
			p.goodRules[id] = r
			rules[id] = r
			kept = append(kept, r)
		}
		d.Rules = kept
		cfg.Domains[domain] = d
	}
	for _, plan := range slices.Sorted(maps.Keys(cfg.Plans)) {
		limits := cfg.Plans[plan]
		for _, id := range slices.Sorted(maps.Keys(limits)) {
			r, ok := rules[id]
			if !ok {
				delete(limits, id) // its rule is gone, or left out above
				continue
			}
			domain, _, _ := strings.Cut(id, "/")
			fits := func(l ratelimit.LimitSpec) error {
				_, err := ratelimit.Compile(ratelimit.Config{
					Domains: map[string]ratelimit.DomainSpec{domain: {Rules: []ratelimit.RuleSpec{r}}},
					Plans:   map[string]map[string]ratelimit.LimitSpec{plan: {id: l}},
				})
				return err
			}
			key := planLimitKey(plan, id)
			err := broken[key]
			if err == nil {
				err = fits(limits[id])
			}
			if err != nil {
				// The last good version is held only if it fits the rule as
				// it is now (the rule may have changed since).
				if good, ok := p.goodLimits[key]; ok && fits(good) == nil {
					bad("plan "+plan+" limit of "+id, err, "held at its last good version")
					limits[id] = good
				} else {
					bad("plan "+plan+" limit of "+id, err, "left out")
					delete(limits, id)
					continue
				}
			}
			p.goodLimits[key] = limits[id]
		}
	}
	if refused == nil {
		p.loaded = true
	}
	return problems, refused
}

// shippedDomain returns the seeded rules file's domain, if it has it.
func (p *PostgresSource) shippedDomain(domain string) (ratelimit.DomainSpec, bool) {
	from := p.Shipped
	if from.Domains == nil {
		from = shipped
	}
	d, ok := from.Domains[domain]
	return d, ok
}

// shippedRule returns the seeded rules file's rule domain/name, if it has
// one.
func (p *PostgresSource) shippedRule(domain, name string) (ratelimit.RuleSpec, bool) {
	d, _ := p.shippedDomain(domain)
	for _, r := range d.Rules {
		if r.Name == name {
			return r, true
		}
	}
	return ratelimit.RuleSpec{}, false
}

// shipped is bootstrap.yaml, parsed once (a test checks that it compiles).
var shipped = func() ratelimit.Config {
	cfg, _ := Parse(Bootstrap)
	return cfg
}()

// domainKey names domain's defaults in load's broken.
func domainKey(domain string) string { return "\x00domain " + domain }

// planLimitKey names plan's limit of rule id in holdBadRows's maps.
func planLimitKey(plan, id string) string { return plan + "\x00" + id }

// load reads the tables. Each row's spec is decoded on its own: one that
// does not decode (a number out of range, a string for a list, a field
// the spec does not have) is returned
// in broken, by rule ID or planLimitKey, for holdBadRows to hold or leave
// out like one that does not compile, instead of failing every reload.
// A rule is named by its row's name column (a copied row renamed there is
// a rule of its own; spec's name is ignored). The tenants' plans are read
// only withTenants.
func (p *PostgresSource) load(ctx context.Context, withTenants bool) (cfg ratelimit.Config, broken map[string]error, err error) {
	err = pgx.BeginTxFunc(ctx, p.Pool, pgx.TxOptions{AccessMode: pgx.ReadOnly, IsoLevel: pgx.RepeatableRead}, func(tx pgx.Tx) error {
		cfg, broken, err = loadTx(ctx, tx, withTenants)
		return err
	})
	if err != nil {
		return cfg, nil, fmt.Errorf("load rules from postgres: %w", err)
	}
	return cfg, broken, nil
}

// loadTx is load's reading of the tables, in tx.
func loadTx(ctx context.Context, tx pgx.Tx, withTenants bool) (ratelimit.Config, map[string]error, error) {
	broken := map[string]error{}
	cfg := ratelimit.Config{
		Domains: map[string]ratelimit.DomainSpec{},
		Plans:   map[string]map[string]ratelimit.LimitSpec{},
		Tenants: map[string]string{},
	}
	err := func() error {
		rows, err := tx.Query(ctx, `SELECT domain, defaults FROM rl_domains`)
		if err != nil {
			return err
		}
		var domain string
		var rawDefaults []byte
		if _, err := pgx.ForEachRow(rows, []any{&domain, &rawDefaults}, func() error {
			var defaults map[string]string
			if err := json.Unmarshal(rawDefaults, &defaults); err != nil {
				broken[domainKey(domain)] = fmt.Errorf("its defaults do not decode: %w", err)
				defaults = nil
			}
			cfg.Domains[domain] = ratelimit.DomainSpec{Defaults: defaults}
			return nil
		}); err != nil {
			return err
		}
		rows, err = tx.Query(ctx, `SELECT domain, name, spec FROM rl_rules ORDER BY domain, position, name`)
		if err != nil {
			return err
		}
		var name string
		var raw []byte
		if _, err := pgx.ForEachRow(rows, []any{&domain, &name, &raw}, func() error {
			var spec ratelimit.RuleSpec
			if err := decodeRow(raw, &spec); err != nil {
				broken[domain+"/"+name] = fmt.Errorf("its spec does not decode: %w", err)
				spec = ratelimit.RuleSpec{}
			}
			spec.Name = name
			d := cfg.Domains[domain]
			d.Rules = append(d.Rules, spec)
			cfg.Domains[domain] = d
			return nil
		}); err != nil {
			return err
		}
		rows, err = tx.Query(ctx, `SELECT p.plan, l.rule_id, l.spec FROM rl_plans p LEFT JOIN rl_plan_limits l USING (plan)`)
		if err != nil {
			return err
		}
		var plan string
		// A plan without limits is one row of NULLs.
		var ruleID *string
		var rawLimit []byte
		if _, err := pgx.ForEachRow(rows, []any{&plan, &ruleID, &rawLimit}, func() error {
			if cfg.Plans[plan] == nil {
				cfg.Plans[plan] = map[string]ratelimit.LimitSpec{}
			}
			if ruleID != nil && rawLimit != nil {
				var limit ratelimit.LimitSpec
				var fields map[string]any
				if err := decodeRow(rawLimit, &limit); err != nil {
					broken[planLimitKey(plan, *ruleID)] = fmt.Errorf("its spec does not decode: %w", err)
				} else if err := json.Unmarshal(rawLimit, &fields); err == nil {
					if err := zeroFigure(fields); err != nil {
						broken[planLimitKey(plan, *ruleID)] = err
					}
				}
				cfg.Plans[plan][*ruleID] = limit
			}
			rawLimit = nil
			return nil
		}); err != nil {
			return err
		}
		if !withTenants {
			return nil
		}
		rows, err = tx.Query(ctx, `SELECT tenant, plan FROM rl_tenant_plans`)
		if err != nil {
			return err
		}
		var tenant string
		_, err = pgx.ForEachRow(rows, []any{&tenant, &plan}, func() error {
			cfg.Tenants[tenant] = plan
			return nil
		})
		return err
	}()
	return cfg, broken, err
}

// decodeRow decodes a row's JSON spec into v as the rules file's decoder
// does: a field v does not have is refused (a misspelt "brust" or
// "Shaddow" would otherwise be dropped, and the rule applied without it),
// and the error names it. Field names match whatever their case, as
// encoding/json matches them.
func decodeRow(raw []byte, v any) error {
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		return err
	}
	if _, err := dec.Token(); !errors.Is(err, io.EOF) {
		return errors.New("more than one JSON value")
	}
	return nil
}

// Seed writes into the rule tables every item of cfg (domain, rule, plan,
// plan limit, tenant plan) that was never seeded before; it reports how
// many items it wrote. Items seeded once are never written again, so the
// database stays the source of truth: an operator's edits and deletions
// stand, while rules and tenant plans added to the bootstrap file reach
// existing databases (the anonymous tenant's plan must: tenant plans were
// written on an empty schema only, so it never reached a seeded one). A
// tenant plan is not written over a tenant that has one, nor an item
// into a domain or plan an operator deleted (a rule the file adds to such
// a domain would otherwise fail the foreign key, and every limiter's
// start with it). Concurrent replicas may both try: every insert skips
// conflicts.
func Seed(ctx context.Context, pool *pgxpool.Pool, cfg ratelimit.Config) (int, error) {
	if _, err := ratelimit.Compile(cfg); err != nil {
		return 0, err
	}
	written := 0
	err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		// once runs insert for item unless it was seeded before.
		once := func(item, insert string, args ...any) error {
			tag, err := tx.Exec(ctx, `INSERT INTO rl_bootstrap_seen (item) VALUES ($1) ON CONFLICT DO NOTHING`, item)
			if err != nil || tag.RowsAffected() == 0 {
				return err
			}
			tag, err = tx.Exec(ctx, insert, args...)
			written += int(tag.RowsAffected())
			return err
		}
		for _, domain := range slices.Sorted(maps.Keys(cfg.Domains)) {
			d := cfg.Domains[domain]
			defaults := d.Defaults
			if defaults == nil {
				defaults = map[string]string{}
			}
			if err := once("domain:"+domain, `INSERT INTO rl_domains (domain, defaults) VALUES ($1, $2) ON CONFLICT DO NOTHING`, domain, defaults); err != nil {
				return err
			}
			for i, r := range d.Rules {
				if err := once("rule:"+domain+"/"+r.Name, `INSERT INTO rl_rules (domain, name, position, spec)
					SELECT $1::text, $2::text, $3::int, $4::jsonb WHERE EXISTS (SELECT FROM rl_domains WHERE domain = $1) ON CONFLICT DO NOTHING`,
					domain, r.Name, i, r); err != nil {
					return err
				}
			}
		}
		for _, plan := range slices.Sorted(maps.Keys(cfg.Plans)) {
			if err := once("plan:"+plan, `INSERT INTO rl_plans (plan) VALUES ($1) ON CONFLICT DO NOTHING`, plan); err != nil {
				return err
			}
			for _, id := range slices.Sorted(maps.Keys(cfg.Plans[plan])) {
				if err := once("limit:"+plan+":"+id, `INSERT INTO rl_plan_limits (plan, rule_id, spec)
					SELECT $1::text, $2::text, $3::jsonb WHERE EXISTS (SELECT FROM rl_plans WHERE plan = $1) ON CONFLICT DO NOTHING`,
					plan, id, cfg.Plans[plan][id]); err != nil {
					return err
				}
			}
		}
		for _, tenant := range slices.Sorted(maps.Keys(cfg.Tenants)) {
			if err := once("tenant:"+tenant, `INSERT INTO rl_tenant_plans (tenant, plan)
				SELECT $1::text, $2::text WHERE EXISTS (SELECT FROM rl_plans WHERE plan = $2) ON CONFLICT DO NOTHING`,
				tenant, cfg.Tenants[tenant]); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		return 0, fmt.Errorf("seed rules: %w", err)
	}
	return written, nil
}

// SetTenantPlan puts tenant on plan; every limiter picks it up through NOTIFY.
func SetTenantPlan(ctx context.Context, pool *pgxpool.Pool, tenant, plan string) error {
	_, err := pool.Exec(ctx, `INSERT INTO rl_tenant_plans (tenant, plan) VALUES ($1, $2)
		ON CONFLICT (tenant) DO UPDATE SET plan = EXCLUDED.plan`, tenant, plan)
	if err != nil {
		return fmt.Errorf("set plan of %s: %w", tenant, err)
	}
	return nil
}

// TenantSource is a Source that reads tenants' plans apart from the rest
// of the rules (PostgresSource): at 500,000 tenants they are nearly all of
// a reload's cost, while a plan change touches one.
type TenantSource interface {
	Source
	// LoadRules is Load without the tenants' plans.
	LoadRules(ctx context.Context) (ratelimit.Config, error)
	// LoadTenants reads the plans of tenants; a tenant without one is not
	// in the map.
	LoadTenants(ctx context.Context, tenants []string) (map[string]string, error)
}

// tenantsEvery is how many periodic refreshes of a TenantSource's rules
// pass between two reloads of every tenant's plan (a backstop: a
// notification names each change).
const tenantsEvery = 30

// Refresher keeps an engine's rules in line with a Source.
type Refresher struct {
	Source   Source
	Interval time.Duration
	Apply    func(*ratelimit.Ruleset)
	Log      *slog.Logger
	// OnResult, when set, observes every refresh (for metrics and tests).
	OnResult func(err error)

	// What Run last applied, apart, for a TenantSource: rules is nil
	// until a whole refresh succeeded, and tenantsStale set while a
	// tenant's plan may have been missed.
	rules        *ratelimit.Ruleset
	tenants      *ratelimit.TenantPlans
	tenantsStale bool
	ticks        int
}

// Refresh loads, compiles and applies the rules once, tenants' plans
// included. On failure the rules in force stay, and the error is returned;
// a PartialError's rules are applied, and it is returned too.
func (r *Refresher) Refresh(ctx context.Context) error {
	rs, err := r.compile(ctx, r.Source.Load)
	if rs != nil {
		r.rules, r.tenants, r.tenantsStale = rs, rs.Tenants(), false
		r.Apply(rs)
	}
	return r.report(err)
}

// refreshRules is Refresh without the tenants' plans, which stay.
func (r *Refresher) refreshRules(ctx context.Context, ts TenantSource) error {
	rs, err := r.compile(ctx, ts.LoadRules)
	if rs != nil {
		r.rules = rs
		r.Apply(rs.WithTenants(r.tenants))
	}
	return r.report(err)
}

// refreshTenants reads the plans of tenants and applies them to the rules
// in force. A plan the rules do not have yet (created in the same breath)
// reloads the rules first.
func (r *Refresher) refreshTenants(ctx context.Context, ts TenantSource, tenants []string) error {
	plans, err := ts.LoadTenants(ctx, tenants)
	if err != nil {
		r.tenantsStale = true // the next tick reloads every tenant
		return r.report(err)
	}
	changes := make(map[string]string, len(tenants))
	newPlan := false
	for _, t := range tenants {
		changes[t] = plans[t]
		newPlan = newPlan || plans[t] != "" && !r.rules.HasPlan(plans[t])
	}
	r.tenants = r.tenants.With(changes)
	if newPlan {
		return r.refreshRules(ctx, ts)
	}
	r.Apply(r.rules.WithTenants(r.tenants))
	return r.report(nil)
}

// compile loads with load and compiles; the Ruleset is nil when nothing
// can be applied.
func (r *Refresher) compile(ctx context.Context, load func(context.Context) (ratelimit.Config, error)) (*ratelimit.Ruleset, error) {
	cfg, err := load(ctx)
	var partial *PartialError
	if err != nil && !errors.As(err, &partial) {
		return nil, err
	}
	rs, cerr := ratelimit.Compile(cfg)
	if cerr != nil {
		return nil, cerr
	}
	return rs, err
}

func (r *Refresher) report(err error) error {
	var partial *PartialError
	switch {
	case errors.As(err, &partial):
		r.Log.Error("rules refreshed, but rows that do not compile are held at their last good version or left out: fix them", "err", err)
	case err != nil:
		r.Log.Error("rules refresh failed; keeping the last good rules", "err", err)
	}
	if r.OnResult != nil {
		r.OnResult(err)
	}
	return err
}

// Run refreshes every Interval and at every change changes reports (nil:
// none, as for a rules file), until ctx ends. A TenantSource's tenants'
// plans are reloaded whole only every tenantsEvery intervals, and when
// changes says so; a notification naming tenants reloads only theirs.
func (r *Refresher) Run(ctx context.Context, changes *Changes) {
	tick := time.NewTicker(r.Interval)
	defer tick.Stop()
	var wake <-chan struct{}
	if changes != nil {
		wake = changes.wake
	}
	ts, split := r.Source.(TenantSource)
	for {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
			r.ticks++
			if split && r.rules != nil && !r.tenantsStale && r.ticks%tenantsEvery != 0 {
				_ = r.refreshRules(ctx, ts)
			} else {
				_ = r.Refresh(ctx)
			}
		case <-wake:
			rules, allTenants, tenants := changes.take()
			if !split || r.rules == nil || r.tenantsStale || allTenants {
				_ = r.Refresh(ctx)
				continue
			}
			if rules {
				_ = r.refreshRules(ctx, ts)
			}
			if len(tenants) > 0 {
				_ = r.refreshTenants(ctx, ts, tenants)
			}
		}
	}
}

// maxNamedTenants bounds the tenants Changes remembers by name between two
// refreshes; past it, every tenant's plan is reloaded.
const maxNamedTenants = 1000

// Changes gathers what the rule tables' notifications say changed, for
// Refresher.Run: the rules (domains, rules, plans and plan limits, small
// and reloaded whole), every tenant's plan, or named tenants' plans.
type Changes struct {
	wake chan struct{}

	mu         sync.Mutex
	rules, all bool
	tenants    map[string]struct{}
}

// NewChanges returns a Changes with nothing changed yet.
func NewChanges() *Changes {
	return &Changes{wake: make(chan struct{}, 1), tenants: map[string]struct{}{}}
}

// Everything marks every rule and tenant changed (a new LISTEN connection:
// notifications sent without one are lost).
func (c *Changes) Everything() {
	c.mu.Lock()
	c.rules, c.all = true, true
	c.mu.Unlock()
	signal(c.wake)
}

// Note records a notification's payload: "rl_tenant_plans:<tenant>" names
// one tenant, "rl_tenant_plans" alone every tenant (a statement that
// changed many, or a database before migration 0003), any other table's
// name the rules.
func (c *Changes) Note(payload string) {
	c.mu.Lock()
	switch tenant, named := strings.CutPrefix(payload, "rl_tenant_plans:"); {
	case named && len(c.tenants) < maxNamedTenants:
		c.tenants[tenant] = struct{}{}
	case named || payload == "rl_tenant_plans":
		c.all = true
	default:
		c.rules = true
	}
	c.mu.Unlock()
	signal(c.wake)
}

// take returns what changed since the last take, and forgets it.
func (c *Changes) take() (rules, allTenants bool, tenants []string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	rules, allTenants = c.rules, c.all
	if !allTenants {
		tenants = slices.Collect(maps.Keys(c.tenants))
	}
	c.rules, c.all = false, false
	clear(c.tenants)
	return rules, allTenants, tenants
}

// Listen LISTENs on Channel on a dedicated connection and records every
// notification in changes, reconnecting with backoff until ctx ends. A
// (re)connection marks everything changed, since notifications sent while
// disconnected are lost.
func Listen(ctx context.Context, pool *pgxpool.Pool, changes *Changes, log *slog.Logger) {
	backoff := 100 * time.Millisecond
	for ctx.Err() == nil {
		err := listenOnce(ctx, pool, changes)
		if ctx.Err() != nil {
			return
		}
		log.Warn("rules LISTEN connection lost; reconnecting", "err", err, "in", backoff)
		select {
		case <-ctx.Done():
			return
		case <-time.After(backoff):
		}
		backoff = min(2*backoff, 5*time.Second)
	}
}

func listenOnce(ctx context.Context, pool *pgxpool.Pool, changes *Changes) error {
	pooled, err := pool.Acquire(ctx)
	if err != nil {
		return err
	}
	// The connection carries a LISTEN: take it out of the pool for good.
	conn := pooled.Hijack()
	defer conn.Close(context.WithoutCancel(ctx))
	if _, err := conn.Exec(ctx, "LISTEN "+Channel); err != nil {
		return err
	}
	changes.Everything()
	for {
		n, err := conn.WaitForNotification(ctx)
		if err != nil {
			if errors.Is(err, context.Canceled) {
				return nil
			}
			return err
		}
		changes.Note(n.Payload)
	}
}

func signal(c chan<- struct{}) {
	select {
	case c <- struct{}{}:
	default:
	}
}
