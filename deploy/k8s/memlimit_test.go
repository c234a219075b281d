package k8s

import (
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"

	"kurz.dev/pkg/server"
)

// maxMemLimitShare is the largest share of a container's memory limit its
// GOMEMLIMIT may be: the runtime does not count the binary's text nor what
// the kernel charges around it, and the heap briefly overshoots the soft
// limit.
const maxMemLimitShare = 0.85

// goMemLimitUnits are the suffixes the Go runtime accepts in GOMEMLIMIT.
var goMemLimitUnits = []struct {
	suffix string
	shift  uint
}{{"TiB", 40}, {"GiB", 30}, {"MiB", 20}, {"KiB", 10}, {"B", 0}}

// parseGoMemLimit reads a GOMEMLIMIT value as the runtime does: a whole
// number of bytes with an optional B, KiB, MiB, GiB or TiB suffix ("off"
// and anything else is an error here: every service must have a limit).
func parseGoMemLimit(v string) (int64, error) {
	num, shift := v, uint(0)
	for _, u := range goMemLimitUnits {
		if n, ok := strings.CutSuffix(v, u.suffix); ok {
			num, shift = n, u.shift
			break
		}
	}
	n, err := strconv.ParseInt(num, 10, 64)
	if err != nil || n <= 0 || n > (1<<62)>>shift {
		return 0, fmt.Errorf("GOMEMLIMIT=%q is not a positive size such as 200MiB", v)
	}
	return n << shift, nil
}

// goMemLimitProblem says why c's GOMEMLIMIT does not keep the Go runtime
// under the container's memory limit, or "".
func goMemLimitProblem(c corev1.Container) string {
	limit, ok := c.Resources.Limits[corev1.ResourceMemory]
	if !ok {
		return "no memory limit"
	}
	var found []corev1.EnvVar
	for _, e := range c.Env {
		if e.Name == "GOMEMLIMIT" {
			found = append(found, e)
		}
	}
	switch {
	case len(found) == 0:
		return "no GOMEMLIMIT: the Go runtime does not know the memory limit and grows its heap past it"
	case len(found) > 1:
		return "GOMEMLIMIT set more than once"
	case found[0].ValueFrom != nil:
		return "GOMEMLIMIT must be a literal value"
	}
	got, err := parseGoMemLimit(found[0].Value)
	if err != nil {
		return err.Error()
	}
	if ceiling := int64(float64(limit.Value()) * maxMemLimitShare); got > ceiling {
		return fmt.Sprintf("GOMEMLIMIT=%s is more than %.0f%% of the memory limit %s", found[0].Value, maxMemLimitShare*100, limit.String())
	}
	return ""
}

// TestGoMemLimitBelowMemoryLimit: every kurz service container sets
// GOMEMLIMIT below its memory limit, in every overlay (issue #16: without
// it a burst grows the heap past the pod's limit and the pod is OOM-killed).
func TestGoMemLimitBelowMemoryLimit(t *testing.T) {
	for _, dir := range overlays {
		r := render(t, dir)
		seen := 0
		for _, w := range workloads(r) {
			if kurzService(w) == "" {
				continue
			}
			seen++
			for _, c := range w.Template.Spec.Containers {
				if p := goMemLimitProblem(c); p != "" {
					t.Errorf("%s: %s container %s: %s", dir, w, c.Name, p)
				}
			}
		}
		if seen != len(services) {
			t.Errorf("%s: checked %d kurz services, want %d", dir, seen, len(services))
		}
	}
}

func TestGoMemLimitCheckCatchesMistakes(t *testing.T) {
	for v, want := range map[string]int64{"200MiB": 200 << 20, "1GiB": 1 << 30, "1048576": 1 << 20, "512KiB": 512 << 10, "10B": 10} {
		if got, err := parseGoMemLimit(v); err != nil || got != want {
			t.Errorf("parseGoMemLimit(%q) = %d, %v; want %d", v, got, err, want)
		}
	}
	for _, v := range []string{"", "off", "200M", "200Mi", "-1MiB", "1.5GiB", "MiB"} {
		if _, err := parseGoMemLimit(v); err == nil {
			t.Errorf("parseGoMemLimit(%q) accepted", v)
		}
	}
	c := func(limit string, env ...corev1.EnvVar) corev1.Container {
		var ctr corev1.Container
		ctr.Env = env
		if limit != "" {
			ctr.Resources.Limits = corev1.ResourceList{corev1.ResourceMemory: resource.MustParse(limit)}
		}
		return ctr
	}
	gml := func(v string) corev1.EnvVar { return corev1.EnvVar{Name: "GOMEMLIMIT", Value: v} }
	for name, tc := range map[string]struct {
		c    corev1.Container
		want string
	}{
		"fits":       {c("256Mi", gml("200MiB")), ""},
		"missing":    {c("256Mi"), "no GOMEMLIMIT"},
		"at limit":   {c("256Mi", gml("256MiB")), "more than"},
		"over limit": {c("128Mi", gml("200MiB")), "more than"},
		"twice":      {c("256Mi", gml("200MiB"), gml("100MiB")), "more than once"},
		"off":        {c("256Mi", gml("off")), "not a positive size"},
		"no limit":   {c("", gml("200MiB")), "no memory limit"},
	} {
		got := goMemLimitProblem(tc.c)
		if (tc.want == "") != (got == "") || !strings.Contains(got, tc.want) {
			t.Errorf("%s: problem %q, want one containing %q", name, got, tc.want)
		}
	}
}

