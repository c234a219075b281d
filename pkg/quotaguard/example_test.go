package quotaguard_test

import (
	"context"
	"errors"
	"fmt"
	"log"
	"net"
	"net/http"
	"net/http/httptest"
	"sync"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/durationpb"

	ratelimitv1 "kurz.dev/gen/kurz/ratelimit/v1"
	"kurz.dev/pkg/quota"
	"kurz.dev/pkg/quotaguard"
)

// A service limits each user to the rule of domain demo (in the example, 2
// requests a minute), keyed by the X-User header its authentication sets.
// The services/limiter README shows the lines from conn to guard.
func ExampleMiddleware() {
	conn := exampleLimiter() // a *grpc.ClientConn to the limiter, grpc.NewClient("127.0.0.1:9091", ...)

	limiter, err := quota.NewDefault(conn)
	if err != nil {
		log.Fatal(err)
	}
	guard, err := quotaguard.Middleware(limiter, quotaguard.Options{Domain: "demo",
		Descriptors: quotaguard.Descriptors(map[string]quotaguard.Source{"user": quotaguard.Header("X-User")})})
	if err != nil {
		log.Fatal(err)
	}
	mux := http.NewServeMux()
	mux.HandleFunc("GET /hello", func(w http.ResponseWriter, r *http.Request) { fmt.Fprintln(w, "hello") })
	handler := guard(mux)

	for range 3 {
		r := httptest.NewRequest(http.MethodGet, "/hello", nil)
		r.Header.Set("X-User", "alice")
		w := httptest.NewRecorder()
		handler.ServeHTTP(w, r)
		fmt.Println(w.Code, w.Header()["RateLimit"], w.Header()["Retry-After"])
	}
	// Output:
	// 200 ["demo/token_bucket";r=1;t=30] []
	// 200 ["demo/token_bucket";r=0;t=60] []
	// 429 ["demo/token_bucket";r=0;t=60] [30]
}

// The same limit on a gRPC service, keyed by the caller's metadata
// "x-user": a denial is RESOURCE_EXHAUSTED with a RetryInfo, and every
// answer carries the rule's fields in its header metadata.
func ExampleUnaryServerInterceptor() {
	limiter, err := quota.NewDefault(exampleLimiter())
	if err != nil {
		log.Fatal(err)
	}
	interceptor, err := quotaguard.UnaryServerInterceptor(limiter, quotaguard.CallOptions{Domain: "demo",
		Descriptors: quotaguard.CallDescriptors(map[string]quotaguard.CallSource{"user": quotaguard.Metadata("x-user")})})
	if err != nil {
		log.Fatal(err)
	}
	srv := grpc.NewServer(grpc.UnaryInterceptor(interceptor))
	healthpb.RegisterHealthServer(srv, &guardedHealth{})

	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		log.Fatal(err)
	}
	go func() { _ = srv.Serve(lis) }()
	defer srv.Stop()
	conn, err := grpc.NewClient(lis.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		log.Fatal(err)
	}
	defer conn.Close()
	ctx := metadata.AppendToOutgoingContext(context.Background(), "x-user", "alice")
	for range 3 {
		var header metadata.MD
		_, err := healthpb.NewHealthClient(conn).Check(ctx, &healthpb.HealthCheckRequest{}, grpc.Header(&header))
		fmt.Println(status.Code(err), header.Get("ratelimit"))
	}
	// Output:
	// OK ["demo/token_bucket";r=1;t=30]
	// OK ["demo/token_bucket";r=0;t=60]
	// ResourceExhausted ["demo/token_bucket";r=0;t=60]
}

// exampleLimiter stands in for the connection to the limiter: the rule
// token_bucket of domain demo, 2 a minute per user, answered in process
// (so no deadline of the client's can pass while the example runs).
func exampleLimiter() grpc.ClientConnInterface {
	return &fakeConn{used: map[string]int64{}}
}

type fakeConn struct {
	mu   sync.Mutex
	used map[string]int64
}

func (c *fakeConn) Invoke(_ context.Context, method string, args, reply any, _ ...grpc.CallOption) error {
	req, ok := args.(*ratelimitv1.CheckQuotaRequest)
	if !ok || method != ratelimitv1.RateLimitService_CheckQuota_FullMethodName {
		return errors.New("the example limiter answers CheckQuota alone")
	}
	const limit = 2
	c.mu.Lock()
	user := req.GetDescriptors()["user"]
	allowed := c.used[user] < limit
	if allowed {
		c.used[user]++
	}
	remaining := limit - c.used[user]
	c.mu.Unlock()
	perUnit := time.Minute / limit
	resp := &ratelimitv1.CheckQuotaResponse{
		Allowed: allowed, DecidingRule: "token_bucket", Limit: limit, Remaining: remaining,
		ResetAfter: durationpb.New(time.Duration(limit-remaining) * perUnit),
		Source:     ratelimitv1.DecisionSource_DECISION_SOURCE_REDIS,
		Decisions:  []*ratelimitv1.RuleDecision{{Rule: "token_bucket", Window: durationpb.New(time.Minute), Capacity: limit}},
	}
	if !allowed {
		resp.RetryAfter = durationpb.New(perUnit)
	}
	proto.Merge(reply.(proto.Message), resp)
	return nil
}

func (c *fakeConn) NewStream(context.Context, *grpc.StreamDesc, string, ...grpc.CallOption) (grpc.ClientStream, error) {
	return nil, errors.New("the example limiter has no streams")
}
