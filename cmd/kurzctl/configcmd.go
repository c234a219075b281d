package main

import (
	"fmt"
	"github.com/spf13/pflag"
	"slices"
	"text/tabwriter"
)

const configHelpNote = `The config file is --config, else KURZ_CONFIG, else
$XDG_CONFIG_HOME/kurz/config.yaml, else ~/.config/kurz/config.yaml. kurzctl
writes it readable by its owner alone, and refuses to read one holding
secrets that others can read.`

func configCommands() []*command {
	return []*command{
		{
			name: "config set-context", args: "<name>", minArgs: 1, maxArgs: 1, offline: true,
			summary: "add or change a context (gateway URL and credentials)",
			help: `Adds a context, or changes the settings given of an existing one: the
global flags --url, --api-key, --admin-token, --limiter and --plain-http
given on this command line are stored in it (--plain-http=false clears
plain-http). Prefer --api-key-stdin or --admin-token-stdin to keep a secret
out of the shell's history. --use makes it the current context.
` + configHelpNote + `

Examples:
  kurzctl config set-context local --url http://127.0.0.1:8080 --use
  printf '%s\n' "$KEY" | kurzctl config set-context prod --url https://kurz.example.com --api-key-stdin
  kurzctl config set-context cluster --url http://kurz-gateway.kurz:8080 --plain-http
  kurzctl --context prod links list`,
			setup: setupSetContext,
		},
		{
			name: "config use-context", args: "<name>", minArgs: 1, maxArgs: 1, offline: true,
			summary: "make a context the current one",
			help:    "Makes a context the current one: commands use its settings where no flag or\nenvironment variable gives one. " + configHelpNote + "\n\nExample:\n  kurzctl config use-context prod",
			setup: func(c *cli, fs *pflag.FlagSet) func([]string) error {
				return func(args []string) error {
					err := c.changeConfig(func(cfg *kurzConfig) error {
						if cfg.find(args[0]) == nil {
							return usagef("config use-context", "no context %q (see kurzctl config get-contexts)", args[0])
						}
						cfg.CurrentContext = args[0]
						return nil
					})
					if err != nil {
						return err
					}
					if c.json() {
						return writeJSONValue(c.stdout, map[string]string{"current-context": args[0]})
					}
					_, err = fmt.Fprintf(c.stdout, "current context: %s\n", args[0])
					return err
				}
			},
		},
		{
			name: "config get-contexts", offline: true,
			summary: "list the contexts (never their secrets)",
			help:    "Lists the contexts, the current one marked *; whether each lets credentials go\nto its URL over plain http (plain-http), and holds an API key or an admin\ntoken, never their values. " + configHelpNote + "\n\nExamples:\n  kurzctl config get-contexts\n  kurzctl config get-contexts -o yaml",
			setup: func(c *cli, fs *pflag.FlagSet) func([]string) error {
				return c.showConfig(func(cfg *kurzConfig) error {
					if len(cfg.Contexts) == 0 {
						_, err := fmt.Fprintln(c.stdout, "no contexts (add one with kurzctl config set-context)")
						return err
					}
					tw := tabwriter.NewWriter(c.stdout, 0, 0, 2, ' ', 0)
					fmt.Fprintln(tw, "CURRENT\tNAME\tURL\tPLAIN HTTP\tLIMITER\tAPI KEY\tADMIN TOKEN")
					for _, k := range cfg.Contexts {
						mark := ""
						if k.Name == cfg.CurrentContext {
							mark = "*"
						}
						plain := "-"
						if k.PlainHTTP {
							plain = "yes"
						}
						fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%s\n", mark, k.Name, orDash(k.redact().URL), plain, orDash(k.Limiter), setOrDash(k.APIKey), setOrDash(k.AdminToken))
					}
					return tw.Flush()
				})
			},
		},
		{
			name: "config view", offline: true,
			summary: "show the config file, secrets redacted",
			help:    "Shows the config file as YAML (or -o json), every secret replaced by " + redacted + ".\n" + configHelpNote + "\n\nExample:\n  kurzctl config view",
			setup: func(c *cli, fs *pflag.FlagSet) func([]string) error {
				return c.showConfig(func(cfg *kurzConfig) error {
					y := &yamlWriter{out: c.stdout}
					if err := writeJSONValue(y, redactConfig(cfg)); err != nil {
						return err
					}
					return y.flush()
				})
			},
		},
		{
			name: "config delete-context", args: "<name>", minArgs: 1, maxArgs: 1, offline: true,
			summary: "remove a context",
			help:    "Removes a context and its credentials from the config file. " + configHelpNote + "\n\nExample:\n  kurzctl config delete-context old",
			setup: func(c *cli, fs *pflag.FlagSet) func([]string) error {
				return func(args []string) error {
					err := c.changeConfig(func(cfg *kurzConfig) error {
						kept := slices.DeleteFunc(slices.Clone(cfg.Contexts), func(k kurzContext) bool { return k.Name == args[0] })
						if len(kept) == len(cfg.Contexts) {
							return usagef("config delete-context", "no context %q (see kurzctl config get-contexts)", args[0])
						}
						cfg.Contexts = kept
						if cfg.CurrentContext == args[0] {
							cfg.CurrentContext = ""
						}
						return nil
					})
					if err != nil {
						return err
					}
					if c.json() {
						return writeJSONValue(c.stdout, struct{}{})
					}
					_, err = fmt.Fprintf(c.stdout, "deleted context %s\n", args[0])
					return err
				}
			},
		},
	}
}

