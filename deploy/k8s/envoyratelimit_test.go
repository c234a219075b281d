package k8s

import (
	"bytes"
	"fmt"
	"maps"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	autoscalingv2 "k8s.io/api/autoscaling/v2"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	policyv1 "k8s.io/api/policy/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"sigs.k8s.io/yaml"
)

// envoyComponent is the Envoy-only limiter, added to an overlay's
// components as deploy/k8s/README.md tells operators to; envoyLimiter is
// the name of its Deployment, Services and pods (app.kubernetes.io/name).
const (
	envoyComponent = "components/envoy-ratelimit"
	// envoyAutoscaling adds limiter-envoy's HPA, listed after it.
	envoyAutoscaling = "components/envoy-ratelimit-autoscaling"
	envoyLimiter     = "limiter-envoy"
	// ratelimitClientLabel marks the pods (Envoy) that may call it.
	ratelimitClientLabel = "kurz.dev/ratelimit-client"
)

// envoyOverlays are the overlays the component is rendered on.
var envoyOverlays = []string{"overlays/dev", "overlays/prod"}

// renderWithComponent renders dir with component added to its
// kustomization's components (its operator files in place), once per
// test binary.
func renderWithComponent(t *testing.T, dir, component string) rendering {
	t.Helper()
	return renderWithComponents(t, dir, component)
}

// renderWithComponents is renderWithComponent with several components, in
// their order.
func renderWithComponents(t *testing.T, dir string, components ...string) rendering {
	t.Helper()
	key := dir + " + " + strings.Join(components, " + ")
	return renderOnce(t, key, dir, func() (map[string]string, error) {
		kust, err := os.ReadFile(filepath.Join(dir, "kustomization.yaml"))
		if err != nil {
			return nil, err
		}
		if regexp.MustCompile(`(?m)^components:`).Match(kust) {
			return nil, fmt.Errorf("%s/kustomization.yaml has a components list already: add %v to it here", dir, components)
		}
		files := maps.Clone(operatorFiles[dir])
		if files == nil {
			files = map[string]string{}
		}
		list := "components:\n"
		for _, c := range components {
			list += "  - ../../" + c + "\n"
		}
		files["kustomization.yaml"] = string(kust) + list
		return files, nil
	})
}

// The component on top of dev and prod passes what the overlays pass: the
// API schemas, every object once and in the namespace kurz, the container
// policy, Services that reach declared ports, GOMEMLIMIT under the memory
// limit and the request covering it, and the overlay's own treatment of a
// kurz service (dev: one small replica; prod: replicas, a budget and the
// topology spread).
func TestEnvoyRateLimitComponentPassesTheOverlaysChecks(t *testing.T) {
	t.Parallel()
	for _, dir := range envoyOverlays {
		t.Run(strings.ReplaceAll(dir, "/", "_"), func(t *testing.T) {
			t.Parallel()
			r := renderWithComponent(t, dir, envoyComponent)
			if err := kubeconform(t, r.Raw); err != nil {
				t.Error(err)
			}
			seen := map[string]bool{}
			for _, o := range r.Objects {
				key := o.Kind + "/" + o.Namespace + "/" + o.Name
				if seen[key] {
					t.Errorf("%s rendered twice", key)
				}
				seen[key] = true
				if o.Kind != "Namespace" && o.Namespace != "kurz" {
					t.Errorf("%s is in namespace %q, want kurz", o, o.Namespace)
				}
			}
			for _, p := range append(workloadPolicyProblems(r), servicePortProblems(r)...) {
				t.Error(p)
			}
			d, ok := byName[appsv1.Deployment](r)[envoyLimiter]
			if !ok {
				t.Fatalf("no Deployment %s", envoyLimiter)
			}
			w := workload{"Deployment", d.Name, &d.Spec.Template, d.Spec.Replicas}
			if kurzService(w) != "limiter" {
				t.Errorf("%s runs %s, want the limiter's image", w, d.Spec.Template.Spec.Containers[0].Image)
			}
			c := d.Spec.Template.Spec.Containers[0]
			if p := goMemLimitProblem(c); p != "" {
				t.Errorf("%s: %s", w, p)
			}
			if gml, err := parseGoMemLimit(c.Env[0].Value); err != nil || c.Resources.Requests.Memory().Value() < gml {
				t.Errorf("%s: memory request %s below GOMEMLIMIT %s (%v)", w, c.Resources.Requests.Memory(), c.Env[0].Value, err)
			}
			if sa := d.Spec.Template.Spec.ServiceAccountName; sa != envoyLimiter || byName[corev1.ServiceAccount](r)[sa] == nil {
				t.Errorf("%s: serviceAccountName %q, want its own ServiceAccount %s", w, sa, envoyLimiter)
			}
			replicas := int32(1)
			if d.Spec.Replicas != nil {
				replicas = *d.Spec.Replicas
			}
			if dir == "overlays/dev" && replicas != 1 {
				t.Errorf("dev: %s has %d replicas, want 1 like every dev service", w, replicas)
			}
			if dir != "overlays/prod" {
				return
			}
			if replicas < 2 {
				t.Errorf("prod: %s has %d replicas, want >= 2", w, replicas)
			}
			var covering []string
			for _, p := range typed[policyv1.PodDisruptionBudget](r) {
				if sel, err := metav1.LabelSelectorAsSelector(p.Spec.Selector); err == nil && sel.Matches(labels.Set(d.Spec.Template.Labels)) {
					covering = append(covering, p.Name)
				}
			}
			if len(covering) != 1 {
				t.Errorf("prod: %s is covered by PDBs %v, want exactly one", w, covering)
			}
			spread := d.Spec.Template.Spec.TopologySpreadConstraints
			if len(spread) == 0 {
				t.Errorf("prod: %s has no topology spread (the overlay's patch selects app.kubernetes.io/component=service)", w)
			}
			for _, tsc := range spread {
				if p := tsc.NodeTaintsPolicy; p == nil || *p != corev1.NodeInclusionPolicyHonor {
					t.Errorf("prod: %s: topology spread on %s: nodeTaintsPolicy %v, want Honor", w, tsc.TopologyKey, deref(p))
				}
			}
		})
	}
}

