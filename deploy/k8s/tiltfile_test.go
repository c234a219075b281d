package k8s

import (
	"bytes"
	"encoding/json"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/moby/buildkit/frontend/dockerfile/instructions"
	"k8s.io/apimachinery/pkg/util/intstr"
)

// tiltManifest is the part of one resource of `tilt alpha tiltfile-result`
// (Tilt's own evaluation of the Tiltfile, as JSON) that the tests read.
type tiltManifest struct {
	Name         string
	ImageTargets []struct {
		Selector       string
		LiveUpdateSpec struct {
			Syncs []struct{ LocalPath, ContainerPath string }
			Execs []struct{ Args []string }
		}
		BuildDetails struct {
			Context, Target, DockerfileContents string
			Args                                []string
			ContextIgnores                      []struct{ Patterns []string }
		}
	}
	DeployTarget struct {
		YAML                    string
		PortForwardTemplateSpec *struct {
			Forwards []struct{ LocalPort, ContainerPort int32 }
		}
		UpdateCmdSpec *struct{ Args, Env []string } // a local_resource's cmd
		Deps          []string
	}
	ResourceDependencies []string
	Labels               map[string]string
}

// tiltfileResult evaluates the Tiltfile with the real Tilt (bin/tilt, built
// by make tools), GOARCH unset, in a HOME of its own.
func tiltfileResult(t *testing.T) []tiltManifest {
	t.Helper()
	root := repoRoot(t)
	tilt := filepath.Join(root, "bin", "tilt")
	if _, err := os.Stat(tilt); err != nil {
		t.Fatalf("%v: run make tools (it builds Tilt into bin/)", err)
	}
	cmd := exec.Command(tilt, "alpha", "tiltfile-result", "-f", "Tiltfile")
	cmd.Dir = root
	cmd.Env = slices.DeleteFunc(os.Environ(), func(kv string) bool { return strings.HasPrefix(kv, "GOARCH=") })
	cmd.Env = append(cmd.Env, "HOME="+t.TempDir(), "TILT_DISABLE_ANALYTICS=1")
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("tilt alpha tiltfile-result: %v\n%s", err, stderr.String())
	}
	var result struct {
		Manifests []tiltManifest
		Error     any
	}
	if err := json.Unmarshal(out, &result); err != nil || result.Error != nil {
		t.Fatalf("tilt alpha tiltfile-result: %v %v", err, result.Error)
	}
	return result.Manifests
}

