//go:build integration

package redirector

import (
	"net/http"
	"net/http/httptest"
	"net/netip"
	"strings"
	"sync"
	"testing"
	"unsafe"

	"kurz.dev/pkg/clickevent"
	"kurz.dev/pkg/linkcache"
	"kurz.dev/pkg/linkrules"
)

// keptClicks keeps the click events recorded.
type keptClicks struct {
	mu     sync.Mutex
	events []clickevent.Event
}

func (k *keptClicks) Record(e clickevent.Event) {
	k.mu.Lock()
	k.events = append(k.events, e)
	k.mu.Unlock()
}

func (k *keptClicks) last() clickevent.Event {
	k.mu.Lock()
	defer k.mu.Unlock()
	return k.events[len(k.events)-1]
}

// shortHost is the redirect's host in these tests: httptest's default,
// example.com, is the host of the links' destinations, which the redirect
// refuses as a loop (508).
const shortHost = "kurz.test"

const (
	iPhone  = "Mozilla/5.0 (iPhone; CPU iPhone OS 17_4 like Mac OS X) AppleWebKit/605.1.15 Mobile/15E148 Safari/604.1"
	android = "Mozilla/5.0 (Linux; Android 14; Pixel 8) AppleWebKit/537.36 Chrome/124.0 Mobile Safari/537.36"
	windows = "Mozilla/5.0 (Windows NT 10.0; Win64; x64) AppleWebKit/537.36 Chrome/124.0.0.0 Safari/537.36"
)

func ruled(t *testing.T) *linkrules.Set {
	t.Helper()
	s := &linkrules.Set{
		Rules: []linkrules.Rule{
			{Name: "ios-de", If: []linkrules.Condition{{Devices: []string{"ios"}}, {Languages: []string{"de"}}}, URL: "https://example.com/ios-de"},
			{Name: "dach", If: []linkrules.Condition{{Countries: []string{"DE", "AT"}}}, URL: "https://example.com/dach"},
			{Name: "office", If: []linkrules.Condition{{CIDRs: []string{"203.0.113.0/24"}}}, URL: "https://example.com/office"},
			{Name: "debug", If: []linkrules.Condition{{Query: &linkrules.Query{Param: "debug"}}}, URL: "https://example.com/debug"},
		},
		Variants: []linkrules.Variant{{Name: "a", URL: "https://example.com/a", Weight: 1}, {Name: "b", URL: "https://example.com/b", Weight: 1}},
	}
	if err := s.Compile(); err != nil {
		t.Fatal(err)
	}
	return s
}

