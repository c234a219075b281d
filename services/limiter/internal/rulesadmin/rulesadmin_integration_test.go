//go:build integration

package rulesadmin

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"google.golang.org/grpc"
	"google.golang.org/grpc/metadata"

	limiterv1 "kurz.dev/gen/kurz/limiter/v1"
	"kurz.dev/pkg/callmeta"
	"kurz.dev/pkg/config"
	"kurz.dev/pkg/pgpool"
	"kurz.dev/pkg/testkit/stack"
	"kurz.dev/services/limiter/internal/rulestore/migrations"
)

func TestMain(m *testing.M) { stack.Require(m, stack.Postgres) }

// isolated returns a pool whose connections live in a fresh schema with the
// limiter's migrations applied, dropped when the test ends: the applies
// here touch no table another test reads.
func isolated(t *testing.T) *pgxpool.Pool {
	t.Helper()
	var cfg pgpool.Config
	if err := config.Load(&cfg); err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	admin, err := pgpool.New(ctx, cfg)
	if err != nil {
		t.Fatalf("local PostgreSQL: %v", err)
	}
	t.Cleanup(admin.Close)
	schema := fmt.Sprintf("rulesadmintest_%d", time.Now().UnixNano())
	if _, err := admin.Exec(ctx, "CREATE SCHEMA "+schema); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _, _ = admin.Exec(context.Background(), "DROP SCHEMA "+schema+" CASCADE") })
	pc, err := pgxpool.ParseConfig(cfg.URL)
	if err != nil {
		t.Fatal(err)
	}
	pc.ConnConfig.RuntimeParams["search_path"] = schema
	pool, err := pgxpool.NewWithConfig(ctx, pc)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	if _, err := pgpool.Migrate(ctx, pool, "limiter", migrations.FS); err != nil {
		t.Fatal(err)
	}
	return pool
}

// applyStream is an ApplyRules stream in process: one message holding the
// whole file, then the end.
type applyStream struct {
	grpc.ServerStream
	ctx  context.Context
	msgs []*limiterv1.ApplyRulesRequest
	resp *limiterv1.ApplyRulesResponse
}

func (s *applyStream) Context() context.Context { return s.ctx }

func (s *applyStream) Recv() (*limiterv1.ApplyRulesRequest, error) {
	if len(s.msgs) == 0 {
		return nil, io.EOF
	}
	m := s.msgs[0]
	s.msgs = s.msgs[1:]
	return m, nil
}

func (s *applyStream) SendAndClose(r *limiterv1.ApplyRulesResponse) error {
	s.resp = r
	return nil
}

// The "rules applied" audit line names the request ID the call's metadata
// carries (the gateway's X-Request-ID), so that an apply can be tied to the
// HTTP request that made it; one that could forge a log field is left out.
func TestRulesAppliedLineNamesTheRequestID(t *testing.T) {
	pool := isolated(t)
	var logs bytes.Buffer
	s := New(pool, "", slog.New(slog.NewTextHandler(&logs, nil)))
	for i, c := range []struct{ sent, logged string }{
		{"0f1e2d3c-aaaa-bbbb-cccc-1234567890ab", "request_id=0f1e2d3c-aaaa-bbbb-cccc-1234567890ab"},
		{"x\nlevel=ERROR msg=forged", `request_id=""`},
	} {
		logs.Reset()
		file := fmt.Sprintf("domains:\n  api:\n    rules:\n      - {name: per-ip, key: [ip], algorithm: token_bucket, limit: %d, window: 1s, failure_mode: open}\n", 10+i)
		ctx := metadata.NewIncomingContext(context.Background(), metadata.Pairs(callmeta.RequestIDKey, c.sent))
		if err := s.ApplyRules(&applyStream{ctx: ctx, msgs: []*limiterv1.ApplyRulesRequest{{Chunk: []byte(file)}}}); err != nil {
			t.Fatalf("apply with request ID %q: %v", c.sent, err)
		}
		line := logs.String()
		if !strings.Contains(line, `msg="rules applied"`) || !strings.Contains(line, c.logged) || strings.Contains(line, "forged") {
			t.Errorf("apply with request ID %q logged:\n%s\nwant %s on the rules applied line", c.sent, line, c.logged)
		}
	}
}