// The component adds a limiter and leaves the stack's as it was: every
// object the overlay renders alone (the limiter's Deployment, ConfigMap,
// Services and policies among them) is rendered byte for byte the same with
// the component, and the component adds only objects of its own.
func TestEnvoyRateLimitComponentLeavesTheStackUnchanged(t *testing.T) {
	t.Parallel()
	for _, dir := range envoyOverlays {
		plain, with := documents(t, render(t, dir).Raw), documents(t, renderWithComponent(t, dir, envoyComponent).Raw)
		if _, ok := plain["Deployment/limiter"]; !ok {
			t.Fatalf("%s renders no Deployment limiter", dir)
		}
		for key, doc := range plain {
			if got, ok := with[key]; !ok {
				t.Errorf("%s: %s is gone with the component", dir, key)
			} else if !bytes.Equal(got, doc) {
				t.Errorf("%s: the component changes %s:\n%s\nwant:\n%s", dir, key, got, doc)
			}
		}
		for key := range with {
			if _, ok := plain[key]; !ok && !strings.Contains(key, envoyLimiter) {
				t.Errorf("%s: the component adds %s, not one of its own (named %s*)", dir, key, envoyLimiter)
			}
		}
	}
}

// documents splits a rendered stream into its documents by kind and name.
func documents(t *testing.T, stream []byte) map[string][]byte {
	t.Helper()
	out := map[string][]byte{}
	for doc := range bytes.SplitSeq(stream, []byte("\n---\n")) {
		obj, err := decodeDoc(doc)
		if err != nil {
			t.Fatal(err)
		}
		out[obj.Kind+"/"+obj.Name] = bytes.TrimSpace(doc)
	}
	return out
}

