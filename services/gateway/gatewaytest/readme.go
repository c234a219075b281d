package gatewaytest

import (
	"fmt"
	"regexp"
	"strings"
)

// MatchOutput compares an output with the one a README shows, line by line
// (blank lines at the end aside); "…" in the README matches any run of
// characters within a line. It returns "" on a match, else what differs.
func MatchOutput(want, got string) string {
	wl := strings.Split(strings.TrimRight(want, "\n"), "\n")
	gl := strings.Split(strings.TrimRight(got, "\n"), "\n")
	if len(wl) != len(gl) {
		return fmt.Sprintf("want %d lines, got %d", len(wl), len(gl))
	}
	for i := range wl {
		parts := strings.Split(wl[i], "…")
		for j, p := range parts {
			parts[j] = regexp.QuoteMeta(p)
		}
		if !regexp.MustCompile("^" + strings.Join(parts, ".*?") + "$").MatchString(gl[i]) {
			return fmt.Sprintf("line %d: want %s\n             got  %s", i+1, wl[i], gl[i])
		}
	}
	return ""
}
