//go:build integration

package faults

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	shortenerv1 "kurz.dev/gen/kurz/shortener/v1"
	"kurz.dev/pkg/callmeta"
	"kurz.dev/pkg/clickevent"
	"kurz.dev/pkg/config"
	"kurz.dev/pkg/linkcache"
	"kurz.dev/pkg/redisconn"
)

// The Redis Cluster is grown and shrunk live, as an operator does it, under
// limiter and redirect load with the click consumer running: a master and
// its replica join (redis-cli --cluster add-node), slots from every master
// move to the new one (reshard), then the new master is emptied again
// (rebalance, its weight 0) and both nodes are deleted (del-node). Limiter
// keys, cached links, visit counters of visit-limited links and a click
// stream, with its consumer group and pending entries, move with their
// slots. Every decision is still made on Redis, or else by its rule's
// failure mode; every redirect is served, visit-limited ones included;
// every click is counted exactly once.
func TestRedisClusterGrownLive(t *testing.T) {
	ctx := context.Background()
	cluster := privateCluster(t)
	limiter := limiterOn(t, cluster.Addrs())
	onCluster := "KURZ_REDIS_ADDRS=" + strings.Join(cluster.Addrs(), ",")
	viaLimiter := "KURZ_LIMITER_GRPC_ADDR=" + limiter.grpcAddr
	shortener := startService(t, "shortener", onCluster, viaLimiter, "KURZ_SHORTENER_BASE_URL=http://short.test")
	// A visit is granted once a replica holds its count (WAIT within the
	// visit timeout). Under -race, with MIGRATE traffic on both cores, a
	// replica's acknowledgement took over the default 500 ms (the visit
	// then answers 503, by design: "held by 0 of 1 replicas"); the slot
	// move is what is under test, so give the replicas 2 s, as the suite
	// gives socket reads 1 s.
	redirect := startService(t, "redirect", onCluster, viaLimiter, "KURZ_REDIRECT_VISIT_TIMEOUT=2s")
	analytics := startService(t, "analytics", onCluster, viaLimiter,
		"KURZ_ANALYTICS_BATCH_SIZE=200", "KURZ_ANALYTICS_BATCH_AGE=200ms", "KURZ_ANALYTICS_CLAIM_IDLE=2s")
	links := createLinks(t, shortener, 30)
	visitLinks := createVisitLinksInMovingSlots(t, shortener, 3)
	links = append(links, visitLinks...)

	decisions := decisionLoad(t, limiter, 8)
	redirects := pacedRedirectLoad(t, redirect, links, 2, 5*time.Millisecond)
	if !decisions.awaitSamples(300, time.Minute) || !redirects.awaitSamples(300, time.Minute) {
		t.Fatal("no steady load before the cluster grows")
	}

	grownAt := time.Now()
	master, err := cluster.AddMaster(ctx)
	if err != nil {
		t.Fatal(err)
	}
	replica, err := cluster.AddReplica(ctx, master)
	if err != nil {
		t.Fatal(err)
	}
	if err := cluster.Reshard(ctx, master, slotsToMove); err != nil {
		t.Fatal(err)
	}
	moved, err := cluster.SlotsServed(ctx, master)
	if err != nil {
		t.Fatal(err)
	}
	if moved == 0 {
		t.Fatal("no slot moved to the new master")
	}
	streamsMoved := streamsOn(t, cluster, master)
	if streamsMoved == 0 {
		t.Error("no click stream moved to the new master: the move of a stream under its consumer was not exercised")
	}
	for _, code := range visitLinks {
		if m, err := cluster.MasterOf(ctx, linkcache.VisitsKey(code)); err != nil || m != master {
			t.Fatalf("the visit counter of %s is not on the new master (%v)", code, err)
		}
	}
	grown := time.Since(grownAt)
	t.Logf("grown in %v: %d slots, %d click streams on the new master", grown.Round(time.Millisecond), moved, streamsMoved)
	if !decisions.awaitSamples(300, time.Minute) || !redirects.awaitSamples(300, time.Minute) {
		t.Fatal("the load stalled on the grown cluster")
	}

	shrunkAt := time.Now()
	if err := cluster.Drain(ctx, master); err != nil {
		t.Fatal(err)
	}
	if left, err := cluster.SlotsServed(ctx, master); err != nil || left != 0 {
		t.Fatalf("the drained master still serves %d slots (%v)", left, err)
	}
	if err := cluster.Remove(ctx, replica); err != nil {
		t.Fatal(err)
	}
	if err := cluster.Remove(ctx, master); err != nil {
		t.Fatal(err)
	}
	shrunk := time.Since(shrunkAt)
	t.Logf("shrunk in %v", shrunk.Round(time.Millisecond))
	if !decisions.awaitSamples(300, time.Minute) || !redirects.awaitSamples(300, time.Minute) {
		t.Fatal("the load stalled on the shrunk cluster")
	}
	samples := decisions.stop()
	served := redirects.stop()

	clickMetrics := scrape(t, redirect)
	t.Logf("redirect: %v", clickMetrics.names("kurz_redirect_click_events"))
	if dropped := clickMetrics.sum("kurz_redirect_click_events_dropped_total"); dropped > 0 {
		t.Errorf("the redirect dropped %v click events: %v", dropped, clickMetrics.names("kurz_redirect_click_events_dropped"))
	}
	bySource := decisionSources(t, samples)
	checkRedirects(t, served)
	nLinks, counted := checkClicksCounted(t, analytics, cluster, served)
	enforcedAgain(t, limiter)
	report(t, "Redis Cluster grown live: a master and its replica added (add-node), slots resharded to it, then drained (rebalance, weight 0) and both deleted (del-node), under limiter, redirect and click load",
		"decisions on Redis, or else by the rule's failure mode; no redirect fails; no click lost or counted twice; quotas enforced after",
		fmt.Sprintf("%d slots moved to the new master (%d of %d click streams with them) in %v and back in %v; %d decisions by source %v; %d redirects, all 302; %d clicks served, %d counted, exactly once per link over %d links",
			moved, streamsMoved, len(clickevent.StreamKeys(streamShards(t))), grown.Round(time.Millisecond), shrunk.Round(time.Millisecond),
			len(samples), bySource, len(served), len(served), counted, nLinks))
}

