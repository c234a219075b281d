package doccheck

import (
	"fmt"
	"regexp"
	"slices"
)

// row matches a markdown table row that starts with a backquoted KURZ_*
// variable and a backquoted default: "| `KURZ_X` | `5s` | ...".
var row = regexp.MustCompile("(?m)^\\| `(KURZ_[A-Z0-9_]+)` \\| `([^`]*)` \\|")

// defaults reads the variables and defaults of a document's table rows.
func defaults(doc []byte) map[string][]string {
	out := map[string][]string{}
	for _, m := range row.FindAllSubmatch(doc, -1) {
		out[string(m[1])] = append(out[string(m[1])], string(m[2]))
	}
	return out
}

// staleDefaults names each variable a hand-written table (a service README)
// gives a default the generated configuration page does not have, or that
// the page does not know at all.
func staleDefaults(readme, generated []byte) []string {
	truth := defaults(generated)
	var out []string
	for name, given := range defaults(readme) {
		want, ok := truth[name]
		if !ok {
			out = append(out, fmt.Sprintf("%s: no such variable in docs/configuration.md", name))
			continue
		}
		for _, g := range given {
			if !slices.Contains(want, g) {
				out = append(out, fmt.Sprintf("%s: default `%s`, docs/configuration.md says %q", name, g, want))
			}
		}
	}
	return out
}
