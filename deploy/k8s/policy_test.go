package k8s

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	autoscalingv2 "k8s.io/api/autoscaling/v2"
	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/util/intstr"
)

// allContainers returns the init and app containers of a pod.
func allContainers(spec *corev1.PodSpec) []corev1.Container {
	return append(slices.Clone(spec.InitContainers), spec.Containers...)
}

// containerProblems lists what a container lacks under the policy every
// workload follows: requests and limits, non-root, read-only root filesystem,
// no privilege escalation, no capabilities, RuntimeDefault seccomp; and, for
// long-running workloads, readiness and liveness probes that point at ports
// the container declares.
func containerProblems(w workload, c corev1.Container, long bool) []string {
	var p []string
	pod := w.Template.Spec.SecurityContext
	sc := c.SecurityContext
	if pod == nil {
		pod = &corev1.PodSecurityContext{}
	}
	if sc == nil {
		sc = &corev1.SecurityContext{}
	}
	for _, res := range []corev1.ResourceName{corev1.ResourceCPU, corev1.ResourceMemory} {
		if _, ok := c.Resources.Requests[res]; !ok {
			p = append(p, "no "+string(res)+" request")
		}
		if _, ok := c.Resources.Limits[res]; !ok {
			p = append(p, "no "+string(res)+" limit")
		}
	}
	nonRoot := (sc.RunAsNonRoot != nil && *sc.RunAsNonRoot) || (sc.RunAsNonRoot == nil && pod.RunAsNonRoot != nil && *pod.RunAsNonRoot)
	if !nonRoot {
		p = append(p, "runAsNonRoot is not true")
	}
	if u := sc.RunAsUser; u != nil && *u == 0 || u == nil && pod.RunAsUser != nil && *pod.RunAsUser == 0 {
		p = append(p, "runs as user 0")
	}
	if sc.ReadOnlyRootFilesystem == nil || !*sc.ReadOnlyRootFilesystem {
		p = append(p, "readOnlyRootFilesystem is not true")
	}
	if sc.AllowPrivilegeEscalation == nil || *sc.AllowPrivilegeEscalation {
		p = append(p, "allowPrivilegeEscalation is not false")
	}
	if sc.Privileged != nil && *sc.Privileged {
		p = append(p, "privileged")
	}
	if sc.Capabilities == nil || !slices.Contains(sc.Capabilities.Drop, "ALL") || len(sc.Capabilities.Add) > 0 {
		p = append(p, "capabilities: want drop [ALL] and nothing added")
	}
	seccomp := sc.SeccompProfile
	if seccomp == nil {
		seccomp = pod.SeccompProfile
	}
	if seccomp == nil || seccomp.Type != corev1.SeccompProfileTypeRuntimeDefault {
		p = append(p, "seccompProfile is not RuntimeDefault")
	}
	if problem := imageProblem(c.Image); problem != "" {
		p = append(p, problem)
	}
	if long {
		for name, probe := range map[string]*corev1.Probe{"readinessProbe": c.ReadinessProbe, "livenessProbe": c.LivenessProbe, "startupProbe": c.StartupProbe} {
			if probe == nil {
				if name != "startupProbe" {
					p = append(p, "no "+name)
				}
				continue
			}
			if err := probeTargetsContainer(probe, c); err != nil {
				p = append(p, name+": "+err.Error())
			}
		}
	}
	return p
}

// imageProblem says why an image reference is not pinned, or "".
func imageProblem(image string) string {
	if _, digest, ok := strings.Cut(image, "@"); ok {
		if !strings.HasPrefix(digest, "sha256:") {
			return fmt.Sprintf("image %q: bad digest", image)
		}
		return ""
	}
	lastSlash := strings.LastIndex(image, "/")
	_, tag, ok := strings.Cut(image[lastSlash+1:], ":")
	switch {
	case !ok || tag == "":
		return fmt.Sprintf("image %q has no tag", image)
	case tag == "latest" || strings.HasPrefix(tag, "latest-"):
		return fmt.Sprintf("image %q uses a latest tag", image)
	}
	return ""
}

