//go:build integration

package app

import (
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/base64"
	"errors"
	"io"
	"log/slog"
	"net/http"
	"net/url"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"google.golang.org/protobuf/types/known/fieldmaskpb"
	"google.golang.org/protobuf/types/known/timestamppb"

	ratelimitv1 "kurz.dev/gen/kurz/ratelimit/v1"
	shortenerv1 "kurz.dev/gen/kurz/shortener/v1"
	"kurz.dev/pkg/callmeta"
	"kurz.dev/pkg/linkcache"
	"kurz.dev/pkg/linkpass"
	"kurz.dev/pkg/testkit/limitertest"
	"kurz.dev/pkg/testkit/redistest"
	"kurz.dev/pkg/testkit/servertest"
	"kurz.dev/services/shortener/shortenertest"
)

// Link features of issue #10 as the redirect serves them: passwords (form,
// CSRF token, limiter, Argon2), visit limits, per-device targets, and what
// HEAD requests and link-preview fetchers may see.

const (
	testFormSecret = "redirect-test-form-secret-0123456789"
	testPassword   = "correct horse battery"
	iPhoneUA       = "Mozilla/5.0 (iPhone; CPU iPhone OS 17_4 like Mac OS X) AppleWebKit/605.1.15 (KHTML, like Gecko) Version/17.4 Mobile/15E148 Safari/604.1"
	androidUA      = "Mozilla/5.0 (Linux; Android 14; Pixel 8) AppleWebKit/537.36 (KHTML, like Gecko) Chrome/124.0.6367.82 Mobile Safari/537.36"
	windowsUA      = "Mozilla/5.0 (Windows NT 10.0; Win64; x64) AppleWebKit/537.36 (KHTML, like Gecko) Chrome/124.0.0.0 Safari/537.36"
	iPadOSUA       = "Mozilla/5.0 (Macintosh; Intel Mac OS X 10_15_7) AppleWebKit/605.1.15 (KHTML, like Gecko) Version/17.4 Safari/605.1.15"
	slackUA        = "Slackbot-LinkExpanding 1.0 (+https://api.slack.com/robots)"
)

// features are a link's issue #10 columns (migration 0003).
type features struct {
	status                int
	maxVisits             int64
	passwordHash          string
	ios, android, desktop string
	expires               time.Time // zero: never
}

// insertLink stores an active link with features directly in PostgreSQL.
func (f *fixture) insertLink(code, target string, ft features) {
	f.t.Helper()
	null := func(s string) *string {
		if s == "" {
			return nil
		}
		return &s
	}
	var expires *time.Time
	if !ft.expires.IsZero() {
		expires = &ft.expires
	}
	if _, err := f.db.Exec(context.Background(), `INSERT INTO links (code, tenant, long_url, redirect_type, max_visits,
			password_hash, ios_url, android_url, desktop_url, expires_at) VALUES ($1, 'feat', $2, $3, $4, $5, $6, $7, $8, $9)`,
		code, target, ft.status, ft.maxVisits, null(ft.passwordHash), null(ft.ios), null(ft.android), null(ft.desktop), expires); err != nil {
		f.t.Fatal(err)
	}
}

var (
	hashOnce   sync.Once
	passHash   string
	tokenField = regexp.MustCompile(`name="token" value="([^"]+)"`)
)

// testHash is the Argon2id hash of testPassword, as the shortener stores it
// (computed once: each costs ~19 MiB and tens of milliseconds).
func testHash(t *testing.T) string {
	t.Helper()
	hashOnce.Do(func() {
		var err error
		if passHash, err = linkpass.Hash(testPassword); err != nil {
			panic(err)
		}
	})
	return passHash
}

// form is what a browser keeps from a form page: its cookie and token.
type form struct {
	cookie *http.Cookie
	token  string
}

// openForm GETs code's form page and returns the response and the form.
func openForm(t *testing.T, base, code string, header ...string) (*http.Response, form) {
	t.Helper()
	resp := get(t, base, "/"+code, header...)
	return resp, formOf(t, resp)
}

func formOf(t *testing.T, resp *http.Response) form {
	t.Helper()
	var fm form
	for _, c := range resp.Cookies() {
		if c.Name == "kurz_form" {
			fm.cookie = c
		}
	}
	if m := tokenField.FindStringSubmatch(resp.Header.Get("X-Test-Body")); m != nil {
		fm.token = m[1]
	}
	if fm.cookie == nil || fm.token == "" {
		t.Fatalf("form page %d without cookie (%v) or token: %q", resp.StatusCode, resp.Cookies(), resp.Header.Get("X-Test-Body"))
	}
	return fm
}

// submit POSTs the form with password, sending cookie (if any) and header
// pairs, and returns the response with its body in X-Test-Body.
func submit(t *testing.T, base, code string, cookie *http.Cookie, token, password string, header ...string) *http.Response {
	t.Helper()
	body := url.Values{"token": {token}, "password": {password}}.Encode()
	return post(t, base+"/"+code, "application/x-www-form-urlencoded", body, cookie, header...)
}

