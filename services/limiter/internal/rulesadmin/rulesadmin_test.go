package rulesadmin

import (
	"context"
	"io"
	"log/slog"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
	"google.golang.org/grpc/test/bufconn"

	limiterv1 "kurz.dev/gen/kurz/limiter/v1"
	"kurz.dev/services/limiter/internal/rulestore"
)

// emptyStream is an ApplyRules stream of n empty messages, then the end;
// it counts the messages read.
type emptyStream struct {
	grpc.ServerStream
	n, read int
}

func (s *emptyStream) Recv() (*limiterv1.ApplyRulesRequest, error) {
	if s.read == s.n {
		return nil, io.EOF
	}
	s.read++
	return &limiterv1.ApplyRulesRequest{}, nil
}

func (s *emptyStream) SendAndClose(*limiterv1.ApplyRulesResponse) error { return nil }

// An apply takes up to MaxApplyMessages messages, a directory's files in
// chunks; one more is refused at once, naming the bound, however little
// the messages carry.
func TestReceiveBoundsTheMessages(t *testing.T) {
	if up := receive(&emptyStream{n: MaxApplyMessages}); up.err != nil {
		t.Fatalf("%d messages: %v, want them read", MaxApplyMessages, up.err)
	}
	s := &emptyStream{n: 1 << 30}
	up := receive(s)
	if st := status.Convert(up.err); st.Code() != codes.InvalidArgument || !strings.Contains(st.Message(), "over 32000 messages") {
		t.Fatalf("endless empty messages: %v, want INVALID_ARGUMENT naming 32000 messages", up.err)
	}
	if s.read != MaxApplyMessages+1 {
		t.Errorf("read %d messages, want %d: the refusal comes at the first past the bound", s.read, MaxApplyMessages+1)
	}
}

// An apply whose caller stops sending (the stream left open, no end) is
// cut when its time is up with DEADLINE_EXCEEDED naming the bound, over a
// real gRPC stream, and the apply is free again for the next caller.
func TestApplyBoundsItsTime(t *testing.T) {
	// A pool that never connects: the apply is cut before its transaction.
	pool, err := pgxpool.New(context.Background(), "postgres://kurz@127.0.0.1:1/none?connect_timeout=1")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	s := New(pool, rulestore.FileSource{}, slog.New(slog.DiscardHandler))
	s.applyTime = 100 * time.Millisecond

	lis := bufconn.Listen(1 << 20)
	srv := grpc.NewServer()
	limiterv1.RegisterRulesAdminServiceServer(srv, s)
	go func() { _ = srv.Serve(lis) }()
	t.Cleanup(srv.Stop)
	conn, err := grpc.NewClient("passthrough:///bufconn", grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithContextDialer(func(ctx context.Context, _ string) (net.Conn, error) { return lis.DialContext(ctx) }))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = conn.Close() })
	client := limiterv1.NewRulesAdminServiceClient(conn)

	for i := range 2 {
		stream, err := client.ApplyRules(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		if err := stream.Send(&limiterv1.ApplyRulesRequest{Chunk: []byte("domains:\n")}); err != nil {
			t.Fatal(err)
		}
		// Wait for the answer without ending the stream: the caller stalls.
		err = stream.RecvMsg(new(limiterv1.ApplyRulesResponse))
		if st := status.Convert(err); st.Code() != codes.DeadlineExceeded || !strings.Contains(st.Message(), "within 100ms") {
			t.Fatalf("apply %d, stalled: %v, want DEADLINE_EXCEEDED naming 100ms", i+1, err)
		}
		if n := len(s.applying); n != 0 {
			t.Fatalf("apply %d: %d applies still hold the slot after the answer", i+1, n)
		}
	}
}
