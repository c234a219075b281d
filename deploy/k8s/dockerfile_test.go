package k8s

import (
	"bufio"
	"bytes"
	"debug/elf"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/moby/buildkit/frontend/dockerfile/instructions"
	"github.com/moby/buildkit/frontend/dockerfile/parser"
	"github.com/moby/buildkit/frontend/dockerfile/shell"
	"github.com/moby/patternmatcher"
	"github.com/moby/patternmatcher/ignorefile"
)

// dockerfile is the repository's Dockerfile as BuildKit's own parser
// (the one `docker build` runs) reads it.
type dockerfile struct {
	Syntax string // image of the # syntax= directive, or ""
	Stages []instructions.Stage
}

func readDockerfile(t *testing.T) dockerfile {
	t.Helper()
	data, err := os.ReadFile(filepath.Join(repoRoot(t), "Dockerfile"))
	if err != nil {
		t.Fatal(err)
	}
	ast, err := parser.Parse(bytes.NewReader(data))
	if err != nil {
		t.Fatalf("Dockerfile: %v", err)
	}
	stages, _, err := instructions.Parse(ast.AST, nil)
	if err != nil {
		t.Fatalf("Dockerfile: %v", err)
	}
	syntax, _, _, _ := parser.DetectSyntax(data)
	return dockerfile{Syntax: syntax, Stages: stages}
}

// stage returns the stage named name, or fails the test.
func (df dockerfile) stage(t *testing.T, name string) instructions.Stage {
	t.Helper()
	for _, s := range df.Stages {
		if s.Name == name {
			return s
		}
	}
	t.Fatalf("the Dockerfile has no stage %q", name)
	return instructions.Stage{}
}

// commands returns a stage's commands of type T, in order.
func commands[T instructions.Command](s instructions.Stage) []T {
	var out []T
	for _, c := range s.Commands {
		if v, ok := c.(T); ok {
			out = append(out, v)
		}
	}
	return out
}

// expandFor expands ${SERVICE} (and any other build argument, to nothing)
// as Docker does for a build of svc.
func expandFor(svc string) func(string) (string, error) {
	lex := shell.NewLex('\\')
	env := shell.EnvsFromSlice([]string{"SERVICE=" + svc})
	return func(word string) (string, error) {
		s, _, err := lex.ProcessWord(word, env)
		return s, err
	}
}

