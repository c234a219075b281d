package redisconn

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"

	"kurz.dev/pkg/resp"
)

// KeyNodes finds the master that holds a key, and every master: a
// cluster client. Commands that must share one connection with a write
// before them (WAIT, which waits for the connection's own writes) go to
// the key's node directly, in one pipeline.
type KeyNodes interface {
	MasterForKey(ctx context.Context, key string) (*redis.Client, error)
	ForEachMaster(ctx context.Context, fn func(ctx context.Context, client *redis.Client) error) error
}

// Redirection reports whether err is a node's MOVED or ASK answer, and the
// address it names. A node's client follows neither: a command it refused
// ran nowhere, and may be sent to the node named (after ASKING, for ASK).
func Redirection(err error) (ask bool, addr string, ok bool) {
	var rerr redis.Error
	if !errors.As(err, &rerr) {
		return false, "", false
	}
	f := strings.Fields(rerr.Error())
	if len(f) != 3 || (f[0] != "MOVED" && f[0] != "ASK") {
		return false, "", false
	}
	return f[0] == "ASK", f[2], true
}

// MasterAt is the cluster's master at addr, from a fresh view of the
// cluster (ForEachMaster reloads it first).
func MasterAt(ctx context.Context, kn KeyNodes, addr string) (*redis.Client, error) {
	var mu sync.Mutex
	var found *redis.Client
	err := kn.ForEachMaster(ctx, func(_ context.Context, c *redis.Client) error {
		if c.Options().Addr == addr {
			mu.Lock()
			found = c
			mu.Unlock()
		}
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("redis masters: %w", err)
	}
	if found == nil {
		return nil, fmt.Errorf("no redis master at %s", addr)
	}
	return found, nil
}

// ShortOfReplicas lists the masters of rdb holding slots that have fewer
// than want replicas online, each as "<addr> has <n>": a WAIT for want
// replicas on them cannot succeed until a replica comes back.
func ShortOfReplicas(ctx context.Context, rdb *redis.ClusterClient, want int) ([]string, error) {
	shards, err := rdb.ClusterShards(ctx).Result()
	if err != nil {
		return nil, fmt.Errorf("cluster shards: %w", err)
	}
	return shortOfReplicas(shards, want), nil
}

// ReplicasHeld returns a check that fails while a master of rdb holding
// slots has fewer replicas online than want, the value of the setting
// that asks a WAIT for them; the error names the setting, the masters,
// and what it costs there (cost). Nothing else would show it: the service
// still serves, with WAITs that cannot succeed. Services warn with it at
// start and report it in readiness, degraded.
func ReplicasHeld(rdb *redis.ClusterClient, setting string, want int, cost string) func(context.Context) error {
	return func(ctx context.Context) error {
		short, err := ShortOfReplicas(ctx, rdb, want)
		if err != nil {
			return fmt.Errorf("%s=%d not compared with the cluster's replicas: %w", setting, want, err)
		}
		return replicasError(setting, want, short, cost)
	}
}

// WarnReplicasHeld runs ReplicasHeld's check once at start (within 2 s)
// and logs warning with its error when the cluster falls short, then
// returns the check for readiness (a soft check: the service still
// serves).
func WarnReplicasHeld(ctx context.Context, log *slog.Logger, rdb *redis.ClusterClient, setting string, want int, cost, warning string) func(context.Context) error {
	held := ReplicasHeld(rdb, setting, want, cost)
	cctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	if err := held(cctx); err != nil {
		log.Warn(warning, "err", err)
	}
	return held
}

func replicasError(setting string, want int, short []string, cost string) error {
	if len(short) == 0 {
		return nil
	}
	return fmt.Errorf("%s=%d is more than the replicas online (%s): %s; lower it or add replicas",
		setting, want, strings.Join(short, ", "), cost)
}

// shortOfReplicas is ShortOfReplicas on the answer of CLUSTER SHARDS; a
// shard without slots holds no key and is left out.
func shortOfReplicas(shards []redis.ClusterShard, want int) []string {
	var short []string
	for _, s := range shards {
		if len(s.Slots) == 0 {
			continue
		}
		master, online := "a master", 0
		for _, n := range s.Nodes {
			switch n.Role {
			case "master":
				master = net.JoinHostPort(cmp.Or(n.Endpoint, n.IP), strconv.FormatInt(cmp.Or(n.Port, n.TLSPort), 10))
			case "replica":
				if n.Health == "online" {
					online++
				}
			}
		}
		if online < want {
			short = append(short, fmt.Sprintf("%s has %d", master, online))
		}
	}
	return short
}

// OnKeyNode sends, with send, commands that must share one connection to
// the master holding key: a write and the WAIT for it (WAIT waits for the
// writes of its own connection, and has no key to route it). A node
// refuses a command on a slot it does not serve with MOVED (the slot has
// moved; this client's view of the cluster is older) or ASK (the slot is
// moving and the key is already on the other node); a refused command ran
// nowhere, so send is called once more for the node the answer names,
// asking set when it must send ASKING before each command on key. Only
// the write's own refusal counts: send marks with AfterWrite the failure
// of a command after a write that ran.
func OnKeyNode[T any](ctx context.Context, kn KeyNodes, key string, send func(ctx context.Context, node *redis.Client, asking bool) (T, error)) (T, error) {
	var zero T
	node, err := kn.MasterForKey(ctx, key)
	if err != nil {
		return zero, fmt.Errorf("redis node of %s: %w", key, err)
	}
	v, err := send(ctx, node, false)
	var ran afterWrite
	if errors.As(err, &ran) {
		return v, err
	}
	ask, addr, refused := Redirection(err)
	if !refused {
		if !NotRun(err) || !Pause(ctx, unsettledWait) {
			return v, err
		}
		// CLUSTERDOWN from a node just removed from the cluster (del-node
		// resets it) or whose view of the slot has not settled, TRYAGAIN,
		// LOADING: the write ran nowhere. Once more, on the master a
		// reloaded slot map names.
		if r, ok := kn.(interface{ ReloadState(context.Context) }); ok {
			r.ReloadState(ctx)
		}
		node, nerr := kn.MasterForKey(ctx, key)
		if nerr != nil {
			return zero, errors.Join(err, nerr)
		}
		return send(ctx, node, false)
	}
	target, terr := MasterAt(ctx, kn, addr)
	if terr != nil {
		return zero, errors.Join(err, terr)
	}
	return send(ctx, target, ask)
}

// unsettledWait is how long OnKeyNode waits before it sends a write a node
// refused unrun for a reason other than a redirect again: long enough for
// the cluster's gossip to settle a slot's owner and the slot map's
// reload, short beside a visit's deadline (500 ms by default).
const unsettledWait = 50 * time.Millisecond

// NotRun reports whether err is a node's error reply saying it did not run
// the command (resp.NotServed): a redirect, or CLUSTERDOWN, TRYAGAIN,
// LOADING, READONLY, MASTERDOWN, BUSY. Sent again, such a command runs
// once; not so after a timeout or a broken connection.
func NotRun(err error) bool {
	var reply redis.Error
	return errors.As(err, &reply) && resp.NotServed(reply.Error())
}

// Pause waits d, unless ctx ends first or would end before it: false then.
func Pause(ctx context.Context, d time.Duration) bool {
	if dl, ok := ctx.Deadline(); ok && time.Until(dl) < d {
		return false
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-t.C:
		return true
	}
}

// QueueWait queues on p a WAIT for replicas replicas, its timeout three
// quarters of what is left of ctx's deadline (at least 1 ms, also without
// one): it must answer before the socket's deadline, and a WAIT with
// timeout 0 would block for ever. Held reads its answer.
func QueueWait(ctx context.Context, p redis.Pipeliner, replicas int) *redis.Cmd {
	d := time.Millisecond
	if dl, ok := ctx.Deadline(); ok {
		d = max(d, time.Until(dl)*3/4)
	}
	return p.Do(ctx, "WAIT", replicas, d.Milliseconds())
}

// Held is the answer of a WAIT QueueWait queued: how many replicas
// acknowledged the connection's writes in time, and an error that says so
// (naming what) when that is fewer than replicas.
func Held(wait *redis.Cmd, replicas int, what string) (int64, error) {
	held, err := wait.Int64()
	if err != nil {
		return 0, fmt.Errorf("%s: wait for %d replicas: %w", what, replicas, err)
	}
	if held < int64(replicas) {
		return held, fmt.Errorf("%s held by %d of %d replicas in time", what, held, replicas)
	}
	return held, nil
}

// AfterWrite marks err as the failure of a command sent after a write
// that ran, in the same round trip: OnKeyNode returns it, and does not
// send the round trip again even when err is a MOVED or ASK (the key's
// slot moved between the two commands), which would run the write twice.
func AfterWrite(err error) error {
	if err == nil {
		return nil
	}
	return afterWrite{err}
}

type afterWrite struct{ err error }

func (a afterWrite) Error() string { return a.err.Error() }
func (a afterWrite) Unwrap() error { return a.err }
