// Command kurzctl is kurz's command-line client: links, click statistics,
// imports and exports through the gateway's JSON API; tenants and API keys
// through its admin API; quota checks and explanations straight from the
// limiter's gRPC API.
//
//	kurzctl links create https://example.com/spring --tag spring
//	kurzctl stats 1000abc --since 7d
//	kurzctl quota explain --domain api --descriptor tenant=acme
//
// Run "kurzctl help" for every command.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"strings"
	"syscall"
)

// Exit codes: scripts tell a mistake on the command line from a refusal by
// the service.
const (
	exitOK    = 0
	exitError = 1 // the API (or the network, or a file) failed
	exitUsage = 2 // the command line is wrong
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	code := run(ctx, os.Args[1:], os.Stdout, os.Stderr)
	stop()
	os.Exit(code)
}

// run executes one kurzctl command line (without the program name) and
// returns the exit code. Everything it prints goes to stdout and stderr; it
// reads stdin only for --password-stdin.
func run(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	return runIO(ctx, args, os.Stdin, stdout, stderr, os.LookupEnv)
}

// runIO is run with its inputs explicit: stdin and the environment.
func runIO(ctx context.Context, args []string, stdin io.Reader, stdout, stderr io.Writer, lookupEnv func(string) (string, bool)) int {
	c := &cli{ctx: ctx, stdin: stdin, stdout: stdout, stderr: stderr, lookupEnv: lookupEnv, g: globals{timeout: defaultTimeout}}
	err := c.dispatch(args)
	if err == nil {
		return exitOK
	}
	var usage *usageError
	if errors.As(err, &usage) {
		fmt.Fprintf(stderr, "%s: %s\n", usage.prog(), usage.msg)
		fmt.Fprintf(stderr, "Run '%s -h' for usage.\n", usage.prog())
		return exitUsage
	}
	fmt.Fprintf(stderr, "kurzctl: %s\n", errorText(err))
	return exitError
}

// errorText is what a person sees of err: the API's own message for API
// errors, the cause otherwise; never a stack trace.
func errorText(err error) string {
	if errors.Is(err, context.Canceled) {
		return "interrupted"
	}
	return err.Error()
}

// usageError is a mistake on the command line: exit code 2, with a pointer
// to the command's help.
type usageError struct {
	cmd string // "links create"; "" for kurzctl itself
	msg string
}

func (e *usageError) Error() string { return e.msg }

func (e *usageError) prog() string {
	if e.cmd == "" {
		return "kurzctl"
	}
	return "kurzctl " + e.cmd
}

func usagef(cmd, format string, args ...any) error {
	return &usageError{cmd: cmd, msg: fmt.Sprintf(format, args...)}
}

// cli is one invocation: its streams, environment and global settings.
type cli struct {
	ctx       context.Context
	stdin     io.Reader
	stdout    io.Writer
	stderr    io.Writer
	lookupEnv func(string) (string, bool)
	g         globals
	// given is g as the command line set it, before the environment and
	// the config file filled the rest (config set-context stores it).
	given globals
}

// command is one leaf command, e.g. "links create".
type command struct {
	name    string // the words that select it, e.g. "links create"
	args    string // its positional arguments, e.g. "<long-url>"
	summary string // one line, for the command lists
	help    string // what it does, with examples
	// minArgs and maxArgs bound the positional arguments (maxArgs < 0: no
	// bound).
	minArgs, maxArgs int
	// offline commands call no service: they need no gateway settings
	// (config, version, help, completion, docs).
	offline bool
	// setup defines the command's own flags on fs and returns what runs the
	// command with its positional arguments once the flags are parsed.
	setup func(c *cli, fs *flag.FlagSet) func(args []string) error
}

// commands is every command, in the order help lists them.
var commands []*command