func post(t *testing.T, target, contentType, body string, cookie *http.Cookie, header ...string) *http.Response {
	t.Helper()
	req, err := http.NewRequest(http.MethodPost, target, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", contentType)
	if cookie != nil {
		req.AddCookie(&http.Cookie{Name: cookie.Name, Value: cookie.Value})
	}
	for i := 0; i+1 < len(header); i += 2 {
		req.Header.Set(header[i], header[i+1])
	}
	resp, err := client.Do(req)
	if err != nil {
		t.Fatalf("POST %s: %v", target, err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	resp.Header.Set("X-Test-Body", string(b))
	return resp
}

// signToken makes a form token under testFormSecret, as the service does:
// nonce.issued-at.base64url(HMAC-SHA256(secret, code|nonce|issued-at)).
func signToken(code, nonce string, issued time.Time) string {
	return signTokenWith(testFormSecret, code, nonce, issued)
}

func signTokenWith(secret, code, nonce string, issued time.Time) string {
	iat := strconv.FormatInt(issued.Unix(), 10)
	m := hmac.New(sha256.New, []byte(secret))
	m.Write([]byte(code + "|" + nonce + "|" + iat))
	return nonce + "." + iat + "." + base64.RawURLEncoding.EncodeToString(m.Sum(nil))
}

// assertForm checks a form page: status, security headers, the message,
// and that it shows neither the target nor a Location.
func assertForm(t *testing.T, what string, resp *http.Response, status int, message, target string) {
	t.Helper()
	body := resp.Header.Get("X-Test-Body")
	if resp.StatusCode != status {
		t.Errorf("%s: %d, want %d; body %q", what, resp.StatusCode, status, body)
	}
	if loc := resp.Header.Get("Location"); loc != "" || strings.Contains(body, target) {
		t.Errorf("%s: reveals the target (Location %q): %q", what, loc, body)
	}
	csp := resp.Header.Get("Content-Security-Policy")
	for _, want := range []string{"default-src 'none'", "style-src 'sha256-", "form-action 'self'", "frame-ancestors 'none'"} {
		if !strings.Contains(csp, want) {
			t.Errorf("%s: Content-Security-Policy %q lacks %q", what, csp, want)
		}
	}
	for name, want := range map[string]string{
		"Cache-Control": "no-store", "X-Frame-Options": "DENY", "Referrer-Policy": "no-referrer",
		"X-Content-Type-Options": "nosniff", "Content-Type": "text/html; charset=utf-8",
	} {
		if got := resp.Header.Get(name); got != want {
			t.Errorf("%s: %s %q, want %q", what, name, got, want)
		}
	}
	if resp.Request.Method != http.MethodHead && (!strings.Contains(body, `<form method="post"`) || !strings.Contains(body, message)) {
		t.Errorf("%s: no form or no %q in %q", what, message, body)
	}
}

// TestPasswordFormPage: GET (and HEAD, and a preview fetcher's GET) of a
// password-protected link answers 200 with the form, never the target, with
// the security headers and a nonce cookie; nothing from the request but the
// code and the query (in the form's action) reaches the page, escaped.
func TestPasswordFormPage(t *testing.T) {
	const xss = `<script>alert("kurz")</script>`
	f := newFixture(t)
	code := f.code()
	const target = "https://example.com/secret-place"
	f.insertLink(code, target, features{passwordHash: testHash(t)})
	vrc := &redisCounter{}
	r := start(t, map[string]string{"KURZ_REDIRECT_TRUSTED_PROXIES": "127.0.0.1/32,::1"}, hooks{visitRedis: counted(t, f, vrc)})

	resp, fm := openForm(t, r.HTTP, code+"?next="+url.QueryEscape(xss), "User-Agent", xss, "Referer", "https://x.example/?"+xss)
	assertForm(t, "GET", resp, http.StatusOK, "Enter the password", target)
	body := resp.Header.Get("X-Test-Body")
	if strings.Contains(strings.ToLower(body), "<script") || !strings.Contains(body, "/"+code) {
		t.Errorf("form page reflects the request or lacks the code: %q", body)
	}
	if c := fm.cookie; !c.HttpOnly || c.SameSite != http.SameSiteStrictMode || c.Path != "/"+code || c.Secure || c.MaxAge != 3600 {
		t.Errorf("cookie %+v: want HttpOnly, SameSite=Strict, Path=/%s, Max-Age=3600, not Secure over plain HTTP", c, code)
	}
	_, behindTLS := openForm(t, r.HTTP, code, "X-Forwarded-Proto", "https")
	if !behindTLS.cookie.Secure {
		t.Errorf("cookie behind a TLS-terminating proxy (X-Forwarded-Proto: https): %+v, want Secure", behindTLS.cookie)
	}

	head := do(t, http.MethodHead, r.HTTP+"/"+code)
	assertForm(t, "HEAD", head, http.StatusOK, "", target)
	bot := get(t, r.HTTP, "/"+code, "User-Agent", slackUA)
	assertForm(t, "GET by a preview fetcher", bot, http.StatusOK, "Enter the password", target)
	if n := vrc.total(); n != 0 {
		t.Errorf("a password link without a visit limit touched the visit counters %d times", n)
	}
}

// TestPasswordFormCSRF: a POST without the form's cookie, with another
// form's nonce, with a forged or re-signed token, or an hour-old one is
// refused with 403 and the form again, before the limiter is asked.
func TestPasswordFormCSRF(t *testing.T) {
	f := newFixture(t)
	code, other := f.code(), f.code()
	const target = "https://example.com/csrf"
	f.insertLink(code, target, features{passwordHash: testHash(t)})
	lim := limitertest.Start(t, limitertest.AllowAll)
	r := start(t, map[string]string{"KURZ_LIMITER_GRPC_ADDR": lim.Addr(), "KURZ_REDIRECT_FORM_SECRET": testFormSecret}, hooks{})

	_, a := openForm(t, r.HTTP, code)
	_, b := openForm(t, r.HTTP, code)
	nonce := a.token[:strings.IndexByte(a.token, '.')]
	at := strings.LastIndexByte(a.token, '.') + 1
	flip := byte('A')
	if a.token[at] == 'A' {
		flip = 'B'
	}
	flipped := a.token[:at] + string(flip) + a.token[at+1:]
	tests := map[string]struct {
		cookie *http.Cookie
		token  string
	}{
		"no cookie":                  {nil, a.token},
		"no token":                   {a.cookie, ""},
		"nonce of another form":      {a.cookie, b.token},
		"signature flipped":          {a.cookie, flipped},
		"signed with another secret": {a.cookie, signTokenWith("another secret of 32 characters!", code, nonce, time.Now())},
		"token of another code":      {a.cookie, signToken(other, nonce, time.Now())},
		"issued an hour ago":         {a.cookie, signToken(code, nonce, time.Now().Add(-time.Hour))},
		"issued in the future":       {a.cookie, signToken(code, nonce, time.Now().Add(5*time.Minute))},
		"garbage":                    {a.cookie, "<b>.x.y"},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			resp := submit(t, r.HTTP, code, tc.cookie, tc.token, testPassword)
			assertForm(t, name, resp, http.StatusForbidden, "was not sent from this page", target)
			if strings.Contains(resp.Header.Get("X-Test-Body"), "<b>") {
				t.Errorf("the posted token is reflected")
			}
		})
	}
	if calls := len(lim.Calls()); calls > 1 { // the first GET's miss-path check only
		t.Errorf("refused forms reached the limiter (%d calls): the token is checked first", calls)
	}
	// The test's own signature is the service's: a fresh token it signs works.
	if resp := submit(t, r.HTTP, code, a.cookie, signToken(code, nonce, time.Now()), testPassword); resp.StatusCode != http.StatusSeeOther {
		t.Errorf("a valid token signed like the service: %d, want 303", resp.StatusCode)
	}

	// Bad bodies: too large, not a form, not even a password link.
	big := url.Values{"token": {a.token}, "password": {strings.Repeat("x", 8<<10)}}.Encode()
	if resp := post(t, r.HTTP+"/"+code, "application/x-www-form-urlencoded", big, a.cookie); resp.StatusCode != http.StatusRequestEntityTooLarge {
		t.Errorf("8 KiB form: %d, want 413", resp.StatusCode)
	}
	if resp := post(t, r.HTTP+"/"+code, "application/json", `{"password":"x"}`, a.cookie); resp.StatusCode != http.StatusUnsupportedMediaType {
		t.Errorf("JSON body: %d, want 415", resp.StatusCode)
	}
	open := f.code()
	f.insert(open, "feat", "https://example.com/open", 0, nil, false)
	if resp := post(t, r.HTTP+"/"+open, "application/x-www-form-urlencoded", "password=x", nil); resp.StatusCode != http.StatusMethodNotAllowed || resp.Header.Get("Location") != "" {
		t.Errorf("POST to a link without a password: %d Location %q, want 405 and no Location", resp.StatusCode, resp.Header.Get("Location"))
	}
}

// TestPasswordAttempts: a wrong password is 401 with the form; the right
// one a 303 to the target (the browser GETs it, a 307/308 link included),
// uncacheable, counted as a click, after the limiter calls of an attempt
// (domain links.password charged with client IP, its network and code;
// links.password.guesses looked at, and charged after a wrong password,
// with client IP and code). On a visit-limited link the right password
// spends a visit.
func TestPasswordAttempts(t *testing.T) {
	f := newFixture(t)
	code, once := f.code(), f.code()
	const target = "https://example.com/behind-password"
	f.insertLink(code, target, features{status: 308, passwordHash: testHash(t)})
	f.insertLink(once, "https://example.com/once", features{passwordHash: testHash(t), maxVisits: 1})
	lim := limitertest.Start(t, limitertest.AllowAll)
	since := time.Now().Add(-time.Second)
	r := start(t, map[string]string{"KURZ_LIMITER_GRPC_ADDR": lim.Addr(), "KURZ_REDIRECT_TRUSTED_PROXIES": "127.0.0.1/32,::1",
		"KURZ_REDIRECT_CLICK_FLUSH_INTERVAL": "20ms", "KURZ_REDIRECT_FORM_SECRET": testFormSecret}, hooks{})
	ip := []string{"X-Forwarded-For", "203.0.113.7", "User-Agent", "kurz-test/1.0"}

	_, fm := openForm(t, r.HTTP, code, ip...)
	before := len(lim.Calls())
	wrong := submit(t, r.HTTP, code, fm.cookie, fm.token, "not the password", ip...)
	assertForm(t, "wrong password", wrong, http.StatusUnauthorized, "Wrong password.", target)
	again := formOf(t, wrong) // the 401 carries a fresh form
	right := submit(t, r.HTTP, code, again.cookie, again.token, testPassword, ip...)
	if right.StatusCode != http.StatusSeeOther || right.Header.Get("Location") != target || right.Header.Get("Cache-Control") != "no-store" {
		t.Fatalf("right password: %d Location %q Cache-Control %q, want 303 to %s, no-store", right.StatusCode,
			right.Header.Get("Location"), right.Header.Get("Cache-Control"), target)
	}
	calls := lim.Calls()[before:]
	// The wrong attempt: a charge, a look, a charge of the guess; the
	// right one: a charge and a look.
	want := []struct {
		domain string
		cost   uint32
	}{{"links.password", 1}, {"links.password.guesses", 0}, {"links.password.guesses", 1}, {"links.password", 1}, {"links.password.guesses", 0}}
	if len(calls) != len(want) {
		t.Fatalf("%d limiter calls for 2 attempts, want %d", len(calls), len(want))
	}
	for i, c := range calls {
		// Only links.password, the Argon2 work, is charged to the network
		// (the IPv4 address's /24).
		descriptors, network := 2, ""
		if want[i].domain == "links.password" {
			descriptors, network = 3, "203.0.113.0/24"
		}
		if d := c.GetDescriptors(); c.GetDomain() != want[i].domain || c.GetCost() != want[i].cost || d["ip"] != "203.0.113.7" || d["code"] != code ||
			d["net"] != network || len(d) != descriptors {
			t.Errorf("limiter call %d %v, want %s cost %d with ip 203.0.113.7, code %s and net %q", i+1, c, want[i].domain, want[i].cost, code, network)
		}
	}
	await(t, "the click of the right password", 10*time.Second, func() bool {
		_, n := streamEvents(t, f.rdb, r.cfg.Streams.Shards, code, since)
		return n == 1
	})

	_, fm = openForm(t, r.HTTP, once, ip...)
	if resp := submit(t, r.HTTP, once, fm.cookie, fm.token, testPassword, ip...); resp.StatusCode != http.StatusSeeOther {
		t.Fatalf("first visit of a one-visit password link: %d", resp.StatusCode)
	}
	if resp := get(t, r.HTTP, "/"+once, ip...); resp.StatusCode != http.StatusGone {
		t.Errorf("form of a spent one-visit link: %d, want 410", resp.StatusCode)
	}
	// A second right password (a form kept open in another tab) finds the
	// visit spent.
	if resp := submit(t, r.HTTP, once, fm.cookie, signToken(once, fm.cookie.Value, time.Now()), testPassword, ip...); resp.StatusCode != http.StatusGone || resp.Header.Get("Location") != "" {
		t.Errorf("second right password on a one-visit link: %d Location %q, want 410", resp.StatusCode, resp.Header.Get("Location"))
	}
	if got, _ := f.rdb.Get(context.Background(), linkcache.VisitsKey(once)).Int64(); got != 1 {
		t.Errorf("visit counter %d after two right passwords, want 1 (the refused visit is not counted)", got)
	}
	if err := r.Stop(); err != nil { // flushes the click buffer
		t.Fatal(err)
	}
	// Only the right passwords that redirected are clicks: not the form
	// pages, the 401, nor the 410.
	for c, want := range map[string]int{code: 1, once: 1} {
		if _, n := streamEvents(t, f.rdb, r.cfg.Streams.Shards, c, since); n != want {
			t.Errorf("%s: %d click events, want %d", c, n, want)
		}
	}
}

// startLimiterProcess runs the real limiter on testdata/rules.yaml (file
// mode) and returns its address.
func startLimiterProcess(t *testing.T) string {
	t.Helper()
	rules, err := filepath.Abs(filepath.Join("testdata", "rules.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	return startLimiterOn(t, rules)
}

// startLimiterOn runs the real limiter in file mode on the rules file at
// the absolute path rules and returns its address.
func startLimiterOn(t *testing.T, rules string) string {
	t.Helper()
	dir := t.TempDir()
	if err := servertest.BuildServices(dir, "limiter"); err != nil {
		t.Fatal(err)
	}
	p := servertest.Run(t, dir, servertest.Spec{Name: "limiter", Service: "kurz.ratelimit.v1.RateLimitService", Env: func(g, h string) []string {
		return []string{"KURZ_LIMITER_GRPC_ADDR=" + g, "KURZ_LIMITER_HTTP_ADDR=" + h,
			"KURZ_LIMITER_RULES_SOURCE=file", "KURZ_LIMITER_RULES_FILE=" + rules,
			"KURZ_LIMITER_REDIS_TIMEOUT=1s", "KURZ_REDIS_READ_TIMEOUT=1s", "KURZ_REDIS_WRITE_TIMEOUT=1s", "KURZ_LOG_LEVEL=warn"}
	}})
	t.Cleanup(func() {
		if err := p.Stop(); err != nil {
			t.Errorf("limiter did not stop cleanly: %v\n%s", err, p.Output())
		}
	})
	return p.GRPCAddr
}

// TestPasswordAttemptsLimited, with the real limiter and the bootstrap's
// rule (links.password.guesses per-ip-link: 5 wrong passwords per 15
// minutes, per client IP and link): right passwords never count, so one
// address (an office's NAT) opens the link as often as it likes; after 5
// wrong ones the sixth attempt is 429 with Retry-After, even with the right
// password, and never redirected; another IP still gets in.
func TestPasswordAttemptsLimited(t *testing.T) {
	f := newFixture(t)
	code := f.code()
	const target = "https://example.com/limited"
	f.insertLink(code, target, features{passwordHash: testHash(t)})
	r := start(t, map[string]string{"KURZ_LIMITER_GRPC_ADDR": startLimiterProcess(t),
		"KURZ_REDIRECT_TRUSTED_PROXIES": "127.0.0.1/32,::1", "KURZ_REDIRECT_PASSWORD_LIMITER_TIMEOUT": "2s"}, hooks{})
	office := []string{"X-Forwarded-For", "198.51.100.65"}
	for i := range 10 {
		_, fm := openForm(t, r.HTTP, code, office...)
		if resp := submit(t, r.HTTP, code, fm.cookie, fm.token, testPassword, office...); resp.StatusCode != http.StatusSeeOther || resp.Header.Get("Location") != target {
			t.Fatalf("right password %d of 10 from one address: %d %q, want 303 to the target", i+1, resp.StatusCode, resp.Header.Get("Location"))
		}
	}
	attacker := []string{"X-Forwarded-For", "198.51.100.66"}
	_, fm := openForm(t, r.HTTP, code, attacker...)
	for i := range 5 {
		resp := submit(t, r.HTTP, code, fm.cookie, fm.token, "guess number "+strconv.Itoa(i), attacker...)
		if resp.StatusCode != http.StatusUnauthorized {
			t.Fatalf("guess %d: %d, want 401", i+1, resp.StatusCode)
		}
		fm = formOf(t, resp)
	}
	resp := submit(t, r.HTTP, code, fm.cookie, fm.token, testPassword, attacker...)
	assertForm(t, "sixth attempt, right password", resp, http.StatusTooManyRequests, "Too many attempts", target)
	if ra, err := strconv.Atoi(resp.Header.Get("Retry-After")); err != nil || ra < 1 || ra > 900 {
		t.Errorf("Retry-After %q, want 1..900 seconds", resp.Header.Get("Retry-After"))
	}
	other := []string{"X-Forwarded-For", "198.51.100.67"}
	_, fm = openForm(t, r.HTTP, code, other...)
	if resp := submit(t, r.HTTP, code, fm.cookie, fm.token, testPassword, other...); resp.StatusCode != http.StatusSeeOther || resp.Header.Get("Location") != target {
		t.Errorf("another IP, right password: %d %q, want 303 to the target", resp.StatusCode, resp.Header.Get("Location"))
	}

	// Wrong guesses are counted after their hash: a burst posted at once
	// still gets no more than 5 checked. Of those the gate lets through,
	// some may find every Argon2 slot of the pod busy, and as many
	// waiting: they are refused, nothing checked (503).
	burst := []string{"X-Forwarded-For", "198.51.100.68"}
	forms := make([]form, 20)
	for i := range forms {
		_, forms[i] = openForm(t, r.HTTP, code, burst...)
	}
	statuses := make([]int, len(forms))
	busy := make([]bool, len(forms))
	var wg sync.WaitGroup
	for i, fm := range forms {
		body := url.Values{"token": {fm.token}, "password": {"burst guess " + strconv.Itoa(i)}}.Encode()
		req, err := http.NewRequest(http.MethodPost, r.HTTP+"/"+code, strings.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
		req.Header.Set(burst[0], burst[1])
		req.AddCookie(&http.Cookie{Name: fm.cookie.Name, Value: fm.cookie.Value})
		wg.Go(func() {
			// t.Fatal belongs to the test's goroutine: a failed POST
			// leaves status 0, reported below.
			if resp, err := client.Do(req); err == nil {
				b, _ := io.ReadAll(resp.Body)
				resp.Body.Close()
				statuses[i] = resp.StatusCode
				busy[i] = resp.Header.Get("Retry-After") == "1" && strings.Contains(string(b), "yours was not checked")
			}
		})
	}
	wg.Wait()
	checked := 0
	for i, s := range statuses {
		switch {
		case s == http.StatusUnauthorized:
			checked++
		case s == http.StatusTooManyRequests, s == http.StatusServiceUnavailable && busy[i]:
		default:
			t.Errorf("burst guess: %d, want 401, 429, or 503 with every Argon2 slot busy", s)
		}
	}
	if checked > 5 {
		t.Errorf("%d of a burst of %d wrong guesses were checked, want at most 5", checked, len(forms))
	}
}

// The attempts at a link one address has in flight on a pod keep to the
// wrong guesses the rule has left (pkg/guessgate), also when a look is
// stale or the limiter's count is lost. The fake limiters below let
// attempts through links.password and answer links.password.guesses for
// a rule of 2 wrong guesses.
func TestPasswordGuessesInFlightKeepToTheRule(t *testing.T) {
	f := newFixture(t)
	code := f.code()
	f.insertLink(code, "https://example.com/guesses", features{passwordHash: testHash(t)})
	const allowed = 2
	answer := func(allowedNow bool, left int64, source ratelimitv1.DecisionSource) *ratelimitv1.CheckQuotaResponse {
		return &ratelimitv1.CheckQuotaResponse{Allowed: allowedNow, DecidingRule: "links.password.guesses/per-ip-link",
			Limit: allowed, Remaining: max(left, 0), Source: source}
	}
	// burst opens n forms, posts a wrong guess with each at once from one
	// address, and sends each answer's status on the returned channel.
	burst := func(t *testing.T, lim *limitertest.Server, n int) <-chan int {
		r := start(t, map[string]string{"KURZ_LIMITER_GRPC_ADDR": lim.Addr(), "KURZ_REDIRECT_TRUSTED_PROXIES": "127.0.0.1/32,::1",
			"KURZ_REDIRECT_PASSWORD_LIMITER_TIMEOUT": "15s"}, hooks{})
		ip := []string{"X-Forwarded-For", "198.51.100.69"}
		statuses := make(chan int, n)
		for i := range n {
			_, fm := openForm(t, r.HTTP, code, ip...)
			body := url.Values{"token": {fm.token}, "password": {"guess " + strconv.Itoa(i)}}.Encode()
			req, err := http.NewRequest(http.MethodPost, r.HTTP+"/"+code, strings.NewReader(body))
			if err != nil {
				t.Fatal(err)
			}
			req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
			req.Header.Set(ip[0], ip[1])
			req.AddCookie(&http.Cookie{Name: fm.cookie.Name, Value: fm.cookie.Value})
			go func() {
				status := 0 // no answer
				if resp, err := client.Do(req); err == nil {
					resp.Body.Close()
					status = resp.StatusCode
				}
				statuses <- status
			}()
		}
		return statuses
	}
	// hold waits in the fake for ch, at most long enough for the
	// redirect's own deadline to answer a test that went wrong.
	hold := func(ch <-chan struct{}) {
		select {
		case <-ch:
		case <-time.After(20 * time.Second):
		}
	}
	count := func(statuses <-chan int, n int, got map[int]int) map[int]int {
		for range n {
			got[<-statuses]++
		}
		return got
	}

	// The third attempt's look is taken before the first two attempts'
	// wrong guesses are charged (the fake holds their charges until it
	// came) and answered after both have been answered 401: what it saw
	// is stale, and it must look again rather than be checked on it.
	t.Run("stale look", func(t *testing.T) {
		var looks, charged atomic.Int64
		thirdLook, release := make(chan struct{}), make(chan struct{})
		lim := limitertest.Start(t, func(req *ratelimitv1.CheckQuotaRequest) *ratelimitv1.CheckQuotaResponse {
			if req.GetDomain() != "links.password.guesses" {
				return limitertest.AllowAll(req)
			}
			if req.GetCost() > 0 {
				hold(thirdLook)
				left := allowed - charged.Add(1)
				return answer(left >= 0, left, ratelimitv1.DecisionSource_DECISION_SOURCE_REDIS)
			}
			left := allowed - charged.Load()
			if looks.Add(1) == 3 {
				close(thirdLook)
				hold(release)
			}
			return answer(left > 0, left, ratelimitv1.DecisionSource_DECISION_SOURCE_REDIS)
		})
		statuses := burst(t, lim, 3)
		got := count(statuses, 2, map[int]int{})
		close(release)
		got = count(statuses, 1, got)
		if got[http.StatusUnauthorized] != allowed || got[http.StatusTooManyRequests] != 1 {
			t.Errorf("3 concurrent wrong guesses, %d allowed, the third one's look stale: %v; want %d checked (401), 1 refused (429)", allowed, got, allowed)
		}
	})

	// The limiter's charges fail closed (its Redis did not answer) while
	// its looks keep saying 2 left: the failures count here instead, so a
	// burst of 10 gets 2 checked, not 10 (2 at a time).
	t.Run("lost charges", func(t *testing.T) {
		const n = 10
		var looks atomic.Int64
		together := make(chan struct{})
		lim := limitertest.Start(t, func(req *ratelimitv1.CheckQuotaRequest) *ratelimitv1.CheckQuotaResponse {
			if req.GetDomain() != "links.password.guesses" {
				return limitertest.AllowAll(req)
			}
			if req.GetCost() > 0 {
				return answer(false, 0, ratelimitv1.DecisionSource_DECISION_SOURCE_FAIL_CLOSED)
			}
			// The first looks wait for one another: every attempt is
			// in the redirect before any check ends.
			if looks.Add(1) == n {
				close(together)
			}
			hold(together)
			return answer(true, allowed, ratelimitv1.DecisionSource_DECISION_SOURCE_REDIS)
		})
		if got := count(burst(t, lim, n), n, map[int]int{}); got[http.StatusUnauthorized] != allowed || got[http.StatusTooManyRequests] != n-allowed {
			t.Errorf("%d concurrent wrong guesses, %d left at every look, no charge counted: %v; want %d checked (401), the rest refused (429)", n, allowed, got, allowed)
		}
	})
}

// TestPasswordAttemptsFailClosed: when the limiter does not answer (nothing
// listens, or it accepts and hangs), an attempt is refused with 503,
// Retry-After and the form, even with the right password; the miss path's
// fail-open policy does not apply to passwords.
func TestPasswordAttemptsFailClosed(t *testing.T) {
	f := newFixture(t)
	code := f.code()
	const target = "https://example.com/fail-closed"
	f.insertLink(code, target, features{passwordHash: testHash(t)})
	for name, addr := range map[string]string{"nothing listens": "127.0.0.1:1", "hangs": blackHole(t)} {
		t.Run(name, func(t *testing.T) {
			r := start(t, map[string]string{"KURZ_LIMITER_GRPC_ADDR": addr, "KURZ_REDIRECT_MISS_FAILURE_POLICY": "open",
				"KURZ_REDIRECT_LIMITER_TIMEOUT": "50ms", "KURZ_REDIRECT_PASSWORD_LIMITER_TIMEOUT": "100ms"}, hooks{})
			_, fm := openForm(t, r.HTTP, code)
			resp := submit(t, r.HTTP, code, fm.cookie, fm.token, testPassword)
			assertForm(t, "limiter "+name, resp, http.StatusServiceUnavailable, "cannot be checked right now", target)
			if resp.Header.Get("Retry-After") == "" {
				t.Errorf("503 without Retry-After")
			}
		})
	}
}

// With no limiter rule for password attempts (links.password deleted),
// every attempt is let through to the hash and warned about: once for a
// burst, not once per attempt, which a stranger posts as fast as it likes.
func TestPasswordAttemptsWithoutARuleWarnOncePerBurst(t *testing.T) {
	f := newFixture(t)
	code := f.code()
	f.insertLink(code, "https://example.com/no-rule", features{passwordHash: testHash(t)})
	noRule := limitertest.Start(t, func(*ratelimitv1.CheckQuotaRequest) *ratelimitv1.CheckQuotaResponse {
		return &ratelimitv1.CheckQuotaResponse{Allowed: true, Source: ratelimitv1.DecisionSource_DECISION_SOURCE_NO_RULE}
	})
	cfg := load(t, map[string]string{"KURZ_REDIRECT_VISITOR_SALT": testSalt, "KURZ_LIMITER_GRPC_ADDR": noRule.Addr()})
	var logs servertest.SyncBuffer
	srv, err := build(context.Background(), cfg, slog.New(slog.NewJSONHandler(&logs, nil)), hooks{})
	if err != nil {
		t.Fatal(err)
	}
	r := servertest.Start(t, srv)
	r.AwaitServing(t, "")
	_, fm := openForm(t, r.HTTP, code)
	start := time.Now()
	for i := range 10 {
		resp := submit(t, r.HTTP, code, fm.cookie, fm.token, "guess number "+strconv.Itoa(i))
		if resp.StatusCode != http.StatusUnauthorized {
			t.Fatalf("guess %d: %d, want 401", i+1, resp.StatusCode)
		}
		fm = formOf(t, resp)
	}
	// One line a second: each attempt hashes (slow under -race), so the
	// ten may take a few seconds, each second allowed a line.
	most := int(time.Since(start)/time.Second) + 1
	if n := strings.Count(logs.String(), "no limiter rule for password attempts"); n < 1 || n > most {
		t.Errorf("%d warnings about 10 attempts no rule bounds, over %v: want 1 to %d", n, time.Since(start).Round(time.Millisecond), most)
	}
}

// counted returns a cluster client (no retries, like the service's own)
// whose commands c counts, for the visit counters.
func counted(t *testing.T, f *fixture, c *redisCounter) redis.Cmdable {
	t.Helper()
	opts := f.rdb.Options()
	rdb := redis.NewClusterClient(&redis.ClusterOptions{Addrs: opts.Addrs, Password: opts.Password,
		DialTimeout: time.Second, ReadTimeout: 5 * time.Second, WriteTimeout: 5 * time.Second, MaxRetries: -1, PoolSize: 64})
	rdb.AddHook(c)
	// Visit counts go straight to the key's node (INCR then WAIT there).
	rdb.OnNewNode(func(node *redis.Client) { node.AddHook(c) })
	t.Cleanup(func() { _ = rdb.Close() })
	return rdb
}

// TestVisitLimit: 200 concurrent GETs of a link limited to 50 visits give
// exactly 50 redirects (uncacheable) and 150 410s, the same 410 as a revoked
// link's. HEAD and a preview fetcher's GET show the status without Location
// and spend nothing. An ordinary link's redirect writes nothing to Redis.
func TestVisitLimit(t *testing.T) {
	const n, limit = 200, 50
	f := newFixture(t)
	code, plain, gone := f.code(), f.code(), f.code()
	const target = "https://example.com/limited-edition"
	f.insertLink(code, target, features{maxVisits: limit})
	f.insert(plain, "feat", "https://example.com/plain", 0, nil, false)
	f.insert(gone, "feat", "https://example.com/gone", 0, nil, true)
	vrc := &redisCounter{}
	// Room for 200 INCRs queueing on one key under the race detector: the
	// test is about exact counting, not latency.
	r := start(t, map[string]string{"KURZ_REDIRECT_VISIT_TIMEOUT": "5s"}, hooks{visitRedis: counted(t, f, vrc)})
	ctx := context.Background()
	visits := func() int64 {
		v, err := f.rdb.Get(ctx, linkcache.VisitsKey(code)).Int64()
		if err != nil && !errors.Is(err, redis.Nil) {
			t.Fatal(err)
		}
		return v
	}

	for _, p := range []struct {
		what   string
		method string
		header []string
	}{{"HEAD", http.MethodHead, nil}, {"preview fetcher", http.MethodGet, []string{"User-Agent", slackUA}}} {
		resp := do(t, p.method, r.HTTP+"/"+code, p.header...)
		if resp.StatusCode != http.StatusFound || resp.Header.Get("Location") != "" || strings.Contains(resp.Header.Get("X-Test-Body"), target) {
			t.Errorf("%s before any visit: %d Location %q, want 302 without Location", p.what, resp.StatusCode, resp.Header.Get("Location"))
		}
	}
	if v := visits(); v != 0 {
		t.Fatalf("HEAD and a preview fetcher spent %d visits", v)
	}

	statuses := make(chan *http.Response, n)
	var wg sync.WaitGroup
	for range n {
		wg.Go(func() { statuses <- get(t, r.HTTP, "/"+code) })
	}
	wg.Wait()
	close(statuses)
	goneBody := get(t, r.HTTP, "/"+gone).Header.Get("X-Test-Body")
	by := map[int]int{}
	for resp := range statuses {
		by[resp.StatusCode]++
		switch resp.StatusCode {
		case http.StatusFound:
			if resp.Header.Get("Location") != target || resp.Header.Get("Cache-Control") != "no-store" {
				t.Errorf("granted visit: Location %q Cache-Control %q, want %s and no-store", resp.Header.Get("Location"), resp.Header.Get("Cache-Control"), target)
			}
		case http.StatusGone:
			if resp.Header.Get("Location") != "" || resp.Header.Get("X-Test-Body") != goneBody {
				t.Errorf("spent link: Location %q body %q, want the revoked link's page", resp.Header.Get("Location"), resp.Header.Get("X-Test-Body"))
			}
		}
	}
	if by[http.StatusFound] != limit || by[http.StatusGone] != n-limit {
		t.Errorf("%d concurrent visits of a %d-visit link: statuses %v, want %d × 302 and %d × 410", n, limit, by, limit, n-limit)
	}
	if v := visits(); v != limit {
		t.Errorf("counter %d after %d visits, want it stopped at the limit, %d", v, n, limit)
	}
	for _, p := range []struct {
		what   string
		method string
		header []string
	}{{"HEAD", http.MethodHead, nil}, {"preview fetcher", http.MethodGet, []string{"User-Agent", slackUA}}} {
		resp := do(t, p.method, r.HTTP+"/"+code, p.header...)
		if resp.StatusCode != http.StatusGone || resp.Header.Get("Location") != "" {
			t.Errorf("%s after the last visit: %d Location %q, want 410 without Location", p.what, resp.StatusCode, resp.Header.Get("Location"))
		}
	}
	if v := visits(); v != limit {
		t.Errorf("HEAD and a preview fetcher moved the counter to %d", v)
	}

	before := vrc.total()
	for range 5 {
		if resp := get(t, r.HTTP, "/"+plain); resp.StatusCode != http.StatusFound {
			t.Fatalf("ordinary link: %d", resp.StatusCode)
		}
	}
	if after := vrc.total(); after != before {
		t.Errorf("ordinary redirects sent %d commands to the visit counters, want 0", after-before)
	}
	if got := f.rdb.Exists(ctx, linkcache.VisitsKey(plain)).Val(); got != 0 {
		t.Errorf("an ordinary link has a visit counter")
	}
}

// TestVisitCounterUnavailable: when Redis cannot count a visit (the counting
// client talks to a Redis that accepts and never answers), the visit is
// refused with 503 and Retry-After, never redirected uncounted, and no click
// is recorded.
func TestVisitCounterUnavailable(t *testing.T) {
	f := newFixture(t)
	code := f.code()
	f.insertLink(code, "https://example.com/uncountable", features{maxVisits: 10})
	dead := redis.NewClusterClient(&redis.ClusterOptions{Addrs: []string{blackHole(t)},
		DialTimeout: 200 * time.Millisecond, ReadTimeout: 200 * time.Millisecond, WriteTimeout: 200 * time.Millisecond, MaxRetries: -1})
	t.Cleanup(func() { _ = dead.Close() })
	since := time.Now().Add(-time.Second)
	r := start(t, map[string]string{"KURZ_REDIRECT_VISIT_TIMEOUT": "200ms"}, hooks{visitRedis: dead})
	for _, method := range []string{http.MethodGet, http.MethodHead} {
		resp := do(t, method, r.HTTP+"/"+code)
		if resp.StatusCode != http.StatusServiceUnavailable || resp.Header.Get("Location") != "" || resp.Header.Get("Retry-After") != "1" {
			t.Errorf("%s with the counter unreachable: %d Location %q Retry-After %q, want 503, none, 1",
				method, resp.StatusCode, resp.Header.Get("Location"), resp.Header.Get("Retry-After"))
		}
	}
	if err := r.Stop(); err != nil { // flushes the click buffer
		t.Fatal(err)
	}
	if _, n := streamEvents(t, f.rdb, r.cfg.Streams.Shards, code, since); n != 0 {
		t.Errorf("%d click events for refused visits", n)
	}
}

// TestVisitsHeldByAReplica: a visit is granted only once a replica holds
// its count, so a failover cannot grant it again; with the replica frozen
// the visit is refused (503), and granted again once it is back. A link that
// expires gives its counter the same end of life (plus an hour's grace), so
// no counter outlives its link.
func TestVisitsHeldByAReplica(t *testing.T) {
	f := newFixture(t)
	code := f.code()
	expires := time.Now().Add(48 * time.Hour).Truncate(time.Millisecond)
	f.insertLink(code, "https://example.com/durable", features{maxVisits: 3, expires: expires})
	master := redistest.Start(t)
	replica := master.StartReplica()
	vrdb := redis.NewClusterClient(&redis.ClusterOptions{Addrs: []string{master.Addr},
		DialTimeout: time.Second, ReadTimeout: 2 * time.Second, WriteTimeout: 2 * time.Second, MaxRetries: -1})
	t.Cleanup(func() { _ = vrdb.Close() })
	// Long enough for a loaded CI machine's replica to acknowledge (400 ms
	// failed there twice), short enough for the paused replica's refusal.
	r := start(t, map[string]string{"KURZ_REDIRECT_VISIT_TIMEOUT": "1500ms"}, hooks{visitRedis: vrdb})
	ctx := context.Background()
	key := linkcache.VisitsKey(code)

	get := func(want int) {
		t.Helper()
		if resp := do(t, http.MethodGet, r.HTTP+"/"+code); resp.StatusCode != want {
			t.Fatalf("GET: %d, want %d", resp.StatusCode, want)
		}
	}
	get(http.StatusFound)
	// The replica answers reads (READONLY) on one connection.
	rc := redis.NewClient(&redis.Options{Addr: replica.Addr, PoolSize: 1})
	t.Cleanup(func() { _ = rc.Close() })
	if err := rc.Do(ctx, "READONLY").Err(); err != nil {
		t.Fatal(err)
	}
	if n, err := rc.Get(ctx, key).Int64(); err != nil || n != 1 {
		t.Errorf("replica's count after a granted visit: %d (%v), want 1", n, err)
	}
	ttl, err := vrdb.PTTL(ctx, key).Result()
	// Redis rounds to its own clock: allow it a second either way.
	if want := time.Until(expires) + time.Hour; err != nil || (ttl-want).Abs() > time.Second {
		t.Errorf("counter TTL %v (%v), want %v: its link's expiry plus the grace", ttl, err, want)
	}

	replica.Pause()
	get(http.StatusServiceUnavailable) // counted on the master, held by no replica
	replica.Resume()
	get(http.StatusFound) // the third visit
	get(http.StatusGone)
}

// TestSpentVisitsStaySpent: a spent link's visit counter lives as long as
// the link, whatever becomes of its expiry. Visits of a link expiring soon
// give the counter that end plus the grace; clearing the expiry (UpdateLink,
// no visit in between) makes the counter permanent at once, in the
// shortener's write-through; and a visit under an entry without expiry
// makes it permanent too, whatever TTL it had (a visit counted by a pod
// that still held the old entry leaves one). Before, the counter kept its
// hour and then granted the spent link a fresh visit.
func TestSpentVisitsStaySpent(t *testing.T) {
	f := newFixture(t)
	sh := shortenertest.Start(t, map[string]string{
		"KURZ_LIMITER_GRPC_ADDR": limitertest.Start(t, limitertest.AllowAll).Addr(),
	})
	api := shortenerv1.NewShortenerServiceClient(sh.Conn)
	ctx := callmeta.Outgoing(context.Background(), "visits-test", "")
	soon := time.Now().Add(20 * time.Second).Truncate(time.Millisecond)
	made, err := api.CreateLink(ctx, &shortenerv1.CreateLinkRequest{LongUrl: "https://example.com/once", MaxVisits: 1,
		ExpireTime: timestamppb.New(soon)})
	if err != nil {
		t.Fatal(err)
	}
	code := made.GetLink().GetCode()
	f.track(code)
	key := linkcache.VisitsKey(code)
	ttl := func() time.Duration {
		t.Helper()
		d, err := f.rdb.PTTL(context.Background(), key).Result()
		if err != nil {
			t.Fatal(err)
		}
		return d
	}

	r := start(t, nil, hooks{})
	for _, want := range []int{http.StatusFound, http.StatusGone} {
		if resp := get(t, r.HTTP, "/"+code); resp.StatusCode != want {
			t.Fatalf("GET of a 1-visit link: %d, want %d", resp.StatusCode, want)
		}
	}
	// Redis rounds to its own clock: allow it a second either way.
	if got, want := ttl(), time.Until(soon)+linkcache.VisitsGrace; (got - want).Abs() > time.Second {
		t.Errorf("counter TTL %v, want %v: its link's expiry plus the grace", got, want)
	}

	if _, err := api.UpdateLink(ctx, &shortenerv1.UpdateLinkRequest{Link: &shortenerv1.Link{Code: code},
		UpdateMask: &fieldmaskpb.FieldMask{Paths: []string{"expire_time"}}}); err != nil {
		t.Fatal(err)
	}
	if got := ttl(); got != -1 {
		t.Errorf("counter TTL %v once the link never expires, want none (-1)", got)
	}

	// As a visit under the old entry leaves the counter. A fresh pod holds
	// nothing stale: it reads the new entry.
	if err := f.rdb.PExpire(context.Background(), key, time.Minute).Err(); err != nil {
		t.Fatal(err)
	}
	fresh := start(t, nil, hooks{})
	if resp := get(t, fresh.HTTP, "/"+code); resp.StatusCode != http.StatusGone {
		t.Errorf("spent link that never expires: %d, want 410", resp.StatusCode)
	}
	if got := ttl(); got != -1 {
		t.Errorf("counter TTL %v after a visit of the link that never expires, want none (-1)", got)
	}
	if n, err := f.rdb.Get(context.Background(), key).Int64(); err != nil || n != 1 {
		t.Errorf("visit count %d (%v), want 1: refused visits are not counted", n, err)
	}
}

// Raising a spent link's limit reopens it by exactly the difference, however
// many visits it refused meanwhile (they are not counted: with a plain INCR
// each pushed the counter on, and a raise from 2 to 4 after 6 visits
// reopened nothing).
func TestRaisingMaxVisitsReopensByTheDifference(t *testing.T) {
	f := newFixture(t)
	sh := shortenertest.Start(t, map[string]string{
		"KURZ_LIMITER_GRPC_ADDR": limitertest.Start(t, limitertest.AllowAll).Addr(),
	})
	api := shortenerv1.NewShortenerServiceClient(sh.Conn)
	ctx := callmeta.Outgoing(context.Background(), "visits-test", "")
	made, err := api.CreateLink(ctx, &shortenerv1.CreateLinkRequest{LongUrl: "https://example.com/raised", MaxVisits: 2})
	if err != nil {
		t.Fatal(err)
	}
	code := made.GetLink().GetCode()
	f.track(code)
	visit := func(r instance, want ...int) {
		t.Helper()
		for i, w := range want {
			if resp := get(t, r.HTTP, "/"+code); resp.StatusCode != w {
				t.Fatalf("visit %d: %d, want %d", i+1, resp.StatusCode, w)
			}
		}
	}
	visit(start(t, nil, hooks{}), 302, 302, 410, 410, 410, 410)
	if _, err := api.UpdateLink(ctx, &shortenerv1.UpdateLinkRequest{Link: &shortenerv1.Link{Code: code, MaxVisits: 4},
		UpdateMask: &fieldmaskpb.FieldMask{Paths: []string{"max_visits"}}}); err != nil {
		t.Fatal(err)
	}
	// A fresh pod: it holds no entry from before the update.
	visit(start(t, nil, hooks{}), 302, 302, 410, 410)
}

// TestDeviceTargets: each User-Agent class gets its target, or the long URL
// when the link has none for it; iPadOS Safari's Macintosh User-Agent is a
// desktop. The targets come from PostgreSQL on a miss (X-Source: db), then
// from Redis and L1, the same. A preview fetcher of an ordinary link is
// redirected like anyone (analytics marks its click as a bot's).
func TestDeviceTargets(t *testing.T) {
	f := newFixture(t)
	all, partial := f.code(), f.code()
	f.insertLink(all, "https://example.com/fallback", features{status: 301,
		ios: "https://apps.apple.com/app/id1", android: "https://play.google.com/store/apps/details?id=x", desktop: "https://example.com/desktop"})
	f.insertLink(partial, "https://example.com/fallback", features{android: "https://play.google.com/store/apps/details?id=x"})
	r := start(t, nil, hooks{})
	tests := []struct {
		code, ua, want string
	}{
		{all, iPhoneUA, "https://apps.apple.com/app/id1"},
		{all, androidUA, "https://play.google.com/store/apps/details?id=x"},
		{all, windowsUA, "https://example.com/desktop"},
		{all, iPadOSUA, "https://example.com/desktop"},
		{all, "", "https://example.com/desktop"},
		{partial, iPhoneUA, "https://example.com/fallback"},
		{partial, androidUA, "https://play.google.com/store/apps/details?id=x"},
		{partial, windowsUA, "https://example.com/fallback"},
		{partial, slackUA, "https://example.com/fallback"},
	}
	sources := map[string]bool{}
	for range 3 { // db, cache, l1
		for _, tc := range tests {
			resp := get(t, r.HTTP, "/"+tc.code, "User-Agent", tc.ua)
			sources[resp.Header.Get("X-Source")] = true
			if resp.Header.Get("Location") != tc.want || resp.Header.Get("Vary") != "User-Agent" || !strings.HasPrefix(resp.Header.Get("Cache-Control"), "private") {
				t.Errorf("/%s as %.40q (from %s): %d Location %q Vary %q Cache-Control %q, want %s, Vary: User-Agent, private",
					tc.code, tc.ua, resp.Header.Get("X-Source"), resp.StatusCode, resp.Header.Get("Location"),
					resp.Header.Get("Vary"), resp.Header.Get("Cache-Control"), tc.want)
			}
		}
	}
	if !sources["db"] || !sources["cache"] || !sources["l1"] {
		t.Errorf("answers came from %v, want db, cache and l1", sources)
	}
}

// TestMissCarriesLinkFeatures: the entry the redirect builds from PostgreSQL
// on a cache miss (and fills Redis with) holds the password hash, the visit
// limit and the per-device targets, as the shortener's write-through does.
func TestMissCarriesLinkFeatures(t *testing.T) {
	f := newFixture(t)
	code := f.code()
	hash := testHash(t)
	f.insertLink(code, "https://example.com/all-features", features{status: 307, maxVisits: 3, passwordHash: hash,
		ios: "https://apps.apple.com/app/id1", desktop: "https://example.com/desktop"})
	r := start(t, nil, hooks{})
	if resp := get(t, r.HTTP, "/"+code); resp.StatusCode != http.StatusOK || resp.Header.Get("X-Source") != "db" {
		t.Fatalf("first GET: %d from %q, want the form from db", resp.StatusCode, resp.Header.Get("X-Source"))
	}
	got, found, err := linkcache.Get(context.Background(), f.rdb, code)
	if err != nil || !found {
		t.Fatalf("Redis entry after the miss: found=%v err=%v", found, err)
	}
	want := linkcache.Entry{State: linkcache.Active, URL: "https://example.com/all-features", Tenant: "feat", Status: 307,
		PasswordHash: hash, MaxVisits: 3, Targets: &linkcache.Targets{IOS: "https://apps.apple.com/app/id1", Desktop: "https://example.com/desktop"}}
	if got.Targets == nil || *got.Targets != *want.Targets {
		t.Errorf("targets %+v, want %+v", got.Targets, want.Targets)
	}
	got.Targets, want.Targets = nil, nil
	if got != want {
		t.Errorf("entry filled from PostgreSQL:\n got %+v\nwant %+v", got, want)
	}
}
