//go:build integration

package app

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/timestamppb"

	analyticsv1 "kurz.dev/gen/kurz/analytics/v1"
	"kurz.dev/pkg/callmeta"
	"kurz.dev/pkg/chconn"
	"kurz.dev/pkg/clickevent"
	"kurz.dev/pkg/redisconn"
	"kurz.dev/pkg/server"
	"kurz.dev/pkg/testkit/limitertest"
	"kurz.dev/pkg/testkit/servertest"
	"kurz.dev/services/analytics/internal/clickstore"
	"kurz.dev/services/analytics/internal/consumer"
)

// start builds the service on streams of its own ("t-<random>:{tag}"),
// never the real click streams, and runs it until the test ends.
func start(t *testing.T, cfg Config) (*servertest.Running, string) {
	t.Helper()
	prefix := "t-" + rnd()
	srv, err := build(context.Background(), cfg, servertest.Logger(t), hooks{streamPrefix: prefix})
	if err != nil {
		t.Fatalf("build: %v", err)
	}
	r := servertest.Start(t, srv)
	r.AwaitServing(t, "kurz.analytics.v1.AnalyticsService")
	return r, prefix
}

func TestBootsHealthyWithSchemaApplied(t *testing.T) {
	cfg := load(t, map[string]string{"KURZ_LIMITER_GRPC_ADDR": limitertest.Start(t, limitertest.AllowAll).Addr()})
	r, _ := start(t, cfg)
	r.AssertOps(t, "clickhouse", "redis", "consumer")
	if got := r.GRPCServices(t); !slices.Contains(got, "kurz.analytics.v1.AnalyticsService") {
		t.Errorf("reflection lists %v, want kurz.analytics.v1.AnalyticsService", got)
	}

	ch, err := chconn.New(context.Background(), cfg.ClickHouse)
	if err != nil {
		t.Fatal(err)
	}
	defer ch.Close()
	var n uint64
	if err := ch.QueryRow(context.Background(),
		"SELECT count() FROM system.tables WHERE database = ? AND substring(name, 1, 6) = 'click_'", cfg.ClickHouse.Database).Scan(&n); err != nil {
		t.Fatal(err)
	}
	if want := uint64(len(clickstore.Schema(clickstore.LayoutOf(cfg.ClickHouse)))); n != want {
		t.Errorf("click_* tables and views in %s: found %d, want %d", cfg.ClickHouse.Database, n, want)
	}

	deadline := time.Now().Add(10 * time.Second)
	for {
		_, body := r.Get(t, "/metrics")
		if strings.Contains(body, "kurz_analytics_consumer_lag") {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("/metrics has no kurz_analytics_consumer_lag after 10s")
		}
		time.Sleep(50 * time.Millisecond)
	}
	code, body := r.Get(t, "/consumerz")
	var st consumer.Status
	if err := json.Unmarshal([]byte(body), &st); code != 200 || err != nil || st.Group != cfg.ConsumerGroup || !st.Healthy || len(st.Lag) != 4 {
		t.Errorf("/consumerz: %d %s (%v); want the group, healthy, lag of 4 streams", code, body, err)
	}
	if err := r.Stop(); err != nil {
		t.Errorf("graceful stop: %v", err)
	}
}

