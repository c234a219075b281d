//go:build integration

package app

import (
	"net/http"
	"slices"
	"testing"
	"time"

	"go.opentelemetry.io/contrib/instrumentation/google.golang.org/grpc/otelgrpc"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	semconv "go.opentelemetry.io/otel/semconv/v1.40.0"
	"go.opentelemetry.io/otel/trace"
	"google.golang.org/grpc"

	"kurz.dev/pkg/testkit/limitertest"
	"kurz.dev/pkg/testkit/servertest"
	"kurz.dev/services/shortener/shortenertest"
)

// TestTraceLinkCreation: one POST /v1/links is one trace, from the gateway's
// HTTP server span through the shortener's CreateLink server span to the
// limiter's CheckQuota server span that the shortener's quota check causes.
// Every service records into one in-memory span recorder (each under its own
// service.name); the limiter is the fake one with an otelgrpc handler, since
// the point is the propagation through our clients and servers.
func TestTraceLinkCreation(t *testing.T) {
	rec := tracetest.NewSpanRecorder()
	limiterTP := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec),
		sdktrace.WithResource(resource.NewSchemaless(semconv.ServiceName("limiter"))))
	lim := limitertest.Start(t, limitertest.AllowAll,
		grpc.StatsHandler(otelgrpc.NewServerHandler(otelgrpc.WithTracerProvider(limiterTP))))
	sh := shortenertest.Start(t, map[string]string{
		"KURZ_LIMITER_GRPC_ADDR":         lim.Addr(),
		"KURZ_SHORTENER_LIMITER_TIMEOUT": "1s",
		"KURZ_SHORTENER_BASE_URL":        shortBase,
		"KURZ_SHORTENER_ALLOW_ANONYMOUS": "false",
		"KURZ_LOG_LEVEL":                 "warn",
	}, shortenertest.WithSpanProcessor(rec))
	gw := startGateway(t, map[string]string{
		"KURZ_LIMITER_GRPC_ADDR":   lim.Addr(),
		"KURZ_SHORTENER_GRPC_ADDR": sh.Server.GRPCAddr(),
	}, func(c *Config) { c.Telemetry.SpanProcessor = rec })

	tn := newTenant(t, gw, "free")
	r := newClient(t, gw, tn.key).do("POST", "/v1/links", `{"longUrl":"https://example.com/traced"}`)
	if r.code != http.StatusCreated {
		t.Fatalf("create: %s", r)
	}

	// A server span ends after its response is on the wire: wait (bounded)
	// for the spans, not for a guessed time.
	var root, createLink, checkQuota sdktrace.ReadOnlySpan
	var spans []sdktrace.ReadOnlySpan
	found := servertest.Eventually(10*time.Second, func() bool {
		spans = rec.Ended()
		root = find(spans, func(s sdktrace.ReadOnlySpan) bool {
			return service(s) == "gateway" && s.SpanKind() == trace.SpanKindServer &&
				hasAttr(s, "http.request.method", "POST") && hasAttr(s, "url.path", "/v1/links")
		})
		if root == nil {
			return false
		}
		inTrace := func(s sdktrace.ReadOnlySpan) bool { return s.SpanContext().TraceID() == root.SpanContext().TraceID() }
		createLink = find(spans, func(s sdktrace.ReadOnlySpan) bool {
			return inTrace(s) && service(s) == "shortener" && s.SpanKind() == trace.SpanKindServer &&
				s.Name() == "kurz.shortener.v1.ShortenerService/CreateLink"
		})
		checkQuota = find(spans, func(s sdktrace.ReadOnlySpan) bool {
			return inTrace(s) && service(s) == "limiter" && s.SpanKind() == trace.SpanKindServer &&
				s.Name() == "kurz.ratelimit.v1.RateLimitService/CheckQuota" && descends(spans, s, createLink)
		})
		return createLink != nil && checkQuota != nil
	})
	if !found {
		for _, s := range spans {
			t.Logf("span %s %s %v trace=%s span=%s parent=%s", service(s), s.Name(), s.SpanKind(),
				s.SpanContext().TraceID(), s.SpanContext().SpanID(), s.Parent().SpanID())
		}
		t.Fatalf("want gateway POST /v1/links → shortener CreateLink → limiter CheckQuota in one trace; got root=%v createLink=%v checkQuota=%v",
			root != nil, createLink != nil, checkQuota != nil)
	}
	if root.Parent().IsValid() {
		t.Errorf("gateway span has parent %s: want a root span", root.Parent().SpanID())
	}
	if !descends(spans, createLink, root) {
		t.Errorf("shortener CreateLink span is not below the gateway's HTTP span")
	}
	// The hops in between are our clients' spans: a server span's parent is
	// the caller's client span, and that one lives in the caller's service.
	for _, hop := range []struct {
		server sdktrace.ReadOnlySpan
		caller string
	}{{createLink, "gateway"}, {checkQuota, "shortener"}} {
		parent := byID(spans, hop.server.Parent().SpanID())
		if parent == nil || parent.SpanKind() != trace.SpanKindClient || service(parent) != hop.caller || !hop.server.Parent().IsRemote() {
			t.Errorf("%s: parent should be a remote %s client span, got %v", hop.server.Name(), hop.caller, parent)
		}
	}
	if got := root.Name(); got != "POST /v1/links" {
		t.Errorf("gateway span name %q: want its route, POST /v1/links", got)
	}

	// The same traffic shows in both services' key metric families.
	t.Run("metrics", func(t *testing.T) {
		for _, svc := range []struct {
			name string
			r    *servertest.Running
			want [][]string // metric name, then label fragments
		}{
			{"gateway", gw, [][]string{
				{"kurz_gateway_requests_total", `route="POST /v1/links"`, `status="201"`},
				{"kurz_gateway_request_duration_seconds_bucket", `route="POST /v1/links"`},
				{"http_server_request_duration_seconds_count", `http_request_method="POST"`, `http_route="POST /v1/links"`},
				{"rpc_client_call_duration_seconds_count", "CreateLink"},
				{"kurz_quota_calls_total"},
			}},
			{"shortener", sh, [][]string{
				{"rpc_server_call_duration_seconds_count", "CreateLink"},
				{"rpc_client_call_duration_seconds_count", "CheckQuota"},
				{"kurz_shortener_links_created_total"},
			}},
		} {
			code, body := svc.r.GetOps(t, "/metrics")
			if code != http.StatusOK {
				t.Fatalf("%s /metrics: %d", svc.name, code)
			}
			for _, w := range svc.want {
				if !servertest.HasSeries(body, w[0], w[1:]...) {
					t.Errorf("%s /metrics has no %s series with %v", svc.name, w[0], w[1:])
				}
			}
		}
	})
}

