package svcauth

import (
	"context"
	"net"
	"slices"
	"sync"
	"testing"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/grpc/test/bufconn"

	ratelimitv1 "kurz.dev/gen/kurz/ratelimit/v1"
	"kurz.dev/pkg/callmeta"
)

// tenantEcho records the tenant its handler sees.
type tenantEcho struct {
	ratelimitv1.UnimplementedRateLimitServiceServer
	mu      sync.Mutex
	tenants []string
}

func (e *tenantEcho) CheckQuota(ctx context.Context, _ *ratelimitv1.CheckQuotaRequest) (*ratelimitv1.CheckQuotaResponse, error) {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.tenants = append(e.tenants, callmeta.Tenant(ctx))
	return &ratelimitv1.CheckQuotaResponse{}, nil
}

func (e *tenantEcho) seen() []string {
	e.mu.Lock()
	defer e.mu.Unlock()
	return slices.Clone(e.tenants)
}

// serve runs a server with k's ServerOptions (and its Tap, if tapped) over
// bufconn, and returns a client connection to it with opts.
func serve(t *testing.T, k *Keys, tapped bool, echo *tenantEcho, opts ...grpc.DialOption) *grpc.ClientConn {
	t.Helper()
	lis := bufconn.Listen(1 << 20)
	srvOpts := k.ServerOptions()
	if tapped {
		srvOpts = append(srvOpts, grpc.InTapHandle(k.Tap))
	}
	srv := grpc.NewServer(srvOpts...)
	healthpb.RegisterHealthServer(srv, health.NewServer())
	ratelimitv1.RegisterRateLimitServiceServer(srv, echo)
	go func() { _ = srv.Serve(lis) }()
	t.Cleanup(srv.Stop)
	dial := grpc.WithContextDialer(func(ctx context.Context, _ string) (net.Conn, error) { return lis.DialContext(ctx) })
	conn, err := grpc.NewClient("passthrough:///buf", append([]grpc.DialOption{dial, grpc.WithTransportCredentials(insecure.NewCredentials())}, opts...)...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = conn.Close() })
	return conn
}

// Health checks need no assertion; an unsigned call, or one with two
// assertions, never reaches the handler; a signed call's handler sees the
// signed tenant, not the metadata's: whether the interceptors check the
// call or the tap checked it before.
func TestServerOptionsHandOnlyTheVerifiedTenant(t *testing.T) {
	for _, tapped := range []bool{false, true} {
		t.Run(map[bool]string{false: "interceptors", true: "tap"}[tapped], func(t *testing.T) {
			k := NewKeys([]byte(keyA), nil)
			echo := &tenantEcho{}
			ctx := callmeta.Outgoing(context.Background(), "acme", "")

			unsigned := serve(t, k, tapped, echo)
			if _, err := healthpb.NewHealthClient(unsigned).Check(context.Background(), &healthpb.HealthCheckRequest{}); err != nil {
				t.Errorf("unsigned health check: %v, want it answered", err)
			}
			if _, err := ratelimitv1.NewRateLimitServiceClient(unsigned).CheckQuota(ctx, &ratelimitv1.CheckQuotaRequest{}); status.Code(err) != codes.Unauthenticated {
				t.Errorf("unsigned call: %v, want UNAUTHENTICATED", err)
			}
			a := k.Sign("acme", "/kurz.ratelimit.v1.RateLimitService/CheckQuota")
			twice := metadata.AppendToOutgoingContext(context.Background(), AssertionKey, a, AssertionKey, a)
			if _, err := ratelimitv1.NewRateLimitServiceClient(unsigned).CheckQuota(twice, &ratelimitv1.CheckQuotaRequest{}); status.Code(err) != codes.Unauthenticated {
				t.Errorf("two assertions: %v, want UNAUTHENTICATED", err)
			}
			if got := echo.seen(); len(got) != 0 {
				t.Fatalf("the handler ran for refused calls, as tenants %q", got)
			}

			signed := serve(t, k, tapped, echo, k.DialOption())
			if _, err := ratelimitv1.NewRateLimitServiceClient(signed).CheckQuota(ctx, &ratelimitv1.CheckQuotaRequest{}); err != nil {
				t.Fatalf("signed call: %v", err)
			}
			if _, err := ratelimitv1.NewRateLimitServiceClient(signed).CheckQuota(context.Background(), &ratelimitv1.CheckQuotaRequest{}); err != nil {
				t.Fatalf("signed call without a tenant: %v", err)
			}
			if got := echo.seen(); !slices.Equal(got, []string{"acme", ""}) {
				t.Errorf("handler saw tenants %q, want [acme, \"\"]", got)
			}
		})
	}
}

// Keys.Only guards the services it names and leaves every other call as it
// was: the limiter's decisions stay open to Envoy while its rules admin
// service refuses unsigned calls. Its DialOption signs only the calls it
// guards.
func TestOnlyGuardsTheNamedServicesAlone(t *testing.T) {
	for _, tapped := range []bool{false, true} {
		t.Run(map[bool]string{false: "interceptors", true: "tap"}[tapped], func(t *testing.T) {
			k := NewKeys([]byte(keyA), nil)
			echo := &tenantEcho{}
			other := k.Only("kurz.other.v1.AdminService")
			open := serve(t, other, tapped, echo)
			if _, err := ratelimitv1.NewRateLimitServiceClient(open).CheckQuota(context.Background(), &ratelimitv1.CheckQuotaRequest{}); err != nil {
				t.Errorf("unsigned call of a service Only does not name: %v, want it answered", err)
			}
			guarded := k.Only("kurz.ratelimit.v1.RateLimitService")
			unsigned := serve(t, guarded, tapped, echo)
			if _, err := ratelimitv1.NewRateLimitServiceClient(unsigned).CheckQuota(context.Background(), &ratelimitv1.CheckQuotaRequest{}); status.Code(err) != codes.Unauthenticated {
				t.Errorf("unsigned call of the service Only names: %v, want UNAUTHENTICATED", err)
			}
			// A client signing for another service only sends this one
			// unsigned; one signing for it is answered.
			if _, err := ratelimitv1.NewRateLimitServiceClient(serve(t, guarded, tapped, echo, other.DialOption())).CheckQuota(context.Background(), &ratelimitv1.CheckQuotaRequest{}); status.Code(err) != codes.Unauthenticated {
				t.Errorf("a call the client's Only does not name: %v, want it sent unsigned and refused", err)
			}
			if _, err := ratelimitv1.NewRateLimitServiceClient(serve(t, guarded, tapped, echo, guarded.DialOption())).CheckQuota(context.Background(), &ratelimitv1.CheckQuotaRequest{}); err != nil {
				t.Errorf("signed call of the service Only names: %v", err)
			}
			if got := len(echo.seen()); got != 2 {
				t.Errorf("the handler ran %d times, want 2 (the open call and the signed one)", got)
			}
		})
	}
}
