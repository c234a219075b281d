//go:build integration

package app

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"net/http"
	"net/url"
	"strings"
	"testing"

	"kurz.dev/pkg/config"
	"kurz.dev/pkg/testkit/servertest"
	"kurz.dev/services/gateway/gatewaytest"
)

// adminToken is the test gateways' admin credential.
const adminToken = "test-admin-token-0123456789abcdef"

// startGateway runs the gateway in-process on free ports, in front of the
// stack's file-rules limiter, shortener and analytics; it trusts loopback as
// a proxy, so each test client picks its own IP through X-Forwarded-For.
// overrides are KURZ_* variables on top; edits change what no variable can
// (a test's span processor).
func startGateway(t *testing.T, overrides map[string]string, edits ...func(*Config)) *servertest.Running {
	t.Helper()
	return startGatewayLogging(t, servertest.Logger(t), overrides, edits...)
}

// startGatewayLogging is startGateway with the gateway's logs going to log.
func startGatewayLogging(t *testing.T, log *slog.Logger, overrides map[string]string, edits ...func(*Config)) *servertest.Running {
	t.Helper()
	env := gatewaytest.GatewayEnv(stack.Limiter.GRPCAddr, stack.Shortener.GRPCAddr, stack.Analytics.GRPCAddr, adminToken)
	env["KURZ_GATEWAY_ALLOW_ANONYMOUS"] = "true"
	env["KURZ_GATEWAY_TRUSTED_PROXIES"] = "127.0.0.1/32, ::1"
	maps.Copy(env, overrides)
	var cfg Config
	if err := config.LoadFrom(servertest.Env(env), &cfg); err != nil {
		t.Fatal(err)
	}
	for _, edit := range edits {
		edit(&cfg)
	}
	srv, err := New(context.Background(), cfg, log)
	if err != nil {
		t.Fatalf("gateway: %v", err)
	}
	r := servertest.Start(t, srv)
	r.AwaitServing(t, "")
	return r
}

// client calls one gateway as one client: its IP (via X-Forwarded-For) and
// its credential.
type client struct {
	t    *testing.T
	base string
	ip   string
	auth string // the Authorization value; "" sends none
	// http sends the requests; nil is http.DefaultClient.
	http *http.Client
}

func newClient(t *testing.T, gw *servertest.Running, key string) *client {
	c := &client{t: t, base: gw.HTTP, ip: gatewaytest.NewIP()}
	if key != "" {
		c.auth = "Bearer " + key
	}
	return c
}

// with returns a copy of c using another key, same IP.
func (c *client) with(key string) *client {
	d := *c
	d.auth = ""
	if key != "" {
		d.auth = "Bearer " + key
	}
	return &d
}

// response is one answer, read whole.
type response struct {
	code   int
	header http.Header
	body   []byte
}

func (r response) String() string {
	return fmt.Sprintf("%d %s", r.code, strings.TrimSpace(string(r.body)))
}

// json decodes the body as a JSON object (the test fails if it is not one).
func (r response) json(t *testing.T) map[string]any {
	t.Helper()
	var m map[string]any
	if err := json.Unmarshal(r.body, &m); err != nil {
		t.Fatalf("body of %d is not a JSON object: %v\n%s", r.code, err, r.body)
	}
	return m
}

// apiError returns the problem detail's fields (RFC 9457), failing the
// test if the answer is not one: application/problem+json, type, title,
// status (the response's), detail, code and requestId (X-Request-ID's).
func (r response) apiError(t *testing.T) map[string]any {
	t.Helper()
	if ct := r.header.Get("Content-Type"); ct != "application/problem+json" {
		t.Errorf("%d: Content-Type %q, want application/problem+json", r.code, ct)
	}
	e := r.json(t)
	for _, f := range []string{"type", "title", "detail", "code", "requestId"} {
		if s, _ := e[f].(string); s == "" {
			t.Errorf("%d: problem lacks %q: %s", r.code, f, r.body)
		}
	}
	if status, _ := e["status"].(float64); int(status) != r.code {
		t.Errorf("problem status %v != the response's %d", e["status"], r.code)
	}
	if e["requestId"] != r.header.Get("X-Request-ID") {
		t.Errorf("problem requestId %v != X-Request-ID %q", e["requestId"], r.header.Get("X-Request-ID"))
	}
	return e
}

// do sends one request; header adds or (with an empty value) removes fields.
func (c *client) do(method, path, body string, header ...string) response {
	c.t.Helper()
	var rd io.Reader
	if body != "" {
		rd = strings.NewReader(body)
	}
	req, err := http.NewRequest(method, c.base+path, rd)
	if err != nil {
		c.t.Fatal(err)
	}
	req.Header.Set("X-Forwarded-For", c.ip)
	if c.auth != "" {
		req.Header.Set("Authorization", c.auth)
	}
	if body != "" {
		req.Header.Set("Content-Type", "application/json")
	}
	for i := 0; i+1 < len(header); i += 2 {
		if header[i+1] == "" {
			req.Header.Del(header[i])
			continue
		}
		req.Header.Add(header[i], header[i+1])
	}
	return sendWith(c.t, c.http, req)
}

