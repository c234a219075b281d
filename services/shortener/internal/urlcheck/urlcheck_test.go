package urlcheck

import (
	"context"
	"errors"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"kurz.dev/pkg/server/servertest"
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
// never panics; whatever it accepts is http(s) with a public host and no user
// info, fits the length bound, and is a fixed point of Normalize. Its seed
// corpus is in testdata/fuzz/FuzzValidateURL; `go test` runs the seeds,
// `go test -fuzz=FuzzValidateURL` explores.
func FuzzValidateURL(f *testing.F) {
	for _, s := range []string{
		"https://example.com/a?b=c#d", "javascript:alert(1)", "http://127.1/", "https://bücher.de/",
		"https://bank.com@evil.example", "http://[::ffff:10.0.0.1]/", "HTTP://EXAMPLE.COM:80",
	} {
		f.Add(s)
	}
	p := Policy{MaxLength: 256, OwnHosts: []string{"kurz.example"}}
	f.Fuzz(func(t *testing.T, raw string) {
		got, err := p.Normalize(raw)
		if err != nil {
			var ue *Error
			if !errors.As(err, &ue) || ue.Reason == "" || ue.Message == "" {
				t.Fatalf("Normalize(%q): error %v is not a *Error with a reason", raw, err)
			}
			return
		}
		if len(got) > p.MaxLength {
			t.Fatalf("Normalize(%q) = %q: longer than %d", raw, got, p.MaxLength)
		}
		u, perr := url.Parse(got)
		if perr != nil {
			t.Fatalf("Normalize(%q) = %q does not parse: %v", raw, got, perr)
		}
		if u.Scheme != "http" && u.Scheme != "https" {
			t.Fatalf("Normalize(%q) = %q: scheme %q", raw, got, u.Scheme)
		}
		if u.User != nil || u.Hostname() == "" || u.Hostname() == "kurz.example" {
			t.Fatalf("Normalize(%q) = %q: user info, empty host or own host", raw, got)
		}
		if strings.ContainsAny(got, "\\\r\n\t ") {
			t.Fatalf("Normalize(%q) = %q: contains whitespace or a backslash", raw, got)
		}
		again, err := p.Normalize(got)
		if err != nil || again != got {
			t.Fatalf("Normalize is not idempotent: %q -> %q -> %q, %v", raw, got, again, err)
		}
	})
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
	defer cancel()
	go bl.Run(ctx)

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