func setupSetContext(c *cli, fs *pflag.FlagSet) func([]string) error {
	keyStdin := fs.Bool("api-key-stdin", false, "read the API key from the first line of stdin")
	tokenStdin := fs.Bool("admin-token-stdin", false, "read the admin token from the first line of stdin")
	use := fs.Bool("use", false, "make it the current context")
	return func(args []string) error {
		const cmd = "config set-context"
		name := args[0]
		if !validContextName(name) {
			return usagef(cmd, "context name %q: want 1 to 64 letters, digits, '-', '_', '.' or '@'", name)
		}
		given := c.given
		switch {
		case *keyStdin && *tokenStdin:
			return usagef(cmd, "give --api-key-stdin or --admin-token-stdin, not both: stdin holds one secret")
		case *keyStdin && given.apiKey != "":
			return usagef(cmd, "give --api-key or --api-key-stdin, not both")
		case *tokenStdin && given.adminToken != "":
			return usagef(cmd, "give --admin-token or --admin-token-stdin, not both")
		}
		if given.url != "" {
			if err := checkURL(cmd, given.url); err != nil {
				return err
			}
		}
		var err error
		if *keyStdin {
			if given.apiKey, err = c.readSecretLine(cmd, "API key"); err != nil {
				return err
			}
		}
		if *tokenStdin {
			if given.adminToken, err = c.readSecretLine(cmd, "admin token"); err != nil {
				return err
			}
		}
		cfg, path, err := c.loadConfig()
		if err != nil {
			return err
		}
		k := cfg.find(name)
		verb := "changed"
		if k == nil {
			cfg.Contexts = append(cfg.Contexts, kurzContext{Name: name})
			k = &cfg.Contexts[len(cfg.Contexts)-1]
			verb = "added"
		}
		for _, f := range []struct{ dst, v *string }{{&k.URL, &given.url}, {&k.APIKey, &given.apiKey}, {&k.AdminToken, &given.adminToken}, {&k.Limiter, &given.limiter}} {
			if *f.v != "" {
				*f.dst = *f.v
			}
		}
		// --plain-http=false clears what --plain-http stored.
		if c.flagChanged("plain-http") {
			k.PlainHTTP = given.plainHTTP
		}
		if *use || cfg.CurrentContext == "" {
			cfg.CurrentContext = name
		}
		if err := saveConfig(path, cfg); err != nil {
			return err
		}
		if c.json() {
			return writeJSONValue(c.stdout, k.redact())
		}
		_, err = fmt.Fprintf(c.stdout, "%s context %s in %s\n", verb, name, path)
		return err
	}
}

// showConfig returns a command that shows the config file, its secrets
// redacted: as JSON (or YAML) for -o json, else with table.
func (c *cli) showConfig(table func(cfg *kurzConfig) error) func([]string) error {
	return func([]string) error {
		cfg, _, err := c.loadConfig()
		if err != nil {
			return err
		}
		if c.json() {
			return writeJSONValue(c.stdout, redactConfig(cfg))
		}
		return table(cfg)
	}
}

// changeConfig loads the config file, lets change edit it and writes it
// back; nothing is written if change fails.
func (c *cli) changeConfig(change func(cfg *kurzConfig) error) error {
	cfg, path, err := c.loadConfig()
	if err != nil {
		return err
	}
	if err := change(cfg); err != nil {
		return err
	}
	return saveConfig(path, cfg)
}

// redactConfig is cfg with every secret redacted, for showing.
func redactConfig(cfg *kurzConfig) *kurzConfig {
	out := &kurzConfig{CurrentContext: cfg.CurrentContext}
	for _, k := range cfg.Contexts {
		out.Contexts = append(out.Contexts, k.redact())
	}
	return out
}

func setOrDash(s string) string {
	if s == "" {
		return "-"
	}
	return "set"
}
