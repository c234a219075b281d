package server_test

import (
	"context"
	"errors"
	"io"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"kurz.dev/pkg/server"
	"kurz.dev/pkg/testkit/servertest"
)

// startWith runs a bare server with cfg on loopback ports.
func startWith(t *testing.T, cfg server.Config, setup func(*server.Server)) *servertest.Running {
	t.Helper()
	cfg.GRPCAddr, cfg.HTTPAddr = "127.0.0.1:0", "127.0.0.1:0"
	log := servertest.Logger(t)
	srv, err := server.New(context.Background(), "ops-test", cfg, server.NewLifecycle(log, 0), log)
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	if setup != nil {
		setup(srv)
	}
	return servertest.Start(t, srv)
}

// getStatus is the status of GET url.
func getStatus(t *testing.T, url string) int {
	t.Helper()
	code, _ := getHost(t, url, "")
	return code
}

// awaitReady polls base/readyz (bounded) until it answers 200.
func awaitReady(t *testing.T, base string) {
	t.Helper()
	deadline := time.Now().Add(15 * time.Second)
	for getStatus(t, base+"/readyz") != http.StatusOK {
		if time.Now().After(deadline) {
			t.Fatal("/readyz never answered 200")
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// With an ops listener, the public listener answers 404 for /readyz,
// /metrics and pprof and keeps /healthz (liveness, no dependency pinged);
// the ops listener serves all four.
func TestOpsRoutesOnlyOnTheOpsListener(t *testing.T) {
	r := startWith(t, server.Config{OpsAddr: "127.0.0.1:0", Pprof: true}, nil)
	if r.Ops == r.HTTP {
		t.Fatalf("ops listener %s is the HTTP listener", r.Ops)
	}
	awaitReady(t, r.Ops)
	for path, want := range map[string]int{"/healthz": 200, "/readyz": 404, "/metrics": 404, "/debug/pprof/": 404} {
		if got := getStatus(t, r.HTTP+path); got != want {
			t.Errorf("public %s: %d, want %d", path, got, want)
		}
	}
	for _, path := range []string{"/healthz", "/readyz", "/metrics", "/debug/pprof/"} {
		if got := getStatus(t, r.Ops+path); got != http.StatusOK {
			t.Errorf("ops %s: %d, want 200", path, got)
		}
	}
}

// Without an ops listener (the internal services), the ops routes stay on
// the HTTP listener.
func TestWithoutOpsAddrOpsRoutesStayOnHTTP(t *testing.T) {
	r := startWith(t, server.Config{}, nil)
	if r.Ops != r.HTTP {
		t.Fatalf("ops %s, want the HTTP listener %s", r.Ops, r.HTTP)
	}
	awaitReady(t, r.HTTP)
	for _, path := range []string{"/healthz", "/readyz", "/metrics"} {
		if got := getStatus(t, r.HTTP+path); got != http.StatusOK {
			t.Errorf("%s: %d, want 200", path, got)
		}
	}
}

// 1,000 concurrent /readyz requests ping no dependency: /readyz answers the
// last background run of the checks, and with an hour between runs the
// check runs once (at start) whatever the probes do.
func TestReadyzFloodPingsNoDependency(t *testing.T) {
	var pings atomic.Int64
	r := startWith(t, server.Config{ReadinessInterval: time.Hour}, func(s *server.Server) {
		s.AddCheck("dependency", func(context.Context) error { pings.Add(1); return nil })
	})
	awaitReady(t, r.HTTP)
	before := pings.Load()

	const flood = 1000
	var wg sync.WaitGroup
	var notOK atomic.Int64
	client := &http.Client{Transport: &http.Transport{MaxConnsPerHost: 64, MaxIdleConnsPerHost: 64}}
	for range flood {
		wg.Go(func() {
			resp, err := client.Get(r.HTTP + "/readyz")
			if err != nil {
				notOK.Add(1)
				return
			}
			_, _ = io.Copy(io.Discard, resp.Body)
			_ = resp.Body.Close()
			if resp.StatusCode != http.StatusOK {
				notOK.Add(1)
			}
		})
	}
	wg.Wait()
	if n := notOK.Load(); n != 0 {
		t.Errorf("%d of %d /readyz requests failed or were not 200", n, flood)
	}
	if got := pings.Load(); before != 1 || got != before {
		t.Errorf("dependency pinged %d times at start and %d during %d /readyz requests; want once, then none", before, got-before, flood)
	}
}

// kurz_dependency_up on /metrics follows the readiness checks: 1 for a
// passing check, 0 for a failing one (hard or soft), and it changes when a
// check's result does.
func TestDependencyUpFollowsTheChecks(t *testing.T) {
	var storeDown atomic.Bool
	r := startWith(t, server.Config{ReadinessInterval: 20 * time.Millisecond}, func(s *server.Server) {
		s.AddCheck("postgres", func(context.Context) error { return nil })
		s.AddSoftCheck("redis", func(context.Context) error {
			if storeDown.Load() {
				return errors.New("connection refused")
			}
			return nil
		})
	})
	scrape := func() string {
		resp, err := http.Get(r.HTTP + "/metrics")
		if err != nil {
			return err.Error()
		}
		defer resp.Body.Close()
		body, _ := io.ReadAll(resp.Body)
		var lines []string
		for l := range strings.Lines(string(body)) {
			if strings.HasPrefix(l, "kurz_dependency_up{") {
				lines = append(lines, strings.TrimSpace(l))
			}
		}
		return strings.Join(lines, "\n")
	}
	up := func(check, value string) func() (bool, string) {
		return func() (bool, string) {
			got := scrape()
			for l := range strings.Lines(got) {
				if strings.Contains(l, `check="`+check+`"`) && strings.HasSuffix(strings.TrimSpace(l), " "+value) {
					return true, got
				}
			}
			return false, got
		}
	}
	if ok, got := servertest.EventuallyState(10*time.Second, up("redis", "1")); !ok {
		t.Fatalf("redis check passing: want kurz_dependency_up{check=\"redis\"} 1, got:\n%s", got)
	}
	storeDown.Store(true)
	if ok, got := servertest.EventuallyState(10*time.Second, up("redis", "0")); !ok {
		t.Fatalf("redis check failing: want kurz_dependency_up{check=\"redis\"} 0, got:\n%s", got)
	}
	if ok, got := up("postgres", "1")(); !ok {
		t.Errorf("postgres check passing: want kurz_dependency_up{check=\"postgres\"} 1, got:\n%s", got)
	}
}

// getHost is the status and body of GET url sent with Host host (""
// for url's).
func getHost(t *testing.T, url, host string) (int, string) {
	t.Helper()
	req, err := http.NewRequest(http.MethodGet, url, nil)
	if err != nil {
		t.Fatal(err)
	}
	req.Host = host
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatalf("GET %s (Host %s): %v", url, host, err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(body)
}

// A page that rebinds its own name to a forwarded ops port is refused
// there (421, before any route), while its IP and a Kubernetes Service
// name are served; the public listener answers any name (custom domains).
func TestOpsListenerRefusesARebindingHost(t *testing.T) {
	r := startWith(t, server.Config{OpsAddr: "127.0.0.1:0", Pprof: true}, nil)
	awaitReady(t, r.Ops)
	port := r.Ops[strings.LastIndexByte(r.Ops, ':'):]
	for _, path := range []string{"/metrics", "/debug/pprof/", "/readyz", "/healthz"} {
		code, body := getHost(t, r.Ops+path, "rebind.attacker.example"+port)
		if code != http.StatusMisdirectedRequest || !strings.Contains(body, "KURZ_OPS_ALLOWED_HOSTS") {
			t.Errorf("ops %s for rebind.attacker.example: %d %q, want 421 naming KURZ_OPS_ALLOWED_HOSTS", path, code, body)
		}
		for _, host := range []string{"127.0.0.1" + port, "localhost" + port, "redirect.kurz.svc.cluster.local" + port} {
			if code, body := getHost(t, r.Ops+path, host); code != http.StatusOK {
				t.Errorf("ops %s for %s: %d %q, want 200", path, host, code, body)
			}
		}
	}
	if code, body := getHost(t, r.HTTP+"/healthz", "go.customer.example"); code != http.StatusOK {
		t.Errorf("public /healthz for go.customer.example: %d %q, want 200", code, body)
	}
}

// Without an ops listener the HTTP listener serves the ops routes, so it
// has their Host check; KURZ_OPS_ALLOWED_HOSTS adds names to it.
func TestHTTPListenerWithTheOpsRoutesChecksTheHost(t *testing.T) {
	r := startWith(t, server.Config{OpsAllowedHosts: []string{"metrics.example.internal"}}, nil)
	awaitReady(t, r.HTTP)
	for host, want := range map[string]int{
		"rebind.attacker.example":  http.StatusMisdirectedRequest,
		"127.0.0.1":                http.StatusOK,
		"limiter":                  http.StatusOK,
		"metrics.example.internal": http.StatusOK,
	} {
		if code, body := getHost(t, r.HTTP+"/metrics", host); code != want {
			t.Errorf("/metrics for %s: %d %.100q, want %d", host, code, body, want)
		}
	}
}
