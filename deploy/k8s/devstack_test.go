package k8s

import (
	"net"
	"os"
	"path"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"

	"kurz.dev/pkg/config"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/labels"
	"sigs.k8s.io/yaml"
)

// What `tilt up` (the dev overlay) gives a developer beyond the services:
// the README's first link working as under `make up`, and the
// observability stack (Prometheus with the alert rules, Grafana with the
// dashboard, Jaeger behind the collector).

// firstLinkSettings are the variables the README's "Your first link" relies
// on: the admin token it creates a tenant with, anonymous creation and
// statistics, and the short URLs' base it prints. The dev overlay gives
// them the values make up (deploy/local/services.sh) does.
var firstLinkSettings = map[string][]string{
	"gateway":   {"KURZ_GATEWAY_ADMIN_TOKEN", "KURZ_GATEWAY_ALLOW_ANONYMOUS"},
	"shortener": {"KURZ_SHORTENER_ALLOW_ANONYMOUS", "KURZ_SHORTENER_BASE_URL"},
	"analytics": {"KURZ_ANALYTICS_ALLOW_ANONYMOUS"},
}

func TestDevGivesTheFirstLinkSettingsOfMakeUp(t *testing.T) {
	local := localDefaults(t)
	readme, err := os.ReadFile(filepath.Join(repoRoot(t), "README.md"))
	if err != nil {
		t.Fatal(err)
	}
	for _, dir := range []string{"overlays/dev", "overlays/dev-chcluster"} {
		r := render(t, dir)
		env := serviceEnvironments(t, r)
		secrets := map[string]*corev1.Secret{}
		for _, s := range typed[corev1.Secret](r) {
			secrets[s.Name] = s
		}
		for svc, names := range firstLinkSettings {
			e, ok := env[svc]
			if !ok {
				t.Errorf("%s: no %s Deployment", dir, svc)
				continue
			}
			for _, name := range names {
				want, ok := local[name]
				if !ok {
					t.Errorf("deploy/local/services.sh does not set %s", name)
					continue
				}
				var got string
				switch g := e.Given[name]; {
				case g.Secret != nil:
					if s := secrets[g.Secret.Name]; s != nil {
						got = string(s.Data[g.Secret.Key])
					}
				default:
					got, _ = e.value(name)
				}
				if got != want {
					t.Errorf("%s: %s gets %s=%q, make up gives it %q", dir, svc, name, got, want)
				}
			}
		}
	}
	// The README sets the token the examples use to that same default.
	token := local["KURZ_GATEWAY_ADMIN_TOKEN"]
	if !strings.Contains(string(readme), "KURZ_GATEWAY_ADMIN_TOKEN:-"+token+"}") {
		t.Errorf("README.md does not default KURZ_GATEWAY_ADMIN_TOKEN to %q", token)
	}
}

// devConfigMap returns the rendered ConfigMap whose name is name or name
// plus a generator's hash.
func devConfigMap(t *testing.T, r rendering, name string) *corev1.ConfigMap {
	t.Helper()
	for _, cm := range typed[corev1.ConfigMap](r) {
		if m := hashSuffix.FindStringSubmatch(cm.Name); cm.Name == name || m != nil && m[1] == name {
			return cm
		}
	}
	t.Fatalf("%s: no ConfigMap %s", r.Dir, name)
	return nil
}

// mountedFile is where container c sees key of ConfigMap cm, or "".
func mountedFile(spec corev1.PodSpec, c corev1.Container, cm, key string) string {
	for _, v := range spec.Volumes {
		if v.ConfigMap == nil || v.ConfigMap.Name != cm {
			continue
		}
		file := ""
		if len(v.ConfigMap.Items) == 0 {
			file = key
		}
		for _, it := range v.ConfigMap.Items {
			if it.Key == key {
				file = it.Path
			}
		}
		if file == "" {
			continue
		}
		for _, m := range c.VolumeMounts {
			if m.Name == v.Name && m.SubPath == "" {
				return path.Join(m.MountPath, file)
			}
		}
	}
	return ""
}

func devDeployment(t *testing.T, r rendering, name string) (*appsv1.Deployment, corev1.Container) {
	t.Helper()
	d, ok := byName[appsv1.Deployment](r)[name]
	if !ok {
		t.Fatalf("%s: no Deployment %s", r.Dir, name)
	}
	return d, d.Spec.Template.Spec.Containers[0]
}

