package server_test

import (
	"context"
	"net/http"
	"testing"

	"go.opentelemetry.io/otel/trace"

	"kurz.dev/pkg/server"
	"kurz.dev/pkg/testkit/servertest"
)

// A listener whose trace context is trusted only from some requests drops
// the others' trace headers before anything reads them: a stranger neither
// joins a trace of its choosing nor puts its trace ID into log lines.
func TestTraceContextOnlyFromTrustedRequests(t *testing.T) {
	log := servertest.Logger(t)
	srv, err := server.New(context.Background(), "trace-test",
		server.Config{GRPCAddr: "127.0.0.1:0", HTTPAddr: "127.0.0.1:0"}, server.NewLifecycle(log, 0), log)
	if err != nil {
		t.Fatal(err)
	}
	seen := make(chan string, 1)
	srv.Mux.HandleFunc("GET /t", func(w http.ResponseWriter, r *http.Request) {
		sc := trace.SpanContextFromContext(r.Context())
		got := ""
		if sc.IsValid() {
			got = sc.TraceID().String()
		}
		seen <- got + "|" + r.Header.Get("Traceparent")
	})
	srv.TrustTraceContextFrom(func(r *http.Request) bool { return r.Header.Get("X-Test-Trusted") == "yes" })
	running := servertest.Start(t, srv)
	const traceID = "4bf92f3577b34da6a3ce929d0e0e4736"
	for _, tc := range []struct {
		trusted string
		want    string
	}{{"yes", traceID + "|00-" + traceID + "-00f067aa0ba902b7-01"}, {"", "|"}} {
		req, _ := http.NewRequest(http.MethodGet, running.HTTP+"/t", nil)
		req.Header.Set("Traceparent", "00-"+traceID+"-00f067aa0ba902b7-01")
		req.Header.Set("Tracestate", "x=y")
		req.Header.Set("X-Test-Trusted", tc.trusted)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		_ = resp.Body.Close()
		if got := <-seen; got != tc.want {
			t.Errorf("trusted %q: the handler saw trace %q, want %q", tc.trusted, got, tc.want)
		}
	}
}
