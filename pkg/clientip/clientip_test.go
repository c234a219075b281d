package clientip

import (
	"net/http/httptest"
	"net/netip"
	"strings"
	"testing"
)

func mustNew(t *testing.T, trusted []string, header string) *Policy {
	t.Helper()
	p, err := New(trusted, header)
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// The client is the peer unless the peer is trusted; then the right-most
// X-Forwarded-For hop that is not trusted. A forged left part changes
// nothing; a malformed hop, or one past MaxHops, stops the walk at the last
// trusted address.
func TestClientWalksForwardedForFromTheRight(t *testing.T) {
	p := mustNew(t, []string{"10.0.0.0/8", "192.0.2.7", "2001:db8:ffff::/48"}, "")
	tooMany := strings.Repeat("10.0.0.1, ", MaxHops) + "10.0.0.2"
	justEnough := "198.51.100.1, " + strings.Repeat("10.0.0.1, ", MaxHops-2) + "10.0.0.2"
	for name, tc := range map[string]struct {
		peer string
		xff  []string
		want string
	}{
		"untrusted peer, XFF ignored":        {"203.0.113.9:5000", []string{"198.51.100.1"}, "203.0.113.9"},
		"trusted peer, one hop":              {"10.1.2.3:5000", []string{"198.51.100.1"}, "198.51.100.1"},
		"forged left part":                   {"10.1.2.3:5000", []string{"1.1.1.1, 198.51.100.1"}, "198.51.100.1"},
		"forged left garbage":                {"10.1.2.3:5000", []string{"<script>, 198.51.100.1"}, "198.51.100.1"},
		"chain over two lines":               {"10.1.2.3:5000", []string{"198.51.100.1, 192.0.2.7", "10.9.9.9"}, "198.51.100.1"},
		"forged line before the proxy's":     {"10.1.2.3:5000", []string{"1.1.1.1", "198.51.100.1"}, "198.51.100.1"},
		"trusted peer, no XFF":               {"10.1.2.3:5000", nil, "10.1.2.3"},
		"all hops trusted":                   {"10.1.2.3:5000", []string{"10.0.0.1, 10.0.0.2"}, "10.0.0.1"},
		"malformed hop":                      {"10.1.2.3:5000", []string{"198.51.100.1, garbage, 10.0.0.2"}, "10.0.0.2"},
		"malformed last hop":                 {"10.1.2.3:5000", []string{"198.51.100.1, unknown"}, "10.1.2.3"},
		"empty last entry":                   {"10.1.2.3:5000", []string{"198.51.100.1, "}, "10.1.2.3"},
		"empty line":                         {"10.1.2.3:5000", []string{""}, "10.1.2.3"},
		"hop with a port":                    {"10.1.2.3:5000", []string{"198.51.100.1:4444"}, "198.51.100.1"},
		"IPv6 hop with brackets and a port":  {"10.1.2.3:5000", []string{"[2001:db8::1]:4444"}, "2001:db8::1"},
		"IPv6 hop in brackets":               {"10.1.2.3:5000", []string{"[2001:db8::1]"}, "2001:db8::1"},
		"IPv6 hop with a zone":               {"10.1.2.3:5000", []string{"fe80::1%eth0"}, "fe80::1"},
		"IPv4 hop in brackets":               {"10.1.2.3:5000", []string{"[198.51.100.1]"}, "10.1.2.3"},
		"unclosed bracket":                   {"10.1.2.3:5000", []string{"[2001:db8::1"}, "10.1.2.3"},
		"IPv4-mapped peer":                   {"[::ffff:10.1.2.3]:5000", []string{"198.51.100.1"}, "198.51.100.1"},
		"trusted IPv6 peer":                  {"[2001:db8:ffff::1]:5000", []string{"2001:db8::5"}, "2001:db8::5"},
		"untrusted IPv6 peer, XFF ignored":   {"[2001:db8::9]:5000", []string{"198.51.100.1"}, "2001:db8::9"},
		"IPv4-mapped hop is the IPv4 twin":   {"10.1.2.3:5000", []string{"::ffff:198.51.100.1"}, "198.51.100.1"},
		"IPv4-mapped hop of a trusted proxy": {"10.1.2.3:5000", []string{"198.51.100.1, ::ffff:10.0.0.4"}, "198.51.100.1"},
		"overlong hop":                       {"10.1.2.3:5000", []string{strings.Repeat("1", 100)}, "10.1.2.3"},
		"MaxHops hops, client within":        {"10.1.2.3:5000", []string{justEnough}, "198.51.100.1"},
		"more than MaxHops hops":             {"10.1.2.3:5000", []string{"198.51.100.1, " + tooMany}, "10.0.0.1"},
		"peer without a port":                {"203.0.113.9", nil, "203.0.113.9"},
		"unreadable peer":                    {"pipe", []string{"198.51.100.1"}, "invalid IP"},
	} {
		t.Run(name, func(t *testing.T) {
			r := httptest.NewRequest("GET", "/", nil)
			r.RemoteAddr = tc.peer
			for _, v := range tc.xff {
				r.Header.Add("X-Forwarded-For", v)
			}
			if got := p.Client(r).String(); got != tc.want {
				t.Errorf("got %q, want %q", got, tc.want)
			}
		})
	}
}

// A single-value header is believed only from trusted peers, holds exactly
// one address, and replaces X-Forwarded-For; when it is missing or bad the
// trusted proxy itself is the client.
func TestClientSingleValueHeader(t *testing.T) {
	p := mustNew(t, []string{"10.0.0.0/8"}, "x-real-ip")
	for name, tc := range map[string]struct {
		peer   string
		values []string
		want   string
	}{
		"trusted peer":                 {"10.1.2.3:5000", []string{"198.51.100.1"}, "198.51.100.1"},
		"trusted peer, IPv6 with port": {"10.1.2.3:5000", []string{"[2001:db8::1]:80"}, "2001:db8::1"},
		"untrusted peer":               {"203.0.113.9:5000", []string{"198.51.100.1"}, "203.0.113.9"},
		"missing":                      {"10.1.2.3:5000", nil, "10.1.2.3"},
		"two lines":                    {"10.1.2.3:5000", []string{"198.51.100.1", "198.51.100.2"}, "10.1.2.3"},
		"a list":                       {"10.1.2.3:5000", []string{"198.51.100.1, 198.51.100.2"}, "10.1.2.3"},
		"garbage":                      {"10.1.2.3:5000", []string{"nobody"}, "10.1.2.3"},
	} {
		t.Run(name, func(t *testing.T) {
			r := httptest.NewRequest("GET", "/", nil)
			r.RemoteAddr = tc.peer
			r.Header.Set("X-Forwarded-For", "192.0.2.99") // ignored when a header is set
			for _, v := range tc.values {
				r.Header.Add("X-Real-IP", v)
			}
			if got := p.Client(r).String(); got != tc.want {
				t.Errorf("got %q, want %q", got, tc.want)
			}
		})
	}
}

func TestNew(t *testing.T) {
	for name, tc := range map[string]struct {
		trusted []string
		header  string
		ok      bool
	}{
		"nothing":                             {nil, "", true},
		"CIDRs and addresses with spaces":     {[]string{" 10.0.0.0/8", "::1 ", "192.0.2.7"}, "", true},
		"empty items":                         {[]string{"", " "}, "", true},
		"host name":                           {[]string{"10.0.0.0/8", "proxy.local"}, "", false},
		"header without proxies":              {nil, "X-Real-IP", false},
		"X-Forwarded-For without proxies":     {nil, "x-forwarded-for", false},
		"X-Forwarded-For is the default":      {[]string{"10.0.0.0/8"}, "X-Forwarded-For", true},
		"header with proxies":                 {[]string{"10.0.0.0/8"}, "CF-Connecting-IP", true},
		"IPv4-mapped prefix is its IPv4 twin": {[]string{"::ffff:10.0.0.0/104"}, "", true},
	} {
		t.Run(name, func(t *testing.T) {
			_, err := New(tc.trusted, tc.header)
			if (err == nil) != tc.ok {
				t.Errorf("New(%q, %q): err %v, want ok=%v", tc.trusted, tc.header, err, tc.ok)
			}
		})
	}
	p := mustNew(t, []string{"::ffff:10.0.0.0/104"}, "")
	if !p.Trusted(netip.MustParseAddr("10.1.2.3")) {
		t.Error("::ffff:10.0.0.0/104 does not trust 10.1.2.3")
	}
}

// X-Forwarded-Proto and the like are believed from trusted peers only.
func TestFromTrustedProxy(t *testing.T) {
	p := mustNew(t, []string{"10.0.0.0/8"}, "")
	for peer, want := range map[string]bool{"10.1.2.3:80": true, "[::ffff:10.1.2.3]:80": true, "203.0.113.9:80": false, "": false} {
		r := httptest.NewRequest("GET", "/", nil)
		r.RemoteAddr = peer
		if got := p.FromTrustedProxy(r); got != want {
			t.Errorf("peer %q: %v, want %v", peer, got, want)
		}
	}
}

// IPv6 clients are keyed by their prefix, IPv4 ones (mapped or not) by their
// address: two addresses of one /64 share a key, two /64s do not.
func TestKey(t *testing.T) {
	k64, k48, k128 := Keying{IPv6Prefix: 64}, Keying{IPv6Prefix: 48}, Keying{IPv6Prefix: 128}
	for _, tc := range []struct {
		k    Keying
		addr string
		want string
	}{
		{k64, "203.0.113.5", "203.0.113.5"},
		{k64, "::ffff:203.0.113.5", "203.0.113.5"},
		{k64, "2001:db8:1:2::1", "2001:db8:1:2::/64"},
		{k64, "2001:db8:1:2:ffff:ffff:ffff:ffff", "2001:db8:1:2::/64"},
		{k64, "2001:db8:1:3::1", "2001:db8:1:3::/64"},
		{k64, "fe80::1%eth0", "fe80::/64"},
		{k48, "2001:db8:1:2::1", "2001:db8:1::/48"},
		{k128, "2001:db8:1:2::1", "2001:db8:1:2::1"},
		{Keying{}, "2001:db8:1:2::1", "2001:db8:1:2::/64"},
	} {
		if got := tc.k.Key(netip.MustParseAddr(tc.addr)); got != tc.want {
			t.Errorf("/%d key of %s: %q, want %q", tc.k.IPv6Prefix, tc.addr, got, tc.want)
		}
	}
	if got := k64.Key(netip.Addr{}); got != "" {
		t.Errorf("key of the zero Addr: %q, want empty", got)
	}
	if got := k64.KeyString("not an address"); got != "" {
		t.Errorf("key of garbage: %q, want empty", got)
	}
	if got := k64.KeyString("2001:db8:1:2::7"); got != "2001:db8:1:2::/64" {
		t.Errorf("KeyString: %q", got)
	}
	for bits, ok := range map[int]bool{0: false, 47: false, 48: true, 64: true, 128: true, 129: false} {
		if err := (Keying{IPv6Prefix: bits}).Check(); (err == nil) != ok {
			t.Errorf("Check(/%d): %v, want ok=%v", bits, err, ok)
		}
	}
}

// FuzzClient: whatever the headers, the walk returns the peer or an address
// that appeared in them, and never panics.
func FuzzClient(f *testing.F) {
	f.Add("10.1.2.3:5000", "198.51.100.1, 10.0.0.1")
	f.Add("10.1.2.3:5000", "[2001:db8::1]:80,,")
	f.Add("[::1]:1", "::ffff:1.2.3.4")
	p, err := New([]string{"10.0.0.0/8", "::1"}, "")
	if err != nil {
		f.Fatal(err)
	}
	f.Fuzz(func(t *testing.T, peer, xff string) {
		r := httptest.NewRequest("GET", "/", nil)
		r.RemoteAddr = peer
		r.Header.Set("X-Forwarded-For", xff)
		got := p.Client(r)
		if got == Peer(r) {
			return
		}
		if !got.IsValid() || !p.FromTrustedProxy(r) {
			t.Fatalf("client %v from peer %q (untrusted or unreadable)", got, peer)
		}
	})
}

// KURZ_*_TRUSTED_PROXIES=0.0.0.0/0 was taken without a word: every client
// may then name its own address in X-Forwarded-For, and every per-address
// bound (anonymous creation, key guesses, walks, password guesses) is
// theirs to pick. Such a setting can be meant (proxies in front of every
// path, as ingress-nginx's default 0.0.0.0/0), so it is warned of, not
// refused: any range wider than the widest private one (10.0.0.0/8,
// fc00::/7).
func TestWarningNamesRangesWiderThanAPrivateOne(t *testing.T) {
	for _, tc := range []struct {
		trusted []string
		want    string // in the warning; "" for none
	}{
		{[]string{"10.0.0.0/8", "fc00::/7", "203.0.113.7", "192.168.0.0/16"}, ""},
		{nil, ""},
		{[]string{"10.0.0.0/8", "0.0.0.0/0"}, "0.0.0.0/0"},
		{[]string{"::/0"}, "::/0"},
		{[]string{"128.0.0.0/1"}, "128.0.0.0/1"},
		{[]string{"2000::/3"}, "2000::/3"},
		// A regional registry's share of IPv6 (much of Europe), though
		// narrower than fc00::/7; a CDN's published ranges, and a private
		// range's part, are not warned of.
		{[]string{"2a00::/12"}, "2a00::/12"},
		{[]string{"2a06:98c0::/29", "2400:cb00::/32", "fd00::/8"}, ""},
		{[]string{"::ffff:0.0.0.0/96"}, "0.0.0.0/0"},
	} {
		got := mustNew(t, tc.trusted, "").Warning()
		if tc.want == "" && got != "" || tc.want != "" && (!strings.Contains(got, tc.want) || !strings.Contains(got, "any client")) {
			t.Errorf("trusted %v: Warning() = %q, want one naming %q", tc.trusted, got, tc.want)
		}
	}
	if got := (*Policy)(nil).Warning(); got != "" {
		t.Errorf("nil policy: Warning() = %q, want none", got)
	}
}
