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

	shortenerv1 "kurz.dev/gen/kurz/shortener/v1"
	"kurz.dev/pkg/fakelimiter"
	"kurz.dev/pkg/redistest"
	"kurz.dev/pkg/server/servertest"
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

// TestRevokeWhoseWriteThroughFailedReachesEveryRedirect: a link is revoked
// while Redis refuses the shortener's write, and still stops redirecting on
// every replica once Redis takes writes again. A shortener and two redirect
// replicas run as processes (built from this workspace) on a private Redis
// and a private database. Both replicas have the link in L1 (second GET:
// X-Source l1); Redis refuses writes (maxmemory below its use: every SET
// fails with OOM, reads still work), DeleteLink succeeds (the revocation is
// committed) and its invalidation is pending (gauge 1); Redis takes writes
// again, and within 30 s both replicas answer 410, and nothing is pending.
//
// A frozen Redis (SIGSTOP) would not do: the SET the shortener gave up on
// waits in the socket and is applied when Redis thaws, whereas the write of
// a failover is lost for good. A refused write is lost for good too.
func TestRevokeWhoseWriteThroughFailedReachesEveryRedirect(t *testing.T) {
	const pendingMetric = "kurz_shortener_invalidations_pending"
	node := redistest.Start(t)
	dbURL := privateDatabase(t)
	bin := t.TempDir()
	if err := servertest.BuildServices(bin, "shortener", "redirect"); err != nil {
		t.Fatal(err)
	}
	lim := fakelimiter.Start(t, fakelimiter.AllowAll)
	stores := []string{"KURZ_REDIS_ADDRS=" + node.Addr, "KURZ_POSTGRES_URL=" + dbURL, "KURZ_LIMITER_GRPC_ADDR=" + lim.Addr()}

	shHTTP, err := servertest.FreeAddr()
	if err != nil {
		t.Fatal(err)
	}
	// First and alone: it applies the schema the redirects read.
	sh := servertest.Run(t, bin, servertest.Spec{Name: "shortener", Service: "kurz.shortener.v1.ShortenerService",
		HTTPAddr: shHTTP, Env: func(g, h string) []string {
			return append([]string{"KURZ_SHORTENER_GRPC_ADDR=" + g, "KURZ_SHORTENER_HTTP_ADDR=" + h,
				"KURZ_SHORTENER_INVALIDATION_RETRY=200ms"}, stores...)
		}})
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("shortener output:\n%s", sh.Output())
		}
	})
	redirectSpec := func(httpAddr string) servertest.Spec {
		return servertest.Spec{Name: "redirect", HTTPAddr: httpAddr, Env: func(g, h string) []string {
			return append([]string{"KURZ_REDIRECT_GRPC_ADDR=" + g, "KURZ_REDIRECT_HTTP_ADDR=" + h}, stores...)
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

	conn, err := grpc.NewClient(sh.GRPCAddr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	api := shortenerv1.NewShortenerServiceClient(conn)
	ctx := as(uniq("revoke-"), "")
	made, err := api.CreateLink(ctx, &shortenerv1.CreateLinkRequest{LongUrl: "https://example.com/taken-down"})
	if err != nil {
		t.Fatal(err)
	}
	code := made.GetLink().GetCode()

	noFollow := &http.Client{Timeout: 5 * time.Second, CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
	visit := func(addr string) (status int, source string) {
		t.Helper()
		resp, err := noFollow.Get("http://" + addr + "/" + code)
		if err != nil {
			t.Fatalf("GET %s/%s: %v", addr, code, err)
		}
		resp.Body.Close()
		return resp.StatusCode, resp.Header.Get("X-Source")
	}
	for _, addr := range replicas {
		visit(addr) // from Redis (the create's write-through), into L1
		if status, source := visit(addr); status != http.StatusFound || source != "l1" {
			t.Fatalf("replica %s before the revoke: %d from %q, want 302 from l1", addr, status, source)
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
	if _, err := api.DeleteLink(ctx, &shortenerv1.DeleteLinkRequest{Code: code}); err != nil {
		t.Fatalf("DeleteLink while Redis refuses writes: %v, want success (the revocation is committed)", err)
	}
	if got := metricAt(t, "http://"+shHTTP, pendingMetric); got != 1 {
		t.Errorf("%s while Redis refuses writes: got %v, want 1", pendingMetric, got)
	}
	maxmemory("0")

	const within = 30 * time.Second
	deadline := time.Now().Add(within)
	for _, addr := range replicas {
		for {
			status, source := visit(addr)
			if status == http.StatusGone {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("replica %s %v after Redis took writes again: %d from %q, want 410 (the revoked link still serves)",
					addr, within, status, source)
			}
			time.Sleep(50 * time.Millisecond)
		}
	}
	await(t, pendingMetric+" back to 0", within, func() bool {
		return metricAt(t, "http://"+shHTTP, pendingMetric) == 0
	})
}
