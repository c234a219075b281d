package faults

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"

	"kurz.dev/pkg/redisconn"
	"kurz.dev/pkg/testkit/servertest"
)

// Cluster is a private Redis Cluster (three masters, three replicas) whose
// nodes announce the addresses of proxies in front of them: every client
// connection, and replication too, goes through a Proxy the test controls.
// It is separate from the stack's shared cluster, so killing its masters
// disturbs no other test.
type Cluster struct {
	Nodes []*Node

	dir         string        // where nodes keep their files
	nodeTimeout time.Duration // every node's cluster-node-timeout
	started     int           // nodes started so far, to name their folders
}

// Node is one redis-server process and the proxy it announces.
type Node struct {
	Port  int    // where redis-server listens
	Proxy *Proxy // what the node announces to clients and peers
	dir   string
	cmd   *exec.Cmd
	done  chan struct{}
}

// Addr is the node's announced (proxied) address.
func (n *Node) Addr() string { return n.Proxy.Addr() }

// Kill stops the node with SIGKILL, as a crashed host, and waits for it.
func (n *Node) Kill() {
	select {
	case <-n.done:
		return
	default:
	}
	_ = n.cmd.Process.Kill()
	<-n.done
}

// StartCluster starts six nodes in dir and creates the cluster; a failed
// node is noticed by its peers after nodeTimeout and its replica promoted.
func StartCluster(dir string, nodeTimeout time.Duration) (*Cluster, error) {
	c := &Cluster{dir: dir, nodeTimeout: nodeTimeout}
	for range 6 {
		n, err := c.startNode()
		if err != nil {
			c.Close()
			return nil, err
		}
		c.Nodes = append(c.Nodes, n)
	}
	// The cluster is formed over the real ports (CLUSTER MEET reaches the
	// bus at port+busOffset); from then on the nodes announce their proxies.
	args := []string{"--cluster", "create"}
	for _, n := range c.Nodes {
		args = append(args, "127.0.0.1:"+strconv.Itoa(n.Port))
	}
	args = append(args, "--cluster-replicas", "1", "--cluster-yes")
	if out, err := exec.Command("redis-cli", args...).CombinedOutput(); err != nil {
		c.Close()
		return nil, fmt.Errorf("redis-cli --cluster create: %w\n%s", err, out)
	}
	if err := c.AwaitHealthy(30 * time.Second); err != nil {
		c.Close()
		return nil, err
	}
	return c, nil
}

// startNode starts one more node, in a folder of its own, outside the
// cluster.
func (c *Cluster) startNode() (*Node, error) {
	dir := filepath.Join(c.dir, "redis-"+strconv.Itoa(c.started))
	c.started++
	return startNode(dir, c.nodeTimeout)
}

func startNode(dir string, nodeTimeout time.Duration) (*Node, error) {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, err
	}
	// A port found free can still be taken before redis-server binds it
	// (the check and the bind are separate steps, and other tests bind
	// ports too): such a node is started again on other ports.
	var err error
	for range 5 {
		var n *Node
		n, err = startNodeOnce(dir, nodeTimeout)
		if !errors.Is(err, errPortTaken) {
			return n, err
		}
	}
	return nil, err
}

// errPortTaken marks a node that could not bind its port or bus port.
var errPortTaken = errors.New("port taken")

func startNodeOnce(dir string, nodeTimeout time.Duration) (*Node, error) {
	_ = os.Remove(filepath.Join(dir, "nodes.conf"))
	port, err := servertest.FreePort(busOffset)
	if err != nil {
		return nil, err
	}
	proxy, err := NewProxy("127.0.0.1:0", "127.0.0.1:"+strconv.Itoa(port))
	if err != nil {
		return nil, err
	}
	_, proxyPort, _ := net.SplitHostPort(proxy.Addr())
	logFile := filepath.Join(dir, "redis.log")
	_ = os.Remove(logFile)
	cmd := exec.Command("redis-server",
		"--port", strconv.Itoa(port), "--bind", "127.0.0.1", "--dir", dir,
		"--cluster-enabled", "yes", "--cluster-config-file", "nodes.conf",
		"--cluster-node-timeout", strconv.FormatInt(nodeTimeout.Milliseconds(), 10),
		// A replica may always take over, however long its link to the
		// master was down: the test kills masters on a busy machine.
		"--cluster-replica-validity-factor", "0",
		"--cluster-announce-ip", "127.0.0.1",
		"--cluster-announce-port", proxyPort,
		"--cluster-announce-bus-port", strconv.Itoa(port+busOffset),
		"--save", "", "--appendonly", "no", "--logfile", logFile)
	if err := cmd.Start(); err != nil {
		_ = proxy.Close()
		return nil, fmt.Errorf("start redis-server: %w", err)
	}
	n := &Node{Port: port, Proxy: proxy, dir: dir, cmd: cmd, done: make(chan struct{})}
	go func() { _ = cmd.Wait(); close(n.done) }()
	direct := redis.NewClient(&redis.Options{Addr: "127.0.0.1:" + strconv.Itoa(port)})
	defer direct.Close()
	deadline := time.Now().Add(10 * time.Second)
	for direct.Ping(context.Background()).Err() != nil {
		select {
		case <-n.done:
			_ = proxy.Close()
			log := n.log()
			if strings.Contains(log, "Address already in use") {
				return nil, fmt.Errorf("redis-server on port %d: %w: %s", port, errPortTaken, log)
			}
			return nil, fmt.Errorf("redis-server on port %d exited: %s", port, log)
		default:
		}
		if time.Now().After(deadline) {
			n.Kill()
			_ = proxy.Close()
			return nil, fmt.Errorf("redis-server on port %d not answering: %s", port, n.log())
		}
		time.Sleep(20 * time.Millisecond) // polling a process that has no readiness signal
	}
	return n, nil
}

