package app

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"syscall"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
)

// The services behind the gateway are separate modules (their internal
// packages cannot be imported), so the tests build their binaries and run
// them as processes on free loopback ports, against the shared stores.

// syncBuffer collects a process's output for failure messages.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// process is one service binary running as its own process.
type process struct {
	name     string
	grpcAddr string
	cmd      *exec.Cmd
	out      *syncBuffer
	done     chan struct{}
	err      error // Wait's result, once done is closed
}

// buildServices builds the named services (with the race detector when the
// test runs under it) into dir, in one go command.
func buildServices(dir string, names ...string) error {
	args := []string{"build", "-ldflags=-s -w", "-o", dir + string(filepath.Separator)}
	if raceEnabled {
		args = append(args, "-race")
	}
	for _, n := range names {
		args = append(args, "kurz.dev/services/"+n)
	}
	cmd := exec.Command("go", args...)
	if out, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("go build: %w\n%s", err, out)
	}
	return nil
}

// freeAddr returns a loopback address nothing listens on right now.
func freeAddr() (string, error) {
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", err
	}
	addr := lis.Addr().String()
	return addr, lis.Close()
}

// startProcess runs bin with the environment plus env, and waits until its
// gRPC health reports SERVING for service.
func startProcess(name, bin, grpcAddr, service string, env ...string) (*process, error) {
	cmd := exec.Command(bin)
	cmd.Env = append(os.Environ(), env...)
	p := &process{name: name, grpcAddr: grpcAddr, cmd: cmd, out: &syncBuffer{}, done: make(chan struct{})}
	cmd.Stdout, cmd.Stderr = p.out, p.out
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("start %s: %w", name, err)
	}
	go func() { p.err = cmd.Wait(); close(p.done) }()
	if err := awaitServing(grpcAddr, service, p.done); err != nil {
		p.kill()
		return nil, fmt.Errorf("%s never became SERVING: %w\n%s", name, err, p.out)
	}
	return p, nil
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
		case <-exited: // a process that dies before serving ends the wait
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

// stop sends SIGTERM and waits for the exit; nil for a clean one.
func (p *process) stop() error {
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
		p.kill()
		return errors.New(p.name + ": still running 30 s after SIGTERM")
	}
}

func (p *process) kill() {
	select {
	case <-p.done:
	default:
		_ = p.cmd.Process.Kill()
		<-p.done
	}
}
