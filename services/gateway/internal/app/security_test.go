//go:build integration

package app

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"errors"
	"log/slog"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	ratelimitv1 "kurz.dev/gen/kurz/ratelimit/v1"
	"kurz.dev/pkg/linkcode"
	"kurz.dev/pkg/testkit/redistest"
	"kurz.dev/pkg/testkit/servertest"
	"kurz.dev/services/gateway/gatewaytest"
)

// logBuffer keeps everything a service logs, and copies it to the test log.
type logBuffer struct {
	t  testing.TB
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *logBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	l.b.Write(p)
	l.mu.Unlock()
	l.t.Log(strings.TrimSuffix(string(p), "\n"))
	return len(p), nil
}

func (l *logBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// captureLogs returns a logger at debug level (everything the service can
// say) in the production format (JSON), and what it wrote.
func captureLogs(t *testing.T) (*slog.Logger, *logBuffer) {
	lb := &logBuffer{t: t}
	return slog.New(slog.NewJSONHandler(lb, &slog.HandlerOptions{Level: slog.LevelDebug})), lb
}

// keySecret is the secret part of an API key kurz_<id>_<secret>.
func keySecret(t *testing.T, key string) string {
	t.Helper()
	parts := strings.Split(key, "_")
	if len(parts) != 3 || len(parts[2]) != 32 {
		t.Fatalf("%q is not a kurz_<id>_<secret> key", key)
	}
	return parts[2]
}

// A tenant's API key is no admin credential: with it, tenant A can neither
// list, issue nor revoke tenant B's keys (nor its own: key management is the
// admin's), nor read or change B; each try is a 401 that names nothing of
// B. Through the admin API, a revocation is scoped to the tenant in the path
// (B's key under A's path is 404), and A's key list holds only A's keys.
// Afterwards B's key still works and B has exactly its one key, unrevoked.
func TestTenantCannotListOrRevokeAnotherTenantsKeys(t *testing.T) {
	gw := startGateway(t, nil)
	a, b := newTenant(t, gw, "free"), newTenant(t, gw, "free")
	ca := newClient(t, gw, a.key)
	for _, req := range []struct{ method, path, body string }{
		{"GET", "/v1/admin/tenants/" + b.id + "/keys", ""},
		{"POST", "/v1/admin/tenants/" + b.id + "/keys", `{"name":"stolen"}`},
		{"DELETE", "/v1/admin/tenants/" + b.id + "/keys/" + b.keyID, ""},
		{"GET", "/v1/admin/tenants/" + b.id, ""},
		{"PATCH", "/v1/admin/tenants/" + b.id, `{"plan":"pro"}`},
		{"GET", "/v1/admin/tenants/" + a.id + "/keys", ""},
	} {
		r := ca.do(req.method, req.path, req.body)
		if e := r.apiError(t); r.code != http.StatusUnauthorized || e["code"] != "UNAUTHENTICATED" || bytes.Contains(r.body, []byte(b.keyID)) {
			t.Errorf("A's key on %s %s: %s; want 401 naming nothing of B", req.method, req.path, r)
		}
	}

	admin := newClient(t, gw, adminToken)
	if r := admin.do("DELETE", "/v1/admin/tenants/"+a.id+"/keys/"+b.keyID, ""); r.code != http.StatusNotFound {
		t.Errorf("revoking B's key under A's path: %s; want 404", r)
	}
	r := admin.do("GET", "/v1/admin/tenants/"+a.id+"/keys", "")
	if r.code != http.StatusOK || !bytes.Contains(r.body, []byte(a.keyID)) || bytes.Contains(r.body, []byte(b.keyID)) {
		t.Errorf("A's keys: %s; want A's key and not B's", r)
	}
	if r := newClient(t, gw, b.key).do("GET", "/v1/links", ""); r.code != http.StatusOK {
		t.Errorf("B's key after A's attempts: %s; want 200", r)
	}
	var keys, live int
	if err := stack.DB.QueryRow(context.Background(),
		`SELECT count(*), count(*) FILTER (WHERE revoked_at IS NULL) FROM gw_api_keys WHERE tenant_id = $1`, b.id).Scan(&keys, &live); err != nil {
		t.Fatal(err)
	}
	if keys != 1 || live != 1 {
		t.Errorf("B has %d keys, %d unrevoked; want its one key, unrevoked", keys, live)
	}
}

// A tenant cannot take over another tenant's code: a custom alias equal to
// A's code is 409 for B, and A's link keeps its target.
func TestTenantCannotTakeOverAnotherTenantsCode(t *testing.T) {
	gw := startGateway(t, nil)
	a, b := newTenant(t, gw, "free"), newTenant(t, gw, "free")
	ca, cb := newClient(t, gw, a.key), newClient(t, gw, b.key)
	r := ca.do("POST", "/v1/links", `{"longUrl":"https://example.com/a-owns-this"}`)
	if r.code != http.StatusCreated {
		t.Fatalf("A creates: %s", r)
	}
	code := r.json(t)["code"].(string)
	r = cb.do("POST", "/v1/links", `{"longUrl":"https://evil.example/","customAlias":"`+code+`"}`)
	if e := r.apiError(t); r.code != http.StatusConflict || e["code"] != "ALREADY_EXISTS" {
		t.Errorf("B claims A's code as its alias: %s; want 409 ALREADY_EXISTS", r)
	}
	if got := ca.do("GET", "/v1/links/"+code, "").json(t)["longUrl"]; got != "https://example.com/a-owns-this" {
		t.Errorf("A's link after B's claim: longUrl %v", got)
	}
	if n := linkCount(t, cb); n != 0 {
		t.Errorf("B lists %d links, want 0", n)
	}
}

// One tenant's traffic cannot consume another tenant's quota at the edge,
// even from the same client IP: tenant A's greedy burst (40 at once against
// api/per-api-key, burst 5) is throttled, and tenant B's first request right
// after passes with its own full bucket (RateLimit r=4 of 5).
func TestTenantCannotConsumeAnotherTenantsQuotaAtTheEdge(t *testing.T) {
	lim := startLimiter(t)
	gw := startGateway(t, map[string]string{"KURZ_LIMITER_GRPC_ADDR": lim.GRPCAddr})
	a, b := newTenant(t, gw, "free"), newTenant(t, gw, "free")
	ca := newClient(t, gw, a.key)
	cb := ca.with(b.key) // same IP: the isolation is not the IP's doing
	const n = 40
	answers := make([]response, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() { answers[i] = ca.do("GET", "/v1/links", "") })
	}
	wg.Wait()
	limited := 0
	for _, r := range answers {
		if r.code == http.StatusTooManyRequests {
			limited++
		}
	}
	if limited == 0 {
		t.Fatalf("A's burst of %d: no 429; the test needs A throttled", n)
	}
	r := cb.do("GET", "/v1/links", "")
	if r.code != http.StatusOK {
		t.Fatalf("B right after A's burst: %s; want 200", r)
	}
	if p, remaining, _ := rateLimit(t, r.header); p != "api/per-api-key" || remaining != 4 {
		t.Errorf("B right after A's burst (%d of A's %d throttled): RateLimit %q r=%d; want api/per-api-key r=4 (B's own full bucket)", limited, n, p, remaining)
	}
}

