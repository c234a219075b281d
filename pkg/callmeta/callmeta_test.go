package callmeta

import (
	"context"
	"net"
	"strings"
	"testing"

	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/peer"
)

func TestRoundTripThroughMetadata(t *testing.T) {
	out := Outgoing(context.Background(), "acme", "203.0.113.7")
	md, _ := metadata.FromOutgoingContext(out)
	if got := md.Get(TenantKey); len(got) != 1 || got[0] != "acme" {
		t.Errorf("outgoing %s = %q, want [acme]", TenantKey, got)
	}
	in := metadata.NewIncomingContext(context.Background(), md)
	if got := ClientIP(in); got != "203.0.113.7" {
		t.Errorf("ClientIP = %q, want 203.0.113.7", got)
	}
}

func TestTenantIsOnlyTheVerifiedOne(t *testing.T) {
	forged := metadata.NewIncomingContext(context.Background(), metadata.Pairs(TenantKey, "victim"))
	if got := Tenant(forged); got != "" {
		t.Errorf("Tenant from x-kurz-tenant metadata alone = %q, want empty", got)
	}
	if got := Tenant(WithVerifiedTenant(forged, "acme")); got != "acme" {
		t.Errorf("Tenant = %q, want the verified acme", got)
	}
}

func TestClientIPFallsBackToPeer(t *testing.T) {
	ctx := peer.NewContext(context.Background(), &peer.Peer{Addr: &net.TCPAddr{IP: net.ParseIP("192.0.2.1"), Port: 4242}})
	bad := metadata.NewIncomingContext(ctx, metadata.Pairs(ClientIPKey, "not-an-ip"))
	for name, c := range map[string]context.Context{"no metadata": ctx, "invalid header": bad} {
		if got := ClientIP(c); got != "192.0.2.1" {
			t.Errorf("%s: ClientIP = %q, want the peer 192.0.2.1", name, got)
		}
	}
	if got := Tenant(ctx); got != "" {
		t.Errorf("Tenant without metadata = %q, want empty", got)
	}
}

func TestCheckIdempotencyKey(t *testing.T) {
	for _, ok := range []string{"a", "8e03978e-40d5-43e8-bc93-6894a57f9324", "order 4711", strings.Repeat("~", MaxIdempotencyKey)} {
		if err := CheckIdempotencyKey(ok); err != nil {
			t.Errorf("CheckIdempotencyKey(%q) = %v, want nil", ok, err)
		}
	}
	for _, bad := range []string{"", "  ", strings.Repeat("k", MaxIdempotencyKey+1), "a\tb", "a\x00b", "schlüssel", "a\x7fb"} {
		if err := CheckIdempotencyKey(bad); err == nil {
			t.Errorf("CheckIdempotencyKey(%q) = nil, want an error", bad)
		}
	}
}

func TestIncomingIdempotencyKey(t *testing.T) {
	in := func(kv ...string) context.Context {
		return metadata.NewIncomingContext(context.Background(), metadata.Pairs(kv...))
	}
	if k, err := IncomingIdempotencyKey(context.Background()); k != "" || err != nil {
		t.Errorf("no metadata: %q, %v; want none", k, err)
	}
	if k, err := IncomingIdempotencyKey(in(IdempotencyKey, "k1")); k != "k1" || err != nil {
		t.Errorf("one key: %q, %v; want k1", k, err)
	}
	if _, err := IncomingIdempotencyKey(in(IdempotencyKey, "k1", IdempotencyKey, "k2")); err == nil {
		t.Error("two keys: no error")
	}
	if _, err := IncomingIdempotencyKey(in(IdempotencyKey, "")); err == nil {
		t.Error("an empty key: no error")
	}
}

func TestValidRequestID(t *testing.T) {
	for id, ok := range map[string]bool{
		"abc-123": true, "0f1e2d3c-aaaa-bbbb-cccc-1234567890ab": true, "a:b/c+d=": true, strings.Repeat("x", MaxRequestID): true,
		"": false, "with space": false, "new\nline": false, `a"b`: false, strings.Repeat("x", MaxRequestID+1): false, "ünï": false,
	} {
		if ValidRequestID(id) != ok {
			t.Errorf("ValidRequestID(%q) = %v, want %v", id, !ok, ok)
		}
	}
}

// A request ID goes out as metadata and comes back as it was; an incoming
// one that is not sane, or is sent twice, is no request ID at all.
func TestRequestIDThroughMetadata(t *testing.T) {
	md, _ := metadata.FromOutgoingContext(OutgoingRequestID(context.Background(), "req-1"))
	if got := RequestID(metadata.NewIncomingContext(context.Background(), md)); got != "req-1" {
		t.Errorf("round trip: %q, want req-1", got)
	}
	if _, ok := metadata.FromOutgoingContext(OutgoingRequestID(context.Background(), "")); ok {
		t.Error("an empty request ID went out as metadata")
	}
	in := func(kv ...string) context.Context {
		return metadata.NewIncomingContext(context.Background(), metadata.Pairs(kv...))
	}
	for name, ctx := range map[string]context.Context{
		"none":      context.Background(),
		"two":       in(RequestIDKey, "a", RequestIDKey, "b"),
		"a newline": in(RequestIDKey, "a\nlevel=ERROR"),
		"too long":  in(RequestIDKey, strings.Repeat("x", MaxRequestID+1)),
	} {
		if got := RequestID(ctx); got != "" {
			t.Errorf("%s: RequestID = %q, want none", name, got)
		}
	}
}
