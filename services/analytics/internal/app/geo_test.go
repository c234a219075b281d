//go:build integration

package app

import (
	"context"
	"fmt"
	"net/http"
	"slices"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"google.golang.org/grpc/metadata"

	analyticsv1 "kurz.dev/gen/kurz/analytics/v1"
	"kurz.dev/pkg/callmeta"
	"kurz.dev/pkg/chconn"
	"kurz.dev/pkg/clickevent"
	"kurz.dev/pkg/geoip/geoiptest"
	"kurz.dev/pkg/linkcache"
	"kurz.dev/pkg/redisconn"
	"kurz.dev/pkg/testkit/limitertest"
	"kurz.dev/pkg/testkit/servertest"
	"kurz.dev/services/analytics/internal/clickstore"
)

// Countries end to end: a real redirect process with KURZ_GEOIP_DB (a
// fixture database) behind a trusted proxy's X-Forwarded-For, this
// analytics service's consumer, ClickHouse and GetLinkStats. Each click's
// row holds its client's country (DE, FR from registered_country, JP over
// IPv6, "" for an address the database does not know) and the statistics
// break the clicks down by it.
//
// As in TestVisitorIPsNeverReachStreamsClickHouseOrLogs the redirect
// writes one shard and the consumer group is the test's own, created at
// the stream's end.
func TestCountriesFromRedirectToStats(t *testing.T) {
	ctx := context.Background()
	rig := newRedirectRig(t)
	cfg, rdb := rig.cfg, rig.rdb
	srv, err := build(ctx, cfg, servertest.Logger(t), hooks{})
	if err != nil {
		t.Fatalf("build: %v", err)
	}
	an := servertest.Start(t, srv)
	an.AwaitServing(t, "kurz.analytics.v1.AnalyticsService")

	tenant, code := "tenant-"+rnd(), "geo"+rnd()
	if err := linkcache.WriteThrough(ctx, rdb, code, linkcache.Entry{State: linkcache.Active, URL: "https://example.com/geo", Tenant: tenant}, time.Hour); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { rdb.Del(context.Background(), linkcache.Key(code)) })

	httpAddr, err := servertest.FreeAddr()
	if err != nil {
		t.Fatal(err)
	}
	rp := rig.redirect(t, httpAddr, "KURZ_GEOIP_DB="+geoiptest.Write(t, nil))

	// Clients per country: 3 in DE, 2 in FR, 1 in JP, 2 unknown.
	clients := []string{geoiptest.IPv4DE, geoiptest.IPv4DE, geoiptest.IPv4DE, geoiptest.IPv4RegisteredFR,
		geoiptest.IPv4RegisteredFR, geoiptest.IPv6JP, geoiptest.IPv4Unknown, geoiptest.IPv4Bad}
	noFollow := &http.Client{Timeout: 10 * time.Second, CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
	for _, ip := range clients {
		req, err := http.NewRequest(http.MethodGet, "http://"+httpAddr+"/"+code, nil)
		if err != nil {
			t.Fatal(err)
		}
		req.Header.Set("X-Forwarded-For", ip)
		req.Header.Set("User-Agent", "Mozilla/5.0 (X11; Linux x86_64; rv:125.0) Gecko/20100101 Firefox/125.0")
		resp, err := noFollow.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusFound {
			t.Fatalf("redirect from %s: %d, want 302", ip, resp.StatusCode)
		}
	}
	if err := rp.Stop(); err != nil { // flushes the click buffer
		t.Fatalf("stop the redirect: %v\n%s", err, rp.Output())
	}

	ch, err := chconn.New(ctx, cfg.ClickHouse)
	if err != nil {
		t.Fatal(err)
	}
	defer ch.Close()
	var stored []string
	ok, state := servertest.EventuallyState(30*time.Second, func() (bool, string) {
		rows, err := ch.Query(ctx, "SELECT country FROM "+clickstore.EventsTable+" WHERE tenant = ? AND code = ? ORDER BY country", tenant, code)
		if err != nil {
			return false, err.Error()
		}
		defer rows.Close()
		stored = stored[:0]
		for rows.Next() {
			var c string
			if err := rows.Scan(&c); err != nil {
				return false, err.Error()
			}
			stored = append(stored, c)
		}
		return len(stored) == len(clients), fmt.Sprintf("%d rows", len(stored))
	})
	if !ok {
		t.Fatalf("clicks of %s in ClickHouse after 30 s: %s, want %d", code, state, len(clients))
	}
	if want := []string{"", "", "DE", "DE", "DE", "FR", "FR", "JP"}; !slices.Equal(stored, want) {
		t.Errorf("click_events.country %q, want %q", stored, want)
	}

	// The rollups the statistics read are written by the same insert as
	// the raw rows, but ClickHouse commits each table's part on its own:
	// a read right after the raw rows appear may not see them yet.
	statsCtx := metadata.AppendToOutgoingContext(ctx, callmeta.TenantKey, tenant)
	want := []string{"DE=3", "=2", "FR=2", "JP=1"}
	var got []string
	ok, state = servertest.EventuallyState(30*time.Second, func() (bool, string) {
		resp, err := analyticsv1.NewAnalyticsServiceClient(an.Conn).GetLinkStats(statsCtx, &analyticsv1.GetLinkStatsRequest{Code: code})
		if err != nil {
			return false, err.Error()
		}
		got = got[:0]
		n := int64(0)
		for _, kc := range resp.GetTopCountries() {
			got = append(got, fmt.Sprintf("%s=%d", kc.GetKey(), kc.GetCount()))
			n += kc.GetCount()
		}
		return n == int64(len(clients)), fmt.Sprintf("top countries %v", got)
	})
	if !ok {
		t.Fatalf("statistics of %s after 30 s: %s, want %v", code, state, want)
	}
	if !slices.Equal(got, want) {
		t.Errorf("top countries %v, want %v", got, want)
	}
}

