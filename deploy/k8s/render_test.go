// Package k8s holds the tests of kurz's Kubernetes manifests (kustomize base
// and overlays), of the Dockerfile and of the Tiltfile. Nothing here needs a
// cluster or a Docker engine: the overlays are rendered with
// `kubectl kustomize`, validated with kubeconform against the Kubernetes
// API's schemas, decoded into their k8s.io/api types, and the policies are
// checked on those typed objects.
package k8s

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"maps"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	autoscalingv2 "k8s.io/api/autoscaling/v2"
	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	policyv1 "k8s.io/api/policy/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	kjson "sigs.k8s.io/json"
	"sigs.k8s.io/yaml"

	"kurz.dev/pkg/linkimport"
	"kurz.dev/pkg/server"
	"kurz.dev/pkg/testkit/mdblock"
)

// overlays are the kustomizations users apply; monitoring is the optional
// Prometheus scrape configuration.
var overlays = []string{"overlays/dev", "overlays/dev-chcluster", "overlays/prod"}

// services are the kurz services, each a module under services/ and an image
// kurz/<name>.
var services = []string{"limiter", "shortener", "redirect", "analytics", "gateway"}

// publicServices take traffic from outside the cluster on their "http" port;
// their ops routes (/readyz, /metrics, pprof) are on a port of their own,
// "ops", which only the kubelet and Prometheus reach.
var publicServices = []string{"gateway", "redirect"}

// opsPort is the name of the container port svc serves /metrics and its
// probes on.
func opsPort(svc string) string {
	if slices.Contains(publicServices, svc) {
		return "ops"
	}
	return "http"
}

// testServiceAuthEnv is the service-auth.env the tests give the prod
// overlay; like every Secret value rendered here, it says dev-only.
const testServiceAuthEnv = "key=dev-only-test-service-auth-key-0123456789abcdef\n"

// operatorFiles are the files an overlay needs that only its operator can
// write (the overlay refuses to render without them), by overlay and name.
// The tests render a copy of this directory with them in place, holding
// documentation addresses.
var operatorFiles = map[string]map[string]string{
	"overlays/prod": {
		"trusted-proxies.env": "KURZ_GATEWAY_TRUSTED_PROXIES=192.0.2.0/24\nKURZ_REDIRECT_TRUSTED_PROXIES=192.0.2.0/24,2001:db8::/64\n",
		"service-auth.env":    testServiceAuthEnv,
	},
}

// kinds maps apiVersion/kind to a constructor of its typed struct. A rendered
// object of any other kind fails the tests: add it here deliberately.
var kinds = map[string]func() any{
	"v1/Namespace":                             func() any { return &corev1.Namespace{} },
	"v1/ConfigMap":                             func() any { return &corev1.ConfigMap{} },
	"v1/Secret":                                func() any { return &corev1.Secret{} },
	"v1/Service":                               func() any { return &corev1.Service{} },
	"v1/ServiceAccount":                        func() any { return &corev1.ServiceAccount{} },
	"apps/v1/Deployment":                       func() any { return &appsv1.Deployment{} },
	"apps/v1/StatefulSet":                      func() any { return &appsv1.StatefulSet{} },
	"batch/v1/Job":                             func() any { return &batchv1.Job{} },
	"autoscaling/v2/HorizontalPodAutoscaler":   func() any { return &autoscalingv2.HorizontalPodAutoscaler{} },
	"policy/v1/PodDisruptionBudget":            func() any { return &policyv1.PodDisruptionBudget{} },
	"networking.k8s.io/v1/NetworkPolicy":       func() any { return &networkingv1.NetworkPolicy{} },
	"rbac.authorization.k8s.io/v1/Role":        func() any { return &rbacv1.Role{} },
	"rbac.authorization.k8s.io/v1/RoleBinding": func() any { return &rbacv1.RoleBinding{} },
	// The Prometheus Operator's, in monitoring/operator (monitoring_test.go).
	"monitoring.coreos.com/v1/PodMonitor":     func() any { return &podMonitor{} },
	"monitoring.coreos.com/v1/PrometheusRule": func() any { return &prometheusRuleObj{} },
}