func init() {
	commands = append(commands, linkCommands()...)
	commands = append(commands, ruleCommands()...)
	commands = append(commands, statsCommand(), quotaCheckCommand(), quotaExplainCommand())
	commands = append(commands, adminCommands()...)
	commands = append(commands, configCommands()...)
	commands = append(commands, completionCommand(), docsCommand())
	commands = append(commands, &command{
		name: "version", summary: "print kurzctl's version", offline: true,
		help: "Prints kurzctl's version, the commit it was built from and when, as make\nrelease sets them (\"dev\" for other builds, with the commit when known).\n\nExamples:\n  kurzctl version\n  kurzctl version -o json",
		setup: func(c *cli, fs *flag.FlagSet) func([]string) error {
			return func([]string) error { return c.version() }
		},
	}, &command{
		name: "help", args: "[command]", summary: "show help for kurzctl or a command", maxArgs: -1, offline: true,
		help:  "Shows the commands, or one command's flags and examples.\n\nExamples:\n  kurzctl help\n  kurzctl help links create",
		setup: func(c *cli, fs *flag.FlagSet) func([]string) error { return c.helpCommand },
	})
}

// dispatch finds the command named by the leading words of args (global
// flags may come before it) and runs it.
func (c *cli) dispatch(args []string) error {
	fs := c.flagSet("")
	rest, err := c.parseLeading(fs, args)
	if errors.Is(err, flag.ErrHelp) {
		c.printOverview(c.stdout)
		return nil
	}
	if err != nil {
		return err
	}
	if len(rest) == 0 {
		c.printOverview(c.stderr)
		return usagef("", "no command given")
	}
	if isCompletionRequest(rest[0]) {
		return c.complete(rest)
	}
	cmd, n := findCommand(rest)
	if cmd == nil {
		if group := groupOf(rest[0]); group != "" {
			if len(rest) == 1 || isHelp(rest[1]) {
				c.printGroup(c.stdoutOrErr(len(rest) > 1), group)
				if len(rest) == 1 {
					return usagef(group, "missing a subcommand")
				}
				return nil
			}
			return usagef(group, "unknown command %q", strings.Join(rest[:2], " "))
		}
		return usagef("", "unknown command %q", rest[0])
	}
	return c.runCommand(cmd, rest[n:])
}

// runCommand parses a command's flags (its own and the global ones, before,
// between or after its arguments), checks the number of arguments and runs
// it.
func (c *cli) runCommand(cmd *command, args []string) error {
	fs := c.flagSet(cmd.name)
	exec := cmd.setup(c, fs)
	pos, err := c.parse(fs, cmd, args)
	if errors.Is(err, flag.ErrHelp) {
		c.printCommandHelp(c.stdout, cmd, fs)
		return nil
	}
	if err != nil {
		return err
	}
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
	err = exec(pos)
	c.stdout = y.out
	if ferr := y.flush(); err == nil {
		err = ferr
	}
	return err
}

// stdoutOrErr is stdout for asked-for help, stderr for help printed beside
// a usage error.
func (c *cli) stdoutOrErr(asked bool) io.Writer {
	if asked {
		return c.stdout
	}
	return c.stderr
}

func isHelp(s string) bool { return s == "-h" || s == "-help" || s == "--help" || s == "help" }

// findCommand returns the command whose words lead args, and how many words
// that is.
func findCommand(args []string) (*command, int) {
	for _, cmd := range commands {
		words := strings.Fields(cmd.name)
		if len(args) >= len(words) && strings.Join(args[:len(words)], " ") == cmd.name {
			return cmd, len(words)
		}
	}
	return nil, 0
}

// groupOf returns word if it is a command group ("links", "quota", ...).
func groupOf(word string) string {
	for _, cmd := range commands {
		if g, _, ok := strings.Cut(cmd.name, " "); ok && g == word {
			return g
		}
	}
	return ""
}

func (c *cli) helpCommand(args []string) error {
	if len(args) == 0 {
		c.printOverview(c.stdout)
		return nil
	}
	if cmd, n := findCommand(args); cmd != nil && n == len(args) {
		fs := c.flagSet(cmd.name)
		cmd.setup(c, fs)
		c.printCommandHelp(c.stdout, cmd, fs)
		return nil
	}
	if g := groupOf(args[0]); g != "" && len(args) == 1 {
		c.printGroup(c.stdout, g)
		return nil
	}
	return usagef("help", "no such command %q", strings.Join(args, " "))
}
