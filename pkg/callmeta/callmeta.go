// Package callmeta names the gRPC metadata the public gateway attaches to the
// calls it makes on a client's behalf, and reads it back on the server side.
// The tenant is believed only as the caller's signed service assertion names
// it (kurz.dev/pkg/svcauth verifies it and calls WithVerifiedTenant); the
// x-kurz-tenant metadata itself only tells the caller's signer which tenant
// to sign for. The client IP is read on services whose every call is
// authenticated that way.
package callmeta

import (
	"context"
	"net"

	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/peer"
)

const (
	// TenantKey carries, on the caller's side, the tenant its svcauth signer
	// puts into the call's assertion. Servers never read it.
	TenantKey = "x-kurz-tenant"
	// ClientIPKey carries the end client's IP address as the gateway saw it.
	ClientIPKey = "x-kurz-client-ip"
)

// AnonymousTenant owns the calls that carry no tenant, where a service allows
// them at all.
const AnonymousTenant = "anonymous"

// Outgoing returns ctx with tenant and client IP attached for the next call;
// empty values are left out.
func Outgoing(ctx context.Context, tenant, clientIP string) context.Context {
	var kv []string
	if tenant != "" {
		kv = append(kv, TenantKey, tenant)
	}
	if clientIP != "" {
		kv = append(kv, ClientIPKey, clientIP)
	}
	if len(kv) == 0 {
		return ctx
	}
	return metadata.AppendToOutgoingContext(ctx, kv...)
}

type verifiedTenantKey struct{}

// WithVerifiedTenant returns ctx carrying tenant as the verified tenant of
// the incoming call: svcauth's server interceptor sets it from the caller's
// assertion, and tests of handlers called in process.
func WithVerifiedTenant(ctx context.Context, tenant string) context.Context {
	return context.WithValue(ctx, verifiedTenantKey{}, tenant)
}

// Tenant returns the verified tenant of an incoming call (see
// WithVerifiedTenant), or "" without one. x-kurz-tenant metadata a caller
// sends is never believed.
func Tenant(ctx context.Context) string {
	t, _ := ctx.Value(verifiedTenantKey{}).(string)
	return t
}

// ClientIP returns the end client's IP of an incoming call: the gateway's
// x-kurz-client-ip when present and valid, else the IP of the gRPC peer.
func ClientIP(ctx context.Context) string {
	if ip := net.ParseIP(first(ctx, ClientIPKey)); ip != nil {
		return ip.String()
	}
	p, ok := peer.FromContext(ctx)
	if !ok || p.Addr == nil {
		return ""
	}
	host, _, err := net.SplitHostPort(p.Addr.String())
	if err != nil {
		return p.Addr.String()
	}
	return host
}

func first(ctx context.Context, key string) string {
	md, ok := metadata.FromIncomingContext(ctx)
	if !ok {
		return ""
	}
	if v := md.Get(key); len(v) > 0 {
		return v[0]
	}
	return ""
}
