package linkapi_test

import (
	"context"
	"crypto/sha256"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"

	shortenerv1 "kurz.dev/gen/kurz/shortener/v1"
	"kurz.dev/pkg/callmeta"
	"kurz.dev/services/shortener/internal/linkapi"
	"kurz.dev/services/shortener/internal/linkstore"
)

// withKey is as(tenant) carrying the idempotency keys.
func withKey(tenant string, keys ...string) context.Context {
	ctx := as(tenant)
	for _, k := range keys {
		ctx = metadata.AppendToOutgoingContext(ctx, callmeta.IdempotencyKey, k)
	}
	return ctx
}

// A create sent again with its idempotency key answers the link the key
// made, not created, and spends no quota; the same key with another
// request is refused and makes nothing; another tenant's key is its own.
func TestIdempotencyKeyAnswersTheFirstCreate(t *testing.T) {
	e := newEnv(t)
	req := &shortenerv1.CreateLinkRequest{LongUrl: "https://example.com/once", Mode: shortenerv1.CodeMode_CODE_MODE_RANDOM,
		Tags: []string{"launch"}, Password: "correct horse battery"}
	first, err := e.client.CreateLink(withKey("acme", "order-4711"), req)
	if err != nil || !first.GetCreated() {
		t.Fatalf("the first create: %v, %v; want created", first, err)
	}
	charged := len(e.limiter.Calls())
	again, err := e.client.CreateLink(withKey("acme", "order-4711"), req)
	if err != nil || again.GetCreated() || again.GetLink().GetCode() != first.GetLink().GetCode() {
		t.Fatalf("the same create again: %v, %v; want link %s, not created", again, err, first.GetLink().GetCode())
	}
	if n := len(e.limiter.Calls()) - charged; n != 0 {
		t.Errorf("the repeat asked the limiter %d times; want no quota spent", n)
	}
	// The password is not part of what is compared (its fast hash would
	// sit beside the Argon2id one): a repeat with another one is a repeat.
	other := proto.CloneOf(req)
	other.Password = "another password"
	if got, err := e.client.CreateLink(withKey("acme", "order-4711"), other); err != nil || got.GetLink().GetCode() != first.GetLink().GetCode() {
		t.Errorf("a repeat with another password: %v, %v; want the first link", got, err)
	}

	other = proto.CloneOf(req)
	other.LongUrl = "https://example.com/twice"
	_, err = e.client.CreateLink(withKey("acme", "order-4711"), other)
	wantStatus(t, "the key with another URL", err, codes.InvalidArgument, callmeta.ReasonIdempotencyKeyReused, "")
	if page, err := e.client.ListLinks(as("acme"), &shortenerv1.ListLinksRequest{}); err != nil || len(page.GetLinks()) != 1 {
		t.Errorf("acme's links: %v, %v; want the first one only", page.GetLinks(), err)
	}

	theirs, err := e.client.CreateLink(withKey("globex", "order-4711"), req)
	if err != nil || !theirs.GetCreated() || theirs.GetLink().GetCode() == first.GetLink().GetCode() {
		t.Errorf("another tenant's create with the key: %v, %v; want a link of its own", theirs, err)
	}
}

// Creates racing with one key make one link, and every one of them answers
// it.
func TestIdempotencyKeyConcurrentCreatesMakeOneLink(t *testing.T) {
	e := newEnv(t)
	const racers = 16
	var wg sync.WaitGroup
	codesSeen := make(chan string, racers)
	created := make(chan bool, racers)
	for range racers {
		wg.Go(func() {
			resp, err := e.client.CreateLink(withKey("acme", "race"), &shortenerv1.CreateLinkRequest{LongUrl: "https://example.com/race",
				Mode: shortenerv1.CodeMode_CODE_MODE_RANDOM})
			if err != nil {
				t.Errorf("a racer: %v", err)
				return
			}
			codesSeen <- resp.GetLink().GetCode()
			created <- resp.GetCreated()
		})
	}
	wg.Wait()
	close(codesSeen)
	close(created)
	distinct := map[string]bool{}
	for c := range codesSeen {
		distinct[c] = true
	}
	n := 0
	for c := range created {
		if c {
			n++
		}
	}
	if len(distinct) != 1 || n != 1 {
		t.Errorf("%d racers answered codes %v, %d of them created; want one code, created once", racers, distinct, n)
	}
	if page, err := e.client.ListLinks(as("acme"), &shortenerv1.ListLinksRequest{}); err != nil || len(page.GetLinks()) != 1 {
		t.Errorf("acme's links: %d, %v; want 1", len(page.GetLinks()), err)
	}
}