func TestDockerfile(t *testing.T) {
	df := readDockerfile(t)
	if len(df.Stages) < 2 {
		t.Fatalf("%d stages, want a multi-stage build", len(df.Stages))
	}
	if df.Syntax != "" && imageProblem(df.Syntax) != "" {
		t.Errorf("syntax directive: %s", imageProblem(df.Syntax))
	}
	names := map[string]bool{}
	for _, s := range df.Stages {
		if !names[s.BaseName] {
			if p := imageProblem(s.BaseName); p != "" {
				t.Errorf("FROM %s: %s", s.BaseName, p)
			}
		}
		if s.Name != "" {
			names[s.Name] = true
		}
	}

	// The build stage: golang at the module's Go version, go.mod and go.sum
	// copied before the download, a static trimmed build.
	build := df.Stages[0]
	goVersion := fromGoMod(t, `^go (\d+\.\d+)`)
	if !regexp.MustCompile(`^golang:` + regexp.QuoteMeta(goVersion) + `\.\d+(-[a-z0-9]+)?$`).MatchString(build.BaseName) {
		t.Errorf("build stage FROM %s, want golang:%s.<patch> (go.mod says go %s)", build.BaseName, goVersion, goVersion)
	}
	var before []string // what is copied before go mod download
	downloaded := false
	for _, c := range build.Commands {
		switch c := c.(type) {
		case *instructions.CopyCommand:
			if !downloaded && c.From == "" {
				before = append(before, c.SourcePaths...)
			}
		case *instructions.RunCommand:
			downloaded = downloaded || strings.Contains(strings.Join(c.CmdLine, " "), "go mod download")
		}
	}
	if !downloaded {
		t.Fatal("no RUN go mod download in the build stage")
	}
	for _, w := range []string{"go.mod", "go.sum"} {
		if !slices.Contains(before, w) {
			t.Errorf("%s is not copied before go mod download", w)
		}
	}
	if !slices.ContainsFunc(commands[*instructions.ArgCommand](build), func(a *instructions.ArgCommand) bool {
		return len(a.Args) == 1 && a.Args[0].Key == "SERVICE"
	}) {
		t.Error("build stage: no ARG SERVICE")
	}
	for _, svc := range services {
		buildCmd := goBuildCommand(t, build, svc)
		for _, want := range []string{"CGO_ENABLED=0", "-trimpath", "./services/" + svc} {
			if !slices.Contains(buildCmd, want) {
				t.Errorf("go build command %q lacks %q", buildCmd, want)
			}
		}
		// Stripped, and stamped with the build information kurz binaries
		// report (ARG VERSION, COMMIT, DATE; pkg/buildinfo).
		i := slices.IndexFunc(buildCmd, func(a string) bool { return strings.HasPrefix(a, "-ldflags=") })
		if i < 0 || !strings.HasPrefix(buildCmd[i], "-ldflags=-s -w ") {
			t.Errorf("go build command %q: no -ldflags starting with -s -w", buildCmd)
			continue
		}
		for _, v := range []string{"Version", "Commit", "Date"} {
			if !strings.Contains(buildCmd[i], "-X kurz.dev/pkg/buildinfo."+v+"=") {
				t.Errorf("go build command %q does not set buildinfo.%s", buildCmd, v)
			}
		}
	}
	for _, arg := range []string{"VERSION", "COMMIT", "DATE"} {
		if !slices.ContainsFunc(commands[*instructions.ArgCommand](build), func(a *instructions.ArgCommand) bool {
			return len(a.Args) == 1 && a.Args[0].Key == arg
		}) {
			t.Errorf("build stage: no ARG %s", arg)
		}
	}

	// The final stage is what `docker build` produces by default.
	final := df.Stages[len(df.Stages)-1]
	if !strings.HasPrefix(final.BaseName, "gcr.io/distroless/static") && final.BaseName != "scratch" {
		t.Errorf("final stage FROM %s, want distroless static or scratch", final.BaseName)
	}
	for _, s := range df.Stages[1:] {
		users := commands[*instructions.UserCommand](s)
		if len(users) == 0 {
			t.Errorf("stage %s sets no USER", s.Name)
			continue
		}
		if u := users[len(users)-1].User; u != "65532:65532" && u != "nonroot:nonroot" && u != "nonroot" {
			t.Errorf("stage %s: USER %s, want 65532:65532", s.Name, u)
		}
		eps := commands[*instructions.EntrypointCommand](s)
		if len(eps) == 0 || eps[len(eps)-1].PrependShell {
			t.Errorf("stage %s: want an exec-form ENTRYPOINT", s.Name)
		}
	}
}

// goBuildCommand returns the build stage's go build command for svc, as
// the shell's words, with the variable assignments before it.
func goBuildCommand(t *testing.T, build instructions.Stage, svc string) []string {
	t.Helper()
	for _, run := range commands[*instructions.RunCommand](build) {
		words, err := shell.NewLex('\\').ProcessWords(strings.Join(run.CmdLine, " "), shell.EnvsFromSlice([]string{"SERVICE=" + svc}))
		if err != nil {
			t.Fatalf("RUN %s: %v", run.CmdLine, err)
		}
		for i, w := range words {
			if w == "go" && i+1 < len(words) && words[i+1] == "build" {
				j := i
				for j > 0 && strings.Contains(words[j-1], "=") && !strings.HasPrefix(words[j-1], "-") {
					j--
				}
				return words[j:]
			}
		}
	}
	t.Fatal("no RUN go build in the build stage")
	return nil
}

