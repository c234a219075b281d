package main

import (
	"bytes"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"
)

// kurzctl's commands are one table (commands); cobraRoot makes the cobra
// command tree of it, which parses every command line: flags anywhere among
// the arguments ("--" ends them), the global flags as the root's persistent
// flags, shell completion (kurzctl completion, and the __complete requests
// the scripts make) and the reference pages in docs/cli (kurzctl docs).
// Every mistake on the command line is a *usageError: exit status 2.

// groupSummaries describe the command groups.
var groupSummaries = map[string]string{
	"links":    "create, list, change and export short links",
	"quota":    "ask the limiter what it would decide",
	"tenants":  "manage tenants (admin)",
	"keys":     "manage tenants' API keys (admin)",
	"rules":    "export and apply the limiter's rules and plans as a file (admin)",
	"config":   "manage the config file's contexts",
	"webhooks": "subscribe URLs to signed link events; see deliveries",
}

// cobraRoot returns kurzctl's command tree, its flags bound to c, and keeps
// it in c.root.
func (c *cli) cobraRoot() *cobra.Command {
	root := &cobra.Command{
		Use:   "kurzctl",
		Short: "kurz's command-line client",
		Long: `kurzctl is kurz's command-line client: links, click statistics, imports and
exports through the gateway; tenants, API keys and the limiter's rules
through its admin API; quotas straight from the limiter.

Settings come from flags, then environment variables, then the config file's
current context, then the defaults. Exit status: 0 on success, 1 when a
service refuses or fails (its message on stderr), 2 for a mistake on the
command line, 3 when links import went through its file but some rows got
no link.`,
		SilenceErrors:     true,
		SilenceUsage:      true,
		DisableAutoGenTag: true,
		Args:              cobra.ArbitraryArgs,
		RunE: func(_ *cobra.Command, args []string) error {
			if len(args) == 0 {
				c.printOverview(c.stderr, c.root)
				return usagef("", "no command given")
			}
			return usagef("", "unknown command %q", args[0])
		},
	}
	c.root = root
	c.leaves = map[*cobra.Command]*command{}
	root.CompletionOptions.DisableDefaultCmd = true
	c.defineGlobals(root.PersistentFlags())
	_ = root.RegisterFlagCompletionFunc("output", cobra.FixedCompletions([]string{"table", "json", "yaml"}, cobra.ShellCompDirectiveNoFileComp))
	_ = root.RegisterFlagCompletionFunc("context", c.completeContexts)
	_ = root.MarkPersistentFlagFilename("config", "yaml", "yml")
	root.SetFlagErrorFunc(func(cc *cobra.Command, err error) error { return usagef(commandName(cc), "%v", err) })
	root.SetHelpFunc(func(cc *cobra.Command, _ []string) { c.help(c.stdout, cc) })

	groups := map[string]*cobra.Command{}
	for _, cmd := range commands {
		words := strings.Fields(cmd.name)
		parent := root
		if len(words) == 2 {
			if groups[words[0]] == nil {
				groups[words[0]] = c.groupCommand(words[0])
				root.AddCommand(groups[words[0]])
			}
			parent = groups[words[0]]
		}
		leaf := c.leafCommand(cmd, words[len(words)-1])
		if cmd.name == "help" {
			root.SetHelpCommand(leaf)
			continue
		}
		parent.AddCommand(leaf)
	}
	return root
}

// commandName is a command's words after "kurzctl": "links create".
func commandName(cc *cobra.Command) string {
	return strings.TrimPrefix(strings.TrimPrefix(cc.CommandPath(), "kurzctl"), " ")
}

// groupCommand is a group ("links"): alone, or with a word that names none
// of its commands, it is a usage error that lists the group's commands.
func (c *cli) groupCommand(group string) *cobra.Command {
	return &cobra.Command{
		Use:   group,
		Short: groupSummaries[group],
		Args:  cobra.ArbitraryArgs,
		RunE: func(_ *cobra.Command, args []string) error {
			switch {
			case len(args) == 0:
				c.printGroup(c.stderr, group)
				return usagef(group, "missing a subcommand")
			case args[0] == "help":
				c.printGroup(c.stdout, group)
				return nil
			}
			return usagef(group, "unknown command %q", group+" "+args[0])
		},
	}
}

