package telemetry

import (
	"encoding/json"
	"os"
	"regexp"
	"slices"
	"strings"
	"testing"

	"sigs.k8s.io/yaml"
)

// knownMetrics are the Prometheus names of the families the services export
// (the services' metric tests check the ones with traffic behind them); a
// dashboard query naming anything else would draw an empty panel.
var knownMetrics = map[string]bool{
	"kurz_ratelimit_decisions_total":                  true,
	"kurz_ratelimit_near_limit_total":                 true,
	"kurz_ratelimit_fallbacks_total":                  true,
	"kurz_ratelimit_redis_duration_seconds":           true,
	"kurz_redirect_requests_total":                    true,
	"kurz_redirect_duration_seconds":                  true,
	"kurz_redirect_click_events_written_total":        true,
	"kurz_redirect_click_events_dropped_total":        true,
	"kurz_redirect_set_age_seconds":                   true,
	"kurz_redirect_set_refresh_seconds":               true,
	"kurz_analytics_consumer_lag":                     true,
	"kurz_analytics_consumer_overrun":                 true,
	"kurz_analytics_batch_size":                       true,
	"kurz_analytics_flush_failures_total":             true,
	"kurz_gateway_requests_total":                     true,
	"kurz_gateway_request_duration_seconds":           true,
	"rpc_server_call_duration_seconds":                true,
	"rpc_client_call_duration_seconds":                true,
	"http_server_request_duration_seconds":            true,
	"kurz_ratelimit_breakers_open":                    true,
	"kurz_ratelimit_fleet_replicas":                   true,
	"kurz_ratelimit_rules_refreshes_total":            true,
	"kurz_quota_calls_total":                          true,
	"kurz_shortener_links_created_total":              true,
	"kurz_shortener_urls_refused_total":               true,
	"kurz_shortener_cache_write_failures_total":       true,
	"kurz_shortener_invalidations_pending":            true,
	"kurz_shortener_invalidations_oldest_age_seconds": true,
	"kurz_shortener_webhook_attempts_total":           true,
	"kurz_shortener_webhook_queue_pending":            true,
	"kurz_shortener_webhook_queue_oldest_age_seconds": true,
	"kurz_shortener_webhook_queue_lag_seconds":        true,
	"kurz_analytics_events_dead_lettered_total":       true,
	"kurz_analytics_events_duplicates_skipped_total":  true,
	"kurz_analytics_events_trimmed_total":             true,
	"kurz_dependency_up":                              true,
	"kurz_grpc_calls_refused_total":                   true,
}

var (
	metricName = regexp.MustCompile(`\b(?:kurz|rpc|http)_[a-z0-9_]+`)
	// Label matchers and grouping clauses name labels, not metrics.
	labelParts = regexp.MustCompile(`\{[^}]*\}|\b(?:by|without)\s*\([^)]*\)`)
)

// dashboard is the part of deploy/grafana/kurz.json the tests read.
type dashboard struct {
	Title         string `json:"title"`
	UID           string `json:"uid"`
	SchemaVersion int    `json:"schemaVersion"`
	Panels        []struct {
		ID         int    `json:"id"`
		Type       string `json:"type"`
		Title      string `json:"title"`
		Datasource struct {
			Type string `json:"type"`
		} `json:"datasource"`
		Targets []struct {
			RefID string `json:"refId"`
			Expr  string `json:"expr"`
		} `json:"targets"`
	} `json:"panels"`
}

func loadDashboard(t *testing.T) dashboard {
	t.Helper()
	raw, err := os.ReadFile("../../deploy/grafana/kurz.json")
	if err != nil {
		t.Fatal(err)
	}
	var dash dashboard
	if err := json.Unmarshal(raw, &dash); err != nil {
		t.Fatalf("kurz.json: %v", err)
	}
	return dash
}

