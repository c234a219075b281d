package k8s

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io/fs"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	"sigs.k8s.io/yaml"
)

// The alert rules: monitoring/alerts.rules.yaml is the one source; the
// ConfigMap kurz-prometheus-rules (monitoring/) and the PrometheusRule
// (monitoring/operator/) carry it.
const (
	rulesFile       = "monitoring/alerts.rules.yaml"
	rulesTestFile   = "monitoring/alerts_test.yaml"
	prometheusRule  = "monitoring/operator/prometheusrule.yaml"
	operationsDoc   = "docs/operations.md"
	updateRulesEnv  = "KURZ_UPDATE_RULES"
	prometheusRuleH = `# Generated from ../alerts.rules.yaml (the one source of kurz's alerts):
# edit that file, then KURZ_UPDATE_RULES=1 go test -run TestPrometheusRuleMatchesTheRulesFile ./deploy/k8s/
apiVersion: monitoring.coreos.com/v1
kind: PrometheusRule
metadata:
  name: kurz
  namespace: monitoring
spec:
`
)

// ruleGroups is a Prometheus rules file, as promtool reads it.
type ruleGroups struct {
	Groups []struct {
		Name  string `json:"name"`
		Rules []rule `json:"rules"`
	} `json:"groups"`
}

type rule struct {
	Alert       string            `json:"alert"`
	Expr        string            `json:"expr"`
	For         string            `json:"for"`
	Labels      map[string]string `json:"labels"`
	Annotations map[string]string `json:"annotations"`
}

func (g ruleGroups) rules() []rule {
	var out []rule
	for _, grp := range g.Groups {
		out = append(out, grp.Rules...)
	}
	return out
}

func readRules(t *testing.T) ruleGroups {
	t.Helper()
	raw, err := os.ReadFile(rulesFile)
	if err != nil {
		t.Fatal(err)
	}
	var g ruleGroups
	if err := yaml.UnmarshalStrict(raw, &g); err != nil {
		t.Fatalf("%s: %v", rulesFile, err)
	}
	if len(g.rules()) == 0 {
		t.Fatalf("%s has no rules", rulesFile)
	}
	return g
}

// promtool is Prometheus's own checker (Debian's package prometheus, which
// make tools installs). Its absence fails the tests.
func promtool(t *testing.T, args ...string) {
	t.Helper()
	bin, err := exec.LookPath("promtool")
	if err != nil {
		t.Fatal("promtool is not on PATH: run make tools (it installs Debian's package prometheus, which has /usr/bin/promtool)")
	}
	cmd := exec.Command(bin, args...)
	cmd.Dir = "monitoring"
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("promtool %s: %v\n%s", strings.Join(args, " "), err, out)
	}
}

// promtool check rules accepts the rules file, and promtool test rules
// passes every case of alerts_test.yaml: each alert fires on the series it
// is for, with its labels and annotations, and stays silent below its
// threshold or before its `for`.
func TestAlertRules(t *testing.T) {
	promtool(t, "check", "rules", filepath.Base(rulesFile))
	promtool(t, "test", "rules", filepath.Base(rulesTestFile))
}

// Every alert has a unit test that expects it to fire and one that expects
// it silent, a `for`, a severity that says whether it pages, a summary and
// description, and a runbook that is a section of docs/operations.md.
func TestEveryAlertIsTestedAndDocumented(t *testing.T) {
	g := readRules(t)
	raw, err := os.ReadFile(rulesTestFile)
	if err != nil {
		t.Fatal(err)
	}
	var tests struct {
		RuleFiles []string `json:"rule_files"`
		Tests     []struct {
			AlertRuleTest []struct {
				Alertname string `json:"alertname"`
				ExpAlerts []any  `json:"exp_alerts"`
			} `json:"alert_rule_test"`
		} `json:"tests"`
	}
	if err := yaml.Unmarshal(raw, &tests); err != nil {
		t.Fatalf("%s: %v", rulesTestFile, err)
	}
	if !slices.Equal(tests.RuleFiles, []string{filepath.Base(rulesFile)}) {
		t.Errorf("%s tests rule files %v, want [%s]", rulesTestFile, tests.RuleFiles, filepath.Base(rulesFile))
	}
	fires, silent := map[string]bool{}, map[string]bool{}
	for _, tc := range tests.Tests {
		for _, a := range tc.AlertRuleTest {
			if len(a.ExpAlerts) > 0 {
				fires[a.Alertname] = true
			} else {
				silent[a.Alertname] = true
			}
		}
	}
	doc, err := os.ReadFile(filepath.Join(repoRoot(t), operationsDoc))
	if err != nil {
		t.Fatal(err)
	}
	anchors := map[string]bool{}
	for _, m := range regexp.MustCompile(`(?m)^#+ (.+)$`).FindAllSubmatch(doc, -1) {
		anchors[githubAnchor(string(m[1]))] = true
	}
	seen := map[string]bool{}
	for _, r := range g.rules() {
		if r.Alert == "" {
			t.Errorf("a rule records %q: %s holds alerts only", r.Expr, rulesFile)
			continue
		}
		if seen[r.Alert] {
			t.Errorf("alert %s defined twice", r.Alert)
		}
		seen[r.Alert] = true
		if !fires[r.Alert] || !silent[r.Alert] {
			t.Errorf("alert %s: %s has a case where it fires: %v, where it is silent: %v; want both", r.Alert, rulesTestFile, fires[r.Alert], silent[r.Alert])
		}
		if r.For == "" {
			t.Errorf("alert %s has no for", r.Alert)
		}
		if s := r.Labels["severity"]; s != "critical" && s != "warning" {
			t.Errorf("alert %s: severity %q, want critical (pages) or warning", r.Alert, s)
		}
		for _, a := range []string{"summary", "description"} {
			if strings.TrimSpace(r.Annotations[a]) == "" {
				t.Errorf("alert %s has no %s", r.Alert, a)
			}
		}
		want := operationsDoc + "#" + strings.ToLower(r.Alert)
		if r.Annotations["runbook_url"] != want {
			t.Errorf("alert %s: runbook_url %q, want %q", r.Alert, r.Annotations["runbook_url"], want)
		} else if !anchors[strings.ToLower(r.Alert)] {
			t.Errorf("alert %s: %s has no section %q (its runbook)", r.Alert, operationsDoc, r.Alert)
		}
	}
}

