package k8s

import (
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"reflect"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/labels"
)

// envPrefix starts every variable kurz reads (kurz.dev/pkg/config.Prefix;
// TestEnvPrefixMatchesConfigPackage keeps the two equal).
const envPrefix = "KURZ_"

// envTag is one variable a kurz config struct declares with `env:"NAME"`.
type envTag struct {
	Name       string // with the prefix
	Default    string
	HasDefault bool
	Where      string
}

var (
	envScanOnce sync.Once
	envScan     map[string]map[string]envTag // service -> variable -> tag
	envScanErr  error
)

// readEnv returns, per service, the variables it reads: the env tags in its
// own module and in the kurz.dev/pkg packages it imports, transitively.
func readEnv(t testing.TB) map[string]map[string]envTag {
	t.Helper()
	root := repoRoot(t)
	envScanOnce.Do(func() {
		envScan = map[string]map[string]envTag{}
		for _, svc := range services {
			vars, err := scanEnv(root, svc)
			if err != nil {
				envScanErr = err
				return
			}
			envScan[svc] = vars
		}
	})
	if envScanErr != nil {
		t.Fatal(envScanErr)
	}
	return envScan
}

// readByAny is every variable some service reads.
func readByAny(t testing.TB) map[string]bool {
	all := map[string]bool{}
	for _, vars := range readEnv(t) {
		for name := range vars {
			all[name] = true
		}
	}
	return all
}

func scanEnv(root, svc string) (map[string]envTag, error) {
	// From the service's main package, follow its imports inside its own
	// module and into kurz.dev/pkg: other main packages of the module (tools
	// under cmd/) and test-only imports do not count.
	own := "kurz.dev/services/" + svc + "/"
	queue := []string{filepath.Join(root, "services", svc)}
	vars := map[string]envTag{}
	seen := map[string]bool{}
	fset := token.NewFileSet()
	for len(queue) > 0 {
		dir := queue[0]
		queue = queue[1:]
		if seen[dir] {
			continue
		}
		seen[dir] = true
		entries, err := os.ReadDir(dir)
		if err != nil {
			return nil, fmt.Errorf("%s imports a package that is not in the repository: %w", svc, err)
		}
		for _, e := range entries {
			if e.IsDir() || !strings.HasSuffix(e.Name(), ".go") || strings.HasSuffix(e.Name(), "_test.go") {
				continue
			}
			f, err := parser.ParseFile(fset, filepath.Join(dir, e.Name()), nil, parser.SkipObjectResolution)
			if err != nil {
				return nil, err
			}
			for _, imp := range f.Imports {
				path, _ := strconv.Unquote(imp.Path.Value)
				if rest, ok := strings.CutPrefix(path, "kurz.dev/pkg/"); ok {
					queue = append(queue, filepath.Join(root, "pkg", filepath.FromSlash(rest)))
				} else if rest, ok := strings.CutPrefix(path, own); ok {
					queue = append(queue, filepath.Join(root, "services", svc, filepath.FromSlash(rest)))
				}
			}
			ast.Inspect(f, func(n ast.Node) bool {
				field, ok := n.(*ast.Field)
				if !ok || field.Tag == nil {
					return true
				}
				raw, err := strconv.Unquote(field.Tag.Value)
				if err != nil {
					return true
				}
				tag := reflect.StructTag(raw)
				name, ok := tag.Lookup("env")
				if !ok {
					return true
				}
				def, hasDef := tag.Lookup("default")
				v := envTag{Name: envPrefix + name, Default: def, HasDefault: hasDef, Where: fset.Position(field.Pos()).String()}
				if old, dup := vars[v.Name]; dup && old.HasDefault && !v.HasDefault {
					vars[v.Name] = v // required somewhere wins
				} else if !dup {
					vars[v.Name] = v
				}
				return true
			})
		}
	}
	if len(vars) == 0 {
		return nil, fmt.Errorf("no env tags found for %s: has the config package changed?", svc)
	}
	return vars, nil
}