// object is one rendered document, decoded.
type object struct {
	APIVersion, Kind, Name, Namespace string
	Obj                               any // pointer to the typed struct
}

func (o object) String() string { return o.Kind + "/" + o.Name }

// rendering is the output of one kustomization, as rendered and decoded.
type rendering struct {
	Dir     string
	Raw     []byte
	Objects []object
}

// repoRoot is the repository root (the directory holding go.mod).
func repoRoot(t testing.TB) string {
	t.Helper()
	root, err := filepath.Abs(filepath.Join("..", ".."))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(root, "go.mod")); err != nil {
		t.Fatalf("repository root %s has no go.mod: %v", root, err)
	}
	return root
}

var renders sync.Map // dir, or dir and components -> *renderResult

type renderResult struct {
	once sync.Once
	r    rendering
	err  error
}

// render runs `kubectl kustomize dir` once per test binary and decodes the
// result. kubectl is required: its absence fails the test.
func render(t testing.TB, dir string) rendering {
	t.Helper()
	return renderOnce(t, dir, dir, func() (map[string]string, error) { return operatorFiles[dir], nil })
}

// renderOnce renders dir with the files files gives laid over it (see
// kustomize), once per test binary for each key: the overlays and the
// overlays with components share the cache.
func renderOnce(t testing.TB, key, dir string, files func() (map[string]string, error)) rendering {
	t.Helper()
	v, _ := renders.LoadOrStore(key, &renderResult{})
	res := v.(*renderResult)
	res.once.Do(func() {
		fs, err := files()
		if err != nil {
			res.err = err
			return
		}
		out, err := kustomize(dir, fs)
		if err != nil {
			res.err = err
			return
		}
		objs, err := decodeStream(out)
		if err != nil {
			res.err = fmt.Errorf("%s: %w", key, err)
			return
		}
		res.r = rendering{Dir: key, Raw: out, Objects: objs}
	})
	if res.err != nil {
		t.Fatal(res.err)
	}
	return res.r
}

// kustomize runs `kubectl kustomize dir`; with files (even none), on a copy
// of this directory's manifests where dir's operator files are exactly
// files (name -> content), whatever a local checkout holds.
func kustomize(dir string, files map[string]string) ([]byte, error) {
	kubectl, err := exec.LookPath("kubectl")
	if err != nil {
		return nil, errors.New("kubectl is not on PATH: these tests render the overlays with `kubectl kustomize`; install kubectl (e.g. apt-get install kubectl, or the upstream binary)")
	}
	root := "."
	if files != nil {
		tmp, err := os.MkdirTemp("", "kurz-k8s-")
		if err != nil {
			return nil, err
		}
		defer os.RemoveAll(tmp)
		// The copy sits where this directory does, beside links to its
		// siblings: overlays/dev takes ../../../grafana.
		siblings, err := os.ReadDir("..")
		if err != nil {
			return nil, err
		}
		for _, s := range siblings {
			if s.Name() == "k8s" {
				continue
			}
			abs, err := filepath.Abs(filepath.Join("..", s.Name()))
			if err != nil {
				return nil, err
			}
			if err := os.Symlink(abs, filepath.Join(tmp, s.Name())); err != nil {
				return nil, err
			}
		}
		tmp = filepath.Join(tmp, "k8s")
		if err := copyManifests(".", tmp); err != nil {
			return nil, err
		}
		for name := range operatorFiles[dir] {
			if err := os.Remove(filepath.Join(tmp, dir, name)); err != nil && !errors.Is(err, fs.ErrNotExist) {
				return nil, err
			}
		}
		for name, content := range files {
			if err := os.WriteFile(filepath.Join(tmp, dir, name), []byte(content), 0o644); err != nil {
				return nil, err
			}
		}
		root = tmp
	}
	cmd := exec.Command(kubectl, "kustomize", filepath.Join(root, dir))
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return nil, fmt.Errorf("kubectl kustomize %s: %v\n%s", dir, err, stderr.String())
	}
	return out, nil
}

