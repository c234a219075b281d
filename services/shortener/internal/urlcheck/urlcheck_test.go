package urlcheck

import (
	"bytes"
	"context"
	"errors"
	"log/slog"
	"net/netip"
	"net/url"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"
	"unicode"
	"unicode/utf8"

	"kurz.dev/pkg/testkit/servertest"
	"kurz.dev/pkg/urlnorm"
)

var policy = Policy{MaxLength: 2048, OwnHosts: []string{"kurz.example", "127.0.0.1"}}

func TestNormalize(t *testing.T) {
	long := "https://example.com/" + strings.Repeat("a", 2048)
	tests := map[string]struct {
		in, want, reason string
	}{
		"plain https":          {in: "https://example.com/a/very/long/path?utm=1", want: "https://example.com/a/very/long/path?utm=1"},
		"http":                 {in: "http://example.com", want: "http://example.com"},
		"scheme and host case": {in: "HTTPS://ExAmple.COM/Path", want: "https://example.com/Path"},
		"default port dropped": {in: "https://example.com:443/x", want: "https://example.com/x"},
		"other port kept":      {in: "http://example.com:8080/x", want: "http://example.com:8080/x"},
		"trailing dot":         {in: "https://example.com./", want: "https://example.com/"},
		"idn to punycode":      {in: "https://bücher.de/ä", want: "https://xn--bcher-kva.de/%C3%A4"},
		"full-width host":      {in: "https://ｅｘａｍｐｌｅ．com/", want: "https://example.com/"},
		"fragment and query":   {in: "https://example.com/p?q=1#frag", want: "https://example.com/p?q=1#frag"},
		"spaces trimmed":       {in: "  https://example.com/x \n", want: "https://example.com/x"},
		"public ipv4":          {in: "http://93.184.216.34/", want: "http://93.184.216.34/"},
		"public ipv6":          {in: "http://[2606:4700::1111]:8080/", want: "http://[2606:4700::1111]:8080/"},
		"youtube cdn hyphens":  {in: "https://r4---sn-abc.googlevideo.com/v", want: "https://r4---sn-abc.googlevideo.com/v"},
		"query encoded":        {in: "https://example.com/?q=a b&r=ä&s=\"<>'%20&t=\u00a0x\u202e", want: "https://example.com/?q=a%20b&r=%C3%A4&s=%22%3C%3E'%20&t=%C2%A0x%E2%80%AE"},
		"query as redirected":  {in: "https://example.com/?z=ä&a=%c3%a4&a=1+2&=&;x=日本", want: "https://example.com/?z=%C3%A4&a=%c3%a4&a=1+2&=&;x=%E6%97%A5%E6%9C%AC"},

		"javascript":         {in: "javascript:alert(1)", reason: ReasonScheme},
		"javascript case":    {in: "JaVaScRiPt:alert(1)", reason: ReasonScheme},
		"data":               {in: "data:text/html,<script>alert(1)</script>", reason: ReasonScheme},
		"file":               {in: "file:///etc/passwd", reason: ReasonScheme},
		"vbscript":           {in: "vbscript:msgbox(1)", reason: ReasonScheme},
		"ftp":                {in: "ftp://example.com/f", reason: ReasonScheme},
		"scheme-less":        {in: "example.com/path", reason: ReasonScheme},
		"protocol-relative":  {in: "//example.com/path", reason: ReasonScheme},
		"empty":              {in: "   ", reason: ReasonRequired},
		"too long":           {in: long, reason: ReasonTooLong},
		"no host":            {in: "https:///path", reason: ReasonHostRequired},
		"opaque":             {in: "https:example.com", reason: ReasonHostRequired},
		"userinfo phishing":  {in: "https://bank.com@evil.example/login", reason: ReasonUserInfo},
		"user and password":  {in: "https://u:p@example.com/", reason: ReasonUserInfo},
		"backslash trick":    {in: "https://evil.example\\@bank.com/", reason: ReasonMalformed},
		"control char":       {in: "https://exa\x00mple.com/", reason: ReasonMalformed},
		"bad port":           {in: "https://example.com:99999/", reason: ReasonMalformed},
		"loopback":           {in: "http://127.0.0.1/admin", reason: ReasonPrivateHost},
		"loopback short":     {in: "http://127.1/", reason: ReasonPrivateHost},
		"loopback decimal":   {in: "http://2130706433/", reason: ReasonPrivateHost},
		"loopback hex":       {in: "http://0x7f.0.0.1/", reason: ReasonPrivateHost},
		"private 10/8":       {in: "http://10.1.2.3/", reason: ReasonPrivateHost},
		"private 192.168":    {in: "https://192.168.0.1:8443/", reason: ReasonPrivateHost},
		"link-local meta":    {in: "http://169.254.169.254/latest/meta-data/", reason: ReasonPrivateHost},
		"cgnat":              {in: "http://100.64.0.1/", reason: ReasonPrivateHost},
		"unspecified":        {in: "http://0.0.0.0/", reason: ReasonPrivateHost},
		"ipv6 loopback":      {in: "http://[::1]/", reason: ReasonPrivateHost},
		"ipv6 mapped v4":     {in: "http://[::ffff:127.0.0.1]/", reason: ReasonPrivateHost},
		"ipv6 ula":           {in: "http://[fd00::1]/", reason: ReasonPrivateHost},
		"ipv6 link-local":    {in: "http://[fe80::1]/", reason: ReasonPrivateHost},
		"nat64 private":      {in: "http://[64:ff9b::a00:1]/", reason: ReasonPrivateHost},
		"6to4 loopback":      {in: "http://[2002:7f00:1::1]/", reason: ReasonPrivateHost},
		"6to4 metadata":      {in: "http://[2002:a9fe:a9fe::1]/", reason: ReasonPrivateHost},
		"teredo":             {in: "http://[2001:0:4136:e378:8000:63bf:3fff:fdd2]/", reason: ReasonPrivateHost},
		"site-local":         {in: "http://[fec0::1]/", reason: ReasonPrivateHost},
		"siit v4":            {in: "http://[::ffff:0:7f00:1]/", reason: ReasonPrivateHost},
		"localhost":          {in: "http://localhost:8080/", reason: ReasonPrivateHost},
		"sub.localhost":      {in: "http://app.localhost/", reason: ReasonPrivateHost},
		"dot internal":       {in: "http://db.internal/", reason: ReasonPrivateHost},
		"single label":       {in: "http://intranet/", reason: ReasonHostInvalid},
		"bad ipv4":           {in: "http://1.2.3.256/", reason: ReasonHostInvalid},
		"octal junk":         {in: "http://1.2.3.08/", reason: ReasonHostInvalid},
		"underscore host":    {in: "http://a_b.example.com/", reason: ReasonHostInvalid},
		"leading hyphen":     {in: "http://-a.example.com/", reason: ReasonHostInvalid},
		"empty label":        {in: "http://a..example.com/", reason: ReasonHostInvalid},
		"invalid idn":        {in: "http://xn--a.example/", reason: ReasonHostInvalid},
		"own domain":         {in: "https://kurz.example/10000g8", reason: ReasonLoop},
		"own domain upper":   {in: "https://KURZ.example:8443/x", reason: ReasonLoop},
		"ipv6 zone":          {in: "http://[fe80::1%25eth0]/", reason: ReasonHostInvalid},
		"ipv4 five parts":    {in: "http://1.2.3.4.5/", reason: ReasonHostInvalid},
		"label too long":     {in: "http://" + strings.Repeat("a", 64) + ".com/", reason: ReasonHostInvalid},
		"mailto":             {in: "mailto:a@example.com", reason: ReasonScheme},
		"javascript encoded": {in: "java%0ascript:alert(1)", reason: ReasonMalformed},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			got, err := policy.Normalize(tc.in)
			if tc.reason == "" {
				if err != nil || got != tc.want {
					t.Fatalf("Normalize(%q) = %q, %v; want %q", tc.in, got, err, tc.want)
				}
				return
			}
			var ue *Error
			if !errors.As(err, &ue) || ue.Reason != tc.reason {
				t.Fatalf("Normalize(%q) = %q, %v; want refusal %s", tc.in, got, err, tc.reason)
			}
			if strings.Contains(ue.Message, tc.in) && tc.in != "" {
				t.Errorf("message %q echoes the URL", ue.Message)
			}
		})
	}
}