func TestEnvPrefixMatchesConfigPackage(t *testing.T) {
	src, err := os.ReadFile(filepath.Join(repoRoot(t), "pkg", "config", "config.go"))
	if err != nil {
		t.Fatal(err)
	}
	if want := `const Prefix = "` + envPrefix + `"`; !strings.Contains(string(src), want) {
		t.Errorf("pkg/config/config.go no longer has %s", want)
	}
	vars := readEnv(t)
	for _, want := range []struct{ svc, name string }{
		{"limiter", "KURZ_REDIS_ADDRS"}, {"limiter", "KURZ_SHUTDOWN_TIMEOUT"}, {"limiter", "KURZ_LOG_FORMAT"},
		{"shortener", "KURZ_POSTGRES_URL"}, {"analytics", "KURZ_CLICKHOUSE_ADDRS"}, {"gateway", "KURZ_SHORTENER_GRPC_ADDR"},
	} {
		if _, ok := vars[want.svc][want.name]; !ok {
			t.Errorf("the source scan misses %s for %s", want.name, want.svc)
		}
	}
	if _, ok := vars["gateway"]["KURZ_REDIS_ADDRS"]; ok {
		t.Error("the source scan says the gateway reads KURZ_REDIS_ADDRS; it imports no Redis package")
	}
}

// envSource is where a container's variable comes from.
type envSource struct {
	Value  string                    // literal or ConfigMap value
	From   string                    // "configmap <name>", "env", "secret <name>/<key>"
	Secret *corev1.SecretKeySelector // set for secretKeyRef
}

// serviceEnv is what one kurz service reads and what its container is given.
type serviceEnv struct {
	Service  string
	Workload workload
	Read     map[string]envTag
	Given    map[string]envSource
	Problems []string
}

// value is the effective value of a variable: given, else the default.
func (e serviceEnv) value(name string) (string, bool) {
	if g, ok := e.Given[name]; ok && g.Secret == nil && g.Value != "" {
		return g.Value, true
	}
	if tag, ok := e.Read[name]; ok && tag.HasDefault {
		return tag.Default, true
	}
	return "", false
}

func (e serviceEnv) duration(name string) (time.Duration, error) {
	v, ok := e.value(name)
	if !ok {
		return 0, fmt.Errorf("%s is neither given nor defaulted", name)
	}
	d, err := time.ParseDuration(v)
	if err != nil {
		return 0, fmt.Errorf("%s=%q: %v", name, v, err)
	}
	return d, nil
}

// serviceEnvironments resolves, for every kurz Deployment of a rendering, the
// environment its container gets (envFrom ConfigMaps in order, then env).
func serviceEnvironments(t testing.TB, r rendering) map[string]serviceEnv {
	read := readEnv(t)
	out := map[string]serviceEnv{}
	for _, w := range workloads(r) {
		if svc := kurzService(w); svc != "" {
			out[svc] = workloadEnv(read, r, w)
		}
	}
	return out
}

// workloadEnv resolves the environment of the container of w, a Deployment
// of a kurz service's image, as serviceEnvironments does.
func workloadEnv(read map[string]map[string]envTag, r rendering, w workload) serviceEnv {
	cms := byName[corev1.ConfigMap](r)
	svc := kurzService(w)
	e := serviceEnv{Service: svc, Workload: w, Read: read[svc], Given: map[string]envSource{}}
	c := w.Template.Spec.Containers[0]
	for _, from := range c.EnvFrom {
		switch {
		case from.ConfigMapRef != nil:
			cm, ok := cms[from.ConfigMapRef.Name]
			if !ok {
				if from.ConfigMapRef.Optional == nil || !*from.ConfigMapRef.Optional {
					e.Problems = append(e.Problems, "envFrom ConfigMap "+from.ConfigMapRef.Name+" is not rendered")
				}
				continue
			}
			for k, v := range cm.Data {
				e.Given[from.Prefix+k] = envSource{Value: v, From: "configmap " + cm.Name}
			}
		case from.SecretRef != nil:
			e.Problems = append(e.Problems, "envFrom Secret "+from.SecretRef.Name+": name each secret variable with secretKeyRef instead")
		}
	}
	for _, ev := range c.Env {
		switch {
		case ev.ValueFrom == nil:
			e.Given[ev.Name] = envSource{Value: ev.Value, From: "env"}
		case ev.ValueFrom.SecretKeyRef != nil:
			ref := ev.ValueFrom.SecretKeyRef
			e.Given[ev.Name] = envSource{From: "secret " + ref.Name + "/" + ref.Key, Secret: ref}
		case ev.ValueFrom.ConfigMapKeyRef != nil:
			ref := ev.ValueFrom.ConfigMapKeyRef
			cm, ok := cms[ref.Name]
			if !ok {
				e.Problems = append(e.Problems, "env "+ev.Name+": ConfigMap "+ref.Name+" is not rendered")
				continue
			}
			e.Given[ev.Name] = envSource{Value: cm.Data[ref.Key], From: "configmap " + ref.Name}
		default:
			e.Given[ev.Name] = envSource{From: "env (downward API)"}
		}
	}
	return e
}