// copyManifests copies the kustomizations' files (everything but Go
// sources) from src to dst, keeping the tree.
func copyManifests(src, dst string) error {
	return filepath.WalkDir(src, func(path string, d os.DirEntry, err error) error {
		if err != nil || strings.HasSuffix(path, ".go") {
			return err
		}
		to := filepath.Join(dst, path)
		if d.IsDir() {
			return os.MkdirAll(to, 0o755)
		}
		b, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		return os.WriteFile(to, b, 0o644)
	})
}

// In production the redirect serves the default domain's links only on
// the short URLs' host: a host pointed at it that is not a verified custom
// domain (one deleted, one never registered) gets the 404, not every
// tenant's links.
func TestProdRedirectServesTheDefaultDomainOnItsOwnHost(t *testing.T) {
	r := render(t, "overlays/prod")
	var base, hosts string
	for _, cm := range typed[corev1.ConfigMap](r) {
		switch cm.Name {
		case "shortener-config":
			base = cm.Data["KURZ_SHORTENER_BASE_URL"]
		case "redirect-config":
			hosts = cm.Data["KURZ_REDIRECT_DEFAULT_HOSTS"]
		}
	}
	u, err := url.Parse(base)
	if err != nil || u.Hostname() == "" {
		t.Fatalf("KURZ_SHORTENER_BASE_URL %q: %v", base, err)
	}
	if !slices.Contains(strings.Split(hosts, ","), u.Hostname()) {
		t.Errorf("KURZ_REDIRECT_DEFAULT_HOSTS %q does not name %s, the short URLs' host", hosts, u.Hostname())
	}
}

// Every host the redirect serves the default domain's links on is one the
// shortener refuses as a target (the host of KURZ_SHORTENER_BASE_URL or one
// of KURZ_SHORTENER_OWN_HOSTS): a link to a name the redirect serves but the
// shortener does not know is kurz's would redirect to itself. An overlay
// without KURZ_REDIRECT_DEFAULT_HOSTS serves every host, which no list of
// the shortener's can name; only the redirect's own check (508) and a
// browser's redirect limit stop a loop there.
func TestRedirectDefaultHostsAreShortenerOwnHosts(t *testing.T) {
	for _, dir := range overlays {
		t.Run(dir, func(t *testing.T) {
			var base, own, defaults string
			for _, cm := range typed[corev1.ConfigMap](render(t, dir)) {
				switch cm.Name {
				case "shortener-config":
					base, own = cm.Data["KURZ_SHORTENER_BASE_URL"], cm.Data["KURZ_SHORTENER_OWN_HOSTS"]
				case "redirect-config":
					defaults = cm.Data["KURZ_REDIRECT_DEFAULT_HOSTS"]
				}
			}
			u, err := url.Parse(base)
			if err != nil || u.Hostname() == "" {
				t.Fatalf("KURZ_SHORTENER_BASE_URL %q: %v", base, err)
			}
			known := []string{hostName(u.Hostname())}
			for _, h := range listItems(own) {
				if strings.Contains(h, "://") {
					if u, err := url.Parse(h); err == nil {
						h = u.Hostname()
					}
				}
				known = append(known, hostName(h))
			}
			for _, h := range listItems(defaults) {
				if !slices.Contains(known, hostName(h)) {
					t.Errorf("KURZ_REDIRECT_DEFAULT_HOSTS names %s, which is neither the host of KURZ_SHORTENER_BASE_URL (%s) nor in KURZ_SHORTENER_OWN_HOSTS (%q): add it there, or links to it loop", h, base, own)
				}
			}
		})
	}
}

// listItems splits a comma-separated configuration value as pkg/config
// does: items trimmed, empty ones dropped.
func listItems(v string) []string {
	var items []string
	for item := range strings.SplitSeq(v, ",") {
		if item = strings.TrimSpace(item); item != "" {
			items = append(items, item)
		}
	}
	return items
}

// hostName is h as a host compares: lower-case, without a trailing dot.
func hostName(h string) string {
	return strings.TrimSuffix(strings.ToLower(h), ".")
}

