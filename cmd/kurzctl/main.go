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
	"fmt"
	"io"
	"os"
	"os/signal"
	"syscall"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"
)

// Exit codes: scripts tell a mistake on the command line from a refusal by
// the service.
const (
	exitOK    = 0
	exitError = 1 // the API (or the network, or a file) failed
	exitUsage = 2 // the command line is wrong
	// exitRowsFailed is links import's when it went through the file but
	// some rows got no link (the report lists them).
	exitRowsFailed = 3
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	// A hostile gateway (or a visitor's Referer in the statistics) must
	// not reach a terminal's escape sequences.
	code := run(ctx, os.Args[1:], forTerminal(os.Stdout), forTerminal(os.Stderr))
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
	root := c.cobraRoot()
	root.SetArgs(helpFlags(args))
	root.SetIn(stdin)
	root.SetOut(stdout)
	root.SetErr(stderr)
	err := root.ExecuteContext(ctx)
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
	var rows *rowsFailedError
	if errors.As(err, &rows) {
		return exitRowsFailed
	}
	return exitError
}

// helpFlags returns args (never nil: cobra reads os.Args for nil) with
// "-help", which kurzctl took before it parsed with pflag, spelled
// "--help"; after "--" every word is an argument.
func helpFlags(args []string) []string {
	out := make([]string, len(args))
	copy(out, args)
	for i, a := range out {
		if a == "--" {
			break
		}
		if a == "-help" {
			out[i] = "--help"
		}
	}
	return out
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
	// root is the command tree cobraRoot made for this invocation, and
	// leaves its commands' entries in commands.
	root   *cobra.Command
	leaves map[*cobra.Command]*command
}

// command is one leaf command, e.g. "links create"; cobraRoot makes a
// cobra command of each.
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
	setup func(c *cli, fs *pflag.FlagSet) func(args []string) error
}

// commands is every command, in the order help lists them.
var commands []*command

func init() {
	commands = append(commands, linkCommands()...)
	commands = append(commands, webhookCommands()...)
	commands = append(commands, ruleCommands()...)
	commands = append(commands, domainCommands()...)
	commands = append(commands, statsCommand(), quotaCheckCommand(), quotaExplainCommand())
	commands = append(commands, adminCommands()...)
	commands = append(commands, limiterRulesCommands()...)
	commands = append(commands, configCommands()...)
	commands = append(commands, completionCommand(), docsCommand())
	commands = append(commands, &command{
		name: "version", summary: "print kurzctl's version", offline: true,
		help: "Prints kurzctl's version, the commit it was built from and when, as make\nrelease sets them (\"dev\" for other builds, with the commit when known).\n\nExamples:\n  kurzctl version\n  kurzctl version -o json",
		setup: func(c *cli, fs *pflag.FlagSet) func([]string) error {
			return func([]string) error { return c.version() }
		},
	}, &command{
		name: "help", args: "[command]", summary: "show help for kurzctl or a command", maxArgs: -1, offline: true,
		help:  "Shows the commands, or one command's flags and examples.\n\nExamples:\n  kurzctl help\n  kurzctl help links create",
		setup: func(c *cli, fs *pflag.FlagSet) func([]string) error { return c.helpCommand },
	})
}
