package faults

import (
	"context"
	"fmt"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"
)

// The cluster grows and shrinks live as an operator does it: redis-cli
// --cluster add-node, rebalance and del-node, run against the announced
// (proxied) addresses, so slot migrations (MIGRATE from node to node) go
// through the proxies too.

// cliTimeout bounds one redis-cli --cluster command.
const cliTimeout = 2 * time.Minute

// redisCLI runs redis-cli --cluster with args.
func redisCLI(args ...string) error {
	ctx, cancel := context.WithTimeout(context.Background(), cliTimeout)
	defer cancel()
	out, err := exec.CommandContext(ctx, "redis-cli", append([]string{"--cluster"}, args...)...).CombinedOutput()
	if err != nil {
		return fmt.Errorf("redis-cli --cluster %s: %w\n%s", strings.Join(args, " "), err, out)
	}
	return nil
}

// ID is the node's cluster node ID.
func (n *Node) ID(ctx context.Context) (string, error) {
	direct := n.direct()
	defer direct.Close()
	return direct.Do(ctx, "CLUSTER", "MYID").Text()
}

func (n *Node) direct() *redis.Client {
	return redis.NewClient(&redis.Options{Addr: "127.0.0.1:" + strconv.Itoa(n.Port)})
}

// entry is the announced address of a live node, for redis-cli to start
// from.
func (c *Cluster) entry() (string, error) {
	for _, n := range c.Nodes {
		if n.alive() {
			return n.Addr(), nil
		}
	}
	return "", fmt.Errorf("no live node")
}

// AddMaster starts a node and joins it to the cluster as a master that
// serves no slot yet (redis-cli --cluster add-node).
func (c *Cluster) AddMaster(ctx context.Context) (*Node, error) {
	return c.add(ctx)
}

// AddReplica starts a node and joins it to the cluster as a replica of
// master (add-node --cluster-slave --cluster-master-id), and waits until it
// replicates.
func (c *Cluster) AddReplica(ctx context.Context, master *Node) (*Node, error) {
	id, err := master.ID(ctx)
	if err != nil {
		return nil, err
	}
	n, err := c.add(ctx, "--cluster-slave", "--cluster-master-id", id)
	if err != nil {
		return nil, err
	}
	// Joined is not yet replicating: the first sync waits
	// repl-diskless-sync-delay (5 s) for other replicas. Until it is done
	// the master has no replica to acknowledge a write (WAIT).
	return n, n.awaitReplicating(ctx, 30*time.Second)
}

// awaitReplicating waits until the replica's link to its master is up.
func (n *Node) awaitReplicating(ctx context.Context, timeout time.Duration) error {
	direct := n.direct()
	defer direct.Close()
	deadline := time.Now().Add(timeout)
	for time.Now().Before(deadline) {
		info, err := direct.Info(ctx, "replication").Result()
		if err == nil && strings.Contains(info, "master_link_status:up") {
			return nil
		}
		time.Sleep(50 * time.Millisecond) // replication has no change notification
	}
	return fmt.Errorf("replica %d not replicating after %v", n.Port, timeout)
}

func (c *Cluster) add(ctx context.Context, args ...string) (*Node, error) {
	entry, err := c.entry()
	if err != nil {
		return nil, err
	}
	n, err := c.startNode()
	if err != nil {
		return nil, err
	}
	c.Nodes = append(c.Nodes, n) // Close stops it whatever happens next
	if err := redisCLI(append([]string{"add-node", n.Addr(), entry}, args...)...); err != nil {
		return nil, err
	}
	return n, c.AwaitAgreement(ctx, 30*time.Second)
}

// Reshard moves n slots to master from the others, from each a share
// proportional to the slots it serves, its lowest-numbered first
// (redis-cli --cluster reshard --cluster-from all).
func (c *Cluster) Reshard(ctx context.Context, master *Node, n int) error {
	return c.change(ctx, master, func(entry, id string) []string {
		return []string{"reshard", entry, "--cluster-from", "all", "--cluster-to", id,
			"--cluster-slots", strconv.Itoa(n), "--cluster-yes"}
	})
}

// Drain moves every slot of master to the other masters (rebalance with
// the master's weight 0).
func (c *Cluster) Drain(ctx context.Context, master *Node) error {
	return c.change(ctx, master, func(entry, id string) []string {
		return []string{"rebalance", entry, "--cluster-weight", id + "=0"}
	})
}

