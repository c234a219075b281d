package telemetry

import (
	"context"
	"fmt"
	"maps"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"
)

func TestHTTPServerRecordsRouteAndStatus(t *testing.T) {
	tel := setup(t, Config{}, "web")
	mux := http.NewServeMux()
	var seen trace.SpanContext
	mux.HandleFunc("GET /{code}", func(w http.ResponseWriter, r *http.Request) {
		seen = trace.SpanContextFromContext(r.Context())
		if _, ok := w.(http.Flusher); !ok {
			t.Error("the wrapped writer lost http.Flusher")
		}
		http.Redirect(w, r, "https://example.com/", http.StatusFound)
	})
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) {})
	h := tel.HTTPServer("web", mux, func(r *http.Request) bool { return r.URL.Path == "/healthz" })

	req := httptest.NewRequest("GET", "/abc", nil)
	req.Header.Set("traceparent", "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01")
	h.ServeHTTP(httptest.NewRecorder(), req)
	h.ServeHTTP(httptest.NewRecorder(), httptest.NewRequest("GET", "/healthz", nil))
	h.ServeHTTP(httptest.NewRecorder(), httptest.NewRequest("BREW", "/abc", nil))

	if seen.TraceID().String() != "4bf92f3577b34da6a3ce929d0e0e4736" {
		t.Errorf("handler context in trace %s, want the caller's", seen.TraceID())
	}
	text := scrape(t, tel)
	for _, want := range []string{
		`http_server_request_duration_seconds_count{http_request_method="GET",http_response_status_code="302",http_route="GET /{code}"`,
		`http_server_request_duration_seconds_count{http_request_method="_OTHER",http_response_status_code="405"`,
	} {
		if !strings.Contains(text, want) {
			t.Errorf("no series %s in:\n%s", want, text)
		}
	}
	if strings.Contains(text, "healthz") {
		t.Error("a skipped request was recorded")
	}
}

func TestHTTPServerSpansOnlyWhenRecorded(t *testing.T) {
	rec := tracetest.NewSpanRecorder()
	tel := setup(t, Config{SpanProcessor: rec}, "web")
	mux := http.NewServeMux()
	mux.HandleFunc("GET /{code}", func(w http.ResponseWriter, _ *http.Request) {})
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) {})
	h := tel.HTTPServer("web", mux, func(r *http.Request) bool { return r.URL.Path == "/healthz" })
	h.ServeHTTP(httptest.NewRecorder(), httptest.NewRequest("GET", "/abc", nil))
	h.ServeHTTP(httptest.NewRecorder(), httptest.NewRequest("GET", "/healthz", nil))
	_ = tel.Shutdown(context.Background())
	ended := rec.Ended()
	if len(ended) != 1 || ended[0].Name() != "GET /{code}" {
		var names []string
		for _, s := range ended {
			names = append(names, s.Name())
		}
		t.Fatalf("spans %v: want one, GET /{code} (none for skipped requests)", names)
	}
}

// What a stranger sends does not size or name spans: a 60 KB User-Agent
// is cut to MaxAttributeValue, and a made-up method that no route took
// names its span "_OTHER", as the metrics count it.
func TestHTTPSpansBoundWhatClientsChoose(t *testing.T) {
	rec := tracetest.NewSpanRecorder()
	tel := setup(t, Config{SpanProcessor: rec}, "web")
	mux := http.NewServeMux()
	mux.HandleFunc("GET /{code}", func(w http.ResponseWriter, _ *http.Request) {})
	h := tel.HTTPServer("web", mux, nil)
	big := httptest.NewRequest("GET", "/abc", nil)
	big.Header.Set("User-Agent", strings.Repeat("a", 60_000))
	h.ServeHTTP(httptest.NewRecorder(), big)
	for i := range 3 {
		h.ServeHTTP(httptest.NewRecorder(), httptest.NewRequest(fmt.Sprintf("MADE-UP-%d", i), "/nothing/here", nil))
	}
	_ = tel.Shutdown(context.Background())
	names := map[string]int{}
	for _, s := range rec.Ended() {
		names[s.Name()]++
		for _, kv := range s.Attributes() {
			if n := len(kv.Value.Emit()); n > MaxAttributeValue {
				t.Errorf("span %s: attribute %s is %d bytes long, want at most %d", s.Name(), kv.Key, n, MaxAttributeValue)
			}
		}
	}
	if want := map[string]int{"GET /{code}": 1, "_OTHER": 3}; !maps.Equal(names, want) {
		t.Errorf("span names %v, want %v", names, want)
	}
}
