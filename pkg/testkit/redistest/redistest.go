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

	"kurz.dev/pkg/testkit/servertest"
)

// busOffset is where Redis puts a node's cluster bus: port+10000.
const busOffset = 10000

// Node is a running redis-server in cluster mode.
type Node struct {
	Addr string
	t    testing.TB
	dir  string
	port int
	cmd  *exec.Cmd
	done chan struct{} // closed when cmd has exited
}

// Start launches a node on a free loopback port (its cluster bus port free
// too) and assigns it every slot. It is killed when the test ends.
func Start(t testing.TB) *Node {
	t.Helper()
	n := launch(t)
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
	return n
}

// launch starts an empty cluster-mode node.
func launch(t testing.TB) *Node {
	t.Helper()
	if _, err := exec.LookPath("redis-server"); err != nil {
		t.Fatalf("redis-server not found (deploy/local/infra.sh installs it): %v", err)
	}
	port, err := servertest.FreePort(busOffset)
	if err != nil {
		t.Fatal(err)
	}
	n := &Node{t: t, dir: t.TempDir(), port: port, Addr: fmt.Sprintf("127.0.0.1:%d", port)}
	t.Cleanup(n.Kill)
	n.Restart()
	return n
}

// StartReplica launches a replica of n (a master from Start) and waits until
// n reports it online.
func (n *Node) StartReplica() *Node {
	n.t.Helper()
	r := launch(n.t)
	ctx := context.Background()
	mc := redis.NewClient(&redis.Options{Addr: n.Addr})
	defer mc.Close()
	rc := redis.NewClient(&redis.Options{Addr: r.Addr})
	defer rc.Close()
	id, err := mc.Do(ctx, "CLUSTER", "MYID").Text()
	if err != nil {
		n.t.Fatalf("master id: %v", err)
	}
	if err := rc.ClusterMeet(ctx, "127.0.0.1", fmt.Sprint(n.port)).Err(); err != nil {
		n.t.Fatalf("cluster meet: %v", err)
	}
	// REPLICATE needs the master known to the replica first.
	r.await(func() bool { return rc.Do(ctx, "CLUSTER", "REPLICATE", id).Err() == nil }, "CLUSTER REPLICATE")
	n.await(func() bool {
		info, err := mc.Info(ctx, "replication").Result()
		return err == nil && strings.Contains(info, "connected_slaves:1") && strings.Contains(info, "state=online")
	}, "its replica online")
	// Online on the master's side is not yet acknowledging writes: wait for
	// the replica's side of the link, then for a write it acknowledged.
	r.await(func() bool {
		info, err := rc.Info(ctx, "replication").Result()
		return err == nil && strings.Contains(info, "master_link_status:up")
	}, "its link to the master up")
	n.await(func() bool {
		// One connection: WAIT counts the acknowledgements of its own writes.
		conn := mc.Conn()
		defer conn.Close()
		if conn.Set(ctx, "redistest:replica-probe", "1", time.Minute).Err() != nil {
			return false
		}
		acked, err := conn.Do(ctx, "WAIT", 1, 500).Int()
		return err == nil && acked == 1
	}, "its replica acknowledging a write")
	if err := mc.Del(ctx, "redistest:replica-probe").Err(); err != nil {
		n.t.Fatalf("replica probe: %v", err)
	}
	return r
}

// Restart starts the server again (after Kill) with the same data directory
// and port, and waits until it answers.
func (n *Node) Restart() {
	n.t.Helper()
	cmd := exec.Command("redis-server",
		"--port", fmt.Sprint(n.port), "--bind", "127.0.0.1",
		"--cluster-enabled", "yes", "--cluster-config-file", filepath.Join(n.dir, "nodes.conf"),
		"--dir", n.dir, "--save", "", "--appendonly", "no", "--daemonize", "no")
	logf, err := os.OpenFile(n.logPath(), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		n.t.Fatal(err)
	}
	cmd.Stdout, cmd.Stderr = logf, logf
	if err := cmd.Start(); err != nil {
		_ = logf.Close()
		n.t.Fatalf("start redis-server: %v", err)
	}
	n.cmd, n.done = cmd, make(chan struct{})
	go func(done chan struct{}) { _ = cmd.Wait(); _ = logf.Close(); close(done) }(n.done)
	c := redis.NewClient(&redis.Options{Addr: n.Addr, DialTimeout: 100 * time.Millisecond})
	defer c.Close()
	n.await(func() bool { return c.Ping(context.Background()).Err() == nil }, "PING")
}

// Kill stops the server with SIGKILL and waits for it to exit. Killing a
// stopped node does nothing.
func (n *Node) Kill() {
	if n.cmd == nil {
		return
	}
	_ = n.cmd.Process.Signal(syscall.SIGKILL)
	<-n.done
	n.cmd = nil
}

// Pause freezes the server (SIGSTOP): connections stay open and every call
// times out, like a Redis that is slow rather than dead.
func (n *Node) Pause() { _ = n.cmd.Process.Signal(syscall.SIGSTOP) }

// Resume thaws a paused server.
func (n *Node) Resume() { _ = n.cmd.Process.Signal(syscall.SIGCONT) }

func (n *Node) logPath() string { return filepath.Join(n.dir, "redis.log") }

// await polls ok (redis-server has no readiness signal) for 10 s at most,
// and gives up at once, with the server's log, if the server exits.
func (n *Node) await(ok func() bool, what string) {
	n.t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !ok() {
		select {
		case <-n.done:
			log, _ := os.ReadFile(n.logPath())
			n.t.Fatalf("redis %s exited before %s:\n%s", n.Addr, what, log)
		default:
		}
		if time.Now().After(deadline) {
			log, _ := os.ReadFile(n.logPath())
			n.t.Fatalf("redis %s: no %s within 10s:\n%s", n.Addr, what, log)
		}
		time.Sleep(20 * time.Millisecond)
	}
}