// find returns the first span that matches, or nil.
func find(spans []sdktrace.ReadOnlySpan, match func(sdktrace.ReadOnlySpan) bool) sdktrace.ReadOnlySpan {
	if i := slices.IndexFunc(spans, match); i >= 0 {
		return spans[i]
	}
	return nil
}

func byID(spans []sdktrace.ReadOnlySpan, id trace.SpanID) sdktrace.ReadOnlySpan {
	return find(spans, func(s sdktrace.ReadOnlySpan) bool { return s.SpanContext().SpanID() == id })
}

// descends reports whether ancestor is on s's chain of recorded parents.
func descends(spans []sdktrace.ReadOnlySpan, s, ancestor sdktrace.ReadOnlySpan) bool {
	if s == nil || ancestor == nil {
		return false
	}
	for range len(spans) {
		if !s.Parent().IsValid() || s.Parent().TraceID() != ancestor.SpanContext().TraceID() {
			return false
		}
		if s.Parent().SpanID() == ancestor.SpanContext().SpanID() {
			return true
		}
		if s = byID(spans, s.Parent().SpanID()); s == nil {
			return false
		}
	}
	return false
}

func service(s sdktrace.ReadOnlySpan) string {
	v, _ := s.Resource().Set().Value(semconv.ServiceNameKey)
	return v.AsString()
}

func hasAttr(s sdktrace.ReadOnlySpan, key, want string) bool {
	for _, kv := range s.Attributes() {
		if kv.Key == attribute.Key(key) {
			return kv.Value.AsString() == want
		}
	}
	return false
}
