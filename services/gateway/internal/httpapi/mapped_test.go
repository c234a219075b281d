package httpapi

import (
	"context"
	"log/slog"
	"net/http/httptest"
	"reflect"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"

	shortenerv1 "kurz.dev/gen/kurz/shortener/v1"
	"kurz.dev/pkg/callmeta"
	"kurz.dev/pkg/rpcerr"
)

// routeHandler returns the handler the route table gives pattern (the
// generated one's, for a mapped route), for tests that call a route
// after admission.
func (a *API) routeHandler(pattern string) func(*call) error {
	for _, rt := range a.table() {
		if rt.pattern != pattern {
			continue
		}
		if rt.rpc != nil {
			return a.serveMapped(rt.pattern, *rt.rpc)
		}
		return rt.handle
	}
	panic("no route " + pattern)
}

// mdShortener records the outgoing metadata and deadline of GetLink.
type mdShortener struct {
	shortenerv1.ShortenerServiceClient
	md       metadata.MD
	deadline time.Duration
}

func (s *mdShortener) GetLink(ctx context.Context, in *shortenerv1.GetLinkRequest, _ ...grpc.CallOption) (*shortenerv1.GetLinkResponse, error) {
	s.md, _ = metadata.FromOutgoingContext(ctx)
	if d, ok := ctx.Deadline(); ok {
		s.deadline = time.Until(d)
	}
	return &shortenerv1.GetLinkResponse{Link: &shortenerv1.Link{Code: in.GetCode(), Password: "hunter22"}}, nil
}

// A mapped route's call carries the tenant, client IP and request ID the
// gateway attaches, under the gateway's call timeout, and nothing of the client's
// request headers: not its API key (grpc-gateway passes Authorization on by
// default), not grpc-gateway's forwarding metadata, not a Grpc-Timeout of
// its choosing. The answer leaves Link's input-only password out.
func TestMappedCallCarriesOnlyTheGatewaysMetadata(t *testing.T) {
	sh := &mdShortener{}
	a := &API{opts: Options{MaxBodyBytes: 1024, CallTimeout: 3 * time.Second}, shortener: sh, log: slog.New(slog.DiscardHandler)}
	r := httptest.NewRequest("GET", "/v1/links/abcd123", nil)
	r.SetPathValue("code", "abcd123")
	r.Header.Set("Authorization", "Bearer kurz_secret")
	r.Header.Set("Grpc-Metadata-X-Kurz-Tenant", "someone-else")
	r.Header.Set("Grpc-Timeout", "1H")
	r.Header.Set("X-Forwarded-For", "198.51.100.1")
	w := httptest.NewRecorder()
	if err := a.routeHandler("GET /v1/links/{code}")(&call{w: w, r: r, st: &reqState{id: "t", ip: "203.0.113.9", tenant: "acme"}}); err != nil {
		t.Fatal(err)
	}
	want := metadata.MD{callmeta.TenantKey: {"acme"}, callmeta.ClientIPKey: {"203.0.113.9"}, callmeta.RequestIDKey: {"t"}}
	if !reflect.DeepEqual(sh.md, want) {
		t.Errorf("metadata sent = %v, want only %v", sh.md, want)
	}
	if sh.deadline <= 0 || sh.deadline > 3*time.Second {
		t.Errorf("call deadline in %v, want within the call timeout of 3s", sh.deadline)
	}
	if w.Code != 200 || !strings.HasPrefix(w.Body.String(), `{"code":"abcd123",`) || strings.Contains(w.Body.String(), "password\"") {
		t.Errorf("answer %d %s, want the link without its password", w.Code, w.Body)
	}
}

// statusShortener answers CreateLink and DeleteLink, and refuses GetLink as
// the shortener does an unknown code.
type statusShortener struct {
	shortenerv1.ShortenerServiceClient
}