// TestLocalLauncherSetsThePodsGoMemLimit: deploy/local/services.sh (make up)
// runs every service with the GOMEMLIMIT its pod has in overlays/prod.
func TestLocalLauncherSetsThePodsGoMemLimit(t *testing.T) {
	script, err := os.ReadFile(filepath.Join(repoRoot(t), "deploy", "local", "services.sh"))
	if err != nil {
		t.Fatal(err)
	}
	m := regexp.MustCompile(`(?m)^declare -A GOMEMLIMITS=\((.*)\)$`).FindSubmatch(script)
	if m == nil {
		t.Fatal("services.sh has no line declare -A GOMEMLIMITS=(...)")
	}
	local := map[string]string{}
	for _, kv := range regexp.MustCompile(`\[(\w+)\]=(\S+)`).FindAllSubmatch(m[1], -1) {
		local[string(kv[1])] = string(kv[2])
	}
	pods := map[string]string{}
	for _, w := range workloads(render(t, "overlays/prod")) {
		if svc := kurzService(w); svc != "" {
			for _, e := range w.Template.Spec.Containers[0].Env {
				if e.Name == "GOMEMLIMIT" {
					pods[svc] = e.Value
				}
			}
		}
	}
	for _, svc := range services {
		if local[svc] == "" || local[svc] != pods[svc] {
			t.Errorf("services.sh runs %s with GOMEMLIMIT %q, its pod with %q", svc, local[svc], pods[svc])
		}
	}
}

// grpcSigned are the services that refuse a gRPC call without a service
// assertion before reading its request (pkg/svcauth's tap): a stranger
// makes them hold no request, and their derived call bound counts the
// small size (server.GRPCStrangerRecvSize).
var grpcSigned = map[string]bool{"shortener": true, "analytics": true}

// grpcRecvSizes is each service's gRPC receive bound, as its app sets it
// (each app's tests hold it to it).
var grpcRecvSizes = map[string]int{
	"limiter":   server.LimiterGRPCMaxRecvMsgSize,
	"shortener": server.DefaultGRPCMaxRecvMsgSize,
	"redirect":  server.SmallGRPCMaxRecvMsgSize,
	"analytics": server.SmallGRPCMaxRecvMsgSize,
	"gateway":   server.SmallGRPCMaxRecvMsgSize,
}

// maxGRPCRequestShare is the largest share of a container's memory limit
// that the gRPC requests arriving at once may take: the calls the server
// holds (KURZ_GRPC_MAX_CALLS, or the bound it derives from GOMEMLIMIT)
// times its receive bound. gRPC grants each call the window of the message
// it declares, so a caller can fill them all at once.
const maxGRPCRequestShare = 0.25

// TestGRPCRequestsInFlightFitTheMemoryLimit: in every overlay, no kurz
// service can be made to hold more than maxGRPCRequestShare of its memory
// limit in gRPC requests arriving by a caller without the service key
// (1,024 calls of 4 MiB once let the limiter and the shortener be pushed
// gigabytes past a 256Mi limit).
func TestGRPCRequestsInFlightFitTheMemoryLimit(t *testing.T) {
	for _, dir := range overlays {
		for svc, e := range serviceEnvironments(t, render(t, dir)) {
			recv, ok := grpcRecvSizes[svc]
			if !ok {
				t.Errorf("%s: %s has no gRPC receive bound in grpcRecvSizes", dir, svc)
				continue
			}
			limit, ok := e.Workload.Template.Spec.Containers[0].Resources.Limits[corev1.ResourceMemory]
			if !ok {
				t.Errorf("%s: %s has no memory limit", dir, svc)
				continue
			}
			gml, err := parseGoMemLimit(e.Given["GOMEMLIMIT"].Value)
			if err != nil {
				t.Errorf("%s: %s: %v", dir, svc, err)
				continue
			}
			if grpcSigned[svc] {
				recv = server.GRPCStrangerRecvSize(recv, true)
			}
			calls, how := server.GRPCMaxCallsFor(gml, recv), "derived from GOMEMLIMIT"
			if v, set := e.Given["KURZ_GRPC_MAX_CALLS"]; set && v.Value != "0" {
				if calls, err = strconv.Atoi(v.Value); err != nil {
					t.Errorf("%s: %s: KURZ_GRPC_MAX_CALLS=%q: %v", dir, svc, v.Value, err)
					continue
				}
				how = "KURZ_GRPC_MAX_CALLS, " + v.From
			}
			held := int64(calls) * int64(recv)
			if ceiling := int64(float64(limit.Value()) * maxGRPCRequestShare); held > ceiling {
				t.Errorf("%s: %s holds up to %d gRPC calls (%s) of %d KiB requests, %d MiB: more than %.0f%% of its memory limit %s",
					dir, svc, calls, how, recv>>10, held>>20, maxGRPCRequestShare*100, limit.String())
			}
		}
	}
}
