//go:build integration

package faults

import (
	"cmp"
	"context"
	"fmt"
	"net"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	analyticsv1 "kurz.dev/gen/kurz/analytics/v1"
	"kurz.dev/pkg/callmeta"
	"kurz.dev/pkg/clickevent"
)

// Clicks flow from the redirect through the streams into ClickHouse while
// the pipeline is hurt twice: ClickHouse goes away for a while, then the
// consumer is killed with SIGKILL in the middle of its work and started
// again under a new name. Afterwards every click answered 302 is counted
// exactly once: none lost, none twice.
func TestNoClickLostOrCountedTwice(t *testing.T) {
	cluster := privateCluster(t)
	onCluster := "KURZ_REDIS_ADDRS=" + strings.Join(cluster.Addrs(), ",")
	ch := proxy(t, clickHouseAddr())
	limiter := startService(t, "limiter", "KURZ_LIMITER_RULES_SOURCE=file", "KURZ_LIMITER_RULES_FILE="+testdata(t, "rules.yaml"))
	viaLimiter := "KURZ_LIMITER_GRPC_ADDR=" + limiter.grpcAddr
	shortener := startService(t, "shortener", viaLimiter, onCluster, "KURZ_SHORTENER_BASE_URL=http://short.test")
	redirect := startService(t, "redirect", viaLimiter, onCluster)
	consumerEnv := []string{viaLimiter, onCluster, "KURZ_CLICKHOUSE_ADDRS=" + ch.Addr(),
		"KURZ_ANALYTICS_BATCH_SIZE=200", "KURZ_ANALYTICS_BATCH_AGE=200ms",
		"KURZ_ANALYTICS_CLAIM_IDLE=2s", "KURZ_ANALYTICS_INSERT_TIMEOUT=2s"}
	analytics := startService(t, "analytics", append(consumerEnv, "KURZ_ANALYTICS_CONSUMER_NAME=first")...)

	links := createLinks(t, shortener, 20)
	clicks := redirectLoad(t, redirect, links, 2)
	if !clicks.awaitSamples(300, time.Minute) {
		t.Fatal("no clicks before the faults")
	}
	ch.Cut()
	if !clicks.awaitSamples(300, time.Minute) {
		t.Fatal("redirects stalled while ClickHouse was down")
	}
	ch.Restore()
	if !clicks.awaitSamples(300, time.Minute) {
		t.Fatal("no clicks after ClickHouse returned")
	}
	analytics.Kill()
	if !clicks.awaitSamples(300, time.Minute) {
		t.Fatal("redirects stalled while the consumer was dead")
	}
	analytics.env = append(analytics.env, "KURZ_ANALYTICS_CONSUMER_NAME=second") // the last value wins
	analytics.start(t)
	if !clicks.awaitSamples(300, time.Minute) {
		t.Fatal("no clicks after the consumer restarted")
	}
	served := clicks.stop()
	checkRedirects(t, served)
	nLinks, counted := checkClicksCounted(t, analytics, cluster, served)
	report(t, "ClickHouse unreachable, then the consumer killed (SIGKILL) mid-work and restarted under a new name, under click load", "no click lost, none counted twice", fmt.Sprintf("%d clicks served, %d counted, exactly once per link over %d links", len(served), counted, nLinks))
}

