package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"net/url"
	"strings"
	"text/tabwriter"
	"time"

	"kurz.dev/pkg/buildinfo"
)

// Defaults of the global settings, when neither a flag nor the environment
// gives one: the addresses make up uses.
const (
	defaultURL     = "http://127.0.0.1:8080"
	defaultLimiter = "127.0.0.1:9091"
	defaultTimeout = 30 * time.Second
)

// globals are the settings every command takes, as flags or from the
// environment.
type globals struct {
	url        string
	apiKey     string
	adminToken string
	limiter    string
	output     string
	timeout    time.Duration
	config     string // the config file (--config)
	context    string // the context to use (--context)
	// adminTokenAlias is set when the admin token came from the deprecated
	// KURZ_ADMIN_TOKEN: the call that uses it warns.
	adminTokenAlias bool
}

// adminTokenEnv is the admin token's variable: the gateway's own name for
// it, so one variable serves both. deprecatedAdminTokenEnv is read too,
// with a warning.
const (
	adminTokenEnv           = "KURZ_GATEWAY_ADMIN_TOKEN"
	deprecatedAdminTokenEnv = "KURZ_ADMIN_TOKEN"
)

// globalFlags documents the global flags once, for every help text (never
// with their values: they may be secrets).
var globalFlags = []struct{ name, usage string }{
	{"--url URL", "the gateway's base URL (env KURZ_URL; default " + defaultURL + ")"},
	{"--api-key KEY", "a tenant's API key, for links and stats (env KURZ_API_KEY)"},
	{"--admin-token TOKEN", "the gateway's admin token, for tenants and keys (env " + adminTokenEnv + ")"},
	{"--limiter ADDR", "the limiter's gRPC address, for quota (env KURZ_LIMITER_ADDR; default " + defaultLimiter + ")"},
	{"--context NAME", "the config file's context to take settings from (env KURZ_CONTEXT; default its current-context)"},
	{"--config FILE", "the config file (env KURZ_CONFIG; default $XDG_CONFIG_HOME/kurz/config.yaml)"},
	{"-o, --output FORMAT", "table (for people), json (the API's JSON, one document, for scripts) or yaml (the same as YAML)"},
	{"--timeout DURATION", "bound on each call to a service (default 30s; 0: none)"},
}

func isGlobalFlag(name string) bool {
	switch name {
	case "url", "api-key", "admin-token", "limiter", "output", "o", "timeout", "config", "context":
		return true
	}
	return false
}

// flagSet returns a FlagSet with the global flags, bound to c.g with their
// current values (so flags given before the command keep theirs), for
// cmd's own flags to be added to. It never prints: parse reports errors.
func (c *cli) flagSet(name string) *flag.FlagSet {
	fs := flag.NewFlagSet("kurzctl "+name, flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	fs.Usage = func() {}
	g := &c.g
	fs.StringVar(&g.url, "url", g.url, "")
	fs.StringVar(&g.apiKey, "api-key", g.apiKey, "")
	fs.StringVar(&g.adminToken, "admin-token", g.adminToken, "")
	fs.StringVar(&g.limiter, "limiter", g.limiter, "")
	fs.StringVar(&g.output, "output", g.output, "")
	fs.StringVar(&g.output, "o", g.output, "")
	fs.DurationVar(&g.timeout, "timeout", g.timeout, "")
	fs.StringVar(&g.config, "config", g.config, "")
	fs.StringVar(&g.context, "context", g.context, "")
	return fs
}

// parseLeading parses the global flags before the command's name.
func (c *cli) parseLeading(fs *flag.FlagSet, args []string) ([]string, error) {
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return nil, err
		}
		return nil, usagef("", "%v", err)
	}
	return fs.Args(), nil
}

// parse parses a command's flags wherever they stand among its arguments
// (stdlib flag stops at the first argument); "--" ends the flags.
func (c *cli) parse(fs *flag.FlagSet, cmd *command, args []string) ([]string, error) {
	var pos []string
	for {
		if err := fs.Parse(args); err != nil {
			if errors.Is(err, flag.ErrHelp) {
				return nil, err
			}
			return nil, usagef(cmd.name, "%v", err)
		}
		rest := fs.Args()
		if len(rest) == 0 {
			return pos, nil
		}
		if n := len(args) - len(rest); n > 0 && args[n-1] == "--" {
			return append(pos, rest...), nil
		}
		pos = append(pos, rest[0])
		args = rest[1:]
	}
}

// resolveGlobals fills the settings no flag gave from the environment, the
// config file's context and the defaults, and checks them. An offline
// command (config, version, ...) calls no service: only its output format
// is resolved.
func (c *cli) resolveGlobals(cmd *command) error {
	g := &c.g
	if g.output == "" {
		g.output = "table"
	}
	if g.output != "table" && g.output != "json" && g.output != "yaml" {
		return usagef(cmd.name, "--output %q: want table, json or yaml", g.output)
	}
	if g.timeout < 0 {
		return usagef(cmd.name, "--timeout must not be negative")
	}
	if cmd.offline {
		return nil
	}
	k, err := c.currentContext(cmd.name)
	if err != nil {
		return err
	}
	if k == nil {
		k = &kurzContext{}
	}
	fromEnv := func(dst *string, name, fromContext, def string) {
		switch v, ok := c.lookupEnv(name); {
		case *dst != "":
		case ok && v != "":
			*dst = v
		case fromContext != "":
			*dst = fromContext
		default:
			*dst = def
		}
	}
	fromEnv(&g.url, "KURZ_URL", k.URL, defaultURL)
	fromEnv(&g.apiKey, "KURZ_API_KEY", k.APIKey, "")
	if g.adminToken == "" {
		if v, ok := c.lookupEnv(adminTokenEnv); !ok || v == "" {
			if v, ok := c.lookupEnv(deprecatedAdminTokenEnv); ok && v != "" {
				g.adminToken, g.adminTokenAlias = v, true
			}
		}
	}
	fromEnv(&g.adminToken, adminTokenEnv, k.AdminToken, "")
	fromEnv(&g.limiter, "KURZ_LIMITER_ADDR", k.Limiter, defaultLimiter)
	if err := checkURL(cmd.name, g.url); err != nil {
		return err
	}
	g.url = strings.TrimRight(g.url, "/")
	return nil
}