// TestGrafanaDashboard: deploy/grafana/kurz.json is a dashboard model
// Grafana can import: valid JSON, unique panel IDs, and every panel (rows
// aside) has a title, a Prometheus datasource and at least one target whose
// PromQL names only metrics the services export, with balanced brackets.
func TestGrafanaDashboard(t *testing.T) {
	dash := loadDashboard(t)
	if dash.Title == "" || dash.UID == "" || dash.SchemaVersion == 0 || len(dash.Panels) == 0 {
		t.Fatalf("dashboard: title %q, uid %q, schemaVersion %d, %d panels: want all set", dash.Title, dash.UID, dash.SchemaVersion, len(dash.Panels))
	}
	ids := map[int]bool{}
	used := map[string]bool{}
	for _, p := range dash.Panels {
		if ids[p.ID] {
			t.Errorf("panel id %d used twice", p.ID)
		}
		ids[p.ID] = true
		if p.Title == "" {
			t.Errorf("panel %d has no title", p.ID)
		}
		if p.Type == "row" {
			continue
		}
		if p.Datasource.Type != "prometheus" {
			t.Errorf("panel %q: datasource type %q, want prometheus", p.Title, p.Datasource.Type)
		}
		if len(p.Targets) == 0 {
			t.Errorf("panel %q has no targets", p.Title)
		}
		for _, tg := range p.Targets {
			if strings.TrimSpace(tg.Expr) == "" || tg.RefID == "" {
				t.Errorf("panel %q: target %q has an empty expr or refId", p.Title, tg.RefID)
				continue
			}
			if !balanced(tg.Expr) {
				t.Errorf("panel %q: unbalanced brackets in %s", p.Title, tg.Expr)
			}
			names := metricName.FindAllString(labelParts.ReplaceAllString(tg.Expr, ""), -1)
			if len(names) == 0 {
				t.Errorf("panel %q: %s names no kurz metric", p.Title, tg.Expr)
			}
			for _, n := range names {
				base := strings.TrimSuffix(strings.TrimSuffix(strings.TrimSuffix(n, "_bucket"), "_count"), "_sum")
				if !knownMetrics[base] {
					t.Errorf("panel %q: unknown metric %s", p.Title, n)
				}
				used[base] = true
			}
		}
	}
	for _, key := range []string{"kurz_ratelimit_decisions_total", "kurz_ratelimit_redis_duration_seconds",
		"kurz_redirect_requests_total", "kurz_redirect_duration_seconds", "kurz_analytics_consumer_lag"} {
		if !used[key] {
			t.Errorf("no panel shows %s", key)
		}
	}
}

func balanced(s string) bool {
	var stack []rune
	pairs := map[rune]rune{')': '(', ']': '[', '}': '{'}
	inQuote := false
	for _, r := range s {
		switch {
		case r == '"':
			inQuote = !inQuote
		case inQuote:
		case r == '(' || r == '[' || r == '{':
			stack = append(stack, r)
		case pairs[r] != 0:
			if len(stack) == 0 || stack[len(stack)-1] != pairs[r] {
				return false
			}
			stack = stack[:len(stack)-1]
		}
	}
	return len(stack) == 0 && !inQuote
}

// TestDashboardShowsWhatTheAlertsWatch: every metric an alert of
// deploy/k8s/monitoring/alerts.rules.yaml reads is drawn by some panel, so
// the operator paged has the graph behind the page.
func TestDashboardShowsWhatTheAlertsWatch(t *testing.T) {
	dash := loadDashboard(t)
	drawn := map[string]bool{}
	for _, p := range dash.Panels {
		for _, tg := range p.Targets {
			for _, n := range metricName.FindAllString(labelParts.ReplaceAllString(tg.Expr, ""), -1) {
				drawn[n] = true
			}
		}
	}
	rawRules, err := os.ReadFile("../../deploy/k8s/monitoring/alerts.rules.yaml")
	if err != nil {
		t.Fatal(err)
	}
	var rules struct {
		Groups []struct {
			Rules []struct {
				Alert string `json:"alert"`
				Expr  string `json:"expr"`
			} `json:"rules"`
		} `json:"groups"`
	}
	if err := yaml.Unmarshal(rawRules, &rules); err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, g := range rules.Groups {
		for _, r := range g.Rules {
			n++
			for _, m := range metricName.FindAllString(labelParts.ReplaceAllString(r.Expr, ""), -1) {
				if !drawn[m] {
					t.Errorf("alert %s reads %s, which no panel of kurz.json draws", r.Alert, m)
				}
			}
		}
	}
	if n == 0 {
		t.Fatal("alerts.rules.yaml has no rules")
	}
}

