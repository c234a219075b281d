package main

import (
	"bytes"
	"encoding/json"
	"errors"
	"io/fs"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"

	"sigs.k8s.io/yaml"

	"kurz.dev/pkg/buildinfo"
)

// docs/cli is what kurzctl docs writes now: run make docs after changing a
// command, a flag or a help text.
func TestDocsCLIIsCurrent(t *testing.T) {
	c := &cli{lookupEnv: func(string) (string, bool) { return "", false }}
	want := c.docPages()
	dir := filepath.Join("..", "..", "docs", "cli")
	entries, err := os.ReadDir(dir)
	if err != nil {
		t.Fatalf("%v (run make docs)", err)
	}
	var have []string
	for _, e := range entries {
		have = append(have, e.Name())
	}
	var names []string
	for name := range want {
		names = append(names, name)
	}
	slices.Sort(names)
	if !slices.Equal(have, names) {
		t.Fatalf("docs/cli holds %v, kurzctl docs writes %v: run make docs", have, names)
	}
	for _, name := range names {
		got, err := os.ReadFile(filepath.Join(dir, name))
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(got, want[name]) {
			t.Errorf("docs/cli/%s is stale: run make docs", name)
		}
	}
	if !strings.Contains(string(want["kurzctl_links_create.md"]), "--tag tag") {
		t.Errorf("links create's page lacks its --tag flag:\n%s", want["kurzctl_links_create.md"])
	}
}

// The completion scripts are cobra's, and the requests they make are
// answered: commands, a command's flags, the output formats and the
// config file's contexts.
func TestCompletion(t *testing.T) {
	dir := t.TempDir()
	c := &ctl{t: t, env: map[string]string{"KURZ_CONFIG": filepath.Join(dir, "config.yaml")}}
	for _, shell := range []string{"bash", "zsh", "fish", "powershell"} {
		if out := c.ok("completion", shell); !strings.Contains(out, "__complete") || !strings.Contains(out, "kurzctl") {
			t.Errorf("completion %s: no completion script:\n%.300s", shell, out)
		}
	}
	if r := c.run("completion", "tcsh"); r.code != exitUsage {
		t.Errorf("completion tcsh: %s", r)
	}
	c.ok("config", "set-context", "staging", "--url", "http://127.0.0.1:1")
	for _, tt := range []struct {
		args []string
		want []string
	}{
		{[]string{"__complete", "links", "cr"}, []string{"create\tshorten a URL"}},
		{[]string{"__complete", "con"}, []string{"config\t"}},
		{[]string{"__complete", "links", "create", "https://example.com", "--ta"}, []string{"--tag\t"}},
		{[]string{"__complete", "keys", "issue", "acme", "-"}, []string{"--quiet\t", "--output\t"}},
		{[]string{"__complete", "links", "list", "-o", ""}, []string{"table", "json", "yaml"}},
		{[]string{"__complete", "config", "use-context", ""}, []string{"staging"}},
	} {
		out := c.ok(tt.args...)
		for _, w := range tt.want {
			if !strings.Contains(out, w) {
				t.Errorf("kurzctl %s: want %q in\n%s", strings.Join(tt.args, " "), w, out)
			}
		}
	}
}

// -o yaml is -o json as YAML; what is not JSON passes unchanged.
func TestOutputYAML(t *testing.T) {
	c := &ctl{t: t, env: map[string]string{}}
	var v buildinfo.Info
	out := c.ok("version", "-o", "yaml")
	if err := yaml.UnmarshalStrict([]byte(out), &v); err != nil || v.Version != "dev" || v.Go == "" {
		t.Fatalf("version -o yaml: %v\n%s", err, out)
	}

	for _, tt := range []struct{ in, want string }{
		{`{"b":1,"a":"x"}` + "\n", "a: x\nb: 1\n"},
		{`{"a":1}` + "\n" + `{"a":2}` + "\n", "a: 1\n---\na: 2\n"},
		{"code,short_url\nabc,http://x/abc\n", "code,short_url\nabc,http://x/abc\n"},
	} {
		var buf bytes.Buffer
		w := &yamlWriter{out: &buf}
		w.Write([]byte(tt.in))
		if err := w.flush(); err != nil || buf.String() != tt.want {
			t.Errorf("yaml of %q = %q, %v; want %q", tt.in, buf.String(), err, tt.want)
		}
	}
}

