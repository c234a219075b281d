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
	"fmt"
	"net"
	"strings"

	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/peer"
)

const (
	// TenantKey carries, on the caller's side, the tenant its svcauth signer
	// puts into the call's assertion. Servers never read it.
	TenantKey = "x-kurz-tenant"
	// ClientIPKey carries the end client's IP address as the gateway saw it.
	ClientIPKey = "x-kurz-client-ip"
	// IdempotencyKey carries a create's idempotency key: the client's
	// Idempotency-Key header at the gateway, or a gRPC caller's own. A
	// create sent again with the same key answers what the first made.
	IdempotencyKey = "idempotency-key"
	// IfMatchKey carries the entity tags a change is conditional on: the
	// client's If-Match header at the gateway, a tag per value. The change
	// applies only while the resource's current tag is one of them.
	IfMatchKey = "if-match"
	// RequestIDKey carries the gateway's request ID (its X-Request-ID), so
	// that what a service logs of a call names the HTTP request that made it.
	RequestIDKey = "x-request-id"
)

// MaxIfMatch bounds the entity tags of one call (IfMatchKey values).
const MaxIfMatch = 16

// ReasonETagMismatch (ErrorInfo, ABORTED; 412 at the gateway): the change
// was conditional on entity tags, and the resource's current one is none of
// them: it changed since the client read it.
const ReasonETagMismatch = "ETAG_MISMATCH"

// ReasonIfMatchInvalid (INVALID_ARGUMENT): If-Match is not a list of
// entity tags, or holds more than MaxIfMatch.
const ReasonIfMatchInvalid = "IF_MATCH_INVALID"

// MaxIdempotencyKey is the longest idempotency key, in bytes.
const MaxIdempotencyKey = 255

// Reasons (google.rpc.ErrorInfo) of the refusals about idempotency keys.
const (
	// ReasonIdempotencyKeyInvalid: the key is empty, too long, sent twice
	// or holds a byte outside printable ASCII (INVALID_ARGUMENT).
	ReasonIdempotencyKeyInvalid = "IDEMPOTENCY_KEY_INVALID"
	// ReasonIdempotencyKeyReused: the key made a link for another request
	// (INVALID_ARGUMENT; 422 at the gateway).
	ReasonIdempotencyKeyReused = "IDEMPOTENCY_KEY_REUSED"
	// ReasonIdempotencyKeyUnsupported: the call does not take a key
	// (INVALID_ARGUMENT): it would not make the call safe to repeat.
	ReasonIdempotencyKeyUnsupported = "IDEMPOTENCY_KEY_UNSUPPORTED"
)

// CheckIdempotencyKey says what is wrong with key, or nil: 1 to
// MaxIdempotencyKey bytes of printable ASCII (space included, as a gRPC
// metadata value and a structured-field string may hold), not only spaces.
func CheckIdempotencyKey(key string) error {
	if strings.TrimLeft(key, " ") == "" || len(key) > MaxIdempotencyKey {
		return fmt.Errorf("an idempotency key is 1 to %d characters, not only spaces; this one has %d", MaxIdempotencyKey, len(key))
	}
	for i := 0; i < len(key); i++ {
		if c := key[i]; c < 0x20 || c > 0x7e {
			return fmt.Errorf("an idempotency key holds printable ASCII only (a UUID is a good one); byte %d is 0x%02x", i, c)
		}
	}
	return nil
}

// OutgoingIdempotencyKey returns ctx with key attached for the next call as
// its idempotency key.
func OutgoingIdempotencyKey(ctx context.Context, key string) context.Context {
	return metadata.AppendToOutgoingContext(ctx, IdempotencyKey, key)
}

// IncomingIdempotencyKey returns the idempotency key of an incoming call:
// "" without one, an error for several or an invalid one.
func IncomingIdempotencyKey(ctx context.Context) (string, error) {
	md, _ := metadata.FromIncomingContext(ctx)
	v := md.Get(IdempotencyKey)
	switch len(v) {
	case 0:
		return "", nil
	case 1:
		return v[0], CheckIdempotencyKey(v[0])
	}
	return "", fmt.Errorf("the call carries %d idempotency keys; send one", len(v))
}

// OutgoingIfMatch returns ctx with tags attached for the next call as the
// entity tags its change is conditional on.
func OutgoingIfMatch(ctx context.Context, tags []string) context.Context {
	kv := make([]string, 0, 2*len(tags))
	for _, t := range tags {
		kv = append(kv, IfMatchKey, t)
	}
	return metadata.AppendToOutgoingContext(ctx, kv...)
}

// IncomingIfMatch returns the entity tags an incoming call's change is
// conditional on (nil: none), or an error for more than MaxIfMatch.
func IncomingIfMatch(ctx context.Context) ([]string, error) {
	md, _ := metadata.FromIncomingContext(ctx)
	v := md.Get(IfMatchKey)
	if len(v) > MaxIfMatch {
		return nil, fmt.Errorf("the call is conditional on %d entity tags; send at most %d", len(v), MaxIfMatch)
	}
	return v, nil
}

// MaxRequestID is the longest request ID, in bytes.
const MaxRequestID = 128

// ValidRequestID says whether id is a request ID worth keeping as it is: 1
// to MaxRequestID letters, digits and ._:+/=- (a UUID, a trace ID, base64).
// A client sets X-Request-ID, and a gRPC caller the metadata, so nothing
// else goes into a log line: no spaces or quotes to forge a field with, no
// line breaks, no control bytes.
func ValidRequestID(id string) bool {
	if id == "" || len(id) > MaxRequestID {
		return false
	}
	for i := range len(id) {
		c := id[i]
		ok := c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || strings.IndexByte("._:+/=-", c) >= 0
		if !ok {
			return false
		}
	}
	return true
}

// OutgoingRequestID returns ctx with id attached for the next call as the
// request ID it serves; an empty id is left out.
func OutgoingRequestID(ctx context.Context, id string) context.Context {
	if id == "" {
		return ctx
	}
	return metadata.AppendToOutgoingContext(ctx, RequestIDKey, id)
}

// RequestID returns the request ID of an incoming call, for its log lines:
// "" without one, and "" for several or one ValidRequestID refuses, as the
// caller is not believed to have sent a sane one.
func RequestID(ctx context.Context) string {
	md, _ := metadata.FromIncomingContext(ctx)
	if v := md.Get(RequestIDKey); len(v) == 1 && ValidRequestID(v[0]) {
		return v[0]
	}
	return ""
}

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
