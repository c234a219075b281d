package quotaapi

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"

	ratelimitv1 "kurz.dev/gen/kurz/ratelimit/v1"
	"kurz.dev/pkg/clientip"
	"kurz.dev/pkg/testkit/servertest"
)

// recordingService records every RateLimitRequest and answers resp, or
// fails with err.
type recordingService struct {
	rlsv3.UnimplementedRateLimitServiceServer
	resp *rlsv3.RateLimitResponse
	err  error

	mu   sync.Mutex
	reqs []*rlsv3.RateLimitRequest
}

func (s *recordingService) ShouldRateLimit(_ context.Context, req *rlsv3.RateLimitRequest) (*rlsv3.RateLimitResponse, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.reqs = append(s.reqs, req)
	if s.err != nil {
		return nil, s.err
	}
	if s.resp == nil {
		return &rlsv3.RateLimitResponse{OverallCode: rlsv3.RateLimitResponse_OK}, nil
	}
	return s.resp, nil
}

// serveForwardAuth sends one forward-auth request to a ForwardAuth over
// svc (IPv6 clients keyed by their /64) and returns its answer.
func serveForwardAuth(t *testing.T, svc rlsv3.RateLimitServiceServer, method, target string, header http.Header) *httptest.ResponseRecorder {
	t.Helper()
	mux := http.NewServeMux()
	mux.Handle(ForwardAuthRoute, NewForwardAuth(svc, clientip.Keying{IPv6Prefix: 64}, NewInFlight(8), time.Second, servertest.Logger(t)))
	r := httptest.NewRequest(method, target, nil)
	for k, vs := range header {
		for _, v := range vs {
			r.Header.Add(k, v)
		}
	}
	w := httptest.NewRecorder()
	mux.ServeHTTP(w, r)
	return w
}

// fromTraefik is the header every forward-auth request of Traefik's (and
// Caddy's) carries, the method of the request it forwards, and that some
// tests need alone.
var fromTraefik = http.Header{"X-Forwarded-Method": {"GET"}}

// descriptorsOf is req's descriptors, each as "key=value,key=value".
func descriptorsOf(req *rlsv3.RateLimitRequest) []string {
	var out []string
	for _, d := range req.GetDescriptors() {
		var entries []string
		for _, e := range d.GetEntries() {
			entries = append(entries, e.GetKey()+"="+e.GetValue())
		}
		out = append(out, strings.Join(entries, ","))
	}
	return out
}

// onlyRequest is the one request svc was asked, failing the test unless
// there was exactly one.
func onlyRequest(t *testing.T, svc *recordingService) *rlsv3.RateLimitRequest {
	t.Helper()
	if len(svc.reqs) != 1 {
		t.Fatalf("%d ShouldRateLimit calls, want 1", len(svc.reqs))
	}
	return svc.reqs[0]
}

