//go:build integration

package app

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc/codes"
	"google.golang.org/protobuf/types/known/fieldmaskpb"
	"google.golang.org/protobuf/types/known/timestamppb"

	shortenerv1 "kurz.dev/gen/kurz/shortener/v1"
	"kurz.dev/pkg/linkcache"
	"kurz.dev/pkg/rpcerr"
	"kurz.dev/pkg/testkit/limitertest"
	"kurz.dev/services/shortener/internal/linkapi"
	"kurz.dev/services/shortener/internal/urlcheck"
)

// TestCreateValidatesBeforeStoring: every refusal is INVALID_ARGUMENT with a
// machine-readable reason, and nothing reaches the database.
func TestCreateValidatesBeforeStoring(t *testing.T) {
	tenant := uniq("val-")
	sh := start(t, map[string]string{"KURZ_SHORTENER_BASE_URL": "https://kurz.example"}, hooks{})
	db, _ := stores(t, sh.cfg, tenant)
	ctx := as(tenant, "")
	past := timestamppb.New(time.Now().Add(-time.Hour))
	tests := map[string]struct {
		req    *shortenerv1.CreateLinkRequest
		reason string
	}{
		"javascript":     {&shortenerv1.CreateLinkRequest{LongUrl: "javascript:alert(1)"}, urlcheck.ReasonScheme},
		"data":           {&shortenerv1.CreateLinkRequest{LongUrl: "data:text/html,hi"}, urlcheck.ReasonScheme},
		"file":           {&shortenerv1.CreateLinkRequest{LongUrl: "file:///etc/passwd"}, urlcheck.ReasonScheme},
		"vbscript":       {&shortenerv1.CreateLinkRequest{LongUrl: "vbscript:msgbox"}, urlcheck.ReasonScheme},
		"scheme-less":    {&shortenerv1.CreateLinkRequest{LongUrl: "example.com"}, urlcheck.ReasonScheme},
		"empty":          {&shortenerv1.CreateLinkRequest{}, urlcheck.ReasonRequired},
		"userinfo":       {&shortenerv1.CreateLinkRequest{LongUrl: "https://bank.com@evil.example"}, urlcheck.ReasonUserInfo},
		"too long":       {&shortenerv1.CreateLinkRequest{LongUrl: "https://example.com/" + strings.Repeat("x", 2048)}, urlcheck.ReasonTooLong},
		"loopback":       {&shortenerv1.CreateLinkRequest{LongUrl: "http://127.0.0.1:9091/"}, urlcheck.ReasonPrivateHost},
		"metadata IP":    {&shortenerv1.CreateLinkRequest{LongUrl: "http://169.254.169.254/"}, urlcheck.ReasonPrivateHost},
		"own domain":     {&shortenerv1.CreateLinkRequest{LongUrl: "https://KURZ.example/abcd"}, urlcheck.ReasonLoop},
		"no host":        {&shortenerv1.CreateLinkRequest{LongUrl: "https:///x"}, urlcheck.ReasonHostRequired},
		"past expiry":    {&shortenerv1.CreateLinkRequest{LongUrl: "https://example.com/", ExpireTime: past}, linkapi.ReasonExpireTimeInvalid},
		"bad redirect":   {&shortenerv1.CreateLinkRequest{LongUrl: "https://example.com/", RedirectType: 99}, linkapi.ReasonRedirectInvalid},
		"bad mode":       {&shortenerv1.CreateLinkRequest{LongUrl: "https://example.com/", Mode: 42}, linkapi.ReasonModeInvalid},
		"custom no code": {&shortenerv1.CreateLinkRequest{LongUrl: "https://example.com/", Mode: shortenerv1.CodeMode_CODE_MODE_CUSTOM}, linkapi.ReasonAliasInvalid},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			_, err := sh.api.CreateLink(ctx, tc.req)
			reason, st := wantStatus(t, err, codes.InvalidArgument)
			if reason != tc.reason {
				t.Errorf("reason %q, want %q (message %q)", reason, tc.reason, st.Message())
			}
			var field bool
			for _, d := range st.Details() {
				if br, ok := d.(*errdetails.BadRequest); ok && len(br.GetFieldViolations()) == 1 {
					field = true
				}
			}
			if !field {
				t.Errorf("no BadRequest field violation in %v", st.Details())
			}
		})
	}
	var n int
	if err := db.QueryRow(context.Background(), `SELECT count(*) FROM links WHERE tenant = $1`, tenant).Scan(&n); err != nil || n != 0 {
		t.Errorf("%d rows stored for refused requests (%v), want 0", n, err)
	}

	got, err := sh.api.CreateLink(ctx, &shortenerv1.CreateLinkRequest{LongUrl: " HTTPS://Bücher.DE:443/a b?x=1 "})
	if err != nil {
		t.Fatal(err)
	}
	if want := "https://xn--bcher-kva.de/a%20b?x=1"; got.GetLink().GetLongUrl() != want {
		t.Errorf("stored %q, want the normal form %q", got.GetLink().GetLongUrl(), want)
	}
	if !strings.HasPrefix(got.GetLink().GetShortUrl(), "https://kurz.example/") || len(got.GetLink().GetCode()) != 7 {
		t.Errorf("short URL %q", got.GetLink().GetShortUrl())
	}
}

