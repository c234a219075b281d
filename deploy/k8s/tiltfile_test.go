package k8s

import (
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/moby/buildkit/frontend/dockerfile/instructions"
	"go.starlark.net/starlark"
	"go.starlark.net/starlarkstruct"
	"go.starlark.net/syntax"
	"k8s.io/apimachinery/pkg/util/intstr"
)

// The real Tilt is not installable here (`go install` of its module fails:
// README.md, "How these tests check"), so the Tiltfile is executed with
// go.starlark.net, Tilt's own Starlark interpreter, against stubs of the
// Tilt built-ins it uses. Each stub takes exactly the parameters of the Tilt
// API (docs.tilt.dev/api.html), so a misspelt or unknown argument fails as
// it would under `tilt up`; the calls are recorded and checked against the
// dev overlay and the Dockerfile.

type tiltDockerBuild struct {
	Ref, Context, Dockerfile, Target string
	BuildArgs                        map[string]string
	Only                             []string
	LiveUpdate                       []*starlarkstruct.Struct
}

type tiltLocalResource struct {
	Name, Cmd    string
	Env          map[string]string
	Deps, Labels []string
	ResourceDeps []string
}

type tiltK8sResource struct {
	Workload                   string
	PortForwards, ResourceDeps []string
	Labels                     []string
}

type tiltfile struct {
	K8sYAML        []string
	DockerBuilds   []tiltDockerBuild
	LocalResources []tiltLocalResource
	K8sResources   []tiltK8sResource
}

func strList(v starlark.Value) ([]string, error) {
	switch v := v.(type) {
	case nil, starlark.NoneType:
		return nil, nil
	case starlark.String:
		return []string{string(v)}, nil
	case starlark.Int:
		return []string{v.String()}, nil
	case starlark.Indexable:
		var out []string
		for i := range v.Len() {
			s, err := strList(v.Index(i))
			if err != nil {
				return nil, err
			}
			out = append(out, s...)
		}
		return out, nil
	}
	return nil, fmt.Errorf("want a string or a list of strings, got %s", v.Type())
}

func strDict(d *starlark.Dict) (map[string]string, error) {
	out := map[string]string{}
	if d == nil {
		return out, nil
	}
	for _, item := range d.Items() {
		k, ok1 := item[0].(starlark.String)
		v, ok2 := item[1].(starlark.String)
		if !ok1 || !ok2 {
			return nil, fmt.Errorf("want a dict of strings, got %s: %s", item[0], item[1])
		}
		out[string(k)] = string(v)
	}
	return out, nil
}

