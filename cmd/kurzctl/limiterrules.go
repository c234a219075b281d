package main

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"mime/multipart"
	"net/http"
	"net/url"
	"os"
	"strings"

	"github.com/spf13/pflag"

	"kurz.dev/pkg/envoydir"
)

// The limiter's rules, plans and plan limits as a file (GET and PUT
// /v1/admin/rules): `rules get` and `rules apply`. Not to be confused with
// a link's redirect rules (links rules, links set-rules: rules.go).

// maxLimiterRulesFile bounds a limiter rules file, as the gateway does.
const maxLimiterRulesFile = 1 << 20

// rulesChange is one change of an apply, as the gateway answers it.
type rulesChange struct {
	Kind   string   `json:"kind"`
	Name   string   `json:"name"`
	Change string   `json:"change"`
	Fields []string `json:"fields"`
}

func limiterRulesCommands() []*command {
	return []*command{
		{
			name: "rules get", summary: "print the limiter's rules and plans as a rules file", maxArgs: 0,
			help: `Prints the rules, plans and plan limits every limiter decides by, in the
limiter's rules-file format (that of bootstrap.yaml and
KURZ_LIMITER_RULES_FILE): keep it in git, edit it, and give it to rules
apply. Tenants' plans are left out (tenants set-plan changes them). The
rules' etag is printed on stderr, for rules apply --if-match. -o json
prints the same as JSON. ` + adminHelpNote + `

Examples:
  kurzctl rules get > rules.yaml
  kurzctl rules get -o json`,
			setup: func(c *cli, fs *pflag.FlagSet) func([]string) error {
				return func([]string) error { return c.rulesGet() }
			},
		},
		{
			name: "rules apply", args: "<file>|<dir>|-", minArgs: 1, maxArgs: 1,
			summary: "apply a rules file to the limiter's rules and plans",
			help: `Applies a rules file (YAML or JSON, at most 1 MiB; - reads stdin): each
domain in it replaces that domain whole (its defaults, its rules and their
order), each plan that plan's limits. Domains and plans the file does not
name are left as they are; --prune deletes them. Nothing is written unless
the whole result compiles with the limiter's own compiler (the error names
the domain, rule or plan and the field); every limiter decides by it within
a second. Prints what changed, and the rules' new etag. --dry-run prints
what would change and writes nothing; --if-match applies only if the rules
are still at the etag rules get printed. A plan some tenant is on is not
deleted (move them first with tenants set-plan).

An envoyproxy/ratelimit file (top-level domain and descriptors) applies
too, as its translation (what limiter rules from-envoy prints): its domain
replaces the limiter's domain of that name whole, a shipped one (api,
links.create, ...) included, and descriptors kurz would decide otherwise
than envoyproxy/ratelimit are refused, named. The output then says the
file was read as envoyproxy/ratelimit's.

A directory of envoyproxy/ratelimit files (its runtime config directory,
one domain a file, a mounted ConfigMap too) applies in one step, read as
the limiter reads one for KURZ_LIMITER_RULES_FILE: dot entries (..data)
skipped, links followed; a subdirectory, a file that is not
envoyproxy/ratelimit's (a kurz rules file, a README) and the same domain in
two files are refused (unless --merge-domains, envoyproxy/ratelimit's
MERGE_DOMAIN_CONFIG: the files of one domain merged, the same top-level
descriptor in two of them refused); at most 1,000 files, 1 MiB in all.
--prune then keeps every file's domains. ` + adminHelpNote + `

Examples:
  kurzctl rules get > rules.yaml
  kurzctl rules apply rules.yaml --dry-run
  kurzctl rules apply rules.yaml --if-match AbCd1234eFgH5678
  kurzctl rules apply - --prune < rules.yaml
  kurzctl rules apply ratelimit-config/edge.yaml --dry-run
  kurzctl rules apply ratelimit-config/ --dry-run`,
			setup: func(c *cli, fs *pflag.FlagSet) func([]string) error {
				dryRun := fs.Bool("dry-run", false, "print what would change; write nothing")
				prune := fs.Bool("prune", false, "delete the domains and plans the file does not name")
				ifMatch := fs.String("if-match", "", "apply only if the rules are still at this `etag` (from rules get)")
				merge := fs.Bool("merge-domains", false, "for a directory: merge the files of one domain (envoyproxy/ratelimit's MERGE_DOMAIN_CONFIG)")
				return func(args []string) error {
					return c.rulesApply(args[0], rulesApplyOptions{dryRun: *dryRun, prune: *prune, ifMatch: *ifMatch, mergeDomains: *merge})
				}
			},
		},
	}
}

// rulesGet prints the rules file (or its JSON) and its etag on stderr.
func (c *cli) rulesGet() error {
	const cmd = "rules get"
	gw, err := c.gateway(cmd, adminAuth)
	if err != nil {
		return err
	}
	if c.g.output == "json" {
		gw.accept = "application/json"
	} else {
		gw.accept = "application/yaml"
	}
	resp, err := gw.send(c.ctx, "GET", "/v1/admin/rules", nil, nil, "")
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	raw, err := readAnswer(resp, "GET", "/v1/admin/rules")
	if err != nil {
		return err
	}
	if c.g.output == "json" {
		err = writeRaw(c.stdout, raw)
	} else {
		_, err = c.stdout.Write(raw)
	}
	if err != nil {
		return err
	}
	if etag := strings.Trim(resp.Header.Get("ETag"), `"`); etag != "" {
		fmt.Fprintf(c.stderr, "etag: %s (rules apply --if-match %s)\n", etag, etag)
	}
	return nil
}

