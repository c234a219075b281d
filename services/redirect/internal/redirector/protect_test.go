package redirector

import (
	"bytes"
	"crypto/sha256"
	"encoding/base64"
	"errors"
	"net/netip"
	"runtime"
	"strings"
	"testing"
	"time"
)

func TestFormTokens(t *testing.T) {
	f := formTokens{secret: []byte("0123456789abcdef0123456789abcdef")}
	other := formTokens{secret: []byte("another secret, another replica.")}
	now := time.Unix(1_800_000_000, 0)
	nonce, token := f.issue("abc1234", now)
	_, otherToken := f.issue("abc1234", now)
	_, forged := other.issue("abc1234", now)
	_, old := f.issue("abc1234", now.Add(-formTokenTTL))
	_, future := f.issue("abc1234", now.Add(2*clockSkew))
	parts := strings.Split(token, ".")
	tests := map[string]struct {
		code, cookie, token string
		want                error
	}{
		"valid":                       {"abc1234", nonce, token, nil},
		"no cookie":                   {"abc1234", "", token, errNoCookie},
		"no token":                    {"abc1234", nonce, "", errMalformed},
		"nonce of another form":       {"abc1234", nonce, otherToken, errNonceMismatch},
		"signed with another secret":  {"abc1234", strings.Split(forged, ".")[0], forged, errBadSignature},
		"token of another code":       {"xyz9876", nonce, token, errBadSignature},
		"issued-at moved":             {"abc1234", nonce, parts[0] + "." + "1800000100" + "." + parts[2], errBadSignature},
		"signature dropped":           {"abc1234", nonce, parts[0] + "." + parts[1] + ".", errBadSignature},
		"an hour old":                 {"abc1234", strings.Split(old, ".")[0], old, errExpired},
		"issued in the future":        {"abc1234", strings.Split(future, ".")[0], future, errExpired},
		"cookie nonce of other token": {"abc1234", strings.Split(otherToken, ".")[0], token, errNonceMismatch},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			if got := f.check(tc.code, tc.cookie, tc.token, now); !errors.Is(got, tc.want) {
				t.Errorf("check = %v, want %v", got, tc.want)
			}
		})
	}
	if err := f.check("abc1234", nonce, token, now.Add(formTokenTTL-time.Second)); err != nil {
		t.Errorf("a token 59m59s old: %v, want valid", err)
	}
}

// The page carries the style the CSP's hash allows, the code escaped, and
// the token; nothing else varies.
func TestFormTemplate(t *testing.T) {
	var b bytes.Buffer
	if err := formTemplate.Execute(&b, formPage{Style: formStyle, Code: `a"<b>`, Token: "n.1.m", Message: msgWrong}); err != nil {
		t.Fatal(err)
	}
	body := b.String()
	if !strings.Contains(body, "<style>"+formStyle+"</style>") {
		t.Errorf("the style is not verbatim in the page:\n%s", body)
	}
	sum := sha256.Sum256([]byte(formStyle))
	if !strings.Contains(formCSP, "'sha256-"+base64.StdEncoding.EncodeToString(sum[:])+"'") {
		t.Errorf("CSP %q does not allow the page's style", formCSP)
	}
	if strings.Contains(body, `a"<b>`) || !strings.Contains(body, "a&#34;&lt;b&gt;") {
		t.Errorf("the code is not escaped:\n%s", body)
	}
	if !strings.Contains(body, `name="token" value="n.1.m"`) || !strings.Contains(body, msgWrong) {
		t.Errorf("token or message missing:\n%s", body)
	}
}

func TestDecideVisit(t *testing.T) {
	redisDown := errors.New("redis incr: i/o timeout")
	tests := map[string]struct {
		n    int64
		err  error
		max  int64
		want verdict
	}{
		"first visit":        {1, nil, 50, visitGranted},
		"last visit":         {50, nil, 50, visitGranted},
		"one past the limit": {51, nil, 50, visitExhausted},
		"far past the limit": {5000, nil, 50, visitExhausted},
		"redis failed":       {0, redisDown, 50, visitUncounted},
		"redis failed late":  {7, redisDown, 50, visitUncounted},
		"counter corrupted":  {0, nil, 50, visitExhausted},
	}
	for name, tc := range tests {
		if got := decideVisit(tc.n, tc.err, tc.max); got != tc.want {
			t.Errorf("%s: decideVisit(%d, %v, %d) = %v, want %v", name, tc.n, tc.err, tc.max, got, tc.want)
		}
	}
}

// A form carries whole parameters of its request's first maxFormQuery
// bytes into its action, escaped as a URL attribute: markup and quotes in
// a query never leave the attribute.
func TestFormActionCarriesTheQueryBoundedAndEscaped(t *testing.T) {
	fill := "f=" + strings.Repeat("a", maxFormQuery-len("f=")-len("&u=1"))
	for _, tc := range []struct{ query, want string }{
		{"", "/abc"},
		{"utm_source=news", "/abc?utm_source=news"},
		{fill + "&u=1", "/abc?" + fill + "&u=1"},
		{fill + "&u=12", "/abc?" + fill},
		{strings.Repeat("b", maxFormQuery+1), "/abc"},
	} {
		if got := formAction("abc", tc.query); got != tc.want {
			t.Errorf("formAction of a %d-byte query: %d bytes, want %d", len(tc.query), len(got), len(tc.want))
		}
	}
	var body bytes.Buffer
	if err := formTemplate.Execute(&body, formPage{Code: "abc", Action: formAction("abc", `x="><script>&y='`)}); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(body.String(), `action="/abc?x=%22%3e%3cscript%3e&amp;y=%27"`) {
		t.Errorf("form: %s", body.String())
	}
}

// The network of an address, the key of the per-network password rules,
// is its IPv4 /24 or IPv6 /48, an IPv4-mapped address counting as IPv4.
func TestNetKey(t *testing.T) {
	for _, tc := range []struct{ addr, want string }{
		{"203.0.113.7", "203.0.113.0/24"},
		{"203.0.113.255", "203.0.113.0/24"},
		{"::ffff:203.0.113.7", "203.0.113.0/24"},
		{"2001:db8:1:2:3:4:5:6", "2001:db8:1::/48"},
		{"2001:db8:1:ffff::1", "2001:db8:1::/48"},
		{"fe80::1%eth0", "fe80::/48"},
	} {
		if got := netKey(netip.MustParseAddr(tc.addr)); got != tc.want {
			t.Errorf("netKey(%s) = %q, want %q", tc.addr, got, tc.want)
		}
	}
	if got := netKey(netip.Addr{}); got != "" {
		t.Errorf("netKey of no address = %q, want \"\"", got)
	}
}

// By default a pod runs GOMAXPROCS Argon2 checks at once, at most 4:
// without a CPU limit GOMAXPROCS is the node's cores, and 19 MiB a check
// on a 32-core node is over any redirect's memory limit. A setting wins.
func TestPasswordChecksByDefaultAreBoundedWhateverTheCores(t *testing.T) {
	prev := runtime.GOMAXPROCS(32)
	t.Cleanup(func() { runtime.GOMAXPROCS(prev) })
	if got := passwordChecks(0); got != defaultPasswordChecks {
		t.Errorf("default on 32 cores: %d checks at once, want %d", got, defaultPasswordChecks)
	}
	runtime.GOMAXPROCS(1)
	if got := passwordChecks(0); got != 1 {
		t.Errorf("default on 1 core: %d checks at once, want 1", got)
	}
	if got := passwordChecks(12); got != 12 {
		t.Errorf("set to 12: %d checks at once, want 12", got)
	}
}