func (n *Node) log() string {
	b, _ := os.ReadFile(filepath.Join(n.dir, "redis.log"))
	return string(b)
}

// busOffset is where Redis puts a node's cluster bus: port+10000.
const busOffset = 10000

// Addrs are the announced addresses, for KURZ_REDIS_ADDRS.
func (c *Cluster) Addrs() []string {
	addrs := make([]string, len(c.Nodes))
	for i, n := range c.Nodes {
		addrs[i] = n.Addr()
	}
	return addrs
}

// Client returns a cluster client through the proxies.
func (c *Cluster) Client() *redis.ClusterClient {
	return redis.NewClusterClient(&redis.ClusterOptions{Addrs: c.Addrs()})
}

// MasterOf returns the running node that serves key's slot as master, as
// the nodes themselves report it.
func (c *Cluster) MasterOf(ctx context.Context, key string) (*Node, error) {
	slot := redisconn.Slot(key)
	for _, n := range c.Nodes {
		if !n.alive() {
			continue
		}
		direct := redis.NewClient(&redis.Options{Addr: "127.0.0.1:" + strconv.Itoa(n.Port)})
		slots, err := direct.ClusterSlots(ctx).Result()
		_ = direct.Close()
		if err != nil {
			continue
		}
		for _, s := range slots {
			if slot >= s.Start && slot <= s.End && len(s.Nodes) > 0 {
				return c.byAddr(s.Nodes[0].Addr)
			}
		}
	}
	return nil, fmt.Errorf("no live node knows the master of slot %d", slot)
}

func (c *Cluster) byAddr(addr string) (*Node, error) {
	for _, n := range c.Nodes {
		if n.Addr() == addr {
			return n, nil
		}
	}
	return nil, fmt.Errorf("no node announces %s", addr)
}

func (n *Node) alive() bool {
	select {
	case <-n.done:
		return false
	default:
		return true
	}
}

// AwaitHealthy waits until every live node reports cluster_state:ok and
// all 16384 slots served by a live master.
func (c *Cluster) AwaitHealthy(timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	var last string
	for time.Now().Before(deadline) {
		if last = c.unhealthy(); last == "" {
			return nil
		}
		time.Sleep(50 * time.Millisecond) // cluster state has no change notification
	}
	return fmt.Errorf("cluster not healthy after %v: %s", timeout, last)
}

func (c *Cluster) unhealthy() string {
	ctx := context.Background()
	for _, n := range c.Nodes {
		if !n.alive() {
			continue
		}
		direct := redis.NewClient(&redis.Options{Addr: "127.0.0.1:" + strconv.Itoa(n.Port)})
		info, err := direct.ClusterInfo(ctx).Result()
		_ = direct.Close()
		if err != nil {
			return fmt.Sprintf("node %d: %v", n.Port, err)
		}
		if !strings.Contains(info, "cluster_state:ok") || !strings.Contains(info, "cluster_slots_ok:16384") {
			return fmt.Sprintf("node %d: state not ok", n.Port)
		}
	}
	// Every master that serves slots must be alive.
	live := c.liveClient()
	slots, err := live.ClusterSlots(ctx).Result()
	_ = live.Close()
	if err != nil {
		return err.Error()
	}
	for _, s := range slots {
		m, err := c.byAddr(s.Nodes[0].Addr)
		if err != nil || !m.alive() {
			return fmt.Sprintf("slots %d-%d served by a dead master", s.Start, s.End)
		}
	}
	return ""
}

func (c *Cluster) liveClient() *redis.Client {
	for _, n := range c.Nodes {
		if n.alive() {
			return redis.NewClient(&redis.Options{Addr: "127.0.0.1:" + strconv.Itoa(n.Port)})
		}
	}
	return redis.NewClient(&redis.Options{Addr: "127.0.0.1:1"})
}

// Close kills every node and proxy.
func (c *Cluster) Close() {
	for _, n := range c.Nodes {
		n.Kill()
		_ = n.Proxy.Close()
	}
}
