// Package servertest boots a kurz service in-process for tests: real
// listeners on loopback, real dependencies, a real shutdown.
package servertest

import (
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"net/http"
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	reflectionpb "google.golang.org/grpc/reflection/grpc_reflection_v1"

	"kurz.dev/pkg/config"
	"kurz.dev/pkg/server"
	"kurz.dev/pkg/svcauth"
)

// Env overrides the process environment for config.LoadFrom: keys in
// overrides win, everything else comes from the real environment (which
// `make test` points at the local stack), and the test defaults (the
// service auth key, the shortener's code key) fill what neither sets.
func Env(overrides map[string]string) config.Lookup {
	return func(name string) (string, bool) {
		if v, ok := overrides[name]; ok {
			return v, true
		}
		if v, ok := os.LookupEnv(name); ok || testDefaults[name] == "" {
			return v, ok
		}
		return testDefaults[name], true
	}
}

// ServiceAuthKey is the KURZ_SERVICE_AUTH_KEY of services a test starts
// (with Env, StartProcess or StartAll) when the environment sets none. It
// is no secret: test stacks listen on loopback.
const ServiceAuthKey = "kurz-test-service-auth-key-not-a-secret"

// CodeKey is the KURZ_SHORTENER_CODE_KEY of shorteners a test starts the
// same way: a test reads a block code's ID back with
// linkcode.NewPermutation([]byte(CodeKey)).
const CodeKey = "kurz-test-shortener-code-key-not-a-secret"

const serviceAuthVar = "KURZ_SERVICE_AUTH_KEY"

// testDefaults are the secrets and settings every test-started service gets
// unless the environment or the test sets them. Test analytics services
// keep every raw click: tests share a database and some write clicks dated
// long ago (the retention is tested on a database of its own).
var testDefaults = map[string]string{
	serviceAuthVar:            ServiceAuthKey,
	"KURZ_SHORTENER_CODE_KEY": CodeKey,
	// Every test shortener shares the webhook queue of the test database:
	// only the stacks that test webhooks send (webhooktest.Env).
	"KURZ_SHORTENER_WEBHOOK_SEND":  "false",
	"KURZ_ANALYTICS_RAW_RETENTION": "0",
}

// defaultEnv is testDefaults as KEY=value lines, for a process environment
// (later lines of the same variable win).
func defaultEnv() []string {
	var env []string
	for k, v := range testDefaults {
		env = append(env, k+"="+v)
	}
	return env
}

func serviceAuthKey() string {
	if v := os.Getenv(serviceAuthVar); v != "" {
		return v
	}
	return ServiceAuthKey
}

// ServiceAuthKeys are the keys of the test's services: the environment's
// KURZ_SERVICE_AUTH_KEY, else ServiceAuthKey.
func ServiceAuthKeys() *svcauth.Keys {
	return svcauth.NewKeys([]byte(serviceAuthKey()), nil)
}

// ServiceAuth is a dial option that signs every call with the key of the
// test's services (see ServiceAuthKeys), for the tenant in the call's
// x-kurz-tenant metadata: a test calls the shortener or analytics directly
// as the gateway would.
func ServiceAuth() grpc.DialOption { return ServiceAuthKeys().DialOption() }

// Logger writes the service's log lines into the test log.
func Logger(t testing.TB) *slog.Logger {
	return slog.New(slog.NewTextHandler(testWriter{t}, &slog.HandlerOptions{Level: slog.LevelDebug}))
}

type testWriter struct{ t testing.TB }

func (w testWriter) Write(p []byte) (int, error) {
	w.t.Helper()
	w.t.Log(string(p))
	return len(p), nil
}

// Running is a service started by Start.
type Running struct {
	Server *server.Server
	// Conn is a client connection to the service's gRPC listener; its calls
	// are signed (see ServiceAuth).
	Conn *grpc.ClientConn
	// HTTP is the base URL of the service's HTTP listener.
	HTTP string
	// Ops is the base URL of /readyz and /metrics: the ops listener's, or
	// HTTP's when the service has none.
	Ops  string
	stop context.CancelFunc
	done chan error
}

// Start runs srv until the test ends (or Stop), and fails the test if the
// shutdown is not clean.
func Start(t testing.TB, srv *server.Server) *Running {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	r := &Running{Server: srv, HTTP: "http://" + srv.HTTPAddr(), Ops: "http://" + srv.OpsAddr(), stop: cancel, done: make(chan error, 1)}
	go func() { r.done <- srv.Run(ctx) }()
	conn, err := grpc.NewClient(srv.GRPCAddr(), grpc.WithTransportCredentials(insecure.NewCredentials()), ServiceAuth())
	if err != nil {
		cancel()
		t.Fatalf("grpc client: %v", err)
	}
	r.Conn = conn
	t.Cleanup(func() {
		_ = conn.Close()
		if err := r.Stop(); err != nil {
			t.Errorf("shutdown: %v", err)
		}
	})
	return r
}

