// Package redistest runs a private single-node Redis Cluster (one master
// holding all 16384 slots) for tests that must stop, pause or restart Redis
// without disturbing the shared local cluster.
package redistest

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"kurz.dev/pkg/server/servertest"
)

// Node is a running redis-server in cluster mode.
type Node struct {
	Addr string
	t    testing.TB
	dir  string
	port int
	cmd  *exec.Cmd
}

// Start launches a node on a free loopback port and assigns it every slot.
// It is stopped when the test ends.
func Start(t testing.TB) *Node {
	t.Helper()
	_, err := exec.LookPath("redis-server")
	if err != nil {
		t.Fatalf("redis-server not found (deploy/local/infra.sh installs it): %v", err)
	}
	n := &Node{t: t, dir: t.TempDir(), port: freePort(t)}
	n.Addr = fmt.Sprintf("127.0.0.1:%d", n.port)
	n.Restart()
	c := redis.NewClient(&redis.Options{Addr: n.Addr})
	defer c.Close()
	ctx := context.Background()
	if err := c.Do(ctx, "CLUSTER", "ADDSLOTSRANGE", 0, 16383).Err(); err != nil {
		t.Fatalf("assign slots: %v", err)
	}
	n.await(func() bool {
		info, err := c.ClusterInfo(ctx).Result()
		return err == nil && strings.Contains(info, "cluster_state:ok")
	}, "cluster_state:ok")
	t.Cleanup(n.Kill)
	return n
}

// Restart starts the server again (after Kill) with the same data directory
// and port, and waits until it answers.
func (n *Node) Restart() {
	n.t.Helper()
	n.cmd = exec.Command("redis-server",
		"--port", fmt.Sprint(n.port), "--bind", "127.0.0.1",
		"--cluster-enabled", "yes", "--cluster-config-file", filepath.Join(n.dir, "nodes.conf"),
		"--dir", n.dir, "--save", "", "--appendonly", "no", "--daemonize", "no")
	if logf, err := os.OpenFile(filepath.Join(n.dir, "redis.log"), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644); err == nil {
		n.cmd.Stdout, n.cmd.Stderr = logf, logf
	}
	if err := n.cmd.Start(); err != nil {
		n.t.Fatalf("start redis-server: %v", err)
	}
	c := redis.NewClient(&redis.Options{Addr: n.Addr, DialTimeout: 100 * time.Millisecond})
	defer c.Close()
	n.await(func() bool { return c.Ping(context.Background()).Err() == nil }, "PING")
}

// Kill stops the server with SIGKILL and waits for it to exit.
func (n *Node) Kill() {
	if n.cmd == nil || n.cmd.Process == nil {
		return
	}
	_ = n.cmd.Process.Signal(syscall.SIGKILL)
	_, _ = n.cmd.Process.Wait()
	n.cmd = nil
}

// Pause freezes the server (SIGSTOP): connections stay open and every call
// times out, like a Redis that is slow rather than dead.
func (n *Node) Pause() { _ = n.cmd.Process.Signal(syscall.SIGSTOP) }

// Resume thaws a paused server.
func (n *Node) Resume() { _ = n.cmd.Process.Signal(syscall.SIGCONT) }

func (n *Node) await(ok func() bool, what string) {
	n.t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !ok() {
		if time.Now().After(deadline) {
			n.t.Fatalf("redis %s: no %s within 10s", n.Addr, what)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// freePort returns a port free for the node and its cluster bus
// (port+10000), below the kernel's ephemeral range so that nothing takes
// it between tests' restarts of the node.
func freePort(t testing.TB) int {
	t.Helper()
	port, err := servertest.FreePort(10000)
	if err != nil {
		t.Fatal(err)
	}
	return port
}