// The client 203.0.113.7 sends POST https://Shop.Example:8443/api/../login/?next=/x
// through each proxy: each describes it in its own headers, and passes on
// what the client forged in the others'. The URL names the proxy, and the
// descriptors come out the same: the address the proxy saw, the method,
// the host as routed (port dropped, lower-cased) and the path as a router
// sees it (dot segments resolved, query dropped), never the forgeries.
func TestForwardAuthReadsEachProxysHeaders(t *testing.T) {
	forged := http.Header{ // what the client sent, which the proxies pass on
		"X-Forwarded-Uri": {"/elsewhere"}, "X-Forwarded-Method": {"GET"}, "X-Forwarded-Host": {"other.example"},
		"X-Original-Url": {"https://other.example/elsewhere"}, "X-Original-Method": {"GET"}, "X-Real-Ip": {"198.51.100.2"},
	}
	for name, tc := range map[string]struct {
		from   string
		header http.Header
	}{
		// The README's recipe; nginx passes the client's other headers on.
		"nginx": {"nginx", http.Header{
			"X-Original-Url": {"https://Shop.Example:8443/api/../login/?next=/x"}, "X-Original-Method": {"POST"}, "X-Real-Ip": {"203.0.113.7"},
			"X-Forwarded-For": {"198.51.100.1"}, "X-Forwarded-Uri": {"/elsewhere"},
		}},
		// Its auth location; with compute-full-forwarded-for its
		// X-Forwarded-For ends in the load balancer's address.
		"ingress-nginx": {"ingress-nginx", http.Header{
			"X-Original-Url": {"https://Shop.Example:8443/api/../login/?next=/x"}, "X-Original-Method": {"POST"}, "X-Real-Ip": {"203.0.113.7"},
			"X-Forwarded-For": {"198.51.100.1, 10.0.0.2"}, "X-Sent-From": {"nginx-ingress-controller"}, "X-Auth-Request-Redirect": {"/api/../login/?next=/x"},
			"X-Forwarded-Uri": {"/elsewhere"}, "X-Forwarded-Host": {"other.example"},
		}},
		// trustForwardHeader: the client's X-Forwarded-For, then the peer.
		"traefik": {"traefik", http.Header{
			"X-Forwarded-Method": {"POST"}, "X-Forwarded-Uri": {"/api/../login/?next=/x"}, "X-Forwarded-Host": {"Shop.Example:8443"},
			"X-Forwarded-Proto": {"https"}, "X-Forwarded-For": {"198.51.100.1, 203.0.113.7"},
			"X-Real-Ip": {"198.51.100.2"}, "X-Original-Url": {"https://other.example/elsewhere"},
		}},
		// No trusted_proxies: X-Forwarded-For is the peer alone.
		"caddy": {"caddy", http.Header{
			"X-Forwarded-Method": {"POST"}, "X-Forwarded-Uri": {"/api/../login/?next=/x"}, "X-Forwarded-Host": {"Shop.Example:8443"},
			"X-Forwarded-Proto": {"https"}, "X-Forwarded-For": {"203.0.113.7"}, "Via": {"1.1 Caddy"},
			"X-Real-Ip": {"198.51.100.2"}, "X-Original-Method": {"GET"},
		}},
	} {
		t.Run(name, func(t *testing.T) {
			header := tc.header.Clone()
			for k, v := range forged {
				if _, set := header[k]; !set {
					header[k] = v
				}
			}
			svc := &recordingService{}
			w := serveForwardAuth(t, svc, http.MethodGet,
				"/forward-auth/edge?from="+tc.from+"&d=remote_address&d=remote_address,method,host,path", header)
			if w.Code != http.StatusOK {
				t.Fatalf("status %d (%s), want 200", w.Code, w.Body)
			}
			req := onlyRequest(t, svc)
			want := []string{"remote_address=203.0.113.7", "remote_address=203.0.113.7,method=POST,host=shop.example,path=/login/"}
			if got := descriptorsOf(req); req.GetDomain() != "edge" || fmt.Sprint(got) != fmt.Sprint(want) {
				t.Errorf("domain %q, descriptors %q; want edge, %q", req.GetDomain(), got, want)
			}
		})
	}
}

// Each proxy's forward-auth request method is accepted: nginx's
// subrequest, Traefik's and Caddy's are GETs, ingress-nginx's whatever its
// auth-method annotation says.
func TestForwardAuthTakesAnyMethod(t *testing.T) {
	for _, m := range []string{http.MethodGet, http.MethodHead, http.MethodPost, http.MethodDelete, "PROPFIND"} {
		svc := &recordingService{}
		if w := serveForwardAuth(t, svc, m, "/forward-auth/edge?from=traefik&d=value:api", fromTraefik); w.Code != http.StatusOK || len(svc.reqs) != 1 {
			t.Errorf("%s: status %d after %d decisions, want 200 after 1", m, w.Code, len(svc.reqs))
		}
	}
}

