//go:build integration

package app

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/redis/go-redis/v9"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/protobuf/types/known/fieldmaskpb"

	shortenerv1 "kurz.dev/gen/kurz/shortener/v1"
	"kurz.dev/pkg/clickevent"
	"kurz.dev/pkg/testkit/limitertest"
	"kurz.dev/pkg/testkit/servertest"
	"kurz.dev/pkg/webhooksig"
	"kurz.dev/services/shortener/internal/webhook"
)

// event is a delivery's body.
type event struct {
	ID     string         `json:"id"`
	Type   string         `json:"type"`
	Time   time.Time      `json:"time"`
	Tenant string         `json:"tenant"`
	Data   map[string]any `json:"data"`
}

// webhookEnv lets the tests' loopback receivers in and keeps retries short.
var webhookEnv = map[string]string{
	"KURZ_SHORTENER_WEBHOOK_SEND":          "true",
	"KURZ_SHORTENER_WEBHOOK_ALLOW_HTTP":    "true",
	"KURZ_SHORTENER_WEBHOOK_ALLOW_CIDRS":   "127.0.0.1/32",
	"KURZ_SHORTENER_WEBHOOK_POLL_INTERVAL": "50ms",
	"KURZ_SHORTENER_WEBHOOK_BACKOFF_BASE":  "100ms",
	"KURZ_SHORTENER_WEBHOOK_BACKOFF_MAX":   "200ms",
	"KURZ_SHORTENER_WEBHOOK_TIMEOUT":       "2s",
	"KURZ_SHORTENER_WEBHOOK_MAX_ATTEMPTS":  "3",
}

// received is one request a receiver got, its signature checked.
type received struct {
	event   event
	header  http.Header
	sigErr  error
	rawBody []byte
}

// receiver is a loopback webhook receiver that answers what answer says.
type receiver struct {
	*httptest.Server
	mu     sync.Mutex
	secret string
	got    []received
	answer func(r *http.Request) int
}

func newReceiver(t *testing.T) *receiver {
	rc := &receiver{answer: func(*http.Request) int { return http.StatusNoContent }}
	rc.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(io.LimitReader(r.Body, 1<<20))
		rc.mu.Lock()
		secret := rc.secret
		rc.mu.Unlock()
		var ev event
		_ = json.Unmarshal(b, &ev)
		got := received{event: ev, header: r.Header.Clone(), rawBody: b,
			sigErr: webhooksig.Verify(secret, r.Header.Get(webhooksig.Header), b, time.Now(), 0)}
		code := rc.answer(r)
		rc.mu.Lock()
		rc.got = append(rc.got, got)
		rc.mu.Unlock()
		w.WriteHeader(code)
		_, _ = io.WriteString(w, "receiver says "+http.StatusText(code))
	}))
	t.Cleanup(rc.Close)
	return rc
}

func (rc *receiver) all() []received {
	rc.mu.Lock()
	defer rc.mu.Unlock()
	return append([]received(nil), rc.got...)
}

// ids returns how often each event id arrived with a 2xx-worthy request.
func (rc *receiver) ids() map[string]int {
	n := map[string]int{}
	for _, g := range rc.all() {
		n[g.event.ID]++
	}
	return n
}

func subscribe(t *testing.T, ctx context.Context, api shortenerv1.WebhookServiceClient, rc *receiver, events ...string) *shortenerv1.Webhook {
	t.Helper()
	resp, err := api.CreateWebhook(ctx, &shortenerv1.CreateWebhookRequest{Url: rc.URL + "/hooks", Events: events})
	if err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(resp.GetSecret(), "whsec_") {
		t.Fatalf("secret %q", resp.GetSecret())
	}
	rc.mu.Lock()
	rc.secret = resp.GetSecret()
	rc.mu.Unlock()
	return resp.GetWebhook()
}

func deliveries(t *testing.T, ctx context.Context, api shortenerv1.WebhookServiceClient, id string) []*shortenerv1.WebhookDelivery {
	t.Helper()
	resp, err := api.ListWebhookDeliveries(ctx, &shortenerv1.ListWebhookDeliveriesRequest{WebhookId: id})
	if err != nil {
		t.Fatal(err)
	}
	return resp.GetDeliveries()
}

// webhookSetup starts a shortener with webhookEnv, a fresh tenant (calling
// as it: ctx) and a receiver; the tenant's rows go when the test ends.
func webhookSetup(t *testing.T) (instance, string, context.Context, shortenerv1.WebhookServiceClient, *receiver) {
	sh := start(t, webhookEnv, hooks{})
	tenant := uniq("wh")
	stores(t, sh.cfg, tenant)
	dropWebhooks(t, sh, tenant)
	return sh, tenant, as(tenant, ""), shortenerv1.NewWebhookServiceClient(sh.Conn), newReceiver(t)
}

func TestWebhookDeliversSignedLinkEvents(t *testing.T) {
	sh, tenant, ctx, api, rc := webhookSetup(t)
	wh := subscribe(t, ctx, api, rc)

	link, err := sh.api.CreateLink(ctx, &shortenerv1.CreateLinkRequest{LongUrl: "https://example.com/hooked", Tags: []string{"a"}})
	if err != nil {
		t.Fatal(err)
	}
	code := link.GetLink().GetCode()
	if _, err := sh.api.UpdateLink(ctx, &shortenerv1.UpdateLinkRequest{
		Link:       &shortenerv1.Link{Code: code, LongUrl: "https://example.com/moved"},
		UpdateMask: &fieldmaskpb.FieldMask{Paths: []string{"long_url"}},
	}); err != nil {
		t.Fatal(err)
	}
	if _, err := sh.api.DeleteLink(ctx, &shortenerv1.DeleteLinkRequest{Code: code}); err != nil {
		t.Fatal(err)
	}

	await(t, "three deliveries", 10*time.Second, func() bool { return len(rc.all()) >= 3 })
	byType := map[string]received{}
	for _, g := range rc.all() {
		if g.sigErr != nil {
			t.Errorf("delivery %s: signature: %v", g.event.ID, g.sigErr)
		}
		if g.header.Get("Kurz-Event-Id") != g.event.ID || g.header.Get("Kurz-Event-Type") != g.event.Type {
			t.Errorf("headers %v do not match the body's id %q and type %q", g.header, g.event.ID, g.event.Type)
		}
		if got := g.header.Get("Kurz-Webhook-Id"); got != wh.GetId() {
			t.Errorf("Kurz-Webhook-Id %q, want the subscription's %q", got, wh.GetId())
		}
		if g.event.Tenant != tenant {
			t.Errorf("tenant %q, want %q", g.event.Tenant, tenant)
		}
		byType[g.event.Type] = g
	}
	for typ, wantURL := range map[string]string{"link.created": "https://example.com/hooked",
		"link.updated": "https://example.com/moved", "link.deleted": "https://example.com/moved"} {
		g, ok := byType[typ]
		if !ok {
			t.Errorf("no %s event among %d", typ, len(rc.all()))
			continue
		}
		raw := g.event
		if raw.Data["code"] != code || raw.Data["long_url"] != wantURL || raw.Data["short_url"] != link.GetLink().GetShortUrl() {
			t.Errorf("%s data %v, want code %s, long_url %s, short_url %s", typ, raw.Data, code, wantURL, link.GetLink().GetShortUrl())
		}
		if _, leaked := raw.Data["password_hash"]; leaked {
			t.Errorf("%s data carries the password hash", typ)
		}
	}
	ds := deliveries(t, ctx, api, wh.GetId())
	if len(ds) != 3 {
		t.Fatalf("%d deliveries listed, want 3", len(ds))
	}
	await(t, "all succeeded", 5*time.Second, func() bool {
		for _, d := range deliveries(t, ctx, api, wh.GetId()) {
			if d.GetStatus() != shortenerv1.WebhookDeliveryStatus_WEBHOOK_DELIVERY_STATUS_SUCCEEDED || d.GetAttempts() != 1 || d.GetLastStatusCode() != 204 {
				return false
			}
		}
		return true
	})
}