func probeTargetsContainer(p *corev1.Probe, c corev1.Container) error {
	switch {
	case p.HTTPGet != nil:
		return portDeclared(p.HTTPGet.Port, c)
	case p.TCPSocket != nil:
		return portDeclared(p.TCPSocket.Port, c)
	case p.GRPC != nil:
		return portDeclared(intstr.FromInt32(p.GRPC.Port), c)
	case p.Exec != nil:
		if len(p.Exec.Command) == 0 {
			return fmt.Errorf("empty exec command")
		}
		return nil
	}
	return fmt.Errorf("no handler")
}

func portDeclared(port intstr.IntOrString, c corev1.Container) error {
	for _, cp := range c.Ports {
		if port.Type == intstr.String && cp.Name == port.StrVal || port.Type == intstr.Int && cp.ContainerPort == port.IntVal {
			return nil
		}
	}
	return fmt.Errorf("port %s is not a port of container %s", port.String(), c.Name)
}

func TestEveryContainerFollowsThePolicy(t *testing.T) {
	for _, dir := range overlays {
		for _, p := range workloadPolicyProblems(render(t, dir)) {
			t.Errorf("%s: %s", dir, p)
		}
	}
}

// workloadPolicyProblems applies containerProblems to every container of
// the rendering, and refuses service account tokens.
func workloadPolicyProblems(r rendering) []string {
	var problems []string
	for _, w := range workloads(r) {
		for _, c := range w.Template.Spec.InitContainers {
			for _, p := range containerProblems(w, c, false) {
				problems = append(problems, fmt.Sprintf("%s init container %s: %s", w, c.Name, p))
			}
		}
		for _, c := range w.Template.Spec.Containers {
			for _, p := range containerProblems(w, c, w.Kind != "Job") {
				problems = append(problems, fmt.Sprintf("%s container %s: %s", w, c.Name, p))
			}
		}
		if w.Template.Spec.AutomountServiceAccountToken == nil || *w.Template.Spec.AutomountServiceAccountToken {
			problems = append(problems, fmt.Sprintf("%s mounts a service account token; nothing in kurz calls the Kubernetes API", w))
		}
	}
	return problems
}

func TestPolicyCheckCatchesViolations(t *testing.T) {
	yes, no := true, false
	c := corev1.Container{Name: "x", Image: "kurz/x:latest", SecurityContext: &corev1.SecurityContext{AllowPrivilegeEscalation: &yes, ReadOnlyRootFilesystem: &no}}
	w := workload{Kind: "Deployment", Name: "x", Template: &corev1.PodTemplateSpec{}}
	got := strings.Join(containerProblems(w, c, true), "; ")
	for _, want := range []string{"no cpu request", "no memory limit", "runAsNonRoot", "readOnlyRootFilesystem", "allowPrivilegeEscalation", "capabilities", "seccomp", "latest", "no readinessProbe", "no livenessProbe"} {
		if !strings.Contains(got, want) {
			t.Errorf("problems %q do not mention %q", got, want)
		}
	}
	for image, pinned := range map[string]bool{
		"redis:7.2.8": true, "kurz/limiter:0.1.0": true, "localhost:5000/kurz/limiter": false,
		"redis": false, "redis:latest": false, "x@sha256:abc": true, "gcr.io/distroless/static-debian12:nonroot": true,
	} {
		if got := imageProblem(image) == ""; got != pinned {
			t.Errorf("imageProblem(%q) pinned=%v, want %v", image, got, pinned)
		}
	}
}

func TestServicePortsMatchContainerPorts(t *testing.T) {
	for _, dir := range overlays {
		for _, p := range servicePortProblems(render(t, dir)) {
			t.Errorf("%s: %s", dir, p)
		}
	}
}

// servicePortProblems says which Services of the rendering select no
// workload, have an unnamed port or one no selected container declares.
func servicePortProblems(r rendering) []string {
	var problems []string
	ws := workloads(r)
	for _, svc := range typed[corev1.Service](r) {
		sel := labels.SelectorFromSet(svc.Spec.Selector)
		var matched []workload
		for _, w := range ws {
			if len(svc.Spec.Selector) > 0 && sel.Matches(labels.Set(w.Template.Labels)) {
				matched = append(matched, w)
			}
		}
		if len(matched) == 0 {
			problems = append(problems, fmt.Sprintf("Service %s selects no workload (selector %v)", svc.Name, svc.Spec.Selector))
			continue
		}
		for _, port := range svc.Spec.Ports {
			if port.Name == "" {
				problems = append(problems, fmt.Sprintf("Service %s port %d has no name", svc.Name, port.Port))
			}
			target := port.TargetPort
			if target.Type == intstr.Int && target.IntVal == 0 {
				target = intstr.FromInt32(port.Port)
			}
			for _, w := range matched {
				found := false
				for _, c := range w.Template.Spec.Containers {
					if portDeclared(target, c) == nil {
						found = true
					}
				}
				if !found {
					problems = append(problems, fmt.Sprintf("Service %s port %s targets %s, which no container of %s declares", svc.Name, port.Name, target.String(), w))
				}
			}
		}
	}
	return problems
}