// A deleted link no longer holds its key: the key makes a new link.
func TestIdempotencyKeyOfADeletedLinkMakesANewOne(t *testing.T) {
	e := newEnv(t)
	req := &shortenerv1.CreateLinkRequest{LongUrl: "https://example.com/gone"}
	first, err := e.client.CreateLink(withKey("acme", "k-gone"), req)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := e.client.DeleteLink(as("acme"), &shortenerv1.DeleteLinkRequest{Code: first.GetLink().GetCode()}); err != nil {
		t.Fatal(err)
	}
	again, err := e.client.CreateLink(withKey("acme", "k-gone"), req)
	if err != nil || !again.GetCreated() || again.GetLink().GetCode() == first.GetLink().GetCode() {
		t.Errorf("the key after its link was deleted: %v, %v; want a new link", again, err)
	}
}

// A key that cannot be one is refused before anything is stored; so is a
// key from the anonymous tenant (its callers share it) and on a batch.
// (Bytes outside printable ASCII never leave a gRPC client; the gateway's
// header check and callmeta's test cover them.)
func TestIdempotencyKeyRefusals(t *testing.T) {
	e := newEnv(t, func(o *linkapi.Options) { o.AllowAnonymous = true })
	req := &shortenerv1.CreateLinkRequest{LongUrl: "https://example.com/refused"}
	for name, keys := range map[string][]string{
		"only spaces":  {"   "},
		"256 bytes":    {strings.Repeat("k", 256)},
		"two of them":  {"k1", "k2"},
		"an empty one": {""},
	} {
		_, err := e.client.CreateLink(withKey("acme", keys...), req)
		wantStatus(t, name, err, codes.InvalidArgument, callmeta.ReasonIdempotencyKeyInvalid, "")
	}
	_, err := e.client.CreateLink(withKey("", "anon-key"), req)
	wantStatus(t, "an anonymous create with a key", err, codes.InvalidArgument, callmeta.ReasonIdempotencyKeyUnsupported, "")
	_, err = e.client.BatchCreateLinks(withKey("acme", "batch-key"), &shortenerv1.BatchCreateLinksRequest{
		Requests: []*shortenerv1.CreateLinkRequest{req}})
	wantStatus(t, "a batch with a key", err, codes.InvalidArgument, callmeta.ReasonIdempotencyKeyUnsupported, "")
	if page, err := e.client.ListLinks(as("acme"), &shortenerv1.ListLinksRequest{}); err != nil || len(page.GetLinks()) != 0 {
		t.Errorf("acme's links after the refusals: %d, %v; want none", len(page.GetLinks()), err)
	}
	if live, err := e.store.Live(t.Context(), "", 10); err != nil || len(live) != 0 {
		t.Errorf("the store holds %d links, %v; want none", len(live), err)
	}
}

// A repeat is answered before the request is checked again: its expiry,
// ahead when the key made the link, may have passed since, and the retry
// must still learn that the link exists rather than be refused for it.
func TestIdempotencyKeyAnswersARepeatWhoseExpiryPassed(t *testing.T) {
	e := newEnv(t)
	passed := time.Now().Add(-time.Minute).Truncate(time.Second)
	req := &shortenerv1.CreateLinkRequest{LongUrl: "https://example.com/late", ExpireTime: timestamppb.New(passed)}
	key := sha256.Sum256([]byte("late-retry"))
	hash, err := linkapi.RequestHash(req)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := e.store.Insert(t.Context(), linkstore.Link{Code: "lateRty", Tenant: "acme", LongURL: "https://example.com/late",
		Expires: &passed, RequestKey: key[:], RequestHash: hash}); err != nil {
		t.Fatal(err)
	}
	resp, err := e.client.CreateLink(withKey("acme", "late-retry"), req)
	if err != nil || resp.GetCreated() || resp.GetLink().GetCode() != "lateRty" {
		t.Errorf("the retry after the expiry: %v, %v; want link lateRty, not created", resp, err)
	}
	_, err = e.client.CreateLink(as("acme"), req)
	wantStatus(t, "the same request without the key", err, codes.InvalidArgument, linkapi.ReasonExpireTimeInvalid, "expire_time")
}