// rulesApplyOptions are rules apply's flags.
type rulesApplyOptions struct {
	dryRun, prune, mergeDomains bool
	ifMatch                     string
}

// rulesApply applies the file name (- for stdin), or the directory of
// envoyproxy/ratelimit files name, and prints the changes.
func (c *cli) rulesApply(name string, o rulesApplyOptions) error {
	dryRun, prune, ifMatch := o.dryRun, o.prune, o.ifMatch
	const cmd = "rules apply"
	var body []byte
	var ctype string
	info, err := os.Stat(name)
	isDir := name != "-" && err == nil && info.IsDir()
	if o.mergeDomains && !isDir {
		return usagef(cmd, "--merge-domains merges the files of a directory: give one (%s is not)", name)
	}
	if isDir {
		body, ctype, err = dirForm(cmd, name)
		if err != nil {
			return err
		}
	} else {
		body, err = c.readLimiterRules(cmd, name)
		if err != nil {
			return err
		}
		ctype = "application/yaml"
		if t := bytes.TrimSpace(body); len(t) > 0 && t[0] == '{' {
			ctype = "application/json"
		}
	}
	gw, err := c.gateway(cmd, adminAuth)
	if err != nil {
		return err
	}
	if ifMatch != "" {
		if !strings.HasPrefix(ifMatch, `"`) && ifMatch != "*" && !strings.HasPrefix(ifMatch, "W/") {
			ifMatch = `"` + ifMatch + `"`
		}
		gw.ifMatch = ifMatch
	}
	query := url.Values{}
	if dryRun {
		query.Set("dry_run", "true")
	}
	if prune {
		query.Set("prune", "true")
	}
	if o.mergeDomains {
		query.Set("merge_domains", "true")
	}
	resp, err := gw.send(c.ctx, http.MethodPut, "/v1/admin/rules", query, bytes.NewReader(body), ctype)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	raw, err := readAnswer(resp, http.MethodPut, "/v1/admin/rules")
	if err != nil {
		return err
	}
	if c.json() {
		return writeRaw(c.stdout, raw)
	}
	var out struct {
		DryRun  bool          `json:"dryRun"`
		ETag    string        `json:"etag"`
		Format  string        `json:"format"`
		Changes []rulesChange `json:"changes"`
	}
	if err := json.Unmarshal(raw, &out); err != nil {
		return fmt.Errorf("PUT /v1/admin/rules: the answer is not an apply's: %w", err)
	}
	return printRulesChanges(c.stdout, out.DryRun, out.ETag, out.Format, out.Changes)
}

// dirForm reads the directory dir of envoyproxy/ratelimit files as the
// limiter's file source reads one (envoydir.Read: dot entries skipped,
// links followed, a subdirectory refused, 1 MiB in all) and makes of its
// files a multipart/form-data body, one part per file, which the gateway
// applies in one step. Which are envoyproxy/ratelimit files the limiter
// judges, as it does for its own directory.
func dirForm(cmd, dir string) ([]byte, string, error) {
	files, err := envoydir.Read(dir)
	if err != nil {
		return nil, "", usagef(cmd, "%v", err)
	}
	var b bytes.Buffer
	w := multipart.NewWriter(&b)
	for _, f := range files {
		part, err := w.CreateFormFile("file", f.Name)
		if err != nil {
			return nil, "", err
		}
		if _, err := part.Write(f.Data); err != nil {
			return nil, "", err
		}
	}
	if err := w.Close(); err != nil {
		return nil, "", err
	}
	return b.Bytes(), w.FormDataContentType(), nil
}

// printRulesChanges writes one line per change, then the etag; first, for
// an envoyproxy/ratelimit file, that it was read as one, so that its
// changes (kurz rules, named as the translation names them) read as what
// they are.
func printRulesChanges(w io.Writer, dryRun bool, etag, format string, changes []rulesChange) error {
	var b strings.Builder
	if format == "envoy" {
		b.WriteString("read as an envoyproxy/ratelimit file, applied as its translation (limiter rules from-envoy prints it)\n")
	}
	for _, ch := range changes {
		fmt.Fprintf(&b, "%-6s %s %s", ch.Kind, ch.Name, ch.Change)
		if len(ch.Fields) > 0 {
			fmt.Fprintf(&b, ": %s", strings.Join(ch.Fields, ", "))
		}
		b.WriteByte('\n')
	}
	switch {
	case len(changes) == 0:
		b.WriteString("no changes\n")
	case dryRun:
		b.WriteString("dry run: nothing written\n")
	}
	if dryRun {
		fmt.Fprintf(&b, "etag after: %s\n", etag)
	} else {
		fmt.Fprintf(&b, "etag: %s\n", etag)
	}
	_, err := io.WriteString(w, b.String())
	return err
}

// readLimiterRules reads the rules file name (- for stdin), at most
// maxLimiterRulesFile bytes; the limiter judges the rest.
func (c *cli) readLimiterRules(cmd, name string) ([]byte, error) {
	b, err := c.readInput(cmd, name, maxLimiterRulesFile)
	if err != nil {
		return nil, err
	}
	if len(bytes.TrimSpace(b)) == 0 {
		return nil, usagef(cmd, "%s is empty: give a rules file (rules get prints the rules in force)", name)
	}
	return b, nil
}
