package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"net/url"
	"runtime"
	"runtime/debug"
	"strings"
	"text/tabwriter"
	"time"
)

// version is kurzctl's version, set at build time with
// -ldflags "-X main.version=v1.2.3".
var version = "dev"

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
}

// globalFlags documents the global flags once, for every help text (never
// with their values: they may be secrets).
var globalFlags = []struct{ name, usage string }{
	{"--url URL", "the gateway's base URL (env KURZ_URL; default " + defaultURL + ")"},
	{"--api-key KEY", "a tenant's API key, for links and stats (env KURZ_API_KEY)"},
	{"--admin-token TOKEN", "the gateway's admin token, for tenants and keys (env KURZ_ADMIN_TOKEN)"},
	{"--limiter ADDR", "the limiter's gRPC address, for quota (env KURZ_LIMITER_ADDR; default " + defaultLimiter + ")"},
	{"-o, --output FORMAT", "table (for people) or json (the API's JSON, one document, for scripts)"},
	{"--timeout DURATION", "bound on each call to a service (default 30s; 0: none)"},
}

func isGlobalFlag(name string) bool {
	switch name {
	case "url", "api-key", "admin-token", "limiter", "output", "o", "timeout":
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

// resolveGlobals fills the settings no flag gave from the environment and
// the defaults, and checks them.
func (c *cli) resolveGlobals(cmd string) error {
	g := &c.g
	fromEnv := func(dst *string, name, def string) {
		if *dst == "" {
			if v, ok := c.lookupEnv(name); ok && v != "" {
				*dst = v
			} else {
				*dst = def
			}
		}
	}
	fromEnv(&g.url, "KURZ_URL", defaultURL)
	fromEnv(&g.apiKey, "KURZ_API_KEY", "")
	fromEnv(&g.adminToken, "KURZ_ADMIN_TOKEN", "")
	fromEnv(&g.limiter, "KURZ_LIMITER_ADDR", defaultLimiter)
	if g.output == "" {
		g.output = "table"
	}
	if g.output != "table" && g.output != "json" {
		return usagef(cmd, "--output %q: want table or json", g.output)
	}
	u, err := url.Parse(g.url)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return usagef(cmd, "--url %q: want the gateway's base URL, e.g. %s", g.url, defaultURL)
	}
	g.url = strings.TrimRight(g.url, "/")
	if g.timeout < 0 {
		return usagef(cmd, "--timeout must not be negative")
	}
	return nil
}

// json reports whether the output is JSON, for scripts.
func (c *cli) json() bool { return c.g.output == "json" }

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

func (c *cli) version() error {
	rev := ""
	if info, ok := debug.ReadBuildInfo(); ok {
		for _, s := range info.Settings {
			if s.Key == "vcs.revision" && len(s.Value) >= 12 {
				rev = ", commit " + s.Value[:12]
			}
		}
	}
	if c.json() {
		return writeJSONValue(c.stdout, map[string]string{"version": version, "go": runtime.Version(), "commit": strings.TrimPrefix(rev, ", commit ")})
	}
	fmt.Fprintf(c.stdout, "kurzctl %s (%s%s)\n", version, runtime.Version(), rev)
	return nil
}
