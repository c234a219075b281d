package main

import (
	"errors"
	"path/filepath"
	"strings"
	"testing"
	"time"
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