// Every kurz service: named gRPC and HTTP ports, a Service with both, a
// ServiceAccount of its own, liveness and the scrape annotations on its ops
// port (HTTP, or "ops" on the public services, which no Service exposes),
// user 65532, and a grace period longer than its shutdown (preStop sleep plus
// KURZ_SHUTDOWN_TIMEOUT, KURZ_CLOSE_TIMEOUT and KURZ_TELEMETRY_FLUSH_TIMEOUT
// as configured).
func TestKurzServices(t *testing.T) {
	for _, dir := range overlays {
		r := render(t, dir)
		env := serviceEnvironments(t, r)
		byName := map[string]workload{}
		for _, w := range workloads(r) {
			if svc := kurzService(w); svc != "" {
				byName[svc] = w
			}
		}
		accounts := map[string]bool{}
		for _, sa := range typed[corev1.ServiceAccount](r) {
			accounts[sa.Name] = true
		}
		servicePorts := map[string]map[string]int32{}
		serviceTargets := map[string][]intstr.IntOrString{} // by the app it selects
		for _, s := range typed[corev1.Service](r) {
			servicePorts[s.Name] = map[string]int32{}
			for _, p := range s.Spec.Ports {
				servicePorts[s.Name][p.Name] = p.Port
				app := s.Spec.Selector["app.kubernetes.io/name"]
				serviceTargets[app] = append(serviceTargets[app], p.TargetPort)
			}
		}
		for _, svc := range services {
			w, ok := byName[svc]
			if !ok {
				t.Errorf("%s: no Deployment runs kurz/%s", dir, svc)
				continue
			}
			spec := w.Template.Spec
			c := spec.Containers[0]
			if w.Name != svc || c.Name != svc || w.app() != svc {
				t.Errorf("%s: %s: want Deployment, container and app.kubernetes.io/name all %q", dir, w, svc)
			}
			ports := map[string]int32{}
			for _, p := range c.Ports {
				ports[p.Name] = p.ContainerPort
			}
			wantPorts := []string{"grpc", "http"}
			if ops := opsPort(svc); ops != "http" {
				wantPorts = append(wantPorts, ops)
				// No Service leads to the ops port: it is for the kubelet
				// and Prometheus, which reach the pod itself.
				for _, tp := range serviceTargets[svc] {
					if tp.StrVal == ops || tp.IntVal == ports[ops] {
						t.Errorf("%s: a Service of %s targets its %s port", dir, svc, ops)
					}
				}
			}
			for _, p := range wantPorts {
				if ports[p] == 0 {
					t.Errorf("%s: %s: ports %v, want exactly %v", dir, w, ports, wantPorts)
				}
			}
			if len(ports) != len(wantPorts) {
				t.Errorf("%s: %s: ports %v, want exactly %v", dir, w, ports, wantPorts)
			}
			if got := servicePorts[svc]; got["grpc"] != ports["grpc"] || got["http"] != ports["http"] {
				t.Errorf("%s: Service %s ports %v, want grpc %d and http %d", dir, svc, got, ports["grpc"], ports["http"])
			}
			if c.ReadinessProbe == nil || c.ReadinessProbe.GRPC == nil && (c.ReadinessProbe.HTTPGet == nil || c.ReadinessProbe.HTTPGet.Path != "/readyz") {
				t.Errorf("%s: %s: readiness must be the gRPC health probe or GET /readyz", dir, w)
			}
			if c.LivenessProbe == nil || c.LivenessProbe.HTTPGet == nil || c.LivenessProbe.HTTPGet.Path != "/healthz" ||
				c.LivenessProbe.HTTPGet.Port != intstr.FromString(opsPort(svc)) {
				t.Errorf("%s: %s: liveness must be GET /healthz on port %q", dir, w, opsPort(svc))
			}
			if p := c.ReadinessProbe; p != nil && p.HTTPGet != nil && p.HTTPGet.Port != intstr.FromString(opsPort(svc)) {
				t.Errorf("%s: %s: GET /readyz must be on port %q", dir, w, opsPort(svc))
			}
			if spec.ServiceAccountName != svc || !accounts[svc] {
				t.Errorf("%s: %s: serviceAccountName %q, want its own ServiceAccount %q (rendered: %v)", dir, w, spec.ServiceAccountName, svc, accounts[svc])
			}
			if u := spec.SecurityContext; u == nil || u.RunAsUser == nil || *u.RunAsUser != 65532 {
				t.Errorf("%s: %s: want pod runAsUser 65532 (distroless nonroot)", dir, w)
			}
			ann := w.Template.Annotations
			if ann["prometheus.io/scrape"] != "true" || ann["prometheus.io/path"] != "/metrics" || ann["prometheus.io/port"] != strconv.Itoa(int(ports[opsPort(svc)])) {
				t.Errorf("%s: %s: scrape annotations %v, want scrape=true path=/metrics port=%d (%s)", dir, w, ann, ports[opsPort(svc)], opsPort(svc))
			}

			// Termination: grace > preStop sleep + drain + closes + flush.
			var shutdown time.Duration
			for _, name := range []string{"KURZ_SHUTDOWN_TIMEOUT", "KURZ_CLOSE_TIMEOUT", "KURZ_TELEMETRY_FLUSH_TIMEOUT"} {
				d, err := env[svc].duration(name)
				if err != nil {
					t.Errorf("%s: %s: %v", dir, w, err)
				}
				shutdown += d
			}
			var preStop int64
			if l := c.Lifecycle; l != nil && l.PreStop != nil {
				if l.PreStop.Sleep == nil {
					t.Errorf("%s: %s: preStop must be the native sleep action (the image has no shell)", dir, w)
				} else {
					preStop = l.PreStop.Sleep.Seconds
				}
			}
			grace := int64(30) // Kubernetes' default
			if spec.TerminationGracePeriodSeconds != nil {
				grace = *spec.TerminationGracePeriodSeconds
			}
			if grace <= preStop+int64(shutdown.Seconds()) {
				t.Errorf("%s: %s: terminationGracePeriodSeconds %d must exceed preStop %ds + KURZ_SHUTDOWN_TIMEOUT, KURZ_CLOSE_TIMEOUT and KURZ_TELEMETRY_FLUSH_TIMEOUT (%s)", dir, w, grace, preStop, shutdown)
			}
		}
	}
}

