package redisconn

import (
	"context"
	"errors"
	"fmt"
	"reflect"
	"testing"

	"github.com/redis/go-redis/v9"
)

// replyError is an error reply from Redis, as go-redis returns one.
type replyError string

func (e replyError) Error() string { return string(e) }
func (replyError) RedisError()     {}

// A MOVED or ASK answer is a refused command, to send again to the node it
// names; any other error, a reply or not, is not.
func TestRedirection(t *testing.T) {
	for _, tc := range []struct {
		err  error
		ok   bool
		ask  bool
		addr string
	}{
		{replyError("MOVED 5649 127.0.0.1:7004"), true, false, "127.0.0.1:7004"},
		{fmt.Errorf("redis incr v:abc: %w", replyError("ASK 5649 127.0.0.1:7004")), true, true, "127.0.0.1:7004"},
		{replyError("TRYAGAIN Multiple keys request during rehashing of slot"), false, false, ""},
		{replyError("CLUSTERDOWN The cluster is down"), false, false, ""},
		{errors.New("MOVED 5649 127.0.0.1:7004"), false, false, ""}, // not a reply: may have run
		{errors.New("i/o timeout"), false, false, ""},
		{nil, false, false, ""},
	} {
		ask, addr, ok := Redirection(tc.err)
		if ok != tc.ok || ask != tc.ask || addr != tc.addr {
			t.Errorf("Redirection(%v) = ask %v, %q, %v; want ask %v, %q, %v", tc.err, ask, addr, ok, tc.ask, tc.addr, tc.ok)
		}
	}
}

// shard is a CLUSTER SHARDS entry: a master on port with slots (or none)
// and one replica per health given.
func shard(port int64, slots bool, replicas ...string) redis.ClusterShard {
	s := redis.ClusterShard{Nodes: []redis.Node{{Endpoint: "10.0.0.1", Port: port, Role: "master", Health: "online"}}}
	if slots {
		s.Slots = []redis.SlotRange{{Start: 0, End: 100}}
	}
	for _, h := range replicas {
		s.Nodes = append(s.Nodes, redis.Node{Endpoint: "10.0.0.2", Port: port, Role: "replica", Health: h})
	}
	return s
}

// A master holding slots with fewer replicas online than wanted is listed
// with how many it has; replicas that are down do not count, and a master
// without slots holds no key.
func TestShortOfReplicasCountsEachMastersOnlineReplicas(t *testing.T) {
	shards := []redis.ClusterShard{
		shard(7001, true, "online", "online"),
		shard(7002, true, "online", "failed"),
		shard(7003, false),
	}
	if got := shortOfReplicas(shards, 1); len(got) != 0 {
		t.Errorf("want 1: %q, want none (every master with slots has a replica online)", got)
	}
	if got, want := shortOfReplicas(shards, 2), []string{"10.0.0.1:7002 has 1"}; !reflect.DeepEqual(got, want) {
		t.Errorf("want 2: %q, want %q", got, want)
	}
}

// The readiness check names the setting, each master short of replicas and
// what it costs there.
func TestReplicasHeldNamesTheSettingAndTheCost(t *testing.T) {
	short := shortOfReplicas([]redis.ClusterShard{shard(7002, true, "failed")}, 1)
	err := replicasError("KURZ_X_REPLICAS", 1, short, "writes there wait")
	want := "KURZ_X_REPLICAS=1 is more than the replicas online (10.0.0.1:7002 has 0): writes there wait; lower it or add replicas"
	if err == nil || err.Error() != want {
		t.Fatalf("got %v, want %q", err, want)
	}
	if err := replicasError("KURZ_X_REPLICAS", 1, nil, "writes there wait"); err != nil {
		t.Fatalf("no master short: %v, want nil", err)
	}
}

// oneNode is a cluster of one master that holds every key.
type oneNode struct{ c *redis.Client }

func (n oneNode) MasterForKey(context.Context, string) (*redis.Client, error) { return n.c, nil }

func (n oneNode) ForEachMaster(ctx context.Context, fn func(context.Context, *redis.Client) error) error {
	return fn(ctx, n.c)
}

// OnKeyNode resends a round trip whose write was refused, and never one
// whose write ran and a later command was refused (AfterWrite): the slot
// moved between the two, and the write would run twice.
func TestOnKeyNodeResendsOnlyARefusedWrite(t *testing.T) {
	c := redis.NewClient(&redis.Options{Addr: "127.0.0.1:7004"}) // never dialled
	t.Cleanup(func() { _ = c.Close() })
	ask := replyError("ASK 5649 127.0.0.1:7004")
	for _, tc := range []struct {
		name  string
		first error
		sends int
	}{
		{"write refused", ask, 2},
		{"refused after the write", AfterWrite(fmt.Errorf("expire: %w", ask)), 1},
	} {
		sends := 0
		_, err := OnKeyNode(context.Background(), oneNode{c}, "k", func(context.Context, *redis.Client, bool) (int, error) {
			sends++
			if sends == 1 {
				return 0, tc.first
			}
			return 1, nil
		})
		if sends != tc.sends {
			t.Errorf("%s: sent %d times, want %d (err %v)", tc.name, sends, tc.sends, err)
		}
	}
}

// reloading is oneNode that counts its slot map's reloads.
type reloading struct {
	oneNode
	reloads int
}

func (r *reloading) ReloadState(context.Context) { r.reloads++ }

// A write a node refused unrun for another reason than a redirect
// (CLUSTERDOWN from a node del-node just reset, TRYAGAIN, LOADING) is sent
// once more after the slot map's reload; an error after which the write
// may have run (a timeout here) is not. Before, such a CLUSTERDOWN refused
// a visit (503) while a master left the cluster.
func TestOnKeyNodeSendsAWriteRefusedUnrunOnceMore(t *testing.T) {
	c := redis.NewClient(&redis.Options{Addr: "127.0.0.1:7004"}) // never dialled
	t.Cleanup(func() { _ = c.Close() })
	for _, tc := range []struct {
		name           string
		err            error
		sends, reloads int
	}{
		{"CLUSTERDOWN", replyError("CLUSTERDOWN Hash slot not served"), 2, 1},
		{"LOADING", replyError("LOADING Redis is loading the dataset in memory"), 2, 1},
		{"a timeout", context.DeadlineExceeded, 1, 0},
		{"OOM", replyError("OOM command not allowed when used memory > 'maxmemory'."), 1, 0},
	} {
		kn := &reloading{oneNode: oneNode{c}}
		sends := 0
		v, err := OnKeyNode(context.Background(), kn, "k", func(context.Context, *redis.Client, bool) (int, error) {
			sends++
			if sends == 1 {
				return 0, tc.err
			}
			return 7, nil
		})
		if sends != tc.sends || kn.reloads != tc.reloads {
			t.Errorf("%s: sent %d times after %d reloads, want %d after %d (%d, %v)", tc.name, sends, kn.reloads, tc.sends, tc.reloads, v, err)
		}
		if tc.sends == 2 && (v != 7 || err != nil) {
			t.Errorf("%s: %d, %v; want the second send's answer", tc.name, v, err)
		}
	}
}