// secretVariable says whether a variable holds a credential, which must come
// from a Secret and never from a ConfigMap or a literal.
// The last word of the name decides: KURZ_REDIS_PASSWORD is one,
// KURZ_REDIRECT_PASSWORD_LIMITER_TIMEOUT is not.
func secretVariable(name string) bool {
	switch name[strings.LastIndexByte(name, '_')+1:] {
	case "PASSWORD", "SECRET", "TOKEN", "SALT", "KEY":
		return true
	}
	return name == "KURZ_POSTGRES_URL"
}

// configProblems checks one service's environment against what it reads.
func configProblems(e serviceEnv, readByAny map[string]bool) []string {
	p := slices.Clone(e.Problems)
	for name, tag := range e.Read {
		_, given := e.Given[name]
		switch {
		case !given && !tag.HasDefault:
			p = append(p, fmt.Sprintf("%s is required (no default, %s) but neither a ConfigMap nor a secretKeyRef provides it", name, tag.Where))
		case !given && loopback.MatchString(tag.Default):
			p = append(p, fmt.Sprintf("%s is not set and its default %q (%s) is this pod's loopback, which serves nothing in Kubernetes", name, tag.Default, tag.Where))
		}
	}
	for name, src := range e.Given {
		if !strings.HasPrefix(name, envPrefix) {
			continue
		}
		if !readByAny[name] {
			p = append(p, fmt.Sprintf("%s (from %s) is read by no kurz service: a typo?", name, src.From))
		}
		if secretVariable(name) && src.Secret == nil {
			p = append(p, fmt.Sprintf("%s is a credential but comes from %s, not a Secret", name, src.From))
		}
	}
	return p
}