// A link on a custom domain is keyed "<domain>/<code>" in PostgreSQL; its
// events show it as the API does: the bare code, the domain, and the short
// URL on that domain.
func TestWebhookEventsOfACustomDomainLink(t *testing.T) {
	sh, tenant, ctx, api, rc := webhookSetup(t)
	db, _ := stores(t, sh.cfg, tenant)
	t.Cleanup(func() { _, _ = db.Exec(context.Background(), `DELETE FROM domains WHERE tenant = $1`, tenant) })
	subscribe(t, ctx, api, rc, "link.created")
	domain := testDomain()
	if _, err := sh.api.RegisterDomain(ctx, &shortenerv1.RegisterDomainRequest{Name: domain}); err != nil {
		t.Fatal(err)
	}
	if _, err := sh.api.ApproveDomain(ctx, &shortenerv1.ApproveDomainRequest{Name: domain}); err != nil {
		t.Fatal(err)
	}
	link, err := sh.api.CreateLink(ctx, &shortenerv1.CreateLinkRequest{LongUrl: "https://example.com/on-a-domain", Domain: domain})
	if err != nil {
		t.Fatal(err)
	}
	l := link.GetLink()
	await(t, "the link.created delivery", 10*time.Second, func() bool { return len(rc.all()) >= 1 })
	d := rc.all()[0].event.Data
	if d["code"] != l.GetCode() || d["domain"] != domain || d["short_url"] != l.GetShortUrl() || l.GetShortUrl() != "https://"+domain+"/"+l.GetCode() {
		t.Errorf("data code %v, domain %v, short_url %v; want %s, %s, %s", d["code"], d["domain"], d["short_url"], l.GetCode(), domain, l.GetShortUrl())
	}
}

func TestWebhookRetriesThenDeadLettersThenRedelivers(t *testing.T) {
	sh, _, ctx, api, rc := webhookSetup(t)
	var mu sync.Mutex
	failing := true
	rc.answer = func(*http.Request) int {
		mu.Lock()
		defer mu.Unlock()
		if failing {
			return http.StatusInternalServerError
		}
		return http.StatusOK
	}
	wh := subscribe(t, ctx, api, rc, "link.created")
	if _, err := sh.api.CreateLink(ctx, &shortenerv1.CreateLinkRequest{LongUrl: "https://example.com/dead"}); err != nil {
		t.Fatal(err)
	}
	var dead *shortenerv1.WebhookDelivery
	ok, state := servertest.EventuallyState(15*time.Second, func() (bool, string) {
		ds := deliveries(t, ctx, api, wh.GetId())
		if len(ds) != 1 {
			return false, "no delivery"
		}
		dead = ds[0]
		return dead.GetStatus() == shortenerv1.WebhookDeliveryStatus_WEBHOOK_DELIVERY_STATUS_DEAD, dead.String()
	})
	if !ok {
		t.Fatalf("not dead: %s", state)
	}
	if dead.GetAttempts() != 3 || dead.GetLastStatusCode() != 500 || !strings.HasPrefix(dead.GetLastError(), "HTTP 500: receiver says") {
		t.Errorf("dead delivery %v: want 3 attempts, last status 500 and the answer's start in last_error", dead)
	}
	// The attempts are counted before the outcome is stored.
	if got := metricValue(t, sh.Running, "kurz_shortener_webhook_attempts_total"); got != 3 {
		t.Errorf("kurz_shortener_webhook_attempts_total = %v, want 3", got)
	}
	body := metricsBody(t, sh)
	for _, outcome := range []string{"retry", "dead"} {
		if !servertest.HasSeries(body, "kurz_shortener_webhook_attempts_total", `outcome="`+outcome+`"`) {
			t.Errorf("no kurz_shortener_webhook_attempts_total{outcome=%q}", outcome)
		}
	}
	for _, name := range []string{"kurz_shortener_webhook_queue_pending", "kurz_shortener_webhook_queue_oldest_age_seconds", "kurz_shortener_webhook_queue_lag_seconds"} {
		if !servertest.HasSeries(body, name) {
			t.Errorf("/metrics has no %s", name)
		}
	}
	if n := rc.ids()[dead.GetId()]; n != 3 {
		t.Errorf("the receiver got the event %d times, want 3 (one per attempt)", n)
	}

	mu.Lock()
	failing = false
	mu.Unlock()
	again, err := api.RedeliverWebhookDelivery(ctx, &shortenerv1.RedeliverWebhookDeliveryRequest{WebhookId: wh.GetId(), Id: dead.GetId()})
	if err != nil {
		t.Fatal(err)
	}
	if again.GetDelivery().GetStatus() != shortenerv1.WebhookDeliveryStatus_WEBHOOK_DELIVERY_STATUS_PENDING {
		t.Errorf("redelivered: %v, want pending", again.GetDelivery())
	}
	await(t, "the redelivery succeeds", 10*time.Second, func() bool {
		ds := deliveries(t, ctx, api, wh.GetId())
		return len(ds) == 1 && ds[0].GetStatus() == shortenerv1.WebhookDeliveryStatus_WEBHOOK_DELIVERY_STATUS_SUCCEEDED
	})
	if n := rc.ids()[dead.GetId()]; n != 4 {
		t.Errorf("the receiver got the event %d times, want 4 (the same id again)", n)
	}
	_, err = api.RedeliverWebhookDelivery(ctx, &shortenerv1.RedeliverWebhookDeliveryRequest{WebhookId: wh.GetId(), Id: "evt_nope"})
	wantStatus(t, err, codes.NotFound)
}