// evalTiltfile runs src with the Tilt stubs and returns what it declared.
func evalTiltfile(src string, getenv func(string) (string, bool)) (*tiltfile, error) {
	tf := &tiltfile{}
	var v starlark.Value // sink for parameters the tests do not inspect
	builtin := func(name string, fn func(args starlark.Tuple, kwargs []starlark.Tuple) (starlark.Value, error)) *starlark.Builtin {
		return starlark.NewBuiltin(name, func(_ *starlark.Thread, b *starlark.Builtin, args starlark.Tuple, kwargs []starlark.Tuple) (starlark.Value, error) {
			return fn(args, kwargs)
		})
	}
	step := func(kind string, fields starlark.StringDict) starlark.Value {
		return starlarkstruct.FromStringDict(starlark.String(kind), fields)
	}
	predeclared := starlark.StringDict{
		"version_settings": builtin("version_settings", func(args starlark.Tuple, kwargs []starlark.Tuple) (starlark.Value, error) {
			return starlark.None, starlark.UnpackArgs("version_settings", args, kwargs, "check_updates?", &v, "constraint?", &v)
		}),
		"kustomize": builtin("kustomize", func(args starlark.Tuple, kwargs []starlark.Tuple) (starlark.Value, error) {
			var dir string
			err := starlark.UnpackArgs("kustomize", args, kwargs, "pathToDir", &dir, "kustomize_bin?", &v, "flags?", &v)
			return starlark.String("kustomize:" + dir), err
		}),
		"k8s_yaml": builtin("k8s_yaml", func(args starlark.Tuple, kwargs []starlark.Tuple) (starlark.Value, error) {
			var yaml starlark.Value
			if err := starlark.UnpackArgs("k8s_yaml", args, kwargs, "yaml", &yaml, "allow_duplicates?", &v); err != nil {
				return nil, err
			}
			items, err := strList(yaml)
			tf.K8sYAML = append(tf.K8sYAML, items...)
			return starlark.None, err
		}),
		"sync": builtin("sync", func(args starlark.Tuple, kwargs []starlark.Tuple) (starlark.Value, error) {
			var local, remote string
			err := starlark.UnpackArgs("sync", args, kwargs, "local_path", &local, "remote_path", &remote)
			return step("sync", starlark.StringDict{"local": starlark.String(local), "remote": starlark.String(remote)}), err
		}),
		"run": builtin("run", func(args starlark.Tuple, kwargs []starlark.Tuple) (starlark.Value, error) {
			var cmd, trigger starlark.Value
			err := starlark.UnpackArgs("run", args, kwargs, "cmd", &cmd, "trigger?", &trigger, "echo_off?", &v)
			if trigger == nil {
				trigger = starlark.NewList(nil)
			}
			return step("run", starlark.StringDict{"cmd": cmd, "trigger": trigger}), err
		}),
		"docker_build": builtin("docker_build", func(args starlark.Tuple, kwargs []starlark.Tuple) (starlark.Value, error) {
			var b tiltDockerBuild
			var buildArgs *starlark.Dict
			var only starlark.Value
			var live *starlark.List
			b.Dockerfile = "Dockerfile"
			if err := starlark.UnpackArgs("docker_build", args, kwargs,
				"ref", &b.Ref, "context", &b.Context, "build_args?", &buildArgs, "dockerfile?", &b.Dockerfile,
				"dockerfile_contents?", &v, "live_update?", &live, "match_in_env_vars?", &v, "ignore?", &v,
				"only?", &only, "entrypoint?", &v, "target?", &b.Target, "ssh?", &v, "network?", &v,
				"secret?", &v, "extra_tag?", &v, "container_args?", &v, "cache_from?", &v, "pull?", &v,
				"platform?", &v, "extra_hosts?", &v); err != nil {
				return nil, err
			}
			var err error
			if b.BuildArgs, err = strDict(buildArgs); err != nil {
				return nil, fmt.Errorf("docker_build build_args: %w", err)
			}
			if b.Only, err = strList(only); err != nil {
				return nil, fmt.Errorf("docker_build only: %w", err)
			}
			if live != nil {
				for i := range live.Len() {
					s, ok := live.Index(i).(*starlarkstruct.Struct)
					if !ok {
						return nil, fmt.Errorf("docker_build live_update[%d] is not a live update step", i)
					}
					b.LiveUpdate = append(b.LiveUpdate, s)
				}
			}
			tf.DockerBuilds = append(tf.DockerBuilds, b)
			return starlark.None, nil
		}),
		"local_resource": builtin("local_resource", func(args starlark.Tuple, kwargs []starlark.Tuple) (starlark.Value, error) {
			var r tiltLocalResource
			var env *starlark.Dict
			var deps, labels, resourceDeps starlark.Value
			if err := starlark.UnpackArgs("local_resource", args, kwargs,
				"name", &r.Name, "cmd?", &r.Cmd, "deps?", &deps, "trigger_mode?", &v, "resource_deps?", &resourceDeps,
				"ignore?", &v, "auto_init?", &v, "serve_cmd?", &v, "cmd_bat?", &v, "serve_cmd_bat?", &v,
				"allow_parallel?", &v, "links?", &v, "tags?", &v, "env?", &env, "serve_env?", &v,
				"readiness_probe?", &v, "dir?", &v, "serve_dir?", &v, "labels?", &labels); err != nil {
				return nil, err
			}
			var err error
			r.Env, err = strDict(env)
			if err == nil {
				r.Deps, err = strList(deps)
			}
			if err == nil {
				r.Labels, err = strList(labels)
			}
			if err == nil {
				r.ResourceDeps, err = strList(resourceDeps)
			}
			tf.LocalResources = append(tf.LocalResources, r)
			return starlark.None, err
		}),
		"k8s_resource": builtin("k8s_resource", func(args starlark.Tuple, kwargs []starlark.Tuple) (starlark.Value, error) {
			var r tiltK8sResource
			var pf, deps, labels starlark.Value
			if err := starlark.UnpackArgs("k8s_resource", args, kwargs,
				"workload?", &r.Workload, "new_name?", &v, "port_forwards?", &pf, "extra_pod_selectors?", &v,
				"trigger_mode?", &v, "resource_deps?", &deps, "objects?", &v, "auto_init?", &v,
				"pod_readiness?", &v, "links?", &v, "labels?", &labels, "discovery_strategy?", &v); err != nil {
				return nil, err
			}
			var err error
			r.PortForwards, err = strList(pf)
			if err == nil {
				r.ResourceDeps, err = strList(deps)
			}
			if err == nil {
				r.Labels, err = strList(labels)
			}
			tf.K8sResources = append(tf.K8sResources, r)
			return starlark.None, err
		}),
		"os": &starlarkstruct.Module{Name: "os", Members: starlark.StringDict{
			"getenv": builtin("getenv", func(args starlark.Tuple, kwargs []starlark.Tuple) (starlark.Value, error) {
				var key string
				var def starlark.Value = starlark.None
				if err := starlark.UnpackArgs("getenv", args, kwargs, "key", &key, "default?", &def); err != nil {
					return nil, err
				}
				if val, ok := getenv(key); ok {
					return starlark.String(val), nil
				}
				return def, nil
			}),
		}},
	}
	thread := &starlark.Thread{Name: "Tiltfile"}
	opts := &syntax.FileOptions{Set: true, While: true, TopLevelControl: true, GlobalReassign: true, Recursion: true}
	if _, err := starlark.ExecFileOptions(opts, thread, "Tiltfile", src, predeclared); err != nil {
		if ee, ok := err.(*starlark.EvalError); ok {
			return nil, fmt.Errorf("%s", ee.Backtrace())
		}
		return nil, err
	}
	return tf, nil
}

