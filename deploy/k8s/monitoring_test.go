package k8s

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"os"
	"slices"
	"strings"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	kjson "sigs.k8s.io/json"
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

// podMonitor is the part of the Prometheus Operator's PodMonitor
// (monitoring.coreos.com/v1) that monitoring/operator uses, field for field
// as its CRD names them: TestMonitoringForThePrometheusOperator decodes
// strictly into it, in place of a kubeconform schema.
type podMonitor struct {
	APIVersion        string `json:"apiVersion"`
	Kind              string `json:"kind"`
	metav1.ObjectMeta `json:"metadata"`
	Spec              struct {
		NamespaceSelector struct {
			MatchNames []string `json:"matchNames"`
		} `json:"namespaceSelector"`
		Selector            metav1.LabelSelector `json:"selector"`
		PodMetricsEndpoints []struct {
			Port        string `json:"port"`
			Path        string `json:"path"`
			Interval    string `json:"interval"`
			Relabelings []struct {
				SourceLabels []string `json:"sourceLabels"`
				TargetLabel  string   `json:"targetLabel"`
			} `json:"relabelings"`
		} `json:"podMetricsEndpoints"`
	} `json:"spec"`
}

// prometheusRuleObj is the Prometheus Operator's PrometheusRule: a rules
// file's groups under spec.
type prometheusRuleObj struct {
	APIVersion        string `json:"apiVersion"`
	Kind              string `json:"kind"`
	metav1.ObjectMeta `json:"metadata"`
	Spec              ruleGroups `json:"spec"`
}

// The ConfigMap kurz-prometheus-rules carries the rules file as it is.
func TestPrometheusRulesConfigMap(t *testing.T) {
	want, err := os.ReadFile(rulesFile)
	if err != nil {
		t.Fatal(err)
	}
	cm := byName[corev1.ConfigMap](render(t, "monitoring"))["kurz-prometheus-rules"]
	if cm == nil {
		t.Fatal("monitoring renders no ConfigMap kurz-prometheus-rules")
	}
	if cm.Namespace != "monitoring" || cm.Data["kurz.rules.yaml"] != string(want) {
		t.Errorf("ConfigMap %s/kurz-prometheus-rules: keys %v; want kurz.rules.yaml holding %s, in namespace monitoring", cm.Namespace, slices.Collect(maps.Keys(cm.Data)), rulesFile)
	}
}

// monitoring/operator: the PodMonitors scrape every service on the port its
// prometheus.io annotations name (http, or ops on gateway and redirect, never
// the public http of those), label its series with service as the scrape
// config does, and the PrometheusRule holds the rules file's groups. The CRD
// kinds have no schema in bin/k8s-schemas: kubeconform skips them and they
// are decoded strictly into the structs above instead.
func TestMonitoringForThePrometheusOperator(t *testing.T) {
	r := render(t, "monitoring/operator")
	if err := kubeconform(t, r.Raw, "PodMonitor", "PrometheusRule"); err != nil {
		t.Error(err)
	}
	reader := utilyaml.NewYAMLReader(bufio.NewReader(bytes.NewReader(r.Raw)))
	for {
		doc, err := reader.Read()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		js, err := yaml.YAMLToJSON(doc)
		if err != nil {
			t.Fatal(err)
		}
		obj, err := decodeDoc(doc)
		if err != nil {
			t.Fatal(err)
		}
		strict, err := kjson.UnmarshalStrict(js, kinds[obj.APIVersion+"/"+obj.Kind]())
		if err != nil || len(strict) > 0 {
			t.Errorf("%s: %v %v", obj, err, strict)
		}
		if obj.Namespace != "monitoring" {
			t.Errorf("%s in namespace %q, want monitoring", obj, obj.Namespace)
		}
	}

	deployments := byName[appsv1.Deployment](render(t, "overlays/dev"))
	for _, svc := range services {
		var ports []string
		for _, pm := range typed[podMonitor](r) {
			sel, err := metav1.LabelSelectorAsSelector(&pm.Spec.Selector)
			if err != nil {
				t.Fatalf("PodMonitor %s: %v", pm.Name, err)
			}
			d := deployments[svc]
			if d == nil {
				t.Fatalf("overlays/dev has no Deployment %s", svc)
			}
			if !sel.Matches(labels.Set(d.Spec.Template.Labels)) {
				continue
			}
			if !slices.Equal(pm.Spec.NamespaceSelector.MatchNames, []string{"kurz"}) {
				t.Errorf("PodMonitor %s: namespaces %v, want [kurz]", pm.Name, pm.Spec.NamespaceSelector.MatchNames)
			}
			for _, ep := range pm.Spec.PodMetricsEndpoints {
				ports = append(ports, ep.Port)
				if ep.Path != d.Spec.Template.Annotations["prometheus.io/path"] {
					t.Errorf("PodMonitor %s: path %q, the pods' annotation says %q", pm.Name, ep.Path, d.Spec.Template.Annotations["prometheus.io/path"])
				}
				labelled := slices.ContainsFunc(ep.Relabelings, func(rl struct {
					SourceLabels []string `json:"sourceLabels"`
					TargetLabel  string   `json:"targetLabel"`
				}) bool {
					return rl.TargetLabel == "service" && slices.Equal(rl.SourceLabels, []string{"__meta_kubernetes_pod_label_app_kubernetes_io_name"})
				})
				if !labelled {
					t.Errorf("PodMonitor %s: port %s: no relabeling of the pod's app.kubernetes.io/name into service", pm.Name, ep.Port)
				}
			}
		}
		if !slices.Equal(ports, []string{opsPort(svc)}) {
			t.Errorf("%s is scraped on ports %v, want [%s]", svc, ports, opsPort(svc))
		}
		if !slices.ContainsFunc(deployments[svc].Spec.Template.Spec.Containers[0].Ports, func(p corev1.ContainerPort) bool {
			return p.Name == opsPort(svc) && p.ContainerPort == annotatedPort(deployments[svc])
		}) {
			t.Errorf("%s: no container port %s on the prometheus.io/port annotation's number", svc, opsPort(svc))
		}
	}

	rules := typed[prometheusRuleObj](r)
	if len(rules) != 1 {
		t.Fatalf("%d PrometheusRules, want 1", len(rules))
	}
	got, _ := json.Marshal(rules[0].Spec)
	want, _ := json.Marshal(readRules(t))
	if !bytes.Equal(got, want) {
		t.Errorf("PrometheusRule %s does not hold the groups of %s", rules[0].Name, rulesFile)
	}
}

// annotatedPort is the number the Deployment's prometheus.io/port names.
func annotatedPort(d *appsv1.Deployment) int32 {
	var n int32
	_, _ = fmt.Sscan(d.Spec.Template.Annotations["prometheus.io/port"], &n)
	return n
}