// Remove deletes a node that serves no slot from the cluster (redis-cli
// --cluster del-node: every other node forgets it), then stops it.
func (c *Cluster) Remove(ctx context.Context, n *Node) error {
	c.Nodes = slices.DeleteFunc(c.Nodes, func(m *Node) bool { return m == n })
	defer func() {
		n.Kill()
		_ = n.Proxy.Close()
	}()
	return c.change(ctx, n, func(entry, id string) []string { return []string{"del-node", entry, id} })
}

// change runs the redis-cli --cluster command args builds from a live
// node's address and the ID of node, then waits for the nodes to agree.
func (c *Cluster) change(ctx context.Context, node *Node, args func(entry, id string) []string) error {
	id, err := node.ID(ctx)
	if err != nil {
		return err
	}
	entry, err := c.entry()
	if err != nil {
		return err
	}
	if err := redisCLI(args(entry, id)...); err != nil {
		return err
	}
	return c.AwaitAgreement(ctx, 30*time.Second)
}

// SlotsServed counts the slots n serves as master, as a live node reports
// it.
func (c *Cluster) SlotsServed(ctx context.Context, n *Node) (int, error) {
	live := c.liveClient()
	defer live.Close()
	slots, err := live.ClusterSlots(ctx).Result()
	if err != nil {
		return 0, err
	}
	count := 0
	for _, s := range slots {
		if len(s.Nodes) > 0 && s.Nodes[0].Addr == n.Addr() {
			count += s.End - s.Start + 1
		}
	}
	return count, nil
}

// AwaitAgreement waits until the cluster is healthy and every live node
// knows the same nodes, in the same roles, serving the same slots: what
// redis-cli --cluster checks before it changes anything.
func (c *Cluster) AwaitAgreement(ctx context.Context, timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	var last string
	for time.Now().Before(deadline) {
		if last = c.unhealthy(); last == "" {
			if last = c.disagreement(ctx); last == "" {
				return nil
			}
		}
		time.Sleep(50 * time.Millisecond) // cluster state has no change notification
	}
	return fmt.Errorf("cluster nodes do not agree after %v: %s", timeout, last)
}

func (c *Cluster) disagreement(ctx context.Context) string {
	var first string
	for _, n := range c.Nodes {
		if !n.alive() {
			continue
		}
		direct := n.direct()
		nodes, err := direct.ClusterNodes(ctx).Result()
		_ = direct.Close()
		if err != nil {
			return fmt.Sprintf("node %d: %v", n.Port, err)
		}
		view, err := clusterView(nodes)
		if err != nil {
			return fmt.Sprintf("node %d: %v", n.Port, err)
		}
		if first == "" {
			first = view
		} else if view != first {
			return fmt.Sprintf("node %d sees\n%s\nanother sees\n%s", n.Port, view, first)
		}
	}
	if got, want := strings.Count(first, "\n"), c.liveCount(); got != want {
		return fmt.Sprintf("the nodes know %d nodes, %d are running", got, want)
	}
	return ""
}

func (c *Cluster) liveCount() int {
	count := 0
	for _, n := range c.Nodes {
		if n.alive() {
			count++
		}
	}
	return count
}

// clusterView is CLUSTER NODES reduced to what every node must agree on:
// each node's ID, address, role, master and slots, one line each, sorted.
// A node in handshake or failing is an error: the view is not settled.
func clusterView(nodes string) (string, error) {
	var lines []string
	for line := range strings.Lines(nodes) {
		f := strings.Fields(line)
		if len(f) < 8 {
			continue
		}
		flags := strings.Split(f[2], ",")
		for _, bad := range []string{"handshake", "fail", "fail?", "noaddr"} {
			if slices.Contains(flags, bad) {
				return "", fmt.Errorf("node %s is %s", f[0], f[2])
			}
		}
		role := "replica"
		if slices.Contains(flags, "master") {
			role = "master"
		}
		var slots []string
		for _, s := range f[8:] {
			if !strings.HasPrefix(s, "[") { // a slot being migrated or imported: the node's own business
				slots = append(slots, s)
			}
		}
		addr, _, _ := strings.Cut(f[1], "@")
		lines = append(lines, strings.Join(append([]string{f[0], addr, role, f[3]}, slots...), " ")+"\n")
	}
	slices.Sort(lines)
	return strings.Join(lines, ""), nil
}