// recorder is a gateway that answers every request 404 and remembers which
// server was asked and with which credential.
type recorder struct {
	mu   sync.Mutex
	seen []string // "<server> <Authorization>"
}

func (rec *recorder) server(t *testing.T, name string) string {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		rec.mu.Lock()
		rec.seen = append(rec.seen, name+" "+r.Header.Get("Authorization"))
		rec.mu.Unlock()
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusNotFound)
		w.Write([]byte(`{"error":{"code":"not_found","message":"no such thing"}}`))
	}))
	t.Cleanup(srv.Close)
	return srv.URL
}

func (rec *recorder) last(t *testing.T) string {
	t.Helper()
	rec.mu.Lock()
	defer rec.mu.Unlock()
	if len(rec.seen) == 0 {
		t.Fatal("no request reached a gateway")
	}
	return rec.seen[len(rec.seen)-1]
}

// Settings come from flags, then the environment, then the current
// context (or --context's), then the defaults.
func TestConfigContextPrecedence(t *testing.T) {
	rec := &recorder{}
	fromContext, fromEnv, fromFlag := rec.server(t, "context"), rec.server(t, "env"), rec.server(t, "flag")
	cfgPath := filepath.Join(t.TempDir(), "kurz", "config.yaml")
	c := &ctl{t: t, env: map[string]string{"KURZ_CONFIG": cfgPath}, stdin: "ctx-key\n"}
	c.ok("config", "set-context", "prod", "--url", fromContext, "--api-key-stdin")
	c.ok("config", "set-context", "other", "--url", fromEnv)
	c.ok("config", "use-context", "prod")

	if r := c.run("links", "get", "abc1234"); r.code != exitError || rec.last(t) != "context Bearer ctx-key" {
		t.Fatalf("context: %s\nlast request: %s", r, rec.last(t))
	}
	c.env["KURZ_URL"], c.env["KURZ_API_KEY"] = fromEnv, "env-key"
	if c.run("links", "get", "abc1234"); rec.last(t) != "env Bearer env-key" {
		t.Fatalf("env over context: last request %s", rec.last(t))
	}
	if c.run("links", "get", "abc1234", "--url", fromFlag, "--api-key", "flag-key"); rec.last(t) != "flag Bearer flag-key" {
		t.Fatalf("flags over env: last request %s", rec.last(t))
	}
	delete(c.env, "KURZ_URL")
	delete(c.env, "KURZ_API_KEY")
	if c.run("--context", "other", "links", "get", "abc1234"); rec.last(t) != "env " {
		t.Fatalf("--context other: last request %q", rec.last(t))
	}
	if r := c.run("--context", "nosuch", "links", "get", "abc1234"); r.code != exitUsage || !strings.Contains(r.stderr, `no context "nosuch"`) {
		t.Fatalf("unknown context: %s", r)
	}
}