// limiter-envoy decides on its file alone: the rules of the ConfigMap
// limiter-envoy-rules, mounted read-only, as a directory; no PostgreSQL
// (settings or credentials) and no service-auth key, which the file source
// does not use; the stack's Redis Cluster, under a key prefix and a fleet
// name other than the stack limiter's; its configuration read by the
// limiter, required variables given, credentials from Secrets.
func TestEnvoyRateLimiterReadsItsRulesFromTheConfigMap(t *testing.T) {
	t.Parallel()
	read, any := readEnv(t), readByAny(t)
	for _, dir := range envoyOverlays {
		r := renderWithComponent(t, dir, envoyComponent)
		var envoy, stack serviceEnv
		for _, w := range workloads(r) {
			switch w.Name {
			case envoyLimiter:
				envoy = workloadEnv(read, r, w)
			case "limiter":
				stack = workloadEnv(read, r, w)
			}
		}
		if envoy.Service == "" || stack.Service == "" {
			t.Fatalf("%s: Deployments limiter and %s not both rendered", dir, envoyLimiter)
		}
		// The limiter reads the PostgreSQL settings for its postgres
		// source only: a file source opens no connection, and the
		// loopback default of KURZ_POSTGRES_URL is never dialled.
		envoy.Read = maps.Clone(envoy.Read)
		maps.DeleteFunc(envoy.Read, func(name string, _ envTag) bool { return strings.HasPrefix(name, "KURZ_POSTGRES_") })
		for _, p := range configProblems(envoy, any) {
			t.Errorf("%s: %s: %s", dir, envoyLimiter, p)
		}
		if v, _ := envoy.value("KURZ_LIMITER_RULES_SOURCE"); v != "file" {
			t.Errorf("%s: %s: KURZ_LIMITER_RULES_SOURCE=%q, want file", dir, envoyLimiter, v)
		}
		for name, src := range envoy.Given {
			if strings.HasPrefix(name, "KURZ_POSTGRES_") || strings.HasPrefix(name, "KURZ_SERVICE_AUTH_") {
				t.Errorf("%s: %s gets %s (from %s): with a file source it uses neither PostgreSQL nor the rules admin API", dir, envoyLimiter, name, src.From)
			}
		}
		for _, name := range []string{"KURZ_REDIS_ADDRS", "KURZ_REDIS_PASSWORD"} {
			if e, s := envoy.Given[name], stack.Given[name]; e.From != s.From || e.Value != s.Value || e.From == "" {
				t.Errorf("%s: %s=%q from %s, want the stack limiter's (%q from %s)", dir, name, e.Value, e.From, s.Value, s.From)
			}
		}
		// The key prefix keeps the two limiters' counters apart whatever
		// their domains are called.
		ep, _ := envoy.value("KURZ_LIMITER_REDIS_KEY_PREFIX")
		sp, _ := stack.value("KURZ_LIMITER_REDIS_KEY_PREFIX")
		if ep == sp || strings.ContainsAny(ep, "{} \t\n") {
			t.Errorf("%s: KURZ_LIMITER_REDIS_KEY_PREFIX %q for %s, %q for the stack's: want prefixes that differ, without braces or whitespace, or the two count into the same keys", dir, ep, envoyLimiter, sp)
		}
		ef, _ := envoy.value("KURZ_LIMITER_FLEET")
		sf, _ := stack.value("KURZ_LIMITER_FLEET")
		if ef == sf {
			t.Errorf("%s: both limiters heartbeat as fleet %q: each would count the other's pods", dir, ef)
		}

		file, _ := envoy.value("KURZ_LIMITER_RULES_FILE")
		spec := envoy.Workload.Template.Spec
		var mount *corev1.VolumeMount
		for i, m := range spec.Containers[0].VolumeMounts {
			if path.Clean(m.MountPath) == path.Clean(file) {
				mount = &spec.Containers[0].VolumeMounts[i]
			}
		}
		if mount == nil || !mount.ReadOnly || mount.SubPath != "" {
			t.Fatalf("%s: KURZ_LIMITER_RULES_FILE=%q is not a read-only mount of a whole volume (%+v)", dir, file, mount)
		}
		var vol *corev1.Volume
		for i := range spec.Volumes {
			if spec.Volumes[i].Name == mount.Name {
				vol = &spec.Volumes[i]
			}
		}
		if vol == nil || vol.ConfigMap == nil || vol.ConfigMap.Name != "limiter-envoy-rules" || len(vol.ConfigMap.Items) > 0 {
			t.Errorf("%s: the volume at %s is %+v, want the whole ConfigMap limiter-envoy-rules", dir, file, vol)
		}
		if _, ok := byName[corev1.ConfigMap](r)["limiter-envoy-rules"]; !ok {
			t.Errorf("%s: no ConfigMap limiter-envoy-rules (a hash suffix would rename it)", dir)
		}
	}
}