func TestProdHasReplicasAutoscalersAndBudgets(t *testing.T) {
	r := render(t, "overlays/prod")
	if n := len(typed[appsv1.StatefulSet](r)); n != 0 {
		t.Errorf("prod renders %d StatefulSets: stateful dependencies are managed outside the cluster", n)
	}
	// The one Secret is generated from service-auth.env, which the operator
	// provides and git ignores.
	for _, s := range typed[corev1.Secret](r) {
		if m := hashSuffix.FindStringSubmatch(s.Name); m == nil || m[1] != "kurz-service-auth" {
			t.Errorf("prod renders Secret %s: credentials must not be in the repository", s.Name)
		}
	}
	deployments := byName[appsv1.Deployment](r)
	hpa := map[string]int32{}
	for _, h := range typed[autoscalingv2.HorizontalPodAutoscaler](r) {
		ref := h.Spec.ScaleTargetRef
		d, ok := deployments[ref.Name]
		if ref.Kind != "Deployment" || !ok {
			t.Errorf("HPA %s targets %s/%s, which is not rendered", h.Name, ref.Kind, ref.Name)
			continue
		}
		min := int32(1)
		if h.Spec.MinReplicas != nil {
			min = *h.Spec.MinReplicas
		}
		if min < 2 || h.Spec.MaxReplicas <= min || len(h.Spec.Metrics) == 0 {
			t.Errorf("HPA %s: min %d max %d metrics %d, want min >= 2, max > min, a metric", h.Name, min, h.Spec.MaxReplicas, len(h.Spec.Metrics))
		}
		if d.Spec.Replicas != nil {
			t.Errorf("Deployment %s sets replicas although HPA %s owns them (each apply would reset the count)", d.Name, h.Name)
		}
		hpa[ref.Name] = min
	}
	for _, want := range []string{"redirect", "limiter"} {
		if _, ok := hpa[want]; !ok {
			t.Errorf("no HorizontalPodAutoscaler for %s", want)
		}
	}
	pdbs := typed[policyv1.PodDisruptionBudget](r)
	for name, d := range deployments {
		if _, scaled := hpa[name]; !scaled && (d.Spec.Replicas == nil || *d.Spec.Replicas < 2) {
			t.Errorf("Deployment %s: replicas %v, want >= 2 (or an HPA)", name, d.Spec.Replicas)
		}
		var covering []string
		for _, p := range pdbs {
			sel, err := metav1.LabelSelectorAsSelector(p.Spec.Selector)
			if err != nil {
				t.Errorf("PDB %s: %v", p.Name, err)
				continue
			}
			if sel.Matches(labels.Set(d.Spec.Template.Labels)) {
				covering = append(covering, p.Name)
				if p.Spec.MinAvailable == nil && p.Spec.MaxUnavailable == nil {
					t.Errorf("PDB %s sets neither minAvailable nor maxUnavailable", p.Name)
				}
			}
		}
		if len(covering) != 1 {
			t.Errorf("Deployment %s is covered by PDBs %v, want exactly one", name, covering)
		}
		spread := d.Spec.Template.Spec.TopologySpreadConstraints
		a := d.Spec.Template.Spec.Affinity
		if len(spread) == 0 && (a == nil || a.PodAntiAffinity == nil) {
			t.Errorf("Deployment %s has neither topologySpreadConstraints nor podAntiAffinity", name)
		}
		for _, tsc := range spread {
			sel, err := metav1.LabelSelectorAsSelector(tsc.LabelSelector)
			if err != nil || !sel.Matches(labels.Set(d.Spec.Template.Labels)) {
				t.Errorf("Deployment %s: topology spread on %s does not select its own pods", name, tsc.TopologyKey)
			}
			if _, own := tsc.LabelSelector.MatchLabels["app.kubernetes.io/name"]; !own && !slices.Contains(tsc.MatchLabelKeys, "app.kubernetes.io/name") {
				t.Errorf("Deployment %s: topology spread on %s counts other services' pods too", name, tsc.TopologyKey)
			}
		}
	}
}