// redirectRig is the setup of a test that runs a real redirect process
// into this analytics service: the redirect binary built from this
// workspace, a fake limiter that allows everything, a configuration on one
// click stream shard (clicks:{0}, a key no 8-shard producer or consumer
// uses) and the test's own consumer group, created at the stream's end and
// destroyed when the test ends.
type redirectRig struct {
	bin, stream string
	lim         *limitertest.Server
	cfg         Config
	rdb         *redis.ClusterClient
}

func newRedirectRig(t *testing.T) redirectRig {
	t.Helper()
	ctx := context.Background()
	r := redirectRig{bin: t.TempDir(), stream: clickevent.StreamKeys(1)[0]}
	if err := servertest.BuildServices(r.bin, "redirect"); err != nil {
		t.Fatal(err)
	}
	r.lim = limitertest.Start(t, limitertest.AllowAll)
	r.cfg = load(t, map[string]string{"KURZ_LIMITER_GRPC_ADDR": r.lim.Addr(), "KURZ_CLICK_STREAM_SHARDS": "1"})
	var err error
	if r.rdb, err = redisconn.New(ctx, r.cfg.Redis); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = r.rdb.Close() })
	if err := r.rdb.XGroupCreateMkStream(ctx, r.stream, r.cfg.ConsumerGroup, "$").Err(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { r.rdb.XGroupDestroy(context.Background(), r.stream, r.cfg.ConsumerGroup) })
	return r
}

// redirect runs the redirect on httpAddr, behind a trusted proxy on
// loopback, writing the rig's stream; env adds to its environment.
func (r redirectRig) redirect(t *testing.T, httpAddr string, env ...string) *servertest.Process {
	t.Helper()
	return servertest.Run(t, r.bin, servertest.Spec{Name: "redirect", HTTPAddr: httpAddr, Env: func(g, h string) []string {
		return append([]string{"KURZ_REDIRECT_GRPC_ADDR=" + g, "KURZ_REDIRECT_HTTP_ADDR=" + h, "KURZ_REDIRECT_OPS_ADDR=127.0.0.1:0",
			"KURZ_LIMITER_GRPC_ADDR=" + r.lim.Addr(), "KURZ_REDIRECT_TRUSTED_PROXIES=127.0.0.1/32,::1",
			"KURZ_CLICK_STREAM_SHARDS=1", "KURZ_REDIRECT_CLICK_FLUSH_INTERVAL=20ms"}, env...)
	}})
}