func TestServiceConfiguration(t *testing.T) {
	t.Parallel() // renders both overlays: overlap it with the slow tests
	any := readByAny(t)
	for _, dir := range overlays {
		r := render(t, dir)
		envs := serviceEnvironments(t, r)
		for _, svc := range services {
			e, ok := envs[svc]
			if !ok {
				t.Errorf("%s: no Deployment runs kurz/%s", dir, svc)
				continue
			}
			for _, p := range configProblems(e, any) {
				t.Errorf("%s: %s: %s", dir, svc, p)
			}
			// The listen addresses must be given (the defaults are loopback)
			// and match the container ports.
			c := e.Workload.Template.Spec.Containers[0]
			kinds := []string{"grpc", "http"}
			if opsPort(svc) != "http" {
				kinds = append(kinds, opsPort(svc))
			}
			for _, kind := range kinds {
				name := envPrefix + strings.ToUpper(svc) + "_" + strings.ToUpper(kind) + "_ADDR"
				g, ok := e.Given[name]
				if !ok {
					t.Errorf("%s: %s: %s is not set; its default listens on loopback only", dir, svc, name)
					continue
				}
				host, port, err := net.SplitHostPort(g.Value)
				if err != nil || (host != "" && host != "0.0.0.0" && host != "::") {
					t.Errorf("%s: %s: %s=%q, want :PORT", dir, svc, name, g.Value)
					continue
				}
				n, _ := strconv.Atoi(port)
				found := false
				for _, cp := range c.Ports {
					found = found || cp.Name == kind && int(cp.ContainerPort) == n
				}
				if !found {
					t.Errorf("%s: %s: %s=%q but the container port %q is not %s", dir, svc, name, g.Value, kind, port)
				}
			}
			// Dial targets of other kurz services resolve to a Service of
			// theirs, on their gRPC port.
			for _, other := range services {
				name := envPrefix + strings.ToUpper(other) + "_GRPC_ADDR"
				if other == svc {
					continue
				}
				g, given := e.Given[name]
				if _, reads := e.Read[name]; reads && !given {
					t.Errorf("%s: %s reads %s but it is not set; its default is loopback", dir, svc, name)
				}
				if given {
					if err := dialsService(r, g.Value, other); err != nil {
						t.Errorf("%s: %s: %s=%q: %v", dir, svc, name, g.Value, err)
					}
				}
			}
			if v, _ := e.value("KURZ_VERSION"); !strings.HasSuffix(c.Image, ":"+v) {
				t.Errorf("%s: %s: KURZ_VERSION %q differs from the image tag of %s", dir, svc, v, c.Image)
			}
		}
		// Every KURZ_* key of every ConfigMap is read by some service and
		// reaches a kurz container.
		used := map[string]bool{}
		for _, w := range workloads(r) {
			for _, c := range allContainers(&w.Template.Spec) {
				for _, from := range c.EnvFrom {
					if from.ConfigMapRef != nil {
						used[from.ConfigMapRef.Name] = true
					}
				}
				for _, ev := range c.Env {
					if ev.ValueFrom != nil && ev.ValueFrom.ConfigMapKeyRef != nil {
						used[ev.ValueFrom.ConfigMapKeyRef.Name] = true
					}
				}
			}
			for _, v := range w.Template.Spec.Volumes {
				if v.ConfigMap != nil {
					used[v.ConfigMap.Name] = true
				}
			}
		}
		for _, cm := range typed[corev1.ConfigMap](r) {
			if !used[cm.Name] {
				t.Errorf("%s: ConfigMap %s is used by no workload", dir, cm.Name)
			}
			for k := range cm.Data {
				if strings.HasPrefix(k, envPrefix) && !any[k] {
					t.Errorf("%s: ConfigMap %s sets %s, which no kurz service reads (typo?)", dir, cm.Name, k)
				}
			}
		}
	}
}

func TestConfigCheckCatchesMistakes(t *testing.T) {
	e := serviceEnv{
		Service: "x",
		Read: map[string]envTag{
			"KURZ_NEEDED":   {Name: "KURZ_NEEDED", Where: "x.go:1"},
			"KURZ_OPTIONAL": {Name: "KURZ_OPTIONAL", HasDefault: true},
			"KURZ_DB_URL":   {Name: "KURZ_DB_URL", HasDefault: true, Default: "postgres://u:p@127.0.0.1:5433/x"},
		},
		Given: map[string]envSource{
			"KURZ_OPTINAL":            {Value: "1", From: "configmap x"},
			"KURZ_REDIS_PASSWORD":     {Value: "hunter2", From: "configmap x"},
			"KURZ_X_SALT":             {Value: "pepper", From: "configmap x"},
			"KURZ_X_PASSWORD_TIMEOUT": {Value: "1s", From: "configmap x"},
		},
	}
	known := map[string]bool{"KURZ_NEEDED": true, "KURZ_OPTIONAL": true, "KURZ_REDIS_PASSWORD": true, "KURZ_X_SALT": true, "KURZ_X_PASSWORD_TIMEOUT": true}
	got := strings.Join(configProblems(e, known), "\n")
	for _, want := range []string{"KURZ_NEEDED is required", "KURZ_OPTINAL (from configmap x) is read by no kurz service", "KURZ_REDIS_PASSWORD is a credential", "KURZ_X_SALT is a credential", "KURZ_DB_URL is not set and its default"} {
		if !strings.Contains(got, want) {
			t.Errorf("problems:\n%s\ndo not mention %q", got, want)
		}
	}
	// A timeout named after what it guards is no credential.
	if strings.Contains(got, "KURZ_X_PASSWORD_TIMEOUT is a credential") {
		t.Errorf("problems:\n%s\ncall a timeout a credential", got)
	}
}

