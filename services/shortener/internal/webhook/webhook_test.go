package webhook

import (
	"encoding/base64"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

func TestCheckRefusesWhatNoOperatorAllowed(t *testing.T) {
	var strict Targets
	for _, raw := range []string{
		"", "http://example.com/hook", "ftp://example.com/", "https://user:pw@example.com/",
		"https://127.0.0.1/", "https://[::1]/", "https://10.0.0.8/", "https://169.254.169.254/latest",
		"https://192.168.1.1/", "https://[fe80::1]/", "https://224.0.0.1/", "https://100.64.0.1/",
		"https://[::ffff:127.0.0.1]/", "https://localhost/", "https://printer.local/", "https:///nohost",
		"https://example.com/" + strings.Repeat("a", maxURLLength),
		// One label (an intranet name, or one the search domains complete),
		// and a Unicode look-alike of a local name.
		"https://vm:5433/", "https://redis/", "https://ⓛⓞⓒⓐⓛⓗⓞⓢⓣ/", "https://db.ⓘⓝⓣⓔⓡⓝⓐⓛ/",
		"https://vm\uff0e/x", "https://runsc\u3002/x",
		"https://[2002:7f00:1::1]/",
		// Ports no sender can dial.
		"https://hooks.example.com:0/", "https://hooks.example.com:65536/", "https://hooks.example.com:99999/",
		"https://93.184.215.14:0/",
	} {
		if got, err := strict.Check(raw); err == nil {
			t.Errorf("Check(%q) = %q, want an error", raw, got)
		}
	}
	if _, err := strict.Check("https://hooks.example.com/kurz?x=1"); err != nil {
		t.Errorf("a public https URL: %v", err)
	}
	if got, err := strict.Check("https://BÜCHER.example:8443/kurz"); err != nil || got != "https://xn--bcher-kva.example:8443/kurz" {
		t.Errorf("a Unicode host: %q, %v; want it subscribed in punycode", got, err)
	}
	for raw, want := range map[string]string{
		"https://hooks.example.com:0443/kurz":    "https://hooks.example.com/kurz",
		"https://hooks.example.com:443/kurz":     "https://hooks.example.com/kurz",
		"https://hooks.example.com:08443/kurz":   "https://hooks.example.com:8443/kurz",
		"https://93.184.215.14:00443/kurz":       "https://93.184.215.14/kurz",
		"https://[2606:4700::1111]:0065535/kurz": "https://[2606:4700::1111]:65535/kurz",
	} {
		if got, err := strict.Check(raw); err != nil || got != want {
			t.Errorf("Check(%q) = %q, %v; want %q, the port as the sender dials it", raw, got, err, want)
		}
	}
	lenient := Targets{AllowHTTP: true, Allow: []netip.Prefix{netip.MustParsePrefix("127.0.0.0/8")}}
	for _, raw := range []string{"http://127.0.0.1:9/x", "http://localhost:9/"} {
		if _, err := lenient.Check(raw); err != nil {
			t.Errorf("allow-listed %q: %v", raw, err)
		}
	}
	if _, err := lenient.Check("http://10.0.0.1/"); err == nil {
		t.Error("10.0.0.1 is not in the allow-list")
	}
}

// TestCheckReadsNumericHostsAsABrowserDoes: 127.1, 2130706433, 0x7f.1 are
// 127.0.0.1 to a browser (WHATWG URL) but names to the resolver, so such a
// receiver was accepted and could never be reached. Check judges the
// address they spell, refusing it as it refuses 127.0.0.1, and subscribes
// a public one in dotted form, which the sender can dial.
func TestCheckReadsNumericHostsAsABrowserDoes(t *testing.T) {
	var strict Targets
	_, literal := strict.Check("https://127.0.0.1/")
	if literal == nil {
		t.Fatal("https://127.0.0.1/ accepted")
	}
	for _, raw := range []string{
		"https://127.1/", "https://2130706433/x", "https://0x7f.1/x", "https://017700000001/", "https://0/",
		"https://0X7F.0.0.1:8443/", "https://127.1./", "https://0xa9.254.169.254/latest", "https://3232235777/", // 192.168.1.1
	} {
		if got, err := strict.Check(raw); err == nil || err.Error() != literal.Error() {
			t.Errorf("Check(%q) = %q, %v; want %q", raw, got, err, literal)
		}
	}
	for _, raw := range []string{"https://1.2.3.4.5/", "https://256.1/", "https://0x100000000/", "https://08.1/", "https://example.123/"} {
		if got, err := strict.Check(raw); err == nil || !strings.Contains(err.Error(), "neither a domain name nor a valid IPv4 address") {
			t.Errorf("Check(%q) = %q, %v; want a host that is no IPv4 address refused", raw, got, err)
		}
	}
	for raw, want := range map[string]string{
		"https://8.8.8.8/kurz":            "https://8.8.8.8/kurz",
		"https://134744072/kurz":          "https://8.8.8.8/kurz",
		"https://0x8.8.8.8:8443/kurz?a=1": "https://8.8.8.8:8443/kurz?a=1",
		"https://8.526344/kurz":           "https://8.8.8.8/kurz",
		"https://hooks.example.com/kurz":  "https://hooks.example.com/kurz",
	} {
		if got, err := strict.Check(raw); err != nil || got != want {
			t.Errorf("Check(%q) = %q, %v; want %q", raw, got, err, want)
		}
	}
	lenient := Targets{AllowHTTP: true, Allow: []netip.Prefix{netip.MustParsePrefix("127.0.0.0/8")}}
	if got, err := lenient.Check("http://127.1:9/x"); err != nil || got != "http://127.0.0.1:9/x" {
		t.Errorf("allow-listed http://127.1:9/x: %q, %v; want http://127.0.0.1:9/x", got, err)
	}
}

// TestClientRefusesAtDialTime is the DNS rebinding guard: whatever a name
// resolved to when subscribed, the address dialled is checked.
func TestClientRefusesAtDialTime(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {}))
	defer srv.Close()
	byName := strings.Replace(srv.URL, "127.0.0.1", "localhost", 1)

	_, err := Targets{}.Client(time.Second).Post(byName, "application/json", nil)
	if !dialRefused(err) {
		t.Fatalf("POST %s without an allow-list: %v, want a refused dial", byName, err)
	}
	allowed := Targets{Allow: []netip.Prefix{netip.MustParsePrefix("127.0.0.1/32"), netip.MustParsePrefix("::1/128")}}
	resp, err := allowed.Client(time.Second).Post(byName, "application/json", nil)
	if err != nil {
		t.Fatalf("allow-listed: %v", err)
	}
	resp.Body.Close()
}