// header: entries take the header's value, keyed by its name
// lower-cased or by the key given; value: entries are the URL's text
// (generic_key by default, Envoy's GenericKey); cost is the hits_addend.
// A descriptor whose header is absent is left out, as Envoy leaves out a
// descriptor whose request_headers action finds none; with every one left
// out nothing is asked and the request passes.
func TestForwardAuthHeaderAndValueEntries(t *testing.T) {
	const target = "/forward-auth/api?from=caddy&cost=3&d=header:X-Api-Key&d=value:api,tenant=header:x-tenant&d=plan=value:a=b:c"
	svc := &recordingService{}
	w := serveForwardAuth(t, svc, http.MethodGet, target, http.Header{"X-Api-Key": {"k1"}, "X-Tenant": {"acme"}, "X-Forwarded-Method": {"GET"}})
	if w.Code != http.StatusOK {
		t.Fatalf("status %d (%s), want 200", w.Code, w.Body)
	}
	req := onlyRequest(t, svc)
	want := []string{"x-api-key=k1", "generic_key=api,tenant=acme", "plan=a=b:c"}
	if got := descriptorsOf(req); fmt.Sprint(got) != fmt.Sprint(want) || req.GetHitsAddend() != 3 {
		t.Errorf("descriptors %q at hits_addend %d, want %q at 3", got, req.GetHitsAddend(), want)
	}

	svc = &recordingService{}
	serveForwardAuth(t, svc, http.MethodGet, target, http.Header{"X-Tenant": {"acme"}, "X-Forwarded-Method": {"GET"}})
	want = []string{"generic_key=api,tenant=acme", "plan=a=b:c"}
	if got := descriptorsOf(onlyRequest(t, svc)); fmt.Sprint(got) != fmt.Sprint(want) {
		t.Errorf("without X-Api-Key: descriptors %q, want %q", got, want)
	}

	svc = &recordingService{}
	w = serveForwardAuth(t, svc, http.MethodGet, "/forward-auth/api?from=caddy&d=header:X-Api-Key&d=value:api,tenant=header:x-tenant", fromTraefik)
	if w.Code != http.StatusOK || len(svc.reqs) != 0 {
		t.Errorf("without either header: status %d after %d decisions, want 200 after none", w.Code, len(svc.reqs))
	}
}

// An IPv6 client is counted by its /64, as Envoy's remote_address entries
// are, whatever key the URL gives it: a client holds a whole prefix.
func TestForwardAuthKeysAnIPv6ClientByItsPrefix(t *testing.T) {
	svc := &recordingService{}
	serveForwardAuth(t, svc, http.MethodGet, "/forward-auth/edge?from=caddy&d=client=remote_address",
		http.Header{"X-Forwarded-For": {"[2001:db8:1:2:3:4:5:6]:443"}, "X-Forwarded-Method": {"GET"}})
	if got := descriptorsOf(onlyRequest(t, svc)); fmt.Sprint(got) != "[client=2001:db8:1:2::/64]" {
		t.Errorf("descriptors %q, want [client=2001:db8:1:2::/64]", got)
	}
}

// A URL the limiter cannot follow is 400 with the part at fault named,
// before anything is decided.
func TestForwardAuthRefusesAMalformedURL(t *testing.T) {
	for target, want := range map[string]string{
		"/forward-auth/no%20such?d=value:x":                                  `domain "no such"`,
		"/forward-auth/edge":                                                 "no descriptor: name at least one with d=",
		"/forward-auth/edge?from=caddy&d=pth":                                `d=pth: "pth" is no source`,
		"/forward-auth/edge?d=remote_address:x&from=caddy":                   `"remote_address:x" is no source`,
		"/forward-auth/edge?d=header":                                        `"header" is no source`,
		"/forward-auth/edge?d=remote_address":                                "no from=: name the proxy that asks",
		"/forward-auth/edge?d=value:x":                                       "no from=: name the proxy that asks",
		"/forward-auth/edge?from=apache&d=remote_address":                    "from=apache: want nginx, ingress-nginx, traefik or caddy",
		"/forward-auth/edge?from=caddy&from=nginx&d=remote_address":          "from given 2 times",
		"/forward-auth/edge?d=value:x&cost=0":                                "cost=0: want 1 to 1000000",
		"/forward-auth/edge?d=value:x&cost=1000001":                          "cost=1000001",
		"/forward-auth/edge?d=value:x&deny_status=500":                       "deny_status=500: want 429 or 403",
		"/forward-auth/edge?d=value:x&descriptor=path":                       `unknown parameter "descriptor"`,
		"/forward-auth/edge?from=caddy&d=remote_address,remote_address":      "key remote_address twice",
		"/forward-auth/edge?d=a%2Fb=value:x":                                 `key "a/b"`,
		"/forward-auth/edge?d=header:X%20Y":                                  `header name "X Y"`,
		"/forward-auth/edge?d=header:X!Y":                                    "header:X!Y: the header's name is no descriptor key; give one, KEY=header:X!Y",
		"/forward-auth/edge?d=value:":                                        "value:TEXT: want 1 to",
		"/forward-auth/edge?d=value:x;y":                                     "query:",
		"/forward-auth/edge?" + strings.Repeat("d=value:x&", 33):             "33 descriptors (d=): at most 32",
		"/forward-auth/edge?d=" + strings.Repeat("value:x,", 32) + "value:x": "33 entries: at most 32",
		"/forward-auth/edge?d=value:" + strings.Repeat("x", 5000):            "query of 5008 bytes: at most 4096",
	} {
		svc := &recordingService{}
		w := serveForwardAuth(t, svc, http.MethodGet, target, nil)
		if w.Code != http.StatusBadRequest || !strings.Contains(w.Body.String(), want) {
			t.Errorf("%.80s: %d %q, want 400 with %q", target, w.Code, w.Body, want)
		}
		if len(svc.reqs) != 0 {
			t.Errorf("%.80s: %d decisions, want none", target, len(svc.reqs))
		}
	}
}

