package app

import (
	"context"
	"io"
	"net/http"
	"path/filepath"
	"strings"
	"testing"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/protobuf/encoding/protojson"

	"kurz.dev/pkg/server"
	"kurz.dev/pkg/testkit/servertest"
)

// startNoRedis starts a limiter on the test rules with Redis unreachable,
// each decision by its rule's failure mode (race3 opens, quota closes),
// with overrides, and waits until it is ready.
func startNoRedis(t *testing.T, overrides map[string]string) *servertest.Running {
	t.Helper()
	rules, err := filepath.Abs(filepath.Join("testdata", "rules.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	env := map[string]string{"KURZ_REDIS_ADDRS": "127.0.0.1:1", "KURZ_REDIS_DIAL_TIMEOUT": "200ms",
		"KURZ_LIMITER_RULES_SOURCE": "file", "KURZ_LIMITER_RULES_FILE": rules}
	for k, v := range overrides {
		env[k] = v
	}
	srv, err := New(context.Background(), load(t, env), servertest.Logger(t))
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	r := servertest.Start(t, srv)
	r.AwaitServing(t, "envoy.service.ratelimit.v3.RateLimitService")
	return r
}

// post sends body to url as ct and returns the status and the body.
func post(t *testing.T, url, ct, body string) (int, string) {
	t.Helper()
	return postHost(t, url, "", ct, body)
}

// do sends req and returns the answer, its body read into the string.
func do(t *testing.T, req *http.Request) (*http.Response, string) {
	t.Helper()
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatalf("%s %s (Host %q): %v", req.Method, req.URL, req.Host, err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return resp, string(b)
}

// With KURZ_LIMITER_ENVOY_HTTP=true the limiter's HTTP listener answers
// envoyproxy/ratelimit's POST /json and GET /healthcheck, decided by the
// gRPC API's handler: an allowed request 200, a denied one 429, each with
// the RateLimitResponse as JSON; a request over the gRPC receive bound is
// 413 and a GET 405.
func TestEnvoyJSONOnTheHTTPListener(t *testing.T) {
	r := startNoRedis(t, map[string]string{"KURZ_LIMITER_ENVOY_HTTP": "true"})
	for _, tc := range []struct {
		domain, key string
		code        int
		overall     rlsv3.RateLimitResponse_Code
	}{
		{"race3", "user", http.StatusOK, rlsv3.RateLimitResponse_OK},                         // failure_mode open
		{"quota", "api_key", http.StatusTooManyRequests, rlsv3.RateLimitResponse_OVER_LIMIT}, // failure_mode closed
	} {
		code, body := post(t, r.HTTP+"/json", "application/json",
			`{"domain": "`+tc.domain+`", "descriptors": [{"entries": [{"key": "`+tc.key+`", "value": "k"}]}]}`)
		var resp rlsv3.RateLimitResponse
		if err := protojson.Unmarshal([]byte(body), &resp); err != nil {
			t.Fatalf("%s: %d %q: %v", tc.domain, code, body, err)
		}
		if code != tc.code || resp.GetOverallCode() != tc.overall {
			t.Errorf("%s: %d %v, want %d %v", tc.domain, code, resp.GetOverallCode(), tc.code, tc.overall)
		}
	}
	big := `{"domain": "race3", "descriptors": [{"entries": [{"key": "user", "value": "` + strings.Repeat("a", server.LimiterGRPCMaxRecvMsgSize) + `"}]}]}`
	if code, body := post(t, r.HTTP+"/json", "application/json", big); code != http.StatusRequestEntityTooLarge {
		t.Errorf("a body over the gRPC bound: %d %q, want 413", code, body)
	}
	if code, body := post(t, r.HTTP+"/json", "application/json", `{"domain": "race3", "descriptor": []}`); code != http.StatusBadRequest {
		t.Errorf("an unknown field: %d %q, want 400", code, body)
	}
	resp, err := http.Get(r.HTTP + "/json")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusMethodNotAllowed || resp.Header.Get("Allow") != http.MethodPost {
		t.Errorf("GET /json: %d Allow %q, want 405 Allow POST", resp.StatusCode, resp.Header.Get("Allow"))
	}
	resp, err = http.Get(r.HTTP + "/healthcheck")
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK || string(b) != "OK" {
		t.Errorf("GET /healthcheck of a ready limiter: %d %q, want 200 OK", resp.StatusCode, b)
	}
}

// Off by default: the HTTP listener is the ops port, and neither route is
// there unless asked for.
func TestEnvoyJSONIsOffByDefault(t *testing.T) {
	r := startNoRedis(t, nil)
	if code, body := post(t, r.HTTP+"/json", "application/json", `{"domain": "race3", "descriptors": [{"entries": [{"key": "user", "value": "k"}]}]}`); code != http.StatusNotFound {
		t.Errorf("POST /json: %d %q, want 404", code, body)
	}
	resp, err := http.Get(r.HTTP + "/healthcheck")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusNotFound {
		t.Errorf("GET /healthcheck: %d, want 404", resp.StatusCode)
	}
}

// postHost is post with the Host host ("" for url's).
func postHost(t *testing.T, url, host, ct, body string) (int, string) {
	t.Helper()
	req, err := http.NewRequest(http.MethodPost, url, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Host = host
	req.Header.Set("Content-Type", ct)
	resp, b := do(t, req)
	return resp.StatusCode, b
}

// The HTTP listener is the limiter's ops port: POST /json and /metrics
// answer its IP and its Service's names (what in-cluster callers, the
// kubelet and Prometheus send), and refuse a name a web page rebound to a
// port forwarded to the operator's machine (421, nothing decided).
func TestEnvoyJSONRefusesARebindingHost(t *testing.T) {
	r := startNoRedis(t, map[string]string{"KURZ_LIMITER_ENVOY_HTTP": "true"})
	port := r.HTTP[strings.LastIndexByte(r.HTTP, ':'):]
	req := `{"domain": "race3", "descriptors": [{"entries": [{"key": "user", "value": "k"}]}]}`
	for _, host := range []string{"127.0.0.1", "localhost", "limiter-envoy", "limiter-envoy.kurz.svc", "limiter-envoy.kurz.svc.cluster.local"} {
		if code, body := postHost(t, r.HTTP+"/json", host+port, "application/json", req); code != http.StatusOK {
			t.Errorf("POST /json for %s: %d %q, want 200", host, code, body)
		}
	}
	if code, body := postHost(t, r.HTTP+"/json", "rebind.attacker.example"+port, "application/json", req); code != http.StatusMisdirectedRequest {
		t.Errorf("POST /json for rebind.attacker.example: %d %q, want 421", code, body)
	}
	for host, want := range map[string]int{"rebind.attacker.example" + port: http.StatusMisdirectedRequest, "10.42.0.17" + port: http.StatusOK} {
		hreq, err := http.NewRequest(http.MethodGet, r.HTTP+"/metrics", nil)
		if err != nil {
			t.Fatal(err)
		}
		hreq.Host = host
		resp, err := http.DefaultClient.Do(hreq)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != want {
			t.Errorf("GET /metrics for %s: %d, want %d", host, resp.StatusCode, want)
		}
	}
}