// leafCommand makes the cobra command of cmd: its flags, its bounds on
// the arguments and what runs it once the global settings are resolved.
func (c *cli) leafCommand(cmd *command, word string) *cobra.Command {
	leaf := &cobra.Command{
		Use:   strings.TrimSpace(word + " " + cmd.args),
		Short: cmd.summary,
		Long:  strings.TrimSpace(cmd.help),
		Args: func(_ *cobra.Command, pos []string) error {
			switch {
			case len(pos) < cmd.minArgs:
				missing := strings.Fields(cmd.args)
				if len(pos) < len(missing) {
					return usagef(cmd.name, "missing %s", strings.Join(missing[len(pos):cmd.minArgs], " "))
				}
				return usagef(cmd.name, "want %s", cmd.args)
			case cmd.maxArgs >= 0 && len(pos) > cmd.maxArgs:
				return usagef(cmd.name, "unexpected argument %q (usage: kurzctl %s %s)", pos[cmd.maxArgs], cmd.name, cmd.args)
			}
			return nil
		},
	}
	exec := cmd.setup(c, leaf.Flags())
	leaf.RunE = func(_ *cobra.Command, pos []string) error { return c.runCommand(cmd, exec, pos) }
	c.leaves[leaf] = cmd
	if cmd.args == "" {
		leaf.ValidArgsFunction = cobra.NoFileCompletions
	}
	switch cmd.name {
	case "config use-context", "config delete-context", "config set-context":
		leaf.ValidArgsFunction = c.completeContexts
	case "completion":
		leaf.ValidArgs = []string{"bash", "zsh", "fish", "powershell"}
	}
	return leaf
}

// runCommand resolves the global settings and runs a command whose flags
// and arguments cobra has parsed.
func (c *cli) runCommand(cmd *command, exec func([]string) error, pos []string) error {
	c.given = c.g
	if err := c.resolveGlobals(cmd); err != nil {
		return err
	}
	if c.g.output != "yaml" {
		return exec(pos)
	}
	// -o yaml: the command writes JSON, converted when it is done.
	y := &yamlWriter{out: c.stdout}
	c.stdout = y
	err := exec(pos)
	c.stdout = y.out
	if ferr := y.flush(); err == nil {
		err = ferr
	}
	return err
}

// help shows cc's help: the overview for kurzctl itself, a group's
// commands, or a command's usage, flags and examples.
func (c *cli) help(w io.Writer, cc *cobra.Command) {
	switch cmd, ok := c.leaves[cc]; {
	case ok:
		c.printCommandHelp(w, cmd, cc)
	case cc.HasParent():
		c.printGroup(w, cc.Name())
	default:
		c.printOverview(w, cc)
	}
}

// helpCommand runs "kurzctl help [command]".
func (c *cli) helpCommand(args []string) error {
	if len(args) == 0 {
		c.printOverview(c.stdout, c.root)
		return nil
	}
	cc, rest, err := c.root.Find(args)
	if err != nil || cc == c.root || len(rest) > 0 {
		return usagef("help", "no such command %q", strings.Join(args, " "))
	}
	c.help(c.stdout, cc)
	return nil
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
		setup: func(c *cli, fs *pflag.FlagSet) func([]string) error {
			return func(args []string) error {
				root := c.root
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
		setup: func(c *cli, fs *pflag.FlagSet) func([]string) error {
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
	// A tree of its own: the running one has flags cobra added to the
	// command it runs (--help).
	walk((&cli{lookupEnv: c.lookupEnv}).cobraRoot())
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
	if cmd.Runnable() && !cmd.HasAvailableSubCommands() {
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