func stepString(s *starlarkstruct.Struct, field string) string {
	v, err := s.Attr(field)
	if err != nil {
		return ""
	}
	str, _ := starlark.AsString(v)
	return str
}

func TestTiltfile(t *testing.T) {
	root := repoRoot(t)
	src, err := os.ReadFile(filepath.Join(root, "Tiltfile"))
	if err != nil {
		t.Fatal(err)
	}
	tf, err := evalTiltfile(string(src), func(string) (string, bool) { return "", false })
	if err != nil {
		t.Fatalf("Tiltfile: %v", err)
	}
	const overlay = "deploy/k8s/overlays/dev"
	if !slices.Equal(tf.K8sYAML, []string{"kustomize:" + overlay}) {
		t.Errorf("k8s_yaml got %v, want exactly kustomize('%s')", tf.K8sYAML, overlay)
	}
	r := render(t, "overlays/dev")
	ws := map[string]workload{}
	for _, w := range workloads(r) {
		ws[w.Name] = w
	}

	// Images: one docker_build per service, from the Dockerfile's dev stage,
	// live-updating the binary its compile resource builds.
	dev := readDockerfile(t).stage(t, "dev")
	var devCopy string
	var devEntrypoint []string
	for _, c := range commands[*instructions.CopyCommand](dev) {
		if c.DestPath == "/app/service" && len(c.SourcePaths) == 1 {
			devCopy = c.SourcePaths[0]
		}
	}
	if eps := commands[*instructions.EntrypointCommand](dev); len(eps) > 0 {
		devEntrypoint = eps[len(eps)-1].CmdLine
	}
	builds := map[string]tiltDockerBuild{}
	for _, b := range tf.DockerBuilds {
		builds[b.Ref] = b
	}
	compiles := map[string]tiltLocalResource{}
	for _, lr := range tf.LocalResources {
		compiles[lr.Name] = lr
	}
	// Tilt replaces the images the dev overlay names with the ones it built:
	// docker_build must name exactly those.
	devImages := map[string]string{}
	for _, w := range workloads(render(t, "overlays/dev")) {
		if svc := kurzService(w); svc != "" {
			devImages[svc] = imageRepo(w.Template.Spec.Containers[0].Image)
		}
	}
	for _, svc := range services {
		b, ok := builds[devImages[svc]]
		if !ok {
			t.Errorf("no docker_build('%s', ...), the image overlays/dev runs for %s", devImages[svc], svc)
			continue
		}
		if b.Context != "." || b.Dockerfile != "Dockerfile" || b.BuildArgs["SERVICE"] != svc || len(b.BuildArgs) != 1 {
			t.Errorf("docker_build kurz/%s: context %q dockerfile %q build_args %v, want '.', 'Dockerfile', {'SERVICE': '%s'}", svc, b.Context, b.Dockerfile, b.BuildArgs, svc)
		}
		if b.Target != "dev" {
			t.Errorf("docker_build kurz/%s: target %q, want the Dockerfile's dev stage", svc, b.Target)
		}
		if len(b.Only) == 0 {
			t.Errorf("docker_build kurz/%s: no only=[...]: the whole repository would be the build context", svc)
		}
		var synced, syncDest string
		restarts := false
		for _, s := range b.LiveUpdate {
			switch s.Constructor().String() {
			case `"sync"`:
				synced, syncDest = stepString(s, "local"), stepString(s, "remote")
				if !slices.Contains(b.Only, synced) {
					t.Errorf("docker_build kurz/%s: sync source %s is not in only=%v, so Tilt would not watch it", svc, synced, b.Only)
				}
			case `"run"`:
				cmd := stepString(s, "cmd")
				restarts = restarts || strings.Contains(cmd, "kill -HUP 1")
			}
		}
		if synced == "" || !restarts {
			t.Errorf("docker_build kurz/%s: live_update needs a sync of the binary and a run('kill -HUP 1') for the restart wrapper", svc)
		}
		if want, _ := expandFor(svc)(devCopy); want != synced+"/service" {
			t.Errorf("kurz/%s: the dev stage copies %s, the live update syncs %s/service", svc, want, synced)
		}
		if !slices.Contains(devEntrypoint, syncDest+"/service") {
			t.Errorf("kurz/%s: live update syncs to %s, but the dev ENTRYPOINT %q does not run %s/service", svc, syncDest, devEntrypoint, syncDest)
		}
		if w, ok := ws[svc]; ok && !writableMount(w, syncDest) {
			t.Errorf("kurz/%s: %s is not on an emptyDir of the dev pod; the root filesystem is read-only", svc, syncDest)
		}

		c, ok := compiles[svc+"-compile"]
		if !ok {
			t.Errorf("no local_resource('%s-compile', ...)", svc)
			continue
		}
		if !strings.Contains(c.Cmd, "go build") || !strings.Contains(c.Cmd, "./services/"+svc) || !strings.Contains(c.Cmd, "-o "+synced+"/service") {
			t.Errorf("%s-compile: cmd %q, want go build ./services/%s -o %s/service", svc, c.Cmd, svc, synced)
		}
		if c.Env["CGO_ENABLED"] != "0" || c.Env["GOOS"] != "linux" {
			t.Errorf("%s-compile: env %v, want CGO_ENABLED=0 GOOS=linux (a static binary for the distroless image)", svc, c.Env)
		}
		for _, dep := range []string{"go.mod", "go.sum", "gen", "pkg", "services/" + svc} {
			if !slices.Contains(c.Deps, dep) {
				t.Errorf("%s-compile: deps %v lack %s", svc, c.Deps, dep)
			}
		}
	}

	// Resources: every dev workload, labelled, port-forwarded and ordered.
	resources := map[string]tiltK8sResource{}
	for _, k := range tf.K8sResources {
		if _, ok := ws[k.Workload]; !ok {
			t.Errorf("k8s_resource(%q): no such workload in %s", k.Workload, overlay)
		}
		resources[k.Workload] = k
	}
	deps := map[string][]string{}
	for name, k := range resources {
		deps[name] = k.ResourceDeps
	}
	for name, lr := range compiles {
		deps[name] = lr.ResourceDeps
		if !slices.Equal(lr.Labels, []string{"services"}) {
			t.Errorf("local_resource %s: labels %v, want [services]", name, lr.Labels)
		}
	}
	for name, w := range ws {
		k, ok := resources[name]
		if !ok {
			t.Errorf("workload %s has no k8s_resource (labels, dependencies)", w)
			continue
		}
		want := "infra"
		switch {
		case kurzService(w) != "":
			want = "services"
		case w.Template.Labels["app.kubernetes.io/component"] == "observability":
			want = "observability"
		}
		if !slices.Equal(k.Labels, []string{want}) {
			t.Errorf("k8s_resource %s: labels %v, want [%s]", name, k.Labels, want)
		}
		for _, d := range k.ResourceDeps {
			if _, ok := deps[d]; !ok {
				t.Errorf("k8s_resource %s: resource_deps names %q, which is not a resource", name, d)
			}
		}
		for _, pf := range k.PortForwards {
			local, remote, found := strings.Cut(pf, ":")
			if !found {
				remote = local
			}
			n, err := strconv.Atoi(remote)
			if err != nil || portDeclared(intstr.FromInt(n), w.Template.Spec.Containers[0]) != nil {
				t.Errorf("k8s_resource %s: port forward %s: %d is not a container port", name, pf, n)
			}
		}
	}
	// The services' public ports and the limiter's gRPC, and the UIs of the
	// observability stack.
	for svc, port := range map[string]string{"gateway": "8080", "redirect": "8787", "limiter": "9091",
		"grafana": "3000", "prometheus": "9090", "jaeger": "16686"} {
		if !slices.Contains(resources[svc].PortForwards, port+":"+port) {
			t.Errorf("k8s_resource %s: port_forwards %v lack %s:%s", svc, resources[svc].PortForwards, port, port)
		}
	}
	// Each service waits for its own compile and for the stores its code
	// reads (from the source scan), the Redis Cluster through the Job that
	// forms it.
	closure := func(start string) map[string]bool {
		seen := map[string]bool{}
		var visit func(string)
		visit = func(n string) {
			for _, d := range deps[n] {
				if !seen[d] {
					seen[d] = true
					visit(d)
				}
			}
		}
		visit(start)
		return seen
	}
	env := readEnv(t)
	for _, svc := range services {
		got := closure(svc)
		want := []string{svc + "-compile"}
		if _, ok := env[svc]["KURZ_REDIS_ADDRS"]; ok {
			want = append(want, "redis", "redis-cluster-init")
		}
		if _, ok := env[svc]["KURZ_POSTGRES_URL"]; ok {
			want = append(want, "postgres")
		}
		if _, ok := env[svc]["KURZ_CLICKHOUSE_ADDRS"]; ok {
			want = append(want, "clickhouse")
		}
		for _, w := range want {
			if !got[w] {
				t.Errorf("k8s_resource %s does not wait for %s (resource_deps)", svc, w)
			}
		}
	}
	if !closure("redis-cluster-init")["redis"] {
		t.Error("redis-cluster-init does not wait for redis")
	}
}

