package main

import (
	"cmp"
	"fmt"
	"io"
	"net"
	"net/url"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

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
	plainHTTP  bool   // credentials and link passwords may go over http:// to another machine
	config     string // the config file (--config)
	context    string // the context to use (--context)
	// adminTokenAlias is set when the admin token came from the deprecated
	// KURZ_ADMIN_TOKEN: the call that uses it warns.
	adminTokenAlias bool
	// withheldKey and withheldToken name the context whose API key or
	// admin token was not sent because --url or KURZ_URL points elsewhere;
	// the refusal says so.
	withheldKey, withheldToken string
}

// adminTokenEnv is the admin token's variable: the gateway's own name for
// it, so one variable serves both. deprecatedAdminTokenEnv is read too,
// with a warning.
const (
	adminTokenEnv           = "KURZ_GATEWAY_ADMIN_TOKEN"
	deprecatedAdminTokenEnv = "KURZ_ADMIN_TOKEN"
)

// plainHTTPEnv is --plain-http's variable, for a pod or a job that calls a
// gateway inside its network with the settings in its environment.
const plainHTTPEnv = "KURZ_PLAIN_HTTP"

// defineGlobals defines the flags every command takes, bound to c.g: the
// root's persistent flags. Their defaults are never secrets (c.g holds no
// credential yet when they are defined).
func (c *cli) defineGlobals(pf *pflag.FlagSet) {
	g := &c.g
	pf.StringVar(&g.url, "url", "", "the gateway's base `URL` (env KURZ_URL; default "+defaultURL+")")
	// A secret given as a flag is in the command line, which other users
	// of the machine read in ps: the help points at the safer ways.
	pf.StringVar(&g.apiKey, "api-key", "", "a tenant's API `key`, for links and stats (env KURZ_API_KEY; as a flag it shows in ps: prefer the env, or a context made with config set-context --api-key-stdin)")
	pf.StringVar(&g.adminToken, "admin-token", "", "the gateway's admin `token`, for tenants and keys (env "+adminTokenEnv+"; as a flag it shows in ps: prefer the env, or a context made with config set-context --admin-token-stdin)")
	pf.StringVar(&g.limiter, "limiter", "", "the limiter's gRPC `address`, for quota (env KURZ_LIMITER_ADDR; default "+defaultLimiter+")")
	pf.StringVar(&g.context, "context", "", "the config file's `context` to take settings from (env KURZ_CONTEXT; default its current-context)")
	pf.StringVar(&g.config, "config", "", "the config `file` (env KURZ_CONFIG; default $XDG_CONFIG_HOME/kurz/config.yaml)")
	pf.StringVarP(&g.output, "output", "o", "table", "output `format`: table (for people), json (the API's JSON, one document, for scripts) or yaml (the same as YAML)")
	pf.DurationVar(&g.timeout, "timeout", defaultTimeout, "bound on each call to a service; on links export, on each pause of its answer (0: none)")
	pf.BoolVar(&g.plainHTTP, "plain-http", false, "send the API key, admin token or a link's password over an http:// URL of another machine (env "+plainHTTPEnv+"; refused by default: use https)")
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
	// fromEnv reports whether the context's value was taken.
	fromEnv := func(dst *string, name, fromContext, def string) bool {
		switch v, ok := c.lookupEnv(name); {
		case *dst != "":
		case ok && v != "":
			*dst = v
		case fromContext != "":
			*dst = fromContext
			return true
		default:
			*dst = def
		}
		return false
	}
	fromEnv(&g.url, "KURZ_URL", k.URL, defaultURL)
	if err := checkURL(cmd.name, g.url); err != nil {
		return err
	}
	g.url = strings.TrimRight(g.url, "/")
	// A context's credentials are for its own gateway (the default URL
	// when it names none): a --url or KURZ_URL pointing elsewhere gets
	// only the credentials given with it, as gh keeps a token per host.
	ownGateway := strings.TrimRight(cmp.Or(k.URL, defaultURL), "/") == g.url
	contextKey, contextToken := k.APIKey, k.AdminToken
	if !ownGateway {
		if contextKey != "" {
			g.withheldKey = k.Name
		}
		if contextToken != "" {
			g.withheldToken = k.Name
		}
		contextKey, contextToken = "", ""
	}
	fromEnv(&g.apiKey, "KURZ_API_KEY", contextKey, "")
	if g.adminToken == "" {
		if v, ok := c.lookupEnv(adminTokenEnv); !ok || v == "" {
			if v, ok := c.lookupEnv(deprecatedAdminTokenEnv); ok && v != "" {
				g.adminToken, g.adminTokenAlias = v, true
			}
		}
	}
	fromEnv(&g.adminToken, adminTokenEnv, contextToken, "")
	fromEnv(&g.limiter, "KURZ_LIMITER_ADDR", k.Limiter, defaultLimiter)
	// --plain-http, else KURZ_PLAIN_HTTP, else the context's plain-http,
	// which like its credentials holds for its own gateway only.
	if !c.flagChanged("plain-http") {
		switch v, ok := c.lookupEnv(plainHTTPEnv); {
		case ok && v != "":
			b, err := strconv.ParseBool(v)
			if err != nil {
				return usagef(cmd.name, "%s=%q: want true or false", plainHTTPEnv, v)
			}
			g.plainHTTP = b
		case ownGateway:
			g.plainHTTP = k.PlainHTTP
		}
	}
	return nil
}

