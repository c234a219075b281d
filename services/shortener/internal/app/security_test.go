//go:build integration

package app

import (
	"context"
	"testing"
	"time"

	"golang.org/x/net/http2/hpack"
	"google.golang.org/grpc/codes"
	"google.golang.org/protobuf/types/known/fieldmaskpb"

	shortenerv1 "kurz.dev/gen/kurz/shortener/v1"
	"kurz.dev/pkg/linkcache"
	"kurz.dev/pkg/server"
	"kurz.dev/pkg/svcauth"
	"kurz.dev/pkg/testkit/servertest"
	"kurz.dev/services/shortener/internal/urlcheck"
)

// scriptTargets are long URLs that would make a short link run script or
// read local files in the visitor's browser, in spellings a filter that only
// compares prefixes would miss, with the reason each is refused for.
var scriptTargets = map[string]struct{ url, reason string }{
	"javascript":                 {"javascript:alert(document.cookie)", urlcheck.ReasonScheme},
	"javascript, mixed case":     {"JaVaScRiPt:alert(1)", urlcheck.ReasonScheme},
	"javascript, padded":         {" \tjavascript:alert(1) ", urlcheck.ReasonScheme},
	"javascript with a host":     {"javascript://example.com/%0Aalert(1)", urlcheck.ReasonScheme},
	"javascript, tab inside":     {"java\tscript:alert(1)", urlcheck.ReasonMalformed},
	"javascript, newline inside": {"java\nscript:alert(1)", urlcheck.ReasonMalformed},
	"data":                       {"data:text/html,<script>alert(1)</script>", urlcheck.ReasonScheme},
	"data, base64 html":          {"data:text/html;base64,PHNjcmlwdD5hbGVydCgxKTwvc2NyaXB0Pg==", urlcheck.ReasonScheme},
	"vbscript":                   {"vbscript:msgbox(1)", urlcheck.ReasonScheme},
	"file":                       {"file:///etc/passwd", urlcheck.ReasonScheme},
	"file, windows":              {"FILE://C:/Windows/win.ini", urlcheck.ReasonScheme},
	"scheme-relative":            {"//evil.example/x", urlcheck.ReasonScheme},
}

// TestShortLinksCannotPointAtScriptSchemesEvenThroughUpdate: javascript:,
// data:, vbscript: and file: targets (in every spelling of scriptTargets)
// are INVALID_ARGUMENT on CreateLink and on UpdateLink alike, and an update
// refused leaves the stored row and the redirect cache entry as they were.
func TestShortLinksCannotPointAtScriptSchemesEvenThroughUpdate(t *testing.T) {
	tenant := uniq("xss-")
	sh := start(t, nil, hooks{})
	db, rdb := stores(t, sh.cfg, tenant)
	ctx := as(tenant, "")
	const target = "https://example.com/safe"
	made, err := sh.api.CreateLink(ctx, &shortenerv1.CreateLinkRequest{LongUrl: target})
	if err != nil {
		t.Fatal(err)
	}
	code := made.GetLink().GetCode()

	for name, tc := range scriptTargets {
		t.Run(name, func(t *testing.T) {
			_, err := sh.api.CreateLink(ctx, &shortenerv1.CreateLinkRequest{LongUrl: tc.url})
			if reason, st := wantStatus(t, err, codes.InvalidArgument); reason != tc.reason {
				t.Errorf("CreateLink(%q): reason %q (%s), want %s", tc.url, reason, st.Message(), tc.reason)
			}
			_, err = sh.api.UpdateLink(ctx, &shortenerv1.UpdateLinkRequest{
				Link:       &shortenerv1.Link{Code: code, LongUrl: tc.url},
				UpdateMask: &fieldmaskpb.FieldMask{Paths: []string{"long_url"}},
			})
			if reason, st := wantStatus(t, err, codes.InvalidArgument); reason != tc.reason {
				t.Errorf("UpdateLink(%q): reason %q (%s), want %s", tc.url, reason, st.Message(), tc.reason)
			}
		})
	}

	var stored string
	var n int
	if err := db.QueryRow(context.Background(), `SELECT max(long_url), count(*) FROM links WHERE tenant = $1`, tenant).Scan(&stored, &n); err != nil {
		t.Fatal(err)
	}
	if n != 1 || stored != target {
		t.Errorf("after %d refused creates and updates: %d rows, long_url %q; want 1 row with %q", len(scriptTargets), n, stored, target)
	}
	if e, found, err := linkcache.Get(context.Background(), rdb, code); err != nil || !found || e.URL != target {
		t.Errorf("redirect cache entry after the refused updates: %+v found=%v err=%v; want %q", e, found, err, target)
	}
}