// A context's credentials go to its own gateway only: --url or KURZ_URL
// naming another gets none of them, and its 401 says why.
func TestContextCredentialsStayWithTheirGateway(t *testing.T) {
	rec := &recorder{}
	own, other := rec.server(t, "own"), rec.server(t, "other")
	cfgPath := filepath.Join(t.TempDir(), "config.yaml")
	c := &ctl{t: t, env: map[string]string{"KURZ_CONFIG": cfgPath}, stdin: "ctx-key\n"}
	c.ok("config", "set-context", "prod", "--url", own+"/", "--api-key-stdin", "--admin-token", "ctx-admin-token-0123456789")

	if c.run("links", "get", "abc1234"); rec.last(t) != "own Bearer ctx-key" {
		t.Fatalf("the context's own URL (given with a trailing slash): last request %q", rec.last(t))
	}
	if c.run("--url", own, "links", "get", "abc1234"); rec.last(t) != "own Bearer ctx-key" {
		t.Fatalf("--url naming the context's URL: last request %q", rec.last(t))
	}
	if c.run("--url", other, "links", "get", "abc1234"); rec.last(t) != "other " {
		t.Fatalf("--url elsewhere: last request %q, want no credential", rec.last(t))
	}
	c.env["KURZ_URL"] = other
	if c.run("links", "get", "abc1234"); rec.last(t) != "other " {
		t.Fatalf("KURZ_URL elsewhere: last request %q, want no credential", rec.last(t))
	}
	if r := c.run("--api-key", "given", "links", "get", "abc1234"); r.code != exitError || rec.last(t) != "other Bearer given" {
		t.Fatalf("a key given with KURZ_URL: %s, last request %q", r, rec.last(t))
	}
	if r := c.run("tenants", "get", "acme"); r.code != exitUsage || !strings.Contains(r.stderr, `context "prod"'s token is only sent to its own URL`) {
		t.Fatalf("the admin API elsewhere: %s", r)
	}
}

// The config file is written for its owner alone; no command prints its
// secrets; a file with secrets that others can read is refused.
func TestConfigKeepsSecrets(t *testing.T) {
	cfgPath := filepath.Join(t.TempDir(), "config.yaml")
	const key, token = "kurz_secretkey_0123456789", "admin-secret-token-0123456789"
	c := &ctl{t: t, env: map[string]string{"XDG_CONFIG_HOME": filepath.Dir(cfgPath), "HOME": "/nonexistent"}}
	cfgPath = filepath.Join(filepath.Dir(cfgPath), "kurz", "config.yaml") // XDG_CONFIG_HOME/kurz/config.yaml
	c.ok("config", "set-context", "prod", "--url", "https://kurz.example.com", "--api-key", key, "--admin-token", token)

	st, err := os.Stat(cfgPath)
	if err != nil {
		t.Fatal(err)
	}
	if st.Mode().Perm() != 0o600 {
		t.Errorf("config file mode %04o, want 0600", st.Mode().Perm())
	}
	raw, _ := os.ReadFile(cfgPath)
	if !strings.Contains(string(raw), key) {
		t.Fatalf("the file does not hold the key:\n%s", raw)
	}
	for _, args := range [][]string{
		{"config", "view"}, {"config", "view", "-o", "json"}, {"config", "get-contexts"}, {"config", "get-contexts", "-o", "yaml"},
		{"config", "set-context", "prod", "-o", "json"},
	} {
		r := c.run(args...)
		if r.code != 0 || strings.Contains(r.stdout+r.stderr, key) || strings.Contains(r.stdout+r.stderr, token) {
			t.Errorf("kurzctl %s shows a secret or failed: %s", strings.Join(args, " "), r)
		}
	}
	if out := c.ok("config", "view"); !strings.Contains(out, "api-key: "+redacted) || !strings.Contains(out, "current-context: prod") {
		t.Errorf("config view:\n%s", out)
	}

	if err := os.Chmod(cfgPath, 0o644); err != nil {
		t.Fatal(err)
	}
	r := c.run("links", "get", "abc1234")
	if r.code != exitError || !strings.Contains(r.stderr, "chmod 600") || strings.Contains(r.stderr, key) {
		t.Errorf("a world-readable file with secrets: %s", r)
	}
}