// TestClicksThroughTheService: events written as the redirect service
// writes them come out of GetLinkStats over gRPC, exactly.
func TestClicksThroughTheService(t *testing.T) {
	cfg := load(t, map[string]string{"KURZ_LIMITER_GRPC_ADDR": limitertest.Start(t, limitertest.AllowAll).Addr()})
	r, prefix := start(t, cfg)
	rdb, err := redisconn.New(context.Background(), cfg.Redis)
	if err != nil {
		t.Fatal(err)
	}
	defer rdb.Close()
	var keys []string
	for _, k := range clickevent.StreamKeys(cfg.Streams.Shards) {
		key := prefix + strings.TrimPrefix(k, consumer.DefaultStreamPrefix)
		keys = append(keys, key)
		defer rdb.Del(context.Background(), key)
	}

	tenant, code := "tenant-"+rnd(), "svc"+rnd()
	day := time.Now().UTC().Truncate(24 * time.Hour).Add(-48 * time.Hour)
	const n = 120
	pipe := rdb.Pipeline()
	for i := range n {
		at := day.Add(time.Duration(i%3)*time.Hour + time.Duration(i)*time.Second)
		ref := "https://news.example.com/a"
		if i%4 == 0 {
			ref = "https://www.social.example/p"
		}
		ev := clickevent.Event{ID: clickevent.NewID(at), Code: code, Tenant: tenant, Time: at,
			Visitor: fmt.Sprintf("%032x", i%15), UserAgent: "Mozilla/5.0 (X11; Linux x86_64; rv:125.0) Gecko/20100101 Firefox/125.0", Referrer: ref}
		pipe.XAdd(context.Background(), &redis.XAddArgs{Stream: keys[i%len(keys)], MaxLen: cfg.Streams.MaxLen, Approx: true, ID: "*", Values: ev.Values()})
	}
	if _, err := pipe.Exec(context.Background()); err != nil {
		t.Fatal(err)
	}

	client := analyticsv1.NewAnalyticsServiceClient(r.Conn)
	ask := func(tenant string) (*analyticsv1.GetLinkStatsResponse, error) {
		ctx := metadata.AppendToOutgoingContext(context.Background(), callmeta.TenantKey, tenant)
		return client.GetLinkStats(ctx, &analyticsv1.GetLinkStatsRequest{
			Code: code, StartTime: timestamppb.New(day), EndTime: timestamppb.New(day.Add(24 * time.Hour))})
	}
	var resp *analyticsv1.GetLinkStatsResponse
	deadline := time.Now().Add(20 * time.Second)
	for {
		if resp, err = ask(tenant); err != nil {
			t.Fatal(err)
		}
		if resp.GetCounts().GetTotal() == n || time.Now().After(deadline) {
			break
		}
		time.Sleep(50 * time.Millisecond)
	}
	c := resp.GetCounts()
	if got, want := [3]int64{c.GetTotal(), c.GetHuman(), c.GetUniqueVisitors()}, [3]int64{n, n, 15}; got != want {
		t.Fatalf("(total, human, unique visitors) = %v, want %v", got, want)
	}
	if resp.GetInterval() != analyticsv1.Interval_INTERVAL_HOUR || len(resp.GetSeries()) != 24 {
		t.Errorf("interval %v with %d buckets, want hourly with 24", resp.GetInterval(), len(resp.GetSeries()))
	}
	for h, b := range resp.GetSeries() {
		if want := map[int]int64{0: 40, 1: 40, 2: 40}[h]; b.GetCounts().GetTotal() != want {
			t.Errorf("hour %d: %d clicks, want %d", h, b.GetCounts().GetTotal(), want)
		}
	}
	top := resp.GetTopReferrers()
	if len(top) != 2 || top[0].GetKey() != "news.example.com" || top[0].GetCount() != 90 || top[1].GetKey() != "social.example" || top[1].GetCount() != 30 {
		t.Errorf("top referrers %v, want news.example.com 90, social.example 30", top)
	}
	if b := resp.GetTopBrowsers(); len(b) != 1 || b[0].GetKey() != "Firefox" || b[0].GetCount() != n {
		t.Errorf("top browsers %v, want Firefox %d", b, n)
	}
	if _, err := ask("someone-else-" + rnd()); status.Code(err) != codes.NotFound {
		t.Errorf("another tenant: %v, want NotFound", err)
	}
}

// Analytics reads gRPC requests of up to server.SmallGRPCMaxRecvMsgSize (a
// stats query is a code and a range), so a call held at the call gate
// holds no more of a request arriving.
func TestGRPCRequestsAreSmall(t *testing.T) {
	cfg := load(t, map[string]string{"KURZ_LIMITER_GRPC_ADDR": limitertest.Start(t, limitertest.AllowAll).Addr()})
	r, _ := start(t, cfg)
	_, err := analyticsv1.NewAnalyticsServiceClient(r.Conn).GetLinkStats(context.Background(),
		&analyticsv1.GetLinkStatsRequest{Code: strings.Repeat("c", server.SmallGRPCMaxRecvMsgSize)})
	if got := status.Code(err); got != codes.ResourceExhausted {
		t.Errorf("a %d-byte stats query: %v (%v), want ResourceExhausted", server.SmallGRPCMaxRecvMsgSize, got, err)
	}
}

// TestUnsignedCallsAreRefusedBeforeTheirRequestArrives: a stats query
// without a valid service assertion is refused (UNAUTHENTICATED) when its
// headers arrive, while its request is still unsent, and counted in
// kurz_grpc_calls_refused_total: a stranger who reaches the gRPC port
// cannot make analytics hold a request per call it opens. The request
// declares almost the receive bound, sends 32 KiB and stalls; a server that
// read it first would never answer.
func TestUnsignedCallsAreRefusedBeforeTheirRequestArrives(t *testing.T) {
	cfg := load(t, map[string]string{"KURZ_LIMITER_GRPC_ADDR": limitertest.Start(t, limitertest.AllowAll).Addr()})
	r, _ := start(t, cfg)
	got, err := servertest.StallGRPCCall(r.Server.GRPCAddr(), "/kurz.analytics.v1.AnalyticsService/GetLinkStats",
		server.SmallGRPCMaxRecvMsgSize-64, 32<<10, 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	if got.Status != int(codes.Unauthenticated) {
		t.Errorf("unsigned call: grpc-status %d (%q) after %d bytes of the request, want %d (Unauthenticated)", got.Status, got.Message, got.Sent, codes.Unauthenticated)
	}
	if _, body := r.Get(t, "/metrics"); !servertest.HasSeries(body, "kurz_grpc_calls_refused_total", `reason="unauthenticated"`) {
		t.Errorf("no kurz_grpc_calls_refused_total{reason=\"unauthenticated\"} after an unsigned call:\n%s", body)
	}
}
