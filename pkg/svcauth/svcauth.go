// Package svcauth authenticates the calls kurz services make to each other.
// A trusted caller (the gateway, and tools run by operators) holds a secret
// key shared with the services it calls; on every call it signs a short-lived
// assertion naming the tenant it acts for and the method it calls. The called
// service verifies the assertion when the call's headers arrive (Tap), before
// it reads the request, refuses the call with UNAUTHENTICATED without a valid
// one, and takes the tenant from it alone (callmeta.Tenant): a pod that can
// reach a gRPC port but holds no key can act as no tenant, whatever
// x-kurz-tenant metadata it sends, nor make the service hold its request.
//
// An assertion is "v1.<expiry>.<tenant>.<mac>": the expiry in Unix seconds,
// the tenant in unpadded base64url, and the HMAC-SHA256 of everything before
// the last dot plus the full gRPC method name (its audience), in unpadded
// base64url. It lives TTL; the verifier allows MaxSkew of clock difference
// either way and accepts the current key or the previous one, so a key
// rotates without refused calls in three rollouts, in any order of pods:
// the new key as previous (everyone accepts it), then the new key as
// current and the old one as previous (everyone signs with it), then no
// previous key.
package svcauth

import (
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/base64"
	"errors"
	"fmt"
	"hash"
	"strconv"
	"strings"
	"sync"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/grpc/tap"

	"kurz.dev/pkg/callmeta"
	"kurz.dev/pkg/config"
)

// AssertionKey is the gRPC metadata that carries the caller's assertion.
const AssertionKey = "x-kurz-assertion"

const (
	// TTL is how long an assertion is valid after it is signed: a captured
	// one is replayable for this long, on the one method it names.
	TTL = 60 * time.Second
	// MaxSkew is the clock difference tolerated between caller and server,
	// on both ends of the validity window.
	MaxSkew = 30 * time.Second
	// MinKeyLen is the shortest key accepted, in bytes.
	MinKeyLen = 32
	// MaxTenantLen bounds the tenant an assertion may carry.
	MaxTenantLen = 128
	// MaxAssertionLen bounds what a verifier reads: version, expiry, the
	// longest tenant and the MAC, with room to spare.
	MaxAssertionLen = 320
)

const version = "v1"

// macLen is the length of the base64url MAC: 32 bytes, unpadded.
var macLen = base64.RawURLEncoding.EncodedLen(sha256.Size)

// Reasons a verification fails. They name no secret and are sent to the
// caller in the UNAUTHENTICATED status.
var (
	ErrMissing   = errors.New("no service assertion (" + AssertionKey + "): internal calls must be signed with KURZ_SERVICE_AUTH_KEY")
	ErrMalformed = errors.New("the service assertion is malformed")
	ErrSignature = errors.New("the service assertion's signature does not verify (wrong key, or signed for another method)")
	ErrExpired   = errors.New("the service assertion has expired")
	ErrTooLong   = errors.New("the service assertion expires further ahead than its lifetime allows")
)

// Config is the shared key, from the environment. Give the gateway and the
// services it calls (shortener, analytics, and the limiter for its rules
// admin API) the same values.
type Config struct {
	// Key signs new assertions and verifies them: at least MinKeyLen
	// random bytes (e.g. `openssl rand -base64 48`). A credential: from a
	// Secret.
	Key string `env:"SERVICE_AUTH_KEY" default:""`
	// PreviousKey still verifies assertions during a rotation; empty
	// outside one.
	PreviousKey string `env:"SERVICE_AUTH_PREVIOUS_KEY" default:""`
	// AllowPublishedSecrets lets the service start with a secret whose
	// value this repository publishes (the dev overlay's, make up's
	// defaults): for local and dev use only, where anyone may read them.
	// Off, such a key, code key or admin token is refused at start. It is
	// here because every service holding one of those secrets reads this
	// block.
	AllowPublishedSecrets bool `env:"ALLOW_PUBLISHED_SECRETS" default:"false"`
}