func TestClientDoesNotFollowRedirects(t *testing.T) {
	hits := 0
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		hits++
		http.Redirect(w, r, "/elsewhere", http.StatusFound)
	}))
	defer srv.Close()
	c := Targets{Allow: []netip.Prefix{netip.MustParsePrefix("127.0.0.1/32")}}.Client(time.Second)
	resp, err := c.Post(srv.URL, "application/json", nil)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusFound || hits != 1 {
		t.Fatalf("status %d after %d requests, want the 302 itself after 1", resp.StatusCode, hits)
	}
}

func TestBackoffDoublesWithJitterWithinBounds(t *testing.T) {
	s := &Sender{cfg: Config{BackoffBase: 10 * time.Second, BackoffMax: time.Minute}}
	for n, want := range map[int]time.Duration{1: 10 * time.Second, 2: 20 * time.Second, 3: 40 * time.Second, 4: time.Minute, 9: time.Minute} {
		for range 50 {
			if d := s.backoff(n); d < want/2 || d > want {
				t.Fatalf("backoff(%d) = %s, want %s to %s", n, d, want/2, want)
			}
		}
	}
}

func TestSealerOpensOnlyItsOwnSecrets(t *testing.T) {
	a, _ := NewSealer(strings.Repeat("a", 32), "")
	b, _ := NewSealer(strings.Repeat("b", 32), "")
	secret := newSecret()
	if len(secret) != len(secretPrefix)+43 {
		t.Fatalf("secret %q", secret)
	}
	sealed := a.Seal("wh_1", secret)
	if strings.Contains(string(sealed), secret[len(secretPrefix):]) {
		t.Fatal("the sealed secret contains the secret")
	}
	if got, err := a.Open("wh_1", sealed); err != nil || got != secret {
		t.Fatalf("Open = %q, %v", got, err)
	}
	if _, err := b.Open("wh_1", sealed); err == nil {
		t.Error("another key opened it")
	}
	if _, err := a.Open("wh_2", sealed); err == nil {
		t.Error("it opened as another subscription's secret")
	}
}