// The dev Prometheus scrapes every service's pods on the port their
// prometheus.io/port annotation names, labels them by service as the
// scrape config of monitoring/ does, and loads monitoring/alerts.rules.yaml.
func TestDevPrometheusScrapesEveryServiceAndLoadsTheAlerts(t *testing.T) {
	r := render(t, "overlays/dev")
	d, c := devDeployment(t, r, "prometheus")
	cm := devConfigMap(t, r, "prometheus-config")
	configPath := mountedFile(d.Spec.Template.Spec, c, cm.Name, "prometheus.yml")
	if configPath == "" || !slices.Contains(c.Args, "--config.file="+configPath) {
		t.Errorf("prometheus: args %v do not load %s's prometheus.yml (mounted at %q)", c.Args, cm.Name, configPath)
	}
	var cfg struct {
		Global struct {
			ScrapeInterval     string `json:"scrape_interval"`
			EvaluationInterval string `json:"evaluation_interval"`
		} `json:"global"`
		RuleFiles     []string `json:"rule_files"`
		ScrapeConfigs []struct {
			JobName      string `json:"job_name"`
			MetricsPath  string `json:"metrics_path"`
			DNSSDConfigs []struct {
				Names []string `json:"names"`
				Type  string   `json:"type"`
				Port  int      `json:"port"`
			} `json:"dns_sd_configs"`
			RelabelConfigs []struct {
				SourceLabels []string `json:"source_labels"`
				Regex        string   `json:"regex"`
				TargetLabel  string   `json:"target_label"`
			} `json:"relabel_configs"`
		} `json:"scrape_configs"`
	}
	if err := yaml.UnmarshalStrict([]byte(cm.Data["prometheus.yml"]), &cfg); err != nil {
		t.Fatalf("prometheus.yml: %v", err)
	}

	rules, err := os.ReadFile(rulesFile)
	if err != nil {
		t.Fatal(err)
	}
	// Prometheus's own parser accepts the configuration, with the rules
	// where the pod mounts them.
	dir := t.TempDir()
	ruleCopy := filepath.Join(dir, "kurz.rules.yaml")
	if err := os.WriteFile(ruleCopy, rules, 0o644); err != nil {
		t.Fatal(err)
	}
	promCfg := strings.ReplaceAll(cm.Data["prometheus.yml"], "/etc/prometheus-rules/kurz.rules.yaml", ruleCopy)
	if err := os.WriteFile(filepath.Join(dir, "prometheus.yml"), []byte(promCfg), 0o644); err != nil {
		t.Fatal(err)
	}
	promtool(t, "check", "config", filepath.Join(dir, "prometheus.yml"))
	rulesCM := devConfigMap(t, r, "kurz-prometheus-rules")
	if rulesCM.Data["kurz.rules.yaml"] != string(rules) {
		t.Errorf("ConfigMap %s: kurz.rules.yaml is not %s", rulesCM.Name, rulesFile)
	}
	if p := mountedFile(d.Spec.Template.Spec, c, rulesCM.Name, "kurz.rules.yaml"); p == "" || !slices.Contains(cfg.RuleFiles, p) {
		t.Errorf("prometheus: rule_files %v do not hold the alert rules (mounted at %q)", cfg.RuleFiles, p)
	}

	// Each name resolves (Prometheus appends the pod's search domains) to
	// a headless Service selecting exactly one service's pods.
	headless := byName[corev1.Service](r)
	scraped := map[string]int{} // service -> port
	for _, sc := range cfg.ScrapeConfigs {
		if sc.MetricsPath != "/metrics" {
			t.Errorf("job %s: metrics_path %q, want /metrics", sc.JobName, sc.MetricsPath)
		}
		var relabel *regexp.Regexp
		for _, rc := range sc.RelabelConfigs {
			if rc.TargetLabel == "service" && slices.Equal(rc.SourceLabels, []string{"__meta_dns_name"}) {
				relabel = regexp.MustCompile("^(?:" + rc.Regex + ")$")
			}
		}
		for _, dc := range sc.DNSSDConfigs {
			for _, name := range dc.Names {
				s := headless[name]
				if s == nil || s.Spec.ClusterIP != corev1.ClusterIPNone || !s.Spec.PublishNotReadyAddresses {
					t.Errorf("job %s: %s is not a headless Service publishing every pod", sc.JobName, name)
					continue
				}
				var selected []string
				for _, w := range workloads(r) {
					if labels.SelectorFromSet(s.Spec.Selector).Matches(labels.Set(w.Template.Labels)) {
						selected = append(selected, kurzService(w))
					}
				}
				if len(selected) != 1 || selected[0] == "" || dc.Type != "A" {
					t.Errorf("job %s: %s (type %s) resolves to the pods of %v, want one kurz service's (type A)", sc.JobName, name, dc.Type, selected)
					continue
				}
				svc := selected[0]
				scraped[svc] = dc.Port
				if m := relabel.FindStringSubmatch(name); relabel == nil || m == nil || m[1] != svc {
					t.Errorf("job %s: targets of %s are not labelled service=%s", sc.JobName, name, svc)
				}
			}
		}
	}
	for _, w := range workloads(r) {
		svc := kurzService(w)
		if svc == "" {
			continue
		}
		want, _ := strconv.Atoi(w.Template.Annotations["prometheus.io/port"])
		if got := scraped[svc]; got != want || want == 0 {
			t.Errorf("prometheus scrapes %s on port %d, its pods' prometheus.io/port is %d", svc, got, want)
		}
	}
}

