package quotaguard

import (
	"context"
	"net"
	"net/netip"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/status"

	"kurz.dev/pkg/clientip"
	"kurz.dev/pkg/quota"
	"kurz.dev/pkg/ratelimitfields"
	"kurz.dev/pkg/rpcerr"
)

// CallOptions say what the interceptors ask the limiter about each call;
// as Options, for gRPC.
type CallOptions struct {
	// Domain is the limiter domain whose rules decide (required).
	Domain string
	// Descriptors are the descriptors of a call to fullMethod
	// ("/pkg.Service/Method"), ctx holding its metadata and peer
	// (required); ok false lets the call through unchecked (health
	// checks, say). CallDescriptors builds one from CallSources.
	Descriptors func(ctx context.Context, fullMethod string) (map[string]string, bool)
	// Cost is what a call costs: nil or 0 is 1, over MaxCost is MaxCost.
	Cost func(ctx context.Context, fullMethod string) uint32
	// Policy decides when the limiter does not answer in time.
	Policy quota.Policy
	// MaxWait is the longest a call waits for its turn in a leaky
	// bucket's queue (0 is DefaultMaxWait); a turn further off is
	// RESOURCE_EXHAUSTED, retrying at that turn.
	MaxWait time.Duration
}

// Header metadata keys of the RateLimit fields (gRPC's keys are lower
// case).
const (
	policyMetadata = "ratelimit-policy"
	stateMetadata  = "ratelimit"
)

type callGuard struct {
	c *quota.Client
	o CallOptions
}

func newCallGuard(c *quota.Client, o CallOptions) (*callGuard, error) {
	if err := checkSetup(c, "CallOptions", o.Domain, o.Descriptors != nil, o.Policy, o.MaxWait); err != nil {
		return nil, err
	}
	return &callGuard{c: c, o: o}, nil
}

// UnaryServerInterceptor returns the interceptor that asks the limiter,
// through c, about every unary call o's Descriptors checks, as Middleware
// does for HTTP: the deciding rule's fields go in the header metadata
// ("ratelimit", "ratelimit-policy"); a denial is RESOURCE_EXHAUSTED with
// an ErrorInfo (kurz.dev, RATE_LIMITED, metadata "rule") and a RetryInfo
// (none when the call costs more than the rule ever holds); a call the
// limiter did not decide under FailClosed is UNAVAILABLE
// (RATE_LIMITER_UNAVAILABLE, retry after a second); a call whose client
// went away first ends with its context's status. The handler finds the
// decision in its context (DecisionFrom).
func UnaryServerInterceptor(c *quota.Client, o CallOptions) (grpc.UnaryServerInterceptor, error) {
	g, err := newCallGuard(c, o)
	if err != nil {
		return nil, err
	}
	return func(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
		ctx, err := g.admit(ctx, info.FullMethod, func(md metadata.MD) error { return grpc.SetHeader(ctx, md) })
		if err != nil {
			return nil, err
		}
		return handler(ctx, req)
	}, nil
}

// StreamServerInterceptor is UnaryServerInterceptor for streams: one check
// when the stream opens (its messages are not counted one by one).
func StreamServerInterceptor(c *quota.Client, o CallOptions) (grpc.StreamServerInterceptor, error) {
	g, err := newCallGuard(c, o)
	if err != nil {
		return nil, err
	}
	return func(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, handler grpc.StreamHandler) error {
		ctx, err := g.admit(ss.Context(), info.FullMethod, ss.SetHeader)
		if err != nil {
			return err
		}
		return handler(srv, &guardedStream{ServerStream: ss, ctx: ctx})
	}, nil
}

// guardedStream is a stream whose context holds the guard's decision.
type guardedStream struct {
	grpc.ServerStream
	ctx context.Context
}

func (s *guardedStream) Context() context.Context { return s.ctx }

