package clickevent

import (
	"bufio"
	"bytes"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"kurz.dev/pkg/resp"
)

func TestValuesParseRoundTrip(t *testing.T) {
	e := Event{
		ID: NewID(time.Now()), Code: "10000g8", Tenant: "acme", Time: time.UnixMilli(1790000000123),
		Visitor: Visitor([]byte("salt"), time.Now(), "203.0.113.9", "curl/8"), UserAgent: "curl/8",
		Referrer: "https://news.example/", TraceParent: "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
		Country: "DE",
	}
	vals := e.Values()
	m := map[string]any{}
	for i := 0; i < len(vals); i += 2 {
		m[vals[i]] = vals[i+1]
	}
	got, err := Parse(m)
	if err != nil || got != e {
		t.Fatalf("Parse(Values(e)) = %+v, %v; want %+v", got, err, e)
	}
	// An older producer's entry has no country: it reads as unknown.
	delete(m, FieldCountry)
	want := e
	want.Country = ""
	if got, err := Parse(m); err != nil || got != want {
		t.Fatalf("Parse without a country = %+v, %v; want %+v", got, err, want)
	}
	for _, bad := range []string{"de", "DEU", "D", "1A", "ÄÖ"} {
		m[FieldCountry] = bad
		if got, err := Parse(m); err != nil || got.Country != "" {
			t.Errorf("Parse with country %q = %q, %v; want \"\"", bad, got.Country, err)
		}
	}
	delete(m, FieldVersion)
	if _, err := Parse(m); err == nil {
		t.Error("Parse without a version: want an error")
	}
}

func TestVisitorHidesTheIPAndRotatesDaily(t *testing.T) {
	day := time.Date(2026, 3, 1, 10, 0, 0, 0, time.UTC)
	a := Visitor([]byte("s1"), day, "203.0.113.9", "ua")
	if a != Visitor([]byte("s1"), day.Add(time.Hour), "203.0.113.9", "ua") {
		t.Error("same visitor, same day: hashes differ")
	}
	for name, other := range map[string]string{
		"next day":   Visitor([]byte("s1"), day.Add(24*time.Hour), "203.0.113.9", "ua"),
		"other salt": Visitor([]byte("s2"), day, "203.0.113.9", "ua"),
		"other ip":   Visitor([]byte("s1"), day, "203.0.113.10", "ua"),
		"other ua":   Visitor([]byte("s1"), day, "203.0.113.9", "ub"),
	} {
		if other == a {
			t.Errorf("%s: same hash", name)
		}
	}
	if strings.Contains(a, "203") || len(a) != 32 {
		t.Errorf("visitor %q: want 32 hex digits, no trace of the IP", a)
	}
}

func TestNewIDIsUUIDv7(t *testing.T) {
	re := regexp.MustCompile(`^[0-9a-f]{8}-[0-9a-f]{4}-7[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}$`)
	seen := map[string]bool{}
	for range 1000 {
		id := NewID(time.Now())
		if !re.MatchString(id) || seen[id] {
			t.Fatalf("NewID = %q: want a fresh UUIDv7", id)
		}
		seen[id] = true
	}
}

func TestTruncateKeepsUTF8(t *testing.T) {
	s := strings.Repeat("a", MaxTextLen-1) + "é"
	if got := Truncate(s); got != strings.Repeat("a", MaxTextLen-1) {
		t.Errorf("Truncate split a rune: %q", got[MaxTextLen-4:])
	}
}

// A reused HMAC state must hash like a fresh one: the pool resets it, and
// an input past the kept buffer's size (a huge user agent) changes nothing.
func TestVisitorsReuseMatchesAFreshHMAC(t *testing.T) {
	day := time.Date(2026, 3, 1, 10, 0, 0, 0, time.UTC)
	v := NewVisitors([]byte("s1"))
	for i, ip := range []string{"203.0.113.9", "203.0.113.10", "2001:db8::1", "203.0.113.9", "203.0.113.9"} {
		ua := strings.Repeat("u", []int{0, 1, 6000, 2, 3}[i])
		want := hex.EncodeToString(func() []byte {
			m := hmac.New(sha256.New, []byte("s1"))
			m.Write([]byte("2026-03-01\x00" + ip + "\x00" + ua))
			return m.Sum(nil)[:16]
		}())
		if got := v.Visitor(day, ip, ua); got != want {
			t.Errorf("visit %d (%s): got %s, want %s", i, ip, got, want)
		}
	}
}

