//go:build integration

package faults

import (
	"context"
	"fmt"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	shortenerv1 "kurz.dev/gen/kurz/shortener/v1"
	"kurz.dev/pkg/callmeta"
	"kurz.dev/pkg/config"
	"kurz.dev/pkg/linkcache"
	"kurz.dev/pkg/redisconn"
)

// viaProxy returns the PostgreSQL URL with its host and port replaced by
// the proxy's.
func viaProxy(t *testing.T, rawURL string, p *Proxy) string {
	t.Helper()
	u, err := url.Parse(rawURL)
	if err != nil {
		t.Fatal(err)
	}
	u.Host = p.Addr()
	return u.String()
}

// sharedRedis is a client of the stack's Redis Cluster.
func sharedRedis(t *testing.T) *redis.ClusterClient {
	t.Helper()
	var cfg redisconn.Config
	if err := config.Load(&cfg); err != nil {
		t.Fatal(err)
	}
	rdb, err := redisconn.New(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = rdb.Close() })
	return rdb
}

const browserUA = "Mozilla/5.0 (X11; Linux x86_64) AppleWebKit/537.36 (KHTML, like Gecko) Chrome/131.0.0.0 Safari/537.36"

// get requests a short code on the redirect service, without following.
func get(t *testing.T, redirect *service, code string) (int, string) {
	t.Helper()
	req, err := http.NewRequest(http.MethodGet, "http://"+redirect.httpAddr+"/"+code, nil)
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("User-Agent", browserUA) // a person, not a bot: the click counts as human
	resp, err := noFollow.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	return resp.StatusCode, resp.Header.Get("X-Source")
}

// PostgreSQL goes away (every connection reset, new ones refused). The
// redirect serves every cached link; a link it must look up, and an unknown
// code, answer 503 — and are not negative-cached, since a database error is
// not "not found". CreateLink answers UNAVAILABLE with a message a person
// can act on and writes nothing. When PostgreSQL returns, everything
// recovers by itself.
func TestPostgresDown(t *testing.T) {
	pg := proxy(t, mustHostPort(t, pgURL))
	pgEnv := "KURZ_POSTGRES_URL=" + viaProxy(t, pgURL, pg)
	limiter := startService(t, "limiter", "KURZ_LIMITER_RULES_SOURCE=file", "KURZ_LIMITER_RULES_FILE="+testdata(t, "rules.yaml"))
	shortener := startService(t, "shortener", pgEnv, "KURZ_LIMITER_GRPC_ADDR="+limiter.grpcAddr, "KURZ_SHORTENER_BASE_URL=http://short.test")
	redirect := startService(t, "redirect", pgEnv, "KURZ_LIMITER_GRPC_ADDR="+limiter.grpcAddr)
	sc := shortenerv1.NewShortenerServiceClient(shortener.conn(t))
	ctx := callmeta.Outgoing(context.Background(), "faults", "192.0.2.1")
	rdb := sharedRedis(t)

	links := createLinks(t, shortener, 2)
	cached, evicted := links[0], links[1]
	if st, _ := get(t, redirect, cached); st != http.StatusFound {
		t.Fatalf("before the fault %s answered %d", cached, st)
	}
	// The evicted link is in PostgreSQL only: the redirect must ask the
	// database for it.
	if err := rdb.Del(context.Background(), linkcache.Key(evicted)).Err(); err != nil {
		t.Fatal(err)
	}
	run := strconv.FormatInt(time.Now().UnixNano(), 36)
	unknown, alias := "zz"+run, "pg"+run

	pg.Cut()
	if st, _ := get(t, redirect, cached); st != http.StatusFound {
		t.Errorf("a cached link answered %d while PostgreSQL was down, want 302", st)
	}
	if st, _ := get(t, redirect, evicted); st != http.StatusServiceUnavailable {
		t.Errorf("a link not in the cache answered %d while PostgreSQL was down, want 503", st)
	}
	if st, _ := get(t, redirect, unknown); st != http.StatusServiceUnavailable {
		t.Errorf("an unknown code answered %d while PostgreSQL was down, want 503", st)
	}
	_, err := sc.CreateLink(ctx, &shortenerv1.CreateLinkRequest{LongUrl: "https://example.com/pg-down", CustomAlias: alias})
	if status.Code(err) != codes.Unavailable {
		t.Fatalf("CreateLink while PostgreSQL was down: %v, want UNAVAILABLE", err)
	}
	var retry *errdetails.RetryInfo
	for _, d := range status.Convert(err).Details() {
		if r, ok := d.(*errdetails.RetryInfo); ok {
			retry = r
		}
	}
	if retry == nil || retry.GetRetryDelay().AsDuration() <= 0 {
		t.Errorf("CreateLink while PostgreSQL was down: details %v, want RetryInfo with a delay", status.Convert(err).Details())
	}
	msg := status.Convert(err).Message()
	if strings.Contains(msg, pg.Addr()) || strings.Contains(strings.ToLower(msg), "dial") || strings.Contains(msg, "127.0.0.1") {
		t.Errorf("UNAVAILABLE message leaks internals: %q", msg)
	}
	t.Logf("CreateLink while PostgreSQL is down: %s: %s", status.Code(err), msg)

	restoredAt := time.Now()
	pg.Restore()
	var recovered time.Duration
	eventually(t, 30*time.Second, "the shortener reads PostgreSQL again", func() (bool, string) {
		_, err := sc.GetLink(ctx, &shortenerv1.GetLinkRequest{Code: cached})
		recovered = time.Since(restoredAt)
		return err == nil, status.Convert(err).Message()
	})
	// Nothing of the failed creation was written: the alias is free.
	if _, err := sc.GetLink(ctx, &shortenerv1.GetLinkRequest{Code: alias}); status.Code(err) != codes.NotFound {
		t.Errorf("after a failed CreateLink, GetLink of its alias: %v, want NOT_FOUND", err)
	}
	if n := rdb.Exists(context.Background(), linkcache.Key(alias)).Val(); n != 0 {
		t.Error("a failed CreateLink left a cache entry")
	}
	if _, err := sc.CreateLink(ctx, &shortenerv1.CreateLinkRequest{LongUrl: "https://example.com/pg-back", CustomAlias: alias}); err != nil {
		t.Fatalf("CreateLink after recovery: %v", err)
	}
	// The 503s were not negative-cached.
	if st, src := get(t, redirect, evicted); st != http.StatusFound {
		t.Errorf("after recovery the evicted link answered %d (source %s), want 302", st, src)
	}
	if st, src := get(t, redirect, unknown); st != http.StatusNotFound || src != "db" {
		t.Errorf("after recovery the unknown code answered %d from %q, want 404 from the database", st, src)
	}
	if st, _ := get(t, redirect, alias); st != http.StatusFound {
		t.Errorf("the link created after recovery answered %d", st)
	}
	report(t, "PostgreSQL unreachable (connections reset)", "cached links served; uncached and unknown codes 503, not negative-cached; CreateLink UNAVAILABLE, nothing half-written; recovery by itself", fmt.Sprintf("cached link 302, uncached link and unknown code 503 (not negative-cached), CreateLink UNAVAILABLE, nothing written; recovered %v after PostgreSQL returned",
		recovered.Round(time.Millisecond)))
}

func mustHostPort(t *testing.T, rawURL string) string {
	t.Helper()
	u, err := url.Parse(rawURL)
	if err != nil {
		t.Fatal(err)
	}
	return u.Host
}