// githubAnchor is the fragment a Markdown renderer gives a heading.
func githubAnchor(heading string) string {
	var b strings.Builder
	for _, r := range strings.ToLower(strings.TrimSpace(heading)) {
		switch {
		case r >= 'a' && r <= 'z', r >= '0' && r <= '9', r == '-', r == '_':
			b.WriteRune(r)
		case r == ' ':
			b.WriteRune('-')
		}
	}
	return b.String()
}

var (
	// promMetric is a metric name in an expression; label matchers,
	// grouping clauses and quoted strings are removed first.
	promMetric = regexp.MustCompile(`\b[a-z_][a-z0-9_]*_[a-z0-9_]+\b`)
	notMetrics = regexp.MustCompile(`\{[^}]*\}|\b(?:by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)|"[^"]*"|\[[^\]]*\]`)
	// instrumentName is an OpenTelemetry instrument name in Go source.
	instrumentName = regexp.MustCompile(`"((?:kurz|rpc|http)\.[a-z0-9_.]+)"`)
	// promQLFuncs are the functions the rules call (they look like names).
	promQLFuncs = map[string]bool{"histogram_quantile": true, "max_over_time": true}
	// scrapeSeries is Prometheus's own series of a target, which no
	// service declares: up, of every scrape.
	scrapeSeries = regexp.MustCompile(`\bup\{`)
)

// Every metric an alert reads is one the services declare: an OpenTelemetry
// instrument name in the Go sources of services/ and pkg/, in its Prometheus
// form (dots to underscores, plus _total, _seconds, _bucket as the exporter
// adds them). The declarations, not a scrape: a series appears on /metrics
// only once something was counted, and the alerts watch exactly the rare
// ones (fallbacks, dead letters), so a scrape of an idle stack could not
// tell a renamed metric from a quiet one.
func TestAlertMetricsAreDeclaredInCode(t *testing.T) {
	isDeclared := declaredMetrics(t)
	for _, r := range readRules(t).rules() {
		names := promMetric.FindAllString(notMetrics.ReplaceAllString(r.Expr, ""), -1)
		names = slices.DeleteFunc(names, func(n string) bool { return promQLFuncs[n] })
		if len(names) == 0 && !scrapeSeries.MatchString(r.Expr) {
			t.Errorf("alert %s: %s names no metric", r.Alert, r.Expr)
		}
		for _, n := range names {
			if !isDeclared(n) {
				t.Errorf("alert %s reads %s, which no service declares", r.Alert, n)
			}
		}
	}
}