// CreateLink creates a link, except for CODE_MODE_FROM_URL, where it
// returns the link that exists.
func (statusShortener) CreateLink(_ context.Context, req *shortenerv1.CreateLinkRequest, _ ...grpc.CallOption) (*shortenerv1.CreateLinkResponse, error) {
	return &shortenerv1.CreateLinkResponse{Link: &shortenerv1.Link{Code: "10000g8"},
		Created: req.GetMode() != shortenerv1.CodeMode_CODE_MODE_FROM_URL}, nil
}

func (statusShortener) DeleteLink(context.Context, *shortenerv1.DeleteLinkRequest, ...grpc.CallOption) (*shortenerv1.DeleteLinkResponse, error) {
	return &shortenerv1.DeleteLinkResponse{}, nil
}

func (statusShortener) GetLink(context.Context, *shortenerv1.GetLinkRequest, ...grpc.CallOption) (*shortenerv1.GetLinkResponse, error) {
	return nil, rpcerr.WithDetails(codes.NotFound, "no link with this code", rpcerr.Info("CODE_NOT_FOUND", nil))
}

// The mapped routes answer as the gateway always did: a create 201 with
// Location (200 when it found the link of its URL), a delete 204 without a body, a refusal as the service's status
// mapped to its HTTP error, with the service's message.
func TestMappedStatuses(t *testing.T) {
	a := &API{opts: Options{MaxBodyBytes: 1024, CallTimeout: time.Second}, shortener: statusShortener{}, log: slog.New(slog.DiscardHandler)}
	for _, tc := range []struct {
		pattern, target, body string
		status                int
		location, text        string
	}{
		{"POST /v1/links", "/v1/links", `{"longUrl":"https://example.com/"}`, 201, "/v1/links/10000g8", `{"code":"10000g8",`},
		{"POST /v1/links", "/v1/links", `{"longUrl":"https://example.com/","mode":"CODE_MODE_FROM_URL"}`, 200, "/v1/links/10000g8", `{"code":"10000g8",`},
		{"DELETE /v1/links/{code}", "/v1/links/10000g8", "", 204, "", ""},
		{"GET /v1/links/{code}", "/v1/links/10000g8", "", 404, "", "no link with this code"},
	} {
		method, _, _ := strings.Cut(tc.pattern, " ")
		r := httptest.NewRequest(method, tc.target, strings.NewReader(tc.body))
		r.SetPathValue("code", "10000g8")
		w := httptest.NewRecorder()
		err := a.routeHandler(tc.pattern)(&call{w: w, r: r, st: &reqState{id: "t", tenant: "acme"}})
		status, text, body := w.Code, w.Body.String(), w.Body.String()
		if err != nil {
			e := toAPIError(err)
			status, text, body = e.status, e.message, ""
		}
		if status != tc.status || w.Header().Get("Location") != tc.location || !strings.Contains(text, tc.text) {
			t.Errorf("%s: %d Location %q %q, want %d Location %q and %q", tc.pattern, status, w.Header().Get("Location"), text, tc.status, tc.location, tc.text)
		}
		if tc.status == 204 && (body != "" || w.Header().Get("Content-Type") != "") {
			t.Errorf("%s: 204 with Content-Type %q and body %q", tc.pattern, w.Header().Get("Content-Type"), body)
		}
	}
}

// webhookFake answers the WebhookService's calls.
type webhookFake struct {
	shortenerv1.WebhookServiceClient
	listed *shortenerv1.ListWebhookDeliveriesRequest
}

func (webhookFake) CreateWebhook(context.Context, *shortenerv1.CreateWebhookRequest, ...grpc.CallOption) (*shortenerv1.CreateWebhookResponse, error) {
	return &shortenerv1.CreateWebhookResponse{Webhook: &shortenerv1.Webhook{Id: "wh_1"}, Secret: "whsec_x", Created: true}, nil
}

func (webhookFake) DeleteWebhook(context.Context, *shortenerv1.DeleteWebhookRequest, ...grpc.CallOption) (*shortenerv1.DeleteWebhookResponse, error) {
	return &shortenerv1.DeleteWebhookResponse{}, nil
}