// Keys returns the verifier and signer of c, or an error naming the variable
// that is missing or too short. There is no way to run without a key.
func (c Config) Keys() (*Keys, error) {
	var errs []error
	switch {
	case c.Key == "":
		errs = append(errs, fmt.Errorf("KURZ_SERVICE_AUTH_KEY is not set: internal gRPC calls are signed with it; give the gateway, shortener and analytics the same random secret of at least %d characters", MinKeyLen))
	case len(c.Key) < MinKeyLen:
		errs = append(errs, fmt.Errorf("KURZ_SERVICE_AUTH_KEY has %d characters: want at least %d", len(c.Key), MinKeyLen))
	}
	if n := len(c.PreviousKey); n > 0 && n < MinKeyLen {
		errs = append(errs, fmt.Errorf("KURZ_SERVICE_AUTH_PREVIOUS_KEY has %d characters: want at least %d (or empty)", n, MinKeyLen))
	}
	errs = append(errs,
		config.NotPublished("KURZ_SERVICE_AUTH_KEY", c.Key, c.AllowPublishedSecrets),
		config.NotPublished("KURZ_SERVICE_AUTH_PREVIOUS_KEY", c.PreviousKey, c.AllowPublishedSecrets))
	if err := errors.Join(errs...); err != nil {
		return nil, err
	}
	return NewKeys([]byte(c.Key), []byte(c.PreviousKey)), nil
}

// Keys signs assertions with the current key and verifies them with the
// current or the previous key. It is safe for concurrent use.
type Keys struct {
	current, previous *macPool // previous is nil outside a rotation
	now               func() time.Time
	// only, when set, are the gRPC services (full names) whose calls are
	// signed and verified; every other call passes as it is (Only).
	only []string
}

// Only returns Keys that sign and verify the calls of the named gRPC
// services (full names, such as "kurz.limiter.v1.RulesAdminService") and
// let every other call pass unsigned: for a service whose hot API stays
// open (the limiter's decisions, which Envoy calls too) beside an
// administrative one that must not.
func (k *Keys) Only(services ...string) *Keys {
	c := *k
	c.only = make([]string, len(services))
	for i, s := range services {
		c.only[i] = "/" + s + "/"
	}
	return &c
}

// open says whether a call to method needs no assertion: health checks,
// reflection, and, with Only, the methods of the services it does not
// name.
func (k *Keys) open(method string) bool {
	if open(method) {
		return true
	}
	if k.only == nil {
		return false
	}
	for _, prefix := range k.only {
		if strings.HasPrefix(method, prefix) {
			return false
		}
	}
	return true
}

// NewKeys returns Keys for the current key and, during a rotation, the
// previous one (nil or empty outside one). Callers check the lengths (see
// Config.Keys).
func NewKeys(current, previous []byte) *Keys {
	k := &Keys{current: newMACPool(current), now: time.Now}
	if len(previous) > 0 && !hmac.Equal(previous, current) {
		k.previous = newMACPool(previous)
	}
	return k
}

// macPool reuses keyed HMAC states and their scratch buffers, so that
// signing and verifying allocate nothing but the token or tenant they
// return.
type macPool struct{ p sync.Pool }

type macState struct {
	h   hash.Hash
	buf []byte
	sum [sha256.Size]byte
}

func newMACPool(key []byte) *macPool {
	key = append([]byte(nil), key...)
	return &macPool{p: sync.Pool{New: func() any {
		return &macState{h: hmac.New(sha256.New, key), buf: make([]byte, 0, MaxAssertionLen+256)}
	}}}
}

// sum writes payload and audience into s's HMAC and returns the MAC in
// base64url, in s's scratch buffer (valid until s goes back to the pool).
func sum[T string | []byte](s *macState, payload T, audience string) []byte {
	s.h.Reset()
	s.buf = append(append(append(s.buf[:0], payload...), '\n'), audience...)
	s.h.Write(s.buf)
	s.buf = base64.RawURLEncoding.AppendEncode(s.buf[:0], s.h.Sum(s.sum[:0]))
	return s.buf
}

// mac appends to dst the base64url MAC of payload for audience.
func (m *macPool) mac(dst, payload []byte, audience string) []byte {
	s := m.p.Get().(*macState)
	defer m.p.Put(s)
	return append(dst, sum(s, payload, audience)...)
}

