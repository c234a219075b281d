//go:build integration

package app

import (
	"context"
	"crypto/rand"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	shortenerv1 "kurz.dev/gen/kurz/shortener/v1"

	"kurz.dev/pkg/callmeta"
	"kurz.dev/pkg/testkit/limitertest"
	"kurz.dev/pkg/testkit/servertest"
	"kurz.dev/services/shortener/shortenertest"
)

// txtRecords answers TXT lookups from a map, as DNS would (no outbound
// network in tests).
type txtRecords map[string][]string

func (r txtRecords) LookupTXT(_ context.Context, name string) ([]string, error) {
	// An absolute name (trailing dot) is the same record, as in DNS.
	if v, ok := r[strings.TrimSuffix(name, ".")]; ok {
		return v, nil
	}
	return nil, &net.DNSError{Err: "no such host", Name: name, IsNotFound: true}
}

// getHost GETs path from base with the Host header host.
func getHost(t *testing.T, base, path, host string) *http.Response {
	t.Helper()
	req, err := http.NewRequest(http.MethodGet, base+path, nil)
	if err != nil {
		t.Fatal(err)
	}
	req.Host = host
	resp, err := client.Do(req)
	if err != nil {
		t.Fatalf("GET %s (Host %s): %v", path, host, err)
	}
	var body strings.Builder
	buf := make([]byte, 4096)
	for {
		n, err := resp.Body.Read(buf)
		body.Write(buf[:n])
		if err != nil {
			break
		}
	}
	resp.Body.Close()
	resp.Header.Set("X-Test-Body", body.String())
	return resp
}