// API keys are stored only as their SHA-256: the key row's hash is the
// digest of the whole key, and no row of any table of the database holds the
// key or its secret, raw, hex-encoded (as a bytea would print) or in base64.
func TestAPIKeysStoredOnlyAsHashes(t *testing.T) {
	gw := startGateway(t, nil)
	tn := newTenant(t, gw, "free")
	admin := newClient(t, gw, adminToken)
	r := admin.do("POST", "/v1/admin/tenants/"+tn.id+"/keys", `{"name":"second"}`)
	if r.code != http.StatusCreated {
		t.Fatalf("second key: %s", r)
	}
	second := r.json(t)["key"].(string)
	ctx := context.Background()
	for _, key := range []string{tn.key, second} {
		if r := newClient(t, gw, key).do("GET", "/v1/links", ""); r.code != http.StatusOK {
			t.Fatalf("key %.17s…: %s; want it to work", key, r)
		}
		var stored []byte
		id := strings.Split(key, "_")[1]
		if err := stack.DB.QueryRow(ctx, `SELECT hash FROM gw_api_keys WHERE id = $1`, id).Scan(&stored); err != nil {
			t.Fatal(err)
		}
		if sum := sha256.Sum256([]byte(key)); !bytes.Equal(stored, sum[:]) {
			t.Errorf("key %s: stored hash %x, want SHA-256 of the key %x", id, stored, sum)
		}
	}

	rows, err := stack.DB.Query(ctx, `SELECT quote_ident(table_schema) || '.' || quote_ident(table_name)
		FROM information_schema.tables
		WHERE table_type = 'BASE TABLE' AND table_schema NOT IN ('pg_catalog', 'information_schema')`)
	if err != nil {
		t.Fatal(err)
	}
	tables, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		t.Fatal(err)
	}
	var needles []string
	for _, key := range []string{tn.key, second} {
		secret := keySecret(t, key)
		needles = append(needles, key, secret, hex.EncodeToString([]byte(key)), hex.EncodeToString([]byte(secret)),
			base64.StdEncoding.EncodeToString([]byte(key)), base64.RawURLEncoding.EncodeToString([]byte(key)))
	}
	scanned := 0
	for _, table := range tables {
		var hits int
		err := stack.DB.QueryRow(ctx, `SELECT count(*) FROM `+table+` AS r WHERE EXISTS (
			SELECT 1 FROM unnest($1::text[]) AS n WHERE strpos(r::text, n) > 0)`, needles).Scan(&hits)
		var pgErr *pgconn.PgError
		if errors.As(err, &pgErr) && pgErr.Code == "42P01" {
			continue // dropped by another test meanwhile
		}
		if err != nil {
			t.Fatalf("scan %s: %v", table, err)
		}
		scanned++
		if hits > 0 {
			t.Errorf("%s: %d rows hold an API key or its secret (raw, hex or base64)", table, hits)
		}
	}
	if scanned < 2 {
		t.Fatalf("scanned %d tables (%v); want at least gw_tenants and gw_api_keys", scanned, tables)
	}
	t.Logf("no trace of 2 keys in %d tables", scanned)
}

