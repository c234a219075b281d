//go:build integration

package rulestore

import (
	"context"
	"errors"
	"fmt"
	"reflect"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"

	"kurz.dev/services/limiter/internal/ratelimit"
)

const adminRules = `
domains:
  api:
    defaults: {algo: token_bucket}
    rules:
      - {name: per-key, key: [api_key], algorithm: token_bucket, limit: 100, window: 1s, burst: 20, failure_mode: open}
      - {name: per-ip, key: [ip], algorithm: fixed_window, limit: 50, window: 1m, failure_mode: open}
  auth:
    rules:
      - {name: per-ip, key: [ip], algorithm: sliding_window_counter, limit: 5, window: 1m, failure_mode: closed}
plans:
  free: {api/per-key: {limit: 10}}
  pro: {api/per-key: {limit: 1000, burst: 200}}
tenants: {acme: pro}
`

// exported is the rules of pool as Export writes them, and their etag.
func exported(t *testing.T, pool *pgxpool.Pool) (string, string) {
	t.Helper()
	cfg, err := Export(context.Background(), pool)
	if err != nil {
		t.Fatal(err)
	}
	out, err := Marshal(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return string(out), ETag(out)
}

func apply(t *testing.T, pool *pgxpool.Pool, file string, opts ApplyOptions) (ApplyResult, error) {
	t.Helper()
	return Apply(context.Background(), pool, []byte(file), opts)
}

// The export applied as it is changes nothing, and keeps its etag; the
// etag an apply reports is the one the export then shows.
func TestApplyingTheExportChangesNothing(t *testing.T) {
	pool := seeded(t, adminRules)
	file, etag := exported(t, pool)
	if strings.Contains(file, "acme") {
		t.Errorf("the export names a tenant:\n%s", file)
	}
	res, err := apply(t, pool, file, ApplyOptions{IfMatch: []string{etag}})
	if err != nil || len(res.Changes) != 0 || res.ETag != etag || res.From != etag {
		t.Fatalf("apply of the export: %+v, %v; want no change and etag %s", res, err, etag)
	}
	changed := strings.Replace(file, "limit: 50", "limit: 60", 1)
	res, err = apply(t, pool, changed, ApplyOptions{IfMatch: []string{etag}})
	if err != nil || len(res.Changes) != 1 || res.Changes[0].String() != "rule api/per-ip changed (limit)" {
		t.Fatalf("apply of a changed limit: %+v, %v", res, err)
	}
	if _, now := exported(t, pool); now != res.ETag || now == etag {
		t.Errorf("etag after the apply %s, the apply said %s (before %s)", now, res.ETag, etag)
	}
	if got := load(t, pool); got.Domains["api"].Rules[1].Limit != 60 || got.Tenants["acme"] != "pro" {
		t.Errorf("the limiters load %+v", got)
	}
}

// A file's domain replaces the domain whole, rules in the file's order; a
// plan its limits; domains and plans it does not name stay, unless pruned
// (then a plan with tenants is refused, naming them). A dry run says the
// same and writes nothing.
func TestApplyReplacesWhatTheFileNamesAndPrunesOnlyWhenAsked(t *testing.T) {
	pool := seeded(t, adminRules)
	before, etag := exported(t, pool)
	file := `
domains:
  api:
    rules:
      - {name: per-ip, key: [ip], algorithm: fixed_window, limit: 50, window: 1m, failure_mode: open}
      - {name: per-route, key: [route], algorithm: fixed_window, limit: 5, window: 1s, failure_mode: open}
plans:
  free: {api/per-route: {limit: 2}}
  team: {}
`
	// pro's limit of the removed rule: the whole does not compile.
	if _, err := apply(t, pool, file, ApplyOptions{}); !errors.Is(err, ErrInvalid) || !strings.Contains(err.Error(), `plan pro: no rule "api/per-key"`) {
		t.Fatalf("apply leaving pro's limit of a removed rule: %v; want it refused, naming plan pro and the rule", err)
	}
	if after, _ := exported(t, pool); after != before {
		t.Fatalf("a refused apply wrote:\n%s", after)
	}
	file += "  pro: {api/per-ip: {limit: 500}}\n"
	dry, err := apply(t, pool, file, ApplyOptions{DryRun: true})
	if err != nil {
		t.Fatal(err)
	}
	if after, now := exported(t, pool); after != before || now != etag {
		t.Fatalf("a dry run wrote:\n%s", after)
	}
	want := "domain api changed (defaults); rule api/per-ip changed (position); rule api/per-key removed; rule api/per-route added; " +
		"limit free api/per-key removed; limit free api/per-route added; limit pro api/per-ip added; limit pro api/per-key removed; plan team added"
	if got := changeList(dry.Changes); got != want {
		t.Errorf("dry run: %s\nwant %s", got, want)
	}
	res, err := apply(t, pool, file, ApplyOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if res.ETag != dry.ETag || changeList(res.Changes) != want {
		t.Errorf("the apply (%s, etag %s) did other than its dry run said (etag %s)", changeList(res.Changes), res.ETag, dry.ETag)
	}
	if _, now := exported(t, pool); now != res.ETag {
		t.Errorf("etag after the apply %s, the apply said %s", now, res.ETag)
	}
	got := load(t, pool)
	if r := got.Domains["api"].Rules; len(r) != 2 || r[0].Name != "per-ip" || r[1].Name != "per-route" || len(got.Domains["api"].Defaults) != 0 {
		t.Errorf("domain api after the apply: %+v", got.Domains["api"])
	}
	if _, ok := got.Domains["auth"]; !ok {
		t.Errorf("domain auth, which the file does not name, is gone")
	}
	if _, ok := got.Plans["team"]; !ok || got.Plans["pro"]["api/per-ip"].Limit != 500 {
		t.Errorf("plans after the apply: %+v", got.Plans)
	}

	// Prune: auth goes; free goes too, unless a tenant is on it.
	execSQL(t, pool, `INSERT INTO rl_tenant_plans (tenant, plan) VALUES ('zeta', 'free'), ('beta', 'free')`)
	prune := strings.Replace(file, "  free: {api/per-route: {limit: 2}}\n", "", 1)
	if _, err := apply(t, pool, prune, ApplyOptions{Prune: true}); !errors.Is(err, ErrPlanInUse) || !strings.Contains(err.Error(), "plan free has 2 tenants (beta, zeta)") {
		t.Fatalf("prune of a plan with tenants: %v; want it refused, naming them", err)
	}
	execSQL(t, pool, `DELETE FROM rl_tenant_plans WHERE plan = 'free'`)
	res, err = apply(t, pool, prune, ApplyOptions{Prune: true})
	if err != nil {
		t.Fatal(err)
	}
	if got := changeList(res.Changes); got != "domain auth removed; rule auth/per-ip removed; plan free removed; limit free api/per-route removed" {
		t.Errorf("prune: %s", got)
	}
	got = load(t, pool)
	if _, ok := got.Domains["auth"]; ok || got.Plans["free"] != nil {
		t.Errorf("after prune: domains %v, plans %v", got.Domains, got.Plans)
	}

	// What an apply deleted, the bootstrap file does not put back.
	if n, err := Seed(context.Background(), pool, mustParse(t, adminRules)); err != nil || n != 0 {
		t.Errorf("seed after the applies: wrote %d, %v; want nothing (deleted items stay deleted)", n, err)
	}
	// Nor does a rule a newer bootstrap file adds to a deleted domain
	// fail the seed (and the limiter's start).
	newer := mustParse(t, adminRules+`
`)
	d := newer.Domains["auth"]
	d.Rules = append(d.Rules, d.Rules[0])
	d.Rules[1].Name = "per-user"
	newer.Domains["auth"] = d
	if _, err := Seed(context.Background(), pool, newer); err != nil {
		t.Errorf("seed of a new rule of a deleted domain: %v; want it skipped", err)
	}
	if _, ok := load(t, pool).Domains["auth"]; ok {
		t.Errorf("the seed brought the deleted domain back")
	}
}

// Refusals leave the tables as they were: a rule that does not compile
// (named, with its field), an etag that is not the rules', a tenants
// section that changes a plan, a file over 1 MiB, an envoyproxy/ratelimit
// file kurz would decide otherwise (the descriptor named), or whose domain
// replaces one the plans limit rules of.
func TestApplyRefusesAndWritesNothing(t *testing.T) {
	pool := seeded(t, adminRules)
	before, etag := exported(t, pool)
	for _, c := range []struct {
		name, file string
		opts       ApplyOptions
		err        error
		says       string
	}{
		{"a misspelt field", "domains:\n  api:\n    rules:\n      - {name: per-ip, key: [ip], algorithm: fixed_window, limt: 5, window: 1s, failure_mode: open}\n",
			ApplyOptions{}, ErrInvalid, "field limt not found"},
		{"a rule that does not compile", "domains:\n  api:\n    rules:\n      - {name: per-ip, key: [ip], algorithm: fixed_windows, limit: 5, window: 1s, failure_mode: open}\n",
			ApplyOptions{}, ErrInvalid, `rule api/per-ip: algorithm "fixed_windows"`},
		{"a stale etag", before, ApplyOptions{IfMatch: []string{"stale"}}, ErrETagMismatch, "they are at etag " + etag},
		{"a weak etag", before, ApplyOptions{IfMatch: []string{"W/" + etag}}, ErrETagMismatch,
			`If-Match W/"` + etag + `" is a weak validator, which cannot be used for an apply`},
		{"a stale etag and a weak one", before, ApplyOptions{IfMatch: []string{"stale", "W/" + etag}}, ErrETagMismatch, "a weak tag, W/\"" + etag + "\", never matches"},
		{"a tenant moved", before + "tenants: {acme: free}\n", ApplyOptions{}, ErrTenantPlans, "acme: free (now pro)"},
		{"over 1 MiB", before + "#" + strings.Repeat("x", MaxApplyBytes), ApplyOptions{}, ErrInvalid, "at most 1048576"},
		{"an envoyproxy/ratelimit star mid-value", "domain: edge\ndescriptors:\n  - key: path\n    value: /api/*/x\n    rate_limit: {unit: second, requests_per_unit: 1}\n",
			ApplyOptions{}, ErrInvalid, "path=/api/*/x"},
		{"an envoyproxy/ratelimit file replacing a planned domain", "domain: api\ndescriptors:\n  - key: remote_address\n    rate_limit: {unit: second, requests_per_unit: 1}\n",
			ApplyOptions{}, ErrInvalid, "api/per-key"},
		{"an empty file", "\n", ApplyOptions{}, ErrInvalid, "the file is empty"},
	} {
		_, err := apply(t, pool, c.file, c.opts)
		if !errors.Is(err, c.err) || !strings.Contains(err.Error(), c.says) {
			t.Errorf("%s: %v; want %v saying %q", c.name, err, c.err, c.says)
		}
	}
	if after, _ := exported(t, pool); after != before {
		t.Errorf("refused applies wrote:\n%s", after)
	}
	// A tenants section that says what the tables say passes (the
	// bootstrap file has one).
	if res, err := apply(t, pool, before+"tenants: {acme: pro}\n", ApplyOptions{}); err != nil || len(res.Changes) != 0 {
		t.Errorf("a tenants section as the tables have it: %+v, %v", res, err)
	}
}

// An envoyproxy/ratelimit file applies as its translation (what the file
// source and `limiter rules from-envoy` make of it), said to be one: its
// domain, a kurz domain of the same name, is added, or replaces the
// domain of that name whole, as a kurz file's would; the rest is left.
func TestApplyAnEnvoyFileAppliesItsTranslation(t *testing.T) {
	pool := seeded(t, adminRules)
	before, _ := exported(t, pool)
	const envoy = `
domain: auth
descriptors:
  - key: generic_key
    value: login
    rate_limit: {unit: minute, requests_per_unit: 20}
    descriptors:
      - key: remote_address
        rate_limit: {unit: second, requests_per_unit: 2, name: login-per-ip}
`
	translated, err := FromEnvoy([]EnvoyFile{{Name: "auth.yaml", Data: []byte(envoy)}})
	if err != nil {
		t.Fatal(err)
	}
	want := mustParse(t, before)
	want.Tenants = nil
	want.Domains["auth"] = translated.Domains["auth"]

	res, err := apply(t, pool, envoy, ApplyOptions{DryRun: true})
	if err != nil || res.Format != FormatEnvoy {
		t.Fatalf("dry run of an envoyproxy/ratelimit file: %+v, %v; want it read as %q", res, err, FormatEnvoy)
	}
	if got, wantChanges := changeList(res.Changes), "rule auth/generic_key_login added; rule auth/login-per-ip added; rule auth/per-ip removed"; got != wantChanges {
		t.Errorf("dry run changes: %s; want %s", got, wantChanges)
	}
	if after, _ := exported(t, pool); after != before {
		t.Fatalf("a dry run wrote:\n%s", after)
	}

	res, err = apply(t, pool, envoy, ApplyOptions{})
	if err != nil || res.Format != FormatEnvoy || len(res.Changes) != 3 {
		t.Fatalf("apply of an envoyproxy/ratelimit file: %+v, %v", res, err)
	}
	cfg, err := Export(context.Background(), pool)
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(fieldsOf(cfg), fieldsOf(want)) {
		got, _ := Marshal(cfg)
		t.Errorf("the export after the apply:\n%s\nwant the seeded rules with auth the file's translation", got)
	}
	if file, etag := exported(t, pool); etag != res.ETag || !strings.Contains(file, "fixed_window") {
		t.Errorf("the export's etag %s, the apply's %s:\n%s", etag, res.ETag, file)
	}

	// The same file again changes nothing.
	if res, err := apply(t, pool, envoy, ApplyOptions{}); err != nil || len(res.Changes) != 0 {
		t.Errorf("the Envoy file applied again: %+v, %v; want no change", res, err)
	}
}

// An envoyproxy/ratelimit file with an unlimited descriptor applies as a
// kurz rule marked unlimited, with nothing of a limit: the export writes
// it so, the limiters load it so, and the export applied again changes
// nothing (the rule's spec row holds the flag; no column is needed).
func TestAnUnlimitedRuleRoundTripsThroughApplyAndExport(t *testing.T) {
	pool := seeded(t, adminRules)
	const envoy = `
domain: auth
descriptors:
  - {key: user, rate_limit: {unit: minute, requests_per_unit: 20}}
  - {key: user, value: internal, rate_limit: {unlimited: true}}
`
	if _, err := apply(t, pool, envoy, ApplyOptions{}); err != nil {
		t.Fatal(err)
	}
	file, etag := exported(t, pool)
	if !strings.Contains(file, "unlimited: true") || strings.Contains(file, "limit: 1099511627776") {
		t.Fatalf("the export:\n%s\nwant rule user_internal unlimited, with no limit", file)
	}
	got := load(t, pool).Domains["auth"].Rules
	want := ratelimit.RuleSpec{Name: "user_internal", Key: []string{"user"}, Match: map[string]string{"user": "internal"}, Unlimited: true}
	if len(got) != 2 || !reflect.DeepEqual(got[1], want) {
		t.Fatalf("the limiters load auth's rules %+v; want the second %+v", got, want)
	}
	if res, err := apply(t, pool, file, ApplyOptions{IfMatch: []string{etag}}); err != nil || len(res.Changes) != 0 || res.ETag != etag {
		t.Errorf("the export applied again: %+v, %v; want no change, etag %s", res, err, etag)
	}
	// Made limited by hand, the change is the flag and the limit's fields.
	limited := strings.Replace(file, "unlimited: true", "algorithm: fixed_window\n        limit: 5\n        window: 1m\n        failure_mode: open", 1)
	res, err := apply(t, pool, limited, ApplyOptions{DryRun: true})
	if err != nil || changeList(res.Changes) != "rule auth/user_internal changed (algorithm, failure_mode, limit, unlimited, window)" {
		t.Errorf("unlimited made limited: %+v, %v\n%s", res, err, limited)
	}
}

// Two applies at once are serialised: each sees the other's result, and
// if-match refuses the one whose read went stale.
func TestConcurrentAppliesAreSerialised(t *testing.T) {
	pool := seeded(t, adminRules)
	before, etag := exported(t, pool)
	errs := make(chan error, 2)
	for _, limit := range []string{"limit: 51", "limit: 52"} {
		go func() {
			_, err := Apply(context.Background(), pool, []byte(strings.Replace(before, "limit: 50", limit, 1)), ApplyOptions{IfMatch: []string{etag}})
			errs <- err
		}()
	}
	var ok, stale int
	for range 2 {
		switch err := <-errs; {
		case err == nil:
			ok++
		case errors.Is(err, ErrETagMismatch):
			stale++
		default:
			t.Fatal(err)
		}
	}
	if ok != 1 || stale != 1 {
		t.Errorf("%d applied, %d refused as stale; want one each", ok, stale)
	}
}

func changeList(cs []Change) string {
	var s []string
	for _, c := range cs {
		s = append(s, c.String())
	}
	return strings.Join(s, "; ")
}

func mustParse(t *testing.T, src string) ratelimit.Config {
	t.Helper()
	cfg, err := Parse([]byte(src))
	if err != nil {
		t.Fatal(err)
	}
	return cfg
}

// A file within the bound whose rules export over it (flow style exports
// half as large again) is refused: what it applied could not be exported
// and applied back.
func TestApplyRefusesRulesThatExportOverTheBound(t *testing.T) {
	pool := seeded(t, adminRules)
	before, _ := exported(t, pool)
	var b strings.Builder
	b.WriteString("domains:\n  x:\n    rules:\n")
	for i := range 10 {
		fmt.Fprintf(&b, "      - {name: r%d, key: [ip], algorithm: token_bucket, limit: 5, window: 1s, failure_mode: open}\n", i)
	}
	b.WriteString("plans:\n")
	for i := 0; b.Len() < MaxApplyBytes-300; i++ {
		fmt.Fprintf(&b, "  p%d: {", i)
		for j := range 10 {
			fmt.Fprintf(&b, "x/r%d: {limit: 3}, ", j)
		}
		b.WriteString("}\n")
	}
	for _, dryRun := range []bool{true, false} {
		_, err := apply(t, pool, b.String(), ApplyOptions{DryRun: dryRun})
		if !errors.Is(err, ErrInvalid) || !strings.Contains(err.Error(), "as a rules file (the export), over the 1048576") {
			t.Errorf("dry run %v: %v; want it refused as exporting over the bound", dryRun, err)
		}
	}
	if after, _ := exported(t, pool); after != before {
		t.Errorf("the refused apply wrote:\n%s", after)
	}
}

// A tenant moved onto a plan while an apply deletes it is waited for and
// counted: the apply is refused as the plan being in use, not failed on
// the foreign key.
func TestApplyDeletingAPlanCountsATenantMovedOntoItMeanwhile(t *testing.T) {
	pool := seeded(t, adminRules)
	ctx := context.Background()
	mover, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = mover.Rollback(ctx) }()
	var moverPID int
	if err := mover.QueryRow(ctx, `SELECT pg_backend_pid()`).Scan(&moverPID); err != nil {
		t.Fatal(err)
	}
	if _, err := mover.Exec(ctx, `INSERT INTO rl_tenant_plans (tenant, plan) VALUES ('mover', 'free')`); err != nil {
		t.Fatal(err)
	}
	withoutFree := mustParse(t, adminRules)
	delete(withoutFree.Plans, "free")
	file, err := Marshal(withoutFree)
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() {
		_, err := Apply(ctx, pool, file, ApplyOptions{Prune: true})
		done <- err
	}()
	// The apply waits for the mover's row lock on plan free, then the
	// mover commits.
	for blocked := 0; blocked == 0; {
		if err := pool.QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity WHERE $1 = ANY(pg_blocking_pids(pid))`, moverPID).Scan(&blocked); err != nil {
			t.Fatal(err)
		}
		select {
		case err := <-done:
			t.Fatalf("the apply ended before the mover committed: %v", err)
		default:
		}
	}
	if err := mover.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	if err := <-done; !errors.Is(err, ErrPlanInUse) || !strings.Contains(err.Error(), "plan free has 1 tenants (mover)") {
		t.Errorf("apply: %v; want it refused as plan free being in use by mover", err)
	}
}
