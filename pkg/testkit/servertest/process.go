package servertest

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
)

// Tests that need another module's service (whose internal packages they
// cannot import) build its binary and run it as a process on free loopback
// ports, against the shared stores.

// BuildServices builds the named services (kurz.dev/services/<name>) into
// dir in one go command, with the race detector when the test binary has it.
func BuildServices(dir string, names ...string) error {
	return buildServices(dir, RaceEnabled, names)
}

// BuildServicesWithoutRace is BuildServices without the race detector ever:
// for tests that measure a process's memory, which the detector's shadow
// memory would multiply.
func BuildServicesWithoutRace(dir string, names ...string) error {
	return buildServices(dir, false, names)
}

func buildServices(dir string, race bool, names []string) error {
	// -s -w: no symbol table or DWARF, a much faster link; panics and race
	// reports still name functions and lines.
	args := []string{"build", "-ldflags=-s -w", "-o", dir + string(filepath.Separator)}
	if race {
		args = append(args, "-race")
	}
	for _, n := range names {
		args = append(args, "kurz.dev/services/"+n)
	}
	if out, err := exec.Command("go", args...).CombinedOutput(); err != nil {
		return fmt.Errorf("go build: %w\n%s", err, out)
	}
	return nil
}

// FreeAddr returns a loopback address nothing listens on right now, and
// never the same one twice in a test binary (see FreePort).
func FreeAddr() (string, error) {
	port, err := FreePort(0)
	if err != nil {
		return "", err
	}
	return "127.0.0.1:" + strconv.Itoa(port), nil
}

// FreePort returns a loopback port that nothing listens on right now and,
// when offset is not 0, such that port+offset is free too (Redis Cluster
// puts a node's bus at port+10000). A test binary never gets the same port
// twice.
//
// Ports come from below the kernel's ephemeral range: a port found free
// there stays free until the process meant to take it binds it (or binds
// it again after a restart), because the kernel hands ephemeral ports, not
// these, to "listen on port 0" and to outgoing connections. A port probed
// with "listen on port 0" can be given to another socket the moment its
// probe closes (CI once saw a Redis bus port taken that way).
func FreePort(offset int) (int, error) {
	handedOut.Lock()
	defer handedOut.Unlock()
	low, high := 10000, ephemeralLow()-offset
	if high-low < 1000 {
		return 0, fmt.Errorf("the kernel's ephemeral port range starts at %d: no room below it for test ports", high+offset)
	}
	for range 1000 {
		port := low + rand.IntN(high-low)
		if handedOut.ports[port] || handedOut.ports[port+offset] {
			continue
		}
		if !canListen(port) || (offset != 0 && !canListen(port+offset)) {
			continue
		}
		handedOut.ports[port], handedOut.ports[port+offset] = true, true
		return port, nil
	}
	return 0, errors.New("no free loopback port after 1000 tries")
}

var handedOut = struct {
	sync.Mutex
	ports map[int]bool
}{ports: map[int]bool{}}

func canListen(port int) bool {
	lis, err := net.Listen("tcp", "127.0.0.1:"+strconv.Itoa(port))
	if err != nil {
		return false
	}
	return lis.Close() == nil
}

// ephemeralLow is the first port of the kernel's ephemeral range (Linux's
// default where it cannot be read).
func ephemeralLow() int {
	if b, err := os.ReadFile("/proc/sys/net/ipv4/ip_local_port_range"); err == nil {
		if f := strings.Fields(string(b)); len(f) == 2 {
			if n, err := strconv.Atoi(f[0]); err == nil {
				return n
			}
		}
	}
	return 32768
}

// Process is a service binary running as its own process.
type Process struct {
	Name     string
	GRPCAddr string
	cmd      *exec.Cmd
	out      *SyncBuffer
	done     chan struct{}
	err      error // Wait's result, once done is closed
}

// StartProcess runs bin with the process environment plus env (and the test
// defaults, ServiceAuthKey and CodeKey, unless either sets them) and waits
// (60 s at most) until its gRPC health reports SERVING for service. A
// process that exits before that ends the wait at once.
func StartProcess(name, bin, grpcAddr, service string, env ...string) (*Process, error) {
	cmd := exec.Command(bin)
	// The test defaults come first: the environment and env override them
	// (the last of duplicate variables wins).
	cmd.Env = append(append(defaultEnv(), os.Environ()...), env...)
	dieWithParent(cmd)
	p := &Process{Name: name, GRPCAddr: grpcAddr, cmd: cmd, out: &SyncBuffer{}, done: make(chan struct{})}
	cmd.Stdout, cmd.Stderr = p.out, p.out
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("start %s: %w", name, err)
	}
	go func() { p.err = cmd.Wait(); close(p.done) }()
	if err := awaitServing(grpcAddr, service, p.done); err != nil {
		p.Kill()
		return nil, fmt.Errorf("%s never became SERVING: %w\n%s", name, err, p.out)
	}
	return p, nil
}