// The prod overlay needs the operator's trusted proxies: without
// trusted-proxies.env it does not render, and whatever the file says is
// what the gateway and the redirect get (the generated ConfigMap itself is
// not rendered).
func TestProdRefusesToRenderWithoutTrustedProxies(t *testing.T) {
	// Every operator file but this one: the failure is about it.
	files := maps.Clone(operatorFiles["overlays/prod"])
	delete(files, "trusted-proxies.env")
	out, err := kustomize("overlays/prod", files)
	if err == nil || !strings.Contains(err.Error(), "trusted-proxies.env") {
		t.Fatalf("overlays/prod rendered without trusted-proxies.env (err %v, %d bytes)", err, len(out))
	}
	r := render(t, "overlays/prod")
	want := map[string]map[string]string{
		"gateway-config":  {"KURZ_GATEWAY_TRUSTED_PROXIES": "192.0.2.0/24"},
		"redirect-config": {"KURZ_REDIRECT_TRUSTED_PROXIES": "192.0.2.0/24,2001:db8::/64"},
	}
	for _, cm := range typed[corev1.ConfigMap](r) {
		if cm.Name == "kurz-trusted-proxies" {
			t.Errorf("ConfigMap %s is rendered; it is local to kustomize", cm.Name)
		}
		for k, v := range want[cm.Name] {
			if got := cm.Data[k]; got != v {
				t.Errorf("%s: %s=%q, want %q from trusted-proxies.env", cm.Name, k, got, v)
			}
			delete(want[cm.Name], k)
		}
	}
	for name, left := range want {
		if len(left) > 0 {
			t.Errorf("ConfigMap %s not rendered with %v", name, left)
		}
	}
}

// decodeStream splits a YAML stream and decodes every document into its
// typed struct, field names case-sensitively as the API server does: unknown
// kinds are errors. Unknown and duplicate fields are kubeconform's
// (TestOverlaysConformToTheAPISchemas).
func decodeStream(data []byte) ([]object, error) {
	reader := utilyaml.NewYAMLReader(bufio.NewReader(bytes.NewReader(data)))
	var objs []object
	var errs []error
	for i := 0; ; i++ {
		doc, err := reader.Read()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return nil, fmt.Errorf("document %d: %w", i, err)
		}
		if len(bytes.TrimSpace(doc)) == 0 {
			continue
		}
		obj, err := decodeDoc(doc)
		if err != nil {
			errs = append(errs, fmt.Errorf("document %d: %w", i, err))
			continue
		}
		objs = append(objs, obj)
	}
	if len(objs) == 0 && len(errs) == 0 {
		return nil, errors.New("no objects rendered")
	}
	return objs, errors.Join(errs...)
}

func decodeDoc(doc []byte) (object, error) {
	var meta struct {
		APIVersion string `json:"apiVersion"`
		Kind       string `json:"kind"`
		Metadata   struct {
			Name      string `json:"name"`
			Namespace string `json:"namespace"`
		} `json:"metadata"`
	}
	if err := yaml.Unmarshal(doc, &meta); err != nil {
		return object{}, err
	}
	id := meta.APIVersion + "/" + meta.Kind
	newObj, ok := kinds[id]
	if !ok {
		return object{}, fmt.Errorf("%s %q: kind not known to the tests (add it to kinds)", id, meta.Metadata.Name)
	}
	js, err := yaml.YAMLToJSON(doc)
	if err != nil {
		return object{}, fmt.Errorf("%s %q: %w", id, meta.Metadata.Name, err)
	}
	// The API machinery's decoder: encoding/json would take "targetport"
	// for targetPort.
	obj := newObj()
	if err := kjson.UnmarshalCaseSensitivePreserveInts(js, obj); err != nil {
		return object{}, fmt.Errorf("%s %q: decode: %w", id, meta.Metadata.Name, err)
	}
	return object{APIVersion: meta.APIVersion, Kind: meta.Kind, Name: meta.Metadata.Name, Namespace: meta.Metadata.Namespace, Obj: obj}, nil
}

// typed returns every rendered object of type T.
func typed[T any](r rendering) []*T {
	var out []*T
	for _, o := range r.Objects {
		if v, ok := o.Obj.(*T); ok {
			out = append(out, v)
		}
	}
	return out
}