func (f *webhookFake) ListWebhookDeliveries(_ context.Context, in *shortenerv1.ListWebhookDeliveriesRequest, _ ...grpc.CallOption) (*shortenerv1.ListWebhookDeliveriesResponse, error) {
	f.listed = in
	return &shortenerv1.ListWebhookDeliveriesResponse{}, nil
}

func (webhookFake) RedeliverWebhookDelivery(_ context.Context, in *shortenerv1.RedeliverWebhookDeliveryRequest, _ ...grpc.CallOption) (*shortenerv1.RedeliverWebhookDeliveryResponse, error) {
	return &shortenerv1.RedeliverWebhookDeliveryResponse{Delivery: &shortenerv1.WebhookDelivery{Id: in.GetId(), WebhookId: in.GetWebhookId()}}, nil
}

// The webhook routes are mapped: a create answers 201 with the secret and
// Cache-Control: no-store, a delete 204, a redeliver the delivery itself
// (response_body); the deliveries' page size and status are checked before
// the service is asked, and the path and query reach it.
func TestMappedWebhookRoutes(t *testing.T) {
	wh := &webhookFake{}
	a := &API{opts: Options{MaxBodyBytes: 1024, CallTimeout: time.Second}, shortener: statusShortener{}, webhooks: wh, log: slog.New(slog.DiscardHandler)}
	for _, tc := range []struct {
		pattern, target, body string
		path                  map[string]string
		status                int
		cache, text           string
	}{
		{"POST /v1/webhooks", "/v1/webhooks", `{"url":"https://hooks.example.com/"}`, nil, 201, "no-store", `"secret":"whsec_x"`},
		{"DELETE /v1/webhooks/{id}", "/v1/webhooks/wh_1", "", map[string]string{"id": "wh_1"}, 204, "", ""},
		{"POST /v1/webhooks/{webhookId}/deliveries/{id}/redeliver", "/v1/webhooks/wh_1/deliveries/evt_2/redeliver", "",
			map[string]string{"webhookId": "wh_1", "id": "evt_2"}, 200, "no-store", `{"id":"evt_2","webhookId":"wh_1"`},
		{"GET /v1/webhooks/{webhookId}/deliveries", "/v1/webhooks/wh_1/deliveries?page_size=101", "", map[string]string{"webhookId": "wh_1"}, 400, "", "page_size"},
		{"GET /v1/webhooks/{webhookId}/deliveries", "/v1/webhooks/wh_1/deliveries?status=dead", "", map[string]string{"webhookId": "wh_1"}, 400, "", "status must be"},
		{"DELETE /v1/webhooks/{id}", "/v1/webhooks/" + strings.Repeat("x", 65), "", map[string]string{"id": strings.Repeat("x", 65)}, 400, "", "1 to 64 characters"},
		// %2F, decoded: a 400, not a route the mapped table cannot find (500).
		{"DELETE /v1/webhooks/{id}", "/v1/webhooks/a%2Fb", "", map[string]string{"id": "a/b"}, 400, "", "without '/'"},
		{"GET /v1/webhooks/{webhookId}/deliveries", "/v1/webhooks/a%2Fb/deliveries", "", map[string]string{"webhookId": "a/b"}, 400, "", "without '/'"},
		{"GET /v1/webhooks/{webhookId}/deliveries", "/v1/webhooks/wh_1/deliveries?page_size=5&status=WEBHOOK_DELIVERY_STATUS_DEAD", "", map[string]string{"webhookId": "wh_1"}, 200, "no-store", "{"},
	} {
		method, _, _ := strings.Cut(tc.pattern, " ")
		r := httptest.NewRequest(method, tc.target, strings.NewReader(tc.body))
		for k, v := range tc.path {
			r.SetPathValue(k, v)
		}
		w := httptest.NewRecorder()
		err := a.routeHandler(tc.pattern)(&call{w: w, r: r, st: &reqState{id: "t", tenant: "acme"}})
		status, text := w.Code, w.Body.String()
		if err != nil {
			e := toAPIError(err)
			status, text = e.status, e.message
		}
		if status != tc.status || w.Header().Get("Cache-Control") != tc.cache || !strings.Contains(text, tc.text) {
			t.Errorf("%s %s: %d Cache-Control %q %q, want %d %q and %q", method, tc.target, status, w.Header().Get("Cache-Control"), text, tc.status, tc.cache, tc.text)
		}
	}
	r := httptest.NewRequest("POST", "/v1/webhooks", strings.NewReader(`{"url":"https://hooks.example.com/"}`))
	w := httptest.NewRecorder()
	if err := a.routeHandler("POST /v1/webhooks")(&call{w: w, r: r, st: &reqState{id: "t", tenant: "acme"}}); err != nil || w.Code != 201 ||
		w.Header().Get("Location") != "/v1/webhooks" {
		t.Errorf("POST /v1/webhooks: %v, %d Location %q; want 201 Location /v1/webhooks", err, w.Code, w.Header().Get("Location"))
	}
	if got := wh.listed; got.GetWebhookId() != "wh_1" || got.GetPageSize() != 5 || got.GetStatus() != shortenerv1.WebhookDeliveryStatus_WEBHOOK_DELIVERY_STATUS_DEAD {
		t.Errorf("ListWebhookDeliveries got %v, want wh_1, 5, DEAD", got)
	}
}