// TestRulesChooseTheDestination walks the order of destinations: the first
// matching rule, else the device target, else a variant (sticky), else the
// URL; and what each answer says to caches and records on its click.
func TestRulesChooseTheDestination(t *testing.T) {
	clicks := &keptClicks{}
	cfg := benchConfig()
	lookups := 0
	cfg.Country = func(a netip.Addr) string {
		lookups++
		if a == netip.MustParseAddr("192.0.2.1") {
			return "AT"
		}
		return "US"
	}
	rules := ruled(t)
	noVariants := ruled(t)
	noVariants.Variants = nil
	if err := noVariants.Compile(); err != nil {
		t.Fatal(err)
	}
	mux := serveEntries(t, cfg, clicks, map[string]linkcache.Entry{
		"ruled":   {State: linkcache.Active, URL: "https://example.com/", Tenant: "t", Rules: rules, Targets: &linkcache.Targets{Android: "https://example.com/android"}},
		"nosplit": {State: linkcache.Active, URL: "https://example.com/", Tenant: "t", Rules: noVariants},
		"plain":   {State: linkcache.Active, URL: "https://example.com/", Tenant: "t"},
	})
	serve := func(path, addr string, header ...string) *httptest.ResponseRecorder {
		req := httptest.NewRequest(http.MethodGet, path, nil)
		req.Host = shortHost
		req.RemoteAddr = addr + ":1234"
		for i := 0; i+1 < len(header); i += 2 {
			req.Header.Set(header[i], header[i+1])
		}
		w := httptest.NewRecorder()
		mux.ServeHTTP(w, req)
		return w
	}
	for _, tc := range []struct {
		name, path, addr string
		header           []string
		want             string
		rule, variant    string
	}{
		{"first rule, all conditions", "/ruled", "198.51.100.1", []string{"User-Agent", iPhone, "Accept-Language", "de-DE,de;q=0.9"}, "https://example.com/ios-de", "ios-de", ""},
		{"german at q=0 fails the first rule", "/ruled", "198.51.100.1", []string{"User-Agent", iPhone, "Accept-Language", "en, de;q=0", "X-Pick", ""}, "", "", "?"},
		{"country", "/ruled", "192.0.2.1", []string{"User-Agent", windows}, "https://example.com/dach", "dach", ""},
		{"cidr", "/ruled", "203.0.113.50", []string{"User-Agent", windows}, "https://example.com/office", "office", ""},
		{"query", "/ruled?debug", "198.51.100.1", []string{"User-Agent", windows}, "https://example.com/debug", "debug", ""},
		{"device target before variants", "/ruled", "198.51.100.1", []string{"User-Agent", android}, "https://example.com/android", "", ""},
		{"no rule, no variants: the URL", "/nosplit", "198.51.100.1", []string{"User-Agent", windows}, "https://example.com/", "", ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			w := serve(tc.path, tc.addr, tc.header...)
			ev := clicks.last()
			if tc.variant == "?" {
				if ev.Variant != "a" && ev.Variant != "b" || ev.Rule != "" || w.Header().Get("Location") != "https://example.com/"+ev.Variant {
					t.Fatalf("Location %q, click rule %q variant %q: want a variant", w.Header().Get("Location"), ev.Rule, ev.Variant)
				}
			} else if w.Header().Get("Location") != tc.want || ev.Rule != tc.rule || ev.Variant != tc.variant {
				t.Fatalf("Location %q, click rule %q variant %q; want %s, %q, %q", w.Header().Get("Location"), ev.Rule, ev.Variant, tc.want, tc.rule, tc.variant)
			}
			if cc, vary := w.Header().Get("Cache-Control"), w.Header().Get("Vary"); cc != "private, max-age=0" || vary != "User-Agent, Accept-Language" {
				t.Fatalf("Cache-Control %q, Vary %q", cc, vary)
			}
		})
	}

	// Sticky: one visitor keeps its variant; over many visitors both show.
	seen := map[string]int{}
	for i := range 64 {
		addr := netip.AddrFrom4([4]byte{198, 51, 100, byte(i)}).String()
		first := serve("/ruled", addr, "User-Agent", windows).Header().Get("Location")
		for range 3 {
			if again := serve("/ruled", addr, "User-Agent", windows).Header().Get("Location"); again != first {
				t.Fatalf("visitor %s got %s, then %s", addr, first, again)
			}
		}
		seen[first]++
	}
	if seen["https://example.com/a"] == 0 || seen["https://example.com/b"] == 0 {
		t.Fatalf("64 visitors split %v, want both variants", seen)
	}

	// A country rule's lookup is the click's country too: one lookup.
	before := lookups
	w := serve("/ruled", "192.0.2.1", "User-Agent", windows)
	if ev := clicks.last(); ev.Rule != "dach" || ev.Country != "AT" || lookups-before != 1 {
		t.Fatalf("country rule: click rule %q country %q, %d country lookups; want dach, AT, 1", ev.Rule, ev.Country, lookups-before)
	}

	// A plain link keeps its answer; only its click looks the country up.
	before = lookups
	w = serve("/plain", "192.0.2.1", "User-Agent", iPhone, "Accept-Language", "de")
	if w.Header().Get("Location") != "https://example.com/" || w.Header().Get("Vary") != "" || lookups-before != 1 {
		t.Fatalf("plain link: Location %q Vary %q, %d country lookups; want 1, for the click", w.Header().Get("Location"), w.Header().Get("Vary"), lookups-before)
	}
	if ev := clicks.last(); ev.Rule != "" || ev.Variant != "" || ev.Country != "AT" {
		t.Fatalf("plain click recorded rule %q variant %q country %q", ev.Rule, ev.Variant, ev.Country)
	}
}