// verify reports whether mac is payload's MAC for audience, comparing in
// constant time.
func (m *macPool) verify(payload, audience, mac string) bool {
	s := m.p.Get().(*macState)
	defer m.p.Put(s)
	want := sum(s, payload, audience)
	s.buf = append(want, mac...) // mac as bytes, after want, without an allocation
	return subtle.ConstantTimeCompare(want, s.buf[len(want):]) == 1
}

// Sign returns an assertion that tenant ("" for none) calls audience, the
// full gRPC method name, valid for TTL from now.
func (k *Keys) Sign(tenant, audience string) string {
	return k.SignAt(tenant, audience, k.now())
}

// SignAt is Sign as of the time at: valid for TTL from then.
func (k *Keys) SignAt(tenant, audience string, at time.Time) string {
	exp := at.Add(TTL).Unix()
	b := make([]byte, 0, len(version)+24+base64.RawURLEncoding.EncodedLen(len(tenant))+macLen)
	b = append(b, version...)
	b = append(b, '.')
	b = strconv.AppendInt(b, exp, 10)
	b = append(b, '.')
	b = base64.RawURLEncoding.AppendEncode(b, []byte(tenant))
	payloadLen := len(b)
	b = append(b, '.')
	b = k.current.mac(b, b[:payloadLen], audience)
	return string(b)
}

// Verify checks assertion for audience, the full gRPC method name being
// called, and returns the tenant it names ("" for none). The error is one of
// the Err* reasons.
func (k *Keys) Verify(assertion, audience string) (string, error) {
	if assertion == "" {
		return "", ErrMissing
	}
	if len(assertion) > MaxAssertionLen {
		return "", ErrMalformed
	}
	dot := strings.LastIndexByte(assertion, '.')
	if dot < 0 || len(assertion)-dot-1 != macLen {
		return "", ErrMalformed
	}
	payload, mac := assertion[:dot], assertion[dot+1:]
	if !k.current.verify(payload, audience, mac) && (k.previous == nil || !k.previous.verify(payload, audience, mac)) {
		return "", ErrSignature
	}
	// Signed by a holder of the key; the fields are still checked, so a
	// caller's bug cannot become a server's.
	v, rest, ok1 := strings.Cut(payload, ".")
	expText, tenantText, ok2 := strings.Cut(rest, ".")
	exp, err := strconv.ParseInt(expText, 10, 64)
	if !ok1 || !ok2 || v != version || err != nil || base64.RawURLEncoding.DecodedLen(len(tenantText)) > MaxTenantLen {
		return "", ErrMalformed
	}
	now := k.now()
	switch {
	case now.Add(-MaxSkew).Unix() > exp:
		return "", ErrExpired
	case exp > now.Add(TTL+MaxSkew).Unix():
		return "", ErrTooLong
	}
	// Decoded through arrays on the stack: the tenant string is the only
	// allocation of a verification.
	var src [MaxAssertionLen]byte
	var tenant [MaxTenantLen]byte
	n, err := base64.RawURLEncoding.Decode(tenant[:], src[:copy(src[:], tenantText)])
	if err != nil {
		return "", ErrMalformed
	}
	return string(tenant[:n]), nil
}

// DialOption makes every call on a client connection (with Only, every
// call of the services it names) carry an assertion for the tenant in its
// outgoing x-kurz-tenant metadata (set with callmeta.Outgoing; "" without
// one) and the method it calls.
func (k *Keys) DialOption() grpc.DialOption {
	return grpc.WithChainUnaryInterceptor(func(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
		return invoker(k.signed(ctx, method), method, req, reply, cc, opts...)
	})
}

// StreamDialOption is DialOption for streaming calls.
func (k *Keys) StreamDialOption() grpc.DialOption {
	return grpc.WithChainStreamInterceptor(func(ctx context.Context, desc *grpc.StreamDesc, cc *grpc.ClientConn, method string, streamer grpc.Streamer, opts ...grpc.CallOption) (grpc.ClientStream, error) {
		return streamer(k.signed(ctx, method), desc, cc, method, opts...)
	})
}

