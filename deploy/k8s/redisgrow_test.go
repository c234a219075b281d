package k8s

import (
	"os/exec"
	"strconv"
	"strings"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
)

// jobScript returns the shell script of a rendered Job whose one container
// runs `sh -c SCRIPT`, and that container.
func jobScript(t *testing.T, r rendering, name string) (string, corev1.Container) {
	t.Helper()
	j, ok := byName[batchv1.Job](r)[name]
	if !ok {
		t.Fatalf("%s: no Job %s", r.Dir, name)
	}
	cs := j.Spec.Template.Spec.Containers
	if len(cs) != 1 || len(cs[0].Command) != 2 || cs[0].Command[0] != "sh" || cs[0].Command[1] != "-c" || len(cs[0].Args) != 1 {
		t.Fatalf("Job %s: want one container with command [sh -c] and the script as its only arg", name)
	}
	if out, err := exec.Command("sh", "-n", "-c", cs[0].Args[0]).CombinedOutput(); err != nil {
		t.Errorf("Job %s: sh -n: %v\n%s", name, err, out)
	}
	return cs[0].Args[0], cs[0]
}

// envValue is the literal value of a container's variable, or "".
func envValue(c corev1.Container, name string) string {
	for _, e := range c.Env {
		if e.Name == name {
			return e.Value
		}
	}
	return ""
}

// The grow Job reaches the StatefulSet's pods where they are (their headless
// Service, the redis port), with the password the nodes require, and is told
// the StatefulSet's size: its runbook is "set both, apply".
func TestRedisGrowJobMatchesTheStatefulSet(t *testing.T) {
	r := render(t, "overlays/dev")
	script, c := jobScript(t, r, "redis-cluster-grow")
	sts, ok := byName[appsv1.StatefulSet](r)["redis"]
	if !ok {
		t.Fatal("dev has no StatefulSet redis")
	}
	replicas := int32(1)
	if sts.Spec.Replicas != nil {
		replicas = *sts.Spec.Replicas
	}
	if got := envValue(c, "REDIS_NODES"); got != strconv.Itoa(int(replicas)) {
		t.Errorf("redis-cluster-grow: REDIS_NODES=%q, want the StatefulSet's replicas %d", got, replicas)
	}
	if replicas < 6 || replicas%2 != 0 {
		t.Errorf("StatefulSet redis: replicas %d, want an even number >= 6 (a replica per master)", replicas)
	}

	// The pods it names: redis-<i>.<serviceName>, a headless Service of
	// the StatefulSet's pods; the port: that Service's and the container's.
	svc, ok := byName[corev1.Service](r)[sts.Spec.ServiceName]
	if !ok || svc.Spec.ClusterIP != corev1.ClusterIPNone {
		t.Fatalf("StatefulSet redis: serviceName %q is not a rendered headless Service", sts.Spec.ServiceName)
	}
	if want := `"` + sts.Name + `-$1.${domain}"`; !strings.Contains(script, want) {
		t.Errorf("redis-cluster-grow: the script does not name pods as %s", want)
	}
	if want := `domain="` + sts.Spec.ServiceName + `.${POD_NAMESPACE}.svc.cluster.local"`; !strings.Contains(script, want) {
		t.Errorf("redis-cluster-grow: the script lacks %s", want)
	}
	var port int32
	for _, p := range svc.Spec.Ports {
		if p.Name == "redis" {
			port = p.Port
		}
	}
	if port == 0 || portDeclared(svc.Spec.Ports[0].TargetPort, sts.Spec.Template.Spec.Containers[0]) != nil {
		t.Errorf("Service %s: no redis port that targets the container's", svc.Name)
	}
	if n := strings.Count(script, ":"+strconv.Itoa(int(port))+`"`); n < 4 {
		t.Errorf("redis-cluster-grow: the script names port %d %d times, want it on every add-node, check and rebalance", port, n)
	}
	if strings.Contains(strings.ReplaceAll(script, ":"+strconv.Itoa(int(port)), ""), ":63") {
		t.Errorf("redis-cluster-grow: the script names a port other than %d", port)
	}
	for _, want := range []string{
		"--cluster add-node", "cluster replicate",
		"--cluster rebalance", "--cluster-use-empty-masters", "--cluster check", "cluster_known_nodes",
	} {
		if !strings.Contains(script, want) {
			t.Errorf("redis-cluster-grow: the script lacks %q", want)
		}
	}

	// The password: the Secret key the nodes require.
	var nodeAuth, jobAuth *corev1.SecretKeySelector
	for _, e := range sts.Spec.Template.Spec.Containers[0].Env {
		if e.Name == "REDIS_PASSWORD" && e.ValueFrom != nil {
			nodeAuth = e.ValueFrom.SecretKeyRef
		}
	}
	for _, e := range c.Env {
		if e.Name == "REDISCLI_AUTH" && e.ValueFrom != nil {
			jobAuth = e.ValueFrom.SecretKeyRef
		}
	}
	if nodeAuth == nil || jobAuth == nil || *nodeAuth != *jobAuth {
		t.Errorf("redis-cluster-grow: REDISCLI_AUTH from %v, want the nodes' REDIS_PASSWORD Secret key %v", jobAuth, nodeAuth)
	}
}