// API keys are never logged: through a whole key lifecycle (issue, use,
// stats, a key in the query string, a wrong secret under the key's real id,
// the real secret under an unknown id, malformed Authorization fields that
// carry the key, the key used as the admin token, revocation, use after
// revocation) the gateway's log, at debug level, holds neither the key, nor
// its secret, nor the wrong secret, nor the admin token, while the failed
// attempts are logged by the key's public id. The limiter and shortener
// behind it do not log the secret either.
func TestAPIKeysNeverLogged(t *testing.T) {
	log, logs := captureLogs(t)
	gw := startGatewayLogging(t, log, nil)
	admin := newClient(t, gw, adminToken)
	id := newTenantID(t)
	cleanupTenants(t, id)
	if r := admin.do("POST", "/v1/admin/tenants", `{"id":"`+id+`","plan":"free"}`); r.code != http.StatusCreated {
		t.Fatalf("create tenant: %s", r)
	}
	r := admin.do("POST", "/v1/admin/tenants/"+id+"/keys", `{"name":"logged?"}`)
	if r.code != http.StatusCreated {
		t.Fatalf("issue key: %s", r)
	}
	key, keyID := r.json(t)["key"].(string), r.json(t)["id"].(string)
	secret := keySecret(t, key)
	wrongSecret := strings.Map(func(c rune) rune { // a well-formed secret, every character changed
		return rune(linkcode.Alphabet[(strings.IndexRune(linkcode.Alphabet, c)+1)%len(linkcode.Alphabet)])
	}, secret)
	wrong := "kurz_" + keyID + "_" + wrongSecret

	c := newClient(t, gw, key)
	steps := []struct {
		name   string
		cl     *client
		method string
		path   string
		body   string
		header []string
		status int
	}{
		{"list", c, "GET", "/v1/links", "", nil, 200},
		{"create", c, "POST", "/v1/links", `{"longUrl":"https://example.com/logged"}`, nil, 201},
		{"key in the query", c, "GET", "/v1/links?page_token=" + key, "", nil, 400},
		{"key as a query parameter", c, "GET", "/v1/links?api_key=" + key, "", nil, 400},
		{"wrong secret, real id", c.with(wrong), "GET", "/v1/links", "", nil, 401},
		{"real secret, unknown id", c.with("kurz_AAAAAAAAAAAA_" + secret), "GET", "/v1/links", "", nil, 401},
		{"Basic scheme", c.with(""), "GET", "/v1/links", "", []string{"Authorization", "Basic " + key}, 401},
		{"extra word", c.with(""), "GET", "/v1/links", "", []string{"Authorization", "Bearer " + key + " please"}, 401},
		{"two fields", c, "GET", "/v1/links", "", []string{"Authorization", "Bearer " + key}, 401},
		{"key as the admin token", c, "GET", "/v1/admin/tenants/" + id, "", nil, 401},
		{"revoke", admin, "DELETE", "/v1/admin/tenants/" + id + "/keys/" + keyID, "", nil, 204},
		{"after revocation", c, "GET", "/v1/links", "", nil, 401},
		{"list keys", admin, "GET", "/v1/admin/tenants/" + id + "/keys", "", nil, 200},
	}
	var code string
	for _, s := range steps {
		r := s.cl.do(s.method, s.path, s.body, s.header...)
		if r.code != s.status {
			t.Errorf("%s: %s; want %d", s.name, r, s.status)
		}
		if s.name == "create" {
			code, _ = r.json(t)["code"].(string)
			if r := c.do("GET", "/v1/links/"+code+"/stats", ""); r.code != http.StatusOK {
				t.Errorf("stats: %s", r)
			}
		}
		if s.name != "create" && (bytes.Contains(r.body, []byte(secret)) || bytes.Contains(r.body, []byte(wrongSecret))) {
			t.Errorf("%s: the answer shows a key's secret: %s", s.name, r)
		}
	}
	if err := gw.Stop(); err != nil { // every line is written
		t.Fatal(err)
	}

	out := logs.String()
	for what, s := range map[string]string{"the key": key, "its secret": secret, "a wrong secret": wrongSecret, "the admin token": adminToken} {
		if strings.Contains(out, s) {
			t.Errorf("the gateway's log holds %s", what)
		}
	}
	if n := strings.Count(out, `"msg":"authentication failed"`); n < 7 || !strings.Contains(out, `"key_id":"`+keyID+`"`) {
		t.Errorf("%d failed authentications logged, key id %s logged: %v; want every failure logged, by the key's public id",
			n, keyID, strings.Contains(out, keyID))
	}
	for _, p := range []*servertest.Process{stack.Limiter, stack.Shortener, stack.Analytics} {
		if strings.Contains(p.Output(), secret) {
			t.Errorf("the %s's output holds the key's secret", p.Name)
		}
	}
	t.Logf("%d bytes of gateway log, %d lines, without the key", len(out), strings.Count(out, "\n"))
}