// TestTenants: no tenant is UNAUTHENTICATED unless anonymous creation is on;
// a tenant never sees or changes another's links (NOT_FOUND, as if absent).
func TestTenants(t *testing.T) {
	a, b := uniq("ta-"), uniq("tb-")
	closed := start(t, nil, hooks{})
	stores(t, closed.cfg, a, b)
	_, err := closed.api.CreateLink(context.Background(), &shortenerv1.CreateLinkRequest{LongUrl: "https://example.com/"})
	wantStatus(t, err, codes.Unauthenticated)

	made, err := closed.api.CreateLink(as(a, ""), &shortenerv1.CreateLinkRequest{LongUrl: "https://example.com/a"})
	if err != nil {
		t.Fatal(err)
	}
	code := made.GetLink().GetCode()
	if made.GetLink().GetTenant() != a {
		t.Errorf("tenant %q, want %q", made.GetLink().GetTenant(), a)
	}
	asB := as(b, "")
	_, err = closed.api.GetLink(asB, &shortenerv1.GetLinkRequest{Code: code})
	wantStatus(t, err, codes.NotFound)
	_, err = closed.api.UpdateLink(asB, &shortenerv1.UpdateLinkRequest{
		Link:       &shortenerv1.Link{Code: code, LongUrl: "https://evil.example/"},
		UpdateMask: &fieldmaskpb.FieldMask{Paths: []string{"long_url"}},
	})
	wantStatus(t, err, codes.NotFound)
	_, err = closed.api.DeleteLink(asB, &shortenerv1.DeleteLinkRequest{Code: code})
	wantStatus(t, err, codes.NotFound)
	list, err := closed.api.ListLinks(asB, &shortenerv1.ListLinksRequest{})
	if err != nil || len(list.GetLinks()) != 0 {
		t.Errorf("tenant b lists %v (%v), want nothing", list.GetLinks(), err)
	}
	if got, err := closed.api.GetLink(as(a, ""), &shortenerv1.GetLinkRequest{Code: code}); err != nil || got.GetLink().GetLongUrl() != "https://example.com/a" {
		t.Errorf("owner's GetLink: %v, %v", got, err)
	}

	open := start(t, map[string]string{"KURZ_SHORTENER_ALLOW_ANONYMOUS": "true"}, hooks{})
	anon, err := open.api.CreateLink(context.Background(), &shortenerv1.CreateLinkRequest{LongUrl: "https://example.com/anon"})
	if err != nil {
		t.Fatal(err)
	}
	if anon.GetLink().GetTenant() != "anonymous" {
		t.Errorf("tenant %q, want anonymous", anon.GetLink().GetTenant())
	}
	db, _ := stores(t, open.cfg)
	t.Cleanup(func() {
		_, _ = db.Exec(context.Background(), `DELETE FROM links WHERE code = $1`, anon.GetLink().GetCode())
	})
}

