package linkrules

import (
	"bytes"
	"net/netip"
	"testing"
)

// FuzzParse: a stored form either is refused or compiles into a Set that
// evaluates any request without panicking and encodes back to a form that
// parses to the same encoding.
func FuzzParse(f *testing.F) {
	f.Add([]byte(`{"r":[{"n":"a","if":[{"l":["de"]},{"q":{"p":"x","v":"1"}}],"u":"https://example.com/"}],"v":[{"n":"b","u":"https://example.com/b","w":3}]}`))
	f.Add([]byte(`{"r":[{"n":"c","if":[{"c":["10.0.0.0/8","::ffff:1.2.3.4/120"]},{"t":{"f":1,"u":2}},{"g":["de"]},{"d":["IOS"]}],"u":"x"}]}`))
	f.Add([]byte(`null`))
	f.Fuzz(func(t *testing.T, b []byte) {
		s, err := Parse(b)
		if err != nil || s == nil {
			return
		}
		for _, req := range []Request{
			{AcceptLanguage: "de-AT;q=0.5, *, en;q=0", RawQuery: "x=1&q=%zz&p+q=1", Addr: netip.MustParseAddr("10.1.2.3"),
				Country: func(netip.Addr) string { return "DE" }, Device: DeviceIOS, NowMs: 1},
			{Addr: netip.MustParseAddr("1.2.3.4"), NowMs: 1 << 50},
		} {
			s.Match(&req)
		}
		s.Pick(NewSticky(b).Bucket("v", "code"))
		enc := s.Marshal()
		again, err := Parse(enc)
		if err != nil {
			t.Fatalf("re-parse of %s: %v", enc, err)
		}
		if !bytes.Equal(again.Marshal(), enc) {
			t.Fatalf("encoding changed: %s -> %s", enc, again.Marshal())
		}
	})
}
