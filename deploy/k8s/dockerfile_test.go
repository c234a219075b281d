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
)

// instruction is one Dockerfile instruction; heredoc bodies are kept apart.
type instruction struct {
	Cmd     string // upper case: FROM, RUN, COPY, ...
	Args    string
	Heredoc string
	Line    int
}

type stage struct {
	Base, Name   string
	Instructions []instruction
}

type dockerfile struct {
	Directives map[string]string // parser directives (# syntax=...)
	Stages     []stage
}

var heredocStart = regexp.MustCompile(`<<-?['"]?([A-Za-z_][A-Za-z0-9_]*)['"]?`)

func parseDockerfile(data []byte) (dockerfile, error) {
	df := dockerfile{Directives: map[string]string{}}
	sc := bufio.NewScanner(bytes.NewReader(data))
	lineNo := 0
	leading := true
	var cur *stage
	for sc.Scan() {
		lineNo++
		line := sc.Text()
		trimmed := strings.TrimSpace(line)
		if leading {
			if m := regexp.MustCompile(`^#\s*([a-z]+)\s*=\s*(\S+)`).FindStringSubmatch(trimmed); m != nil {
				df.Directives[m[1]] = m[2]
				continue
			}
			leading = false
		}
		if trimmed == "" || strings.HasPrefix(trimmed, "#") {
			continue
		}
		start := lineNo
		for strings.HasSuffix(line, "\\") && sc.Scan() {
			lineNo++
			line = strings.TrimSuffix(line, "\\") + " " + strings.TrimSpace(sc.Text())
		}
		cmd, args, _ := strings.Cut(strings.TrimSpace(line), " ")
		ins := instruction{Cmd: strings.ToUpper(cmd), Args: strings.TrimSpace(args), Line: start}
		if m := heredocStart.FindStringSubmatch(ins.Args); m != nil && (ins.Cmd == "RUN" || ins.Cmd == "COPY") {
			var body []string
			closed := false
			for sc.Scan() {
				lineNo++
				if sc.Text() == m[1] {
					closed = true
					break
				}
				body = append(body, sc.Text())
			}
			if !closed {
				return df, fmt.Errorf("line %d: heredoc %s is not closed", start, m[1])
			}
			ins.Heredoc = strings.Join(body, "\n") + "\n"
		}
		if ins.Cmd == "FROM" {
			f := strings.Fields(ins.Args)
			var s stage
			for i := 0; i < len(f); i++ {
				switch {
				case strings.HasPrefix(f[i], "--"):
				case strings.EqualFold(f[i], "AS") && i+1 < len(f):
					s.Name = f[i+1]
					i++
				case s.Base == "":
					s.Base = f[i]
				}
			}
			df.Stages = append(df.Stages, s)
			cur = &df.Stages[len(df.Stages)-1]
			continue
		}
		if cur == nil {
			if ins.Cmd != "ARG" {
				return df, fmt.Errorf("line %d: %s before the first FROM", start, ins.Cmd)
			}
			continue
		}
		cur.Instructions = append(cur.Instructions, ins)
	}
	return df, sc.Err()
}

func readDockerfile(t *testing.T) dockerfile {
	t.Helper()
	data, err := os.ReadFile(filepath.Join(repoRoot(t), "Dockerfile"))
	if err != nil {
		t.Fatal(err)
	}
	df, err := parseDockerfile(data)
	if err != nil {
		t.Fatalf("Dockerfile: %v", err)
	}
	return df
}

func (s stage) find(cmd string) []instruction {
	var out []instruction
	for _, ins := range s.Instructions {
		if ins.Cmd == cmd {
			out = append(out, ins)
		}
	}
	return out
}

func goDirective(t *testing.T, file string) string {
	data, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	m := regexp.MustCompile(`(?m)^go (\d+\.\d+)(\.\d+)?$`).FindStringSubmatch(string(data))
	if m == nil {
		t.Fatalf("%s has no go directive", file)
	}
	return m[1]
}