// A stats time whose offset's '+' was sent unencoded (a space once the
// query is parsed) is refused with a message saying to send it as %2B.
func TestStatsTimeWithAnUnencodedPlusSaysToEncodeIt(t *testing.T) {
	a := &API{opts: Options{CallTimeout: time.Second}, shortener: statusShortener{}, log: slog.New(slog.DiscardHandler)}
	r := httptest.NewRequest("GET", "/v1/links/10000g8/stats?start_time=2026-01-02T15:04:05+02:00", nil)
	r.SetPathValue("code", "10000g8")
	err := a.routeHandler("GET /v1/links/{code}/stats")(&call{w: httptest.NewRecorder(), r: r, st: &reqState{id: "t", tenant: "acme"}})
	if e := toAPIError(err); err == nil || e.status != 400 || !strings.Contains(e.message, "%2B") {
		t.Errorf("start_time with an unencoded '+': %v, want 400 saying to send it as %%2B", err)
	}
}

// An empty page_size or status in a listing's query is refused with the
// message a wrong value gets, not grpc-gateway's parser text.
func TestEmptyListParametersGetTheClearError(t *testing.T) {
	a := &API{opts: Options{MaxBodyBytes: 1024, CallTimeout: time.Second}, shortener: statusShortener{}, webhooks: &webhookFake{}, log: slog.New(slog.DiscardHandler)}
	for _, tc := range []struct{ pattern, target, want string }{
		{"GET /v1/links", "/v1/links?page_size=", "page_size must be a whole number from 1 to 1000"},
		{"GET /v1/webhooks/{webhookId}/deliveries", "/v1/webhooks/wh_1/deliveries?page_size=", "page_size must be a whole number from 1 to 100"},
		{"GET /v1/webhooks/{webhookId}/deliveries", "/v1/webhooks/wh_1/deliveries?status=", "status must be WEBHOOK_DELIVERY_STATUS_PENDING"},
	} {
		r := httptest.NewRequest("GET", tc.target, nil)
		r.SetPathValue("webhookId", "wh_1")
		w := httptest.NewRecorder()
		err := a.routeHandler(tc.pattern)(&call{w: w, r: r, st: &reqState{id: "t", tenant: "acme"}})
		if e := toAPIError(err); err == nil || e.status != 400 || !strings.Contains(e.message, tc.want) {
			t.Errorf("GET %s: %v, want 400 %q", tc.target, err, tc.want)
		}
	}
}