// checkURL checks a gateway base URL.
func checkURL(cmd, s string) error {
	u, err := url.Parse(s)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return usagef(cmd, "--url %q: want the gateway's base URL, e.g. %s", s, defaultURL)
	}
	return nil
}

// json reports whether the output is for scripts: JSON, or YAML, which
// runCommand converts the JSON into.
func (c *cli) json() bool { return c.g.output == "json" || c.g.output == "yaml" }

// visited returns the flags the command line set.
func visited(fs *flag.FlagSet) map[string]bool {
	set := map[string]bool{}
	fs.Visit(func(f *flag.Flag) { set[f.Name] = true })
	return set
}

// stringList is a repeatable flag: --tag a --tag b.
type stringList []string

func (l *stringList) String() string { return strings.Join(*l, ",") }

func (l *stringList) Set(s string) error {
	*l = append(*l, s)
	return nil
}

// printOverview lists every command.
func (c *cli) printOverview(w io.Writer) {
	fmt.Fprint(w, `kurzctl is kurz's command-line client: links, click statistics, imports and
exports through the gateway; tenants and API keys through its admin API;
quotas straight from the limiter.

Usage:
  kurzctl [global flags] <command> [arguments] [flags]

Commands:
`)
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	for _, cmd := range commands {
		fmt.Fprintf(tw, "  %s %s\t%s\n", cmd.name, cmd.args, cmd.summary)
	}
	_ = tw.Flush()
	fmt.Fprint(w, "\n")
	printGlobalFlags(w)
	fmt.Fprint(w, `
Exit status: 0 on success, 1 when a service refuses or fails (its message on
stderr), 2 for a mistake on the command line.

Run 'kurzctl help <command>' (or 'kurzctl <command> -h') for a command's
flags and examples.
`)
}

func printGlobalFlags(w io.Writer) {
	fmt.Fprint(w, "Global flags (before or after the command):\n")
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	for _, f := range globalFlags {
		fmt.Fprintf(tw, "  %s\t%s\n", f.name, f.usage)
	}
	_ = tw.Flush()
}

// printGroup lists the commands of one group ("links").
func (c *cli) printGroup(w io.Writer, group string) {
	fmt.Fprintf(w, "Usage: kurzctl %s <command> [arguments] [flags]\n\nCommands:\n", group)
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	for _, cmd := range commands {
		if strings.HasPrefix(cmd.name, group+" ") {
			fmt.Fprintf(tw, "  %s %s\t%s\n", cmd.name, cmd.args, cmd.summary)
		}
	}
	_ = tw.Flush()
	fmt.Fprintf(w, "\nRun 'kurzctl help %s <command>' for a command's flags and examples.\n", group)
}

// printCommandHelp shows one command: usage, description with examples,
// its own flags, then the global ones.
func (c *cli) printCommandHelp(w io.Writer, cmd *command, fs *flag.FlagSet) {
	fmt.Fprintf(w, "Usage: kurzctl %s", cmd.name)
	if cmd.args != "" {
		fmt.Fprintf(w, " %s", cmd.args)
	}
	fmt.Fprintf(w, " [flags]\n\n%s\n", strings.TrimSpace(cmd.help))
	var own []*flag.Flag
	fs.VisitAll(func(f *flag.Flag) {
		if !isGlobalFlag(f.Name) && !strings.HasPrefix(f.Usage, "short for ") {
			own = append(own, f)
		}
	})
	if len(own) > 0 {
		fmt.Fprint(w, "\nFlags:\n")
		tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
		for _, f := range own {
			typ, usage := flag.UnquoteUsage(f)
			dash := "--"
			if len(f.Name) == 1 {
				dash = "-"
			}
			name := dash + f.Name
			if typ != "" {
				name += " " + typ
			}
			if f.DefValue != "" && f.DefValue != "false" && f.DefValue != "0" && f.DefValue != "[]" {
				usage += fmt.Sprintf(" (default %s)", f.DefValue)
			}
			fmt.Fprintf(tw, "  %s\t%s\n", name, usage)
		}
		_ = tw.Flush()
	}
	fmt.Fprint(w, "\n")
	printGlobalFlags(w)
}

// version prints the build information (pkg/buildinfo): the release
// version make release links in ("dev" otherwise), the commit and the build
// date.
func (c *cli) version() error {
	bi := buildinfo.Get()
	if c.json() {
		return writeJSONValue(c.stdout, bi)
	}
	var extra string
	if bi.Commit != "" {
		extra += ", commit " + bi.ShortCommit()
	}
	if bi.Date != "" {
		extra += ", built " + bi.Date
	}
	_, err := fmt.Fprintf(c.stdout, "kurzctl %s (%s%s)\n", bi.Version, bi.Go, extra)
	return err
}