// Grafana has Prometheus (the default) and Jaeger as datasources, both
// resolving in the namespace, and provisions deploy/grafana/kurz.json.
func TestDevGrafanaShowsTheDashboard(t *testing.T) {
	r := render(t, "overlays/dev")
	d, c := devDeployment(t, r, "grafana")
	spec := d.Spec.Template.Spec
	prov := devConfigMap(t, r, "grafana-provisioning")

	var ds struct {
		APIVersion  int `json:"apiVersion"`
		Datasources []struct {
			Name, Type, UID, Access, URL string
			IsDefault                    bool `json:"isDefault"`
		} `json:"datasources"`
	}
	if err := yaml.UnmarshalStrict([]byte(prov.Data["datasources.yaml"]), &ds); err != nil {
		t.Fatalf("datasources.yaml: %v", err)
	}
	types := map[string]bool{}
	for _, s := range ds.Datasources {
		types[s.Type] = true
		host := strings.TrimPrefix(s.URL, "http://")
		if err := resolvesInRendering(r, host); err != nil {
			t.Errorf("datasource %s: %s: %v", s.Name, s.URL, err)
		}
		if s.Type == "prometheus" && !s.IsDefault {
			t.Errorf("datasource %s is not the default: the dashboard's datasource variable picks the default", s.Name)
		}
	}
	if !types["prometheus"] || !types["jaeger"] {
		t.Errorf("datasources %+v, want a prometheus and a jaeger one", ds.Datasources)
	}
	if p := mountedFile(spec, c, prov.Name, "datasources.yaml"); path.Dir(p) != "/etc/grafana/provisioning/datasources" {
		t.Errorf("grafana: datasources.yaml mounted at %q, not in provisioning/datasources", p)
	}

	var providers struct {
		APIVersion int `json:"apiVersion"`
		Providers  []struct {
			Name, Folder, Type string
			DisableDeletion    bool `json:"disableDeletion"`
			Options            struct {
				Path string `json:"path"`
			} `json:"options"`
		} `json:"providers"`
	}
	if err := yaml.UnmarshalStrict([]byte(prov.Data["dashboards.yaml"]), &providers); err != nil {
		t.Fatalf("dashboards.yaml: %v", err)
	}
	if p := mountedFile(spec, c, prov.Name, "dashboards.yaml"); path.Dir(p) != "/etc/grafana/provisioning/dashboards" {
		t.Errorf("grafana: dashboards.yaml mounted at %q, not in provisioning/dashboards", p)
	}
	want, err := os.ReadFile(filepath.Join(repoRoot(t), "deploy", "grafana", "kurz.json"))
	if err != nil {
		t.Fatal(err)
	}
	dash := devConfigMap(t, r, "grafana-dashboards")
	if dash.Data["kurz.json"] != string(want) {
		t.Errorf("ConfigMap %s: kurz.json is not deploy/grafana/kurz.json", dash.Name)
	}
	at := mountedFile(spec, c, dash.Name, "kurz.json")
	provided := false
	for _, p := range providers.Providers {
		provided = provided || p.Type == "file" && p.Options.Path == path.Dir(at)
	}
	if at == "" || !provided {
		t.Errorf("grafana: kurz.json mounted at %q, which no file provider %+v reads", at, providers.Providers)
	}
}

