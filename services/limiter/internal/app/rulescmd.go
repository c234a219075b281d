package app

import (
	"bytes"
	"fmt"
	"io"
	"os"
	"strconv"

	"go.yaml.in/yaml/v3"

	"kurz.dev/services/limiter/internal/ratelimit"
	"kurz.dev/services/limiter/internal/rulestore"
)

const rulesUsage = `usage: limiter rules from-envoy FILE|DIR

Prints the kurz rules an envoyproxy/ratelimit configuration (one file, or a
directory of *.yaml files, one domain each) translates to, as
KURZ_LIMITER_RULES_FILE would read it: review them, and move to kurz's
format when you are ready. KURZ_LIMITER_ENVOY_MERGE_DOMAINS=true merges
the files of one domain, as the limiter would. Refused configurations say
which descriptor and why; see services/limiter/README.md, "Coming from
envoyproxy/ratelimit".
`

// RulesCommand runs `limiter rules ARGS...` and returns the exit code: 0,
// 1 when the configuration is refused, 2 for a usage error.
func RulesCommand(args []string, stdout, stderr io.Writer) int {
	if len(args) == 1 && (args[0] == "-h" || args[0] == "--help" || args[0] == "help") {
		fmt.Fprint(stdout, rulesUsage)
		return 0
	}
	if len(args) != 2 || args[0] != "from-envoy" {
		fmt.Fprint(stderr, rulesUsage)
		return 2
	}
	// As the limiter would read it: with its MERGE_DOMAIN_CONFIG choice.
	merge, err := strconv.ParseBool(cmpOr(os.Getenv("KURZ_LIMITER_ENVOY_MERGE_DOMAINS"), "false"))
	if err != nil {
		fmt.Fprintf(stderr, "limiter rules from-envoy: KURZ_LIMITER_ENVOY_MERGE_DOMAINS must be true or false\n")
		return 2
	}
	cfg, err := rulestore.ReadEnvoy(args[1], rulestore.EnvoyOptions{MergeDomains: merge})
	if err == nil {
		_, err = ratelimit.Compile(cfg)
	}
	if err != nil {
		fmt.Fprintf(stderr, "limiter rules from-envoy: %v\n", err)
		return 1
	}
	var out bytes.Buffer
	fmt.Fprintf(&out, "# kurz rules translated from envoyproxy/ratelimit configuration %s\n# by `limiter rules from-envoy`: fixed windows, failing open.\n", args[1])
	enc := yaml.NewEncoder(&out)
	enc.SetIndent(2)
	if err := enc.Encode(struct {
		Domains map[string]ratelimit.DomainSpec `yaml:"domains"`
	}{cfg.Domains}); err != nil {
		fmt.Fprintf(stderr, "limiter rules from-envoy: %v\n", err)
		return 1
	}
	if _, err := stdout.Write(out.Bytes()); err != nil {
		return 1
	}
	return 0
}

// cmpOr is s, or or when s is empty.
func cmpOr(s, or string) string {
	if s == "" {
		return or
	}
	return s
}