// A topology spread constraint counts, by default, nodes whose taints the
// pod does not tolerate (nodeTaintsPolicy Ignore): a control-plane node, a
// dedicated pool or a cordoned node holds none of our pods, so the global
// minimum is 0 and with maxSkew 1 each schedulable node takes one pod per
// service (an HPA's 20 redirects on 6 workers schedules 6; a drained node's
// replacement is unschedulable). Honor leaves those nodes out. Node affinity
// is honoured by default; a constraint that sets it must not turn it off.
func TestSpreadCountsOnlyNodesThePodsCanUse(t *testing.T) {
	for _, dir := range overlays {
		for _, d := range typed[appsv1.Deployment](render(t, dir)) {
			for _, tsc := range d.Spec.Template.Spec.TopologySpreadConstraints {
				if p := tsc.NodeTaintsPolicy; p == nil || *p != corev1.NodeInclusionPolicyHonor {
					t.Errorf("%s: Deployment %s: topology spread on %s: nodeTaintsPolicy %v, want Honor (Ignore counts tainted nodes that never get a pod)", dir, d.Name, tsc.TopologyKey, deref(p))
				}
				if p := tsc.NodeAffinityPolicy; p != nil && *p != corev1.NodeInclusionPolicyHonor {
					t.Errorf("%s: Deployment %s: topology spread on %s: nodeAffinityPolicy %s, want Honor (the default)", dir, d.Name, tsc.TopologyKey, *p)
				}
			}
		}
	}
}

// deref is *p, or "unset".
func deref[T any](p *T) any {
	if p == nil {
		return "unset"
	}
	return *p
}