// A forwarded request its proxy did not describe as it should is 400,
// naming the header (never its value, which may be a secret), and so is
// a value past the bound: the proxy refuses such a request, never lets it
// through. A body is 413: the proxies send none.
func TestForwardAuthRefusesWhatTheProxyShouldHaveSent(t *testing.T) {
	secret := "kurz_" + strings.Repeat("s", maxForwardValue)
	for name, tc := range map[string]struct {
		target string
		header http.Header
		want   string
	}{
		"no X-Forwarded-For":       {"/forward-auth/edge?from=traefik&d=remote_address", nil, "no X-Forwarded-For header"},
		"a forged last hop":        {"/forward-auth/edge?from=caddy&d=remote_address", http.Header{"X-Forwarded-For": {"203.0.113.7, unknown"}}, "X-Forwarded-For: its last address does not parse"},
		"X-Real-IP twice":          {"/forward-auth/edge?from=nginx&d=remote_address", http.Header{"X-Real-Ip": {"203.0.113.7", "198.51.100.2"}}, "X-Real-IP given 2 times"},
		"no X-Original-URL":        {"/forward-auth/edge?from=ingress-nginx&d=path", http.Header{"X-Original-Method": {"GET"}}, "no X-Original-URL header"},
		"a path that won't decode": {"/forward-auth/edge?from=nginx&d=path", http.Header{"X-Original-Url": {"http://a/%zz"}, "X-Original-Method": {"GET"}}, "X-Original-URL holds no path"},
		"no host":                  {"/forward-auth/edge?from=traefik&d=host", http.Header{"X-Forwarded-Host": {":8080"}, "X-Forwarded-Method": {"GET"}}, "X-Forwarded-Host holds no host"},
		"no method":                {"/forward-auth/edge?from=traefik&d=method", http.Header{"X-Forwarded-Method": {"GET /x"}}, "X-Forwarded-Method holds no method"},
		"no method, none read":     {"/forward-auth/edge?from=traefik&d=value:x", http.Header{"X-Forwarded-Method": {"GET /x"}}, "X-Forwarded-Method holds no method"},
		"a header past the bound":  {"/forward-auth/edge?from=traefik&d=header:Authorization", http.Header{"Authorization": {secret}, "X-Forwarded-Method": {"GET"}}, "header Authorization of 8197 bytes: at most 8192"},
		"a fact past the bound":    {"/forward-auth/edge?from=caddy&d=path", http.Header{"X-Forwarded-Uri": {"/" + secret}, "X-Forwarded-Method": {"GET"}}, "header X-Forwarded-Uri of 8198 bytes"},
	} {
		svc := &recordingService{}
		w := serveForwardAuth(t, svc, http.MethodGet, tc.target, tc.header)
		if w.Code != http.StatusBadRequest || !strings.Contains(w.Body.String(), tc.want) {
			t.Errorf("%s: %d %q, want 400 with %q", name, w.Code, w.Body, tc.want)
		}
		if strings.Contains(w.Body.String(), "kurz_") || strings.Contains(w.Body.String(), "198.51") {
			t.Errorf("%s: the answer %q echoes a header's value", name, w.Body)
		}
		if len(svc.reqs) != 0 {
			t.Errorf("%s: %d decisions, want none", name, len(svc.reqs))
		}
	}

	svc := &recordingService{}
	mux := http.NewServeMux()
	mux.Handle(ForwardAuthRoute, NewForwardAuth(svc, clientip.Keying{}, NewInFlight(1), time.Second, servertest.Logger(t)))
	for _, length := range []int64{5, -1} { // a Content-Length, chunked
		r := httptest.NewRequest(http.MethodPost, "/forward-auth/edge?d=value:x", strings.NewReader("hello"))
		r.ContentLength = length
		w := httptest.NewRecorder()
		mux.ServeHTTP(w, r)
		if w.Code != http.StatusRequestEntityTooLarge || !strings.Contains(w.Body.String(), "proxy_pass_request_body off") || len(svc.reqs) != 0 {
			t.Errorf("a body of length %d: %d %q after %d decisions, want 413 naming proxy_pass_request_body after none", length, w.Code, w.Body, len(svc.reqs))
		}
	}
}

