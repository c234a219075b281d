//go:build integration

package redirector

import (
	"context"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"go.opentelemetry.io/otel/metric/noop"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"kurz.dev/pkg/linkcache"
	"kurz.dev/pkg/linkpass"
	"kurz.dev/pkg/quota"
	"kurz.dev/pkg/testkit/limitertest"
	"kurz.dev/pkg/testkit/metrictest"
	"kurz.dev/pkg/testkit/redistest"
	"kurz.dev/services/redirect/internal/resolve"
)

// While every Argon2 slot stays busy, a password attempt waits a bounded
// time, not as long as its request lasts: it is answered 503 with
// Retry-After and a form saying its password was not checked, and counted
// as outcome "busy". Once the slot is free the same password gets in.
func TestPasswordAttemptRefusedWhileEveryArgonSlotIsBusy(t *testing.T) {
	const code, password, target = "secret1", "busy right now", "https://example.com/behind-busy"
	hash, err := linkpass.Hash(password)
	if err != nil {
		t.Fatal(err)
	}
	node := redistest.Start(t)
	rdb := redis.NewClient(&redis.Options{Addr: node.Addr})
	t.Cleanup(func() { _ = rdb.Close() })
	ctx := context.Background()
	if err := linkcache.WriteThrough(ctx, rdb, code, linkcache.Entry{State: linkcache.Active, URL: target, Tenant: "t", PasswordHash: hash}, time.Hour); err != nil {
		t.Fatal(err)
	}
	lim := limitertest.Start(t, limitertest.AllowAll)
	conn, err := grpc.NewClient(lim.Addr(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = conn.Close() })
	log := slog.New(slog.DiscardHandler)
	passwords, err := quota.New(conn, 5*time.Second, log, noop.NewMeterProvider())
	if err != nil {
		t.Fatal(err)
	}
	reader, meter := metrictest.New()
	res, err := resolve.New(resolve.Config{L1TTL: time.Hour, L1Size: 1000, RedisTimeout: time.Second, DBTimeout: time.Second}, rdb, nil, log, meter)
	if err != nil {
		t.Fatal(err)
	}
	cfg := benchConfig()
	cfg.PasswordChecks = 1
	h, err := New(cfg, Deps{Resolver: res, PasswordQuota: passwords, Clicks: discardClicks{}, Visits: rdb, Log: log}, meter)
	if err != nil {
		t.Fatal(err)
	}
	mux := http.NewServeMux()
	h.Register(mux)
	post := func(ctx context.Context) *httptest.ResponseRecorder {
		nonce, token := h.tokens.issue(code, time.Now())
		body := url.Values{formField: {token}, "password": {password}}.Encode()
		req := httptest.NewRequestWithContext(ctx, http.MethodPost, "/"+code, strings.NewReader(body))
		req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
		req.AddCookie(&http.Cookie{Name: formCookie, Value: nonce})
		req.Host = "kurz.test"
		req.RemoteAddr = "198.51.100.1:1234"
		w := httptest.NewRecorder()
		mux.ServeHTTP(w, req)
		return w
	}

	// The one slot is another attempt's, for the whole request below.
	release, err := h.argon.Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	// A request that may last far longer than the bounded wait: it must
	// not take all of it.
	long, cancel := context.WithTimeout(ctx, 20*time.Second)
	defer cancel()
	w := post(long)
	body := w.Body.String()
	if w.Code != http.StatusServiceUnavailable || w.Header().Get("Retry-After") != "1" || w.Header().Get("Location") != "" ||
		w.Header().Get("Cache-Control") != "no-store" || !strings.Contains(body, msgBusy) || !strings.Contains(body, `<form method="post"`) {
		t.Errorf("attempt with every slot busy: %d, Retry-After %q, Location %q, Cache-Control %q; want 503, Retry-After 1, no Location, no-store and the form saying %q:\n%s",
			w.Code, w.Header().Get("Retry-After"), w.Header().Get("Location"), w.Header().Get("Cache-Control"), msgBusy, body)
	}
	if long.Err() != nil {
		t.Errorf("the attempt waited for a slot as long as its request lasted")
	}
	release()
	if w := post(ctx); w.Code != http.StatusSeeOther || w.Header().Get("Location") != target {
		t.Errorf("the same password with the slot free: %d to %q, want 303 to %s", w.Code, w.Header().Get("Location"), target)
	}
	const name = "kurz.redirect.password_attempts"
	busy, ok, all := metrictest.Counter(t, reader, name, "outcome", "busy"), metrictest.Counter(t, reader, name, "outcome", "ok"), metrictest.Counter(t, reader, name)
	if busy != 1 || ok != 1 || all != 2 {
		t.Errorf("password attempts: busy %d, ok %d, all %d; want 1, 1, 2", busy, ok, all)
	}
}