func TestListPagination(t *testing.T) {
	tenant := uniq("lst-")
	sh := start(t, nil, hooks{})
	stores(t, sh.cfg, tenant)
	ctx := as(tenant, "")
	var made []string
	for i := range 5 {
		r, err := sh.api.CreateLink(ctx, &shortenerv1.CreateLinkRequest{LongUrl: "https://example.com/" + string(rune('a'+i))})
		if err != nil {
			t.Fatal(err)
		}
		made = append(made, r.GetLink().GetCode())
	}
	if _, err := sh.api.DeleteLink(ctx, &shortenerv1.DeleteLinkRequest{Code: made[2]}); err != nil {
		t.Fatal(err)
	}
	want := []string{made[4], made[3], made[1], made[0]} // newest first, revoked left out
	var got []string
	token := ""
	for pages := 0; ; pages++ {
		if pages > 3 {
			t.Fatal("too many pages")
		}
		resp, err := sh.api.ListLinks(ctx, &shortenerv1.ListLinksRequest{PageSize: 3, PageToken: token})
		if err != nil {
			t.Fatal(err)
		}
		for _, l := range resp.GetLinks() {
			got = append(got, l.GetCode())
		}
		if token = resp.GetNextPageToken(); token == "" {
			break
		}
	}
	if strings.Join(got, ",") != strings.Join(want, ",") {
		t.Errorf("listed %v, want %v", got, want)
	}
	_, err := sh.api.ListLinks(ctx, &shortenerv1.ListLinksRequest{PageToken: "bm90IGEgdG9rZW4"})
	reason, _ := wantStatus(t, err, codes.InvalidArgument)
	if reason != linkapi.ReasonPageTokenInvalid {
		t.Errorf("reason %q", reason)
	}
	_, err = sh.api.ListLinks(ctx, &shortenerv1.ListLinksRequest{PageSize: -1})
	wantStatus(t, err, codes.InvalidArgument)
}

// TestUpdateAndDeleteWriteThrough: each change is re-validated, committed,
// written to the code's Redis entry and published for the redirect pods.
func TestUpdateAndDeleteWriteThrough(t *testing.T) {
	tenant := uniq("upd-")
	sh := start(t, nil, hooks{})
	_, rdb := stores(t, sh.cfg, tenant)
	ctx := as(tenant, "")
	sub := rdb.Subscribe(context.Background(), linkcache.InvalidationChannel)
	defer sub.Close()
	if _, err := sub.Receive(context.Background()); err != nil {
		t.Fatal(err)
	}
	invalidated := func(code string) {
		t.Helper()
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		for {
			m, err := sub.ReceiveMessage(ctx)
			if err != nil {
				t.Fatalf("no invalidation for %s: %v", code, err)
			}
			if m.Payload == code {
				return
			}
		}
	}
	entry := func(code string) linkcache.Entry {
		t.Helper()
		e, found, err := linkcache.Get(context.Background(), rdb, code)
		if err != nil || !found {
			t.Fatalf("entry of %s: found %v, %v", code, found, err)
		}
		return e
	}

	made, err := sh.api.CreateLink(ctx, &shortenerv1.CreateLinkRequest{LongUrl: "https://example.com/v1"})
	if err != nil {
		t.Fatal(err)
	}
	code := made.GetLink().GetCode()
	invalidated(code)
	if e := entry(code); e.State != linkcache.Active || e.URL != "https://example.com/v1" || e.Tenant != tenant {
		t.Errorf("after create: %+v", e)
	}
	if ttl := rdb.TTL(context.Background(), linkcache.Key(code)).Val(); ttl < 23*time.Hour {
		t.Errorf("entry TTL %v, want about 24h", ttl)
	}

	_, err = sh.api.UpdateLink(ctx, &shortenerv1.UpdateLinkRequest{
		Link:       &shortenerv1.Link{Code: code, LongUrl: "javascript:alert(1)"},
		UpdateMask: &fieldmaskpb.FieldMask{Paths: []string{"long_url"}},
	})
	if reason, _ := wantStatus(t, err, codes.InvalidArgument); reason != urlcheck.ReasonScheme {
		t.Errorf("update to javascript: reason %q", reason)
	}
	_, err = sh.api.UpdateLink(ctx, &shortenerv1.UpdateLinkRequest{Link: &shortenerv1.Link{Code: code}})
	wantStatus(t, err, codes.InvalidArgument)
	_, err = sh.api.UpdateLink(ctx, &shortenerv1.UpdateLinkRequest{Link: &shortenerv1.Link{Code: code}, UpdateMask: &fieldmaskpb.FieldMask{Paths: []string{"tenant"}}})
	wantStatus(t, err, codes.InvalidArgument)

	exp := time.Now().Add(48 * time.Hour).Truncate(time.Millisecond)
	upd, err := sh.api.UpdateLink(ctx, &shortenerv1.UpdateLinkRequest{
		Link: &shortenerv1.Link{Code: code, LongUrl: "https://example.com/v2",
			RedirectType: shortenerv1.RedirectType_REDIRECT_TYPE_MOVED_PERMANENTLY, ExpireTime: timestamppb.New(exp)},
		UpdateMask: &fieldmaskpb.FieldMask{Paths: []string{"long_url", "redirect_type", "expire_time"}},
	})
	if err != nil {
		t.Fatal(err)
	}
	if upd.GetLink().GetLongUrl() != "https://example.com/v2" || upd.GetLink().GetRedirectType() != shortenerv1.RedirectType_REDIRECT_TYPE_MOVED_PERMANENTLY {
		t.Errorf("updated link %v", upd.GetLink())
	}
	invalidated(code)
	if e := entry(code); e.URL != "https://example.com/v2" || e.Status != 301 || e.ExpiresAtMs != exp.UnixMilli() {
		t.Errorf("after update: %+v", e)
	}

	if _, err := sh.api.DeleteLink(ctx, &shortenerv1.DeleteLinkRequest{Code: code}); err != nil {
		t.Fatal(err)
	}
	invalidated(code)
	if e := entry(code); e.State != linkcache.Gone {
		t.Errorf("after delete: %+v, want gone", e)
	}
	_, err = sh.api.GetLink(ctx, &shortenerv1.GetLinkRequest{Code: code})
	wantStatus(t, err, codes.NotFound)
	_, err = sh.api.DeleteLink(ctx, &shortenerv1.DeleteLinkRequest{Code: code})
	wantStatus(t, err, codes.NotFound)
}