func TestDockerfile(t *testing.T) {
	root := repoRoot(t)
	df := readDockerfile(t)
	if len(df.Stages) < 2 {
		t.Fatalf("%d stages, want a multi-stage build", len(df.Stages))
	}
	if s, ok := df.Directives["syntax"]; ok && imageProblem(s) != "" {
		t.Errorf("syntax directive: %s", imageProblem(s))
	}
	names := map[string]bool{}
	for _, s := range df.Stages {
		if !names[s.Base] {
			if p := imageProblem(s.Base); p != "" {
				t.Errorf("FROM %s: %s", s.Base, p)
			}
		}
		if s.Name != "" {
			names[s.Name] = true
		}
	}

	// The build stage: golang at the module's Go version, go.mod and go.sum
	// copied before the download, a static trimmed build.
	build := df.Stages[0]
	goVersion := goDirective(t, filepath.Join(root, "go.mod"))
	if !regexp.MustCompile(`^golang:` + regexp.QuoteMeta(goVersion) + `\.\d+(-[a-z0-9]+)?$`).MatchString(build.Base) {
		t.Errorf("build stage FROM %s, want golang:%s.<patch> (go.mod says go %s)", build.Base, goVersion, goVersion)
	}
	var copied []string
	downloadAt := -1
	for i, ins := range build.Instructions {
		if ins.Cmd == "COPY" && !strings.Contains(ins.Args, "--from") {
			f := strings.Fields(ins.Args)
			copied = append(copied, f[:len(f)-1]...)
		}
		if ins.Cmd == "RUN" && strings.Contains(ins.Args, "go mod download") && downloadAt < 0 {
			downloadAt = len(copied)
			_ = i
		}
	}
	if downloadAt < 0 {
		t.Fatal("no RUN go mod download in the build stage")
	}
	before := copied[:downloadAt]
	for _, w := range []string{"go.mod", "go.sum"} {
		if !slices.Contains(before, w) {
			t.Errorf("%s is not copied before go mod download", w)
		}
	}
	if !slices.ContainsFunc(build.find("ARG"), func(i instruction) bool { return i.Args == "SERVICE" }) {
		t.Error("build stage: no ARG SERVICE")
	}
	buildCmd := goBuildCommand(t, build)
	for _, want := range []string{"CGO_ENABLED=0", "-trimpath", "-ldflags=-s -w", "./services/${SERVICE}"} {
		if !slices.Contains(buildCmd, want) {
			t.Errorf("go build command %q lacks %q", buildCmd, want)
		}
	}

	// The final stage is what `docker build` produces by default.
	final := df.Stages[len(df.Stages)-1]
	if !strings.HasPrefix(final.Base, "gcr.io/distroless/static") && final.Base != "scratch" {
		t.Errorf("final stage FROM %s, want distroless static or scratch", final.Base)
	}
	for _, s := range df.Stages[1:] {
		users := s.find("USER")
		if len(users) == 0 {
			t.Errorf("stage %s sets no USER", s.Name)
			continue
		}
		if u := users[len(users)-1].Args; u != "65532:65532" && u != "nonroot:nonroot" && u != "nonroot" {
			t.Errorf("stage %s: USER %s, want 65532:65532", s.Name, u)
		}
		eps := s.find("ENTRYPOINT")
		if len(eps) == 0 || !strings.HasPrefix(eps[len(eps)-1].Args, "[") {
			t.Errorf("stage %s: want an exec-form ENTRYPOINT", s.Name)
		}
	}
}