// An allowed request is 200 with the fields ShouldRateLimit asks Envoy to
// add, as it spells them, and the X-RateLimit fields Envoy's filter would
// build; a denied one is 429, or the URL's deny_status, with Retry-After
// too; decided by the gRPC API's handler over the engine.
func TestForwardAuthAnswers(t *testing.T) {
	engine := newFake(t)
	engine.owners = [][]int{{0}}
	envoy := NewEnvoy(engine, HeadersDraft, clientip.Keying{})
	const target = "/forward-auth/cost?from=traefik&d=user=header:X-User"
	header := http.Header{"X-User": {"alice"}, "X-Forwarded-Method": {"GET"}}

	engine.each = &ratelimitv1.CheckQuotaResponse{Allowed: true, DecidingRule: "per-user", Limit: 100, Remaining: 98,
		ResetAfter: durationpb.New(90 * time.Second), Decisions: []*ratelimitv1.RuleDecision{decision("per-user", true, 100, 98, time.Hour, 0)}}
	w := serveForwardAuth(t, envoy, http.MethodGet, target, header)
	if w.Code != http.StatusOK || w.Body.Len() != 0 {
		t.Errorf("allowed: %d %q, want 200 with no body", w.Code, w.Body)
	}
	wantHeaders(t, "allowed", w.Header(), map[string]string{
		"RateLimit-Policy": `"cost/per-user";q=100;w=3600`, "RateLimit": `"cost/per-user";r=98;t=90`,
		"X-RateLimit-Limit": `100, 100;w=3600;name="per-user"`, "X-RateLimit-Remaining": "98", "X-RateLimit-Reset": "1800",
		"Retry-After": "",
	})
	if len(engine.descs) != 1 || engine.descs[0]["user"] != "alice" {
		t.Errorf("engine asked about %v, want user=alice", engine.descs)
	}

	engine.each = &ratelimitv1.CheckQuotaResponse{Allowed: false, DecidingRule: "per-user", Limit: 100,
		ResetAfter: durationpb.New(90 * time.Second), RetryAfter: durationpb.New(1500 * time.Millisecond),
		Decisions: []*ratelimitv1.RuleDecision{decision("per-user", false, 100, 0, time.Hour, 1500*time.Millisecond)}}
	for deny, want := range map[string]int{"": http.StatusTooManyRequests, "&deny_status=429": http.StatusTooManyRequests, "&deny_status=403": http.StatusForbidden} {
		w := serveForwardAuth(t, envoy, http.MethodGet, target+deny, header)
		if w.Code != want || w.Body.String() != "rate limit exceeded\n" {
			t.Errorf("denied%s: %d %q, want %d, rate limit exceeded", deny, w.Code, w.Body, want)
		}
		wantHeaders(t, "denied"+deny, w.Header(), map[string]string{
			"Retry-After": "2", "RateLimit": `"cost/per-user";r=0;t=90`, "X-RateLimit-Remaining": "0",
		})
	}
}

// wantHeaders checks h against want, field by field as spelt ("" for
// absent).
func wantHeaders(t *testing.T, what string, h http.Header, want map[string]string) {
	t.Helper()
	for k, v := range want {
		if got := strings.Join(h[k], ", "); got != v {
			t.Errorf("%s: %s %q, want %q", what, k, got, v)
		}
	}
}