// The redirect routes by Host: the default hosts serve the default
// domain's links by code, a verified custom domain serves its own links
// (the same code is another link there), an unknown host answers 404
// without a lookup, and a link on a custom domain is served only while its
// own tenant holds the domain.
func TestHostRouting(t *testing.T) {
	f := newFixture(t)
	var pg lookups
	redir := start(t, map[string]string{
		"KURZ_REDIRECT_DEFAULT_HOSTS": "127.0.0.1,localhost",
		// Longer than the test: only the shortener's published changes
		// make the redirect re-read the verified set in time.
		"KURZ_REDIRECT_DOMAIN_REFRESH":  "1h",
		"KURZ_REDIRECT_TRUSTED_PROXIES": "",
	}, hooks{pgTracer: &pg})
	domain := "go-" + strings.ToLower(rand.Text()[:10]) + ".acme.test"
	txt := txtRecords{}
	sh := shortenertest.Start(t, map[string]string{
		"KURZ_SHORTENER_BASE_URL": redir.HTTP,
		"KURZ_LIMITER_GRPC_ADDR":  limitertest.Start(t, limitertest.AllowAll).Addr(),
	}, shortenertest.WithTXT(txt))
	api := shortenerv1.NewShortenerServiceClient(sh.Conn)
	acme, other := "acme-"+strings.ToLower(rand.Text()[:8]), "other-"+strings.ToLower(rand.Text()[:8])
	t.Cleanup(func() {
		_, _ = f.db.Exec(context.Background(), `DELETE FROM domains WHERE tenant = ANY($1)`, []string{acme, other})
	})
	a := callmeta.Outgoing(context.Background(), acme, "192.0.2.1")

	reg, err := api.RegisterDomain(a, &shortenerv1.RegisterDomainRequest{Name: domain})
	if err != nil {
		t.Fatal(err)
	}
	txt["_kurz-challenge."+domain] = []string{reg.GetDomain().GetVerificationToken()}
	if _, err := api.VerifyDomain(a, &shortenerv1.VerifyDomainRequest{Name: domain}); err != nil {
		t.Fatal(err)
	}
	alias := "h" + strings.ToLower(rand.Text()[:8])
	for _, d := range []string{domain, ""} {
		target := "https://example.com/default"
		if d != "" {
			target = "https://example.com/custom"
		}
		if _, err := api.CreateLink(a, &shortenerv1.CreateLinkRequest{LongUrl: target, CustomAlias: alias, Domain: d}); err != nil {
			t.Fatal(err)
		}
	}
	f.track(alias, domain+"/"+alias)

	// The verified domain is served once the redirect has read it, which
	// the shortener's message on linkdomain.ChangedChannel triggers.
	if !servertest.Eventually(10*time.Second, func() bool {
		return getHost(t, redir.HTTP, "/"+alias, domain).StatusCode == http.StatusFound
	}) {
		t.Fatal("the verified domain was not served within 10 s")
	}
	for _, host := range []string{domain, strings.ToUpper(domain) + ":8787", domain + "."} {
		resp := getHost(t, redir.HTTP, "/"+alias, host)
		if resp.StatusCode != http.StatusFound || resp.Header.Get("Location") != "https://example.com/custom" {
			t.Errorf("Host %s: %d %q, want 302 to the custom domain's link", host, resp.StatusCode, resp.Header.Get("Location"))
		}
	}
	for _, host := range []string{"127.0.0.1", strings.TrimPrefix(redir.HTTP, "http://"), "LOCALHOST"} {
		resp := getHost(t, redir.HTTP, "/"+alias, host)
		if resp.StatusCode != http.StatusFound || resp.Header.Get("Location") != "https://example.com/default" {
			t.Errorf("Host %s: %d %q, want 302 to the default domain's link", host, resp.StatusCode, resp.Header.Get("Location"))
		}
	}

	// An unknown host: 404 saying so, and no lookup anywhere.
	before := pg.total()
	for _, host := range []string{"unknown.acme.test", "evil.test:80", strings.Repeat("x", 300) + ".test"} {
		resp := getHost(t, redir.HTTP, "/"+alias, host)
		if resp.StatusCode != http.StatusNotFound || !strings.Contains(resp.Header.Get("X-Test-Body"), "This domain does not serve short links") ||
			resp.Header.Get("X-Source") != "" {
			t.Errorf("Host %q: %d X-Source %q body %q, want the unknown-host 404", host, resp.StatusCode,
				resp.Header.Get("X-Source"), resp.Header.Get("X-Test-Body"))
		}
	}
	if n := pg.total(); n != before {
		t.Errorf("unknown hosts cost %d PostgreSQL lookups, want 0", n-before)
	}

	// A link on the domain that another tenant owns (a row no API would
	// write: the redirect still refuses it) is not served there.
	stray := "s" + strings.ToLower(rand.Text()[:8])
	f.track(domain + "/" + stray)
	if _, err := f.db.Exec(context.Background(), `INSERT INTO links (code, domain, tenant, long_url) VALUES ($1, $2, $3, $4)`,
		domain+"/"+stray, domain, other, "https://example.com/stray"); err != nil {
		t.Fatal(err)
	}
	if resp := getHost(t, redir.HTTP, "/"+stray, domain); resp.StatusCode != http.StatusNotFound {
		t.Errorf("another tenant's link on the domain: %d %q, want 404", resp.StatusCode, resp.Header.Get("Location"))
	}

	// Once the links are gone and the domain deleted, its host is unknown.
	for _, d := range []string{domain} {
		if _, err := api.DeleteLink(a, &shortenerv1.DeleteLinkRequest{Code: alias, Domain: d}); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := f.db.Exec(context.Background(), `UPDATE links SET deleted_at = now() WHERE code = $1`, domain+"/"+stray); err != nil {
		t.Fatal(err)
	}
	if _, err := api.DeleteDomain(a, &shortenerv1.DeleteDomainRequest{Name: domain}); err != nil {
		t.Fatal(err)
	}
	if !servertest.Eventually(10*time.Second, func() bool {
		return strings.Contains(getHost(t, redir.HTTP, "/"+alias, domain).Header.Get("X-Test-Body"), "This domain does not serve")
	}) {
		t.Fatal("the deleted domain was still served after 10 s")
	}
	if resp := getHost(t, redir.HTTP, "/"+alias, "127.0.0.1"); resp.StatusCode != http.StatusFound {
		t.Errorf("the default domain's link after the domain went: %d", resp.StatusCode)
	}
}

// failDomainReads fails every read of the verified domains, as a
// PostgreSQL that refuses the statement would.
type failDomainReads struct{}

func (failDomainReads) TraceQueryStart(ctx context.Context, _ *pgx.Conn, d pgx.TraceQueryStartData) context.Context {
	if !strings.Contains(d.SQL, "FROM domains WHERE verified_at") {
		return ctx
	}
	ctx, cancel := context.WithCancel(ctx)
	cancel()
	return ctx
}

func (failDomainReads) TraceQueryEnd(context.Context, *pgx.Conn, pgx.TraceQueryEndData) {}

// Until the verified domains were read once, a custom domain's host
// cannot be told from the default domain's: with no default hosts
// configured it would serve the default domain's links (another tenant's
// codes on a tenant's domain). It answers the unknown-host 404, and the
// replica is not ready.
func TestHostsBeforeTheDomainsWereReadServeNoDefaultDomainLinks(t *testing.T) {
	f := newFixture(t)
	cfg := load(t, map[string]string{"KURZ_REDIRECT_VISITOR_SALT": testSalt,
		"KURZ_LIMITER_GRPC_ADDR":      limitertest.Start(t, limitertest.AllowAll).Addr(),
		"KURZ_REDIRECT_DEFAULT_HOSTS": "", "KURZ_REDIRECT_DOMAIN_REFRESH": "1h", "KURZ_REDIRECT_TRUSTED_PROXIES": "",
	})
	srv, err := build(context.Background(), cfg, servertest.Logger(t), hooks{pgTracer: failDomainReads{}})
	if err != nil {
		t.Fatalf("build: %v", err)
	}
	// Not start: the replica never becomes ready (SERVING).
	redir := servertest.Start(t, srv)
	code := "d" + strings.ToLower(rand.Text()[:8])
	f.track(code)
	if _, err := f.db.Exec(context.Background(), `INSERT INTO links (code, tenant, long_url) VALUES ($1, $2, $3)`,
		code, "acme-"+strings.ToLower(rand.Text()[:8]), "https://example.com/default"); err != nil {
		t.Fatal(err)
	}
	resp := getHost(t, redir.HTTP, "/"+code, "go-"+strings.ToLower(rand.Text()[:10])+".other.test")
	if resp.StatusCode != http.StatusNotFound || !strings.Contains(resp.Header.Get("X-Test-Body"), "This domain does not serve short links") {
		t.Errorf("a custom host before the domains were read: %d %q, want the unknown-host 404", resp.StatusCode, resp.Header.Get("Location"))
	}
	if status, body := redir.AwaitReadyz(t); status == http.StatusOK || !strings.Contains(body, "custom_domains") {
		t.Errorf("/readyz before the domains were read: %d %s, want not ready, naming custom_domains", status, body)
	}
}