// Brute force against API keys is stopped per IP and stays stopped while
// the limiter's Redis is down. The limiter runs on a private Redis, which
// the test kills: the limiter itself keeps answering (auth/per-ip fails
// closed: FAIL_CLOSED), and the gateway falls back to its memory of failing
// IPs. An IP blocked before the outage stays blocked (429, even with a valid
// key); an IP that starts guessing during the outage gets one 401, then 429
// for every further guess (20) and for a valid key; a clean IP with a valid
// key is served (200).
func TestBruteForceStaysBlockedWhileRedisIsDown(t *testing.T) {
	redis := redistest.Start(t)
	lim := servertest.Run(t, stack.BinDir, servertest.Spec{Name: "limiter", Service: limiterService, Env: func(g, h string) []string {
		return append(gatewaytest.LimiterEnv(g, h), "KURZ_LIMITER_RULES_SOURCE=file", "KURZ_LIMITER_RULES_FILE="+stack.rulesFile,
			"KURZ_REDIS_ADDRS="+redis.Addr, "KURZ_LIMITER_REDIS_TIMEOUT=100ms")
	}})
	// Generous: the gateway must hear the limiter's FAIL_CLOSED, not time
	// out on it (the limiter-down case is TestBruteForceBlocksIPEvenWithValidKey).
	gw := startGateway(t, map[string]string{"KURZ_LIMITER_GRPC_ADDR": lim.GRPCAddr, "KURZ_GATEWAY_LIMITER_TIMEOUT": "3s"})
	tn := newTenant(t, gw, "free")
	const unknownKey = "kurz_AAAAAAAAAAAA_BBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBB"

	before := newClient(t, gw, unknownKey)
	for i := range 10 {
		if r := before.do("GET", "/v1/links", ""); r.code != http.StatusUnauthorized {
			t.Fatalf("bad key %d with Redis up: %s; want 401", i+1, r)
		}
	}
	if r := before.with(tn.key).do("GET", "/v1/links", ""); r.code != http.StatusTooManyRequests {
		t.Fatalf("after 10 failures, Redis up: %s; want 429", r)
	}

	redis.Kill()
	killed := time.Now()
	conn, err := grpc.NewClient(lim.GRPCAddr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	rl := ratelimitv1.NewRateLimitServiceClient(conn)
	var src ratelimitv1.DecisionSource
	if !servertest.Eventually(10*time.Second, func() bool {
		resp, err := rl.CheckQuota(context.Background(), &ratelimitv1.CheckQuotaRequest{Domain: "auth", Descriptors: map[string]string{"ip": gatewaytest.NewIP()}})
		src = resp.GetSource()
		return err == nil && !resp.GetAllowed() && src == ratelimitv1.DecisionSource_DECISION_SOURCE_FAIL_CLOSED
	}) {
		t.Fatalf("with its Redis killed the limiter answers auth with source %v; want FAIL_CLOSED", src)
	}
	failClosedAfter := time.Since(killed)

	for i := range 3 {
		if r := before.with(tn.key).do("GET", "/v1/links", ""); r.code != http.StatusTooManyRequests || r.header.Get("Retry-After") == "" || r.apiError(t)["reason"] != "RATE_LIMITED" {
			t.Errorf("IP blocked before the outage, valid key, Redis down (%d): %s; want 429 RATE_LIMITED with Retry-After", i+1, r)
		}
	}
	during := newClient(t, gw, unknownKey)
	if r := during.do("GET", "/v1/links", ""); r.code != http.StatusUnauthorized {
		t.Errorf("first guess of a new IP, Redis down: %s; want 401", r)
	}
	blocked := 0
	for range 20 {
		if r := during.do("GET", "/v1/links", ""); r.code == http.StatusTooManyRequests {
			blocked++
		}
	}
	if blocked != 20 {
		t.Errorf("further guesses of that IP, Redis down: %d of 20 got 429; want all", blocked)
	}
	if r := during.with(tn.key).do("GET", "/v1/links", ""); r.code != http.StatusTooManyRequests {
		t.Errorf("that IP with a valid key, Redis down: %s; want 429", r)
	}
	if r := newClient(t, gw, tn.key).do("GET", "/v1/links", ""); r.code != http.StatusOK {
		t.Errorf("a clean IP with a valid key, Redis down: %s; want 200", r)
	}
	if _, m := gw.GetOps(t, "/metrics"); !strings.Contains(m, `kurz_gateway_quota_degraded_total{domain="auth"`) {
		t.Error(`/metrics lacks kurz_gateway_quota_degraded_total{domain="auth"}: the fallback was not what blocked`)
	}
	t.Logf("limiter answered FAIL_CLOSED %v after Redis was killed; the outage checks took %v", failClosedAfter.Round(time.Millisecond), (time.Since(killed) - failClosedAfter).Round(time.Millisecond))
}

// xss is a payload that would run if any answer reflected it into HTML.
const xss = `<script>alert("kurz")</script>`

// The gateway never reflects request data into HTML: every answer to
// requests carrying a script tag in the path, the code, the query (names and
// values), the body and the headers is JSON (a QR code's SVG, or the ops
// endpoints' text), the API's answers with X-Content-Type-Options: nosniff,
// and no body holds the tag unescaped; request IDs that are not plain tokens
// are replaced, not echoed.
func TestGatewayNeverReflectsRequestsIntoHTML(t *testing.T) {
	gw := startGateway(t, nil)
	tn := newTenant(t, gw, "free")
	c := newClient(t, gw, tn.key)
	r := c.do("POST", "/v1/links", `{"longUrl":"https://example.com/x"}`)
	if r.code != http.StatusCreated {
		t.Fatalf("create: %s", r)
	}
	code := r.json(t)["code"].(string)
	raw, _ := json.Marshal(xss)
	q := strings.NewReplacer("<", "%3C", ">", "%3E", `"`, "%22", " ", "%20").Replace(xss)
	headers := []string{"User-Agent", xss, "Referer", "https://example.com/" + q, "X-Request-ID", xss, "Accept", "text/html", "Cookie", "a=" + q}
	for _, tc := range []struct {
		name, method, path, body string
		header                   []string
		ct                       string // the Content-Type, sent with nosniff; "" for the ops endpoints
	}{
		{"code in the path", "GET", "/v1/links/" + q, "", nil, "application/json"},
		{"code in the stats path", "GET", "/v1/links/" + q + "/stats", "", nil, "application/json"},
		{"unknown route", "GET", "/" + q, "", nil, "application/json"},
		{"unknown route, deep", "GET", "/v1/" + q + "/x", "", nil, "application/json"},
		{"method", "BREW", "/v1/links/" + q, "", nil, "application/json"},
		{"query name, raw", "GET", "/v1/links?" + xss + "=1", "", nil, "application/json"},
		{"query value", "GET", "/v1/links?page_token=" + q, "", nil, "application/json"},
		{"query value of stats", "GET", "/v1/links/" + code + "/stats?interval=" + q, "", nil, "application/json"},
		{"body field name", "POST", "/v1/links", `{` + string(raw) + `:1}`, nil, "application/json"},
		{"body value", "POST", "/v1/links", `{"longUrl":"javascript:` + strings.Trim(string(raw), `"`) + `"}`, nil, "application/json"},
		{"link target", "POST", "/v1/links", `{"longUrl":"https://example.com/` + strings.Trim(string(raw), `"`) + `"}`, nil, "application/json"},
		{"compat body", "POST", "/links", `{"longUrl":` + string(raw) + `}`, nil, "application/json"},
		{"patch", "PATCH", "/v1/links/" + code, `{"longUrl":"data:text/html,` + strings.Trim(string(raw), `"`) + `"}`, nil, "application/json"},
		{"headers", "GET", "/v1/links/" + code, "", headers, "application/json"},
		{"bearer token", "GET", "/v1/links", "", []string{"Authorization", "", "Authorization", "Bearer " + xss}, "application/json"},
		{"admin token", "GET", "/v1/admin/tenants/" + q, "", nil, "application/json"},
		{"openapi", "GET", "/v1/openapi.json?" + xss, "", nil, "application/json"},
		{"qr code", "GET", "/v1/links/" + code + "/qr?format=svg", "", headers, "image/svg+xml"},
		{"healthz", "GET", "/healthz?" + xss, "", headers, ""},
		{"readyz", "GET", "/readyz?" + q, "", headers, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := c.do(tc.method, tc.path, tc.body, tc.header...)
			ct := r.header.Get("Content-Type")
			if low := strings.ToLower(string(r.body)); strings.Contains(low, "<script") || strings.Contains(low, "</script") {
				t.Errorf("%s %s: %d %s reflects the script tag: %.300s", tc.method, tc.path, r.code, ct, r.body)
			}
			if strings.Contains(ct, "html") {
				t.Errorf("%s %s: Content-Type %q", tc.method, tc.path, ct)
			}
			want := ct == tc.ct || (tc.ct == "application/json" && r.code >= 400 && ct == "application/problem+json")
			if tc.ct != "" && (!want || r.header.Get("X-Content-Type-Options") != "nosniff") {
				t.Errorf("%s %s: %d with Content-Type %q, X-Content-Type-Options %q; want %s, nosniff",
					tc.method, tc.path, r.code, ct, r.header.Get("X-Content-Type-Options"), tc.ct)
			}
			if id := r.header.Get("X-Request-ID"); strings.ContainsAny(id, `<>"`) {
				t.Errorf("%s %s: X-Request-ID %q echoes the request", tc.method, tc.path, id)
			}
		})
	}
}