// buildContext assembles, in a temporary directory, what the build stage's
// COPY instructions put into its WORKDIR for a build of svc, leaving out
// what .dockerignore keeps out of Docker's build context (so a file the
// build needs but the image does not get is missing there too), and
// returns it.
func buildContext(t *testing.T, build instructions.Stage, svc string) string {
	t.Helper()
	if w := commands[*instructions.WorkdirCommand](build); len(w) != 1 || w[0].Path != "/src" {
		t.Fatalf("build stage: want one WORKDIR /src, got %v", w)
	}
	root, src, ignored := repoRoot(t), filepath.Join(t.TempDir(), "src"), dockerignore(t)
	for _, c := range commands[*instructions.CopyCommand](build) {
		// Expand rewrites in place: expand a copy, the stage is shared.
		paths := c.SourcesAndDest
		paths.SourcePaths = slices.Clone(paths.SourcePaths)
		if err := paths.Expand(expandFor(svc)); err != nil {
			t.Fatalf("%s: %v", c, err)
		}
		if err := replayCopy(root, src, paths.SourcePaths, paths.DestPath, ignored); err != nil {
			t.Fatalf("%s: %v", c, err)
		}
	}
	return src
}

// Every service's build context holds every package the service imports,
// and its embedded files: `go list -deps` resolves them all there.
func TestDockerfileBuildContextHoldsEveryImport(t *testing.T) {
	t.Parallel() // with the other slow tests, after the quick ones
	build := readDockerfile(t).Stages[0]
	for _, svc := range services {
		t.Run(svc, func(t *testing.T) {
			t.Parallel()
			cmd := exec.Command("go", "list", "-e", "-deps", "-f", "{{with .Error}}{{$.ImportPath}}: {{.}}\n{{end}}", "./services/"+svc)
			cmd.Dir = buildContext(t, build, svc)
			cmd.Env = append(os.Environ(), "CGO_ENABLED=0", "GOWORK=off")
			out, err := cmd.Output()
			if err != nil {
				t.Fatalf("go list -deps in the build context: %v", err)
			}
			if len(out) > 0 {
				t.Errorf("the build context lacks packages or files:\n%s", out)
			}
		})
	}
}

// The build stage, replayed without Docker for one service (the command
// is the same for every service but for ${SERVICE}, whose contexts
// TestDockerfileBuildContextHoldsEveryImport checks): its RUN commands run
// with sh in the build context, /out mapped to a temporary directory. The
// binary must be static and stripped, as distroless static needs.
func TestDockerfileBuildStageBuildsAStaticBinary(t *testing.T) {
	t.Parallel() // linking is mostly serial: overlap it with go list
	const svc = "gateway"
	build := readDockerfile(t).Stages[0]
	src := buildContext(t, build, svc)
	out := t.TempDir()
	for _, run := range commands[*instructions.RunCommand](build) {
		if !run.PrependShell {
			t.Fatalf("%s: want the shell form", run.String())
		}
		script := strings.ReplaceAll(strings.Join(run.CmdLine, " "), "/out/", out+"/")
		cmd := exec.Command("sh", "-c", script)
		cmd.Dir = src
		cmd.Env = append(os.Environ(), "SERVICE="+svc, "GOWORK=off")
		if b, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("%s: %v\n%s", run.String(), err, b)
		}
	}
	f, err := elf.Open(filepath.Join(out, "service"))
	if err != nil {
		t.Fatalf("the build stage left no /out/service: %v", err)
	}
	defer f.Close()
	for _, p := range f.Progs {
		if p.Type == elf.PT_INTERP {
			t.Error("the binary is dynamically linked; distroless static has no libc")
		}
	}
	if f.Section(".symtab") != nil {
		t.Error("the binary has a symbol table; -ldflags=-s should strip it")
	}
}

