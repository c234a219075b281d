// Package grpcclient dials other kurz services with the same instrumentation
// and keepalive everywhere.
package grpcclient

import (
	"cmp"
	"context"
	"fmt"
	"net/url"
	"strings"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/backoff"
	"google.golang.org/grpc/connectivity"
	"google.golang.org/grpc/credentials/insecure"
	_ "google.golang.org/grpc/health" // client-side health checking (healthCheckConfig)
	"google.golang.org/grpc/keepalive"
	"google.golang.org/grpc/resolver"
	"google.golang.org/grpc/resolver/manual"

	"kurz.dev/pkg/config"
	"kurz.dev/pkg/telemetry"
)

// serviceConfig spreads calls over every address the name resolves to: with
// "dns:///limiter-headless:9091" each replica gets its share. Each
// connection watches its server's gRPC health: a replica that reports
// NOT_SERVING (draining on SIGTERM) gets no new calls while it finishes the
// ones it has.
const serviceConfig = `{"loadBalancingConfig":[{"round_robin":{}}],"healthCheckConfig":{"serviceName":""}}`

// WaitForReplica makes the connection's calls wait for a ready replica
// (within their deadline) instead of failing at once when none is: in a
// rolling restart the replica that just came back may still be in its
// reconnect backoff when the next one starts draining. For services whose
// calls have deadlines of seconds (the shortener, analytics); calls to the
// limiter should keep failing fast, so that their callers apply the rule's
// failure mode within their few milliseconds.
var WaitForReplica = grpc.WithDefaultCallOptions(grpc.WaitForReady(true))

// StreamWindow and ConnWindow are the fixed HTTP/2 flow-control windows of
// every kurz gRPC connection, per call and per connection, on the clients'
// side (Dial) and the servers' (pkg/server).
const (
	StreamWindow = 1 << 20
	ConnWindow   = 4 << 20
)

// Dial creates a client connection to target: host:port, a gRPC target URI
// such as dns:///limiter:9091 (or grpc-go's other forms, dns:limiter:9091,
// unix:/run/limiter.sock), or a comma-separated list of host:port (fixed
// replicas, e.g. on one machine). It does not block: the first call
// connects.
//
// A target it cannot use is refused (the caller names its variable): an
// address without a port (gRPC's DNS resolver would dial 443), a scheme no
// resolver serves, a list without an address. Such a target used to be
// dialled for good, its service never reached.
func Dial(target string, tel *telemetry.Telemetry, opts ...grpc.DialOption) (*grpc.ClientConn, error) {
	if strings.Contains(target, ",") {
		r := manual.NewBuilderWithScheme("kurz-list")
		var state resolver.State
		for _, addr := range strings.Split(target, ",") {
			if addr = strings.TrimSpace(addr); addr != "" {
				if err := config.HostPort(addr); err != nil {
					return nil, fmt.Errorf("grpc target %q: %w", config.Redacted(target), err)
				}
				state.Addresses = append(state.Addresses, resolver.Address{Addr: addr})
			}
		}
		if len(state.Addresses) == 0 {
			return nil, fmt.Errorf("grpc target %q: no address", config.Redacted(target))
		}
		r.InitialState(state)
		opts = append(opts, grpc.WithResolvers(r))
		target = r.Scheme() + ":///" + strings.ReplaceAll(target, " ", "")
	} else if err := checkTarget(target); err != nil {
		return nil, fmt.Errorf("grpc target: %w", err)
	}
	// Readiness checks of dependencies run every few seconds: as traces
	// they would be noise, each its own root; they get none.
	base := append(tel.GRPCClientOptions(),
		grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithKeepaliveParams(keepalive.ClientParameters{Time: 30 * time.Second, Timeout: 10 * time.Second, PermitWithoutStream: true}),
		grpc.WithDefaultServiceConfig(serviceConfig),
		// Fixed flow-control windows, large enough for any of kurz's
		// messages on a network inside one cluster (1 MiB in flight per
		// call is 1 GiB/s at a 1 ms round trip). With gRPC's dynamic
		// windows the client pings after every answer to estimate the
		// bandwidth when calls come one at a time, a third write per call
		// on both sides: against the stack's limiter at one caller, fixed
		// windows took 7-15% less of its CPU per call and 4-11% off p50.
		// kurz's servers have the same (pkg/server).
		grpc.WithStaticStreamWindowSize(StreamWindow),
		grpc.WithStaticConnWindowSize(ConnWindow),
		// A replica that restarts is back within seconds: reconnect soon
		// after, not after gRPC's default backoff of up to two minutes.
		grpc.WithConnectParams(grpc.ConnectParams{
			Backoff:           backoff.Config{BaseDelay: 100 * time.Millisecond, Multiplier: 1.6, Jitter: 0.2, MaxDelay: 2 * time.Second},
			MinConnectTimeout: 2 * time.Second,
		}),
	)
	conn, err := grpc.NewClient(target, append(base, opts...)...)
	if err != nil {
		return nil, fmt.Errorf("grpc client for %s: %w", target, err)
	}
	return conn, nil
}

// checkTarget refuses a single target gRPC would dial without ever
// reaching a server: host:port, or a target of a registered resolver as
// grpc-go reads it (scheme://[authority]/endpoint, or scheme:endpoint as
// in unix:path and dns:host:port), whose endpoint is host:port for dns and
// passthrough.
func checkTarget(target string) error {
	u, err := url.Parse(target)
	if err != nil || resolver.Get(u.Scheme) == nil {
		// grpc-go dials this as dns:///target.
		scheme, _, isURI := strings.Cut(target, "://")
		switch {
		case !isURI:
			return config.HostPort(target)
		case err != nil:
			return fmt.Errorf("%q: not a target URI (dns:///host:port, or host:port)", config.Redacted(target))
		}
		return fmt.Errorf("%q: scheme %q has no resolver (dns:///host:port, or host:port)", config.Redacted(target), scheme)
	}
	if u.Scheme != "dns" && u.Scheme != "passthrough" {
		return nil
	}
	// resolver.Target.Endpoint's reading, which drops a query: refused,
	// as a place for credentials.
	if u.RawQuery != "" || u.Fragment != "" {
		return fmt.Errorf("%q: want the endpoint host:port alone, no query (no credentials: passwords have variables of their own)", config.Redacted(target))
	}
	endpoint := strings.TrimPrefix(cmp.Or(u.Path, u.Opaque), "/")
	if err := config.HostPort(endpoint); err != nil {
		return fmt.Errorf("%q: %w", config.Redacted(target), err)
	}
	return nil
}

// HealthCheck is a readiness check of the service behind conn: ready while
// at least one of its replicas is connected and reports SERVING (the
// connection watches each replica's health). One replica draining or down
// is not a failure; every replica failing is.
func HealthCheck(conn *grpc.ClientConn) func(ctx context.Context) error {
	return func(ctx context.Context) error {
		for {
			state := conn.GetState()
			switch state {
			case connectivity.Ready:
				return nil
			case connectivity.Idle:
				conn.Connect()
			case connectivity.TransientFailure, connectivity.Shutdown:
				return fmt.Errorf("%s: no replica serving (%s)", conn.Target(), state)
			}
			if !conn.WaitForStateChange(ctx, state) {
				return fmt.Errorf("%s: no replica serving within the check's deadline (%s)", conn.Target(), state)
			}
		}
	}
}