// dialsService checks that a gRPC target (host:port or dns:///host:port)
// names a rendered Service that selects the pods of service svc and has the
// port.
func dialsService(r rendering, target, svc string) error {
	hostport := target
	if rest, ok := strings.CutPrefix(target, "dns:///"); ok {
		hostport = rest
	} else if strings.Contains(target, "://") {
		return fmt.Errorf("unsupported target scheme")
	}
	host, port, err := net.SplitHostPort(hostport)
	if err != nil {
		return err
	}
	name := strings.TrimSuffix(host, "."+clusterDomain)
	if strings.Contains(name, ".") {
		return fmt.Errorf("host %q is not a Service of this namespace", host)
	}
	var pods labels.Set
	for _, w := range workloads(r) {
		if kurzService(w) == svc {
			pods = w.Template.Labels
		}
	}
	for _, s := range typed[corev1.Service](r) {
		if s.Name != name {
			continue
		}
		if !labels.SelectorFromSet(s.Spec.Selector).Matches(pods) || len(s.Spec.Selector) == 0 {
			return fmt.Errorf("Service %s does not select %s's pods", name, svc)
		}
		for _, p := range s.Spec.Ports {
			if strconv.Itoa(int(p.Port)) == port {
				return nil
			}
		}
		return fmt.Errorf("Service %s has no port %s", name, port)
	}
	return fmt.Errorf("no Service %q is rendered", name)
}

// clusterDomain is the DNS suffix of the kurz namespace; names may carry it.
const clusterDomain = "kurz.svc.cluster.local"

// The dev endpoints point at what the dev overlays run.
func TestDevEndpointsResolveInTheNamespace(t *testing.T) {
	for _, dir := range []string{"overlays/dev", "overlays/dev-chcluster"} {
		devEndpointsResolve(t, render(t, dir))
	}
}

func devEndpointsResolve(t *testing.T, r rendering) {
	envs := serviceEnvironments(t, r)
	secrets := byName[corev1.Secret](r)
	for _, svc := range services {
		e := envs[svc]
		var endpoints []string
		for _, name := range []string{"KURZ_REDIS_ADDRS", "KURZ_CLICKHOUSE_ADDRS", "KURZ_OTLP_ENDPOINT"} {
			if _, reads := e.Read[name]; !reads {
				continue
			}
			v, _ := e.value(name)
			if v == "" {
				t.Errorf("%s: %s: %s is empty", r.Dir, svc, name)
			}
			for item := range strings.SplitSeq(v, ",") {
				endpoints = append(endpoints, strings.TrimSpace(item))
			}
		}
		if g, ok := e.Given["KURZ_POSTGRES_URL"]; ok && g.Secret != nil {
			s, ok := secrets[g.Secret.Name]
			if !ok {
				t.Errorf("%s: %s: Secret %s is not rendered", r.Dir, svc, g.Secret.Name)
				continue
			}
			raw := string(s.Data[g.Secret.Key]) + s.StringData[g.Secret.Key]
			u, err := url.Parse(raw)
			if err != nil || u.Port() == "" {
				t.Errorf("%s: %s: KURZ_POSTGRES_URL %q: want postgres://user:password@host:port/db", r.Dir, svc, raw)
				continue
			}
			endpoints = append(endpoints, u.Host)
		}
		for _, ep := range endpoints {
			if err := resolvesInRendering(r, ep); err != nil {
				t.Errorf("%s: %s: endpoint %s: %v", r.Dir, svc, ep, err)
			}
		}
	}
}