// A Redis master is cut off from its replica (the replication link's bytes
// dropped, as across a partition) while the click consumer reads its
// streams, stores the clicks and acknowledges them; then the master dies.
// The promoted replica never saw those reads: its streams hold the clicks
// but not the consumer group's record of having delivered them, so it
// delivers them first-hand again, and the consumer stores them again.
// Every click still counts once.
func TestClicksReadBeforeAFailoverCountOnce(t *testing.T) {
	ctx := context.Background()
	cluster := privateCluster(t)
	onCluster := "KURZ_REDIS_ADDRS=" + strings.Join(cluster.Addrs(), ",")
	limiter := startService(t, "limiter", "KURZ_LIMITER_RULES_SOURCE=file", "KURZ_LIMITER_RULES_FILE="+testdata(t, "rules.yaml"))
	viaLimiter := "KURZ_LIMITER_GRPC_ADDR=" + limiter.grpcAddr
	shortener := startService(t, "shortener", viaLimiter, onCluster, "KURZ_SHORTENER_BASE_URL=http://short.test")
	redirect := startService(t, "redirect", viaLimiter, onCluster)
	links := createLinks(t, shortener, 20)
	clicks := redirectLoad(t, redirect, links, 2)
	if !clicks.awaitSamples(400, time.Minute) {
		t.Fatal("no clicks")
	}
	served := clicks.stop()
	checkRedirects(t, served)
	keys := clickevent.StreamKeys(streamShards(t))
	rdb := cluster.Client()
	defer rdb.Close()
	eventually(t, 10*time.Second, "every click served in the streams", func() (bool, string) {
		var n int64
		for _, k := range keys {
			l, err := rdb.XLen(ctx, k).Result()
			if err != nil {
				return false, err.Error()
			}
			n += l
		}
		return n == int64(len(served)), fmt.Sprintf("%d of %d", n, len(served))
	})

	// The victim: the master of the first stream; its streams must be on
	// its replica in full before the partition, as they would be after
	// any quiet moment.
	victim, err := cluster.MasterOf(ctx, keys[0])
	if err != nil {
		t.Fatal(err)
	}
	replica := replicaOf(t, cluster, victim)
	var onVictim []string
	for _, k := range keys {
		if m, err := cluster.MasterOf(ctx, k); err != nil {
			t.Fatal(err)
		} else if m == victim {
			onVictim = append(onVictim, k)
		}
	}
	var entries int64
	eventually(t, 10*time.Second, "the replica holds every click of the victim's streams", func() (bool, string) {
		entries = 0
		for _, k := range onVictim {
			m, r := xlen(t, victim, k), xlen(t, replica, k)
			if m != r {
				return false, fmt.Sprintf("%s: %d entries on the master, %d on the replica", k, m, r)
			}
			entries += m
		}
		return true, ""
	})
	if entries == 0 {
		t.Fatal("no click on the victim's streams: the fault would reach nothing")
	}

	victim.Proxy.Isolate() // the replication link, and every other connection open now
	analytics := startService(t, "analytics", viaLimiter, onCluster,
		"KURZ_ANALYTICS_BATCH_SIZE=200", "KURZ_ANALYTICS_BATCH_AGE=200ms", "KURZ_ANALYTICS_CLAIM_IDLE=2s")
	firstCopies := int64(len(served))
	eventually(t, time.Minute, "every click stored once before the failover", func() (bool, string) {
		got := int64(scrape(t, analytics).sum("kurz_analytics_events_consumed_total"))
		return got == firstCopies, fmt.Sprintf("%d of %d stored", got, firstCopies)
	})
	// Every click on the cut-off master, and none other of its streams',
	// was read without its replica's acknowledgement. (Reads of other
	// masters' streams may be too, when a replica did not acknowledge
	// within the 100 ms a read waits: in three runs of eight here the
	// clicks of one more master, while the cluster saw the victim go;
	// stored as suspect, which is safe. They are logged, not asserted.)
	unreplicated := scrape(t, analytics)
	var onVictimUnreplicated int64
	for line, v := range unreplicated {
		if !strings.HasPrefix(line, "kurz_analytics_events_read_unreplicated_total{") {
			continue
		}
		for _, k := range onVictim {
			if strings.Contains(line, `stream="`+k+`"`) {
				onVictimUnreplicated += int64(v)
			}
		}
	}
	if onVictimUnreplicated != entries {
		t.Errorf("%d clicks of the cut-off master's streams read without a replica's acknowledgement, want its %d", onVictimUnreplicated, entries)
	}
	if all := int64(unreplicated.sum("kurz_analytics_events_read_unreplicated_total")); all != onVictimUnreplicated {
		t.Logf("%d clicks of other masters' streams read without a replica's acknowledgement: %v", all-onVictimUnreplicated,
			unreplicated.names("kurz_analytics_events_read_unreplicated_total"))
	}

	killedAt := time.Now()
	victim.Kill()
	if err := cluster.AwaitHealthy(30 * time.Second); err != nil {
		t.Fatal(err)
	}
	eventually(t, time.Minute, "the promoted replica's clicks stored again", func() (bool, string) {
		got := int64(scrape(t, analytics).sum("kurz_analytics_events_consumed_total"))
		return got == firstCopies+entries, fmt.Sprintf("%d stored, want %d + %d delivered again", got, firstCopies, entries)
	})
	nLinks, counted := checkClicksCounted(t, analytics, cluster, served)
	report(t, "Redis master cut off from its replica while the click consumer read and stored its clicks, then killed (SIGKILL): the promoted replica delivers those clicks again", "every click counted once",
		fmt.Sprintf("%d clicks served, %d of them on the cut-off master, stored again %v after the kill; %d counted, exactly once per link over %d links",
			len(served), entries, time.Since(killedAt).Round(time.Millisecond), counted, nLinks))
}

