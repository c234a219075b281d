//go:build integration

package app

import (
	"context"
	"crypto/rand"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	shortenerv1 "kurz.dev/gen/kurz/shortener/v1"
	"kurz.dev/pkg/callmeta"
	"kurz.dev/pkg/linkcache"
	"kurz.dev/pkg/linkcode"
	"kurz.dev/pkg/testkit/limitertest"
	"kurz.dev/services/shortener/shortenertest"
)

// TestTranscript replays the design notes' prototype session against an
// in-process shortener and redirect pod, on the real Redis Cluster and
// PostgreSQL, and prints it the way curl would.
func TestTranscript(t *testing.T) {
	f := newFixture(t)
	// The shortener's write-through publishes an invalidation that reaches
	// this pod asynchronously; one landing after the second redirect would
	// drop the L1 entry the third one expects. Record them to wait for it.
	var invalidated sync.Map
	redir := start(t, nil, hooks{afterInvalidate: func(code string) { invalidated.Store(code, true) }})
	sh := shortenertest.Start(t, map[string]string{
		"KURZ_SHORTENER_ALLOW_ANONYMOUS": "true",
		"KURZ_SHORTENER_BASE_URL":        redir.HTTP,
		"KURZ_LIMITER_GRPC_ADDR":         limitertest.Start(t, limitertest.AllowAll).Addr(),
	})
	api := shortenerv1.NewShortenerServiceClient(sh.Conn)
	ctx := context.Background()
	var out strings.Builder
	say := func(format string, args ...any) { fmt.Fprintf(&out, format+"\n", args...) }
	create := func(req *shortenerv1.CreateLinkRequest) *shortenerv1.Link {
		t.Helper()
		ctx := ctx
		if req.GetCustomAlias() != "" {
			// Aliases are a tenant's (an anonymous one could never be
			// deleted): the session's alias is made with a key.
			ctx = callmeta.Outgoing(ctx, "transcript", "192.0.2.1")
		}
		resp, err := api.CreateLink(ctx, req)
		if err != nil {
			t.Fatalf("CreateLink(%v): %v", req, err)
		}
		l := resp.GetLink()
		f.track(l.GetCode())
		say(`{"code":%q,"short":%q}`, l.GetCode(), l.GetShortUrl())
		return l
	}
	check := func(code string, resp *http.Response, wantSource string, wantStatus int, wantLocation string) {
		t.Helper()
		say("$ curl -s -o /dev/null -D - %s/%s", redir.HTTP, code)
		say("HTTP/1.1 %s", resp.Status)
		if l := resp.Header.Get("Location"); l != "" {
			say("Location: %s", l)
		}
		say("Cache-Control: %s\nX-Source: %s", resp.Header.Get("Cache-Control"), resp.Header.Get("X-Source"))
		if resp.StatusCode != wantStatus || resp.Header.Get("X-Source") != wantSource || resp.Header.Get("Location") != wantLocation {
			t.Errorf("GET /%s: %d X-Source %q Location %q; want %d %q %q", code, resp.StatusCode,
				resp.Header.Get("X-Source"), resp.Header.Get("Location"), wantStatus, wantSource, wantLocation)
		}
		if wantStatus == http.StatusFound && resp.Header.Get("Cache-Control") != "private, max-age=0" {
			t.Errorf("GET /%s: Cache-Control %q, want private, max-age=0", code, resp.Header.Get("Cache-Control"))
		}
	}
	redirect := func(code, wantSource string, wantStatus int, wantLocation string) {
		t.Helper()
		check(code, get(t, redir.HTTP, "/"+code), wantSource, wantStatus, wantLocation)
	}

	say("$ grpcurl -d '{\"longUrl\":\"https://example.com/a/very/long/path?utm=1\"}' ... CreateLink  (then /b, /c random, javascript:alert(1))")
	a := create(&shortenerv1.CreateLinkRequest{LongUrl: "https://example.com/a/very/long/path?utm=1"})
	b := create(&shortenerv1.CreateLinkRequest{LongUrl: "https://example.com/b"})
	c := create(&shortenerv1.CreateLinkRequest{LongUrl: "https://example.com/c", Mode: shortenerv1.CodeMode_CODE_MODE_RANDOM})
	blockCodes, err := linkcode.NewPermutation([]byte(shortenertest.CodeKey))
	if err != nil {
		t.Fatal(err)
	}
	ida, okA := blockCodes.ID(a.GetCode())
	idb, okB := blockCodes.ID(b.GetCode())
	if !okA || !okB || idb != ida+1 || len(a.GetCode()) != 7 {
		t.Errorf("block codes %s, %s: want 7-character codes of consecutive IDs", a.GetCode(), b.GetCode())
	}
	if a.GetShortUrl() != redir.HTTP+"/"+a.GetCode() {
		t.Errorf("short URL %q, want %s/%s", a.GetShortUrl(), redir.HTTP, a.GetCode())
	}
	if idc, ok := blockCodes.ID(c.GetCode()); len(c.GetCode()) != 7 || strings.Trim(c.GetCode(), linkcode.Alphabet) != "" || (ok && idc == idb+1) {
		t.Errorf("random code %q: want 7 base62 characters, not the next block code", c.GetCode())
	}

	_, err = api.CreateLink(ctx, &shortenerv1.CreateLinkRequest{LongUrl: "javascript:alert(1)"})
	st, _ := status.FromError(err)
	var reason string
	for _, d := range st.Details() {
		if info, ok := d.(*errdetails.ErrorInfo); ok {
			reason = info.GetReason()
		}
	}
	say("ERROR: Code: %s Message: %s (reason %s)", st.Code(), st.Message(), reason)
	if st.Code() != codes.InvalidArgument || reason != "URL_SCHEME_NOT_ALLOWED" {
		t.Errorf("javascript: got %v %q, want InvalidArgument URL_SCHEME_NOT_ALLOWED", st.Code(), reason)
	}

	say("# create /d, delete its cache key, then redirect three times")
	d := create(&shortenerv1.CreateLinkRequest{LongUrl: "https://example.com/d"})
	await(t, "the shortener's invalidation of "+d.GetCode(), 10*time.Second, func() bool {
		_, ok := invalidated.Load(d.GetCode())
		return ok
	})
	f.flush(d.GetCode())
	redirect(d.GetCode(), "db", http.StatusFound, "https://example.com/d")
	redirect(d.GetCode(), "cache", http.StatusFound, "https://example.com/d")
	redirect(d.GetCode(), "l1", http.StatusFound, "https://example.com/d")

	unknown := "z" + rand.Text()[:6] // "zzzzzzz" in the notes; fresh per run
	f.track(unknown)
	say("# unknown code %s, three times", unknown)
	redirect(unknown, "db", http.StatusNotFound, "")
	redirect(unknown, "cache", http.StatusNotFound, "")
	redirect(unknown, "l1", http.StatusNotFound, "")

	say("# creating a code clears its negative entry (and the pods' L1)")
	alias := "new-" + strings.ToLower(rand.Text()[:8])
	f.track(alias)
	redirect(alias, "db", http.StatusNotFound, "")
	redirect(alias, "cache", http.StatusNotFound, "")
	create(&shortenerv1.CreateLinkRequest{LongUrl: "https://example.com/e", CustomAlias: alias})
	e, found, err := linkcache.Get(ctx, f.rdb, alias)
	if err != nil || !found || e.State != linkcache.Active {
		t.Errorf("entry of %s right after CreateLink: %+v found=%v err=%v, want active", alias, e, found, err)
	}
	// The invalidation reaches the pod asynchronously: poll (bounded by the
	// L1 TTL, which would hide a lost invalidation) for the first 302.
	var first *http.Response
	took := await(t, "the new alias redirects", redir.cfg.L1TTL, func() bool {
		first = get(t, redir.HTTP, "/"+alias)
		return first.StatusCode == http.StatusFound
	})
	check(alias, first, "cache", http.StatusFound, "https://example.com/e")
	say("(the pod's negative L1 entry was dropped by the invalidation within %v)", took.Round(time.Millisecond))

	t.Logf("transcript:\n%s", out.String())
}