// With GOMEMLIMIT set the services run with GOGC=400 (pkg/server): the
// heap grows to about GOMEMLIMIT between collections, so that is a busy
// pod's steady state (a shortener under load: 214 MiB RSS at 200MiB). A
// memory request below it lets the scheduler pack pods onto memory they
// will use, and the kubelet evicts pods above their request first.
func TestMemoryRequestCoversGoMemLimit(t *testing.T) {
	for _, dir := range overlays {
		for _, w := range workloads(render(t, dir)) {
			if kurzService(w) == "" {
				continue
			}
			for _, c := range w.Template.Spec.Containers {
				var gml string
				for _, e := range c.Env {
					if e.Name == "GOMEMLIMIT" {
						gml = e.Value
					}
				}
				want, err := parseGoMemLimit(gml)
				if err != nil {
					t.Errorf("%s: %s container %s: %v", dir, w, c.Name, err)
					continue
				}
				if req := c.Resources.Requests[corev1.ResourceMemory]; req.Value() < want {
					t.Errorf("%s: %s container %s: memory request %s is below GOMEMLIMIT=%s, the heap a busy pod grows to", dir, w, c.Name, req.String(), gml)
				}
			}
		}
	}
}

func TestDevHasOneReplicaAndTheStatefulDependencies(t *testing.T) {
	r := render(t, "overlays/dev")
	for _, d := range typed[appsv1.Deployment](r) {
		if d.Spec.Replicas == nil || *d.Spec.Replicas != 1 {
			t.Errorf("dev Deployment %s: replicas %v, want 1", d.Name, d.Spec.Replicas)
		}
	}
	sts := byName[appsv1.StatefulSet](r)
	headless := map[string]bool{}
	for _, s := range typed[corev1.Service](r) {
		if s.Spec.ClusterIP == corev1.ClusterIPNone {
			headless[s.Name] = true
		}
	}
	images := map[string]string{"redis": "redis:7.2.", "postgres": "postgres:16.", "clickhouse": "clickhouse/clickhouse-server:24.8."}
	for name, prefix := range images {
		s, ok := sts[name]
		if !ok {
			t.Errorf("dev has no StatefulSet %s", name)
			continue
		}
		if img := s.Spec.Template.Spec.Containers[0].Image; !strings.HasPrefix(img, prefix) {
			t.Errorf("StatefulSet %s: image %s, want %s*", name, img, prefix)
		}
		if !headless[s.Spec.ServiceName] {
			t.Errorf("StatefulSet %s: serviceName %q is not a headless Service", name, s.Spec.ServiceName)
		}
		if len(s.Spec.VolumeClaimTemplates) == 0 {
			t.Errorf("StatefulSet %s has no PersistentVolumeClaim template", name)
		}
	}
	if s := sts["redis"]; s != nil {
		if s.Spec.Replicas == nil || *s.Spec.Replicas != 6 {
			t.Errorf("redis: replicas %v, want 6 (3 masters, 3 replicas)", s.Spec.Replicas)
		}
		args := strings.Join(s.Spec.Template.Spec.Containers[0].Args, " ")
		if !strings.Contains(args, "--cluster-enabled yes") {
			t.Errorf("redis: args %q do not enable cluster mode", args)
		}
	}
	var job string
	for _, j := range typed[batchv1.Job](r) {
		script := strings.Join(append(j.Spec.Template.Spec.Containers[0].Command, j.Spec.Template.Spec.Containers[0].Args...), " ")
		if strings.Contains(script, "--cluster create") {
			job = j.Name
			c := j.Spec.Template.Spec.Containers[0]
			if len(c.Command) == 2 && c.Command[0] == "sh" && c.Command[1] == "-c" && len(c.Args) == 1 {
				if out, err := exec.Command("sh", "-n", "-c", c.Args[0]).CombinedOutput(); err != nil {
					t.Errorf("Job %s: sh -n: %v\n%s", j.Name, err, out)
				}
			} else {
				t.Errorf("Job %s: want command [sh -c] and the script as the only arg", j.Name)
			}
			for _, want := range []string{"--cluster-replicas 1", "--cluster-yes", "cluster_state", "ok"} {
				if !strings.Contains(script, want) {
					t.Errorf("Job %s: script lacks %q", j.Name, want)
				}
			}
		}
	}
	if job == "" {
		t.Error("dev has no Job that forms the Redis Cluster (redis-cli --cluster create)")
	}
}

