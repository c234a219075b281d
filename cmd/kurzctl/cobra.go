package main

import (
	"bytes"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"
)

// kurzctl's commands are one table (commands) that its own parser runs:
// flags anywhere among the arguments, exit status 2 for a mistake on the
// command line. cobraRoot mirrors the table as a cobra command tree, each
// command with its flags, for what cobra does well: shell completion
// (kurzctl completion, and the __complete requests the scripts make) and
// the reference pages in docs/cli (kurzctl docs).

// groupSummaries describe the command groups.
var groupSummaries = map[string]string{
	"links":    "create, list, change and export short links",
	"quota":    "ask the limiter what it would decide",
	"tenants":  "manage tenants (admin)",
	"keys":     "manage tenants' API keys (admin)",
	"config":   "manage the config file's contexts",
	"webhooks": "subscribe URLs to signed link events; see deliveries",
}

// cobraRoot returns kurzctl's command tree for cobra.
func (c *cli) cobraRoot() *cobra.Command {
	root := &cobra.Command{
		Use:   "kurzctl",
		Short: "kurz's command-line client",
		Long: `kurzctl is kurz's command-line client: links, click statistics, imports and
exports through the gateway; tenants and API keys through its admin API;
quotas straight from the limiter.

Settings come from flags, then environment variables, then the config file's
current context, then the defaults. Exit status: 0 on success, 1 when a
service refuses or fails (its message on stderr), 2 for a mistake on the
command line.`,
		SilenceErrors:     true,
		SilenceUsage:      true,
		DisableAutoGenTag: true,
	}
	root.CompletionOptions.DisableDefaultCmd = true
	var g globals
	pf := root.PersistentFlags()
	pf.StringVar(&g.url, "url", "", "the gateway's base URL (env KURZ_URL; default "+defaultURL+")")
	pf.StringVar(&g.apiKey, "api-key", "", "a tenant's API key, for links and stats (env KURZ_API_KEY)")
	pf.StringVar(&g.adminToken, "admin-token", "", "the gateway's admin token, for tenants and keys (env "+adminTokenEnv+")")
	pf.StringVar(&g.limiter, "limiter", "", "the limiter's gRPC address, for quota (env KURZ_LIMITER_ADDR; default "+defaultLimiter+")")
	pf.StringVar(&g.context, "context", "", "the config file's context to take settings from (env KURZ_CONTEXT)")
	pf.StringVar(&g.config, "config", "", "the config file (env KURZ_CONFIG; default $XDG_CONFIG_HOME/kurz/config.yaml)")
	pf.StringVarP(&g.output, "output", "o", "table", "output format: table, json or yaml")
	pf.DurationVar(&g.timeout, "timeout", defaultTimeout, "bound on each call to a service (0: none)")
	_ = root.RegisterFlagCompletionFunc("output", cobra.FixedCompletions([]string{"table", "json", "yaml"}, cobra.ShellCompDirectiveNoFileComp))
	_ = root.RegisterFlagCompletionFunc("context", c.completeContexts)
	_ = root.MarkPersistentFlagFilename("config", "yaml", "yml")

	groups := map[string]*cobra.Command{}
	for _, cmd := range commands {
		if cmd.name == "help" {
			continue // cobra has its own
		}
		words := strings.Fields(cmd.name)
		parent := root
		if len(words) == 2 {
			if groups[words[0]] == nil {
				groups[words[0]] = &cobra.Command{Use: words[0], Short: groupSummaries[words[0]]}
				root.AddCommand(groups[words[0]])
			}
			parent = groups[words[0]]
		}
		leaf := &cobra.Command{
			Use:   strings.TrimSpace(words[len(words)-1] + " " + cmd.args),
			Short: cmd.summary,
			Long:  strings.TrimSpace(cmd.help),
			Run:   func(*cobra.Command, []string) {},
		}
		if cmd.args == "" {
			leaf.ValidArgsFunction = cobra.NoFileCompletions
		}
		switch cmd.name {
		case "config use-context", "config delete-context", "config set-context":
			leaf.ValidArgsFunction = c.completeContexts
		case "completion":
			leaf.ValidArgs = []string{"bash", "zsh", "fish", "powershell"}
		}
		fs := flag.NewFlagSet(cmd.name, flag.ContinueOnError)
		cmd.setup(&cli{stdin: c.stdin, stdout: c.stdout, stderr: c.stderr, lookupEnv: c.lookupEnv}, fs)
		addGoFlags(leaf.Flags(), fs)
		parent.AddCommand(leaf)
	}
	return root
}

// addGoFlags defines a command's own flags (not the global ones) on dst;
// a one-letter flag whose usage is "short for --x" becomes x's shorthand.
func addGoFlags(dst *pflag.FlagSet, fs *flag.FlagSet) {
	short := map[string]string{}
	fs.VisitAll(func(f *flag.Flag) {
		if long, ok := strings.CutPrefix(f.Usage, "short for --"); ok && len(f.Name) == 1 {
			short[long] = f.Name
		}
	})
	fs.VisitAll(func(f *flag.Flag) {
		if isGlobalFlag(f.Name) || strings.HasPrefix(f.Usage, "short for --") {
			return
		}
		typ, _ := flag.UnquoteUsage(f)
		isBool := false
		if b, ok := f.Value.(interface{ IsBoolFlag() bool }); ok && b.IsBoolFlag() {
			typ, isBool = "bool", true
		}
		if typ == "" {
			typ = "string"
		}
		// The placeholder goes into the type, so completion descriptions
		// read without pflag's backquotes.
		usage := strings.ReplaceAll(f.Usage, "`", "")
		pf := dst.VarPF(pflagValue{f.Value, typ}, f.Name, short[f.Name], usage)
		pf.DefValue = f.DefValue
		if isBool {
			pf.NoOptDefVal = "true"
		}
	})
}