// scriptTargets are long URLs a short link must never point at, in the
// spellings a prefix filter would miss.
var scriptTargets = []string{
	"javascript:alert(document.cookie)",
	"JaVaScRiPt:alert(1)",
	" javascript:alert(1)",
	"javascript://example.com/%0Aalert(1)",
	"java\tscript:alert(1)",
	"data:text/html,<script>alert(1)</script>",
	"data:text/html;base64,PHNjcmlwdD5hbGVydCgxKTwvc2NyaXB0Pg==",
	"vbscript:msgbox(1)",
	"file:///etc/passwd",
	"FILE://C:/Windows/win.ini",
	"//evil.example/x",
}

// refusedURL checks the answer to a link write with a refused long URL: 400
// INVALID_ARGUMENT whose details carry one of reasons.
func refusedURL(t *testing.T, what string, r response, reasons ...string) {
	t.Helper()
	e := r.apiError(t)
	ok := false
	for _, reason := range reasons {
		ok = ok || bytes.Contains(r.body, []byte(`"reason":"`+reason+`"`))
	}
	if r.code != http.StatusBadRequest || e["code"] != "INVALID_ARGUMENT" || !ok {
		t.Errorf("%s: %s; want 400 INVALID_ARGUMENT with reason %v", what, r, reasons)
	}
}