// The prod overlay's scale-out settings agree with each other: the
// limiter's replica bound is its HPA's maximum, and analytics runs in
// cluster mode against more than one ClickHouse node.
func TestProdScaleOutSettings(t *testing.T) {
	r := render(t, "overlays/prod")
	envs := serviceEnvironments(t, r)
	var max int32
	for _, h := range typed[autoscalingv2.HorizontalPodAutoscaler](r) {
		if h.Spec.ScaleTargetRef.Name == "limiter" {
			max = h.Spec.MaxReplicas
		}
	}
	if got, _ := envs["limiter"].value("KURZ_LIMITER_MAX_REPLICAS"); got != strconv.Itoa(int(max)) || max == 0 {
		t.Errorf("limiter: KURZ_LIMITER_MAX_REPLICAS=%q, want the limiter HPA's maxReplicas %d", got, max)
	}
	if v, _ := envs["analytics"].value("KURZ_CLICKHOUSE_CLUSTER"); v == "" {
		t.Error("analytics: KURZ_CLICKHOUSE_CLUSTER is not set: prod's ClickHouse is a replicated cluster")
	}
	if v, _ := envs["analytics"].value("KURZ_CLICKHOUSE_ADDRS"); len(strings.Split(v, ",")) < 2 {
		t.Errorf("analytics: KURZ_CLICKHOUSE_ADDRS=%q, want several nodes of the cluster", v)
	}
}

// The prod overlay's PostgreSQL connections at its HPAs' maxima, one
// surge pod per Deployment during a rollout, are the figure the README
// gives operators to size max_connections by: each pod's pool
// (KURZ_POSTGRES_MAX_CONNS) plus the limiter's LISTEN connection.
func TestProdPostgresConnectionBudgetIsStated(t *testing.T) {
	r := render(t, "overlays/prod")
	envs := serviceEnvironments(t, r)
	maxPods := map[string]int32{}
	for _, h := range typed[autoscalingv2.HorizontalPodAutoscaler](r) {
		maxPods[h.Spec.ScaleTargetRef.Name] = h.Spec.MaxReplicas
	}
	total, least := 0, 0
	var parts []string
	for _, d := range typed[appsv1.Deployment](r) {
		e, ok := envs[d.Name]
		if !ok {
			continue
		}
		if _, uses := e.Given["KURZ_POSTGRES_URL"]; !uses {
			continue
		}
		size, err := strconv.Atoi(e.Given["KURZ_POSTGRES_MAX_CONNS"].Value)
		if err != nil || size < 1 {
			t.Errorf("%s uses PostgreSQL without a pool size of its own (KURZ_POSTGRES_MAX_CONNS %q): the default, 16 a pod, does not fit", d.Name, e.Given["KURZ_POSTGRES_MAX_CONNS"].Value)
			continue
		}
		if d.Name == "limiter" {
			size++ // the rules' LISTEN connection, outside the pool
		}
		pods, minPods := maxPods[d.Name], maxPods[d.Name]
		if pods == 0 && d.Spec.Replicas != nil {
			pods, minPods = *d.Spec.Replicas, *d.Spec.Replicas
		}
		for _, h := range typed[autoscalingv2.HorizontalPodAutoscaler](r) {
			if h.Spec.ScaleTargetRef.Name == d.Name && h.Spec.MinReplicas != nil {
				minPods = *h.Spec.MinReplicas
			}
		}
		surge := 0
		if ru := d.Spec.Strategy.RollingUpdate; ru != nil && ru.MaxSurge != nil {
			surge = ru.MaxSurge.IntValue()
		}
		total += (int(pods) + surge) * size
		least += int(minPods) * size
		parts = append(parts, fmt.Sprintf("%s (%d+%d)×%d", d.Name, pods, surge, size))
	}
	readme, err := os.ReadFile(filepath.Join(repoRoot(t), "deploy", "k8s", "README.md"))
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{fmt.Sprintf("**%d** PostgreSQL connections", total), fmt.Sprintf("%d at the minimum replicas", least)} {
		if !strings.Contains(string(readme), want) {
			t.Errorf("deploy/k8s/README.md does not say %q (%s)", want, strings.Join(parts, " + "))
		}
	}
}