// signed is ctx with the assertion of a call to method, unless the call
// needs none.
func (k *Keys) signed(ctx context.Context, method string) context.Context {
	if k.only != nil && k.open(method) {
		return ctx
	}
	var tenant string
	if v := metadata.ValueFromOutgoingContext(ctx, callmeta.TenantKey); len(v) > 0 {
		tenant = v[len(v)-1]
	}
	return metadata.AppendToOutgoingContext(ctx, AssertionKey, k.Sign(tenant, method))
}

// Tap refuses a call to any method but health checks and reflection with
// UNAUTHENTICATED unless its headers carry a valid assertion for it, and
// hands the call the assertion's tenant. Install it as the server's tap
// (server.Config.GRPCAuthenticate): gRPC runs the tap when a call's
// headers arrive, before it reads any of the request, while the
// interceptors of ServerOptions run only after the whole request has
// arrived, so a stranger without the key could otherwise make the server
// buffer up to its receive size on every call it opens.
func (k *Keys) Tap(ctx context.Context, info *tap.Info) (context.Context, error) {
	if k.open(info.FullMethodName) {
		return ctx, nil
	}
	// The header's keys are lower case, as HTTP/2 sends them.
	tenant, err := k.verifyValues(info.Header[AssertionKey], info.FullMethodName)
	if err != nil {
		return nil, err
	}
	return context.WithValue(callmeta.WithVerifiedTenant(ctx, tenant), tappedKey{}, info.FullMethodName), nil
}

// tappedKey is the context key of the method whose assertion Tap verified:
// its interceptors need not verify it again.
type tappedKey struct{}

// tapped reports whether Tap admitted the call to method of ctx.
func tapped(ctx context.Context, method string) bool {
	m, _ := ctx.Value(tappedKey{}).(string)
	return m == method
}

// ServerOptions make a gRPC server refuse every call but health checks and
// reflection with UNAUTHENTICATED unless it carries a valid assertion for
// its method, and hand the handlers the assertion's tenant (callmeta.Tenant).
// They check a call after its request has arrived; Tap checks it before,
// and what Tap admitted they pass through.
func (k *Keys) ServerOptions() []grpc.ServerOption {
	return []grpc.ServerOption{
		grpc.ChainUnaryInterceptor(func(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
			if k.open(info.FullMethod) || tapped(ctx, info.FullMethod) {
				return handler(ctx, req)
			}
			ctx, err := k.authenticate(ctx, info.FullMethod)
			if err != nil {
				return nil, err
			}
			return handler(ctx, req)
		}),
		grpc.ChainStreamInterceptor(func(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, handler grpc.StreamHandler) error {
			if k.open(info.FullMethod) || tapped(ss.Context(), info.FullMethod) {
				return handler(srv, ss)
			}
			ctx, err := k.authenticate(ss.Context(), info.FullMethod)
			if err != nil {
				return err
			}
			return handler(srv, &authedStream{ServerStream: ss, ctx: ctx})
		}),
	}
}

// open says whether method needs no assertion: health checks (probes, load
// balancers) and reflection (the API's shape, public in the repository).
func open(method string) bool {
	return strings.HasPrefix(method, "/grpc.health.v1.Health/") || strings.HasPrefix(method, "/grpc.reflection.")
}

func (k *Keys) authenticate(ctx context.Context, method string) (context.Context, error) {
	tenant, err := k.verifyValues(metadata.ValueFromIncomingContext(ctx, AssertionKey), method)
	if err != nil {
		return nil, err
	}
	return callmeta.WithVerifiedTenant(ctx, tenant), nil
}

// verifyValues verifies the assertion of a call to method, the values of
// its AssertionKey header, and returns its tenant, or an UNAUTHENTICATED
// status.
func (k *Keys) verifyValues(v []string, method string) (string, error) {
	var assertion string
	switch len(v) {
	case 0:
	case 1:
		assertion = v[0]
	default: // which one would be believed is ambiguous: none is
		return "", status.Error(codes.Unauthenticated, ErrMalformed.Error())
	}
	tenant, err := k.Verify(assertion, method)
	if err != nil {
		return "", status.Error(codes.Unauthenticated, err.Error())
	}
	return tenant, nil
}

type authedStream struct {
	grpc.ServerStream
	ctx context.Context
}

func (s *authedStream) Context() context.Context { return s.ctx }