// The admin token is the gateway's variable, KURZ_GATEWAY_ADMIN_TOKEN;
// KURZ_ADMIN_TOKEN still works, with a warning, and the new name wins.
func TestAdminTokenVariable(t *testing.T) {
	rec := &recorder{}
	url := rec.server(t, "gw")
	cfg := filepath.Join(t.TempDir(), "config.yaml")
	for _, tt := range []struct {
		name     string
		env      map[string]string
		wantAuth string
		warns    bool
	}{
		{"server's name", map[string]string{"KURZ_GATEWAY_ADMIN_TOKEN": "new"}, "gw Bearer new", false},
		{"deprecated alias", map[string]string{"KURZ_ADMIN_TOKEN": "old"}, "gw Bearer old", true},
		{"both", map[string]string{"KURZ_GATEWAY_ADMIN_TOKEN": "new", "KURZ_ADMIN_TOKEN": "old"}, "gw Bearer new", false},
	} {
		t.Run(tt.name, func(t *testing.T) {
			tt.env["KURZ_URL"], tt.env["KURZ_CONFIG"] = url, cfg
			r := (&ctl{t: t, env: tt.env}).run("tenants", "get", "acme")
			if r.code != exitError || rec.last(t) != tt.wantAuth {
				t.Fatalf("%s\nlast request: %s, want %s", r, rec.last(t), tt.wantAuth)
			}
			if warned := strings.Contains(r.stderr, "KURZ_ADMIN_TOKEN is deprecated"); warned != tt.warns {
				t.Errorf("warned %v, want %v: %s", warned, tt.warns, r.stderr)
			}
		})
	}
}

// cobra parses every command line: global flags before the command or
// after it, a command's flags between its arguments, "--" ending the
// flags, and each flag's value completed where it has a fixed set.
func TestFlagsAnywhere(t *testing.T) {
	var mu sync.Mutex
	var paths []string
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		paths = append(paths, r.Method+" "+r.URL.EscapedPath()+" "+r.Header.Get("Authorization"))
		mu.Unlock()
		w.Header().Set("Content-Type", "application/json")
		w.Write([]byte(`{"code":"abc1234","longUrl":"https://example.com"}`))
	}))
	t.Cleanup(srv.Close)
	c := &ctl{t: t, env: map[string]string{"KURZ_CONFIG": filepath.Join(t.TempDir(), "config.yaml")}}
	last := func() string {
		mu.Lock()
		defer mu.Unlock()
		return paths[len(paths)-1]
	}
	for _, tt := range []struct {
		args []string
		want string
	}{
		{[]string{"--url", srv.URL, "--api-key", "k1", "links", "get", "abc1234"}, "GET /v1/links/abc1234 Bearer k1"},
		{[]string{"links", "get", "abc1234", "--url", srv.URL, "--api-key=k2"}, "GET /v1/links/abc1234 Bearer k2"},
		{[]string{"links", "--url", srv.URL, "get", "abc1234"}, "GET /v1/links/abc1234 "},
		{[]string{"--url", srv.URL, "links", "get", "--", "-abc"}, "GET /v1/links/-abc "},
	} {
		c.ok(tt.args...)
		if got := last(); got != tt.want {
			t.Errorf("kurzctl %s: sent %q, want %q", strings.Join(tt.args, " "), got, tt.want)
		}
	}
	if out := decodeJSON(t, c.ok("-o", "json", "--url", srv.URL, "links", "get", "abc1234")); out["code"] != "abc1234" {
		t.Errorf("-o json before the command: %v", out)
	}
	if r := c.run("links", "get", "abc1234", "--url"); r.code != exitUsage || !strings.Contains(r.stderr, "flag needs an argument: --url") {
		t.Errorf("--url without a value: %s", r)
	}
	if r := c.run("help", "links", "nosuch"); r.code != exitUsage || !strings.Contains(r.stderr, `no such command "links nosuch"`) {
		t.Errorf("help of no command: %s", r)
	}
	c.ok("config", "set-context", "staging", "--url", srv.URL)
	if out := c.ok("__complete", "links", "list", "--context", ""); !strings.Contains(out, "staging") {
		t.Errorf("--context's value is not completed from the config file:\n%s", out)
	}
	if out := c.ok("__complete", "--output", ""); !strings.Contains(out, "yaml") {
		t.Errorf("--output's value is not completed:\n%s", out)
	}
}