// resolvesInRendering checks host:port against the rendered Services and
// StatefulSet pods (pod.headless-service names).
func resolvesInRendering(r rendering, hostport string) error {
	host, port, err := net.SplitHostPort(hostport)
	if err != nil {
		return err
	}
	n, _ := strconv.Atoi(port)
	labelsOf := strings.Split(strings.TrimSuffix(host, "."+clusterDomain), ".")
	services := byName[corev1.Service](r)
	var svc *corev1.Service
	switch len(labelsOf) {
	case 1:
		svc = services[labelsOf[0]]
	case 2:
		svc = services[labelsOf[1]]
		if svc == nil || svc.Spec.ClusterIP != corev1.ClusterIPNone {
			return fmt.Errorf("%s is not a headless Service", labelsOf[1])
		}
		ok := false
		for _, w := range workloads(r) {
			if w.Kind != "StatefulSet" {
				continue
			}
			ord, found := strings.CutPrefix(labelsOf[0], w.Name+"-")
			i, err := strconv.Atoi(ord)
			if found && err == nil && w.Replicas != nil && i < int(*w.Replicas) {
				ok = true
			}
		}
		if !ok {
			return fmt.Errorf("pod %s is not a StatefulSet pod", labelsOf[0])
		}
	default:
		return fmt.Errorf("host %s is outside the namespace", host)
	}
	if svc == nil {
		return fmt.Errorf("no Service for %s", host)
	}
	for _, p := range svc.Spec.Ports {
		if int(p.Port) == n {
			return nil
		}
	}
	return fmt.Errorf("Service %s has no port %d", svc.Name, n)
}

// loopback matches a default meant for the local stack (make up).
var loopback = regexp.MustCompile(`(^|[/@,])(127\.0\.0\.1|localhost|\[::1\])(:|/|$)`)

var hashSuffix = regexp.MustCompile(`^(.+)-[a-z0-9]{10}$`)

// documentedSecrets reads deploy/k8s/README.md: a table row naming a Secret
// and a key, both in backticks, documents that key.
func documentedSecrets(t testing.TB) []string {
	data, err := os.ReadFile("README.md")
	if err != nil {
		t.Fatalf("deploy/k8s/README.md: %v", err)
	}
	var rows []string
	for line := range strings.SplitSeq(string(data), "\n") {
		if strings.HasPrefix(strings.TrimSpace(line), "|") {
			rows = append(rows, line)
		}
	}
	return rows
}

// localDefaults are the defaults deploy/local/services.sh (make up) gives
// the services' variables, `export NAME=${NAME:-value}`: public values,
// printed in the README, for a stack on loopback.
func localDefaults(t testing.TB) map[string]string {
	t.Helper()
	script, err := os.ReadFile(filepath.Join(repoRoot(t), "deploy", "local", "services.sh"))
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]string{}
	for _, m := range localDefault.FindAllStringSubmatch(string(script), -1) {
		if m[1] == m[2] {
			out[m[1]] = m[3]
		}
	}
	if len(out) == 0 {
		t.Fatal("deploy/local/services.sh: no line export KURZ_X=${KURZ_X:-value}")
	}
	return out
}

var localDefault = regexp.MustCompile(`(?m)^export (KURZ_\w+)=\$\{(KURZ_\w+):-([^}]*)\}$`)

// isLocalDefault: value is what make up gives the variable name, so it is
// public already.
func isLocalDefault(t testing.TB, name, value string) bool {
	v, ok := localDefaults(t)[name]
	return name != "" && ok && v == value
}

