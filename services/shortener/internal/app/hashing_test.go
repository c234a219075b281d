//go:build integration

package app

import (
	"context"
	"slices"
	"testing"
	"time"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc/codes"

	shortenerv1 "kurz.dev/gen/kurz/shortener/v1"
	"kurz.dev/pkg/capacity"
	"kurz.dev/pkg/rpcerr"
	"kurz.dev/pkg/testkit/limitertest"
	"kurz.dev/services/shortener/internal/linkapi"
)

// TestPasswordChangeChargedToLinkQuota: setting a password on an existing
// link costs one link of the links.create quota (it costs the service what
// a create with a password does); other changes, and removing a password,
// cost nothing. Over quota, the whole update is refused and changes nothing.
func TestPasswordChangeChargedToLinkQuota(t *testing.T) {
	tenant := uniq("pwq-")
	lim := limitertest.Start(t, limitertest.AllowAll)
	sh := start(t, map[string]string{"KURZ_LIMITER_GRPC_ADDR": lim.Addr()}, hooks{})
	db, _ := stores(t, sh.cfg, tenant)
	ctx := as(tenant, "203.0.113.9")
	made, err := sh.api.CreateLink(ctx, &shortenerv1.CreateLinkRequest{LongUrl: "https://example.com/pwq", Tags: []string{"old"}})
	if err != nil {
		t.Fatal(err)
	}
	code := made.GetLink().GetCode()
	update := func(pw string, paths ...string) error {
		_, err := sh.api.UpdateLink(ctx, &shortenerv1.UpdateLinkRequest{
			Link: &shortenerv1.Link{Code: code, Password: pw, Tags: []string{"new"}}, UpdateMask: mask(paths...)})
		return err
	}
	if err := update("", "tags"); err != nil {
		t.Fatal(err)
	}
	if err := update("first passphrase", "password"); err != nil {
		t.Fatal(err)
	}
	if err := update("", "password"); err != nil {
		t.Fatal(err)
	}
	calls := lim.Calls()
	if len(calls) != 2 {
		t.Fatalf("limiter asked %d times, want 2: the create and the password set (not the tags, not the removal)", len(calls))
	}
	if c := calls[1]; c.GetDomain() != linkapi.QuotaDomain || c.GetDescriptors()["tenant"] != tenant ||
		c.GetDescriptors()["ip"] != "203.0.113.9" || c.GetCost() > 1 {
		t.Errorf("password set charged %v, want links.create with tenant and ip, cost 1", c)
	}

	lim.SetDecider(limitertest.Deny("links-per-day", 3*time.Second))
	before := readRow(t, db, code)
	err = update("second passphrase", "password", "tags")
	if reason, st := wantStatus(t, err, codes.ResourceExhausted); reason != rpcerr.ReasonRateLimited || retryDelay(st.Details()) != 3*time.Second {
		t.Errorf("password set over quota: reason %q, details %v; want %s with a 3s RetryInfo", reason, st.Details(), rpcerr.ReasonRateLimited)
	}
	after := readRow(t, db, code)
	if after.hash != nil || !slices.Equal(after.tags, before.tags) {
		t.Errorf("refused update changed the row: hash %v tags %v, want none and %v", after.hash, after.tags, before.tags)
	}
}

// TestPasswordHashingBeyondSlotsRefused: with every hashing slot taken,
// each path that hashes (create, update, batch) is refused UNAVAILABLE
// PASSWORD_HASHING_BUSY with a RetryInfo, and stores or changes nothing;
// a refused create or update charges no quota either (the refusal asks
// for the same request again); calls without a password go through. Once
// a slot is free, the same calls succeed.
func TestPasswordHashingBeyondSlotsRefused(t *testing.T) {
	tenant := uniq("pwb-")
	gate := capacity.New(1, 0)
	lim := limitertest.Start(t, limitertest.AllowAll)
	sh := start(t, map[string]string{"KURZ_LIMITER_GRPC_ADDR": lim.Addr()}, hooks{hashes: gate})
	db, _ := stores(t, sh.cfg, tenant)
	ctx := as(tenant, "")
	plain, err := sh.api.CreateLink(ctx, &shortenerv1.CreateLinkRequest{LongUrl: "https://example.com/plain"})
	if err != nil {
		t.Fatal(err)
	}
	code := plain.GetLink().GetCode()

	release, err := gate.Acquire(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	busy := func(what string, err error) {
		t.Helper()
		reason, st := wantStatus(t, err, codes.Unavailable)
		if reason != linkapi.ReasonHashingBusy || retryDelay(st.Details()) <= 0 {
			t.Errorf("%s: reason %q details %v; want %s with a RetryInfo", what, reason, st.Details(), linkapi.ReasonHashingBusy)
		}
	}
	charged := len(lim.Calls())
	create := &shortenerv1.CreateLinkRequest{LongUrl: "https://example.com/locked", Password: "correct horse"}
	_, err = sh.api.CreateLink(ctx, create)
	busy("create", err)
	upd := &shortenerv1.UpdateLinkRequest{Link: &shortenerv1.Link{Code: code, Password: "correct horse", Tags: []string{"new"}},
		UpdateMask: mask("password", "tags")}
	_, err = sh.api.UpdateLink(ctx, upd)
	busy("update", err)
	if n := len(lim.Calls()) - charged; n != 0 {
		t.Errorf("the refused create and update charged the quota %d times, want 0", n)
	}
	batch := &shortenerv1.BatchCreateLinksRequest{Requests: []*shortenerv1.CreateLinkRequest{
		{LongUrl: "https://example.com/b/0", Password: "correct horse"},
		{LongUrl: "https://example.com/b/1"},
	}}
	resp, err := sh.api.BatchCreateLinks(ctx, batch)
	if err != nil {
		t.Fatal(err)
	}
	if e := resp.GetResults()[0].GetError(); e.GetCode() != "UNAVAILABLE" || resp.GetCreated() != 1 {
		t.Errorf("batch: item 0 error %v, created %d; want UNAVAILABLE and the item without a password created", e, resp.GetCreated())
	}
	if n := countRows(t, db, tenant, `AND password_hash IS NOT NULL`); n != 0 {
		t.Errorf("%d links with a password stored while hashing was refused, want 0", n)
	}
	if r := readRow(t, db, code); r.hash != nil || len(r.tags) != 0 {
		t.Errorf("refused update changed the row: hash %v tags %v", r.hash, r.tags)
	}

	release()
	if _, err := sh.api.CreateLink(ctx, create); err != nil {
		t.Errorf("create with a free slot: %v", err)
	}
	if _, err := sh.api.UpdateLink(ctx, upd); err != nil {
		t.Errorf("update with a free slot: %v", err)
	}
	batch.Requests = batch.Requests[:1]
	batch.Requests[0].LongUrl = "https://example.com/b/2"
	if resp, err := sh.api.BatchCreateLinks(ctx, batch); err != nil || resp.GetCreated() != 1 {
		t.Errorf("batch with a free slot: %v, %v", resp, err)
	}
	if n := countRows(t, db, tenant, `AND password_hash IS NOT NULL`); n != 3 {
		t.Errorf("%d links with a password, want 3", n)
	}
}

// retryDelay is the RetryInfo delay among details (0: none).
func retryDelay(details []any) time.Duration {
	for _, d := range details {
		if r, ok := d.(*errdetails.RetryInfo); ok {
			return r.GetRetryDelay().AsDuration()
		}
	}
	return 0
}