func TestAllowPrivateHosts(t *testing.T) {
	p := Policy{MaxLength: 2048, AllowPrivateHosts: true, OwnHosts: []string{"127.0.0.1"}}
	if got, err := p.Normalize("http://localhost:3000/x"); err != nil || got != "http://localhost:3000/x" {
		t.Errorf("localhost with AllowPrivateHosts: %q, %v", got, err)
	}
	var ue *Error
	if _, err := p.Normalize("http://127.0.0.1:8787/10000g8"); !errors.As(err, &ue) || ue.Reason != ReasonLoop {
		t.Errorf("own IP with AllowPrivateHosts: got %v, want %s", err, ReasonLoop)
	}
}

func TestOwnHost(t *testing.T) {
	for in, want := range map[string]string{
		"http://127.0.0.1:8787": "127.0.0.1",
		"https://KURZ.Example/": "kurz.example",
		"kurz.example:8443":     "kurz.example",
		"bücher.de":             "xn--bcher-kva.de",
	} {
		if got, err := OwnHost(in); err != nil || got != want {
			t.Errorf("OwnHost(%q) = %q, %v; want %q", in, got, err, want)
		}
	}
}

// FuzzValidateURL checks the validator's invariants on arbitrary input: it
// never panics; a refusal is an *Error with one of the documented reasons;
// whatever it accepts was written as http:// or https://, holds no white
// space, control or format character, backslash, quote or angle bracket (so
// no client reads it differently), is ASCII (as the redirect sends it),
// fits the length bound, has no user info, a public host in its normal form
// (the form OwnHost and the blocklist compare), not the short domain, a
// canonical non-default port, and is a fixed point of Normalize. A policy
// that allows private hosts accepts everything the strict one does,
// unchanged. Its seed corpus is in testdata/fuzz/FuzzValidateURL; `go test`
// runs the seeds, `go test -fuzz=FuzzValidateURL` explores.
func FuzzValidateURL(f *testing.F) {
	for _, s := range []string{
		"https://example.com/a?b=c#d", "javascript:alert(1)", "http://127.1/", "https://bücher.de/",
		"https://bank.com@evil.example", "http://[::ffff:10.0.0.1]/", "HTTP://EXAMPLE.COM:80",
		"https://example.com/?q=a b", "https://example.com/?q=\"><script>", "https://example.com/?q=ä#ö",
		"https://example.com/?\u2028=\u00a0", "http://[2606:4700::1111]:0443/", "https://xn--bcher-kva.de./",
		" data:text/html,x", "https://kurz.example:443/x", "http://0x5d.0xb8.0xd8.0x22/",
	} {
		f.Add(s)
	}
	reasons := map[string]bool{
		ReasonRequired: true, ReasonTooLong: true, ReasonMalformed: true, ReasonScheme: true,
		ReasonHostRequired: true, ReasonHostInvalid: true, ReasonUserInfo: true, ReasonPrivateHost: true,
		ReasonLoop: true, ReasonBlocked: true,
	}
	p := Policy{MaxLength: 256, OwnHosts: []string{"kurz.example"}}
	lax := Policy{MaxLength: 256, AllowPrivateHosts: true, OwnHosts: []string{"kurz.example"}}
	f.Fuzz(func(t *testing.T, raw string) {
		got, err := p.Normalize(raw)
		if err != nil {
			var ue *Error
			if !errors.As(err, &ue) || !reasons[ue.Reason] || ue.Message == "" {
				t.Fatalf("Normalize(%q): error %v is not a *Error with a documented reason", raw, err)
			}
			if laxGot, err := lax.Normalize(raw); err == nil && ue.Reason != ReasonPrivateHost && ue.Reason != ReasonHostInvalid {
				t.Fatalf("Normalize(%q) refused (%s) by the strict policy only, as %q", raw, ue.Reason, laxGot)
			}
			return
		}
		if scheme, _, _ := strings.Cut(strings.ToLower(strings.TrimSpace(raw)), "//"); scheme != "http:" && scheme != "https:" {
			t.Fatalf("Normalize(%q) = %q: accepted though not written as http:// or https://", raw, got)
		}
		if len(got) > p.MaxLength {
			t.Fatalf("Normalize(%q) = %q: longer than %d", raw, got, p.MaxLength)
		}
		for i, r := range got {
			if r <= ' ' || r == 0x7f || strings.ContainsRune("\\\"<>", r) || unicode.IsSpace(r) || unicode.IsControl(r) || unicode.Is(unicode.Cf, r) {
				t.Fatalf("Normalize(%q) = %q: %q at %d is white space, a control character or unsafe in a URL", raw, got, r, i)
			}
		}
		if nonASCII := func(r rune) bool { return r >= utf8.RuneSelf }; strings.ContainsFunc(got, nonASCII) {
			t.Fatalf("Normalize(%q) = %q: non-ASCII, which the redirect would send escaped", raw, got)
		}
		u, perr := url.Parse(got)
		if perr != nil {
			t.Fatalf("Normalize(%q) = %q does not parse: %v", raw, got, perr)
		}
		if u.Scheme != "http" && u.Scheme != "https" || u.Opaque != "" || u.User != nil {
			t.Fatalf("Normalize(%q) = %q: scheme %q, opaque %q, user info %v", raw, got, u.Scheme, u.Opaque, u.User)
		}
		host := u.Hostname()
		if a, err := netip.ParseAddr(host); err == nil {
			if a.String() != host || a.Is4In6() || a.Zone() != "" || !publicIP(a) {
				t.Fatalf("Normalize(%q) = %q: IP host %q is not a public address in canonical form", raw, got, host)
			}
		} else if again, err := urlnorm.Host(host); err != nil || again != host || localName(host) || !strings.Contains(host, ".") {
			t.Fatalf("Normalize(%q) = %q: host %q is not a public name in normal form (urlnorm.Host: %q, %v)", raw, got, host, again, err)
		}
		if own, err := OwnHost(got); err != nil || own != host {
			t.Fatalf("Normalize(%q) = %q: OwnHost reads host %q, %v; want %q", raw, got, own, err, host)
		}
		if host == "kurz.example" {
			t.Fatalf("Normalize(%q) = %q: links to the short domain", raw, got)
		}
		if port := u.Port(); port != "" {
			n, err := strconv.Atoi(port)
			if err != nil || strconv.Itoa(n) != port || n < 1 || n > 65535 ||
				u.Scheme == "http" && n == 80 || u.Scheme == "https" && n == 443 {
				t.Fatalf("Normalize(%q) = %q: port %q is not canonical", raw, got, port)
			}
		}
		again, err := p.Normalize(got)
		if err != nil || again != got {
			t.Fatalf("Normalize is not idempotent: %q -> %q -> %q, %v", raw, got, again, err)
		}
		if laxGot, err := lax.Normalize(raw); err != nil || laxGot != got {
			t.Fatalf("AllowPrivateHosts changes an accepted URL: %q -> %q, but %q, %v", raw, got, laxGot, err)
		}
	})
}

