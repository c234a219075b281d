package ratelimit

import (
	"strings"
	"testing"
)

// An ad-hoc key's parts are escaped as descriptor values, so that no part
// forges a separator or a hash tag, and its tag is all but the namespace.
func TestAdHocKey(t *testing.T) {
	for _, tc := range []struct {
		parts   []string
		key     string
		hashTag string
	}{
		{[]string{"a", "b"}, "gb:{a:b}", "a:b"},
		{[]string{"a:b", "c"}, "gb:{a%3Ab:c}", "a%3Ab:c"},
		{[]string{"}{", "x"}, "gb:{%7D%7B:x}", "%7D%7B:x"},
		{[]string{strings.Repeat("v", 65), "x"}, "gb:{" + escapeValue(strings.Repeat("v", 65)) + ":x}", escapeValue(strings.Repeat("v", 65)) + ":x"},
	} {
		key := AdHocKey("gb", tc.parts...)
		if key != tc.key || hashTag(key) != tc.hashTag {
			t.Errorf("AdHocKey(%q) = %q, tag %q; want %q, tag %q", tc.parts, key, hashTag(key), tc.key, tc.hashTag)
		}
	}
}

func TestParseFailureMode(t *testing.T) {
	for _, s := range []string{"open", "closed", "local"} {
		if _, err := ParseFailureMode(s); err != nil {
			t.Errorf("%s: %v", s, err)
		}
	}
	if _, err := ParseFailureMode("deny"); err == nil || !strings.Contains(err.Error(), `failure mode "deny": want open, closed or local`) {
		t.Errorf("deny: %v, want a refusal naming the modes", err)
	}
}