// goBuildCommand returns the build stage's go build command, as words.
func goBuildCommand(t *testing.T, build stage) []string {
	for _, ins := range build.find("RUN") {
		words := shellWords(ins.Args)
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

// shellWords splits a simple shell command line (quotes, no expansions).
func shellWords(s string) []string {
	var words []string
	var cur strings.Builder
	in := false
	var quote rune
	for _, r := range s {
		switch {
		case quote != 0 && r == quote:
			quote = 0
		case quote != 0:
			cur.WriteRune(r)
		case r == '\'' || r == '"':
			quote, in = r, true
		case r == ' ' || r == '\t':
			if in {
				words = append(words, cur.String())
				cur.Reset()
				in = false
			}
		default:
			cur.WriteRune(r)
			in = true
		}
	}
	if in {
		words = append(words, cur.String())
	}
	return words
}

// The build stage, replayed here for every service without Docker: its COPY
// instructions assemble a build context in a temporary directory (so a module
// the build needs but the Dockerfile does not copy fails here too), then its
// RUN commands run there with sh, /out mapped to a temporary directory. The
// binary must be static and stripped, as distroless static needs.
func TestDockerfileBuildStageBuildsEveryService(t *testing.T) {
	root := repoRoot(t)
	build := readDockerfile(t).Stages[0]
	if w := build.find("WORKDIR"); len(w) != 1 || w[0].Args != "/src" {
		t.Fatalf("build stage: want WORKDIR /src, got %v", w)
	}
	for _, svc := range services {
		t.Run(svc, func(t *testing.T) {
			t.Parallel() // linking is mostly serial: use both cores
			dir := t.TempDir()
			src, out := filepath.Join(dir, "src"), filepath.Join(dir, "out")
			for _, ins := range build.Instructions {
				args := strings.ReplaceAll(ins.Args, "${SERVICE}", svc)
				switch ins.Cmd {
				case "COPY":
					if err := replayCopy(root, src, args); err != nil {
						t.Fatalf("line %d: COPY %s: %v", ins.Line, args, err)
					}
				case "RUN":
					script := ins.Args
					for strings.HasPrefix(script, "--") {
						_, script, _ = strings.Cut(script, " ")
					}
					script = strings.ReplaceAll(script, "/out/", out+"/")
					cmd := exec.Command("sh", "-c", script)
					cmd.Dir = src
					// The workspace of the copied context, not the tests' GOWORK.
					cmd.Env = append(os.Environ(), "SERVICE="+svc, "GOWORK=")
					if b, err := cmd.CombinedOutput(); err != nil {
						t.Fatalf("line %d: RUN %s: %v\n%s", ins.Line, script, err, b)
					}
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
		})
	}
}

// replayCopy performs a COPY (sources relative to root, destination relative
// to dst, the WORKDIR) with Docker's semantics: a directory source copies its
// contents; a destination ending in / is a directory.
func replayCopy(root, dst, args string) error {
	f := strings.Fields(args)
	for len(f) > 0 && strings.HasPrefix(f[0], "--") {
		f = f[1:]
	}
	if len(f) < 2 {
		return fmt.Errorf("want sources and a destination")
	}
	srcs, dest := f[:len(f)-1], filepath.Join(dst, f[len(f)-1])
	intoDir := strings.HasSuffix(f[len(f)-1], "/") || len(srcs) > 1
	for _, s := range srcs {
		from := filepath.Join(root, s)
		info, err := os.Stat(from)
		if err != nil {
			return err
		}
		if info.IsDir() {
			err := filepath.WalkDir(from, func(path string, d fs.DirEntry, err error) error {
				if err != nil || d.IsDir() {
					return err
				}
				rel, _ := filepath.Rel(from, path)
				return copyFile(path, filepath.Join(dest, rel))
			})
			if err != nil {
				return err
			}
			continue
		}
		to := dest
		if intoDir {
			to = filepath.Join(dest, filepath.Base(s))
		}
		if err := copyFile(from, to); err != nil {
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

func TestDockerignore(t *testing.T) {
	root := repoRoot(t)
	data, err := os.ReadFile(filepath.Join(root, ".dockerignore"))
	if err != nil {
		t.Fatal(err)
	}
	var patterns []string
	for line := range strings.SplitSeq(string(data), "\n") {
		line = strings.TrimSpace(line)
		if line != "" && !strings.HasPrefix(line, "#") && !strings.HasPrefix(line, "!") {
			patterns = append(patterns, strings.TrimPrefix(line, "/"))
		}
	}
	for _, want := range []string{".git", ".local", "bin"} {
		if !slices.Contains(patterns, want) {
			t.Errorf(".dockerignore does not exclude %s", want)
		}
	}
	ignored := func(path string) bool {
		for _, p := range patterns {
			if ok, _ := filepath.Match(p, path); ok || strings.HasPrefix(path, p+"/") {
				return true
			}
		}
		return false
	}
	df := readDockerfile(t)
	for _, s := range df.Stages {
		for _, ins := range s.find("COPY") {
			if strings.Contains(ins.Args, "--from") || ins.Heredoc != "" {
				continue
			}
			f := strings.Fields(ins.Args)
			for _, src := range f[:len(f)-1] {
				if strings.HasPrefix(src, "--") {
					continue
				}
				for _, svc := range services {
					if path := strings.ReplaceAll(src, "${SERVICE}", svc); ignored(strings.TrimSuffix(path, "/")) {
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
	df := readDockerfile(t)
	var dev *stage
	for i := range df.Stages {
		if df.Stages[i].Name == "dev" {
			dev = &df.Stages[i]
		}
	}
	if dev == nil {
		t.Fatal("no dev stage (Tilt builds target dev)")
	}
	var wrapper string
	for _, ins := range dev.find("COPY") {
		if strings.HasSuffix(ins.Args, " /app/restart.sh") {
			wrapper = ins.Heredoc
		}
	}
	eps := dev.find("ENTRYPOINT")
	if wrapper == "" || len(eps) == 0 {
		t.Fatal("dev stage: want the wrapper as a heredoc COPY to /app/restart.sh and an ENTRYPOINT")
	}
	if want := `["/busybox/sh", "/app/restart.sh", "/app/service", "/tmp/live/service"]`; eps[len(eps)-1].Args != want {
		t.Errorf("dev ENTRYPOINT %s, want %s", eps[len(eps)-1].Args, want)
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
	exitCode := func(done chan error) int {
		t.Helper()
		select {
		case err := <-done:
			if err == nil {
				return 0
			}
			if ee, ok := err.(*exec.ExitError); ok {
				return ee.ExitCode()
			}
			t.Fatal(err)
		case <-time.After(10 * time.Second):
			t.Fatal("the wrapper did not exit within 10s")
		}
		return -1
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
	if code := exitCode(done); code != 0 {
		t.Errorf("after SIGTERM the wrapper exited %d, want the service's 0", code)
	}

	// A service that exits by itself is not restarted.
	_, done = start("EXIT_AT_ONCE=3")
	expect("start " + live)
	if code := exitCode(done); code != 3 {
		t.Errorf("the wrapper exited %d, want the service's status 3", code)
	}
}
