//go:build integration

package faults

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"kurz.dev/pkg/linkcache"
)

const adminToken = "faults-admin-token-0123456789abcdef"

// gatewayClient calls the gateway's public API as one client address.
type gatewayClient struct {
	t    *testing.T
	base string
	key  string
	ip   string
	// client sends the requests; nil is noFollow.
	client *http.Client
}

// do sends a request and returns the status, the body and how long it took.
func (g gatewayClient) do(method, path, body string) (int, string, time.Duration) {
	g.t.Helper()
	req, err := http.NewRequest(method, g.base+path, strings.NewReader(body))
	if err != nil {
		g.t.Fatal(err)
	}
	if g.key != "" {
		req.Header.Set("Authorization", "Bearer "+g.key)
	}
	req.Header.Set("X-Forwarded-For", g.ip)
	client := g.client
	if client == nil {
		client = noFollow
	}
	start := time.Now()
	resp, err := client.Do(req)
	if err != nil {
		g.t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b), time.Since(start)
}

// field extracts a top-level string field of a JSON object.
func field(t *testing.T, body, name string) string {
	t.Helper()
	var m map[string]any
	if err := json.Unmarshal([]byte(body), &m); err != nil {
		t.Fatalf("not JSON: %q", body)
	}
	s, _ := m[name].(string)
	return s
}

// newTenant creates a tenant on the pro plan through the gateway's admin API
// and returns a client with its API key, calling from ip.
func newTenant(t *testing.T, gateway *service, ip string) gatewayClient {
	t.Helper()
	base := "http://" + gateway.httpAddr
	admin := gatewayClient{t: t, base: base, key: adminToken, ip: "198.51.100.1"}
	tenant := "faults-" + strconv.FormatInt(time.Now().UnixNano(), 36)
	if st, body, _ := admin.do("POST", "/v1/admin/tenants", `{"id":"`+tenant+`","name":"Faults","plan":"pro"}`); st != http.StatusCreated && st != http.StatusOK {
		t.Fatalf("create tenant: %d %s", st, body)
	}
	st, body, _ := admin.do("POST", "/v1/admin/tenants/"+tenant+"/keys", `{"name":"faults"}`)
	if st != http.StatusCreated && st != http.StatusOK {
		t.Fatalf("create key: %d %s", st, body)
	}
	return gatewayClient{t: t, base: base, key: field(t, body, "key"), ip: ip}
}