func TestTiltfile(t *testing.T) {
	t.Parallel() // Tilt's evaluation takes a second or two
	root := repoRoot(t)
	manifests := map[string]tiltManifest{}
	for _, m := range tiltfileResult(t) {
		manifests[m.Name] = m
	}
	r := render(t, "overlays/dev")
	ws := map[string]workload{}
	for _, w := range workloads(r) {
		ws[w.Name] = w
	}
	// Tilt deploys the dev overlay, all of it and nothing else.
	var deployed, rendered []string
	for _, m := range manifests {
		objs, err := decodeStream([]byte(m.DeployTarget.YAML))
		if m.DeployTarget.YAML != "" && err != nil {
			t.Errorf("%s: %v", m.Name, err)
		}
		for _, o := range objs {
			deployed = append(deployed, o.Kind+"/"+o.Name)
		}
	}
	for _, o := range r.Objects {
		rendered = append(rendered, o.Kind+"/"+o.Name)
	}
	slices.Sort(deployed)
	slices.Sort(rendered)
	if !slices.Equal(deployed, rendered) {
		t.Errorf("Tilt deploys %v, want the objects of overlays/dev %v", deployed, rendered)
	}

	// Images: one docker_build per service, from the Dockerfile's dev stage,
	// live-updating the binary its compile resource builds.
	dockerfile, err := os.ReadFile(filepath.Join(root, "Dockerfile"))
	if err != nil {
		t.Fatal(err)
	}
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
	for _, svc := range services {
		images := manifests[svc].ImageTargets
		if len(images) != 1 || images[0].Selector != "kurz/"+svc {
			t.Errorf("%s: want one docker_build('kurz/%s', ...), got %d images", svc, svc, len(images))
			continue
		}
		b, lu := images[0].BuildDetails, images[0].LiveUpdateSpec
		if b.Context != root || b.DockerfileContents != string(dockerfile) || !slices.Equal(b.Args, []string{"SERVICE=" + svc}) {
			t.Errorf("docker_build kurz/%s: context %q, build args %v, want the repository, its Dockerfile, SERVICE=%s", svc, b.Context, b.Args, svc)
		}
		if b.Target != "dev" {
			t.Errorf("docker_build kurz/%s: target %q, want the Dockerfile's dev stage", svc, b.Target)
		}
		var synced, syncDest string
		if len(lu.Syncs) == 1 {
			synced, syncDest = lu.Syncs[0].LocalPath, lu.Syncs[0].ContainerPath
		}
		// only=[synced]: Tilt ignores everything in the context but it.
		if !slices.ContainsFunc(b.ContextIgnores, func(i struct{ Patterns []string }) bool {
			return slices.Equal(i.Patterns, []string{"**", "!" + synced})
		}) {
			t.Errorf("docker_build kurz/%s: the build context is not only %s (context ignores %v)", svc, synced, b.ContextIgnores)
		}
		restarts := slices.ContainsFunc(lu.Execs, func(e struct{ Args []string }) bool {
			return strings.Contains(strings.Join(e.Args, " "), "kill -HUP 1")
		})
		if synced == "" || !restarts {
			t.Errorf("docker_build kurz/%s: live_update needs one sync of the binary and a run('kill -HUP 1') for the restart wrapper", svc)
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

		c := manifests[svc+"-compile"].DeployTarget
		if c.UpdateCmdSpec == nil {
			t.Errorf("no local_resource('%s-compile', ...)", svc)
			continue
		}
		if cmd := strings.Join(c.UpdateCmdSpec.Args, " "); !strings.Contains(cmd, "go build") || !strings.Contains(cmd, "./services/"+svc) || !strings.Contains(cmd, "-o "+synced+"/service") {
			t.Errorf("%s-compile: cmd %q, want go build ./services/%s -o %s/service", svc, cmd, svc, synced)
		}
		if env := c.UpdateCmdSpec.Env; !slices.Contains(env, "CGO_ENABLED=0") || !slices.Contains(env, "GOOS=linux") {
			t.Errorf("%s-compile: env %v, want CGO_ENABLED=0 GOOS=linux (a static binary for the distroless image)", svc, env)
		}
		for _, dep := range []string{"go.mod", "go.sum", "gen", "pkg", "services/" + svc} {
			if !slices.Contains(c.Deps, filepath.Join(root, dep)) {
				t.Errorf("%s-compile: deps %v lack %s", svc, c.Deps, dep)
			}
		}
	}

	// Resources: every dev workload, labelled, port-forwarded and ordered.
	deps := map[string][]string{}
	for name, m := range manifests {
		deps[name] = m.ResourceDependencies
		if _, ok := ws[name]; !ok && m.DeployTarget.UpdateCmdSpec == nil && name != "uncategorized" {
			t.Errorf("resource %s: no such workload in overlays/dev", name)
		}
		if m.DeployTarget.UpdateCmdSpec != nil && !maps.Equal(m.Labels, map[string]string{"services": "services"}) {
			t.Errorf("local_resource %s: labels %v, want [services]", name, m.Labels)
		}
	}
	for name, w := range ws {
		m, ok := manifests[name]
		if !ok {
			t.Errorf("workload %s is no Tilt resource of its own", w)
			continue
		}
		want := "infra"
		switch {
		case kurzService(w) != "":
			want = "services"
		case w.Template.Labels["app.kubernetes.io/component"] == "observability":
			want = "observability"
		}
		if !maps.Equal(m.Labels, map[string]string{want: want}) {
			t.Errorf("k8s_resource %s: labels %v, want [%s]", name, m.Labels, want)
		}
		for _, d := range m.ResourceDependencies {
			if _, ok := deps[d]; !ok {
				t.Errorf("k8s_resource %s: resource_deps names %q, which is not a resource", name, d)
			}
		}
		if pf := m.DeployTarget.PortForwardTemplateSpec; pf != nil {
			for _, f := range pf.Forwards {
				if portDeclared(intstr.FromInt32(f.ContainerPort), w.Template.Spec.Containers[0]) != nil {
					t.Errorf("k8s_resource %s: port forward %d:%d: %d is not a container port", name, f.LocalPort, f.ContainerPort, f.ContainerPort)
				}
			}
		}
	}
	for svc, port := range map[string]int32{"gateway": 8080, "redirect": 8787, "limiter": 9091} {
		pf := manifests[svc].DeployTarget.PortForwardTemplateSpec
		if pf == nil || !slices.Contains(pf.Forwards, struct{ LocalPort, ContainerPort int32 }{port, port}) {
			t.Errorf("k8s_resource %s: port_forwards lack %d:%d", svc, port, port)
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
