package config

import (
	"slices"
	"strings"
)

// Unknown is a variable of the environment that the service does not read
// but looks meant for it; Near is the read variable it is a typo of, if
// any.
type Unknown struct{ Name, Near string }

// Unread lists, by name, the variables of environ (os.Environ's form) that
// are not in read (the full names the service looked up) and look meant for
// service: of its own prefix (KURZ_LIMITER_ for "limiter"), or at most two
// edits from a variable it reads. Variables of other services are left
// alone, as one environment often serves several (a shared ConfigMap, make
// up). Values are never looked at: they may be secrets.
func Unread(environ []string, read map[string]bool, service string) []Unknown {
	own := Prefix + strings.ToUpper(service) + "_"
	var out []Unknown
	for _, kv := range environ {
		name, _, _ := strings.Cut(kv, "=")
		if !strings.HasPrefix(name, Prefix) || read[name] {
			continue
		}
		u := Unknown{Name: name, Near: nearest(name, read)}
		if u.Near != "" || strings.HasPrefix(name, own) {
			out = append(out, u)
		}
	}
	slices.SortFunc(out, func(a, b Unknown) int { return strings.Compare(a.Name, b.Name) })
	return out
}

// nearest is the name of read at most two edits from name (the first in
// order, for a stable answer), or "".
func nearest(name string, read map[string]bool) string {
	best, bestDist := "", 3
	for r := range read {
		if d := editDistance(name, r); d < bestDist || d == bestDist && r < best {
			best, bestDist = r, d
		}
	}
	return best
}

// editDistance is the Levenshtein distance of two ASCII names.
func editDistance(a, b string) int {
	prev := make([]int, len(b)+1)
	cur := make([]int, len(b)+1)
	for j := range prev {
		prev[j] = j
	}
	for i := 1; i <= len(a); i++ {
		cur[0] = i
		for j := 1; j <= len(b); j++ {
			sub := prev[j-1]
			if a[i-1] != b[j-1] {
				sub++
			}
			cur[j] = min(prev[j]+1, cur[j-1]+1, sub)
		}
		prev, cur = cur, prev
	}
	return prev[len(b)]
}
