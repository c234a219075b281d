package redirector

import (
	"net/http"
	"net/http/httptest"
	"net/netip"
	"testing"
	"time"

	"kurz.dev/pkg/linkcache"
	"kurz.dev/pkg/linkrules"
)

// BenchmarkDestination is what choosing the destination costs per
// request: a plain link (the URL, nothing looked at) against one with four
// rules no request matches and two variants (the variant is the answer).
func BenchmarkDestination(b *testing.B) {
	rules, err := linkrules.Parse([]byte(`{"r":[
		{"n":"ios-de","if":[{"d":["ios"]},{"l":["de"]}],"u":"https://example.com/ios-de"},
		{"n":"german","if":[{"l":["de","fr"]}],"u":"https://example.com/de"},
		{"n":"promo","if":[{"q":{"p":"utm_source","v":"de"}}],"u":"https://example.com/promo"},
		{"n":"office","if":[{"c":["203.0.113.0/24","2001:db8::/32"]}],"u":"https://example.com/office"}],
		"v":[{"n":"a","u":"https://example.com/a","w":1},{"n":"b","u":"https://example.com/b","w":1}]}`))
	if err != nil {
		b.Fatal(err)
	}
	h := &Handler{sticky: linkrules.NewSticky([]byte("salt"))}
	r := httptest.NewRequest(http.MethodGet, "/popular?utm_source=news", nil)
	r.Header.Set("User-Agent", "Mozilla/5.0 (Windows NT 10.0; Win64; x64) AppleWebKit/537.36 (KHTML, like Gecko) Chrome/124.0.0.0 Safari/537.36")
	r.Header.Set("Accept-Language", "en-US,en;q=0.9,de;q=0")
	c := client{addr: netip.MustParseAddr("198.51.100.1"), key: "198.51.100.1"}
	now := time.Now()
	for _, tc := range []struct {
		name string
		e    linkcache.Entry
	}{
		{"plain", linkcache.Entry{State: linkcache.Active, URL: "https://example.com/"}},
		{"rules", linkcache.Entry{State: linkcache.Active, URL: "https://example.com/", Rules: rules}},
	} {
		b.Run(tc.name, func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				h.destination(r, r.UserAgent(), "popular", c, tc.e, now)
			}
		})
	}
}