// byName returns every rendered object of type T by its name.
func byName[T any, PT interface {
	*T
	GetName() string
}](r rendering) map[string]PT {
	out := map[string]PT{}
	for _, o := range typed[T](r) {
		out[PT(o).GetName()] = o
	}
	return out
}

// workload is anything that runs pods.
type workload struct {
	Kind, Name string
	Template   *corev1.PodTemplateSpec
	Replicas   *int32
}

func (w workload) String() string { return w.Kind + "/" + w.Name }

// app is the app.kubernetes.io/name label of the workload's pods.
func (w workload) app() string { return w.Template.Labels["app.kubernetes.io/name"] }

func workloads(r rendering) []workload {
	var out []workload
	for _, d := range typed[appsv1.Deployment](r) {
		out = append(out, workload{"Deployment", d.Name, &d.Spec.Template, d.Spec.Replicas})
	}
	for _, s := range typed[appsv1.StatefulSet](r) {
		out = append(out, workload{"StatefulSet", s.Name, &s.Spec.Template, s.Spec.Replicas})
	}
	for _, j := range typed[batchv1.Job](r) {
		out = append(out, workload{"Job", j.Name, &j.Spec.Template, nil})
	}
	return out
}

// kurzService returns the service a Deployment runs (its image is
// kurz/<service>, or <registry>/kurz/<service>), or "".
func kurzService(w workload) string {
	if w.Kind != "Deployment" || len(w.Template.Spec.Containers) == 0 {
		return ""
	}
	repo := imageRepo(w.Template.Spec.Containers[0].Image)
	if i := strings.LastIndex(repo, "kurz/"); i == 0 || i > 0 && repo[i-1] == '/' {
		return repo[i+len("kurz/"):]
	}
	return ""
}

// imageRepo is image without its tag or digest (a registry's port stays).
func imageRepo(image string) string {
	image, _, _ = strings.Cut(image, "@")
	if i := strings.LastIndex(image, ":"); i > strings.LastIndex(image, "/") {
		return image[:i]
	}
	return image
}

// kubeconform runs kubeconform -strict on a YAML stream: every object must
// match the schema of its kind in the Kubernetes API the tests decode with
// (k8s.io/api in go.mod), with no unknown or duplicate field. make tools
// installs kubeconform and the schemas (Makefile, deploy/k8s/schemagen).
// skipKinds are kinds without a schema there (CRDs), left to tests of
// their own.
func kubeconform(t *testing.T, stream []byte, skipKinds ...string) error {
	t.Helper()
	root := repoRoot(t)
	makefile, err := os.ReadFile(filepath.Join(root, "Makefile"))
	if err != nil {
		t.Fatal(err)
	}
	m := regexp.MustCompile(`(?m)^K8S_SCHEMA_VERSION\s*:=\s*v1\.(\d+)\.(\d+)$`).FindSubmatch(makefile)
	if m == nil {
		t.Fatal("the Makefile has no K8S_SCHEMA_VERSION := v1.<minor>.<patch>")
	}
	version := fmt.Sprintf("1.%s.%s", m[1], m[2])
	if api := fromGoMod(t, `^\s*k8s\.io/api (v\S+)`); !strings.HasPrefix(api, "v0."+string(m[1])+".") {
		t.Errorf("K8S_SCHEMA_VERSION is Kubernetes %s but go.mod has k8s.io/api %s: keep their minor versions equal", version, api)
	}
	bin, schemas := filepath.Join(root, "bin", "kubeconform"), filepath.Join(root, "bin", "k8s-schemas")
	for _, p := range []string{bin, filepath.Join(schemas, "v"+version+"-standalone-strict")} {
		if _, err := os.Stat(p); err != nil {
			t.Fatalf("%v: run make tools (it installs kubeconform and the Kubernetes %s schemas into bin/)", err, version)
		}
	}
	args := []string{"-strict", "-summary", "-kubernetes-version", version, "-schema-location", schemas}
	if len(skipKinds) > 0 {
		args = append(args, "-skip", strings.Join(skipKinds, ","))
	}
	cmd := exec.Command(bin, append(args, "-")...)
	cmd.Stdin = bytes.NewReader(stream)
	if out, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("kubeconform: %v\n%s", err, out)
	}
	return nil
}