// TestLinksToOwnShortDomainRefusedOnCreateAndUpdate: a link to the short
// domain itself (KURZ_SHORTENER_BASE_URL's host, or any of
// KURZ_SHORTENER_OWN_HOSTS) would redirect in a loop or launder another
// short link; it is refused as URL_REDIRECT_LOOP by CreateLink and by
// UpdateLink, in every spelling of the host (case, trailing dot, any port,
// full-width letters; a percent-encoded host is refused as malformed),
// while look-alike hosts pass. The
// loopback base URL of make up is caught by its IP spellings too, with
// private hosts allowed (as in development).
func TestLinksToOwnShortDomainRefusedOnCreateAndUpdate(t *testing.T) {
	tenant := uniq("own-")
	sh := start(t, map[string]string{
		"KURZ_SHORTENER_BASE_URL":  "https://kurz.example",
		"KURZ_SHORTENER_OWN_HOSTS": "go.kurz.example,s.example:8443",
	}, hooks{})
	dev := start(t, map[string]string{
		"KURZ_SHORTENER_BASE_URL":            "http://127.0.0.1:8787",
		"KURZ_SHORTENER_ALLOW_PRIVATE_HOSTS": "true",
	}, hooks{})
	db, rdb := stores(t, sh.cfg, tenant)
	ctx := as(tenant, "")

	for _, tc := range []struct {
		sh    instance
		loops map[string]string // URL → the reason it is refused for
		fine  []string
	}{
		{sh, map[string]string{
			"https://kurz.example/abcdefg":            urlcheck.ReasonLoop,
			"http://kurz.example/abcdefg":             urlcheck.ReasonLoop,
			"HTTPS://KURZ.EXAMPLE/abcdefg":            urlcheck.ReasonLoop,
			"https://kurz.example./abcdefg":           urlcheck.ReasonLoop,
			"https://kurz.example:8443/abcdefg":       urlcheck.ReasonLoop,
			"https://ｋｕｒｚ.example/abcdefg":            urlcheck.ReasonLoop,
			"https://go.kurz.example/abcdefg":         urlcheck.ReasonLoop,
			"https://GO.Kurz.Example:443/abcdefg?x=1": urlcheck.ReasonLoop,
			"http://s.example/abcdefg":                urlcheck.ReasonLoop,
			"https://kurz%2Eexample/abcdefg":          urlcheck.ReasonMalformed,
		}, []string{
			"https://www.kurz.example/",
			"https://kurz.example.org/",
			"https://notkurz.example/",
		}},
		{dev, map[string]string{
			"http://127.0.0.1:8787/abcdefg":          urlcheck.ReasonLoop,
			"http://127.1:8787/abcdefg":              urlcheck.ReasonLoop,
			"http://2130706433:8787/abcdefg":         urlcheck.ReasonLoop,
			"http://0x7f.0.0.1/abcdefg":              urlcheck.ReasonLoop,
			"http://[::ffff:127.0.0.1]:8787/abcdefg": urlcheck.ReasonLoop,
		}, []string{
			"http://127.0.0.2:8787/",
		}},
	} {
		base := tc.sh.cfg.BaseURL
		made, err := tc.sh.api.CreateLink(ctx, &shortenerv1.CreateLinkRequest{LongUrl: "https://example.com/kept"})
		if err != nil {
			t.Fatal(err)
		}
		code := made.GetLink().GetCode()
		for raw, want := range tc.loops {
			_, err := tc.sh.api.CreateLink(ctx, &shortenerv1.CreateLinkRequest{LongUrl: raw})
			if reason, st := wantStatus(t, err, codes.InvalidArgument); reason != want {
				t.Errorf("base %s: CreateLink(%q): reason %q (%s), want %s", base, raw, reason, st.Message(), want)
			}
			_, err = tc.sh.api.UpdateLink(ctx, &shortenerv1.UpdateLinkRequest{
				Link:       &shortenerv1.Link{Code: code, LongUrl: raw},
				UpdateMask: &fieldmaskpb.FieldMask{Paths: []string{"long_url"}},
			})
			if reason, st := wantStatus(t, err, codes.InvalidArgument); reason != want {
				t.Errorf("base %s: UpdateLink(%q): reason %q (%s), want %s", base, raw, reason, st.Message(), want)
			}
		}
		got, err := tc.sh.api.GetLink(ctx, &shortenerv1.GetLinkRequest{Code: code})
		if err != nil || got.GetLink().GetLongUrl() != "https://example.com/kept" {
			t.Errorf("base %s: the link after refused updates: %v %v; want it unchanged", base, got.GetLink(), err)
		}
		if e, found, err := linkcache.Get(context.Background(), rdb, code); err != nil || !found || e.URL != "https://example.com/kept" {
			t.Errorf("base %s: cache entry after refused updates: %+v found=%v err=%v", base, e, found, err)
		}
		for _, raw := range tc.fine {
			if _, err := tc.sh.api.CreateLink(ctx, &shortenerv1.CreateLinkRequest{LongUrl: raw}); err != nil {
				t.Errorf("base %s: CreateLink(%q), another host: %v; want it created", base, raw, err)
			}
		}
	}
	var n int
	if err := db.QueryRow(context.Background(), `SELECT count(*) FROM links WHERE tenant = $1`, tenant).Scan(&n); err != nil {
		t.Fatal(err)
	}
	if want := 2 + 3 + 1; n != want {
		t.Errorf("%d links stored, want %d (the two kept links and the other hosts only)", n, want)
	}
}