// limiterMetric is a family every limiter exports, the stack's and
// limiter-envoy (deploy/k8s/components/envoy-ratelimit) alike, and
// limiterAggregation an aggregation of it.
var (
	limiterMetric      = regexp.MustCompile(`\b(?:kurz_ratelimit_[a-z0-9_]+|rpc_server_call_duration_seconds_bucket)(\{[^}]*\})?`)
	limiterMethod      = regexp.MustCompile(`CheckQuota|ShouldRateLimit`)
	limiterAggregation = regexp.MustCompile(`\b(?:sum|max|min|avg|count)\s*(?:by\s*\(([^)]*)\)\s*)?\(`)
)

// TestDashboardShowsEachLimiter: the limiter panels draw each limiter on
// its own, as the alerts judge each (by service). A panel that summed
// them would let the stack limiter's traffic hide limiter-envoy's
// failures; one that picked service="limiter" would not show it at all.
// Every query of a limiter metric selects the dashboard's variable
// $limiter (label_values of service) and keeps service in its grouping,
// and the server latency panel draws Envoy's ShouldRateLimit too.
func TestDashboardShowsEachLimiter(t *testing.T) {
	raw, err := os.ReadFile("../../deploy/grafana/kurz.json")
	if err != nil {
		t.Fatal(err)
	}
	var vars struct {
		Templating struct {
			List []struct {
				Name, Type, Definition string
				IncludeAll             bool `json:"includeAll"`
				Multi                  bool `json:"multi"`
			} `json:"list"`
		} `json:"templating"`
	}
	if err := json.Unmarshal(raw, &vars); err != nil {
		t.Fatal(err)
	}
	found := false
	for _, v := range vars.Templating.List {
		if v.Name == "limiter" {
			found = true
			if v.Type != "query" || !strings.HasSuffix(strings.ReplaceAll(v.Definition, " ", ""), ",service)") || !v.IncludeAll || !v.Multi {
				t.Errorf("variable limiter: type %q, definition %q, includeAll %v, multi %v; want a query of label_values(..., service), multi, with All", v.Type, v.Definition, v.IncludeAll, v.Multi)
			}
		}
	}
	if !found {
		t.Error("kurz.json has no template variable limiter")
	}
	shouldRateLimit := false
	for _, p := range loadDashboard(t).Panels {
		for _, tg := range p.Targets {
			ms := limiterMetric.FindAllStringSubmatch(tg.Expr, -1)
			if len(ms) == 0 || strings.Contains(tg.Expr, "rpc_server_call_duration_seconds") && !limiterMethod.MatchString(tg.Expr) {
				continue // not a limiter query (the shortener's latency)
			}
			if strings.Contains(tg.Expr, "ShouldRateLimit") {
				shouldRateLimit = true
			}
			for _, m := range ms {
				if !strings.Contains(m[1], `service=~"$limiter"`) {
					t.Errorf("panel %q: %s does not select service=~\"$limiter\"", p.Title, m[0])
				}
			}
			for _, a := range limiterAggregation.FindAllStringSubmatch(tg.Expr, -1) {
				if !slices.Contains(strings.Fields(strings.ReplaceAll(a[1], ",", " ")), "service") {
					t.Errorf("panel %q: %s aggregates over the limiters (no service in its by)", p.Title, tg.Expr)
				}
			}
		}
	}
	if !shouldRateLimit {
		t.Error("no limiter panel draws ShouldRateLimit, limiter-envoy's calls")
	}
}
