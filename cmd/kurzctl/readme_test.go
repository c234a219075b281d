//go:build integration

package main

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	ratelimitv1 "kurz.dev/gen/kurz/ratelimit/v1"
	"kurz.dev/pkg/testkit/mdblock"
	"kurz.dev/services/gateway/gatewaytest"
)

// cliDoc is the page whose examples the test runs, and cliSection the
// section of it that holds them.
var cliDoc = filepath.Join("..", "..", "docs", "cli.md")

const cliSection = "## Using kurzctl"

// readmeTenant is the tenant the CLI examples of docs/cli.md create. It is not
// random (the examples are run verbatim): the test deletes it before and
// after.
const readmeTenant = "acme"

// The "Using kurzctl" section of docs/cli.md, run verbatim: its ```console
// blocks hold shell commands ("$ " lines) each followed by its output
// (stdout and stderr). The test runs every command in order in one bash,
// with kurzctl on PATH (this test binary, as kurzctl), against a test
// gateway whose limiter has the rules in PostgreSQL (as under make up);
// only the environment differs from make up's: KURZ_URL, KURZ_GATEWAY_ADMIN_TOKEN,
// KURZ_LIMITER_ADDR. Each output is compared with the page's line by
// line, where "…" matches any run of characters within a line (codes,
// times, keys: what changes from run to run).
func TestREADMECLIExamples(t *testing.T) {
	examples := readmeCLIExamples(t)
	gw := startGateway(t, stack.LimiterPG)
	if err := gatewaytest.DeleteTenants(context.Background(), stack.DB, readmeTenant); err != nil {
		t.Fatal(err)
	}
	cleanupTenants(t, readmeTenant)

	// kurzctl on PATH is this binary, run as kurzctl.
	binDir := t.TempDir()
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(self, filepath.Join(binDir, "kurzctl")); err != nil {
		t.Fatal(err)
	}
	env := []string{runAsKurzctl + "=1", "PATH=" + binDir + string(os.PathListSeparator) + os.Getenv("PATH"),
		"KURZ_URL=" + gw.url, "KURZ_GATEWAY_ADMIN_TOKEN=" + adminToken, "KURZ_LIMITER_ADDR=" + gw.limiter, "LC_ALL=C.UTF-8",
		// No config file of the machine's user: the page's settings alone.
		"KURZ_CONFIG=" + filepath.Join(t.TempDir(), "config.yaml")}
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "KURZ_API_KEY=") && !strings.HasPrefix(kv, "KURZ_URL=") && !strings.HasPrefix(kv, "KURZ_ADMIN_TOKEN=") &&
			!strings.HasPrefix(kv, "KURZ_GATEWAY_ADMIN_TOKEN=") && !strings.HasPrefix(kv, "KURZ_CONFIG=") && !strings.HasPrefix(kv, "KURZ_CONTEXT=") &&
			!strings.HasPrefix(kv, "KURZ_LIMITER_ADDR=") && !strings.HasPrefix(kv, "PATH=") {
			env = append(env, kv)
		}
	}
	sh := startShell(t, env)

	// What docs/cli.md leaves to time, the test awaits: a plan reaches the
	// limiters by NOTIFY, within a second.
	after := map[string]func(){
		"kurzctl tenants create " + readmeTenant: func() { awaitPlan(t, gw.limiter, readmeTenant) },
	}
	for _, ex := range examples {
		got := sh.run(ex.command)
		if problem := gatewaytest.MatchOutput(ex.want, got); problem != "" {
			t.Errorf("docs/cli.md line %d: $ %s\n%s\ngot:\n%s", ex.line, ex.command, problem, got)
		}
		for prefix, hook := range after {
			if strings.HasPrefix(ex.command, prefix) {
				hook()
			}
		}
	}
}

// cliExample is one "$ " command of docs/cli.md and its output.
type cliExample struct {
	command string
	want    string
	line    int // 1-based
}

// readmeCLIExamples reads the commands and outputs of the ```console
// blocks under cliSection.
func readmeCLIExamples(t *testing.T) []cliExample {
	t.Helper()
	var out []cliExample
	for _, b := range mdblock.In(mdblock.Read(t, cliDoc), cliSection, "console") {
		line := b.Line // the opening fence's
		for l := range strings.Lines(b.Code) {
			l, line = strings.TrimSuffix(l, "\n"), line+1
			switch {
			case strings.HasPrefix(l, "$ "):
				out = append(out, cliExample{command: strings.TrimPrefix(l, "$ "), line: line})
			case len(out) > 0:
				out[len(out)-1].want += l + "\n"
			default:
				t.Fatalf("docs/cli.md line %d: output before any command", line)
			}
		}
	}
	if len(out) < 5 {
		t.Fatalf("found %d commands in ```console blocks under %q", len(out), cliSection)
	}
	return out
}

// shell is one bash that runs commands one at a time.
type shell struct {
	t     *testing.T
	stdin io.Writer
	out   *bufio.Reader
}

// shellMarker ends each command's output.
const shellMarker = "@@@ end of command @@@"

func startShell(t *testing.T, env []string) *shell {
	t.Helper()
	pr, pw, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command("bash", "--noprofile", "--norc")
	cmd.Dir = t.TempDir()
	cmd.Env = env
	// One pipe for both: the output interleaves as on a terminal.
	cmd.Stdout, cmd.Stderr = pw, pw
	stdin, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	pw.Close()
	t.Cleanup(func() {
		stdin.Close()
		if err := cmd.Wait(); err != nil {
			t.Errorf("bash: %v", err)
		}
		pr.Close()
	})
	return &shell{t: t, stdin: stdin, out: bufio.NewReader(pr)}
}

// run runs one command line and returns what it printed.
func (s *shell) run(command string) string {
	s.t.Helper()
	// The marker keeps the command's exit status for the next "echo $?".
	if _, err := fmt.Fprintf(s.stdin, "%s\n__rc=$?; echo '%s'; (exit $__rc)\n", command, shellMarker); err != nil {
		s.t.Fatalf("bash: %v", err)
	}
	var b strings.Builder
	for {
		line, err := s.out.ReadString('\n')
		if err != nil {
			s.t.Fatalf("bash ended during %q: %v\n%s", command, err, b.String())
		}
		if line == shellMarker+"\n" {
			return b.String()
		}
		b.WriteString(line)
	}
}

// awaitPlan waits until the limiter applies tenant's plan: its
// links.create rule names it.
func awaitPlan(t *testing.T, limiter, tenant string) {
	t.Helper()
	conn, err := grpc.NewClient(limiter, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	client := ratelimitv1.NewRateLimitServiceClient(conn)
	deadline := time.Now().Add(10 * time.Second)
	for {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		resp, err := client.ExplainQuota(ctx, &ratelimitv1.ExplainQuotaRequest{Domain: "links.create", Descriptors: map[string]string{"tenant": tenant}})
		cancel()
		if err != nil {
			t.Fatalf("explain: %v", err)
		}
		for _, r := range resp.GetRules() {
			if r.GetPlan() != "" {
				return
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("the limiter did not apply %s's plan within 10 s", tenant)
		}
		time.Sleep(20 * time.Millisecond)
	}
}