// pflagValue is a standard library flag.Value for pflag.
type pflagValue struct {
	flag.Value
	typ string
}

func (v pflagValue) Type() string { return v.typ }

// isCompletionRequest: cobra's hidden commands that the completion scripts
// run to ask what comes next on the command line.
func isCompletionRequest(word string) bool {
	return word == cobra.ShellCompRequestCmd || word == cobra.ShellCompNoDescRequestCmd
}

// complete answers a completion script's request.
func (c *cli) complete(args []string) error {
	root := c.cobraRoot()
	root.SetArgs(args)
	root.SetOut(c.stdout)
	root.SetErr(c.stderr)
	return root.ExecuteContext(c.ctx)
}

// completeContexts completes a context's name from the config file.
func (c *cli) completeContexts(_ *cobra.Command, args []string, _ string) ([]cobra.Completion, cobra.ShellCompDirective) {
	cfg, _, err := c.loadConfig()
	if err != nil || len(args) > 0 {
		return nil, cobra.ShellCompDirectiveNoFileComp
	}
	var names []cobra.Completion
	for _, k := range cfg.Contexts {
		names = append(names, k.Name)
	}
	return names, cobra.ShellCompDirectiveNoFileComp
}

func completionCommand() *command {
	return &command{
		name: "completion", args: "<bash|zsh|fish|powershell>", minArgs: 1, maxArgs: 1, offline: true,
		summary: "print a shell completion script",
		help: `Prints the script that completes kurzctl's commands, flags, output formats
and context names in a shell.

Examples:
  source <(kurzctl completion bash)
  kurzctl completion bash > /etc/bash_completion.d/kurzctl
  kurzctl completion zsh > "${fpath[1]}/_kurzctl"
  kurzctl completion fish > ~/.config/fish/completions/kurzctl.fish`,
		setup: func(c *cli, fs *flag.FlagSet) func([]string) error {
			return func(args []string) error {
				root := c.cobraRoot()
				switch args[0] {
				case "bash":
					return root.GenBashCompletionV2(c.stdout, true)
				case "zsh":
					return root.GenZshCompletion(c.stdout)
				case "fish":
					return root.GenFishCompletion(c.stdout, true)
				case "powershell":
					return root.GenPowerShellCompletionWithDesc(c.stdout)
				}
				return usagef("completion", "shell %q: want bash, zsh, fish or powershell", args[0])
			}
		},
	}
}

func docsCommand() *command {
	return &command{
		name: "docs", args: "<dir>", minArgs: 1, maxArgs: 1, offline: true,
		summary: "write the command reference as Markdown",
		help: `Writes one Markdown page per command into <dir> (make docs writes docs/cli).

Example:
  kurzctl docs docs/cli`,
		setup: func(c *cli, fs *flag.FlagSet) func([]string) error {
			return func(args []string) error {
				pages := c.docPages()
				if err := os.MkdirAll(args[0], 0o755); err != nil {
					return err
				}
				for name, text := range pages {
					if err := os.WriteFile(filepath.Join(args[0], name), text, 0o644); err != nil {
						return err
					}
				}
				if c.json() {
					return writeJSONValue(c.stdout, map[string]int{"pages": len(pages)})
				}
				_, err := fmt.Fprintf(c.stdout, "wrote %d pages into %s\n", len(pages), args[0])
				return err
			}
		},
	}
}

// docPages renders every command's reference page, by file name.
func (c *cli) docPages() map[string][]byte {
	pages := map[string][]byte{}
	var walk func(cmd *cobra.Command)
	walk = func(cmd *cobra.Command) {
		pages[docFile(cmd)] = markdownPage(cmd)
		for _, sub := range cmd.Commands() {
			if sub.IsAvailableCommand() {
				walk(sub)
			}
		}
	}
	walk(c.cobraRoot())
	return pages
}

func docFile(cmd *cobra.Command) string {
	return strings.ReplaceAll(cmd.CommandPath(), " ", "_") + ".md"
}

// markdownPage is one command's reference page, in the layout of
// cobra/doc's GenMarkdown (without its dependencies).
func markdownPage(cmd *cobra.Command) []byte {
	var b bytes.Buffer
	fmt.Fprintf(&b, "## %s\n\n%s\n\n", cmd.CommandPath(), cmd.Short)
	if cmd.Long != "" {
		fmt.Fprintf(&b, "### Synopsis\n\n```text\n%s\n```\n\n", cmd.Long)
	}
	if cmd.Runnable() {
		fmt.Fprintf(&b, "```sh\n%s\n```\n\n", cmd.UseLine())
	}
	if fl := cmd.NonInheritedFlags(); fl.HasAvailableFlags() {
		fmt.Fprintf(&b, "### Options\n\n```text\n%s```\n\n", fl.FlagUsages())
	}
	if fl := cmd.InheritedFlags(); fl.HasAvailableFlags() {
		fmt.Fprintf(&b, "### Options inherited from parent commands\n\n```text\n%s```\n\n", fl.FlagUsages())
	}
	var see []string
	if p := cmd.Parent(); p != nil {
		see = append(see, fmt.Sprintf("* [%s](%s) - %s", p.CommandPath(), docFile(p), p.Short))
	}
	subs := slices.Clone(cmd.Commands())
	for _, sub := range subs {
		if sub.IsAvailableCommand() {
			see = append(see, fmt.Sprintf("* [%s](%s) - %s", sub.CommandPath(), docFile(sub), sub.Short))
		}
	}
	if len(see) > 0 {
		fmt.Fprintf(&b, "### See also\n\n%s\n", strings.Join(see, "\n"))
	}
	return b.Bytes()
}