// TestQuota: over quota is RESOURCE_EXHAUSTED with retry-after in the
// message and in RetryInfo; the limiter sees domain links.create with the
// tenant and the client IP; an unreachable limiter follows the policy.
func TestQuota(t *testing.T) {
	tenant := uniq("quo-")
	lim := limitertest.Start(t, limitertest.Deny("per-ip", 12500*time.Millisecond))
	sh := start(t, map[string]string{"KURZ_LIMITER_GRPC_ADDR": lim.Addr()}, hooks{})
	db, _ := stores(t, sh.cfg, tenant)

	_, err := sh.api.CreateLink(as(tenant, "203.0.113.77"), &shortenerv1.CreateLinkRequest{LongUrl: "https://example.com/q"})
	reason, st := wantStatus(t, err, codes.ResourceExhausted)
	if reason != rpcerr.ReasonRateLimited || !strings.Contains(st.Message(), "retry after 13s") {
		t.Errorf("denial: reason %q message %q; want %s and 'retry after 13s'", reason, st.Message(), rpcerr.ReasonRateLimited)
	}
	var retry *errdetails.RetryInfo
	for _, d := range st.Details() {
		if r, ok := d.(*errdetails.RetryInfo); ok {
			retry = r
		}
	}
	if retry.GetRetryDelay().AsDuration() != 13*time.Second {
		t.Errorf("RetryInfo %v, want 13s", retry)
	}
	calls := lim.Calls()
	if len(calls) != 1 || calls[0].GetDomain() != "links.create" ||
		calls[0].GetDescriptors()["tenant"] != tenant || calls[0].GetDescriptors()["ip"] != "203.0.113.77" {
		t.Errorf("limiter saw %v, want one links.create call with tenant and ip", calls)
	}
	var n int
	if err := db.QueryRow(context.Background(), `SELECT count(*) FROM links WHERE tenant = $1`, tenant).Scan(&n); err != nil || n != 0 {
		t.Errorf("denied create stored %d rows (%v)", n, err)
	}
	// Invalid input is refused before the limiter is asked.
	_, err = sh.api.CreateLink(as(tenant, ""), &shortenerv1.CreateLinkRequest{LongUrl: "javascript:alert(1)"})
	wantStatus(t, err, codes.InvalidArgument)
	if len(lim.Calls()) != 1 {
		t.Errorf("limiter called for an invalid URL")
	}

	lim.SetDecider(limitertest.AllowAll)
	if _, err := sh.api.CreateLink(as(tenant, ""), &shortenerv1.CreateLinkRequest{LongUrl: "https://example.com/ok"}); err != nil {
		t.Errorf("allowed create: %v", err)
	}

	dead := "127.0.0.1:1"
	failOpen := start(t, map[string]string{"KURZ_LIMITER_GRPC_ADDR": dead}, hooks{})
	if _, err := failOpen.api.CreateLink(as(tenant, ""), &shortenerv1.CreateLinkRequest{LongUrl: "https://example.com/open"}); err != nil {
		t.Errorf("limiter down, policy open: %v", err)
	}
	if got := metricValue(t, failOpen.Running, "kurz_quota_calls_total"); got != 1 {
		t.Errorf("degraded quota calls counted %v, want 1", got)
	}
	failClosed := start(t, map[string]string{"KURZ_LIMITER_GRPC_ADDR": dead, "KURZ_SHORTENER_LIMITER_FAILURE_POLICY": "closed"}, hooks{})
	_, err = failClosed.api.CreateLink(as(tenant, ""), &shortenerv1.CreateLinkRequest{LongUrl: "https://example.com/closed"})
	if reason, _ := wantStatus(t, err, codes.Unavailable); reason != linkapi.ReasonLimiterDown {
		t.Errorf("limiter down, policy closed: reason %q", reason)
	}
}