// The services' traces reach Jaeger: KURZ_OTLP_ENDPOINT is the collector,
// whose traces pipeline exports to Jaeger's OTLP port.
func TestDevTracesReachJaeger(t *testing.T) {
	r := render(t, "overlays/dev")
	cm := devConfigMap(t, r, "otel-collector-config")
	var cfg struct {
		Exporters map[string]struct {
			Endpoint string `json:"endpoint"`
		} `json:"exporters"`
		Service struct {
			Pipelines map[string]struct {
				Exporters []string `json:"exporters"`
			} `json:"pipelines"`
		} `json:"service"`
	}
	// Not strict: only the exporters' endpoints are read here.
	if err := yaml.Unmarshal([]byte(cm.Data["config.yaml"]), &cfg); err != nil {
		t.Fatalf("collector config: %v", err)
	}
	toJaeger := false
	for _, name := range cfg.Service.Pipelines["traces"].Exporters {
		ep := cfg.Exporters[name].Endpoint
		host, _, err := net.SplitHostPort(ep)
		if err != nil || host != "jaeger" {
			continue
		}
		if err := resolvesInRendering(r, ep); err != nil {
			t.Errorf("exporter %s: %v", name, err)
			continue
		}
		toJaeger = true
	}
	if !toJaeger {
		t.Errorf("the collector's traces pipeline exports to %v, none of them Jaeger's OTLP port", cfg.Service.Pipelines["traces"].Exporters)
	}
	for svc, e := range serviceEnvironments(t, r) {
		if v, _ := e.value("KURZ_OTLP_ENDPOINT"); v != "otel-collector:4317" {
			t.Errorf("%s: KURZ_OTLP_ENDPOINT=%q, want the collector", svc, v)
		}
	}
}

// The services refuse the secrets this repository publishes
// (config.PublishedSecrets) unless KURZ_ALLOW_PUBLISHED_SECRETS is true. The
// dev overlay's Secrets and make up's defaults are such values: each must
// be on that list (or production would accept it), and both setups must
// allow them (or they would not start).
func TestPublishedSecretsAreRefusedOutsideDev(t *testing.T) {
	published := config.PublishedSecrets()
	for _, dir := range []string{"overlays/dev", "overlays/dev-chcluster"} {
		r := render(t, dir)
		for _, s := range typed[corev1.Secret](r) {
			for k, v := range s.Data {
				// URLs carry a password that is on the list by itself.
				if !strings.Contains(string(v), "://") && !slices.Contains(published, string(v)) {
					t.Errorf("%s: Secret %s key %s holds a value missing from config.PublishedSecrets: production would accept it", dir, s.Name, k)
				}
			}
		}
		for svc, e := range serviceEnvironments(t, r) {
			if _, reads := e.Read[config.AllowPublishedSecrets]; !reads {
				continue
			}
			if v, _ := e.value(config.AllowPublishedSecrets); v != "true" {
				t.Errorf("%s: %s: %s=%q, want \"true\": it is given the dev Secrets' published values", dir, svc, config.AllowPublishedSecrets, v)
			}
		}
	}
	local := localDefaults(t)
	for name, v := range local {
		if secretName.MatchString(name) && !slices.Contains(published, v) {
			t.Errorf("deploy/local/services.sh defaults %s to a value missing from config.PublishedSecrets: production would accept it", name)
		}
	}
	if v := local[config.AllowPublishedSecrets]; v != "true" {
		t.Errorf("deploy/local/services.sh defaults %s to %q, want \"true\": make up gives the services published secrets", config.AllowPublishedSecrets, v)
	}
}

// secretName matches the names of the variables that hold secrets.
var secretName = regexp.MustCompile(`_(KEY|TOKEN|SALT|SECRET|PASSWORD)$`)
