package main

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net/url"
	"strings"
	"text/tabwriter"

	"github.com/spf13/pflag"
	"google.golang.org/protobuf/encoding/protojson"
	"sigs.k8s.io/yaml"

	shortenerv1 "kurz.dev/gen/kurz/shortener/v1"
)

// maxRulesFile bounds a rules file: the API bounds what it holds far
// below this.
const maxRulesFile = 1 << 20

func ruleCommands() []*command {
	return []*command{
		{
			name: "links rules", args: "<code>", minArgs: 1, maxArgs: 1,
			summary: "show a link's redirect rules and A/B-test variants",
			help: `Shows a link's redirect rules, in the order they are tried, and its
variants with their weights. -o json prints them as "links set-rules" reads
them.

Examples:
  kurzctl links rules 1000abc
  kurzctl links rules 1000abc -o yaml > rules.yaml`,
			setup: setupLinksRules,
		},
		{
			name: "links set-rules", args: "<code> [<file>]", minArgs: 1, maxArgs: 2,
			summary: "set a link's redirect rules and variants from a JSON or YAML file",
			help: `Reads rules and variants from <file> (JSON or YAML; - for stdin) and sets
them on the link. The file is an object with "rules", "variants" or both, in
the API's JSON form (docs/api.md); a key it leaves out is left as it is, an
empty list removes them. --clear removes both. --if-match sets them only
while the link still has the etag given (links get shows it).

Example file:
` + indent(rulesExample, "  ") + `
Examples:
  kurzctl links set-rules 1000abc rules.yaml
  kurzctl links rules 1000abc -o json | kurzctl links set-rules 1000xyz -
  kurzctl links set-rules 1000abc --clear
  kurzctl links set-rules launch rules.yaml --domain go.example.com
  kurzctl links set-rules 1000abc rules.yaml --if-match "$ETAG"`,
			setup: setupLinksSetRules,
		},
	}
}

// rulesExample is the example file of "links set-rules --help", which
// TestLinkRules sets on a link.
const rulesExample = `rules:
  - name: ios-de
    conditions: [{devices: [ios]}, {languages: [de]}]
    url: https://example.com/de/app
  - name: office
    conditions: [{cidrs: ["203.0.113.0/24"]}]
    url: https://intranet.example.com/
variants:
  - {name: a, url: "https://example.com/landing-a", weight: 1}
  - {name: b, url: "https://example.com/landing-b", weight: 1}
`

// indent puts prefix before every line of s.
func indent(s, prefix string) string {
	var b strings.Builder
	for line := range strings.Lines(s) {
		b.WriteString(prefix + line)
	}
	return b.String()
}

func setupLinksRules(c *cli, fs *pflag.FlagSet) func([]string) error {
	domain := domainFlag(fs)
	return func(args []string) error {
		gw, err := c.gateway("links rules", apiKeyAuth)
		if err != nil {
			return err
		}
		var link shortenerv1.Link
		if _, err := gw.callProto(c.ctx, "GET", "/v1/links/"+url.PathEscape(args[0]), domainQuery(*domain), nil, &link); err != nil {
			return err
		}
		if c.json() {
			return writeRules(c.stdout, &link)
		}
		return printRules(c.stdout, &link)
	}
}

// writeRules prints a link's rules and variants as one JSON object, the
// form set-rules reads.
func writeRules(w io.Writer, l *shortenerv1.Link) error {
	var raw []byte
	var err error
	if raw, err = protojson.Marshal(&shortenerv1.Link{Rules: l.GetRules(), Variants: l.GetVariants()}); err != nil {
		return err
	}
	var doc map[string]json.RawMessage
	if err := json.Unmarshal(raw, &doc); err != nil {
		return err
	}
	out := map[string]json.RawMessage{"rules": json.RawMessage("[]"), "variants": json.RawMessage("[]")}
	for k, v := range doc {
		out[k] = v
	}
	b, err := json.MarshalIndent(out, "", "  ")
	if err != nil {
		return err
	}
	_, err = fmt.Fprintf(w, "%s\n", b)
	return err
}