// A credential goes over plain http only to this machine, unless
// --plain-http says the network is trusted.
func TestCredentialsStayOffPlainHTTP(t *testing.T) {
	rec := &recorder{}
	local := rec.server(t, "local")
	c := &ctl{t: t, env: map[string]string{"KURZ_CONFIG": filepath.Join(t.TempDir(), "config.yaml")}}
	for _, tt := range []struct{ url, auth, what string }{
		{"http://kurz.invalid:8080", "--api-key=kurz_k_secret", "API key"},
		{"http://192.0.2.1", "--admin-token=admin-secret-token-0123456789", "admin token"},
		{"http://[2001:db8::1]:8080", "--api-key=kurz_k_secret", "API key"},
		// A trailing dot sends the name to DNS instead of /etc/hosts.
		{"http://localhost.:8080", "--api-key=kurz_k_secret", "API key"},
	} {
		args := []string{"--url", tt.url, tt.auth, "links", "get", "abc1234"}
		if tt.what == "admin token" {
			args = []string{"--url", tt.url, tt.auth, "tenants", "get", "acme"}
		}
		r := c.run(args...)
		if r.code != exitUsage || !strings.Contains(r.stderr, "refusing to send the "+tt.what+" to "+tt.url+" over plain http") {
			t.Errorf("%s to %s: %s; want a usage error refusing plain http", tt.what, tt.url, r)
		}
		r = c.run(append([]string{"--plain-http", "--timeout=2s"}, args...)...)
		if r.code != exitError || strings.Contains(r.stderr, "refusing") {
			t.Errorf("%s to %s with --plain-http: %s; want the call tried (a network error)", tt.what, tt.url, r)
		}
	}
	if r := c.run("--url", "http://kurz.invalid:8080", "links", "get", "abc1234", "--timeout=2s"); r.code != exitError || strings.Contains(r.stderr, "refusing") {
		t.Errorf("no credential to a plain http URL: %s; want the call tried", r)
	}
	for _, u := range []string{local, strings.Replace(local, "127.0.0.1", "localhost", 1), strings.Replace(local, "127.0.0.1", "LocalHost", 1)} {
		if r := c.run("--url", u, "--api-key", "kurz_k_secret", "links", "get", "abc1234"); r.code != exitError || rec.last(t) != "local Bearer kurz_k_secret" {
			t.Errorf("API key to %s (this machine): %s, last request %q; want it sent", u, r, rec.last(t))
		}
	}
}

// exposes is the decision: a credential crosses the network in clear over
// http:// to any host but this machine's loopback names and addresses.
func TestExposesOnlyPlainHTTPToAnotherMachine(t *testing.T) {
	for _, tt := range []struct {
		url  string
		want bool
	}{
		{"http://127.0.0.1:8080", false},
		{"http://127.3.4.5", false},
		{"http://[::1]:8080", false},
		{"http://localhost:8080", false},
		{"http://LOCALHOST", false},
		{"https://kurz.example.com", false},
		{"https://192.168.1.20:8443", false},
		{"http://192.168.1.20:8080", true},
		{"http://10.0.0.7", true},
		{"http://kurz.example.com", true},
		{"http://kurz-gateway.kurz:8080", true},
		{"http://[2001:db8::1]:8080", true},
		{"http://localhost.:8080", true},
		{"http://127.0.0.1.example.com", true},
	} {
		if got := exposes(tt.url); got != tt.want {
			t.Errorf("exposes(%q) = %v, want %v", tt.url, got, tt.want)
		}
	}
}