// What the gRPC handler refuses is 400 with its message; any other
// failure is 500, its detail logged, not sent.
func TestForwardAuthFailures(t *testing.T) {
	svc := &recordingService{err: status.Error(codes.InvalidArgument, "descriptor 0: bad")}
	if w := serveForwardAuth(t, svc, http.MethodGet, "/forward-auth/edge?from=traefik&d=value:x", fromTraefik); w.Code != http.StatusBadRequest || !strings.Contains(w.Body.String(), "descriptor 0: bad") {
		t.Errorf("INVALID_ARGUMENT: %d %q, want 400 with its message", w.Code, w.Body)
	}
	svc = &recordingService{err: errors.New("redis: secret detail")}
	if w := serveForwardAuth(t, svc, http.MethodGet, "/forward-auth/edge?from=traefik&d=value:x", fromTraefik); w.Code != http.StatusInternalServerError || strings.Contains(w.Body.String(), "secret") {
		t.Errorf("another error: %d %q, want 500 without its detail", w.Code, w.Body)
	}
}

// The forward auth and POST /json share one bound on the requests being
// decided: with /json holding the only slot, a forward-auth request is
// 503 at once with a Retry-After, nothing decided.
func TestForwardAuthSharesTheInFlightBound(t *testing.T) {
	held := &heldService{entered: make(chan struct{}), release: make(chan struct{})}
	inFlight := NewInFlight(1)
	jsonH := NewEnvoyJSON(held, testMaxBody, inFlight, time.Second, servertest.Logger(t))
	svc := &recordingService{}
	auth := NewForwardAuth(svc, clientip.Keying{}, inFlight, time.Second, servertest.Logger(t))
	done := make(chan int)
	go func() {
		r := httptest.NewRequest(http.MethodPost, "/json", strings.NewReader(userA))
		r.Header.Set("Content-Type", "application/json")
		w := httptest.NewRecorder()
		jsonH.ServeHTTP(w, r)
		done <- w.Code
	}()
	<-held.entered
	mux := http.NewServeMux()
	mux.Handle(ForwardAuthRoute, auth)
	w := httptest.NewRecorder()
	r := httptest.NewRequest(http.MethodGet, "/forward-auth/edge?from=traefik&d=value:x", nil)
	r.Header = fromTraefik.Clone()
	mux.ServeHTTP(w, r)
	if w.Code != http.StatusServiceUnavailable || w.Header().Get("Retry-After") == "" || len(svc.reqs) != 0 {
		t.Errorf("forward auth while /json holds the slot: %d (Retry-After %q) after %d decisions, want 503 with a Retry-After after none",
			w.Code, w.Header().Get("Retry-After"), len(svc.reqs))
	}
	close(held.release)
	if code := <-done; code != http.StatusOK {
		t.Errorf("/json: %d, want 200", code)
	}
}

// The X-RateLimit fields are Envoy's filter's: the status with the least
// remaining gives the limit, remaining and reset, every status with a
// current limit its quota policy (Envoy's own test case); statuses
// without a current limit (a domain without rules) give none.
func TestXRateLimitAsEnvoysFilterBuildsThem(t *testing.T) {
	status := func(rpu uint32, unit rlsv3.RateLimitResponse_RateLimit_Unit, name string, remaining uint32, reset int64) *rlsv3.RateLimitResponse_DescriptorStatus {
		return &rlsv3.RateLimitResponse_DescriptorStatus{
			CurrentLimit:   &rlsv3.RateLimitResponse_RateLimit{Name: name, RequestsPerUnit: rpu, Unit: unit},
			LimitRemaining: remaining, DurationUntilReset: durationpb.New(time.Duration(reset) * time.Second),
		}
	}
	h := http.Header{}
	setXRateLimit(h, []*rlsv3.RateLimitResponse_DescriptorStatus{
		{Code: rlsv3.RateLimitResponse_OK},
		status(1, rlsv3.RateLimitResponse_RateLimit_MINUTE, "first", 2, 3),
		status(4, rlsv3.RateLimitResponse_RateLimit_HOUR, "second", 5, 6),
	})
	wantHeaders(t, "two limits", h, map[string]string{
		"X-RateLimit-Limit": `1, 1;w=60;name="first", 4;w=3600;name="second"`, "X-RateLimit-Remaining": "2", "X-RateLimit-Reset": "3",
	})
	h = http.Header{}
	setXRateLimit(h, []*rlsv3.RateLimitResponse_DescriptorStatus{{Code: rlsv3.RateLimitResponse_OK}})
	if len(h) != 0 {
		t.Errorf("no current limit: %v, want no fields", h)
	}
}

