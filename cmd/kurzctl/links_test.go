package main

import (
	"errors"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"google.golang.org/protobuf/proto"

	analyticsv1 "kurz.dev/gen/kurz/analytics/v1"
	shortenerv1 "kurz.dev/gen/kurz/shortener/v1"
)

// A span in days is a finite number of days a time.Duration holds: NaN,
// Inf and more than about 292 years are refused, the last with a message
// that says the bound, rather than wrapping around into the past.
func TestParseSpanRefusesWhatADurationCannotHold(t *testing.T) {
	for _, s := range []string{"NaNd", "nand", "-NaNd", "-1d", "-Infd", "xd", "d"} {
		if d, err := parseSpan(s); err == nil || errors.Is(err, errSpanTooLong) {
			t.Errorf("parseSpan(%q) = %v, %v; want it refused as not a duration", s, d, err)
		}
	}
	for _, s := range []string{"110000d", "106751.5d", "Infd", "+Infd", "1e400d"} {
		if d, err := parseSpan(s); !errors.Is(err, errSpanTooLong) {
			t.Errorf("parseSpan(%q) = %v, %v; want it refused as too long", s, d, err)
		}
	}
	for s, want := range map[string]time.Duration{
		"7d": 7 * 24 * time.Hour, "1.5d": 36 * time.Hour, "0d": 0,
		"106751d": time.Duration(maxSpanDays) * 24 * time.Hour,
	} {
		if d, err := parseSpan(s); err != nil || d != want {
			t.Errorf("parseSpan(%q) = %v, %v; want %v", s, d, err, want)
		}
	}
}

// links create --expire with a span too long for a duration says so as a
// usage error, not as the API's "expire_time must be in the future" of a
// span that wrapped around; NaNd is refused before any call.
func TestCreateRefusesAnExpireItCannotCount(t *testing.T) {
	c := &ctl{t: t, env: map[string]string{"KURZ_CONFIG": filepath.Join(t.TempDir(), "config.yaml")}}
	for arg, want := range map[string]string{
		"110000d": "--expire: \"110000d\": a duration holds at most 106751d",
		"NaNd":    "--expire: \"NaNd\" is neither an RFC 3339 time",
	} {
		r := c.run("--url", "http://127.0.0.1:1", "links", "create", "https://example.com/", "--expire", arg)
		if r.code != exitUsage || !strings.Contains(r.stderr, want) {
			t.Errorf("links create --expire %s: %s; want a usage error saying %q", arg, r, want)
		}
	}
}

// clicksOf is the CLICKS cell of a links list line: the one before
// CREATED, the last (a title before it may hold spaces).
func clicksOf(line string) string {
	f := strings.Fields(line)
	return f[len(f)-2]
}

// With click counts, the list has a CLICKS column: each link's total,
// found by code and domain, and "-" for a link the counts do not name.
func TestPrintLinksShowsClicks(t *testing.T) {
	links := []*shortenerv1.Link{
		{Code: "abcd123", ShortUrl: "https://k.test/abcd123", LongUrl: "https://example.com/a", Title: "A title with spaces"},
		{Code: "abcd123", Domain: proto.String("go.example.com"), ShortUrl: "https://go.example.com/abcd123", LongUrl: "https://example.com/b"},
		{Code: "none123", ShortUrl: "https://k.test/none123", LongUrl: "https://example.com/c"},
	}
	var b strings.Builder
	err := printLinks(&b, links, "", map[string]*analyticsv1.ClickCounts{
		"abcd123": {Total: 42, Human: 40}, "go.example.com/abcd123": {Total: 7},
	})
	if err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(strings.TrimSpace(b.String()), "\n")
	var got []string
	for _, line := range lines[1:] {
		got = append(got, clicksOf(line))
	}
	if want := []string{"42", "7", "-"}; !strings.Contains(strings.Join(strings.Fields(lines[0]), " "), "TAGS CLICKS CREATED") || !slices.Equal(got, want) {
		t.Errorf("clicks %q, want %q after TAGS:\n%s", got, want, b.String())
	}
	b.Reset()
	if err := printLinks(&b, links[:1], "", nil); err != nil {
		t.Fatal(err)
	}
	if strings.Contains(b.String(), "CLICKS") {
		t.Errorf("without click counts the list has a CLICKS column:\n%s", b.String())
	}
}