// TestWebhookDeliveriesSurviveASenderRestart stops the shortener while a
// delivery is in flight and the rest are queued; a new one (the same
// database) delivers every event at least once.
func TestWebhookDeliveriesSurviveASenderRestart(t *testing.T) {
	env := withWebhookEnv(map[string]string{"KURZ_SHORTENER_WEBHOOK_TIMEOUT": "1s", "KURZ_SHORTENER_WEBHOOK_CONCURRENCY": "1"})
	first := start(t, env, hooks{})
	tenant := uniq("wh")
	stores(t, first.cfg, tenant)
	dropWebhooks(t, first, tenant)
	ctx := as(tenant, "")
	rc, inFlight, release := hangingReceiver(t)
	wh := subscribe(t, ctx, shortenerv1.NewWebhookServiceClient(first.Conn), rc, "link.created")
	const links = 5
	for i := range links {
		if _, err := first.api.CreateLink(ctx, &shortenerv1.CreateLinkRequest{LongUrl: "https://example.com/restart/" + string(rune('a'+i))}); err != nil {
			t.Fatal(err)
		}
	}
	awaitInFlight(t, inFlight)
	if err := first.Stop(); err != nil {
		t.Fatalf("stop: %v", err)
	}
	close(release)

	second := start(t, env, hooks{})
	awaitEveryEvent(t, ctx, shortenerv1.NewWebhookServiceClient(second.Conn), wh.GetId(), links, rc)
}

func TestWebhooksAreTenantScopedAndBounded(t *testing.T) {
	env := withWebhookEnv(map[string]string{"KURZ_SHORTENER_WEBHOOK_MAX_SUBSCRIPTIONS": "2"})
	sh := start(t, env, hooks{})
	a, b := uniq("wha"), uniq("whb")
	stores(t, sh.cfg, a, b)
	dropWebhooks(t, sh, a, b)
	api := shortenerv1.NewWebhookServiceClient(sh.Conn)
	rc := newReceiver(t)
	wh := subscribe(t, as(a, ""), api, rc)

	list, err := api.ListWebhooks(as(b, ""), &shortenerv1.ListWebhooksRequest{})
	if err != nil || len(list.GetWebhooks()) != 0 {
		t.Fatalf("tenant b lists %v (%v), want none", list.GetWebhooks(), err)
	}
	_, err = api.ListWebhookDeliveries(as(b, ""), &shortenerv1.ListWebhookDeliveriesRequest{WebhookId: wh.GetId()})
	wantStatus(t, err, codes.NotFound)
	_, err = api.DeleteWebhook(as(b, ""), &shortenerv1.DeleteWebhookRequest{Id: wh.GetId()})
	wantStatus(t, err, codes.NotFound)

	// b's link makes no delivery for a's subscription.
	if _, err := sh.api.CreateLink(as(b, ""), &shortenerv1.CreateLinkRequest{LongUrl: "https://example.com/b"}); err != nil {
		t.Fatal(err)
	}
	if ds := deliveries(t, as(a, ""), api, wh.GetId()); len(ds) != 0 {
		t.Errorf("a's subscription has %d deliveries of b's link", len(ds))
	}

	if _, err := api.CreateWebhook(as(a, ""), &shortenerv1.CreateWebhookRequest{Url: rc.URL + "/2"}); err != nil {
		t.Fatal(err)
	}
	_, err = api.CreateWebhook(as(a, ""), &shortenerv1.CreateWebhookRequest{Url: rc.URL + "/3"})
	if reason, _ := wantStatus(t, err, codes.FailedPrecondition); reason != "WEBHOOK_LIMIT_REACHED" {
		t.Errorf("reason %q", reason)
	}
	for _, bad := range []struct{ url, event string }{
		{"https://10.1.2.3/x", ""}, {"ftp://example.com/", ""}, {"https://user:pw@example.com/", ""},
		{"https://example.com/", "link.exploded"},
	} {
		req := &shortenerv1.CreateWebhookRequest{Url: bad.url}
		if bad.event != "" {
			req.Events = []string{bad.event}
		}
		_, err := api.CreateWebhook(as(b, ""), req)
		wantStatus(t, err, codes.InvalidArgument)
	}

	if _, err := api.DeleteWebhook(as(a, ""), &shortenerv1.DeleteWebhookRequest{Id: wh.GetId()}); err != nil {
		t.Fatal(err)
	}
	list, err = api.ListWebhooks(as(a, ""), &shortenerv1.ListWebhooksRequest{})
	if err != nil || len(list.GetWebhooks()) != 1 {
		t.Fatalf("after delete a lists %v (%v), want one", list.GetWebhooks(), err)
	}
}

// dropWebhooks deletes the tenants' subscriptions (and so their
// deliveries) when the test ends.
func dropWebhooks(t *testing.T, sh instance, tenants ...string) {
	t.Helper()
	db, _ := stores(t, sh.cfg)
	t.Cleanup(func() {
		_, _ = db.Exec(context.Background(), `DELETE FROM webhook_subscriptions WHERE tenant = ANY($1)`, tenants)
	})
}