// A path is counted as a router sees it: one resource, one counter,
// whatever its spelling.
func TestCleanPath(t *testing.T) {
	for in, want := range map[string]string{
		"/login":                 "/login",
		"/api/../login/?next=/x": "/login/",
		"//a///b/./c":            "/a/b/c",
		"/%61%2Fb":               "/a/b",
		"/a/b/..":                "/a",
		"":                       "/",
		"?q=1":                   "/",
		"*":                      "*",
		"http://host:1/p/q?x":    "/p/q",
		"https://host?x":         "/",
		"/../../etc/passwd":      "/etc/passwd",
		"/a%3Fb?c":               "/a?b",
		"/trailing/":             "/trailing/",
		"relative/path":          "/relative/path",
		// A fragment is no part of the path: nginx routes /login#x as
		// /login, and so do the servers that drop it.
		"/login#x":         "/login",
		"/login?a#b":       "/login",
		"/login%23x":       "/login#x", // an escaped '#' is the path's
		"http://a#b/login": "/",
		// Nor are a segment's parameters: Java's servers (Tomcat, Jetty,
		// Spring) route /login;jsessionid=1 as /login.
		"/login;jsessionid=1": "/login",
		"/a;x/../login":       "/login",
		"/login;x/":           "/login/",
		"/login%3Bx":          "/login",
	} {
		if got, ok := cleanPath(in); !ok || got != want {
			t.Errorf("cleanPath(%q) = %q, %v; want %q", in, got, ok, want)
		}
	}
	if got, ok := cleanPath("/a%zz"); ok {
		t.Errorf("cleanPath(/a%%zz) = %q, want it refused", got)
	}
}

// nginx and ingress-nginx write X-Original-URL as $scheme://$http_host$request_uri:
// the client's Host header as it sent it, which nginx lets hold '?' or '#'
// (not '/'), then the request-target, which starts with '/'. The path is
// what follows the Host, so a client that sends `Host: shop.example?` is
// still counted under /login, the path nginx routes and proxies; a host
// that is no host name is refused when the URL reads it.
func TestForwardAuthReadsThePathPastTheClientsHost(t *testing.T) {
	for _, from := range []string{"nginx", "ingress-nginx"} {
		for _, host := range []string{"shop.example?", "shop.example#", "shop.example?a=b#c", "shop.example"} {
			svc := &recordingService{}
			w := serveForwardAuth(t, svc, http.MethodGet, "/forward-auth/edge?from="+from+"&d=method,path",
				http.Header{"X-Original-Url": {"http://" + host + "/login?next=/x"}, "X-Original-Method": {"POST"}})
			if w.Code != http.StatusOK {
				t.Fatalf("%s, Host %q: status %d (%s), want 200", from, host, w.Code, w.Body)
			}
			if got := descriptorsOf(onlyRequest(t, svc)); fmt.Sprint(got) != "[method=POST,path=/login]" {
				t.Errorf("%s, Host %q: descriptors %q, want [method=POST,path=/login]", from, host, got)
			}
		}
	}
	for host, want := range map[string]string{
		"shop.example?": "X-Original-URL holds no host name", "shop.example#": "X-Original-URL holds no host name",
		"a@b": "X-Original-URL holds no host name", "": "X-Original-URL holds no host name",
		"Shop.Example.:8443": "host=shop.example", "[2001:DB8::1]:8443": "host=[2001:db8::1]", "203.0.113.7": "host=203.0.113.7",
	} {
		svc := &recordingService{}
		w := serveForwardAuth(t, svc, http.MethodGet, "/forward-auth/edge?from=nginx&d=host",
			http.Header{"X-Original-Url": {"https://" + host + "/login"}, "X-Original-Method": {"GET"}})
		got := w.Body.String()
		if w.Code == http.StatusOK {
			got = fmt.Sprint(descriptorsOf(onlyRequest(t, svc)))
		}
		if !strings.Contains(got, want) {
			t.Errorf("Host %q: %d %q, want %q", host, w.Code, got, want)
		}
	}
}

