//go:build integration

package faults

import (
	"context"
	"fmt"
	"os"
	"strings"
	"testing"
	"time"

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
