package redirector

import "testing"

func TestPointsBackComparesHostAndPortOnly(t *testing.T) {
	for _, c := range []struct {
		host, target string
		want         bool
	}{
		{"kurz.test:8787", "http://kurz.test:8787/abc", true},
		{"kurz.test:8787", "https://kurz.test:8787", true},
		{"kurz.test:8787", "http://kurz.test:8787?x=1", true},
		{"kurz.test:8787", "http://kurz.test:8787#top", true},
		{"kurz.test:8787", `http://kurz.test:8787\abc`, true},
		{"KURZ.Test.:8787", "HTTP://kurz.TEST:8787/abc", true},
		{"kurz.test:8787", "http://kurz.test.:08787/abc", true},
		{"kurz.test:8787", "http://user:pw@kurz.test:8787/abc", true},
		{"kurz.test", "https://kurz.test/abc", true},
		{"kurz.test", "http://kurz.test:80/abc", true},
		{"kurz.test:443", "http://kurz.test/abc", true},
		{"[2001:db8::1]:8787", "http://[2001:DB8::1]:8787/abc", true},
		{"[2001:db8::1]", "https://[2001:db8::1]/abc", true},
		{"127.0.0.1:8787", "http://127.0.0.1:8787/abc", true},

		{"kurz.test:8787", "http://kurz.test:9999/abc", false},
		{"kurz.test:8787", "http://kurz.test/abc", false},
		{"kurz.test", "http://kurz.test:8787/abc", false},
		{"kurz.test:8787", "http://other.test:8787/kurz.test:8787", false},
		{"kurz.test:8787", "http://kurz.test.other.test:8787/abc", false},
		{"kurz.test:8787", "http://kurz.test:8787@other.test:8787/abc", false},
		{"kurz.test:8787", "http://other.test:8787/?next=http://kurz.test:8787/abc", false},
		{"kurz.test:8787", "ftp://kurz.test:8787/abc", false},
		{"kurz.test:8787", "kurz.test:8787/abc", false},
		{"kurz.test:8787", "http://kurz.test:99999999999999999999/abc", false},
		{"kurz.test:8787x", "http://kurz.test:8787x/abc", false},
		{"[2001:db8::1]:8787", "http://[2001:db8::2]:8787/abc", false},
		{"", "http:///abc", false},
		{"", "https://kurz.test/abc", false},
	} {
		if got := pointsBack(c.host, c.target); got != c.want {
			t.Errorf("pointsBack(%q, %q) = %v, want %v", c.host, c.target, got, c.want)
		}
	}
}

func TestPointsBackDoesNotAllocate(t *testing.T) {
	if n := testing.AllocsPerRun(100, func() {
		pointsBack("Kurz.Test:8787", "https://user@kurz.test:8787/abc?x=1")
	}); n != 0 {
		t.Errorf("pointsBack allocates %v times per call, want 0", n)
	}
}

// BenchmarkPointsBack is what the loop check adds to every redirect: a
// target on another host, the common case, and one on the host asked.
func BenchmarkPointsBack(b *testing.B) {
	for _, c := range []struct{ name, target string }{
		{"other", "https://example.com/some/path?utm_source=news"},
		{"same", "https://kurz.test:8787/some/path?utm_source=news"},
	} {
		b.Run(c.name, func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				pointsBack("kurz.test:8787", c.target)
			}
		})
	}
}