// A web page the operator has open can send a GET to a forwarded
// 127.0.0.1:9191, which the Host check lets through (no rebinding needed:
// the page only spends, it reads nothing), but not with a header of its
// choosing without a CORS preflight, which is an OPTIONS without it. So
// the URL must name its proxy and every request carry the method header
// that proxy always sends; a request without it is refused, nothing
// spent, however little its descriptors read.
func TestForwardAuthAnswersOnlyAProxysRequests(t *testing.T) {
	page := http.Header{"Origin": {"https://attacker.example"}, "Sec-Fetch-Mode": {"no-cors"}, "Sec-Fetch-Site": {"cross-site"}}
	preflight := http.Header{"Origin": {"https://attacker.example"}, "Access-Control-Request-Method": {"GET"},
		"Access-Control-Request-Headers": {"x-forwarded-method"}}
	for name, tc := range map[string]struct {
		method, target string
		header         http.Header
		want           string
	}{
		"an <img> without from=":    {http.MethodGet, "/forward-auth/demo?d=user=value:alice", page, "no from="},
		"an <img> with from=":       {http.MethodGet, "/forward-auth/demo?from=traefik&d=user=value:alice", page, "no X-Forwarded-Method header"},
		"a fetch's preflight":       {http.MethodOptions, "/forward-auth/demo?from=caddy&d=user=value:alice", preflight, "no X-Forwarded-Method header"},
		"nginx's header missing":    {http.MethodGet, "/forward-auth/demo?from=nginx&d=user=header:X-User", http.Header{"X-User": {"alice"}, "X-Forwarded-Method": {"GET"}}, "no X-Original-Method header"},
		"a header the page can set": {http.MethodGet, "/forward-auth/demo?from=ingress-nginx&d=lang=header:Accept-Language", http.Header{"Accept-Language": {"fr"}}, "no X-Original-Method header"},
	} {
		svc := &recordingService{}
		w := serveForwardAuth(t, svc, tc.method, tc.target, tc.header)
		if w.Code != http.StatusBadRequest || !strings.Contains(w.Body.String(), tc.want) || len(svc.reqs) != 0 {
			t.Errorf("%s: %d %q after %d decisions, want 400 with %q after none", name, w.Code, w.Body, len(svc.reqs), tc.want)
		}
		if got := w.Header().Get("Access-Control-Allow-Origin"); got != "" {
			t.Errorf("%s: Access-Control-Allow-Origin %q, want none", name, got)
		}
	}
	for from, header := range map[string]string{"nginx": "X-Original-Method", "ingress-nginx": "X-Original-Method", "traefik": "X-Forwarded-Method", "caddy": "X-Forwarded-Method"} {
		svc := &recordingService{}
		w := serveForwardAuth(t, svc, http.MethodGet, "/forward-auth/demo?from="+from+"&d=user=value:alice", http.Header{header: {"GET"}})
		if w.Code != http.StatusOK || len(svc.reqs) != 1 {
			t.Errorf("from %s with %s: %d %q after %d decisions, want 200 after 1", from, header, w.Code, w.Body, len(svc.reqs))
		}
	}
}

// A header: entry's header given twice is refused: the limiter cannot know
// which of the two the service reads (Go's first, Node's and Rack's both
// joined, others the last), and counting the first would let a client
// send a fresh one before its own on every request and never be limited.
func TestForwardAuthRefusesAHeaderGivenTwice(t *testing.T) {
	svc := &recordingService{}
	w := serveForwardAuth(t, svc, http.MethodGet, "/forward-auth/api?from=traefik&d=header:X-Api-Key",
		http.Header{"X-Api-Key": {"fresh-1", "k1"}, "X-Forwarded-Method": {"GET"}})
	if w.Code != http.StatusBadRequest || !strings.Contains(w.Body.String(), "header X-Api-Key given 2 times") || len(svc.reqs) != 0 {
		t.Errorf("X-Api-Key twice: %d %q after %d decisions, want 400 naming X-Api-Key given 2 times after none", w.Code, w.Body, len(svc.reqs))
	}
	if strings.Contains(w.Body.String(), "k1") {
		t.Errorf("the answer %q echoes a header's value", w.Body)
	}
}
