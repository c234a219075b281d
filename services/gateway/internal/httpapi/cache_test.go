package httpapi

import (
	"context"
	"log/slog"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"

	shortenerv1 "kurz.dev/gen/kurz/shortener/v1"
)

// qrShortener answers GetLink with a link that has a short URL.
type qrShortener struct {
	shortenerv1.ShortenerServiceClient
}

func (qrShortener) GetLink(_ context.Context, in *shortenerv1.GetLinkRequest, _ ...grpc.CallOption) (*shortenerv1.GetLinkResponse, error) {
	return &shortenerv1.GetLinkResponse{Link: &shortenerv1.Link{Code: in.GetCode(), ShortUrl: "https://kurz.example/" + in.GetCode()}}, nil
}

// A tenant's JSON answers and every error are Cache-Control: no-store (no
// proxy or browser cache keeps a tenant's links for the next one); the
// answers whose caching is chosen on purpose keep it: the QR image
// (private, an hour) and the OpenAPI document (public).
func TestJSONAnswersAreNotStored(t *testing.T) {
	a := &API{opts: Options{MaxBodyBytes: 1024, CallTimeout: time.Second}, shortener: qrShortener{}, log: slog.New(slog.DiscardHandler)}
	for _, tc := range []struct {
		pattern, target, contentType, cache string
	}{
		{"GET /v1/links/{code}", "/v1/links/abcd123", "application/json", "no-store"},
		{"GET /v1/links/{code}/qr", "/v1/links/abcd123/qr", "image/png", "private, max-age=3600"},
		{"GET /v1/openapi.json", "/v1/openapi.json", "application/json", "public, max-age=300"},
	} {
		r := httptest.NewRequest("GET", tc.target, nil)
		r.SetPathValue("code", "abcd123")
		w := httptest.NewRecorder()
		if err := a.routeHandler(tc.pattern)(&call{w: w, r: r, st: &reqState{id: "t", tenant: "acme"}}); err != nil {
			t.Fatalf("%s: %v", tc.target, err)
		}
		if got := w.Header(); got.Get("Content-Type") != tc.contentType || got.Get("Cache-Control") != tc.cache {
			t.Errorf("GET %s: %s with Cache-Control %q, want %s with %q", tc.target, got.Get("Content-Type"), got.Get("Cache-Control"), tc.contentType, tc.cache)
		}
	}

	w := httptest.NewRecorder()
	writeJSON(w, 201, map[string]string{"key": "kurz_x"})
	if got := w.Header().Get("Cache-Control"); got != "no-store" {
		t.Errorf("writeJSON: Cache-Control %q, want no-store", got)
	}

	// An error after the handler chose its caching (a QR image that could
	// not be drawn) is not stored either.
	w = httptest.NewRecorder()
	w.Header().Set("Cache-Control", "private, max-age=3600")
	writeError(w, "req-1", notFound("no link with this code"))
	if got := w.Header(); got.Get("Cache-Control") != "no-store" || !strings.HasPrefix(got.Get("Content-Type"), "application/problem+json") {
		t.Errorf("error answer: %s with Cache-Control %q, want problem+json with no-store", got.Get("Content-Type"), got.Get("Cache-Control"))
	}
}
