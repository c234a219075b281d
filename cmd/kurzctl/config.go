package main

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net/url"
	"os"
	"path/filepath"
	"strings"

	"sigs.k8s.io/yaml"
)

// The config file holds contexts, like kubectl's kubeconfig or gh's hosts:
// a named gateway (and limiter) with the credentials to use there.
// Precedence: flags, then environment variables, then the current context,
// then the defaults.

// maxConfigSize bounds the config file kurzctl reads.
const maxConfigSize = 1 << 20

// redacted stands for a secret wherever kurzctl shows a context.
const redacted = "REDACTED"

// kurzConfig is the config file.
type kurzConfig struct {
	CurrentContext string        `json:"current-context,omitempty"`
	Contexts       []kurzContext `json:"contexts,omitempty"`
}

// kurzContext is one named gateway and its credentials.
type kurzContext struct {
	Name       string `json:"name"`
	URL        string `json:"url,omitempty"`
	APIKey     string `json:"api-key,omitempty"`
	AdminToken string `json:"admin-token,omitempty"`
	Limiter    string `json:"limiter,omitempty"`
	// PlainHTTP lets the credentials go to URL over plain http (a
	// gateway inside a trusted network, without TLS): --plain-http bound
	// to this gateway, so a --url naming another does not inherit it.
	PlainHTTP bool `json:"plain-http,omitempty"`
}

func (k kurzContext) hasSecrets() bool { return k.APIKey != "" || k.AdminToken != "" }

// redact returns k with its secrets replaced by redacted.
func (k kurzContext) redact() kurzContext {
	if k.APIKey != "" {
		k.APIKey = redacted
	}
	if k.AdminToken != "" {
		k.AdminToken = redacted
	}
	// A file written before checkURL refused a URL's user and password.
	if u, err := url.Parse(k.URL); err == nil && u.User != nil {
		u.User = url.User(redacted)
		k.URL = u.String()
	}
	return k
}

func (cfg *kurzConfig) find(name string) *kurzContext {
	for i := range cfg.Contexts {
		if cfg.Contexts[i].Name == name {
			return &cfg.Contexts[i]
		}
	}
	return nil
}

// configPath is the config file's path: --config, else KURZ_CONFIG, else
// $XDG_CONFIG_HOME/kurz/config.yaml, else ~/.config/kurz/config.yaml; ""
// when none can be told (no HOME).
func (c *cli) configPath() string {
	if c.g.config != "" {
		return c.g.config
	}
	if v, ok := c.lookupEnv("KURZ_CONFIG"); ok && v != "" {
		return v
	}
	if v, ok := c.lookupEnv("XDG_CONFIG_HOME"); ok && filepath.IsAbs(v) {
		return filepath.Join(v, "kurz", "config.yaml")
	}
	if v, ok := c.lookupEnv("HOME"); ok && v != "" {
		return filepath.Join(v, ".config", "kurz", "config.yaml")
	}
	return ""
}

// loadConfig reads the config file; a missing file is an empty config. A
// file holding secrets that other users can read is refused: the secrets
// may have leaked, and kurzctl will not go on using them silently.
func (c *cli) loadConfig() (*kurzConfig, string, error) {
	path := c.configPath()
	cfg := &kurzConfig{}
	if path == "" {
		return cfg, "", nil
	}
	f, err := os.Open(path)
	if errors.Is(err, fs.ErrNotExist) {
		return cfg, path, nil
	}
	if err != nil {
		return nil, path, fmt.Errorf("config file: %w", err)
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return nil, path, fmt.Errorf("config file: %w", err)
	}
	if !st.Mode().IsRegular() {
		return nil, path, fmt.Errorf("config file %s is not a regular file", path)
	}
	raw, err := io.ReadAll(io.LimitReader(f, maxConfigSize+1))
	if err != nil {
		return nil, path, fmt.Errorf("config file: %w", err)
	}
	if len(raw) > maxConfigSize {
		return nil, path, fmt.Errorf("config file %s is larger than %d bytes", path, maxConfigSize)
	}
	if err := yaml.UnmarshalStrict(raw, cfg); err != nil {
		return nil, path, fmt.Errorf("config file %s: %w", path, err)
	}
	for _, k := range cfg.Contexts {
		if k.hasSecrets() && st.Mode().Perm()&0o077 != 0 {
			return nil, path, fmt.Errorf("config file %s holds secrets and is readable by others (mode %04o): run chmod 600 %s, and replace the keys if others may have read them",
				path, st.Mode().Perm(), path)
		}
	}
	return cfg, path, nil
}

// saveConfig writes cfg to path, readable by its owner alone, replacing the
// file at once (never half-written).
func saveConfig(path string, cfg *kurzConfig) error {
	if path == "" {
		return errors.New("no config file: set --config or KURZ_CONFIG (HOME is not set)")
	}
	raw, err := yaml.Marshal(cfg)
	if err != nil {
		return fmt.Errorf("encode the config: %w", err)
	}
	dir := filepath.Dir(path)
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return fmt.Errorf("config file: %w", err)
	}
	tmp, err := os.CreateTemp(dir, ".config-*.yaml")
	if err != nil {
		return fmt.Errorf("config file: %w", err)
	}
	defer os.Remove(tmp.Name())
	if err := tmp.Chmod(0o600); err != nil {
		tmp.Close()
		return fmt.Errorf("config file: %w", err)
	}
	if _, err := tmp.Write(raw); err != nil {
		tmp.Close()
		return fmt.Errorf("config file: %w", err)
	}
	if err := tmp.Close(); err != nil {
		return fmt.Errorf("config file: %w", err)
	}
	if err := os.Rename(tmp.Name(), path); err != nil {
		return fmt.Errorf("config file: %w", err)
	}
	return nil
}

// currentContext is the context the settings come from: --context, else
// KURZ_CONTEXT, else the file's current-context; nil when none is chosen.
func (c *cli) currentContext(cmd string) (*kurzContext, error) {
	cfg, path, err := c.loadConfig()
	if err != nil {
		return nil, err
	}
	name := c.g.context
	if name == "" {
		if v, ok := c.lookupEnv("KURZ_CONTEXT"); ok {
			name = v
		}
	}
	explicit := name != ""
	if !explicit {
		name = cfg.CurrentContext
	}
	if name == "" {
		return nil, nil
	}
	k := cfg.find(name)
	if k == nil {
		if explicit {
			return nil, usagef(cmd, "no context %q in %s (see kurzctl config get-contexts)", name, orDash(path))
		}
		return nil, fmt.Errorf("config file %s: current-context %q names no context", path, name)
	}
	return k, nil
}

// validContextName: a name to type, list and put in a file.
func validContextName(name string) bool {
	if name == "" || len(name) > 64 {
		return false
	}
	for _, r := range name {
		if !(r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || strings.ContainsRune("-_.@", r)) {
			return false
		}
	}
	return true
}

// readSecretLine reads a secret from the first line of stdin.
func (c *cli) readSecretLine(cmd, what string) (string, error) {
	line, err := bufio.NewReader(io.LimitReader(c.stdin, 4096)).ReadString('\n')
	if err != nil && !errors.Is(err, io.EOF) {
		return "", fmt.Errorf("read the %s from stdin: %w", what, err)
	}
	line = strings.TrimRight(line, "\r\n")
	if line == "" {
		return "", usagef(cmd, "stdin holds no %s", what)
	}
	return line, nil
}