// Short links cannot point at javascript:, data:, vbscript: or file:
// targets through the public API: POST /v1/links and PATCH are 400 with the
// reason (scheme not allowed, or malformed), POST /links answers the
// prototype's {"error":"invalid url"}, and the tenant's one link keeps its
// target.
func TestLinksCannotPointAtScriptSchemesEvenThroughPatch(t *testing.T) {
	gw := startGateway(t, nil)
	c := newClient(t, gw, newTenant(t, gw, "free").key)
	r := c.do("POST", "/v1/links", `{"longUrl":"https://example.com/kept"}`)
	if r.code != http.StatusCreated {
		t.Fatalf("create: %s", r)
	}
	code := r.json(t)["code"].(string)
	for _, target := range scriptTargets {
		body, _ := json.Marshal(map[string]string{"longUrl": target})
		refusedURL(t, "POST "+target, c.do("POST", "/v1/links", string(body)), "URL_SCHEME_NOT_ALLOWED", "URL_MALFORMED")
		refusedURL(t, "PATCH "+target, c.do("PATCH", "/v1/links/"+code, string(body)), "URL_SCHEME_NOT_ALLOWED", "URL_MALFORMED")
		if r := c.do("POST", "/links", string(body)); r.code != http.StatusBadRequest || strings.TrimSpace(string(r.body)) != `{"error":"invalid url"}` {
			t.Errorf("POST /links %q: %s; want 400 {\"error\":\"invalid url\"}", target, r)
		}
	}
	if got := c.do("GET", "/v1/links/"+code, "").json(t)["longUrl"]; got != "https://example.com/kept" {
		t.Errorf("the link after %d refused updates: longUrl %v", len(scriptTargets), got)
	}
	if n := linkCount(t, c); n != 1 {
		t.Errorf("%d links, want the one created", n)
	}
}