func send(t *testing.T, req *http.Request) response {
	t.Helper()
	return sendWith(t, nil, req)
}

// sendWith sends req with hc (nil: http.DefaultClient) and reads the answer.
func sendWith(t *testing.T, hc *http.Client, req *http.Request) response {
	t.Helper()
	if hc == nil {
		hc = http.DefaultClient
	}
	resp, err := hc.Do(req)
	if err != nil {
		t.Fatalf("%s %s: %v", req.Method, req.URL, err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatalf("%s %s: read body: %v", req.Method, req.URL, err)
	}
	return response{code: resp.StatusCode, header: resp.Header, body: b}
}

// tenant is a tenant made for one test through the admin API.
type tenant struct {
	id    string
	key   string
	keyID string
}

// newTenantID returns a tenant ID no other test or run uses.
func newTenantID(t *testing.T) string {
	var b [6]byte
	_, _ = rand.Read(b[:])
	return fmt.Sprintf("gwt-%x", b)
}

// newTenant creates a tenant on plan with one key through gw's admin API,
// and deletes it, its keys, its plan and its links when the test ends.
func newTenant(t *testing.T, gw *servertest.Running, plan string) tenant {
	t.Helper()
	admin := newClient(t, gw, adminToken)
	id := newTenantID(t)
	cleanupTenants(t, id)
	if r := admin.do("POST", "/v1/admin/tenants", fmt.Sprintf(`{"id":%q,"name":"Test","plan":%q}`, id, plan)); r.code != http.StatusCreated {
		t.Fatalf("create tenant: %s", r)
	}
	r := admin.do("POST", "/v1/admin/tenants/"+id+"/keys", `{"name":"test"}`)
	if r.code != http.StatusCreated {
		t.Fatalf("issue key: %s", r)
	}
	k := r.json(t)
	return tenant{id: id, key: k["key"].(string), keyID: k["id"].(string)}
}

// cleanupTenants deletes what the tests wrote for these tenants (see
// gatewaytest.CleanupTenants) when the test ends.
func cleanupTenants(t *testing.T, ids ...string) { gatewaytest.CleanupTenants(t, stack.DB, ids...) }

// cleanupCodes deletes links the tests created as tenant "anonymous".
func cleanupCodes(t *testing.T, codes *[]string) {
	t.Cleanup(func() {
		if _, err := stack.DB.Exec(context.Background(), `DELETE FROM links WHERE tenant = 'anonymous' AND code = ANY($1)`, *codes); err != nil {
			t.Errorf("clean up anonymous links: %v", err)
		}
	})
}

// rateLimit parses the RateLimit field: the policy name, r and t.
func rateLimit(t *testing.T, h http.Header) (policy string, remaining, reset int) {
	t.Helper()
	v := h.Get("RateLimit")
	if _, err := fmt.Sscanf(strings.ReplaceAll(v, ";", " "), "%q r=%d t=%d", &policy, &remaining, &reset); err != nil {
		t.Fatalf("RateLimit %q: %v", v, err)
	}
	return policy, remaining, reset
}

// ratePolicy parses RateLimit-Policy: name, q and w.
func ratePolicy(t *testing.T, h http.Header) (policy string, quota, window int) {
	t.Helper()
	v := h.Get("RateLimit-Policy")
	if _, err := fmt.Sscanf(strings.ReplaceAll(v, ";", " "), "%q q=%d w=%d", &policy, &quota, &window); err != nil {
		t.Fatalf("RateLimit-Policy %q: %v", v, err)
	}
	return policy, quota, window
}

// linkCount is how many live links tenant has, read through the gateway.
func linkCount(t *testing.T, c *client) int {
	t.Helper()
	n, token := 0, ""
	for {
		r := c.do("GET", "/v1/links?page_size=1000"+token, "")
		if r.code != http.StatusOK {
			t.Fatalf("list links: %s", r)
		}
		var page struct {
			Links         []json.RawMessage `json:"links"`
			NextPageToken string            `json:"nextPageToken"`
		}
		if err := json.Unmarshal(r.body, &page); err != nil {
			t.Fatal(err)
		}
		n += len(page.Links)
		if page.NextPageToken == "" {
			return n
		}
		token = "&page_token=" + url.QueryEscape(page.NextPageToken)
	}
}

// decodeStrict decodes one JSON object into v, refusing unknown fields.
func decodeStrict(b []byte, v any) error {
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.DisallowUnknownFields()
	return dec.Decode(v)
}