func setupLinksSetRules(c *cli, fs *pflag.FlagSet) func([]string) error {
	const cmd = "links set-rules"
	clear := fs.Bool("clear", false, "remove every rule and variant")
	domain := domainFlag(fs)
	ifMatch := ifMatchFlag(fs)
	return func(args []string) error {
		var body []byte
		switch {
		case *clear && len(args) == 2:
			return usagef(cmd, "give a file or --clear, not both")
		case *clear:
			body = []byte(`{"rules":[],"variants":[]}`)
		case len(args) == 1:
			return usagef(cmd, "give the rules file (- for stdin), or --clear")
		default:
			var err error
			if body, err = c.readRulesFile(cmd, args[1]); err != nil {
				return err
			}
		}
		if *domain != "" {
			// The body names the link's custom domain, as links update's does.
			var doc map[string]json.RawMessage
			if err := json.Unmarshal(body, &doc); err != nil {
				return fmt.Errorf("encode request: %w", err)
			}
			d, err := json.Marshal(*domain)
			if err != nil {
				return fmt.Errorf("encode request: %w", err)
			}
			doc["domain"] = d
			if body, err = json.Marshal(doc); err != nil {
				return fmt.Errorf("encode request: %w", err)
			}
		}
		gw, err := c.gateway(cmd, apiKeyAuth)
		if err != nil {
			return err
		}
		gw.ifMatch = quoteETag(*ifMatch)
		path := "/v1/links/" + url.PathEscape(args[0])
		raw, err := gw.call(c.ctx, "PATCH", path, nil, body)
		if err != nil {
			return err
		}
		var link shortenerv1.Link
		if err := unmarshalProto(raw, &link); err != nil {
			return fmt.Errorf("PATCH %s: %w", path, err)
		}
		if c.json() {
			return writeRules(c.stdout, &link)
		}
		return printRules(c.stdout, &link)
	}
}

// readRulesFile reads a rules file (JSON or YAML) into the PATCH body: an
// object with rules, variants or both, nothing else.
func (c *cli) readRulesFile(cmd, name string) ([]byte, error) {
	b, err := c.readInput(cmd, name, maxRulesFile)
	if err != nil {
		return nil, err
	}
	j, err := yaml.YAMLToJSON(b)
	if err != nil {
		return nil, usagef(cmd, "%s is neither JSON nor YAML: %v", name, err)
	}
	var doc map[string]json.RawMessage
	if err := json.Unmarshal(j, &doc); err != nil || doc == nil {
		return nil, usagef(cmd, `%s must hold an object with "rules", "variants" or both`, name)
	}
	for k := range doc {
		if k != "rules" && k != "variants" {
			return nil, usagef(cmd, `%s: unknown key %q: a rules file holds "rules" and "variants"`, name, k)
		}
	}
	if len(doc) == 0 {
		return nil, usagef(cmd, `%s holds neither "rules" nor "variants"`, name)
	}
	// Check the shape here (strictly: unknown fields too), so a typo is
	// named before anything is sent.
	if err := protojson.Unmarshal(j, &shortenerv1.Link{}); err != nil {
		return nil, usagef(cmd, "%s: %v", name, err)
	}
	return j, nil
}

// printRules shows rules and variants as two tables, a blank line apart.
func printRules(w io.Writer, l *shortenerv1.Link) error {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	if len(l.GetRules()) == 0 {
		fmt.Fprintln(tw, "no rules")
	} else {
		fmt.Fprintln(tw, "RULE\tIF (all of)\tURL")
		for _, r := range l.GetRules() {
			var conds []string
			for _, c := range r.GetConditions() {
				conds = append(conds, conditionText(c))
			}
			fmt.Fprintf(tw, "%s\t%s\t%s\n", r.GetName(), strings.Join(conds, "; "), r.GetUrl())
		}
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	fmt.Fprintln(w)
	tw = tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	if len(l.GetVariants()) == 0 {
		fmt.Fprintln(tw, "no variants")
	} else {
		fmt.Fprintln(tw, "VARIANT\tWEIGHT\tURL")
		for _, v := range l.GetVariants() {
			fmt.Fprintf(tw, "%s\t%d\t%s\n", v.GetName(), v.GetWeight(), v.GetUrl())
		}
	}
	return tw.Flush()
}

// conditionText is one condition, for a person.
func conditionText(c *shortenerv1.RuleCondition) string {
	list := func(what string, v []string) string { return what + " " + strings.Join(v, ",") }
	switch {
	case len(c.GetDevices()) > 0:
		return list("device", c.GetDevices())
	case len(c.GetLanguages()) > 0:
		return list("language", c.GetLanguages())
	case c.GetQuery() != nil:
		if c.GetQuery().Value != nil {
			return "query " + c.GetQuery().GetParam() + "=" + c.GetQuery().GetValue()
		}
		return "query " + c.GetQuery().GetParam()
	case len(c.GetCidrs()) > 0:
		return list("ip in", c.GetCidrs())
	case len(c.GetCountries()) > 0:
		return list("country", c.GetCountries())
	case c.GetTime() != nil:
		var b bytes.Buffer
		b.WriteString("time")
		if c.GetTime().GetFrom() != nil {
			b.WriteString(" from " + formatTime(c.GetTime().GetFrom()))
		}
		if c.GetTime().GetUntil() != nil {
			b.WriteString(" until " + formatTime(c.GetTime().GetUntil()))
		}
		return b.String()
	}
	return "?"
}