func TestSecretsAreDocumented(t *testing.T) {
	rows := documentedSecrets(t)
	documented := func(name, key string) bool {
		for _, row := range rows {
			if strings.Contains(row, "`"+name+"`") && strings.Contains(row, "`"+key+"`") {
				return true
			}
		}
		return false
	}
	for _, dir := range overlays {
		r := render(t, dir)
		// The variable each Secret key becomes, for the values make up
		// already publishes.
		becomes := map[string]string{}
		for _, w := range workloads(r) {
			for _, c := range allContainers(&w.Template.Spec) {
				for _, ev := range c.Env {
					if ev.ValueFrom != nil && ev.ValueFrom.SecretKeyRef != nil {
						becomes[ev.ValueFrom.SecretKeyRef.Name+"/"+ev.ValueFrom.SecretKeyRef.Key] = ev.Name
					}
				}
			}
		}
		rendered := map[string]*corev1.Secret{}
		for _, s := range typed[corev1.Secret](r) {
			rendered[s.Name] = s
			for k, v := range s.Data {
				if !strings.Contains(string(v), "dev-only") && !isLocalDefault(t, becomes[s.Name+"/"+k], string(v)) {
					t.Errorf("%s: Secret %s key %s: a Secret in the repository must hold an obviously dev-only value (or the public default deploy/local/services.sh gives its variable)", dir, s.Name, k)
				}
			}
		}
		refs := 0
		for _, w := range workloads(r) {
			for _, c := range allContainers(&w.Template.Spec) {
				for _, ev := range c.Env {
					if ev.ValueFrom == nil || ev.ValueFrom.SecretKeyRef == nil {
						continue
					}
					refs++
					ref := ev.ValueFrom.SecretKeyRef
					name := ref.Name
					if s, ok := rendered[name]; ok {
						if _, has := s.Data[ref.Key]; !has && (ref.Optional == nil || !*ref.Optional) {
							t.Errorf("%s: %s: Secret %s has no key %s", dir, w, name, ref.Key)
						}
						if m := hashSuffix.FindStringSubmatch(name); m != nil {
							name = m[1]
						}
					}
					if !documented(name, ref.Key) {
						t.Errorf("%s: %s: %s comes from Secret %s key %s, which deploy/k8s/README.md does not document (a table row with both in backticks)", dir, w, ev.Name, name, ref.Key)
					}
				}
				for _, from := range c.EnvFrom {
					if from.SecretRef != nil {
						t.Errorf("%s: %s: envFrom Secret %s: use secretKeyRef", dir, w, from.SecretRef.Name)
					}
				}
			}
			for _, v := range w.Template.Spec.Volumes {
				if v.Secret != nil || v.Projected != nil {
					t.Errorf("%s: %s: volume %s: secrets as files are not documented; use secretKeyRef", dir, w, v.Name)
				}
			}
		}
		if refs == 0 {
			t.Errorf("%s: no secretKeyRef rendered", dir)
		}
	}
}

// The local stack gives each secret only to the services that read it
// (deploy/local/services.sh, SECRET_USERS: a service's /proc/<pid>/environ
// holds no other's). A secret variable added to the manifests but not to
// that list went to every service the stack starts:
// KURZ_SHORTENER_WEBHOOK_PREVIOUS_KEY, set for a rotation, reached the
// gateway, the limiter, the analytics and the redirect too. Every variable
// the manifests take from a Secret is in the list, given to no service the
// manifests do not give it to.
func TestLocalStackGivesEachSecretOnlyToItsServices(t *testing.T) {
	script, err := os.ReadFile(filepath.Join(repoRoot(t), "deploy", "local", "services.sh"))
	if err != nil {
		t.Fatal(err)
	}
	local := map[string][]string{}
	for _, m := range secretUser.FindAllStringSubmatch(string(script), -1) {
		local[m[1]] = strings.Fields(m[2])
	}
	if len(local) == 0 {
		t.Fatal("deploy/local/services.sh: no SECRET_USERS entry [KURZ_X]=\"services\"")
	}
	for _, dir := range overlays {
		users := map[string]map[string]bool{}
		for _, w := range workloads(render(t, dir)) {
			for _, c := range allContainers(&w.Template.Spec) {
				for _, ev := range c.Env {
					if ev.ValueFrom == nil || ev.ValueFrom.SecretKeyRef == nil || !strings.HasPrefix(ev.Name, envPrefix) {
						continue
					}
					if users[ev.Name] == nil {
						users[ev.Name] = map[string]bool{}
					}
					users[ev.Name][w.app()] = true
				}
			}
		}
		for name, apps := range users {
			svcs, ok := local[name]
			if !ok {
				t.Errorf("%s: %s comes from a Secret, but deploy/local/services.sh's SECRET_USERS does not list it: make up gives it to every service", dir, name)
			}
			for _, s := range svcs {
				if !apps[s] {
					t.Errorf("%s: deploy/local/services.sh gives %s to %s, which the manifests do not give it to", dir, name, s)
				}
			}
		}
	}
}

var secretUser = regexp.MustCompile(`(?m)^\s*\[(KURZ_\w+)\]="([^"]*)"$`)