// fromGoMod returns the first group of re, a multi-line pattern, in go.mod.
func fromGoMod(t *testing.T, re string) string {
	t.Helper()
	data, err := os.ReadFile(filepath.Join(repoRoot(t), "go.mod"))
	if err != nil {
		t.Fatal(err)
	}
	m := regexp.MustCompile(`(?m)` + re).FindSubmatch(data)
	if m == nil {
		t.Fatalf("go.mod has no line matching %s", re)
	}
	return string(m[1])
}

func TestOverlaysConformToTheAPISchemas(t *testing.T) {
	t.Parallel() // kubeconform runs beside the Dockerfile's build
	for _, dir := range append(overlays, "monitoring") {
		t.Run(dir, func(t *testing.T) {
			t.Parallel()
			r := render(t, dir)
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
				if o.Kind != "Namespace" && o.Namespace == "" {
					t.Errorf("%s has no namespace", o)
				}
			}
		})
	}
}

func TestOverlaysUseNamespaceKurz(t *testing.T) {
	for _, dir := range overlays {
		r := render(t, dir)
		var ns []string
		for _, o := range r.Objects {
			if o.Kind == "Namespace" {
				ns = append(ns, o.Name)
			} else if o.Namespace != "kurz" {
				t.Errorf("%s: %s is in namespace %q, want kurz", dir, o, o.Namespace)
			}
		}
		if strings.Join(ns, ",") != "kurz" {
			t.Errorf("%s: Namespace objects %v, want [kurz]", dir, ns)
		}
	}
}

// kubeconform must reject what the API server would drop or refuse; this
// proves the strictness the other tests rely on (and the schemas'), and the
// decoder's own refusals.
func TestAPISchemaCheckRejectsMistakes(t *testing.T) {
	t.Parallel()
	// One object each, in YAML's flow style, with the one mistake its name
	// says, and what kubeconform must say about it.
	cases := map[string]struct{ doc, want string }{
		"unknown field": {`{apiVersion: apps/v1, kind: Deployment, metadata: {name: x}, spec: {replica: 2,
			selector: {matchLabels: {app: x}}, template: {metadata: {labels: {app: x}}, spec: {containers: [{name: x, image: "x:1"}]}}}}`,
			"'replica' not allowed"},
		"misplaced field":        {`{apiVersion: v1, kind: Service, metadata: {name: x}, spec: {ports: [{port: 80, targetport: http}]}}`, "'targetport' not allowed"},
		"missing required field": {`{apiVersion: v1, kind: Service, metadata: {name: x}, spec: {ports: [{targetPort: http}]}}`, "missing property 'port'"},
		"wrong type":             {`{apiVersion: v1, kind: Service, metadata: {name: x}, spec: {ports: [{port: eighty}]}}`, "want integer"},
		"unknown kind":           {`{apiVersion: example.com/v1, kind: Widget, metadata: {name: x}}`, "could not find schema for Widget"},
		"duplicate field":        {`{apiVersion: v1, kind: ConfigMap, metadata: {name: x}, data: {A: "1", A: "2"}}`, `key "A" already set`},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			if err := kubeconform(t, []byte(tc.doc)); err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("kubeconform on %s: %v, want an error saying %q", tc.doc, err, tc.want)
			}
		})
	}
	valid := "apiVersion: v1\nkind: Service\nmetadata: {name: x}\nspec:\n  ports: [{port: 80, targetPort: 8080}, {port: 81, targetPort: http}]\n" +
		"---\napiVersion: v1\nkind: Pod\nmetadata: {name: x}\nspec:\n  containers: [{name: x, image: \"x:1\", resources: {limits: {cpu: 1, memory: 128Mi}}}]\n"
	if err := kubeconform(t, []byte(valid)); err != nil {
		t.Errorf("valid Service and Pod (int-or-string ports, numeric and string quantities): %v", err)
	}
	if _, err := decodeStream([]byte(cases["unknown kind"].doc)); err == nil {
		t.Error("decoded a kind not in kinds")
	}
	objs, err := decodeStream([]byte(cases["misplaced field"].doc))
	if err != nil || objs[0].Obj.(*corev1.Service).Spec.Ports[0].TargetPort.StrVal != "" {
		t.Errorf("targetport decoded as targetPort (%v): field names must match case-sensitively", err)
	}
}

