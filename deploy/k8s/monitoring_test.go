package k8s

import (
	"slices"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/yaml"
)

// promConfig is the part of prometheus.yml the tests read.
type promConfig struct {
	ScrapeConfigs []struct {
		JobName             string `json:"job_name"`
		KubernetesSDConfigs []struct {
			Role       string `json:"role"`
			Namespaces struct {
				Names []string `json:"names"`
			} `json:"namespaces"`
		} `json:"kubernetes_sd_configs"`
		RelabelConfigs []struct {
			SourceLabels []string `json:"source_labels"`
			Action       string   `json:"action"`
			Regex        string   `json:"regex"`
			TargetLabel  string   `json:"target_label"`
		} `json:"relabel_configs"`
	} `json:"scrape_configs"`
}

// The scrape configuration discovers pods in the kurz namespace and follows
// the prometheus.io annotations the service pods carry (TestKurzServices).
func TestPrometheusScrapeConfig(t *testing.T) {
	r := render(t, "monitoring")
	var cfg promConfig
	found := false
	for _, cm := range typed[corev1.ConfigMap](r) {
		if raw, ok := cm.Data["prometheus.yml"]; ok {
			found = true
			if err := yaml.Unmarshal([]byte(raw), &cfg); err != nil {
				t.Fatalf("ConfigMap %s: prometheus.yml: %v", cm.Name, err)
			}
		}
	}
	if !found || len(cfg.ScrapeConfigs) == 0 {
		t.Fatal("no ConfigMap with a prometheus.yml holding scrape_configs")
	}
	for _, sc := range cfg.ScrapeConfigs {
		if len(sc.KubernetesSDConfigs) == 0 {
			t.Errorf("job %s: no kubernetes_sd_configs", sc.JobName)
			continue
		}
		for _, sd := range sc.KubernetesSDConfigs {
			if sd.Role != "pod" || !slices.Equal(sd.Namespaces.Names, []string{"kurz"}) {
				t.Errorf("job %s: role %q namespaces %v, want pod discovery in [kurz]", sc.JobName, sd.Role, sd.Namespaces.Names)
			}
		}
		uses := map[string]string{}
		for _, rc := range sc.RelabelConfigs {
			for _, l := range rc.SourceLabels {
				uses[l] = rc.Action + ">" + rc.TargetLabel
			}
		}
		for label, want := range map[string]string{
			"__meta_kubernetes_pod_annotation_prometheus_io_scrape": "keep>",
			"__meta_kubernetes_pod_annotation_prometheus_io_path":   ">__metrics_path__",
			"__meta_kubernetes_pod_annotation_prometheus_io_port":   ">__address__",
		} {
			got, ok := uses[label]
			action, target, _ := strings.Cut(want, ">")
			if !ok || action != "" && !strings.HasPrefix(got, action+">") || target != "" && !strings.HasSuffix(got, ">"+target) {
				t.Errorf("job %s: %s is not used as %s (got %q)", sc.JobName, label, want, got)
			}
		}
	}
}
