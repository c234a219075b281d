package clickevent

import (
	"strconv"
	"strings"
	"testing"
	"unicode/utf8"
)

// FuzzParse builds a stream entry from fuzzed strings, any field possibly
// missing or of the wrong type, and parses it as the consumer does. Parse
// never panics; an accepted event had version "1", a decimal timestamp and
// an ID and a code, keeps the user agent and referrer within MaxTextLen
// bytes, and goes through the producer's encoding (Values, as XADD writes
// it) and Parse again unchanged. Its country is a country code or "", and
// "" when the entry has none (an older producer's). The seed corpus is in
// testdata/fuzz/FuzzParse.
func FuzzParse(f *testing.F) {
	const all = 1<<9 - 1
	f.Add(uint16(all), Version, "01890a5d-ac96-774b-bcce-b302099a8057", "10000g8", "acme", "1790000000123",
		"3f1c2e0a9b8d7c6b5a4f3e2d1c0b9a88", "Mozilla/5.0", "https://news.example/", "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01")
	f.Add(uint16(all), Version, "i", "c", "", "-9223372036854775808", "", "", "", "")
	f.Add(uint16(all), Version, "i", "c", "t", "+0012", "", "", "", "")
	f.Add(uint16(all), Version, "i", "c", "t", "9223372036854775808", "", "", "", "")
	f.Add(uint16(all), Version, "i", "c", "t", "1e3", "", "", "", "")
	f.Add(uint16(all), "2", "i", "c", "t", "1", "", "", "", "")
	f.Add(uint16(all), Version, "", "c", "t", "1", "", "", "", "")
	f.Add(uint16(all&^(1<<1)), Version, "i", "c", "t", "1", "", "", "", "")
	f.Add(uint16(all|1<<9), Version, "i", "c", "t", "1", "v", "ua", "ref", "tp")
	f.Add(uint16(all|1<<10), Version, "i", "c", "t", "1", "v", "ua", "ref", "tp")
	f.Add(uint16(all|1<<11), Version, "i", "c", "DE", "1", "v", "ua", "ref", "tp")
	f.Add(uint16(all|1<<11), Version, "i", "c", "de", "1", "v", "ua", "ref", "tp")
	f.Add(uint16(all), Version, "i", "c", "t", "1", "v", strings.Repeat("a", MaxTextLen-1)+"é", strings.Repeat("€", 200), "")
	f.Add(uint16(all), Version, "i", "c", "t", "1", "v", "\xff"+strings.Repeat("a", MaxTextLen), strings.Repeat("a", MaxTextLen-2)+"\xe2\x82", "")
	f.Fuzz(func(t *testing.T, present uint16, version, id, code, tenant, ts, visitor, ua, ref, traceparent string) {
		fields := []string{FieldVersion, FieldID, FieldCode, FieldTenant, FieldTimestamp, FieldVisitor, FieldUserAgent, FieldReferrer, FieldTraceParent}
		values := []string{version, id, code, tenant, ts, visitor, ua, ref, traceparent}
		m := map[string]any{}
		for i, field := range fields {
			if present&(1<<i) != 0 {
				m[field] = values[i]
			}
		}
		if present&(1<<9) != 0 {
			m[FieldUserAgent] = []byte(ua) // not a string: read as missing
		}
		if present&(1<<10) != 0 {
			m["extra"] = ts // unknown fields are ignored
		}
		if present&(1<<11) != 0 {
			m[FieldCountry] = tenant // optional; anything but a code reads as ""
		}

		checkTruncate(t, ua)
		checkTruncate(t, ref)

		e, err := Parse(m)
		if err != nil {
			return
		}
		if m[FieldVersion] != Version || e.ID == "" || e.Code == "" || e.ID != m[FieldID] || e.Code != m[FieldCode] {
			t.Fatalf("Parse(%q) accepted %+v", m, e)
		}
		if ms, err := strconv.ParseInt(ts, 10, 64); err != nil || e.Time.UnixMilli() != ms {
			t.Fatalf("Parse(%q): time %v from ts %q (%d, %v)", m, e.Time, ts, ms, err)
		}
		if len(e.UserAgent) > MaxTextLen || len(e.Referrer) > MaxTextLen {
			t.Fatalf("Parse(%q): user agent of %d bytes, referrer of %d; want at most %d", m, len(e.UserAgent), len(e.Referrer), MaxTextLen)
		}

		if want := Country(tenant); present&(1<<11) != 0 && e.Country != want || present&(1<<11) == 0 && e.Country != "" ||
			e.Country != "" && (len(e.Country) != 2 || strings.Trim(e.Country, "ABCDEFGHIJKLMNOPQRSTUVWXYZ") != "") {
			t.Fatalf("Parse(%q): country %q", m, e.Country)
		}

		fields = append(fields, FieldCountry)
		vals := e.Values()
		if len(vals) != 2*len(fields) {
			t.Fatalf("Values(%+v) = %q: want %d field/value pairs", e, vals, len(fields))
		}
		encoded := map[string]any{}
		for i := 0; i < len(vals); i += 2 {
			if vals[i] != fields[i/2] {
				t.Fatalf("Values(%+v): field %d is %q, want %q", e, i/2, vals[i], fields[i/2])
			}
			encoded[vals[i]] = vals[i+1]
		}
		again, err := Parse(encoded)
		if err != nil || again != e {
			t.Fatalf("round trip through Values: %+v -> %q -> %+v, %v", e, vals, again, err)
		}
	})
}

// checkTruncate fails t unless Truncate(s) is the longest prefix of s within
// MaxTextLen bytes that does not split a UTF-8 sequence: it drops at most
// the start of the one rune the bound cuts through, whatever else s holds.
func checkTruncate(t *testing.T, s string) {
	t.Helper()
	got := Truncate(s)
	switch {
	case len(s) <= MaxTextLen && got != s:
		t.Fatalf("Truncate(%q) = %q: changed a short string", s, got)
	case !strings.HasPrefix(s, got) || len(got) > MaxTextLen:
		t.Fatalf("Truncate(%q) = %q: not a prefix within %d bytes", s, got, MaxTextLen)
	case len(got) < MaxTextLen-(utf8.UTFMax-1) && len(s) > MaxTextLen:
		t.Fatalf("Truncate of %d bytes kept %d: more than a split rune dropped", len(s), len(got))
	case Truncate(got) != got:
		t.Fatalf("Truncate(%q) is not stable", s)
	}
	if utf8.ValidString(s) {
		if !utf8.ValidString(got) {
			t.Fatalf("Truncate(%q) = %q: split a rune", s, got)
		}
		// The cut is at a rune boundary: what was dropped is whole runes,
		// and the first of them did not fit.
		if rest := s[len(got):]; rest != "" {
			if r, size := utf8.DecodeRuneInString(rest); r == utf8.RuneError || len(got)+size <= MaxTextLen {
				t.Fatalf("Truncate(%q) = %q: dropped %q, which fits", s, got, rest[:size])
			}
		}
	}
}
