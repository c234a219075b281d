package gatewaytest

import "testing"

func TestMatchOutput(t *testing.T) {
	for _, c := range []struct {
		want, got string
		match     bool
	}{
		{"id  acme\nplan  free\n", "id  acme\nplan  free\n\n", true},
		{"created  …", "created  2026-12-03T07:00:00Z", true},
		{"…  laptop  …  -", "k_1  laptop  2026-12-03  -", true},
		{"plan  free", "plan  pro", false},
		{"a\nb", "a", false},
		{"x.y", "xzy", false}, // README text is literal, not a pattern
		{"…", "two\nlines", false},
	} {
		if got := MatchOutput(c.want, c.got) == ""; got != c.match {
			t.Errorf("MatchOutput(%q, %q) matched=%v, want %v", c.want, c.got, got, c.match)
		}
	}
}