// Envoy's pods (labelled kurz.dev/ratelimit-client: "true", in any
// namespace) reach limiter-envoy's gRPC port and nothing else of kurz but
// the public ports; no
// other pod reaches it; Prometheus scrapes its port "http"; dev's in-cluster
// Redis takes it; the stack's policies are as before (wantIngress).
func TestEnvoyRateLimitNetworkPolicies(t *testing.T) {
	client := peer{Name: "envoy", Namespace: map[string]string{"kubernetes.io/metadata.name": "edge"}, Pod: map[string]string{ratelimitClientLabel: "true"}}
	sameNamespaceClient := peer{Name: "envoy", Namespace: kurzNamespace, Pod: client.Pod}
	for _, dir := range envoyOverlays {
		t.Run(strings.ReplaceAll(dir, "/", "_"), func(t *testing.T) {
			r := renderWithComponent(t, dir, envoyComponent)
			want := wantIngress(t, r)
			want[envoyLimiter] = map[string][]string{"grpc": nil}
			if dir == "overlays/dev" {
				want[envoyLimiter]["http"] = []string{"prometheus"}
				want["redis"]["redis"] = append(want["redis"]["redis"], envoyLimiter)
				want["otel-collector"]["otlp-grpc"] = append(want["otel-collector"]["otlp-grpc"], envoyLimiter)
			}
			checkNetworkPolicies(t, r, want)

			policies := typed[networkingv1.NetworkPolicy](r)
			for _, w := range workloads(r) {
				for _, cp := range w.Template.Spec.Containers[0].Ports {
					wantIn := w.app() == envoyLimiter && cp.Name == "grpc" || slices.Contains(want[w.app()][cp.Name], "*")
					for _, from := range []peer{client, sameNamespaceClient} {
						if got := admits(policies, w.Template.Labels, cp, from); got != wantIn {
							t.Errorf("%s port %s admits a pod labelled %s=true in namespace %s: %v, want %v", w.app(), cp.Name, ratelimitClientLabel, from.Namespace["kubernetes.io/metadata.name"], got, wantIn)
						}
					}
				}
			}
		})
	}
	readme, err := os.ReadFile("README.md")
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(readme), ratelimitClientLabel+`: "true"`) {
		t.Errorf("deploy/k8s/README.md does not name the label Envoy's pods need, %s: \"true\"", ratelimitClientLabel)
	}
}

// The Prometheus Operator's PodMonitors scrape limiter-envoy as the stack's
// limiter, on its port "http"; the annotations that monitoring/'s scrape
// configuration keeps name that port.
func TestEnvoyRateLimiterIsScraped(t *testing.T) {
	d := byName[appsv1.Deployment](renderWithComponent(t, "overlays/dev", envoyComponent))[envoyLimiter]
	if d == nil {
		t.Fatalf("no Deployment %s", envoyLimiter)
	}
	var ports []string
	for _, pm := range typed[podMonitor](render(t, "monitoring/operator")) {
		sel, err := metav1.LabelSelectorAsSelector(&pm.Spec.Selector)
		if err != nil {
			t.Fatal(err)
		}
		if sel.Matches(labels.Set(d.Spec.Template.Labels)) {
			for _, ep := range pm.Spec.PodMetricsEndpoints {
				ports = append(ports, ep.Port)
			}
		}
	}
	if !slices.Equal(ports, []string{"http"}) {
		t.Errorf("PodMonitors scrape %s on ports %v, want [http]", envoyLimiter, ports)
	}
	ann := d.Spec.Template.Annotations
	if ann["prometheus.io/scrape"] != "true" || ann["prometheus.io/path"] != "/metrics" || ann["prometheus.io/port"] != strconv.Itoa(int(d.Spec.Template.Spec.Containers[0].Ports[1].ContainerPort)) ||
		d.Spec.Template.Spec.Containers[0].Ports[1].Name != "http" {
		t.Errorf("%s: scrape annotations %v, want scrape=true path=/metrics and the port of \"http\"", envoyLimiter, ann)
	}
}