// TestUnsignedCallsAreRefusedBeforeTheirRequestArrives: a call without a
// valid service assertion is refused (UNAUTHENTICATED) when its headers
// arrive, while its request is still unsent, and counted in
// kurz_grpc_calls_refused_total: a stranger who reaches the gRPC port
// cannot make the shortener hold a request of up to its receive size (4
// MiB) per call it opens. Each request here declares almost 4 MiB, sends 32
// KiB and stalls; a server that read it first would never answer.
func TestUnsignedCallsAreRefusedBeforeTheirRequestArrives(t *testing.T) {
	sh := start(t, nil, hooks{})
	const method = "/kurz.shortener.v1.ShortenerService/CreateLink"
	// Signed with the key, but for another method: as good as none.
	otherMethod := servertest.ServiceAuthKeys().Sign("acme", "/kurz.shortener.v1.ShortenerService/GetLink")
	for name, headers := range map[string][]hpack.HeaderField{
		"no assertion":                 {},
		"assertion for another method": {{Name: svcauth.AssertionKey, Value: otherMethod}},
	} {
		got, err := servertest.StallGRPCCall(sh.Server.GRPCAddr(), method, server.DefaultGRPCMaxRecvMsgSize-64, 32<<10, 5*time.Second, headers...)
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		if got.Status != int(codes.Unauthenticated) {
			t.Errorf("%s: grpc-status %d (%q) after %d bytes of the request, want %d (Unauthenticated)", name, got.Status, got.Message, got.Sent, codes.Unauthenticated)
		}
	}
	// Refused calls of no other kind are counted here: the sum is theirs.
	if got := metricValue(t, sh.Running, "kurz_grpc_calls_refused_total"); got != 2 {
		t.Errorf("kurz_grpc_calls_refused_total %v after two unsigned calls, want 2", got)
	}
}