// declaredMetrics reports whether a Prometheus metric name is one the
// services declare (TestAlertMetricsAreDeclaredInCode says how).
func declaredMetrics(t *testing.T) func(name string) bool {
	t.Helper()
	declared := map[string]bool{}
	root := repoRoot(t)
	for _, dir := range []string{"services", "pkg"} {
		err := filepath.WalkDir(filepath.Join(root, dir), func(path string, d fs.DirEntry, err error) error {
			if err != nil || d.IsDir() || !strings.HasSuffix(path, ".go") || strings.HasSuffix(path, "_test.go") {
				return err
			}
			src, err := os.ReadFile(path)
			if err != nil {
				return err
			}
			for _, m := range instrumentName.FindAllSubmatch(src, -1) {
				declared[strings.ReplaceAll(string(m[1]), ".", "_")] = true
			}
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
	}
	return func(name string) bool {
		for _, suffix := range []string{"_bucket", "_count", "_sum"} {
			name = strings.TrimSuffix(name, suffix)
		}
		for _, unit := range []string{"", "_total", "_seconds", "_seconds_total"} {
			if base, ok := strings.CutSuffix(name, unit); ok && declared[base] {
				return true
			}
		}
		return false
	}
}

// generatedPrometheusRule is the PrometheusRule of the rules file: its
// groups, indented under spec.
func generatedPrometheusRule(t *testing.T) []byte {
	t.Helper()
	raw, err := os.ReadFile(rulesFile)
	if err != nil {
		t.Fatal(err)
	}
	i := bytes.Index(raw, []byte("\ngroups:\n"))
	if i < 0 {
		t.Fatalf("%s has no top-level groups:", rulesFile)
	}
	out := bytes.NewBufferString(prometheusRuleH)
	for line := range strings.Lines(string(raw[i+1:])) {
		if strings.TrimSpace(line) != "" {
			out.WriteString("  ")
		}
		out.WriteString(line)
	}
	return out.Bytes()
}

// monitoring/operator/prometheusrule.yaml is the rules file's groups as a
// PrometheusRule, byte for byte: one source, generated.
func TestPrometheusRuleMatchesTheRulesFile(t *testing.T) {
	want := generatedPrometheusRule(t)
	if os.Getenv(updateRulesEnv) != "" {
		if err := os.WriteFile(prometheusRule, want, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	got, err := os.ReadFile(prometheusRule)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, want) {
		t.Fatalf("%s is stale: run %s=1 go test -run TestPrometheusRuleMatchesTheRulesFile ./deploy/k8s/", prometheusRule, updateRulesEnv)
	}
}

// Every query of the Grafana dashboard is PromQL that Prometheus parses:
// promtool check rules on a rules file recording each one
// ($__rate_interval, Grafana's, as 5m).
func TestDashboardQueriesParse(t *testing.T) {
	raw, err := os.ReadFile(filepath.Join(repoRoot(t), "deploy", "grafana", "kurz.json"))
	if err != nil {
		t.Fatal(err)
	}
	var dash struct {
		Panels []struct {
			ID      int `json:"id"`
			Targets []struct {
				Expr string `json:"expr"`
			} `json:"targets"`
		} `json:"panels"`
	}
	if err := json.Unmarshal(raw, &dash); err != nil {
		t.Fatal(err)
	}
	queries := map[string]string{}
	for _, p := range dash.Panels {
		for i, tg := range p.Targets {
			queries[fmt.Sprintf("dashboard:panel%d_%d", p.ID, i)] = strings.ReplaceAll(tg.Expr, "$__rate_interval", "5m")
		}
	}
	if len(queries) == 0 {
		t.Fatal("kurz.json has no queries")
	}
	promtoolParses(t, "dashboard", queries)
}

// promtoolParses has promtool check rules parse each query, as a rules
// file recording it under its name.
func promtoolParses(t *testing.T, group string, queries map[string]string) {
	t.Helper()
	type record struct {
		Record string `json:"record"`
		Expr   string `json:"expr"`
	}
	var records []record
	for _, name := range slices.Sorted(maps.Keys(queries)) {
		records = append(records, record{name, queries[name]})
	}
	file := map[string]any{"groups": []any{map[string]any{"name": group, "rules": records}}}
	out, err := yaml.Marshal(file)
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(t.TempDir(), group+".rules.yaml")
	if err := os.WriteFile(path, out, 0o644); err != nil {
		t.Fatal(err)
	}
	promtool(t, "check", "rules", path)
}

// The PromQL that docs/operations.md gives for each of envoyproxy/ratelimit's
// stats parses, and reads only metrics the services declare: users move
// their dashboards and alerts onto these.
func TestEnvoyStatsQueriesParse(t *testing.T) {
	raw, err := os.ReadFile(filepath.Join(repoRoot(t), operationsDoc))
	if err != nil {
		t.Fatal(err)
	}
	_, table, ok := strings.Cut(string(raw), "<!-- envoy-stats:begin -->")
	if table, _, ok = strings.Cut(table, "<!-- envoy-stats:end -->"); !ok {
		t.Fatalf("%s has no envoy-stats table between its markers", operationsDoc)
	}
	isDeclared := declaredMetrics(t)
	queries := map[string]string{}
	for line := range strings.Lines(table) {
		cells := strings.Split(strings.Trim(strings.TrimSpace(line), "|"), "|")
		if len(cells) != 2 || !strings.HasPrefix(strings.TrimSpace(cells[1]), "`") {
			continue // the header, its rule, blank lines
		}
		expr := strings.Trim(strings.TrimSpace(cells[1]), "`")
		queries[fmt.Sprintf("envoy_stats:row%d", len(queries))] = expr
		for _, n := range promMetric.FindAllString(notMetrics.ReplaceAllString(expr, ""), -1) {
			if !isDeclared(n) {
				t.Errorf("%s: %s reads %s, which no service declares", strings.TrimSpace(cells[0]), expr, n)
			}
		}
	}
	if len(queries) < 6 {
		t.Fatalf("%d queries in the envoy-stats table, want one per stat (6) at least", len(queries))
	}
	promtoolParses(t, "envoy_stats", queries)
}