// Spec is one process of a test stack.
type Spec struct {
	// Name is the binary's name in the build directory (see BuildServices).
	Name string
	// Service is the gRPC health service awaited ("" for the whole server).
	Service string
	// GRPCAddr and HTTPAddr are the addresses to give the process (for
	// those others must know in advance); empty ones are picked free.
	GRPCAddr, HTTPAddr string
	// Env is the process's environment given its gRPC and HTTP addresses.
	Env func(grpcAddr, httpAddr string) []string
}

// StartAll starts the specs concurrently from the binaries in dir, and
// returns their processes in the specs' order. If any fails to start, it
// stops the others and returns every failure.
func StartAll(dir string, specs ...Spec) ([]*Process, error) {
	procs := make([]*Process, len(specs))
	errs := make([]error, len(specs))
	var wg sync.WaitGroup
	orFree := func(addr string) (string, error) {
		if addr != "" {
			return addr, nil
		}
		return FreeAddr()
	}
	for i, s := range specs {
		grpcAddr, err := orFree(s.GRPCAddr)
		if err != nil {
			return nil, err
		}
		httpAddr, err := orFree(s.HTTPAddr)
		if err != nil {
			return nil, err
		}
		wg.Go(func() {
			procs[i], errs[i] = StartProcess(s.Name, filepath.Join(dir, s.Name), grpcAddr, s.Service, s.Env(grpcAddr, httpAddr)...)
		})
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		StopAll(procs...)
		return nil, err
	}
	return procs, nil
}

// Run starts one process for a test, from the binary in dir, failing t if
// it does not become SERVING; the process is killed when the test ends.
func Run(t testing.TB, dir string, s Spec) *Process {
	t.Helper()
	procs, err := StartAll(dir, s)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(procs[0].Kill)
	return procs[0]
}

// StopAll stops the processes in reverse order (nil ones are skipped) and
// writes the output of any that does not stop cleanly to stderr.
func StopAll(procs ...*Process) {
	for i := len(procs) - 1; i >= 0; i-- {
		if p := procs[i]; p != nil {
			if err := p.Stop(); err != nil {
				fmt.Fprintf(os.Stderr, "%s did not stop cleanly: %v\n%s\n", p.Name, err, p.Output())
			}
		}
	}
}

func awaitServing(addr, service string, exited <-chan struct{}) error {
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return err
	}
	defer conn.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	go func() {
		select {
		case <-exited:
			cancel()
		case <-ctx.Done():
		}
	}()
	stream, err := healthpb.NewHealthClient(conn).Watch(ctx, &healthpb.HealthCheckRequest{Service: service}, grpc.WaitForReady(true))
	for err == nil {
		var resp *healthpb.HealthCheckResponse
		if resp, err = stream.Recv(); err == nil && resp.GetStatus() == healthpb.HealthCheckResponse_SERVING {
			return nil
		}
	}
	return err
}

// Memory returns the process's resident set size now and its peak so far
// (VmRSS and VmHWM of /proc/<pid>/status), in bytes; Linux only.
func (p *Process) Memory() (rss, peak int64, err error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", p.cmd.Process.Pid))
	if err != nil {
		return 0, 0, fmt.Errorf("%s memory: %w", p.Name, err)
	}
	for line := range strings.Lines(string(b)) {
		name, value, _ := strings.Cut(line, ":")
		var dst *int64
		switch name {
		case "VmRSS":
			dst = &rss
		case "VmHWM":
			dst = &peak
		default:
			continue
		}
		kb, err := strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(value), " kB"), 10, 64)
		if err != nil {
			return 0, 0, fmt.Errorf("%s memory: %s: %w", p.Name, name, err)
		}
		*dst = kb << 10
	}
	if peak == 0 {
		return 0, 0, fmt.Errorf("%s memory: no VmHWM in /proc/%d/status", p.Name, p.cmd.Process.Pid)
	}
	return rss, peak, nil
}

// Output is what the process wrote to stdout and stderr so far.
func (p *Process) Output() string { return p.out.String() }

// Stop sends SIGTERM and waits for the exit: nil for exit status 0.
func (p *Process) Stop() error {
	select {
	case <-p.done:
		return p.err
	default:
	}
	if err := p.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		return err
	}
	select {
	case <-p.done:
		return p.err
	case <-time.After(30 * time.Second):
		p.Kill()
		return errors.New(p.Name + ": still running 30 s after SIGTERM")
	}
}

// Kill stops the process with SIGKILL (if it still runs) and waits for it.
func (p *Process) Kill() {
	select {
	case <-p.done:
	default:
		_ = p.cmd.Process.Kill()
		<-p.done
	}
}

// SyncBuffer is a buffer for concurrent writers: a process's output for
// failure messages, a test's log lines.
type SyncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *SyncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *SyncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}