// TestDeviceTargetsVaryRuledAnswers: a link's device targets answer when
// none of its rules does, so the answer of a link with targets varies by
// User-Agent even when its rules and variants read no device.
func TestDeviceTargetsVaryRuledAnswers(t *testing.T) {
	compile := func(s *linkrules.Set) *linkrules.Set {
		t.Helper()
		if err := s.Compile(); err != nil {
			t.Fatal(err)
		}
		return s
	}
	variants := []linkrules.Variant{{Name: "a", URL: "https://example.com/a", Weight: 1}, {Name: "b", URL: "https://example.com/b", Weight: 1}}
	targets := &linkcache.Targets{IOS: "https://example.com/ios"}
	mux := serveEntries(t, benchConfig(), &keptClicks{}, map[string]linkcache.Entry{
		"split": {State: linkcache.Active, URL: "https://example.com/", Tenant: "t", Targets: targets,
			Rules: compile(&linkrules.Set{Variants: variants})},
		"lang": {State: linkcache.Active, URL: "https://example.com/", Tenant: "t", Targets: targets,
			Rules: compile(&linkrules.Set{Rules: []linkrules.Rule{{Name: "de", If: []linkrules.Condition{{Languages: []string{"de"}}}, URL: "https://example.com/de"}}})},
		"splitonly": {State: linkcache.Active, URL: "https://example.com/", Tenant: "t",
			Rules: compile(&linkrules.Set{Variants: variants})},
	})
	for _, tc := range []struct{ path, ua, vary string }{
		{"/split", iPhone, "User-Agent"},
		{"/split", windows, "User-Agent"},
		{"/lang", iPhone, "User-Agent, Accept-Language"},
		{"/lang", windows, "User-Agent, Accept-Language"},
		{"/splitonly", iPhone, ""},
	} {
		req := httptest.NewRequest(http.MethodGet, tc.path, nil)
		req.Host = shortHost
		req.RemoteAddr = "198.51.100.7:1234"
		req.Header.Set("User-Agent", tc.ua)
		w := httptest.NewRecorder()
		mux.ServeHTTP(w, req)
		if got := w.Header().Get("Vary"); got != tc.vary || w.Code != http.StatusFound {
			t.Errorf("%s as %.30s: %d, Vary %q; want 302, Vary %q", tc.path, tc.ua, w.Code, got, tc.vary)
		}
	}
}

// TestClickKeepsNoMoreThanItStores: a click holds at most MaxTextLen bytes
// of the User-Agent and Referer, in memory of its own: the click buffer
// must not pin a stranger's whole headers while Redis is slow.
func TestClickKeepsNoMoreThanItStores(t *testing.T) {
	clicks := &keptClicks{}
	mux := serveEntries(t, benchConfig(), clicks, map[string]linkcache.Entry{
		"plain": {State: linkcache.Active, URL: "https://example.com/", Tenant: "t"},
	})
	ua, ref := strings.Repeat("u", 30_000), "https://example.com/"+strings.Repeat("r", 30_000)
	req := httptest.NewRequest(http.MethodGet, "/plain", nil)
	req.Host = shortHost
	req.RemoteAddr = "198.51.100.7:1234"
	req.Header.Set("User-Agent", ua)
	req.Header.Set("Referer", ref)
	mux.ServeHTTP(httptest.NewRecorder(), req)
	ev := clicks.last()
	for _, f := range []struct{ name, got, header string }{{"User-Agent", ev.UserAgent, req.Header.Get("User-Agent")}, {"Referer", ev.Referrer, req.Header.Get("Referer")}} {
		if len(f.got) != clickevent.MaxTextLen || !strings.HasPrefix(f.header, f.got) {
			t.Errorf("click %s: %d bytes, want the header's first %d", f.name, len(f.got), clickevent.MaxTextLen)
		}
		if unsafe.StringData(f.got) == unsafe.StringData(f.header) {
			t.Errorf("click %s shares the header's memory: the buffered click pins all %d bytes", f.name, len(f.header))
		}
	}
}
