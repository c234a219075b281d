//go:build integration

package app

import (
	"context"
	"log/slog"
	"net/http"
	"slices"
	"strings"
	"testing"

	"kurz.dev/pkg/testkit/limitertest"
	"kurz.dev/pkg/testkit/servertest"
)

func TestBootsHealthyWithGRPCHealthOnly(t *testing.T) {
	r := start(t, nil, hooks{})
	r.AssertOps(t, "redis", "postgres", "custom_domains")
	want := []string{"grpc.health.v1.Health", "grpc.reflection.v1.ServerReflection", "grpc.reflection.v1alpha.ServerReflection"}
	if got := r.GRPCServices(t); !slices.Equal(got, want) {
		t.Errorf("reflection lists %v, want %v", got, want)
	}
	if err := r.Stop(); err != nil {
		t.Errorf("graceful stop: %v", err)
	}
}

// The public listener answers 404 for /readyz, /metrics and pprof (a short
// code lookup finds no such link) and 200 for /healthz; the ops listener
// (KURZ_REDIRECT_OPS_ADDR) serves them all.
func TestOpsRoutesAreOnlyOnTheOpsListener(t *testing.T) {
	r := start(t, map[string]string{"KURZ_PPROF": "true"}, hooks{})
	r.AssertOpsOffPublic(t)
	r.AssertOps(t, "redis", "postgres")
	if code, _ := r.GetOps(t, "/debug/pprof/"); code != http.StatusOK {
		t.Errorf("ops /debug/pprof/: %d, want 200", code)
	}
}

// The ops listener answers the pod's IP and its Service's names only: a
// web page that rebinds its own name to a forwarded ops port is refused
// (421) before /metrics or pprof. The public listener serves any name
// (custom domains arrive there).
func TestOpsListenerRefusesARebindingHost(t *testing.T) {
	r := start(t, map[string]string{"KURZ_PPROF": "true"}, hooks{})
	port := r.Ops[strings.LastIndexByte(r.Ops, ':'):]
	for _, path := range []string{"/metrics", "/debug/pprof/"} {
		for host, want := range map[string]int{
			"rebind.attacker.example" + port:         http.StatusMisdirectedRequest,
			"127.0.0.1" + port:                       http.StatusOK,
			"redirect.kurz.svc.cluster.local" + port: http.StatusOK,
		} {
			if got := getHost(t, r.Ops, path, host); got.StatusCode != want {
				t.Errorf("ops %s for %s: %d, want %d", path, host, got.StatusCode, want)
			}
		}
	}
	if got := getHost(t, r.HTTP, "/healthz", "rebind.attacker.example"); got.StatusCode != http.StatusOK {
		t.Errorf("public /healthz for any name: %d, want 200", got.StatusCode)
	}
}

func TestFailsFastNamingTheMissingDependency(t *testing.T) {
	cfg := load(t, map[string]string{"KURZ_POSTGRES_URL": "postgres://kurz:kurz@127.0.0.1:1/kurz?sslmode=disable"})
	_, err := New(context.Background(), cfg, servertest.Logger(t))
	if err == nil || !strings.Contains(err.Error(), "KURZ_POSTGRES_URL") {
		t.Fatalf("got %v, want an error naming KURZ_POSTGRES_URL", err)
	}
}

// A KURZ_REDIRECT_VISIT_REPLICAS above the cluster's replicas per master
// would refuse every visit of a visit-limited link while the pod looks
// healthy: the start warns, naming the variable, and /readyz reports the
// check degraded while the pod stays ready for every other link.
func TestVisitReplicasBeyondTheClusterWarnedAndDegraded(t *testing.T) {
	var logs servertest.SyncBuffer
	cfg := load(t, map[string]string{"KURZ_REDIRECT_VISITOR_SALT": testSalt, "KURZ_REDIRECT_VISIT_REPLICAS": "100",
		"KURZ_LIMITER_GRPC_ADDR": limitertest.Start(t, limitertest.AllowAll).Addr()})
	srv, err := build(context.Background(), cfg, slog.New(slog.NewJSONHandler(&logs, nil)), hooks{})
	if err != nil {
		t.Fatalf("build: %v", err)
	}
	if out := logs.String(); !strings.Contains(out, "KURZ_REDIRECT_VISIT_REPLICAS=100") {
		t.Errorf("start log names no KURZ_REDIRECT_VISIT_REPLICAS=100:\n%s", out)
	}
	r := servertest.Start(t, srv)
	r.AwaitServing(t, "")
	if code, body := r.AwaitReadyz(t); code != http.StatusOK || !strings.Contains(body, `"redis_replicas":"degraded"`) {
		t.Errorf("/readyz: %d %s, want 200 with redis_replicas degraded", code, body)
	}

	// The default (1) on the test cluster, one replica per master.
	start(t, nil, hooks{}).AssertOps(t, "redis", "postgres", "redis_replicas")
}