// The sample rules are an envoyproxy/ratelimit configuration the limiter
// takes: the rendered ConfigMap's files, laid out as the kubelet mounts
// them (..data links), go through the limiter's own translator (`limiter
// rules from-envoy DIR`, rulestore.ReadEnvoy as KURZ_LIMITER_RULES_FILE
// reads a directory), each domain limiting something. Their names may be
// the stack limiter's too: the key prefix keeps the two limiters' counters
// apart (TestEnvoyRateLimiterReadsItsRulesFromTheConfigMap).
func TestEnvoyRateLimitSampleRulesAreAccepted(t *testing.T) {
	t.Parallel()
	cm := byName[corev1.ConfigMap](renderWithComponent(t, "overlays/prod", envoyComponent))["limiter-envoy-rules"]
	if cm == nil || len(cm.Data) == 0 {
		t.Fatal("no ConfigMap limiter-envoy-rules with files")
	}
	dir := t.TempDir()
	if err := os.Mkdir(filepath.Join(dir, "..2026_01_01_00_00_00.000000001"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink("..2026_01_01_00_00_00.000000001", filepath.Join(dir, "..data")); err != nil {
		t.Fatal(err)
	}
	for name, content := range cm.Data {
		if err := os.WriteFile(filepath.Join(dir, "..data", name), []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
		if err := os.Symlink(filepath.Join("..data", name), filepath.Join(dir, name)); err != nil {
			t.Fatal(err)
		}
	}

	root := repoRoot(t)
	bin := filepath.Join(t.TempDir(), "limiter")
	build := exec.Command("go", "build", "-o", bin, "./services/limiter")
	build.Dir = root
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("go build ./services/limiter: %v\n%s", err, out)
	}
	var stdout, stderr bytes.Buffer
	cmd := exec.Command(bin, "rules", "from-envoy", dir)
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		t.Fatalf("limiter rules from-envoy refuses limiter-envoy-rules: %v\n%s", err, stderr.String())
	}
	var translated struct {
		Domains map[string]struct {
			Rules []any `json:"rules"`
		} `json:"domains"`
	}
	if err := yaml.Unmarshal(stdout.Bytes(), &translated); err != nil {
		t.Fatal(err)
	}
	if len(translated.Domains) == 0 {
		t.Fatalf("no domain translated from limiter-envoy-rules")
	}
	for name, d := range translated.Domains {
		if len(d.Rules) == 0 {
			t.Errorf("domain %s of limiter-envoy-rules limits nothing", name)
		}
	}
}

// components/envoy-ratelimit-autoscaling, after the component on prod,
// gives limiter-envoy an HPA as the stack limiter's: at least two
// replicas and room above, a metric, the Deployment's replicas left to it
// (a fixed count would reset it on every apply), and the limiter told the
// most replicas there may be (KURZ_LIMITER_MAX_REPLICAS at least the HPA's
// maximum, which its local fallback divides by before it has counted its
// fleet). The result passes prod's checks, the stack is unchanged, and the
// component alone keeps its fixed replicas (dev's one stays one: an HPA
// would raise it to its minimum).
func TestEnvoyRateLimitAutoscalingComponent(t *testing.T) {
	t.Parallel()
	r := renderWithComponents(t, "overlays/prod", envoyComponent, envoyAutoscaling)
	if err := kubeconform(t, r.Raw); err != nil {
		t.Error(err)
	}
	for _, p := range append(workloadPolicyProblems(r), servicePortProblems(r)...) {
		t.Error(p)
	}
	d := byName[appsv1.Deployment](r)[envoyLimiter]
	if d == nil {
		t.Fatalf("no Deployment %s", envoyLimiter)
	}
	if d.Spec.Replicas != nil {
		t.Errorf("Deployment %s sets replicas %d although its HPA owns them", envoyLimiter, *d.Spec.Replicas)
	}
	var hpa *autoscalingv2.HorizontalPodAutoscaler
	for _, h := range typed[autoscalingv2.HorizontalPodAutoscaler](r) {
		if ref := h.Spec.ScaleTargetRef; ref.Kind == "Deployment" && ref.Name == envoyLimiter {
			hpa = h
		}
	}
	if hpa == nil {
		t.Fatalf("no HPA targets Deployment %s", envoyLimiter)
	}
	min := int32(1)
	if hpa.Spec.MinReplicas != nil {
		min = *hpa.Spec.MinReplicas
	}
	if min < 2 || hpa.Spec.MaxReplicas <= min || len(hpa.Spec.Metrics) == 0 {
		t.Errorf("HPA %s: min %d max %d metrics %d, want min >= 2, max > min, a metric", hpa.Name, min, hpa.Spec.MaxReplicas, len(hpa.Spec.Metrics))
	}
	cm := byName[corev1.ConfigMap](r)["limiter-envoy-config"]
	if cm == nil {
		t.Fatal("no ConfigMap limiter-envoy-config")
	}
	if n, err := strconv.Atoi(cm.Data["KURZ_LIMITER_MAX_REPLICAS"]); err != nil || n < int(hpa.Spec.MaxReplicas) {
		t.Errorf("limiter-envoy-config: KURZ_LIMITER_MAX_REPLICAS %q, want at least the HPA's maxReplicas %d", cm.Data["KURZ_LIMITER_MAX_REPLICAS"], hpa.Spec.MaxReplicas)
	}
	plain, with := documents(t, render(t, "overlays/prod").Raw), documents(t, r.Raw)
	for key, doc := range plain {
		if !bytes.Equal(with[key], doc) {
			t.Errorf("the autoscaling component changes the stack's %s", key)
		}
	}
	for _, dir := range envoyOverlays {
		for _, h := range typed[autoscalingv2.HorizontalPodAutoscaler](renderWithComponent(t, dir, envoyComponent)) {
			if h.Spec.ScaleTargetRef.Name == envoyLimiter {
				t.Errorf("%s with %s alone renders HPA %s: dev's one replica would become its minimum", dir, envoyComponent, h.Name)
			}
		}
	}
}