// --plain-http's opt-in comes from KURZ_PLAIN_HTTP too, for a pod or a job,
// and from a context's plain-http, which holds for that context's own URL
// only: a --url naming another gateway is refused again. The flag wins over
// the variable, the variable over the context.
func TestPlainHTTPOptInFromEnvironmentAndContext(t *testing.T) {
	cfgPath := filepath.Join(t.TempDir(), "config.yaml")
	remote := "http://kurz.invalid:8080"
	get := []string{"--timeout=2s", "links", "get", "abc1234"}
	refused := func(r result) bool {
		return r.code == exitUsage && strings.Contains(r.stderr, "refusing to send the API key to ")
	}
	tried := func(r result) bool { return r.code == exitError && !strings.Contains(r.stderr, "refusing") }

	env := &ctl{t: t, env: map[string]string{"KURZ_CONFIG": cfgPath, "KURZ_URL": remote, "KURZ_API_KEY": "kurz_k_secret", plainHTTPEnv: "true"}}
	if r := env.run(get...); !tried(r) {
		t.Errorf("%s=true: %s; want the call tried (a network error)", plainHTTPEnv, r)
	}
	if r := env.run(append([]string{"--plain-http=false"}, get...)...); !refused(r) {
		t.Errorf("--plain-http=false over %s=true: %s; want the flag to win and refuse", plainHTTPEnv, r)
	}
	env.env[plainHTTPEnv] = "false"
	if r := env.run(get...); !refused(r) || !strings.Contains(r.stderr, plainHTTPEnv+"=true") {
		t.Errorf("%s=false: %s; want a refusal that names the variable", plainHTTPEnv, r)
	}
	env.env[plainHTTPEnv] = "yes please"
	if r := env.run(get...); r.code != exitUsage || !strings.Contains(r.stderr, plainHTTPEnv+`="yes please": want true or false`) {
		t.Errorf("%s=yes please: %s; want a usage error naming the variable", plainHTTPEnv, r)
	}

	c := &ctl{t: t, env: map[string]string{"KURZ_CONFIG": cfgPath}, stdin: "kurz_k_secret\n"}
	c.ok("config", "set-context", "cluster", "--url", remote, "--api-key-stdin", "--plain-http", "--use")
	var view kurzConfig
	if err := json.Unmarshal([]byte(c.ok("config", "view", "-o", "json")), &view); err != nil || len(view.Contexts) != 1 || !view.Contexts[0].PlainHTTP {
		t.Errorf("config view after set-context --plain-http: %+v (%v); want plain-http stored", view, err)
	}
	if r := c.run(get...); !tried(r) {
		t.Errorf("a context with plain-http, to its own URL: %s; want the call tried", r)
	}
	if r := c.run(append([]string{"--url", "http://other.invalid:8080", "--api-key", "kurz_k_other"}, get...)...); !refused(r) {
		t.Errorf("a context with plain-http, --url naming another gateway: %s; want it refused", r)
	}
	withEnv := &ctl{t: t, env: map[string]string{"KURZ_CONFIG": cfgPath, plainHTTPEnv: "false"}}
	if r := withEnv.run(get...); !refused(r) {
		t.Errorf("%s=false over a context's plain-http: %s; want the variable to win and refuse", plainHTTPEnv, r)
	}
	c.ok("config", "set-context", "cluster", "--plain-http=false")
	if r := c.run(get...); !refused(r) {
		t.Errorf("after set-context --plain-http=false: %s; want it refused", r)
	}
}

// config get-contexts shows which contexts let credentials go over plain
// http, as it shows which hold them.
func TestGetContextsShowsPlainHTTP(t *testing.T) {
	c := &ctl{t: t, env: map[string]string{"KURZ_CONFIG": filepath.Join(t.TempDir(), "config.yaml")}}
	c.ok("config", "set-context", "cluster", "--url", "http://kurz.invalid:8080", "--plain-http", "--use")
	c.ok("config", "set-context", "prod", "--url", "https://kurz.example.com")
	lines := strings.Split(strings.TrimSpace(c.ok("config", "get-contexts")), "\n")
	if len(lines) != 3 || strings.Join(strings.Fields(lines[0]), " ") != "CURRENT NAME URL PLAIN HTTP LIMITER API KEY ADMIN TOKEN" {
		t.Fatalf("config get-contexts:\n%s\nwant a PLAIN HTTP column after URL, and two contexts", strings.Join(lines, "\n"))
	}
	for _, want := range [][]string{
		{"*", "cluster", "http://kurz.invalid:8080", "yes", "-", "-", "-"},
		{"prod", "https://kurz.example.com", "-", "-", "-", "-"},
	} {
		if !slices.ContainsFunc(lines[1:], func(l string) bool { return slices.Equal(strings.Fields(l), want) }) {
			t.Errorf("config get-contexts:\n%s\nwant a row %q", strings.Join(lines, "\n"), want)
		}
	}
}