// admit decides a call to method, setting its fields with setHeader, and
// returns the handler's context, or the call's error status.
func (g *callGuard) admit(ctx context.Context, method string, setHeader func(metadata.MD) error) (context.Context, error) {
	desc, check := g.o.Descriptors(ctx, method)
	if !check {
		return ctx, nil
	}
	var cost uint32
	if g.o.Cost != nil {
		cost = g.o.Cost(ctx, method)
	}
	d := boundedWait(g.c.Check(ctx, g.o.Domain, bounded(desc), boundedCost(cost), g.o.Policy), g.o.MaxWait)
	if d.Abandoned {
		return nil, status.FromContextError(ctx.Err()).Err()
	}
	if q, ok := d.Fields(g.o.Domain); ok {
		policy, state := ratelimitfields.Fields(q)
		// Only fails once headers are sent, which no handler has done yet.
		_ = setHeader(metadata.Pairs(policyMetadata, policy, stateMetadata, state))
	}
	switch {
	case d.Allowed:
		if err := d.Wait(ctx); err != nil {
			return nil, status.FromContextError(err).Err()
		}
		return context.WithValue(ctx, decisionKey{}, d), nil
	case d.Degraded:
		return nil, rpcerr.RetryLater(codes.Unavailable, rpcerr.ReasonLimiterUnavailable, limiterDownMessage, 0, nil)
	case d.MaxCost > 0:
		return nil, rpcerr.WithDetails(codes.ResourceExhausted, deniedMessage(g.o.Domain, d),
			rpcerr.Info(rpcerr.ReasonRateLimited, map[string]string{"rule": d.Rule}))
	}
	return nil, rpcerr.RetryLater(codes.ResourceExhausted, rpcerr.ReasonRateLimited, deniedMessage(g.o.Domain, d),
		d.ComeBackAfter(), map[string]string{"rule": d.Rule})
}

// A CallSource is one descriptor's value for a call to fullMethod, ctx
// holding its metadata and peer; ok false leaves the descriptor out.
type CallSource func(ctx context.Context, fullMethod string) (value string, ok bool)

// CallDescriptors is a CallOptions.Descriptors that checks every call with
// the descriptors sources yield, by name.
func CallDescriptors(sources map[string]CallSource) func(context.Context, string) (map[string]string, bool) {
	return func(ctx context.Context, method string) (map[string]string, bool) {
		desc := make(map[string]string, len(sources))
		for name, src := range sources {
			if v, ok := src(ctx, method); ok && v != "" {
				desc[name] = v
			}
		}
		return desc, true
	}
}

// PeerIP is the limiter key of the call's connection peer, an IPv6 one by
// its prefix (k's); left out when the peer is no IP address (a Unix
// socket). Behind a proxy that is the proxy: key on a metadata value the
// proxy sets (Metadata) instead. It panics on a k ClientIP refuses.
func PeerIP(k clientip.Keying) CallSource {
	mustKeying("PeerIP", k)
	return func(ctx context.Context, _ string) (string, bool) {
		p, ok := peer.FromContext(ctx)
		if !ok || p.Addr == nil {
			return "", false
		}
		var a netip.Addr
		if tcp, ok := p.Addr.(*net.TCPAddr); ok {
			a, _ = netip.AddrFromSlice(tcp.IP)
		} else {
			a, _ = clientip.ParseHop(p.Addr.String())
		}
		key := k.Key(a)
		return key, key != ""
	}
}

// Metadata is the call's first value of the metadata key (lower case),
// left out when absent or empty; what Header says of a client's choice
// holds here too.
func Metadata(key string) CallSource {
	return func(ctx context.Context, _ string) (string, bool) {
		v := metadata.ValueFromIncomingContext(ctx, key)
		if len(v) == 0 {
			return "", false
		}
		return v[0], v[0] != ""
	}
}

// FullMethod is the called method ("/pkg.Service/Method"). gRPC refuses a
// method the server does not register before any interceptor runs, so a
// client makes no key of its own with it, unless the server has a
// grpc.UnknownServiceHandler (a proxy), whose calls reach the stream
// interceptor under any name the client sends.
func FullMethod(_ context.Context, method string) (string, bool) {
	return method, method != ""
}