// slotsToMove is how many slots the new master takes, a third from each
// master, the lowest of each: enough to carry a click stream (clicks:{2},
// slot 5649) and a share of the limiter's keys, few enough that moving
// them takes seconds.
const slotsToMove = 768

// movingSlot reports whether Reshard(slotsToMove) moves slot off one of
// the three masters redis-cli --cluster create made (0-5460, 5461-10922,
// 10923-16383): the lowest slotsToMove/3 of each.
func movingSlot(slot int) bool {
	for _, first := range []int{0, 5461, 10923} {
		if slot >= first && slot < first+slotsToMove/3 {
			return true
		}
	}
	return false
}

// createVisitLinksInMovingSlots creates visit-limited links (a limit out of
// the load's reach) until n of them count their visits in slots the
// reshard moves, and returns those n codes.
func createVisitLinksInMovingSlots(t *testing.T, shortener *service, n int) []string {
	t.Helper()
	sc := shortenerv1.NewShortenerServiceClient(shortener.conn(t))
	ctx := callmeta.Outgoing(context.Background(), "faults", "192.0.2.1")
	var codes []string
	for i := 0; len(codes) < n; i++ {
		if i == 2000 {
			t.Fatalf("%d of %d links count visits in moving slots after %d tries", len(codes), n, i)
		}
		resp, err := sc.CreateLink(ctx, &shortenerv1.CreateLinkRequest{LongUrl: fmt.Sprintf("https://example.com/visits/%d", i), MaxVisits: 1_000_000})
		if err != nil {
			t.Fatal(err)
		}
		if code := resp.GetLink().GetCode(); movingSlot(redisconn.Slot(linkcache.VisitsKey(code))) {
			codes = append(codes, code)
		}
	}
	return codes
}

// decisionSources asserts that every decision was answered, and every
// answer not from Redis by its rule's failure mode; it returns how many
// decisions each source made.
func decisionSources(t *testing.T, samples []sample) map[string]int {
	t.Helper()
	by := map[string]int{}
	for _, s := range samples {
		if s.err != nil {
			t.Fatalf("%v CheckQuota (%s rule) failed instead of applying its failure mode: %v", s.at.Format("15:04:05.000"), s.tag, s.err)
		}
		by[strings.TrimPrefix(s.outcome, "DECISION_SOURCE_")]++
		if byRedis(s.outcome) {
			continue
		}
		want := wantFallback[s.tag]
		if s.outcome != want.source.String() || s.ok != want.allowed {
			t.Fatalf("%s rule answered %s allowed=%v, want Redis or %s allowed=%v", s.tag, s.outcome, s.ok, want.source, want.allowed)
		}
	}
	return by
}

// streamsOn counts the click streams master serves.
func streamsOn(t *testing.T, cluster *Cluster, master *Node) int {
	t.Helper()
	n := 0
	for _, key := range clickevent.StreamKeys(streamShards(t)) {
		m, err := cluster.MasterOf(context.Background(), key)
		if err != nil {
			t.Fatal(err)
		}
		if m == master {
			n++
		}
	}
	return n
}

// streamShards is the number of click streams the services use.
func streamShards(t *testing.T) int {
	t.Helper()
	var streams clickevent.StreamConfig
	if err := config.Load(&streams); err != nil {
		t.Fatal(err)
	}
	return streams.Shards
}