func TestBlocklistRefusesAtCreation(t *testing.T) {
	tenant := uniq("blo-")
	path := filepath.Join(t.TempDir(), "blocklist")
	if err := os.WriteFile(path, []byte("phish.example\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	sh := start(t, map[string]string{"KURZ_SHORTENER_BLOCKLIST_FILE": path, "KURZ_SHORTENER_BLOCKLIST_RELOAD": "10ms"}, hooks{})
	stores(t, sh.cfg, tenant)
	ctx := as(tenant, "")
	_, err := sh.api.CreateLink(ctx, &shortenerv1.CreateLinkRequest{LongUrl: "https://login.phish.example/"})
	if reason, _ := wantStatus(t, err, codes.InvalidArgument); reason != urlcheck.ReasonBlocked {
		t.Errorf("reason %q, want %s", reason, urlcheck.ReasonBlocked)
	}
	if _, err := sh.api.CreateLink(ctx, &shortenerv1.CreateLinkRequest{LongUrl: "https://fine.example/"}); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, []byte("phish.example\nfine.example\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	await(t, "blocklist reload", 5*time.Second, func() bool {
		_, err := sh.api.CreateLink(ctx, &shortenerv1.CreateLinkRequest{LongUrl: "https://fine.example/2"})
		return err != nil
	})
	if got := metricValue(t, sh.Running, "kurz_shortener_urls_refused_total"); got < 2 {
		t.Errorf("refused metric %v, want at least 2", got)
	}
}

// startWithBlocklist starts a shortener whose blocklist file (path, holding
// phish.example) is reloaded every 10 ms, and returns a domain that is not
// on it yet.
func startWithBlocklist(t *testing.T) (sh instance, path, bad string) {
	t.Helper()
	bad = uniq("later-") + ".example"
	path = filepath.Join(t.TempDir(), "blocklist")
	if err := os.WriteFile(path, []byte("phish.example\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	return start(t, map[string]string{"KURZ_SHORTENER_BLOCKLIST_FILE": path, "KURZ_SHORTENER_BLOCKLIST_RELOAD": "10ms"}, hooks{}), path, bad
}

// TestBlocklistReachesExistingLinks: a domain added to the blocklist
// disables the live links created before it, whether it is their long URL's
// or a device target's, and their redirect entry answers gone; other links
// stay live.
func TestBlocklistReachesExistingLinks(t *testing.T) {
	tenant := uniq("swp-")
	sh, path, bad := startWithBlocklist(t)
	_, rdb := stores(t, sh.cfg, tenant)
	ctx := as(tenant, "")
	create := func(req *shortenerv1.CreateLinkRequest) string {
		t.Helper()
		made, err := sh.api.CreateLink(ctx, req)
		if err != nil {
			t.Fatal(err)
		}
		return made.GetLink().GetCode()
	}
	byURL := create(&shortenerv1.CreateLinkRequest{LongUrl: "https://login." + bad + "/x"})
	byTarget := create(&shortenerv1.CreateLinkRequest{LongUrl: "https://fine.example/app",
		DeviceTargets: &shortenerv1.DeviceTargets{IosUrl: "https://" + bad + "/ios"}})
	fine := create(&shortenerv1.CreateLinkRequest{LongUrl: "https://fine.example/stays"})

	if err := os.WriteFile(path, []byte("phish.example\n"+bad+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, code := range []string{byURL, byTarget} {
		// Disabled in PostgreSQL, then written through to Redis.
		await(t, "sweep of "+code, 10*time.Second, func() bool {
			l, err := sh.api.GetLink(ctx, &shortenerv1.GetLinkRequest{Code: code})
			return err == nil && l.GetLink().GetDisabled() && cacheEntry(t, rdb, code).State == linkcache.Gone
		})
	}
	l, err := sh.api.GetLink(ctx, &shortenerv1.GetLinkRequest{Code: fine})
	if err != nil || l.GetLink().GetDisabled() || cacheEntry(t, rdb, fine).State != linkcache.Active {
		t.Errorf("unrelated link: %v, %v; want live", l, err)
	}
	// The sweep counts a link after writing it through to Redis, which the
	// wait above saw: the count may follow a moment later.
	await(t, "blocklisted metric at least 2", 10*time.Second, func() bool {
		return metricValue(t, sh.Running, "kurz_shortener_links_blocklisted_total") >= 2
	})
}

// TestBlocklistedLinkStaysDisabled: a link the blocklist sweep disabled
// cannot be enabled again by its tenant while its destination is blocked:
// the update is refused INVALID_ARGUMENT URL_BLOCKED, and the link stays
// disabled in PostgreSQL and gone in Redis.
func TestBlocklistedLinkStaysDisabled(t *testing.T) {
	tenant := uniq("swp-")
	sh, path, bad := startWithBlocklist(t)
	_, rdb := stores(t, sh.cfg, tenant)
	ctx := as(tenant, "")
	made, err := sh.api.CreateLink(ctx, &shortenerv1.CreateLinkRequest{LongUrl: "https://login." + bad + "/x"})
	if err != nil {
		t.Fatal(err)
	}
	code := made.GetLink().GetCode()
	if err := os.WriteFile(path, []byte("phish.example\n"+bad+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	await(t, "sweep of "+code, 10*time.Second, func() bool {
		l, err := sh.api.GetLink(ctx, &shortenerv1.GetLinkRequest{Code: code})
		return err == nil && l.GetLink().GetDisabled() && cacheEntry(t, rdb, code).State == linkcache.Gone
	})

	_, err = sh.api.UpdateLink(ctx, &shortenerv1.UpdateLinkRequest{
		Link:       &shortenerv1.Link{Code: code, Disabled: false},
		UpdateMask: &fieldmaskpb.FieldMask{Paths: []string{"disabled"}},
	})
	if reason, _ := wantStatus(t, err, codes.InvalidArgument); reason != urlcheck.ReasonBlocked {
		t.Errorf("enable: reason %q, want %s", reason, urlcheck.ReasonBlocked)
	}
	l, err := sh.api.GetLink(ctx, &shortenerv1.GetLinkRequest{Code: code})
	if err != nil || !l.GetLink().GetDisabled() {
		t.Errorf("after the refused enable: %v, %v; want the link disabled", l.GetLink(), err)
	}
	if e := cacheEntry(t, rdb, code); e.State != linkcache.Gone {
		t.Errorf("redis entry %+v after the refused enable, want gone", e)
	}
}