func TestRuleAndVariantAreOptional(t *testing.T) {
	toMap := func(vals []string) map[string]any {
		m := map[string]any{}
		for i := 0; i < len(vals); i += 2 {
			m[vals[i]] = vals[i+1]
		}
		return m
	}
	plain := Event{ID: NewID(time.Now()), Code: "10000g8", Tenant: "acme", Time: time.UnixMilli(1790000000123)}
	if m := toMap(plain.Values()); m[FieldRule] != nil || m[FieldVariant] != nil || len(m) != 10 { // country is always written
		t.Fatalf("a plain click writes %d fields: %v", len(m), m)
	}
	ruled := plain
	ruled.Rule, ruled.Variant = "ios-de", "b"
	got, err := Parse(toMap(ruled.Values()))
	if err != nil || got != ruled {
		t.Fatalf("Parse(Values(%+v)) = %+v, %v", ruled, got, err)
	}
	// An older redirect's event, without the fields, reads as empty.
	got, err = Parse(toMap(plain.Values()))
	if err != nil || got.Rule != "" || got.Variant != "" {
		t.Fatalf("old event: %+v, %v", got, err)
	}
}

// Args allocates its slice, the timestamp and one interface value per
// non-empty dynamic value; the field names and empty values cost nothing
// (a []string handed to go-redis cost one per element, names included).
func TestArgsBoxOnlyTheValues(t *testing.T) {
	e := Event{ID: "0193a5b2-7c1e-7000-8000-000000000001", Code: "abc", Tenant: "acme", Time: time.UnixMilli(1764843123456),
		Visitor: "v1", UserAgent: "Mozilla/5.0", Referrer: "https://example.com/"}
	// the slice, the timestamp's string, 7 boxed values (ID, code, tenant,
	// timestamp, visitor, agent, referrer; trace and country are empty)
	const most = 1 + 1 + 7
	if n := testing.AllocsPerRun(100, func() { _ = e.Args() }); n > most {
		t.Errorf("Args: %.0f allocations, want at most %d", n, most)
	}
}

// decodeCommand reads b as exactly one command.
func decodeCommand(t *testing.T, b []byte) []string {
	t.Helper()
	r := bufio.NewReader(bytes.NewReader(b))
	args, err := resp.ReadCommand(r)
	if err != nil {
		t.Fatal(err)
	}
	if r.Buffered() > 0 {
		t.Fatalf("%d bytes after the command", r.Buffered())
	}
	return args
}

func TestAppendXAddSendsWhatValuesSay(t *testing.T) {
	for name, e := range map[string]Event{
		"plain": {ID: NewID(time.Now()), Code: "10000g8", Tenant: "acme", Time: time.UnixMilli(1790000000123),
			Visitor: "v", UserAgent: "curl/8", Country: "DE"},
		"rule, variant, long texts": {ID: NewID(time.Now()), Code: "x", Time: time.UnixMilli(-5),
			UserAgent: strings.Repeat("é", MaxTextLen), Referrer: "https://a.example/\r\n$3\r\n",
			Rule: strings.Repeat("r", 2*MaxNameLen), Variant: "b", Country: "zz"},
	} {
		t.Run(name, func(t *testing.T) {
			prefix := []byte("kept")
			b := e.AppendXAdd(prefix, "clicks:{3}", 1_000_000)
			if string(b[:4]) != "kept" {
				t.Fatalf("the buffer's start was overwritten: %q", b[:4])
			}
			want := append([]string{"XADD", "clicks:{3}", "MAXLEN", "~", "1000000", "*"}, e.Values()...)
			if got := decodeCommand(t, b[4:]); !slices.Equal(got, want) {
				t.Errorf("AppendXAdd sends\n%q\nwant\n%q", got, want)
			}
		})
	}
}

func TestAppendXAddAllocatesOnlyTheTimestamp(t *testing.T) {
	e := Event{ID: NewID(time.Now()), Code: "10000g8", Tenant: "acme", Time: time.Now(), Visitor: "v", UserAgent: "curl/8"}
	buf := make([]byte, 0, 4096)
	if n := testing.AllocsPerRun(100, func() { buf = e.AppendXAdd(buf[:0], "clicks:{0}", 1000) }); n > 1 {
		t.Errorf("AppendXAdd: %v allocations, want at most 1", n)
	}
}