// Links to kurz's own short domain are refused through the public API on
// create and on update: with a shortener whose short links live on
// https://kurz.test (and go.kurz.test), the link's own short URL, and other
// spellings of both hosts, are 400 URL_REDIRECT_LOOP on POST and PATCH, and
// the link keeps its target.
func TestLinksToOwnShortDomainRefusedThroughTheGateway(t *testing.T) {
	sh := servertest.Run(t, stack.BinDir, servertest.Spec{Name: "shortener", Service: shortenerService, Env: func(g, h string) []string {
		return []string{"KURZ_SHORTENER_GRPC_ADDR=" + g, "KURZ_SHORTENER_HTTP_ADDR=" + h,
			"KURZ_LIMITER_GRPC_ADDR=" + stack.Limiter.GRPCAddr, "KURZ_SHORTENER_LIMITER_TIMEOUT=1s",
			"KURZ_SHORTENER_BASE_URL=https://kurz.test", "KURZ_SHORTENER_OWN_HOSTS=go.kurz.test",
			"KURZ_SHORTENER_ALLOW_ANONYMOUS=false", "KURZ_LOG_LEVEL=warn"}
	}})
	gw := startGateway(t, map[string]string{"KURZ_SHORTENER_GRPC_ADDR": sh.GRPCAddr})
	c := newClient(t, gw, newTenant(t, gw, "free").key)
	r := c.do("POST", "/v1/links", `{"longUrl":"https://example.com/kept"}`)
	link := r.json(t)
	short, _ := link["shortUrl"].(string)
	if r.code != http.StatusCreated || !strings.HasPrefix(short, "https://kurz.test/") {
		t.Fatalf("create: %s; want a short URL on https://kurz.test", r)
	}
	code := link["code"].(string)
	for _, target := range []string{
		short,
		"https://kurz.test/abcdefg",
		"HTTP://KURZ.TEST./abcdefg",
		"https://kurz.test:8443/abcdefg",
		"https://go.kurz.test/abcdefg",
		"https://Go.Kurz.Test:443/abcdefg?utm=1",
	} {
		body, _ := json.Marshal(map[string]string{"longUrl": target})
		refusedURL(t, "POST "+target, c.do("POST", "/v1/links", string(body)), "URL_REDIRECT_LOOP")
		refusedURL(t, "PATCH "+target, c.do("PATCH", "/v1/links/"+code, string(body)), "URL_REDIRECT_LOOP")
	}
	if got := c.do("GET", "/v1/links/"+code, "").json(t)["longUrl"]; got != "https://example.com/kept" {
		t.Errorf("the link after the refused updates: longUrl %v", got)
	}
}
