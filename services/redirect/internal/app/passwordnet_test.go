//go:build integration

package app

import (
	"crypto/rand"
	"fmt"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"

	"go.yaml.in/yaml/v3"
)

// bootstrapRules is the limiter's shipped rules file.
var bootstrapRules = filepath.Join("..", "..", "..", "limiter", "internal", "rulestore", "bootstrap.yaml")

// ruleLimit is the limit of domain's enforced rule keyed on exactly key in
// the rules file at path.
func ruleLimit(t *testing.T, path, domain string, key ...string) int {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var rules struct {
		Domains map[string]struct {
			Rules []struct {
				Key    []string `yaml:"key"`
				Limit  int      `yaml:"limit"`
				Shadow bool     `yaml:"shadow"`
			} `yaml:"rules"`
		} `yaml:"domains"`
	}
	if err := yaml.Unmarshal(b, &rules); err != nil {
		t.Fatal(err)
	}
	for _, r := range rules.Domains[domain].Rules {
		if !r.Shadow && slices.Equal(r.Key, key) {
			return r.Limit
		}
	}
	t.Fatalf("%s has no enforced rule of %s keyed on %v", path, domain, key)
	return 0
}

// TestPasswordAttemptsPerNetwork, with the real limiter on its shipped
// rules: every password attempt is charged to its network too (the IPv6
// /48; an IPv4 /24), so a client holding a site's 65,536 /64s, each with
// its own per-address allowance and its own wrong guesses at a link, gets
// no more attempts than the network's rule allows. Past it, a /64 of that
// /48 that has made no attempt is refused (429) even with the right
// password, which a /64 of another /48 still opens.
func TestPasswordAttemptsPerNetwork(t *testing.T) {
	perNet := ruleLimit(t, bootstrapRules, "links.password", "net")
	perIP := ruleLimit(t, bootstrapRules, "links.password", "ip")
	guesses := ruleLimit(t, bootstrapRules, "links.password.guesses", "ip", "code")
	rules, err := filepath.Abs(bootstrapRules)
	if err != nil {
		t.Fatal(err)
	}
	f := newFixture(t)
	code := f.code()
	const target = "https://example.com/per-network"
	f.insertLink(code, target, features{passwordHash: testHash(t)})
	r := start(t, map[string]string{"KURZ_LIMITER_GRPC_ADDR": startLimiterOn(t, rules),
		"KURZ_REDIRECT_TRUSTED_PROXIES": "127.0.0.1/32,::1", "KURZ_REDIRECT_PASSWORD_LIMITER_TIMEOUT": "2s"}, hooks{})
	// Random /48s, so two runs within the rules' window do not meet.
	site := func() string {
		var b [2]byte
		_, _ = rand.Read(b[:])
		return fmt.Sprintf("2001:db8:%x", uint16(b[0])<<8|uint16(b[1]))
	}
	attacker, neighbour := site(), site()
	for attacker == neighbour {
		neighbour = site()
	}
	_, fm := openForm(t, r.HTTP, code)

	// The network's limit, and a little more: a sliding window counter
	// the attempts straddle weighs the earlier window's a little under
	// their number. Each /64 stays under its own per-address limit.
	total := perNet + perNet/50
	each := perIP - 1
	if each <= guesses {
		t.Fatalf("links.password/per-ip (%d) leaves no attempt past the %d guesses of links.password.guesses", perIP, guesses)
	}
	n := (total + each - 1) / each
	subnet := func(i int) string { return fmt.Sprintf("%s:%x::1", attacker, i) }
	// First each /64's wrong guesses, checked one at a time (401); then
	// the rest of its attempts, which its used-up guesses refuse (429)
	// before any hash but which count against the network all the same.
	for i := range n {
		for g := range guesses {
			if resp := submit(t, r.HTTP, code, fm.cookie, fm.token, fmt.Sprintf("guess %d of %s", g, subnet(i)), "X-Forwarded-For", subnet(i)); resp.StatusCode != http.StatusUnauthorized {
				t.Fatalf("wrong guess %d of /64 %d of %d: %d, want 401", g+1, i+1, n, resp.StatusCode)
			}
		}
	}
	statuses := make([]map[int]int, n)
	var wg sync.WaitGroup
	for i := range n {
		statuses[i] = map[int]int{}
		rest := min(each, total-i*each) - guesses
		body := url.Values{"token": {fm.token}, "password": {"past the guesses"}}.Encode()
		wg.Go(func() {
			for range rest {
				req, err := http.NewRequest(http.MethodPost, r.HTTP+"/"+code, strings.NewReader(body))
				if err != nil {
					statuses[i][0]++
					continue
				}
				req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
				req.Header.Set("X-Forwarded-For", subnet(i))
				req.AddCookie(&http.Cookie{Name: fm.cookie.Name, Value: fm.cookie.Value})
				status := 0 // no answer
				if resp, err := client.Do(req); err == nil {
					resp.Body.Close()
					status = resp.StatusCode
				}
				statuses[i][status]++
			}
		})
	}
	wg.Wait()
	for i, got := range statuses {
		if len(got) != 1 || got[http.StatusTooManyRequests] == 0 {
			t.Errorf("/64 %d's attempts past its guesses: %v, want 429 each", i+1, got)
		}
	}

	fresh := []string{"X-Forwarded-For", subnet(n)}
	resp := submit(t, r.HTTP, code, fm.cookie, fm.token, testPassword, fresh...)
	assertForm(t, "right password from a fresh /64 of a spent /48", resp, http.StatusTooManyRequests, "Too many attempts", target)
	other := []string{"X-Forwarded-For", neighbour + "::1"}
	if resp := submit(t, r.HTTP, code, fm.cookie, fm.token, testPassword, other...); resp.StatusCode != http.StatusSeeOther || resp.Header.Get("Location") != target {
		t.Errorf("right password from another /48: %d to %q, want 303 to %s", resp.StatusCode, resp.Header.Get("Location"), target)
	}
}