// replicaOf is the node that replicates master.
func replicaOf(t *testing.T, cluster *Cluster, master *Node) *Node {
	t.Helper()
	direct := redis.NewClient(&redis.Options{Addr: "127.0.0.1:" + strconv.Itoa(master.Port)})
	defer direct.Close()
	shards, err := direct.ClusterShards(context.Background()).Result()
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range shards {
		var isMaster bool
		var replica string
		for _, n := range s.Nodes {
			addr := net.JoinHostPort(cmp.Or(n.Endpoint, n.IP), strconv.FormatInt(n.Port, 10))
			switch {
			case n.Role == "master" && addr == master.Addr():
				isMaster = true
			case n.Role == "replica":
				replica = addr
			}
		}
		if isMaster && replica != "" {
			node, err := cluster.byAddr(replica)
			if err != nil {
				t.Fatal(err)
			}
			return node
		}
	}
	t.Fatalf("no replica of %s", master.Addr())
	return nil
}

// xlen is a stream's length on one node, master or replica, read directly.
func xlen(t *testing.T, n *Node, key string) int64 {
	t.Helper()
	ctx := context.Background()
	direct := redis.NewClient(&redis.Options{Addr: "127.0.0.1:" + strconv.Itoa(n.Port)})
	defer direct.Close()
	conn := direct.Conn()
	defer conn.Close()
	if err := conn.ReadOnly(ctx).Err(); err != nil {
		t.Fatal(err)
	}
	l, err := conn.XLen(ctx, key).Result()
	if err != nil {
		t.Fatalf("xlen %s on %d: %v", key, n.Port, err)
	}
	return l
}

// checkClicksCounted asserts that every redirect served counted exactly
// once for its link, and that nothing is left pending in the consumer group
// (so nothing can arrive late); it returns how many links and clicks the
// statistics count.
func checkClicksCounted(t *testing.T, analytics *service, cluster *Cluster, served []sample) (links int, clicks int64) {
	t.Helper()
	want := map[string]int64{}
	for _, s := range served {
		want[s.tag]++
	}
	stats := analyticsv1.NewAnalyticsServiceClient(analytics.conn(t))
	ctx := callmeta.Outgoing(context.Background(), "faults", "")
	eventually(t, 60*time.Second, "every click counted", func() (bool, string) {
		for code, n := range want {
			resp, err := stats.GetLinkStats(ctx, &analyticsv1.GetLinkStatsRequest{Code: code})
			if err != nil {
				return false, err.Error()
			}
			if got := resp.GetCounts().GetTotal(); got != n {
				return false, fmt.Sprintf("%s: %d counted of %d served", code, got, n)
			}
		}
		return true, ""
	})
	rdb := cluster.Client()
	defer rdb.Close()
	eventually(t, 30*time.Second, "nothing pending in the consumer group", func() (bool, string) {
		var pending int64
		for _, key := range clickevent.StreamKeys(streamShards(t)) {
			p, err := rdb.XPending(context.Background(), key, "analytics").Result()
			if err != nil {
				return false, err.Error()
			}
			pending += p.Count
		}
		return pending == 0, fmt.Sprintf("%d pending", pending)
	})
	for code, n := range want {
		resp, err := stats.GetLinkStats(ctx, &analyticsv1.GetLinkStatsRequest{Code: code})
		if err != nil {
			t.Fatal(err)
		}
		got := resp.GetCounts().GetTotal()
		if got != n {
			t.Fatalf("%s: %d counted of %d served after the consumer caught up", code, got, n)
		}
		clicks += got
	}
	return len(want), clicks
}

// clickHouseAddr is the native address of the stack's ClickHouse.
func clickHouseAddr() string {
	if a := os.Getenv("KURZ_CLICKHOUSE_ADDRS"); a != "" {
		return strings.Split(a, ",")[0]
	}
	return "127.0.0.1:9000"
}