// replayCopy performs a COPY (sources relative to root, destination relative
// to dst, the WORKDIR) with Docker's semantics: a directory source copies its
// contents; a destination ending in / is a directory; files ignored (paths
// relative to root) are not in the build context.
func replayCopy(root, dst string, srcs []string, destPath string, ignored func(string) bool) error {
	dest := filepath.Join(dst, destPath)
	intoDir := strings.HasSuffix(destPath, "/") || len(srcs) > 1
	for _, s := range srcs {
		if ignored(s) {
			return fmt.Errorf("%s is not in the build context (.dockerignore)", s)
		}
		from := filepath.Join(root, s)
		info, err := os.Stat(from)
		if err != nil {
			return err
		}
		if !info.IsDir() {
			to := dest
			if intoDir {
				to = filepath.Join(dest, filepath.Base(s))
			}
			if err := copyFile(from, to); err != nil {
				return err
			}
			continue
		}
		err = filepath.WalkDir(from, func(path string, d fs.DirEntry, err error) error {
			if err != nil || d.IsDir() {
				return err
			}
			if rel, _ := filepath.Rel(root, path); ignored(filepath.ToSlash(rel)) {
				return nil
			}
			rel, _ := filepath.Rel(from, path)
			return copyFile(path, filepath.Join(dest, rel))
		})
		if err != nil {
			return err
		}
	}
	return nil
}

func copyFile(from, to string) error {
	data, err := os.ReadFile(from)
	if err != nil {
		return err
	}
	if err := os.MkdirAll(filepath.Dir(to), 0o755); err != nil {
		return err
	}
	return os.WriteFile(to, data, 0o644)
}