// During a rotation the new key's sealer opens what the old key sealed
// (and says so, for the pass that seals it again), and seals under the new
// key only.
func TestSealerOpensThePreviousKeysSecretsDuringARotation(t *testing.T) {
	oldKey, newKey := strings.Repeat("o", 32), strings.Repeat("n", 32)
	old, _ := NewSealer(oldKey, "")
	after, _ := NewSealer(newKey, "")
	rotating, err := NewSealer(newKey, oldKey)
	if err != nil {
		t.Fatal(err)
	}
	if !rotating.Rotating() || after.Rotating() {
		t.Fatalf("Rotating: %v with a previous key, %v without", rotating.Rotating(), after.Rotating())
	}
	secret := newSecret()
	sealed := old.Seal("wh_1", secret)
	if _, err := after.Open("wh_1", sealed); err == nil {
		t.Fatal("a new key without the previous one opened an old secret")
	}
	got, wasOld, err := rotating.open("wh_1", sealed)
	if err != nil || got != secret || !wasOld {
		t.Fatalf("open of an old secret = %q, old %v, %v; want it, old", got, wasOld, err)
	}
	if _, err := rotating.Open("wh_2", sealed); err == nil {
		t.Error("the previous key opened it as another subscription's secret")
	}
	resealed := rotating.Seal("wh_1", secret)
	if got, err := after.Open("wh_1", resealed); err != nil || got != secret {
		t.Errorf("the new key alone opens a secret sealed during the rotation: %q, %v", got, err)
	}
	if _, err := old.Open("wh_1", resealed); err == nil {
		t.Error("a secret sealed during the rotation opened under the old key")
	}
	if _, wasOld, _ := rotating.open("wh_1", resealed); wasOld {
		t.Error("a secret under the new key read as the previous key's")
	}
}

func TestPageTokensRoundTripAndRefuseGarbage(t *testing.T) {
	c := cursor{Created: time.Unix(1733300000, 123).UTC(), ID: "evt_x"}
	got, err := decodeToken(encodeToken(c))
	if err != nil || !got.Created.Equal(c.Created) || got.ID != c.ID {
		t.Fatalf("round trip: %v %v", got, err)
	}
	bads := []string{"!!", "e30", strings.Repeat("A", 300)}
	for _, id := range []string{"evt\u0000x", "evt x", "evt_\u00e9"} {
		bads = append(bads, base64.RawURLEncoding.EncodeToString([]byte(`{"Created":"2024-12-04T08:13:20Z","ID":"`+id+`"}`)))
	}
	for _, bad := range bads {
		if _, err := decodeToken(bad); err == nil {
			t.Errorf("decodeToken(%q) accepted", bad)
		}
	}
}

// IDs are checked before any query: an ID no subscription or delivery can
// have (PostgreSQL refuses a NUL with an error of its own) is the
// caller's error.
func TestCheckIDRefusesWhatNoIDHolds(t *testing.T) {
	for _, id := range []string{"wh_abc234", "evt_0f3a", "A-b_9"} {
		if err := checkID("id", id); err != nil {
			t.Errorf("checkID(%q): %v", id, err)
		}
	}
	for _, id := range []string{"", "wh_\x00", "wh_\xff", "wh abc", "wh_é", "wh_/x", strings.Repeat("a", maxIDLength+1)} {
		err := checkID("id", id)
		if st, ok := status.FromError(err); !ok || st.Code() != codes.InvalidArgument {
			t.Errorf("checkID(%q): %v, want INVALID_ARGUMENT", id, err)
		}
	}
}

func TestScrubKeepsAPrintableBoundedStart(t *testing.T) {
	got := scrub("line1\nline2\x00" + strings.Repeat("x", 500))
	if strings.ContainsAny(got, "\n\x00") || len([]rune(got)) > maxErrorText+1 {
		t.Fatalf("scrub = %q", got)
	}
}

// An event's data shows a link as the API does: the link key queued by the
// trigger or the click batcher ("<domain>/<code>" on a custom domain) is
// split into the bare code and the domain, and the short URL is on the
// link's domain; a default-domain link has no domain field.
func TestBodySplitsTheLinkKey(t *testing.T) {
	s := &Sender{baseURL: "https://kurz.example/"}
	for _, tc := range []struct{ data, want string }{
		{`{"code":"1000ita","clicks":2}`, `{"clicks":2,"code":"1000ita","short_url":"https://kurz.example/1000ita"}`},
		{`{"code":"go.acme.com/launch","clicks":2}`, `{"clicks":2,"code":"launch","domain":"go.acme.com","short_url":"https://go.acme.com/launch"}`},
	} {
		b, err := s.body(claim{Delivery: Delivery{ID: "evt_1", EventType: "link.clicked", Tenant: "acme", Data: []byte(tc.data)}})
		if err != nil {
			t.Fatal(err)
		}
		if !strings.Contains(string(b), `"data":`+tc.want+`}`) {
			t.Errorf("body of %s = %s, want data %s", tc.data, b, tc.want)
		}
	}
}

// A receiver of one label subscribed before Check refused them is not
// dialled either (the resolver's search domains would complete it).
func TestClientRefusesANameOfOneLabel(t *testing.T) {
	_, err := Targets{}.Client(time.Second).Post("https://intranet-zz/kurz", "application/json", nil)
	if err == nil || !dialRefused(err) {
		t.Errorf("POST to a one-label name: %v, want a refused dial", err)
	}
}