// A line too long for a bufio.Scanner (64 KiB) is ignored on its own: the
// entries after it still count.
func TestBlocklistSurvivesALongLine(t *testing.T) {
	path := filepath.Join(t.TempDir(), "blocklist.txt")
	data := "first.example\n" + strings.Repeat("x", 100_000) + "\nafter.example\n"
	if err := os.WriteFile(path, []byte(data), 0o600); err != nil {
		t.Fatal(err)
	}
	bl, err := NewBlocklist(path, time.Hour, servertest.Logger(t))
	if err != nil {
		t.Fatal(err)
	}
	for _, raw := range []string{"https://first.example/", "https://after.example/"} {
		u, _ := url.Parse(raw)
		if v, err := bl.Scan(context.Background(), u); err != nil || !v.Blocked {
			t.Errorf("%s: blocked=%v (%v), want blocked", raw, v.Blocked, err)
		}
	}
	if bl.Len() != 2 {
		t.Errorf("%d entries, want 2", bl.Len())
	}
}

func TestBlocklistReloadsOnChange(t *testing.T) {
	path := filepath.Join(t.TempDir(), "blocklist.txt")
	if err := os.WriteFile(path, []byte("# phishing\nevil.example\n*.malware.test  # whole zone\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	bl, err := NewBlocklist(path, 10*time.Millisecond, servertest.Logger(t))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		bl.Run(ctx, func(context.Context) {})
	}()
	// Run logs into the test log: it must be gone before the test ends.
	defer func() {
		cancel()
		<-done
	}()

	blocked := func(raw string) bool {
		u, _ := url.Parse(raw)
		v, err := bl.Scan(ctx, u)
		if err != nil {
			t.Fatal(err)
		}
		return v.Blocked
	}
	for raw, want := range map[string]bool{
		"https://evil.example/x":         true,
		"https://login.evil.example/":    true,
		"https://cdn.malware.test/":      true,
		"https://notevil.example/":       false,
		"https://example.com/":           false,
		"https://evil.example.com/":      false,
		"https://later-blocked.example/": false,
	} {
		if got := blocked(raw); got != want {
			t.Errorf("blocked(%s) = %v, want %v", raw, got, want)
		}
	}

	if err := os.WriteFile(path, []byte("evil.example\nlater-blocked.example\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(5 * time.Second)
	for !blocked("https://later-blocked.example/") {
		if time.Now().After(deadline) {
			t.Fatal("blocklist change not picked up within 5s")
		}
		time.Sleep(5 * time.Millisecond) // poll interval of the awaited condition
	}
	if blocked("https://cdn.malware.test/") {
		t.Error("entry removed from the file is still blocked")
	}

	if err := os.Remove(path); err != nil {
		t.Fatal(err)
	}
	if !blocked("https://evil.example/") {
		t.Error("a vanished file must keep the last good list")
	}
}

func TestParseHostIPv4(t *testing.T) {
	for host, want := range map[string]struct {
		addr        string
		numeric, ok bool
	}{
		"example.com":  {},
		"127.0.0.1":    {"127.0.0.1", true, true},
		"127.1":        {"127.0.0.1", true, true},
		"0X7F.1.":      {"127.0.0.1", true, true},
		"2130706433":   {"127.0.0.1", true, true},
		"017700000001": {"127.0.0.1", true, true},
		"0":            {"0.0.0.0", true, true},
		"8.526344":     {"8.8.8.8", true, true},
		"1.2.3.4.5":    {"", true, false},
		"256.1":        {"", true, false},
		"example.0x":   {"", true, false},
	} {
		a, numeric, ok := ParseHostIPv4(host)
		if numeric != want.numeric || ok != want.ok || ok && a.String() != want.addr {
			t.Errorf("ParseHostIPv4(%q) = %v, %v, %v; want %s, %v, %v", host, a, numeric, ok, want.addr, want.numeric, want.ok)
		}
	}
}

// A line that holds more than a host (a URL as abuse feeds publish them, a
// path, a port) is ignored and logged with its line number: read as its
// host it would block, and the sweep would disable, every link to the whole
// host. The lines around it still count.
func TestBlocklistIgnoresLinesThatHoldMoreThanAHost(t *testing.T) {
	path := filepath.Join(t.TempDir(), "blocklist.txt")
	data := "evil.example\n" +
		"https://sites.google.com/view/phish-page\n" +
		"docs.example/phish\n" +
		"shop.example:8443\n" +
		"93.184.216.34:443\n" +
		"user@mail.example\n" +
		"after.example\n"
	if err := os.WriteFile(path, []byte(data), 0o600); err != nil {
		t.Fatal(err)
	}
	var logs bytes.Buffer
	bl, err := NewBlocklist(path, time.Hour, slog.New(slog.NewTextHandler(&logs, nil)))
	if err != nil {
		t.Fatal(err)
	}
	for raw, want := range map[string]bool{
		"https://evil.example/":                  true,
		"https://after.example/":                 true,
		"https://sites.google.com/view/innocent": false,
		"https://docs.example/other":             false,
		"https://shop.example/":                  false,
		"https://93.184.216.34/":                 false,
		"https://mail.example/":                  false,
	} {
		u, _ := url.Parse(raw)
		if v, err := bl.Scan(context.Background(), u); err != nil || v.Blocked != want {
			t.Errorf("%s: blocked=%v %s (%v), want blocked=%v", raw, v.Blocked, v.Why, err, want)
		}
	}
	if bl.Len() != 2 {
		t.Errorf("%d entries, want 2", bl.Len())
	}
	for line := 2; line <= 6; line++ {
		if !strings.Contains(logs.String(), "line="+strconv.Itoa(line)+" ") {
			t.Errorf("no warning names line %d; log:\n%s", line, logs.String())
		}
	}
}

// A listed IPv4 address is blocked in every IPv6 form that reaches it
// (IPv4-mapped, NAT64, 6to4), and an IPv6 entry may be written in brackets,
// as in a URL.
func TestBlocklistBlocksAnIPv4AddressInItsIPv6FormsAndBracketedIPv6(t *testing.T) {
	path := filepath.Join(t.TempDir(), "blocklist.txt")
	data := "45.33.32.156\n[2606:4700::1111]\n2001:4860:4860::8888\n[2606:4700::1111]:443\n"
	if err := os.WriteFile(path, []byte(data), 0o600); err != nil {
		t.Fatal(err)
	}
	bl, err := NewBlocklist(path, time.Hour, servertest.Logger(t))
	if err != nil {
		t.Fatal(err)
	}
	for raw, want := range map[string]bool{
		"https://45.33.32.156/":                   true,
		"https://[::ffff:45.33.32.156]/":          true,
		"https://[64:ff9b::2d21:209c]/":           true,
		"https://[2002:2d21:209c::]/":             true,
		"https://[2002:2d21:209c:1::7]/x":         true,
		"https://[2606:4700::1111]/":              true,
		"https://[2606:4700:0:0:0:0:0:1111]:8443": true,
		"https://[2001:4860:4860::8888]/":         true,
		"https://45.33.32.157/":                   false,
		"https://[64:ff9b::2d21:209d]/":           false,
		"https://[2002:2d21:209d::]/":             false,
		"https://[2606:4700::1112]/":              false,
	} {
		u, _ := url.Parse(raw)
		if v, err := bl.Scan(context.Background(), u); err != nil || v.Blocked != want {
			t.Errorf("%s: blocked=%v %s (%v), want blocked=%v", raw, v.Blocked, v.Why, err, want)
		}
	}
	if bl.Len() != 3 {
		t.Errorf("%d entries, want 3 (the bracketed address with a port ignored)", bl.Len())
	}
}

// A query written with non-ASCII characters is stored as the redirect sends
// it, percent-encoded: written either way, it is one destination (one
// CODE_MODE_FROM_URL link, one import match), and the rest of the query
// stays as written.
func TestNormalizeStoresANonASCIIQueryAsTheRedirectSendsIt(t *testing.T) {
	written, err := policy.Normalize("https://example.com/s?q=ä&lang=de")
	if err != nil {
		t.Fatal(err)
	}
	escaped, err := policy.Normalize("https://example.com/s?q=%C3%A4&lang=de")
	if err != nil {
		t.Fatal(err)
	}
	if written != escaped {
		t.Errorf("?q=ä is stored as %q, ?q=%%C3%%A4 as %q: one destination, two forms", written, escaped)
	}
	if want := "https://example.com/s?q=%C3%A4&lang=de"; written != want {
		t.Errorf("stored %q, want %q", written, want)
	}
}