// Stop shuts the service down and returns Run's result. Later calls return nil.
func (r *Running) Stop() error {
	if r.stop == nil {
		return nil
	}
	r.stop()
	r.stop = nil
	select {
	case err := <-r.done:
		return err
	case <-time.After(30 * time.Second):
		return context.DeadlineExceeded
	}
}

// AwaitServing waits (bounded) until gRPC health reports SERVING for service,
// using the health Watch stream, so no polling interval is guessed.
func (r *Running) AwaitServing(t testing.TB, service string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
	defer cancel()
	stream, err := healthpb.NewHealthClient(r.Conn).Watch(ctx, &healthpb.HealthCheckRequest{Service: service})
	if err != nil {
		t.Fatalf("health watch: %v", err)
	}
	for {
		resp, err := stream.Recv()
		if err != nil {
			t.Fatalf("health of %q never became SERVING: %v", service, err)
		}
		if resp.GetStatus() == healthpb.HealthCheckResponse_SERVING {
			return
		}
	}
}

// GRPCServices lists the services the server advertises through reflection.
func (r *Running) GRPCServices(t testing.TB) []string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	stream, err := reflectionpb.NewServerReflectionClient(r.Conn).ServerReflectionInfo(ctx)
	if err != nil {
		t.Fatalf("reflection: %v", err)
	}
	if err := stream.Send(&reflectionpb.ServerReflectionRequest{
		MessageRequest: &reflectionpb.ServerReflectionRequest_ListServices{},
	}); err != nil {
		t.Fatalf("reflection send: %v", err)
	}
	resp, err := stream.Recv()
	if err != nil {
		t.Fatalf("reflection recv: %v", err)
	}
	var names []string
	for _, s := range resp.GetListServicesResponse().GetService() {
		names = append(names, s.GetName())
	}
	slices.Sort(names)
	return names
}

// Get fetches path from the HTTP listener and returns status and body.
func (r *Running) Get(t testing.TB, path string) (int, string) {
	t.Helper()
	return get(t, r.HTTP, path)
}

// GetOps fetches path from the ops listener (/readyz, /metrics).
func (r *Running) GetOps(t testing.TB, path string) (int, string) {
	t.Helper()
	return get(t, r.Ops, path)
}

func get(t testing.TB, base, path string) (int, string) {
	t.Helper()
	resp, err := http.Get(base + path)
	if err != nil {
		t.Fatalf("GET %s: %v", path, err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatalf("GET %s: read body: %v", path, err)
	}
	return resp.StatusCode, string(body)
}

// AssertOps checks the ops endpoints every service has: /healthz on both
// listeners, /readyz with every named check "ok" (once the first run of the
// checks is in), and /metrics in Prometheus text format.
func (r *Running) AssertOps(t testing.TB, checks ...string) {
	t.Helper()
	for _, base := range []string{r.HTTP, r.Ops} {
		if code, body := get(t, base, "/healthz"); code != http.StatusOK {
			t.Errorf("%s/healthz: got %d %s, want 200", base, code, body)
		}
	}
	code, body := r.AwaitReadyz(t)
	if code != http.StatusOK {
		t.Errorf("/readyz: got %d %s, want 200", code, body)
	}
	var ready struct {
		Status string            `json:"status"`
		Checks map[string]string `json:"checks"`
	}
	if err := json.Unmarshal([]byte(body), &ready); err != nil {
		t.Fatalf("/readyz body %q: %v", body, err)
	}
	for _, c := range checks {
		if ready.Checks[c] != "ok" {
			t.Errorf("/readyz check %q: got %q, want ok (all: %v)", c, ready.Checks[c], ready.Checks)
		}
	}
	if code, body := r.GetOps(t, "/metrics"); code != http.StatusOK || !strings.Contains(body, "go_goroutines") {
		t.Errorf("/metrics: got %d, want 200 with Prometheus text; body starts %.200q", code, body)
	}
}

// AwaitReadyz waits (bounded) until /readyz has the result of a run of the
// readiness checks, whatever it is, and returns it.
func (r *Running) AwaitReadyz(t testing.TB) (int, string) {
	t.Helper()
	deadline := time.Now().Add(15 * time.Second)
	for {
		code, body := r.GetOps(t, "/readyz")
		if !strings.Contains(body, `"starting"`) || time.Now().After(deadline) {
			return code, body
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// AssertOpsOffPublic checks that a public service keeps its ops routes off
// its public listener: /readyz, /metrics and /debug/pprof/ answer 404 there
// (run the service with pprof on to check that one), /healthz 200, and the
// ops listener is another listener.
func (r *Running) AssertOpsOffPublic(t testing.TB) {
	t.Helper()
	if r.Ops == r.HTTP {
		t.Errorf("the ops routes are on the public listener %s", r.HTTP)
	}
	for _, path := range []string{"/readyz", "/metrics", "/debug/pprof/", "/healthz"} {
		want := http.StatusNotFound
		if path == "/healthz" {
			want = http.StatusOK
		}
		if code, body := r.Get(t, path); code != want {
			t.Errorf("public %s: got %d %.100s, want %d", path, code, body, want)
		}
	}
}
