//go:build integration

package app

import (
	"bytes"
	"context"
	"crypto/rand"
	"fmt"
	"log/slog"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc/metadata"

	analyticsv1 "kurz.dev/gen/kurz/analytics/v1"
	"kurz.dev/pkg/callmeta"
	"kurz.dev/pkg/chconn"
	"kurz.dev/pkg/clickevent"
	"kurz.dev/pkg/clientip"
	"kurz.dev/pkg/linkcache"
	"kurz.dev/pkg/testkit/servertest"
	"kurz.dev/services/analytics/internal/clickstore"
)

// logBuffer keeps everything a service logs, and copies it to the test log.
type logBuffer struct {
	t  testing.TB
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *logBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	l.b.Write(p)
	l.mu.Unlock()
	l.t.Log(strings.TrimSuffix(string(p), "\n"))
	return len(p), nil
}

func (l *logBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// Raw client IPs never reach the click streams, ClickHouse or the logs: only
// the salted visitor hash does. Clicks come through a real redirect process
// (built from this workspace, logging at debug level, behind a proxy that
// sets X-Forwarded-For) from two distinctive visitors, one IPv4 and one
// IPv6, each behind a forged first hop; the click consumer of this analytics
// service (in process, debug level) moves them into ClickHouse, and the
// statistics are read as the gateway reads them, with the caller's IP in
// x-kurz-client-ip. None of the IP strings appears in any field of the
// stream entries, in any row of any ClickHouse table of the database, in
// the statistics, in the redirect's output or in the analytics log; each
// visitor field is the HMAC of the day, IP key (an IPv6 visitor's /64) and
// user agent under the salt.
//
// The redirect writes one shard (KURZ_CLICK_STREAM_SHARDS=1: clicks:{0}, a
// key no 8-shard producer or consumer uses) and the consumer group is the
// test's own, created at the stream's end.
func TestVisitorIPsNeverReachStreamsClickHouseOrLogs(t *testing.T) {
	const salt = "security-test-salt-0123456789abcdef"
	const perVisitor = 12
	ctx := context.Background()
	rig := newRedirectRig(t)
	cfg, rdb, stream := rig.cfg, rig.rdb, rig.stream

	lb := &logBuffer{t: t}
	srv, err := build(ctx, cfg, slog.New(slog.NewJSONHandler(lb, &slog.HandlerOptions{Level: slog.LevelDebug})), hooks{})
	if err != nil {
		t.Fatalf("build: %v", err)
	}
	an := servertest.Start(t, srv)
	an.AwaitServing(t, "kurz.analytics.v1.AnalyticsService")

	tenant, code := "tenant-"+rnd(), "ip"+rnd()
	target := "https://example.com/visited"
	if err := linkcache.WriteThrough(ctx, rdb, code, linkcache.Entry{State: linkcache.Active, URL: target, Tenant: tenant}, time.Hour); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { rdb.Del(context.Background(), linkcache.Key(code)) })

	var b [8]byte
	_, _ = rand.Read(b[:])
	visitors := []string{
		fmt.Sprintf("192.0.2.%d", 10+b[0]%240),
		fmt.Sprintf("2001:db8:%x:%x::%x", b[1]|0x10, b[2]|0x10, b[3]|0x10),
	}
	forged := []string{fmt.Sprintf("198.51.100.%d", 10+b[4]%240), fmt.Sprintf("2001:db8:%x::%x", b[5]|0x10, b[6]|0x10)}
	caller := fmt.Sprintf("203.0.113.%d", 10+b[7]%240) // the gateway's client reading the stats
	needles := slices.Concat(visitors, forged, []string{caller})
	t.Logf("visitor IPs %v, forged hops %v, stats caller %s", visitors, forged, caller)

	httpAddr, err := servertest.FreeAddr()
	if err != nil {
		t.Fatal(err)
	}
	rp := rig.redirect(t, httpAddr, "KURZ_REDIRECT_VISITOR_SALT="+salt, "KURZ_LOG_LEVEL=debug")

	since := time.Now().Add(-time.Second)
	noFollow := &http.Client{Timeout: 10 * time.Second, CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
	const ua = "Mozilla/5.0 (X11; Linux x86_64; rv:125.0) Gecko/20100101 Firefox/125.0"
	get := func(path, xff string) int {
		t.Helper()
		req, err := http.NewRequest(http.MethodGet, "http://"+httpAddr+path, nil)
		if err != nil {
			t.Fatal(err)
		}
		req.Header.Set("X-Forwarded-For", xff)
		req.Header.Set("User-Agent", ua)
		req.Header.Set("Referer", "https://news.example/item")
		resp, err := noFollow.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		return resp.StatusCode
	}
	for i, ip := range visitors {
		for range perVisitor {
			if status := get("/"+code, forged[i]+", "+ip); status != http.StatusFound {
				t.Fatalf("redirect from %s: %d, want 302", ip, status)
			}
		}
		// The miss path, where the redirect hands the IP to the limiter.
		if status := get("/zz"+rnd(), forged[i]+", "+ip); status != http.StatusNotFound && status != http.StatusServiceUnavailable {
			t.Errorf("unknown code from %s: %d, want 404 (or 503 without the links table)", ip, status)
		}
	}
	if err := rp.Stop(); err != nil { // flushes the click buffer
		t.Fatalf("stop the redirect: %v\n%s", err, rp.Output())
	}

	msgs, err := rdb.XRange(ctx, stream, strconv.FormatInt(since.UnixMilli(), 10), "+").Result()
	if err != nil {
		t.Fatal(err)
	}
	var ids []string
	for _, m := range msgs {
		if m.Values[clickevent.FieldCode] != code {
			continue
		}
		ids = append(ids, m.ID)
		e, err := clickevent.Parse(m.Values)
		if err != nil {
			t.Fatalf("%s %s: %v", stream, m.ID, err)
		}
		for f, v := range m.Values {
			for _, ip := range needles {
				if s, _ := v.(string); strings.Contains(s, ip) {
					t.Errorf("stream entry %s, field %s = %q holds the IP %s", m.ID, f, s, ip)
				}
			}
		}
		hashed := false
		for _, ip := range visitors {
			// The redirect hashes the client's key: an IPv6 visitor's /64.
			key := clientip.Keying{IPv6Prefix: 64}.KeyString(ip)
			hashed = hashed || e.Visitor == clickevent.Visitor([]byte(salt), e.Time, key, ua)
		}
		if !hashed {
			t.Errorf("stream entry %s: visitor %q is not the salted hash of a visitor IP", m.ID, e.Visitor)
		}
	}
	t.Cleanup(func() {
		if len(ids) > 0 {
			rdb.XDel(context.Background(), stream, ids...)
		}
	})
	if len(ids) != len(visitors)*perVisitor {
		t.Fatalf("%d click events of %s in %s, want %d", len(ids), code, stream, len(visitors)*perVisitor)
	}

	ch, err := chconn.New(ctx, cfg.ClickHouse)
	if err != nil {
		t.Fatal(err)
	}
	defer ch.Close()
	deadline := time.Now().Add(30 * time.Second)
	for {
		var n uint64
		if err := ch.QueryRow(ctx, "SELECT count() FROM "+clickstore.EventsTable+" WHERE tenant = ? AND code = ?", tenant, code).Scan(&n); err != nil {
			t.Fatal(err)
		}
		if n == uint64(len(ids)) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d rows of %s in ClickHouse after 30 s, want %d", n, code, len(ids))
		}
		time.Sleep(100 * time.Millisecond)
	}
	// Every table the clicks reach, each row of this test's link and tenant
	// (the views key them by both), and every event row inserted since the
	// test began; each row is matched as a whole, all columns as text.
	tables := []string{clickstore.EventsTable, clickstore.HourlyTable, clickstore.DimsTable, clickstore.OwnersTable, clickstore.SuspectsTable}
	var anyIP []string
	var args []any // the needles, then tenant and code
	for _, ip := range needles {
		anyIP = append(anyIP, "position(toString(tuple(*)), ?) > 0")
		args = append(args, ip)
	}
	args = append(args, tenant, code)
	scanned := map[string]uint64{}
	for _, table := range tables {
		where := "(tenant = ? AND code = ?)"
		if table == clickstore.EventsTable {
			where = "(" + where + " OR inserted_at >= toDateTime(" + strconv.FormatInt(since.Unix(), 10) + "))"
		}
		var rows, hits uint64
		if err := ch.QueryRow(ctx, "SELECT count(), countIf("+strings.Join(anyIP, " OR ")+") FROM "+table+" WHERE "+where,
			args...).Scan(&rows, &hits); err != nil {
			t.Fatalf("scan %s: %v", table, err)
		}
		scanned[table] = rows
		if hits > 0 {
			t.Errorf("ClickHouse %s.%s: %d of %d rows hold a client IP", cfg.ClickHouse.Database, table, hits, rows)
		}
	}
	if scanned[clickstore.EventsTable] < uint64(len(ids)) || scanned[clickstore.OwnersTable] == 0 {
		t.Errorf("rows scanned %v; want at least this test's %d events and its owner row", scanned, len(ids))
	}
	var visitorsStored uint64
	if err := ch.QueryRow(ctx, "SELECT uniqExact(visitor) FROM "+clickstore.EventsTable+" WHERE tenant = ? AND code = ? AND length(visitor) = 32", tenant, code).Scan(&visitorsStored); err != nil {
		t.Fatal(err)
	}
	if visitorsStored != uint64(len(visitors)) {
		t.Errorf("%d distinct 32-hex visitors stored for %s, want %d (one hash per visitor)", visitorsStored, code, len(visitors))
	}

	statsCtx := metadata.AppendToOutgoingContext(ctx, callmeta.TenantKey, tenant, callmeta.ClientIPKey, caller)
	resp, err := analyticsv1.NewAnalyticsServiceClient(an.Conn).GetLinkStats(statsCtx, &analyticsv1.GetLinkStatsRequest{Code: code})
	if err != nil {
		t.Fatal(err)
	}
	if resp.GetCounts().GetTotal() != int64(len(ids)) {
		t.Errorf("stats total %d, want %d", resp.GetCounts().GetTotal(), len(ids))
	}
	if err := an.Stop(); err != nil { // every line is written
		t.Fatal(err)
	}
	for name, out := range map[string]string{"stats answer": resp.String(), "analytics log": lb.String(), "redirect output": rp.Output()} {
		for _, ip := range needles {
			if strings.Contains(out, ip) {
				t.Errorf("the %s holds the IP %s", name, ip)
			}
		}
	}
	if !strings.Contains(rp.Output(), "serving") || !strings.Contains(lb.String(), "analytics configured") {
		t.Errorf("logs not captured: redirect %d bytes, analytics %d bytes", len(rp.Output()), len(lb.String()))
	}
	if t.Failed() {
		t.Logf("redirect output:\n%s", rp.Output())
	}
	t.Logf("%d events: %d stream fields, ClickHouse rows %v, %d + %d bytes of logs checked", len(ids), len(ids)*len(clickevent.Event{}.Values())/2, scanned, len(rp.Output()), len(lb.String()))
}