// dockerignore returns whether .dockerignore keeps a path (relative to the
// repository root, with slashes) out of Docker's build context, read and
// matched by the packages docker build uses.
func dockerignore(t *testing.T) func(path string) bool {
	t.Helper()
	f, err := os.Open(filepath.Join(repoRoot(t), ".dockerignore"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	patterns, err := ignorefile.ReadAll(f)
	if err != nil {
		t.Fatal(err)
	}
	pm, err := patternmatcher.New(patterns)
	if err != nil {
		t.Fatal(err)
	}
	return func(path string) bool {
		ok, err := pm.MatchesOrParentMatches(path)
		if err != nil {
			t.Fatal(err)
		}
		return ok
	}
}

// .dockerignore excludes what must never reach the build context and no
// source a COPY names (the files inside those that a build needs are
// TestDockerfileBuildContextHoldsEveryImport's).
func TestDockerignore(t *testing.T) {
	ignored := dockerignore(t)
	for _, want := range []string{".git/HEAD", ".local/x", "bin/buf"} {
		if !ignored(want) {
			t.Errorf(".dockerignore does not exclude %s", want)
		}
	}
	for _, s := range readDockerfile(t).Stages {
		for _, c := range commands[*instructions.CopyCommand](s) {
			if c.From != "" {
				continue
			}
			for _, svc := range services {
				for _, src := range c.SourcePaths {
					path, err := expandFor(svc)(src)
					if err != nil {
						t.Fatal(err)
					}
					if ignored(strings.TrimSuffix(path, "/")) {
						t.Errorf("stage %s copies %s, which .dockerignore excludes", s.Name, path)
					}
				}
			}
		}
	}
}

// The dev stage's restart wrapper, run with /bin/sh against a fake service:
// SIGHUP restarts the service (preferring the live-synced binary), SIGTERM
// stops it, and a service that exits by itself ends the wrapper with its
// status so that Kubernetes restarts the container.
func TestDevRestartWrapper(t *testing.T) {
	t.Parallel() // mostly waiting for the wrapper
	dev := readDockerfile(t).stage(t, "dev")
	var wrapper string
	for _, c := range commands[*instructions.CopyCommand](dev) {
		if c.DestPath == "/app/restart.sh" && len(c.SourceContents) == 1 {
			wrapper = c.SourceContents[0].Data
		}
	}
	eps := commands[*instructions.EntrypointCommand](dev)
	if wrapper == "" || len(eps) == 0 {
		t.Fatal("dev stage: want the wrapper as a heredoc COPY to /app/restart.sh and an ENTRYPOINT")
	}
	if want := []string{"/busybox/sh", "/app/restart.sh", "/app/service", "/tmp/live/service"}; !slices.Equal(eps[len(eps)-1].CmdLine, want) {
		t.Errorf("dev ENTRYPOINT %q, want %q", eps[len(eps)-1].CmdLine, want)
	}

	dir := t.TempDir()
	script := filepath.Join(dir, "restart.sh")
	// The fake sleeps in short steps: a trap runs between commands, so
	// its TERM is handled within one step wherever it lands.
	fake := `#!/bin/sh
trap 'echo "stop $0" > "$EVENTS"; exit 0' TERM
echo "start $0" > "$EVENTS"
if [ -n "${EXIT_AT_ONCE:-}" ]; then exit "$EXIT_AT_ONCE"; fi
while :; do sleep 0.1; done
`
	baked, live := filepath.Join(dir, "baked"), filepath.Join(dir, "live")
	fifo := filepath.Join(dir, "events")
	for path, body := range map[string]string{script: wrapper, baked: fake} {
		if err := os.WriteFile(path, []byte(body), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	if err := syscall.Mkfifo(fifo, 0o600); err != nil {
		t.Fatal(err)
	}
	// Opened read-write, the FIFO never reports EOF between writers.
	f, err := os.OpenFile(fifo, os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { f.Close() })
	events := make(chan string, 16)
	go func() {
		sc := bufio.NewScanner(f)
		for sc.Scan() {
			events <- sc.Text()
		}
	}()
	expect := func(want string) {
		t.Helper()
		select {
		case got := <-events:
			if got != want {
				t.Fatalf("event %q, want %q", got, want)
			}
		case <-time.After(10 * time.Second):
			t.Fatalf("no event within 10s, want %q", want)
		}
	}
	start := func(extraEnv ...string) (*exec.Cmd, chan error) {
		cmd := exec.Command("/bin/sh", script, baked, live)
		cmd.Env = append(os.Environ(), append(extraEnv, "EVENTS="+fifo)...)
		cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL) })
		done := make(chan error, 1)
		go func() { done <- cmd.Wait() }()
		return cmd, done
	}
	exitCode := func(cmd *exec.Cmd, done chan error) int {
		t.Helper()
		select {
		case <-done:
		case <-time.After(10 * time.Second):
			t.Fatal("the wrapper did not exit within 10s")
		}
		return cmd.ProcessState.ExitCode()
	}

	// A shell cannot trap a signal that was ignored when it started, and
	// SIGHUP is ignored under nohup (and so in a test binary started by
	// one). While this process is notified of SIGHUP, the processes it
	// starts get the default disposition, as PID 1 of a container does.
	hup := make(chan os.Signal, 1)
	signal.Notify(hup, syscall.SIGHUP)
	t.Cleanup(func() { signal.Stop(hup) })

	cmd, done := start()
	expect("start " + baked)
	if err := os.WriteFile(live, []byte(fake), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := cmd.Process.Signal(syscall.SIGHUP); err != nil {
		t.Fatal(err)
	}
	expect("stop " + baked)
	expect("start " + live)
	if err := cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	expect("stop " + live)
	if code := exitCode(cmd, done); code != 0 {
		t.Errorf("after SIGTERM the wrapper exited %d, want the service's 0", code)
	}

	// A service that exits by itself is not restarted.
	cmd, done = start("EXIT_AT_ONCE=3")
	expect("start " + live)
	if code := exitCode(cmd, done); code != 3 {
		t.Errorf("the wrapper exited %d, want the service's status 3", code)
	}
}