// The limiter goes away, then turns slow. Every caller applies its own
// policy within its deadline: the gateway's API quotas fail open (a valid
// key is served), its brute-force rule fails closed (an address already
// guessing keys stays blocked), link creation follows the shortener's
// policy (open by default), redirects are unaffected, and the consumer
// stores the clicks unflagged. When the limiter returns, decisions are its
// own again.
func TestLimiterDownOrSlow(t *testing.T) {
	limiter := startService(t, "limiter", "KURZ_LIMITER_RULES_SOURCE=file", "KURZ_LIMITER_RULES_FILE=")
	lp := proxy(t, limiter.grpcAddr)
	viaLimiter := "KURZ_LIMITER_GRPC_ADDR=" + lp.Addr()
	// Links, their cache and the click streams on a cluster of the test's
	// own: its consumer sees only this test's clicks.
	cluster := privateCluster(t)
	onCluster := "KURZ_REDIS_ADDRS=" + strings.Join(cluster.Addrs(), ",")
	rdb := cluster.Client()
	t.Cleanup(func() { _ = rdb.Close() })
	shortener := startService(t, "shortener", viaLimiter, onCluster, "KURZ_SHORTENER_BASE_URL=http://short.test")
	redirect := startService(t, "redirect", viaLimiter, onCluster)
	analytics := startService(t, "analytics", viaLimiter, onCluster, "KURZ_ANALYTICS_BATCH_AGE=200ms")
	gateway := startService(t, "gateway", viaLimiter, onCluster,
		"KURZ_SHORTENER_GRPC_ADDR="+shortener.grpcAddr, "KURZ_ANALYTICS_GRPC_ADDR="+analytics.grpcAddr,
		"KURZ_GATEWAY_ADMIN_TOKEN="+adminToken, "KURZ_GATEWAY_TRUSTED_PROXIES=127.0.0.1/32")
	base := "http://" + gateway.httpAddr
	user := newTenant(t, gateway, "198.51.100.2")

	// Healthy: the figures every answer under a fault is measured against.
	var healthy time.Duration
	for range 5 {
		st, body, took := user.do("GET", "/v1/links?page_size=1", "")
		if st != http.StatusOK {
			t.Fatalf("healthy list: %d %s", st, body)
		}
		healthy = max(healthy, took)
	}

	faults := []struct {
		name   string
		inject func()
	}{
		{"down", lp.Cut},
		{"slow", func() { lp.SetDelay(2 * time.Second) }},
	}
	for i, f := range faults {
		guesser := gatewayClient{t: t, base: base, key: "kurz_notarealkey_000000000000000000000000", ip: "198.51.100." + strconv.Itoa(66+i)}
		st, body, _ := user.do("POST", "/v1/links", `{"longUrl":"https://example.com/uncached-`+f.name+`"}`)
		if st != http.StatusOK && st != http.StatusCreated {
			t.Fatalf("healthy link creation answered %d %s", st, body)
		}
		uncached := field(t, body, "code")
		f.inject()
		// The gateway's limiter timeout is 50 ms: no answer may wait for the
		// limiter much longer than that beyond the healthy figure.
		bound := healthy + 50*time.Millisecond + answerMargin
		st, body, took := user.do("POST", "/v1/links", `{"longUrl":"https://example.com/limiter-`+f.name+`"}`)
		if st != http.StatusOK && st != http.StatusCreated {
			t.Fatalf("limiter %s: link creation with a valid key answered %d %s, want it served (quotas fail open)", f.name, st, body)
		}
		if took > bound {
			t.Errorf("limiter %s: link creation took %v, over %v", f.name, took, bound)
		}
		code := field(t, body, "code")
		if st, body, took := user.do("GET", "/v1/links?page_size=1", ""); st != http.StatusOK || took > bound {
			t.Errorf("limiter %s: list answered %d in %v (bound %v): %s", f.name, st, took, bound, body)
		}
		// A wrong key: 401; the same address again: blocked (fail closed
		// for addresses already guessing), the valid key's address is not.
		if st, _, _ := guesser.do("GET", "/v1/links", ""); st != http.StatusUnauthorized {
			t.Errorf("limiter %s: a wrong key answered %d, want 401", f.name, st)
		}
		if st, _, _ := guesser.do("GET", "/v1/links", ""); st != http.StatusTooManyRequests {
			t.Errorf("limiter %s: a second wrong key from the same address answered %d, want 429", f.name, st)
		}
		if st, _, _ := user.do("GET", "/v1/links?page_size=1", ""); st != http.StatusOK {
			t.Errorf("limiter %s: the valid key's address answered %d after another address guessed", f.name, st)
		}
		// The miss path asks the limiter (the brake on code scanners) and
		// applies its policy (open) within the redirect's limiter timeout:
		// a link whose cache entry is gone is served from PostgreSQL, an
		// unknown code is 404.
		if err := rdb.Del(context.Background(), linkcache.Key(uncached)).Err(); err != nil {
			t.Fatal(err)
		}
		for _, m := range []struct {
			code, source string
			want         int
		}{{uncached, "db", http.StatusFound}, {"zz" + strconv.FormatInt(time.Now().UnixNano(), 36), "db", http.StatusNotFound}} {
			start := time.Now()
			st, source := get(t, redirect, m.code)
			if took := time.Since(start); st != m.want || source != m.source || took > bound {
				t.Errorf("limiter %s: miss path for %s answered %d (X-Source %q) in %v, want %d (%q) within %v",
					f.name, m.code, st, source, took, m.want, m.source, bound)
			}
		}
		// Redirects are unaffected, and their clicks are stored unflagged.
		for range 3 {
			if st, _ := get(t, redirect, code); st != http.StatusFound {
				t.Errorf("limiter %s: redirect answered %d", f.name, st)
			}
		}
		eventually(t, 30*time.Second, "the clicks in the stats", func() (bool, string) {
			_, body, _ := user.do("GET", "/v1/links/"+code+"/stats?interval=day", "")
			var s struct {
				Counts struct{ Total, Human, Flood string }
			}
			_ = json.Unmarshal([]byte(body), &s)
			return s.Counts.Total == "3" && s.Counts.Human == "3" && s.Counts.Flood == "0", body
		})
		lp.Restore()
	}
	// Back: the limiter decides again (a decision carries its policy).
	eventually(t, 10*time.Second, "the limiter's decisions back", func() (bool, string) {
		req, _ := http.NewRequest("GET", base+"/v1/links?page_size=1", nil)
		req.Header.Set("Authorization", "Bearer "+user.key)
		req.Header.Set("X-Forwarded-For", user.ip)
		resp, err := noFollow.Do(req)
		if err != nil {
			return false, err.Error()
		}
		resp.Body.Close()
		return resp.Header.Get("RateLimit-Policy") != "", resp.Status
	})
	report(t, "Limiter unreachable, then 2 s slow, behind every caller", "each caller applies its own policy within its deadline: API quotas fail open, brute-force rule fails closed, creation per the shortener's policy, redirects unaffected, clicks stored unflagged", fmt.Sprintf("valid key served (fail open), guessing address blocked (fail closed), creation served (shortener policy open), redirects 302, clicks stored unflagged; every answer within %v of the healthy maximum %v",
		50*time.Millisecond+answerMargin, healthy.Round(time.Millisecond)))
}