func writableMount(w workload, path string) bool {
	empty := map[string]bool{}
	for _, v := range w.Template.Spec.Volumes {
		if v.EmptyDir != nil {
			empty[v.Name] = true
		}
	}
	for _, m := range w.Template.Spec.Containers[0].VolumeMounts {
		if empty[m.Name] && !m.ReadOnly && (path == m.MountPath || strings.HasPrefix(path, strings.TrimSuffix(m.MountPath, "/")+"/")) {
			return true
		}
	}
	return false
}

// The stubs are as strict as Tilt: a wrong parameter name is an error.
func TestTiltStubsRejectWhatTiltRejects(t *testing.T) {
	for name, src := range map[string]string{
		"misspelt parameter": "k8s_resource('gateway', port_forward=['8080:8080'])",
		"missing context":    "docker_build('kurz/gateway')",
		"unknown built-in":   "docker_compose('compose.yaml')",
		"syntax error":       "k8s_yaml(kustomize('x')",
	} {
		if _, err := evalTiltfile(src, func(string) (string, bool) { return "", false }); err == nil {
			t.Errorf("%s: %q evaluated without error", name, src)
		}
	}
	tf, err := evalTiltfile("k8s_resource('gateway', port_forwards=8080, labels='services')\nx = os.getenv('GOARCH', 'amd64')\nif x != 'arm64':\n    fail('getenv')\n", func(k string) (string, bool) { return "arm64", k == "GOARCH" })
	if err != nil || len(tf.K8sResources) != 1 || tf.K8sResources[0].PortForwards[0] != "8080" {
		t.Errorf("valid calls: %v %+v", err, tf)
	}
}