// flagChanged reports whether the command line set the global flag name.
func (c *cli) flagChanged(name string) bool {
	if c.root == nil {
		return false
	}
	f := c.root.PersistentFlags().Lookup(name)
	return f != nil && f.Changed
}

// checkURL checks a gateway base URL. A user or password in it
// (https://admin:pw@host) is refused, not echoed: kurzctl would show the URL
// as it is in config view, get-contexts and errors, and the gateway takes
// no credential there (the API key goes in a header).
func checkURL(cmd, s string) error {
	u, err := url.Parse(s)
	if err == nil && u.User != nil {
		u.User = nil
		return usagef(cmd, "--url: remove the user and password from the URL of %s: kurzctl shows the URL as it is (config view, errors), and the gateway reads no credential there; give the API key with --api-key-stdin or KURZ_API_KEY", u)
	}
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return usagef(cmd, "--url %q: want the gateway's base URL, e.g. %s", s, defaultURL)
	}
	return nil
}

// exposes reports whether a credential sent to the gateway base URL
// would cross the network in clear: an http:// URL whose host is not this
// machine (localhost or a loopback address). "localhost." is not this
// machine: a name ending in a dot is looked up in DNS, not /etc/hosts,
// and whoever answers decides where the credential goes.
func exposes(base string) bool {
	u, err := url.Parse(base)
	if err != nil || u.Scheme != "http" {
		return false
	}
	host := u.Hostname()
	if ip := net.ParseIP(host); ip != nil {
		return !ip.IsLoopback()
	}
	return !strings.EqualFold(host, "localhost")
}

// json reports whether the output is for scripts: JSON, or YAML, which
// runCommand converts the JSON into.
func (c *cli) json() bool { return c.g.output == "json" || c.g.output == "yaml" }

// visited returns the flags the command line set.
func visited(fs *pflag.FlagSet) map[string]bool {
	set := map[string]bool{}
	fs.Visit(func(f *pflag.Flag) { set[f.Name] = true })
	return set
}

// printOverview lists every command.
func (c *cli) printOverview(w io.Writer, root *cobra.Command) {
	fmt.Fprint(w, `kurzctl is kurz's command-line client: links, click statistics, imports and
exports through the gateway; tenants, API keys and the limiter's rules
through its admin API; quotas straight from the limiter.

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
	printGlobalFlags(w, root)
	fmt.Fprint(w, `
Exit status: 0 on success, 1 when a service refuses or fails (its message on
stderr), 2 for a mistake on the command line, 3 when links import made some
rows but not all (the failed rows in its report).

Run 'kurzctl help <command>' (or 'kurzctl <command> -h') for a command's
flags and examples.
`)
}

func printGlobalFlags(w io.Writer, root *cobra.Command) {
	fmt.Fprintf(w, "Global flags (before or after the command):\n%s", root.PersistentFlags().FlagUsages())
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
func (c *cli) printCommandHelp(w io.Writer, cmd *command, cc *cobra.Command) {
	fmt.Fprintf(w, "Usage: kurzctl %s", cmd.name)
	if cmd.args != "" {
		fmt.Fprintf(w, " %s", cmd.args)
	}
	fmt.Fprintf(w, " [flags]\n\n%s\n", strings.TrimSpace(cmd.help))
	own := pflag.NewFlagSet(cmd.name, pflag.ContinueOnError)
	cc.NonInheritedFlags().VisitAll(func(f *pflag.Flag) {
		if f.Name != "help" {
			own.AddFlag(f)
		}
	})
	if own.HasFlags() {
		fmt.Fprintf(w, "\nFlags:\n%s", own.FlagUsages())
	}
	fmt.Fprint(w, "\n")
	printGlobalFlags(w, cc.Root())
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
