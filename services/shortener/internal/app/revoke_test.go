//go:build integration

package app

import (
	"context"
	"net/http"
	"net/url"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/redis/go-redis/v9"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/protobuf/types/known/fieldmaskpb"

	shortenerv1 "kurz.dev/gen/kurz/shortener/v1"
	"kurz.dev/pkg/testkit/limitertest"
	"kurz.dev/pkg/testkit/redistest"
	"kurz.dev/pkg/testkit/servertest"
)

// privateDatabase creates an empty PostgreSQL database for one test, next to
// the one KURZ_POSTGRES_URL names, drops it when the test ends, and returns
// its URL. A test that needs queued invalidations to stay its own uses one:
// every shortener drains the shared link_invalidations table into the Redis
// it is configured with, and another test's shortener (another Redis) could
// take them.
func privateDatabase(t *testing.T) string {
	t.Helper()
	ctx := context.Background()
	base := load(t, nil).Postgres.URL
	admin, err := pgx.Connect(ctx, base)
	if err != nil {
		t.Fatal(err)
	}
	defer admin.Close(ctx)
	name := uniq("kurz_revoke_")
	if _, err := admin.Exec(ctx, "CREATE DATABASE "+name); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx := context.Background()
		admin, err := pgx.Connect(ctx, base)
		if err != nil {
			t.Errorf("drop database %s: %v", name, err)
			return
		}
		defer admin.Close(ctx)
		if _, err := admin.Exec(ctx, "DROP DATABASE "+name+" WITH (FORCE)"); err != nil {
			t.Errorf("drop database %s: %v", name, err)
		}
	})
	u, err := url.Parse(base)
	if err != nil {
		t.Fatal(err)
	}
	u.Path = "/" + name
	return u.String()
}