// metricsBody returns the shortener's /metrics.
func metricsBody(t *testing.T, sh instance) string {
	t.Helper()
	resp, err := http.Get(sh.HTTP + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// TestWebhookClicksAreBatchedPerLink writes click events into a stream
// layout of the test's own (11 shards, which nothing else uses) and gets
// one link.clicked delivery per link and interval carrying their number.
func TestWebhookClicksAreBatchedPerLink(t *testing.T) {
	group := uniq("wh-clicks-")
	env := withWebhookEnv(map[string]string{"KURZ_CLICK_STREAM_SHARDS": "11", "KURZ_SHORTENER_WEBHOOK_CLICK_INTERVAL": "1s",
		"KURZ_SHORTENER_WEBHOOK_CLICK_GROUP": group})
	// The subscription exists before the batcher that counts starts, so
	// its first look at the subscribers sees it.
	first := start(t, env, hooks{})
	tenant := uniq("wh")
	_, rdb := stores(t, first.cfg, tenant)
	dropWebhooks(t, first, tenant)
	keys := clickevent.StreamKeys(11)
	t.Cleanup(func() {
		for _, k := range keys {
			rdb.XGroupDestroy(context.Background(), k, group)
		}
	})
	ctx := as(tenant, "")
	rc := newReceiver(t)
	wh := subscribe(t, ctx, shortenerv1.NewWebhookServiceClient(first.Conn), rc, "link.clicked")
	if err := first.Stop(); err != nil {
		t.Fatal(err)
	}
	sh := start(t, env, hooks{})
	api := shortenerv1.NewWebhookServiceClient(sh.Conn)
	link, err := sh.api.CreateLink(ctx, &shortenerv1.CreateLinkRequest{LongUrl: "https://example.com/clicked"})
	if err != nil {
		t.Fatal(err)
	}
	code := link.GetLink().GetCode()
	now := time.Now()
	for i, c := range []struct{ key, tenant, code string }{
		{keys[0], tenant, code}, {keys[5], tenant, code}, {keys[0], tenant, code}, {keys[3], "someone-else", code},
	} {
		ev := clickevent.Event{ID: clickevent.NewID(now), Code: c.code, Tenant: c.tenant, Time: now.Add(time.Duration(i) * time.Second)}
		if err := rdb.XAdd(context.Background(), &redis.XAddArgs{Stream: c.key, Values: ev.Values()}).Err(); err != nil {
			t.Fatal(err)
		}
	}
	ok, state := servertest.EventuallyState(15*time.Second, func() (bool, string) {
		clicks, seen := 0, ""
		for _, g := range rc.all() {
			if g.event.Type != "link.clicked" || g.sigErr != nil {
				seen += fmt.Sprintf(" %s(sig %v)", g.event.Type, g.sigErr)
				continue
			}
			if g.event.Data["code"] != code || g.event.Data["short_url"] != link.GetLink().GetShortUrl() {
				seen += fmt.Sprintf(" data %v", g.event.Data)
				continue
			}
			n, _ := g.event.Data["clicks"].(float64)
			clicks += int(n)
		}
		return clicks == 3, fmt.Sprintf("%d clicks;%s", clicks, seen)
	})
	if !ok {
		t.Fatalf("link.clicked deliveries: %s, want 3 clicks of %s", state, code)
	}
	for _, d := range deliveries(t, ctx, api, wh.GetId()) {
		if d.GetEventType() != "link.clicked" {
			t.Errorf("delivery of %s to a link.clicked-only subscription", d.GetEventType())
		}
	}
	// Every entry is acknowledged, the other tenant's included.
	if !servertest.Eventually(10*time.Second, func() bool {
		for _, k := range keys {
			p, err := rdb.XPending(context.Background(), k, group).Result()
			if err != nil || p.Count != 0 {
				return false
			}
		}
		return true
	}) {
		t.Error("click entries stay pending in the webhook group")
	}
}

// TestWebhookClicksOfADeadReplicaAreDelivered: clicks a replica read and
// never flushed (it died) reach their subscriber after three intervals,
// though no other click ever comes to wake the batcher.
func TestWebhookClicksOfADeadReplicaAreDelivered(t *testing.T) {
	group := uniq("wh-dead-")
	env := withWebhookEnv(map[string]string{"KURZ_CLICK_STREAM_SHARDS": "13", "KURZ_SHORTENER_WEBHOOK_CLICK_INTERVAL": "1s",
		"KURZ_SHORTENER_WEBHOOK_CLICK_GROUP": group})
	first := start(t, env, hooks{})
	tenant := uniq("wh")
	_, rdb := stores(t, first.cfg, tenant)
	dropWebhooks(t, first, tenant)
	keys := clickevent.StreamKeys(13)
	t.Cleanup(func() {
		for _, k := range keys {
			rdb.XGroupDestroy(context.Background(), k, group)
		}
	})
	ctx := as(tenant, "")
	rc := newReceiver(t)
	subscribe(t, ctx, shortenerv1.NewWebhookServiceClient(first.Conn), rc, "link.clicked")
	link, err := first.api.CreateLink(ctx, &shortenerv1.CreateLinkRequest{LongUrl: "https://example.com/dead-replica"})
	if err != nil {
		t.Fatal(err)
	}
	if err := first.Stop(); err != nil {
		t.Fatal(err)
	}
	// A replica reads two clicks, then dies before its flush.
	now := time.Now()
	for i := range 2 {
		ev := clickevent.Event{ID: clickevent.NewID(now), Code: link.GetLink().GetCode(), Tenant: tenant, Time: now.Add(time.Duration(i) * time.Second)}
		if err := rdb.XAdd(context.Background(), &redis.XAddArgs{Stream: keys[2], Values: ev.Values()}).Err(); err != nil {
			t.Fatal(err)
		}
	}
	got, err := rdb.XReadGroup(context.Background(), &redis.XReadGroupArgs{Group: group, Consumer: "dead-replica",
		Streams: []string{keys[2], ">"}, Count: 10, Block: -1}).Result()
	if err != nil || len(got) != 1 || len(got[0].Messages) != 2 {
		t.Fatalf("the dead replica's read: %v, %v", got, err)
	}
	start(t, env, hooks{})
	ok, state := servertest.EventuallyState(20*time.Second, func() (bool, string) {
		clicks := 0
		for _, g := range rc.all() {
			if g.event.Type == "link.clicked" && g.sigErr == nil {
				n, _ := g.event.Data["clicks"].(float64)
				clicks += int(n)
			}
		}
		return clicks == 2, fmt.Sprintf("%d clicks delivered", clicks)
	})
	if !ok {
		t.Fatalf("the dead replica's clicks: %s, want 2", state)
	}
}

// TestWebhookReplicasShareTheQueue runs two shorteners on one database:
// their senders claim with SKIP LOCKED, so each of 20 events reaches the
// receiver exactly once (no failure, so no retry may repeat one).
func TestWebhookReplicasShareTheQueue(t *testing.T) {
	env := withWebhookEnv(map[string]string{"KURZ_SHORTENER_WEBHOOK_CONCURRENCY": "1"})
	a, b := start(t, env, hooks{}), start(t, env, hooks{})
	tenant := uniq("wh")
	stores(t, a.cfg, tenant)
	dropWebhooks(t, a, tenant)
	ctx := as(tenant, "")
	rc := newReceiver(t)
	wh := subscribe(t, ctx, shortenerv1.NewWebhookServiceClient(a.Conn), rc, "link.created")
	const links = 20
	for i := range links {
		sh := []instance{a, b}[i%2]
		if _, err := sh.api.CreateLink(ctx, &shortenerv1.CreateLinkRequest{LongUrl: fmt.Sprintf("https://example.com/shared/%d", i)}); err != nil {
			t.Fatal(err)
		}
	}
	ok, state := servertest.EventuallyState(20*time.Second, func() (bool, string) {
		n := len(rc.ids())
		return n == links, fmt.Sprintf("%d distinct ids", n)
	})
	if !ok {
		t.Fatalf("the receiver got %s, want %d", state, links)
	}
	for id, n := range rc.ids() {
		if n != 1 {
			t.Errorf("event %s arrived %d times, want once", id, n)
		}
	}
	if ds := deliveries(t, ctx, shortenerv1.NewWebhookServiceClient(b.Conn), wh.GetId()); len(ds) != links {
		t.Errorf("%d deliveries listed, want %d", len(ds), links)
	}
}

// TestWebhookRetentionPrunesFinishedDeliveriesOnly: finished deliveries
// whose last attempt is older than the cut go; recent and pending ones
// stay.
func TestWebhookRetentionPrunesFinishedDeliveriesOnly(t *testing.T) {
	sh, _, ctx, api, rc := webhookSetup(t)
	db, _ := stores(t, sh.cfg)
	wh := subscribe(t, ctx, api, rc)
	rows := map[string]struct {
		status string
		age    time.Duration
		gone   bool
	}{
		"old-succeeded": {"succeeded", 48 * time.Hour, true},
		"old-dead":      {"dead", 48 * time.Hour, true},
		"new-dead":      {"dead", time.Minute, false},
		"old-pending":   {"pending", 48 * time.Hour, false},
	}
	prefix := "evt_" + uniq("prune")
	for name, r := range rows {
		if _, err := db.Exec(context.Background(), `
			INSERT INTO webhook_deliveries (id, subscription_id, tenant, event_type, data, status, last_attempt_at, next_attempt_at)
			SELECT $1, id, tenant, 'link.created', '{}', $2, now() - make_interval(secs => $3), now() + interval '1 day'
			FROM webhook_subscriptions WHERE id = $4`,
			prefix+name, r.status, r.age.Seconds(), wh.GetId()); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := webhook.NewStore(db, 5*time.Second).Prune(context.Background(), time.Now().Add(-24*time.Hour)); err != nil {
		t.Fatal(err)
	}
	for name, r := range rows {
		var exists bool
		if err := db.QueryRow(context.Background(), `SELECT EXISTS (SELECT 1 FROM webhook_deliveries WHERE id = $1)`, prefix+name).Scan(&exists); err != nil {
			t.Fatal(err)
		}
		if exists == r.gone {
			t.Errorf("%s: exists %v after the prune, want gone %v", name, exists, r.gone)
		}
	}
}

// lockedBuffer is a log sink several goroutines write.
type lockedBuffer struct {
	mu sync.Mutex
	b  strings.Builder
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// TestWebhookSecretsStayOutOfLogsAndStorage: at debug level, the
// shortener's log of a subscription's life (create, a failed and a
// dead delivery, a redelivery, a delete) never holds its secret, and
// PostgreSQL holds it sealed only.
func TestWebhookSecretsStayOutOfLogsAndStorage(t *testing.T) {
	env := map[string]string{"KURZ_LIMITER_GRPC_ADDR": limitertest.Start(t, limitertest.AllowAll).Addr()}
	maps.Copy(env, webhookEnv)
	cfg := load(t, env)
	var logs lockedBuffer
	srv, err := build(context.Background(), cfg, slog.New(slog.NewTextHandler(&logs, &slog.HandlerOptions{Level: slog.LevelDebug})), hooks{})
	if err != nil {
		t.Fatal(err)
	}
	r := servertest.Start(t, srv)
	r.AwaitServing(t, "kurz.shortener.v1.ShortenerService")
	sh := instance{Running: r, api: shortenerv1.NewShortenerServiceClient(r.Conn), cfg: cfg}
	tenant := uniq("wh")
	db, _ := stores(t, cfg, tenant)
	dropWebhooks(t, sh, tenant)
	ctx := as(tenant, "")
	api := shortenerv1.NewWebhookServiceClient(sh.Conn)
	rc := newReceiver(t)
	rc.answer = func(*http.Request) int { return http.StatusBadGateway }
	wh := subscribe(t, ctx, api, rc)
	rc.mu.Lock()
	secret := rc.secret
	rc.mu.Unlock()
	if _, err := sh.api.CreateLink(ctx, &shortenerv1.CreateLinkRequest{LongUrl: "https://example.com/secretive"}); err != nil {
		t.Fatal(err)
	}
	// The shorteners of other test packages on the same database share the
	// queue, so the dead delivery may be another process's to log: it is
	// redelivered until this instance's sender logged one (bounded).
	for round := 0; round < 10 && !strings.Contains(logs.String(), "webhook delivery dead"); round++ {
		var dead *shortenerv1.WebhookDelivery
		await(t, "a dead delivery", 15*time.Second, func() bool {
			ds := deliveries(t, ctx, api, wh.GetId())
			if len(ds) == 1 && ds[0].GetStatus() == shortenerv1.WebhookDeliveryStatus_WEBHOOK_DELIVERY_STATUS_DEAD {
				dead = ds[0]
			}
			return dead != nil
		})
		if !strings.Contains(logs.String(), "webhook delivery dead") {
			if _, err := api.RedeliverWebhookDelivery(ctx, &shortenerv1.RedeliverWebhookDeliveryRequest{WebhookId: wh.GetId(), Id: dead.GetId()}); err != nil {
				t.Fatal(err)
			}
		}
	}
	list, err := api.ListWebhooks(ctx, &shortenerv1.ListWebhooksRequest{})
	if err != nil || strings.Contains(list.String(), secret) {
		t.Errorf("ListWebhooks (%v) shows the secret", err)
	}
	var sealed []byte
	if err := db.QueryRow(context.Background(), `SELECT secret FROM webhook_subscriptions WHERE id = $1`, wh.GetId()).Scan(&sealed); err != nil {
		t.Fatal(err)
	}
	if len(sealed) < 40 || strings.Contains(string(sealed), secret[len("whsec_"):]) {
		t.Errorf("the stored secret (%d bytes) is not sealed", len(sealed))
	}
	if _, err := api.DeleteWebhook(ctx, &shortenerv1.DeleteWebhookRequest{Id: wh.GetId()}); err != nil {
		t.Fatal(err)
	}
	if got := logs.String(); !strings.Contains(got, "webhook delivery dead") || strings.Contains(got, secret) ||
		strings.Contains(got, secret[len("whsec_"):]) {
		t.Errorf("the log lacks the dead delivery or holds the secret:\n%s", got)
	}
}

// TestWebhookDeliveriesSurviveASIGKILL runs the shortener as a process,
// kills it (SIGKILL: no shutdown at all) while a delivery is in flight
// and the rest are queued, and starts another: every event reaches the
// receiver at least once.
func TestWebhookDeliveriesSurviveASIGKILL(t *testing.T) {
	dir := t.TempDir()
	if err := servertest.BuildServicesWithoutRace(dir, "shortener"); err != nil {
		t.Fatal(err)
	}
	env := []string{"KURZ_LIMITER_GRPC_ADDR=" + limitertest.Start(t, limitertest.AllowAll).Addr(), "KURZ_LOG_LEVEL=warn",
		"KURZ_SHORTENER_WEBHOOK_TIMEOUT=1s", "KURZ_SHORTENER_WEBHOOK_CONCURRENCY=1"}
	for k, v := range webhookEnv {
		if k != "KURZ_SHORTENER_WEBHOOK_TIMEOUT" {
			env = append(env, k+"="+v)
		}
	}
	spec := servertest.Spec{Name: "shortener", Service: "kurz.shortener.v1.ShortenerService", Env: func(g, h string) []string {
		return append(env, "KURZ_SHORTENER_GRPC_ADDR="+g, "KURZ_SHORTENER_HTTP_ADDR="+h)
	}}
	first := servertest.Run(t, dir, spec)
	conn, err := grpc.NewClient(first.GRPCAddr, grpc.WithTransportCredentials(insecure.NewCredentials()), servertest.ServiceAuth())
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()

	tenant := uniq("wh")
	cfg := load(t, nil)
	stores(t, cfg, tenant)
	db, _ := stores(t, cfg)
	t.Cleanup(func() {
		_, _ = db.Exec(context.Background(), `DELETE FROM webhook_subscriptions WHERE tenant = $1`, tenant)
	})
	ctx := as(tenant, "")
	rc, inFlight, release := hangingReceiver(t)
	wh := subscribe(t, ctx, shortenerv1.NewWebhookServiceClient(conn), rc, "link.created")
	links := shortenerv1.NewShortenerServiceClient(conn)
	const n = 5
	for i := range n {
		if _, err := links.CreateLink(ctx, &shortenerv1.CreateLinkRequest{LongUrl: fmt.Sprintf("https://example.com/killed/%d", i)}); err != nil {
			t.Fatal(err)
		}
	}
	awaitInFlight(t, inFlight)
	first.Kill()
	close(release)

	second := servertest.Run(t, dir, spec)
	conn2, err := grpc.NewClient(second.GRPCAddr, grpc.WithTransportCredentials(insecure.NewCredentials()), servertest.ServiceAuth())
	if err != nil {
		t.Fatal(err)
	}
	defer conn2.Close()
	awaitEveryEvent(t, ctx, shortenerv1.NewWebhookServiceClient(conn2), wh.GetId(), n, rc)
}

// hangingReceiver is a receiver whose attempts hang until release is
// closed (or the sender gives up); inFlight receives when one hangs.
func hangingReceiver(t *testing.T) (rc *receiver, inFlight <-chan struct{}, release chan struct{}) {
	rc = newReceiver(t)
	release = make(chan struct{})
	hung := make(chan struct{}, 1)
	rc.answer = func(r *http.Request) int {
		select {
		case <-release:
			return http.StatusOK
		default:
		}
		select {
		case hung <- struct{}{}:
		default:
		}
		select {
		case <-release:
		case <-r.Context().Done():
		}
		return http.StatusOK
	}
	return rc, hung, release
}

func awaitInFlight(t *testing.T, inFlight <-chan struct{}) {
	t.Helper()
	select {
	case <-inFlight:
	case <-time.After(10 * time.Second):
		t.Fatal("no delivery attempted")
	}
}

// awaitEveryEvent waits until the subscription's n deliveries succeeded,
// and checks each event reached rc at least once, and no other did.
func awaitEveryEvent(t *testing.T, ctx context.Context, api shortenerv1.WebhookServiceClient, id string, n int, rc *receiver) {
	t.Helper()
	ok, state := servertest.EventuallyState(30*time.Second, func() (bool, string) {
		ds := deliveries(t, ctx, api, id)
		done := 0
		for _, d := range ds {
			if d.GetStatus() == shortenerv1.WebhookDeliveryStatus_WEBHOOK_DELIVERY_STATUS_SUCCEEDED {
				done++
			}
		}
		return len(ds) == n && done == n, fmt.Sprintf("%d of %d succeeded", done, n)
	})
	if !ok {
		t.Fatalf("after the sender's end: %s", state)
	}
	ids := rc.ids()
	for _, d := range deliveries(t, ctx, api, id) {
		if ids[d.GetId()] < 1 {
			t.Errorf("event %s never reached the receiver", d.GetId())
		}
	}
	if len(ids) != n {
		t.Errorf("the receiver saw %d distinct event ids, want %d", len(ids), n)
	}
}

// TestWebhookSlowReceiverDoesNotStarveOthers: tenant a's receiver hangs
// on every delivery and a has a backlog of 8; a delivery of tenant b,
// queued after them, still arrives while a's hang, because a replica
// sends at most KURZ_SHORTENER_WEBHOOK_CONCURRENCY_PER_SUBSCRIPTION of one
// subscription at once.
func TestWebhookSlowReceiverDoesNotStarveOthers(t *testing.T) {
	env := withWebhookEnv(map[string]string{"KURZ_SHORTENER_WEBHOOK_CONCURRENCY": "4", "KURZ_SHORTENER_WEBHOOK_CONCURRENCY_PER_SUBSCRIPTION": "2",
		"KURZ_SHORTENER_WEBHOOK_TIMEOUT": "30s"})
	sh := start(t, env, hooks{})
	a, b := uniq("wha"), uniq("whb")
	stores(t, sh.cfg, a, b)
	dropWebhooks(t, sh, a, b)
	api := shortenerv1.NewWebhookServiceClient(sh.Conn)
	slow, _, release := hangingReceiver(t)
	defer close(release)
	fast := newReceiver(t)
	subscribe(t, as(a, ""), api, slow, "link.created")
	subscribe(t, as(b, ""), api, fast, "link.created")
	for i := range 8 {
		if _, err := sh.api.CreateLink(as(a, ""), &shortenerv1.CreateLinkRequest{LongUrl: fmt.Sprintf("https://example.com/slow/%d", i)}); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := sh.api.CreateLink(as(b, ""), &shortenerv1.CreateLinkRequest{LongUrl: "https://example.com/fast"}); err != nil {
		t.Fatal(err)
	}
	if !servertest.Eventually(10*time.Second, func() bool { return len(fast.all()) == 1 }) {
		t.Fatalf("tenant b's delivery did not arrive while tenant a's receiver hangs (a has %d in flight)", len(slow.all()))
	}
	if n := len(slow.all()); n != 0 {
		t.Errorf("the hanging receiver answered %d requests, want none yet", n)
	}
}

// TestWebhookTenantOfSlowReceiversDoesNotStarveOthers: tenant a has three
// subscriptions whose receivers hang and a backlog on each; their
// per-subscription share (2 each) would fill all 4 slots, so tenant b's
// delivery arrives only because a replica also sends at most
// KURZ_SHORTENER_WEBHOOK_CONCURRENCY_PER_TENANT of one tenant at once.
func TestWebhookTenantOfSlowReceiversDoesNotStarveOthers(t *testing.T) {
	env := withWebhookEnv(map[string]string{"KURZ_SHORTENER_WEBHOOK_CONCURRENCY": "4", "KURZ_SHORTENER_WEBHOOK_CONCURRENCY_PER_SUBSCRIPTION": "2",
		"KURZ_SHORTENER_WEBHOOK_CONCURRENCY_PER_TENANT": "2", "KURZ_SHORTENER_WEBHOOK_TIMEOUT": "30s"})
	sh := start(t, env, hooks{})
	a, b := uniq("wta"), uniq("wtb")
	stores(t, sh.cfg, a, b)
	dropWebhooks(t, sh, a, b)
	api := shortenerv1.NewWebhookServiceClient(sh.Conn)
	var mu sync.Mutex
	hanging, most := 0, 0
	release := make(chan struct{})
	defer close(release)
	for range 3 {
		slow := newReceiver(t)
		slow.answer = func(r *http.Request) int {
			mu.Lock()
			hanging++
			most = max(most, hanging)
			mu.Unlock()
			select {
			case <-release:
			case <-r.Context().Done():
			}
			mu.Lock()
			hanging--
			mu.Unlock()
			return http.StatusOK
		}
		subscribe(t, as(a, ""), api, slow, "link.created")
	}
	fast := newReceiver(t)
	subscribe(t, as(b, ""), api, fast, "link.created")
	for i := range 4 {
		if _, err := sh.api.CreateLink(as(a, ""), &shortenerv1.CreateLinkRequest{LongUrl: fmt.Sprintf("https://example.com/slow/%d", i)}); err != nil {
			t.Fatal(err)
		}
	}
	if !servertest.Eventually(10*time.Second, func() bool {
		mu.Lock()
		defer mu.Unlock()
		return hanging >= 2
	}) {
		t.Fatal("tenant a's receivers never held two deliveries")
	}
	if _, err := sh.api.CreateLink(as(b, ""), &shortenerv1.CreateLinkRequest{LongUrl: "https://example.com/fast"}); err != nil {
		t.Fatal(err)
	}
	if !servertest.Eventually(10*time.Second, func() bool { return len(fast.all()) == 1 }) {
		t.Fatal("tenant b's delivery did not arrive while tenant a's receivers hang")
	}
	mu.Lock()
	defer mu.Unlock()
	if most != 2 {
		t.Errorf("tenant a's receivers held up to %d deliveries at once, want 2 (its per-tenant share)", most)
	}
}

// withWebhookEnv is webhookEnv with overrides.
func withWebhookEnv(overrides map[string]string) map[string]string {
	env := maps.Clone(webhookEnv)
	maps.Copy(env, overrides)
	return env
}

// A CODE_MODE_FROM_URL link that gives its URL up to a new link changes
// nothing a subscriber sees: the new link's link.created is queued, not a
// second link.updated of the old one.
func TestWebhookNoEventForAReleasedURLKey(t *testing.T) {
	sh, _, ctx, api, rc := webhookSetup(t)
	wh := subscribe(t, ctx, api, rc)
	url := "https://example.com/released-" + uniq("u")
	first, err := sh.api.CreateLink(ctx, &shortenerv1.CreateLinkRequest{LongUrl: url, Mode: shortenerv1.CodeMode_CODE_MODE_FROM_URL})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := sh.api.UpdateLink(ctx, &shortenerv1.UpdateLinkRequest{
		Link:       &shortenerv1.Link{Code: first.GetLink().GetCode(), Disabled: true},
		UpdateMask: &fieldmaskpb.FieldMask{Paths: []string{"disabled"}},
	}); err != nil {
		t.Fatal(err)
	}
	second, err := sh.api.CreateLink(ctx, &shortenerv1.CreateLinkRequest{LongUrl: url, Mode: shortenerv1.CodeMode_CODE_MODE_FROM_URL})
	if err != nil {
		t.Fatal(err)
	}
	if second.GetLink().GetCode() == first.GetLink().GetCode() {
		t.Fatalf("the disabled link %s was handed back", first.GetLink().GetCode())
	}
	types := map[string]int{}
	for _, d := range deliveries(t, ctx, api, wh.GetId()) {
		types[d.GetEventType()]++
	}
	if len(types) != 2 || types["link.created"] != 2 || types["link.updated"] != 1 {
		t.Errorf("events queued %v, want two link.created and one link.updated (the disable)", types)
	}
}

// newClickGroup creates group at the ends of the click streams of a layout
// of shards, destroyed when the test ends, and returns the streams' keys.
func newClickGroup(t *testing.T, rdb *redis.ClusterClient, shards int, group string) []string {
	t.Helper()
	keys := clickevent.StreamKeys(shards)
	for _, k := range keys {
		if err := rdb.XGroupCreateMkStream(context.Background(), k, group, "$").Err(); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { rdb.XGroupDestroy(context.Background(), k, group) })
	}
	return keys
}

// A replica that cannot read the link.clicked subscriptions (PostgreSQL
// away since its start) leaves the shared click group where it is: it used
// to take "none read" for "no subscriber" and move the group to the
// streams' ends, so clicks no replica had read yet were never delivered.
func TestClickBatcherWithoutSubscriptionsLeavesTheGroup(t *testing.T) {
	inst := start(t, withWebhookEnv(nil), hooks{})
	_, rdb := stores(t, inst.cfg)
	cfg := inst.cfg.Webhooks
	cfg.ClickGroup = uniq("wh-unread-")
	cfg.PollInterval = 20 * time.Millisecond
	ctx := context.Background()
	keys := newClickGroup(t, rdb, cfg.Streams.Shards, cfg.ClickGroup)
	ev := clickevent.Event{ID: clickevent.NewID(time.Now()), Code: "unread", Tenant: uniq("wh"), Time: time.Now()}
	id, err := rdb.XAdd(ctx, &redis.XAddArgs{Stream: keys[0], Values: ev.Values()}).Result()
	if err != nil {
		t.Fatal(err)
	}

	away, err := pgxpool.New(ctx, "postgres://kurz:kurz@127.0.0.1:1/kurz?connect_timeout=1")
	if err != nil {
		t.Fatal(err)
	}
	defer away.Close()
	var logs servertest.SyncBuffer
	b := webhook.NewClickBatcher(cfg, rdb, webhook.NewStore(away, time.Second), cfg.Streams, slog.New(slog.NewJSONHandler(&logs, nil)))
	bctx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() { b.Run(bctx); close(done) }()
	await(t, "two failed reads of the subscriptions", 20*time.Second, func() bool {
		return strings.Count(logs.String(), "reading the subscriptions failed") >= 2
	})
	cancel()
	<-done

	res, err := rdb.XReadGroup(ctx, &redis.XReadGroupArgs{Group: cfg.ClickGroup, Consumer: "check", Streams: []string{keys[0], ">"}, Count: 1000, Block: -1}).Result()
	if err != nil && !errors.Is(err, redis.Nil) {
		t.Fatal(err)
	}
	for _, s := range res {
		for _, m := range s.Messages {
			if m.ID == id {
				return
			}
		}
	}
	t.Errorf("click %s is no longer in the group's reach after a replica without the subscriptions ran: skipped", id)
}

// A click batcher removes from its group a replica killed without leaving
// (idle past ForgetIdle, nothing pending), and leaves the group itself
// when it stops: replicas are named per process, so neither piles up.
func TestClickBatcherForgetsKilledReplicasAndLeaves(t *testing.T) {
	inst := start(t, withWebhookEnv(nil), hooks{})
	tenant := uniq("wh")
	db, rdb := stores(t, inst.cfg, tenant)
	dropWebhooks(t, inst, tenant)
	// A link.clicked subscriber, so that the batcher reads (and joins).
	subscribe(t, as(tenant, ""), shortenerv1.NewWebhookServiceClient(inst.Conn), newReceiver(t), "link.clicked")
	cfg := inst.cfg.Webhooks
	cfg.ClickGroup = uniq("wh-forget-")
	cfg.PollInterval, cfg.ClickInterval = 20*time.Millisecond, 100*time.Millisecond
	// Streams no redirect writes to (no key shared with the layouts of 1
	// to 16 shards), so the batcher holds nothing pending when it stops.
	cfg.Streams.Shards = 37
	ctx := context.Background()
	keys := newClickGroup(t, rdb, cfg.Streams.Shards, cfg.ClickGroup)
	for _, k := range keys {
		if err := rdb.XGroupCreateConsumer(ctx, k, cfg.ClickGroup, "killed-replica").Err(); err != nil {
			t.Fatal(err)
		}
	}
	members := func() map[string]int {
		n := map[string]int{}
		for _, k := range keys {
			cs, err := rdb.XInfoConsumers(ctx, k, cfg.ClickGroup).Result()
			if err != nil {
				t.Fatal(err)
			}
			for _, c := range cs {
				n[c.Name]++
			}
		}
		return n
	}
	b := webhook.NewClickBatcher(cfg, rdb, webhook.NewStore(db, time.Second), cfg.Streams, slog.New(slog.DiscardHandler))
	b.ForgetIdle = 500 * time.Millisecond
	bctx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() { b.Run(bctx); close(done) }()
	// A click on every shard (of a tenant without subscribers: counted for
	// no one, acknowledged all the same), so the batcher joins each group.
	for _, k := range keys {
		ev := clickevent.Event{ID: clickevent.NewID(time.Now()), Code: "forget", Tenant: "someone-else", Time: time.Now()}
		if err := rdb.XAdd(ctx, &redis.XAddArgs{Stream: k, Values: ev.Values()}).Err(); err != nil {
			t.Fatal(err)
		}
	}
	ok, state := servertest.EventuallyState(15*time.Second, func() (bool, string) {
		m, pending := members(), int64(0)
		for _, k := range keys {
			p, err := rdb.XPending(ctx, k, cfg.ClickGroup).Result()
			if err != nil {
				t.Fatal(err)
			}
			pending += p.Count
		}
		joined := false
		for name, n := range m {
			joined = joined || strings.HasPrefix(name, "shortener-") && n == len(keys)
		}
		return joined && m["killed-replica"] == 0 && pending == 0, fmt.Sprintf("members %v, pending %d", m, pending)
	})
	if !ok {
		cancel()
		<-done
		t.Fatalf("the batcher in every shard's group, its clicks acknowledged and the killed replica forgotten: not within 15s; %s", state)
	}
	cancel()
	<-done
	if m := members(); len(m) != 0 {
		t.Errorf("after the batcher stopped the groups hold %v, want nobody (it held nothing pending)", m)
	}
}

// TestWebhookKeyRotationSealsSecretsUnderTheNewKey: a subscription made
// under the key derived from the code key, then a shortener started with a
// key of its own and KURZ_SHORTENER_WEBHOOK_PREVIOUS_KEY=derived: its first
// pass seals the secret again under the new key, which alone opens it.
func TestWebhookKeyRotationSealsSecretsUnderTheNewKey(t *testing.T) {
	sh, tenant, ctx, api, rc := webhookSetup(t)
	wh := subscribe(t, ctx, api, rc, "link.created")
	rc.mu.Lock()
	secret := rc.secret
	rc.mu.Unlock()
	db, _ := stores(t, sh.cfg, tenant)
	sealed := func() []byte {
		var b []byte
		if err := db.QueryRow(context.Background(), `SELECT secret FROM webhook_subscriptions WHERE id = $1`, wh.GetId()).Scan(&b); err != nil {
			t.Fatal(err)
		}
		return b
	}
	newKey := strings.Repeat("r", 40)
	after, err := webhook.NewSealer(newKey, "")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := after.Open(wh.GetId(), sealed()); err == nil {
		t.Fatal("the new key opens the secret before the rotation")
	}
	start(t, withWebhookEnv(map[string]string{"KURZ_SHORTENER_WEBHOOK_KEY": newKey, "KURZ_SHORTENER_WEBHOOK_PREVIOUS_KEY": "derived"}), hooks{})
	await(t, "the secret sealed under the new key", 15*time.Second, func() bool {
		got, err := after.Open(wh.GetId(), sealed())
		return err == nil && got == secret
	})
}
