//go:build integration

package app

import (
	"context"
	"net/http"
	"testing"
	"time"

	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"

	"kurz.dev/pkg/testkit/limitertest"
	"kurz.dev/pkg/testkit/servertest"
)

// TestTraceRedirectClick: a redirect has exactly one server span (the
// server's HTTP middleware's; the handler starts none), and the click event
// XADDed to the real stream carries that span's context as traceparent, so
// the consumer's processing can link back to it. Without an incoming
// traceparent the span is a root; with one it continues the caller's trace.
// Probes (HTTP and gRPC health) and scrapes make no spans.
func TestTraceRedirectClick(t *testing.T) {
	f := newFixture(t)
	code := f.code()
	f.insert(code, "acme", "https://example.com/traced", 0, nil, false)
	since := time.Now().Add(-time.Second)

	rec := tracetest.NewSpanRecorder()
	cfg := load(t, map[string]string{
		"KURZ_REDIRECT_VISITOR_SALT":         testSalt,
		"KURZ_LIMITER_GRPC_ADDR":             limitertest.Start(t, limitertest.AllowAll).Addr(),
		"KURZ_REDIRECT_CLICK_FLUSH_INTERVAL": "20ms",
		// The caller is a trusted proxy: only theirs is a trace continued
		// (pkg/server: TestTraceContextOnlyFromTrustedRequests).
		"KURZ_REDIRECT_TRUSTED_PROXIES": "127.0.0.1/32,::1",
	})
	cfg.Telemetry.SpanProcessor = rec
	srv, err := build(context.Background(), cfg, servertest.Logger(t), hooks{})
	if err != nil {
		t.Fatalf("build: %v", err)
	}
	r := servertest.Start(t, srv)
	r.AwaitServing(t, "")

	const callerTrace, callerSpan = "4bf92f3577b34da6a3ce929d0e0e4736", "00f067aa0ba902b7"
	if resp := get(t, r.HTTP, "/"+code); resp.StatusCode != http.StatusFound {
		t.Fatalf("redirect: %d", resp.StatusCode)
	}
	if resp := get(t, r.HTTP, "/"+code, "traceparent", "00-"+callerTrace+"-"+callerSpan+"-01"); resp.StatusCode != http.StatusFound {
		t.Fatalf("redirect with traceparent: %d", resp.StatusCode)
	}
	if status, _ := r.Get(t, "/healthz"); status != http.StatusOK {
		t.Fatalf("/healthz: %d", status)
	}
	for _, path := range []string{"/healthz", "/readyz", "/metrics"} {
		if status, _ := r.GetOps(t, path); status != http.StatusOK {
			t.Fatalf("ops %s: %d", path, status)
		}
	}
	if err := r.Stop(); err != nil { // flushes the click buffer and ends every span
		t.Fatal(err)
	}

	spans := rec.Ended()
	var servers []sdktrace.ReadOnlySpan
	for _, s := range spans {
		if s.SpanKind() == trace.SpanKindServer {
			servers = append(servers, s)
		}
		for _, kv := range s.Attributes() {
			if kv.Key == "url.path" && kv.Value.AsString() != "/"+code {
				t.Errorf("span %q for %s: ops routes must not be traced", s.Name(), kv.Value.AsString())
			}
		}
	}
	if len(servers) != 2 {
		for _, s := range spans {
			t.Logf("span %q kind=%v trace=%s span=%s parent=%s", s.Name(), s.SpanKind(), s.SpanContext().TraceID(), s.SpanContext().SpanID(), s.Parent().SpanID())
		}
		t.Fatalf("%d server spans for 2 redirects: want exactly one each", len(servers))
	}
	byTraceParent := map[string]sdktrace.ReadOnlySpan{}
	for _, s := range servers {
		if s.Name() != "GET /{code}" {
			t.Errorf("server span name %q: want the route, GET /{code}", s.Name())
		}
		byTraceParent["00-"+s.SpanContext().TraceID().String()+"-"+s.SpanContext().SpanID().String()+"-01"] = s
	}

	byShard, total := streamEvents(t, f.rdb, cfg.Streams.Shards, code, since)
	if total != 2 {
		t.Fatalf("%d click events for 2 redirects", total)
	}
	continued := 0
	for _, events := range byShard {
		for _, e := range events {
			s, ok := byTraceParent[e.TraceParent]
			if !ok {
				t.Errorf("click traceparent %q is not the context of a redirect server span", e.TraceParent)
				continue
			}
			delete(byTraceParent, e.TraceParent) // one event per span
			switch p := s.Parent(); {
			case !p.IsValid():
			case p.IsRemote() && p.TraceID().String() == callerTrace && p.SpanID().String() == callerSpan:
				continued++
			default:
				t.Errorf("server span parent %s/%s: want none or the caller's", p.TraceID(), p.SpanID())
			}
		}
	}
	if continued != 1 {
		t.Errorf("%d server spans continue the caller's trace: want 1", continued)
	}
}

// TestMetricFamilies: after traffic, /metrics has the redirect's key
// families: requests by source and status, latency by source, click events
// written and dropped (the drop series at 0 from the start), the otelhttp
// server duration and the quota client's calls.
func TestMetricFamilies(t *testing.T) {
	f := newFixture(t)
	code := f.code()
	f.insert(code, "acme", "https://example.com/metrics", 0, nil, false)
	r := start(t, map[string]string{"KURZ_REDIRECT_CLICK_FLUSH_INTERVAL": "20ms"}, hooks{})
	for range 3 { // db, then l1
		if resp := get(t, r.HTTP, "/"+code); resp.StatusCode != http.StatusFound {
			t.Fatalf("redirect: %d", resp.StatusCode)
		}
	}
	get(t, r.HTTP, "/"+f.code()) // a miss: asks the limiter
	want := []struct {
		name string
		with []string
	}{
		{"kurz_redirect_requests_total", []string{`source="db"`, `status="302"`}},
		{"kurz_redirect_requests_total", []string{`source="l1"`}},
		{"kurz_redirect_duration_seconds_bucket", []string{`source="l1"`}},
		{"kurz_redirect_click_events_dropped_total", []string{`reason="buffer_full"`}},
		{"kurz_redirect_click_events_dropped_total", []string{`reason="redis"`}},
		{"kurz_redirect_click_events_written_total", nil},
		{"http_server_request_duration_seconds_count", []string{`http_request_method="GET"`}},
		{"kurz_quota_calls_total", nil},
	}
	var body string
	ok := servertest.Eventually(5*time.Second, func() bool {
		_, body = r.GetOps(t, "/metrics")
		for _, w := range want {
			if !servertest.HasSeries(body, w.name, w.with...) {
				return false
			}
		}
		return true
	})
	if !ok {
		for _, w := range want {
			if !servertest.HasSeries(body, w.name, w.with...) {
				t.Errorf("/metrics has no %s series with %v", w.name, w.with)
			}
		}
	}
}