// TestRevokeAndUpdateWhoseWriteThroughFailedReachEveryRedirect: a link is
// revoked and another one redirected elsewhere while Redis refuses the
// shortener's writes, and every redirect replica follows both changes once
// Redis takes writes again. A shortener and two redirect replicas run as
// processes (built from this workspace) on a private Redis and a private
// database. Both replicas have both links in L1 (second GET: X-Source l1);
// Redis refuses writes (maxmemory below its use: every SET fails with OOM,
// reads still work); DeleteLink and UpdateLink (long_url) succeed (the
// changes are committed) and two invalidations are pending, the oldest
// waiting more than 0 s; Redis takes writes again, and within 30 s both
// replicas answer 410 for the revoked link and 302 to the new URL for the
// other, and nothing is pending any more.
//
// A frozen Redis (SIGSTOP) would not do: the SET the shortener gave up on
// waits in the socket and is applied when Redis thaws, whereas the write of
// a failover is lost for good. A refused write is lost for good too.
func TestRevokeAndUpdateWhoseWriteThroughFailedReachEveryRedirect(t *testing.T) {
	const (
		pendingMetric = "kurz_shortener_invalidations_pending"
		ageMetric     = "kurz_shortener_invalidations_oldest_age_seconds"
	)
	node := redistest.Start(t)
	dbURL := privateDatabase(t)
	bin := t.TempDir()
	if err := servertest.BuildServices(bin, "shortener", "redirect"); err != nil {
		t.Fatal(err)
	}
	lim := limitertest.Start(t, limitertest.AllowAll)
	stores := []string{"KURZ_REDIS_ADDRS=" + node.Addr, "KURZ_POSTGRES_URL=" + dbURL, "KURZ_LIMITER_GRPC_ADDR=" + lim.Addr()}

	shHTTP, err := servertest.FreeAddr()
	if err != nil {
		t.Fatal(err)
	}
	// First and alone: it applies the schema the redirects read.
	sh := servertest.Run(t, bin, servertest.Spec{Name: "shortener", Service: "kurz.shortener.v1.ShortenerService",
		HTTPAddr: shHTTP, Env: func(g, h string) []string {
			// The private Redis has no replica to wait for.
			return append([]string{"KURZ_SHORTENER_GRPC_ADDR=" + g, "KURZ_SHORTENER_HTTP_ADDR=" + h,
				"KURZ_SHORTENER_INVALIDATION_RETRY=200ms", "KURZ_SHORTENER_CACHE_REPLICAS=0"}, stores...)
		}})
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("shortener output:\n%s", sh.Output())
		}
	})
	redirectSpec := func(httpAddr string) servertest.Spec {
		return servertest.Spec{Name: "redirect", HTTPAddr: httpAddr, Env: func(g, h string) []string {
			return append([]string{"KURZ_REDIRECT_GRPC_ADDR=" + g, "KURZ_REDIRECT_HTTP_ADDR=" + h, "KURZ_REDIRECT_OPS_ADDR=127.0.0.1:0"}, stores...)
		}}
	}
	var replicas []string
	var specs []servertest.Spec
	for range 2 {
		addr, err := servertest.FreeAddr()
		if err != nil {
			t.Fatal(err)
		}
		replicas = append(replicas, addr)
		specs = append(specs, redirectSpec(addr))
	}
	procs, err := servertest.StartAll(bin, specs...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { servertest.StopAll(procs...) })

	conn, err := grpc.NewClient(sh.GRPCAddr, grpc.WithTransportCredentials(insecure.NewCredentials()), servertest.ServiceAuth())
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	api := shortenerv1.NewShortenerServiceClient(conn)
	ctx := as(uniq("revoke-"), "")
	var codes []string // revoked, moved
	for _, target := range []string{"https://example.com/taken-down", "https://example.com/old"} {
		made, err := api.CreateLink(ctx, &shortenerv1.CreateLinkRequest{LongUrl: target})
		if err != nil {
			t.Fatal(err)
		}
		codes = append(codes, made.GetLink().GetCode())
	}
	revoked, moved := codes[0], codes[1]
	const newURL = "https://example.com/new"

	noFollow := &http.Client{Timeout: 5 * time.Second, CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
	// visit returns a replica's answer for code: status, X-Source, Location.
	visit := func(addr, code string) (int, string, string) {
		t.Helper()
		resp, err := noFollow.Get("http://" + addr + "/" + code)
		if err != nil {
			t.Fatalf("GET %s/%s: %v", addr, code, err)
		}
		resp.Body.Close()
		return resp.StatusCode, resp.Header.Get("X-Source"), resp.Header.Get("Location")
	}
	for _, addr := range replicas {
		for _, code := range codes {
			visit(addr, code) // from Redis (the create's write-through), into L1
			if status, source, _ := visit(addr, code); status != http.StatusFound || source != "l1" {
				t.Fatalf("replica %s, %s before the changes: %d from %q, want 302 from l1", addr, code, status, source)
			}
		}
	}

	admin := redis.NewClient(&redis.Options{Addr: node.Addr})
	defer admin.Close()
	maxmemory := func(v string) {
		t.Helper()
		if err := admin.ConfigSet(context.Background(), "maxmemory", v).Err(); err != nil {
			t.Fatalf("CONFIG SET maxmemory %s: %v", v, err)
		}
	}
	if err := admin.ConfigSet(context.Background(), "maxmemory-policy", "noeviction").Err(); err != nil {
		t.Fatal(err)
	}
	maxmemory("1")
	if _, err := api.DeleteLink(ctx, &shortenerv1.DeleteLinkRequest{Code: revoked}); err != nil {
		t.Fatalf("DeleteLink while Redis refuses writes: %v, want success (the revocation is committed)", err)
	}
	if _, err := api.UpdateLink(ctx, &shortenerv1.UpdateLinkRequest{
		Link:       &shortenerv1.Link{Code: moved, LongUrl: newURL},
		UpdateMask: &fieldmaskpb.FieldMask{Paths: []string{"long_url"}},
	}); err != nil {
		t.Fatalf("UpdateLink while Redis refuses writes: %v, want success (the change is committed)", err)
	}
	shMetrics := "http://" + shHTTP
	if got := metricAt(t, shMetrics, pendingMetric); got != 2 {
		t.Errorf("%s while Redis refuses writes: got %v, want 2", pendingMetric, got)
	}
	if got := metricAt(t, shMetrics, ageMetric); got <= 0 {
		t.Errorf("%s while Redis refuses writes: got %v, want > 0", ageMetric, got)
	}
	maxmemory("0")

	const within = 30 * time.Second
	deadline := time.Now().Add(within)
	for _, addr := range replicas {
		for _, want := range []struct {
			code     string
			status   int
			location string
		}{{revoked, http.StatusGone, ""}, {moved, http.StatusFound, newURL}} {
			for {
				status, source, location := visit(addr, want.code)
				if status == want.status && location == want.location {
					break
				}
				if time.Now().After(deadline) {
					t.Fatalf("replica %s, %s %v after Redis took writes again: %d %q from %q, want %d %q (the old state still serves)",
						addr, want.code, within, status, location, source, want.status, want.location)
				}
				time.Sleep(50 * time.Millisecond)
			}
		}
	}
	await(t, pendingMetric+" back to 0", within, func() bool {
		return metricAt(t, shMetrics, pendingMetric) == 0 && metricAt(t, shMetrics, ageMetric) == 0
	})
}