// A link's password goes over plain http only to this machine, unless
// --plain-http says the network is trusted, with no API key as with one:
// anyone on the way would read it and open the link.
func TestLinkPasswordStaysOffPlainHTTP(t *testing.T) {
	rec := &recorder{}
	local := rec.server(t, "local")
	c := &ctl{t: t, env: map[string]string{"KURZ_CONFIG": filepath.Join(t.TempDir(), "config.yaml")}, stdin: "s3cret-pw\n"}
	for _, args := range [][]string{
		{"links", "create", "https://example.com/private", "--password-stdin"},
		{"links", "create", "https://example.com/private", "--password", "s3cret-pw"},
		{"links", "update", "abc1234", "--password-stdin"},
	} {
		remote := append([]string{"--url", "http://kurz.invalid:8080", "--timeout=2s"}, args...)
		r := c.run(remote...)
		if r.code != exitUsage || !strings.Contains(r.stderr, "refusing to send the link's password to http://kurz.invalid:8080 over plain http") {
			t.Errorf("kurzctl %s: %s; want a usage error refusing plain http", strings.Join(remote, " "), r)
		}
		if r := c.run(append([]string{"--plain-http"}, remote...)...); r.code != exitError || strings.Contains(r.stderr, "refusing") {
			t.Errorf("kurzctl --plain-http %s: %s; want the call tried (a network error)", strings.Join(remote, " "), r)
		}
		rec.mu.Lock()
		rec.seen = nil
		rec.mu.Unlock()
		if r := c.run(append([]string{"--url", local}, args...)...); strings.Contains(r.stderr, "refusing") || rec.last(t) != "local " {
			t.Errorf("kurzctl %s to %s (this machine): %s; want it sent", strings.Join(args, " "), local, r)
		}
	}
	if r := c.run("--url", "http://kurz.invalid:8080", "--timeout=2s", "links", "update", "abc1234", "--clear-password"); r.code != exitError || strings.Contains(r.stderr, "refusing") {
		t.Errorf("--clear-password to a plain http URL: %s; want the call tried", r)
	}
}

// A gateway URL with a user or password in it (https://admin:pw@host) is
// refused wherever it comes from, with a message that names the fix and not
// the password; one stored by an older kurzctl is shown redacted.
func TestURLWithUserinfoIsRefused(t *testing.T) {
	dir := t.TempDir()
	cfgPath := filepath.Join(dir, "config.yaml")
	c := &ctl{t: t, env: map[string]string{"KURZ_CONFIG": cfgPath}}
	const secret = "hunter2-url-secret"
	for _, args := range [][]string{
		{"config", "set-context", "prod", "--url", "https://admin:" + secret + "@kurz.example.com"},
		{"--url", "https://" + secret + "@kurz.example.com", "links", "get", "abc1234"},
	} {
		r := c.run(args...)
		if r.code != exitUsage || !strings.Contains(r.stderr, "remove the user and password from the URL of https://kurz.example.com") ||
			strings.Contains(r.stdout+r.stderr, secret) {
			t.Errorf("kurzctl %s: %s; want a usage error naming the fix, not the password", strings.Join(args, " "), r)
		}
	}
	if _, err := os.Stat(cfgPath); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("set-context with a refused URL wrote the config file (%v)", err)
	}

	old := "current-context: old\ncontexts:\n- name: old\n  url: https://admin:" + secret + "@kurz.example.com\n"
	if err := os.WriteFile(cfgPath, []byte(old), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, args := range [][]string{{"config", "view"}, {"config", "view", "-o", "json"}, {"config", "get-contexts"}} {
		r := c.run(args...)
		if r.code != 0 || strings.Contains(r.stdout+r.stderr, secret) || !strings.Contains(r.stdout, redacted+"@kurz.example.com") {
			t.Errorf("kurzctl %s of a stored URL with a password: %s; want it shown redacted", strings.Join(args, " "), r)
		}
	}
	if r := c.run("links", "get", "abc1234"); r.code != exitUsage || strings.Contains(r.stdout+r.stderr, secret) {
		t.Errorf("a command with a stored URL with a password: %s; want it refused without the password", r)
	}
}