// No overlay runs an image of kurz's that Docker Hub could serve: a name
// without a registry host is looked up in Docker Hub's "kurz" namespace,
// which this project does not control, whenever a node lacks the image
// (imagePullPolicy IfNotPresent). Dev names the developer's own local
// registry, prod the operator's.
func TestKurzImagesNameARegistry(t *testing.T) {
	for _, dir := range overlays {
		for _, w := range workloads(render(t, dir)) {
			if kurzService(w) == "" {
				continue
			}
			img := w.Template.Spec.Containers[0].Image
			host, _, _ := strings.Cut(img, "/")
			if !strings.ContainsAny(host, ".:") && host != "localhost" || host == "docker.io" || host == "index.docker.io" {
				t.Errorf("%s: %s runs %s, which Docker Hub would serve: name a registry (overlays/dev: localhost:5001/kurz/...)", dir, w, img)
			}
		}
	}
}

// Production pulls kurz's images from the operator's registry (a
// placeholder to replace), never from Docker Hub's "kurz" namespace, which
// the project does not control; and sends its spans to the off-cluster
// collector over TLS.
func TestProdImagesAndSpansLeaveNothingToStrangers(t *testing.T) {
	r := render(t, "overlays/prod")
	for _, w := range workloads(r) {
		if svc := kurzService(w); svc != "" {
			if img := w.Template.Spec.Containers[0].Image; !strings.HasPrefix(img, "registry.example.internal/kurz/"+svc+":") {
				t.Errorf("%s %s runs %s, want the placeholder registry's kurz/%s", w.Kind, w.Name, img, svc)
			}
		}
	}
	for _, cm := range typed[corev1.ConfigMap](r) {
		if cm.Name == "kurz-common" && cm.Data["KURZ_OTLP_INSECURE"] != "false" {
			t.Errorf("kurz-common: KURZ_OTLP_INSECURE %q, want \"false\" (the collector is off the cluster)", cm.Data["KURZ_OTLP_INSECURE"])
		}
	}
}

// The README's Ingress for the gateway is valid and lets through the
// largest bodies the gateway takes (an import's 10,000 rows of 2 KiB):
// ingress-nginx's default of 1m answers batches and imports 413 itself.
func TestReadmeIngressPassesTheGatewaysLargestBodies(t *testing.T) {
	var example []byte
	for _, b := range mdblock.In(mdblock.Read(t, "README.md"), "", "yaml") {
		if strings.Contains(b.Code, "kind: Ingress\n") {
			example = []byte(b.Code)
		}
	}
	if example == nil {
		t.Fatal("deploy/k8s/README.md has no ```yaml block with an Ingress")
	}
	if err := kubeconform(t, example); err != nil {
		t.Error(err)
	}
	var ing networkingv1.Ingress
	if err := yaml.UnmarshalStrict(example, &ing); err != nil {
		t.Fatal(err)
	}
	size := ing.Annotations["nginx.ingress.kubernetes.io/proxy-body-size"]
	q, err := resource.ParseQuantity(strings.TrimSuffix(size, "m") + "Mi")
	if !strings.HasSuffix(size, "m") || err != nil {
		t.Fatalf("proxy-body-size %q, want <n>m", size)
	}
	if largest := int64(linkimport.MaxRows * 2 << 10); q.Value() <= largest {
		t.Errorf("proxy-body-size %s is not above the gateway's largest body (%d bytes, an import)", size, largest)
	}
	if s, _ := strconv.Atoi(ing.Annotations["nginx.ingress.kubernetes.io/proxy-read-timeout"]); time.Duration(s)*time.Second <= server.DefaultWriteTimeout {
		t.Errorf("proxy-read-timeout %q: want more seconds than the gateway's write timeout %s", ing.Annotations["nginx.ingress.kubernetes.io/proxy-read-timeout"], server.DefaultWriteTimeout)
	}
}
