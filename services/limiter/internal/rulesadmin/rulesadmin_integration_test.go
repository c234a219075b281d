//go:build integration

package rulesadmin

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"
	"google.golang.org/grpc"
	"google.golang.org/grpc/metadata"

	limiterv1 "kurz.dev/gen/kurz/limiter/v1"
	"kurz.dev/pkg/callmeta"
	"kurz.dev/pkg/envoydir"
	"kurz.dev/pkg/pgpool"
	"kurz.dev/pkg/testkit/pgtest"
	"kurz.dev/pkg/testkit/stack"
	"kurz.dev/services/limiter/internal/ratelimit"
	"kurz.dev/services/limiter/internal/rulestore"
	"kurz.dev/services/limiter/internal/rulestore/migrations"
)

func TestMain(m *testing.M) { stack.Require(m, stack.Postgres) }

// isolated returns a pool whose connections live in a fresh schema with the
// limiter's migrations applied, dropped when the test ends: the applies
// here touch no table another test reads.
func isolated(t *testing.T) *pgxpool.Pool {
	t.Helper()
	return pgtest.Schema(t, "rulesadmintest", func(ctx context.Context, pool *pgxpool.Pool) error {
		_, err := pgpool.Migrate(ctx, pool, "limiter", migrations.FS)
		return err
	})
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
	s := New(pool, rulestore.FileSource{}, slog.New(slog.NewTextHandler(&logs, nil)))
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

// dirMessages is the ApplyRules stream of a directory's files: each
// started by a message naming it, its content in chunks of chunk bytes.
func dirMessages(files []envoydir.File, chunk int, opts *limiterv1.ApplyRulesRequest) []*limiterv1.ApplyRulesRequest {
	var msgs []*limiterv1.ApplyRulesRequest
	for _, f := range files {
		rest := f.Data
		msg := &limiterv1.ApplyRulesRequest{FileName: f.Name}
		for {
			n := min(len(rest), chunk)
			msg.Chunk, rest = rest[:n], rest[n:]
			msgs = append(msgs, msg)
			if len(rest) == 0 {
				break
			}
			msg = &limiterv1.ApplyRulesRequest{}
		}
	}
	if opts != nil {
		msgs[0].DryRun, msgs[0].Prune, msgs[0].IfMatch, msgs[0].MergeDomains = opts.DryRun, opts.Prune, opts.IfMatch, opts.MergeDomains
	}
	return msgs
}

// A directory of envoyproxy/ratelimit files applied in one request gives
// the rules the file source reads from the same directory (a ConfigMap's,
// with ..data and links), every domain of it, and with prune keeps them
// all (one file at a time would delete the others').
func TestApplyingADirectoryGivesTheFileSourcesRules(t *testing.T) {
	pool := isolated(t)
	dir := t.TempDir()
	data := filepath.Join(dir, "..2026_12_07_04_00_00.1")
	if err := os.Mkdir(data, 0o755); err != nil {
		t.Fatal(err)
	}
	contents := map[string]string{
		"edge.yaml":      "domain: edge\ndescriptors:\n  - {key: remote_address, rate_limit: {unit: second, requests_per_unit: 5}}\n  - key: path\n    value: /api/*\n    rate_limit: {unit: minute, requests_per_unit: 60}\n",
		"api.yaml":       "domain: api\ndescriptors:\n  - key: user\n    rate_limit: {unit: minute, requests_per_unit: 9}\n    descriptors: [{key: plan, value: pro, rate_limit: {unit: minute, requests_per_unit: 90}}]\n",
		"ratelimit.conf": "domain: conf\ndescriptors: [{key: user, rate_limit: {unit: hour, requests_per_unit: 3}}]\n" + "#" + strings.Repeat("x", 40<<10) + "\n",
	}
	for name, c := range contents {
		if err := os.WriteFile(filepath.Join(data, name), []byte(c), 0o644); err != nil {
			t.Fatal(err)
		}
		if err := os.Symlink(filepath.Join(filepath.Base(data), name), filepath.Join(dir, name)); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.Symlink(filepath.Base(data), filepath.Join(dir, "..data")); err != nil {
		t.Fatal(err)
	}
	fromFile, err := rulestore.ReadFile(dir)
	if err != nil {
		t.Fatal(err)
	}
	files, err := envoydir.Read(dir)
	if err != nil {
		t.Fatal(err)
	}
	s := New(pool, rulestore.FileSource{}, slog.New(slog.DiscardHandler))
	// Chunks of 16 KiB: the 40 KiB file spans three messages.
	st := &applyStream{ctx: context.Background(), msgs: dirMessages(files, 16<<10, &limiterv1.ApplyRulesRequest{Prune: true})}
	if err := s.ApplyRules(st); err != nil {
		t.Fatalf("apply the directory: %v", err)
	}
	if st.resp.GetFormat() != "envoy" {
		t.Errorf("format %q, want envoy", st.resp.GetFormat())
	}
	applied, err := rulestore.Export(context.Background(), pool)
	if err != nil {
		t.Fatal(err)
	}
	// As rules files (canonical: an empty map and none say the same).
	got, err := rulestore.Marshal(ratelimit.Config{Domains: applied.Domains})
	if err != nil {
		t.Fatal(err)
	}
	want, err := rulestore.Marshal(ratelimit.Config{Domains: fromFile.Domains})
	if err != nil {
		t.Fatal(err)
	}
	if len(fromFile.Domains) != 3 || string(got) != string(want) {
		t.Errorf("applied:\n%s\nthe file source's:\n%s", got, want)
	}
}

// What the file source refuses of a directory an apply of it refuses, and
// what a stranger sends is bounded: files, their names, their size.
func TestApplyingADirectoryRefusesWhatTheFileSourceRefusesAndBoundsTheRequest(t *testing.T) {
	pool := isolated(t)
	s := New(pool, rulestore.FileSource{}, slog.New(slog.DiscardHandler))
	edge := "domain: edge\ndescriptors: [{key: ip, rate_limit: {unit: second, requests_per_unit: 5}}]\n"
	many := make([]envoydir.File, envoydir.MaxFiles+1)
	for i := range many {
		many[i] = envoydir.File{Name: fmt.Sprintf("d%d.yaml", i), Data: fmt.Appendf(nil, "domain: d%d\ndescriptors: [{key: ip, rate_limit: {unit: second, requests_per_unit: 5}}]\n", i)}
	}
	big := []byte(edge + "#" + strings.Repeat("x", 600<<10) + "\n")
	for _, c := range []struct {
		name  string
		files []envoydir.File
		want  string
	}{
		{"the same domain twice", []envoydir.File{{Name: "a.yaml", Data: []byte(edge)}, {Name: "b.yaml", Data: []byte(edge)}}, `b.yaml: duplicate domain "edge", also in a.yaml`},
		{"a kurz file among them", []envoydir.File{{Name: "a.yaml", Data: []byte(edge)}, {Name: "kurz.yaml", Data: []byte("domains: {}\n")}}, "kurz.yaml: not an envoyproxy/ratelimit file"},
		{"a README among them", []envoydir.File{{Name: "a.yaml", Data: []byte(edge)}, {Name: "README", Data: []byte("not rules")}}, "README"},
		{"two files of one name", []envoydir.File{{Name: "a.yaml", Data: []byte(edge)}, {Name: "a.yaml", Data: []byte(edge)}}, "two files named a.yaml"},
		{"too many files", many, fmt.Sprintf("over %d files", envoydir.MaxFiles)},
		{"over 1 MiB together", []envoydir.File{{Name: "a.yaml", Data: big}, {Name: "b.yaml", Data: big}}, "over 1048576 bytes"},
		{"a control character in a name", []envoydir.File{{Name: "a\x1b[2J.yaml", Data: []byte(edge)}}, "control character"},
		{"a path for a name", []envoydir.File{{Name: "../a.yaml", Data: []byte(edge)}}, "give the names in the directory"},
		{"a dot file", []envoydir.File{{Name: "..data", Data: []byte(edge)}}, "dot file"},
		{"a name over 255 bytes", []envoydir.File{{Name: strings.Repeat("a", 256), Data: []byte(edge)}}, "over 255"},
	} {
		err := s.ApplyRules(&applyStream{ctx: context.Background(), msgs: dirMessages(c.files, MaxChunk, nil)})
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: got %v, want a refusal with %q", c.name, err, c.want)
		}
	}
	// A file_name after a single file's first chunk is no directory.
	err := s.ApplyRules(&applyStream{ctx: context.Background(), msgs: []*limiterv1.ApplyRulesRequest{{Chunk: []byte(edge)}, {FileName: "b.yaml", Chunk: []byte(edge)}}})
	if err == nil || !strings.Contains(err.Error(), "name every file of a directory") {
		t.Errorf("a file_name after a single file's chunk: got %v, want it refused", err)
	}
	if cfg, err := rulestore.Export(context.Background(), pool); err != nil || len(cfg.Domains) != 0 {
		t.Errorf("after the refusals the tables hold %+v (%v), want nothing", cfg.Domains, err)
	}
}

// merge_domains merges a directory's files of one domain, as the file
// source does with KURZ_LIMITER_ENVOY_MERGE_DOMAINS, to the same rules;
// without it they are refused.
func TestApplyingADirectoryWithMergeDomainsGivesTheFileSourcesRules(t *testing.T) {
	pool := isolated(t)
	dir := t.TempDir()
	for name, c := range map[string]string{
		"a.yaml": "domain: edge\ndescriptors: [{key: remote_address, rate_limit: {unit: second, requests_per_unit: 5}}]\n",
		"b.yaml": "domain: edge\ndescriptors: [{key: path, value: /api/*, rate_limit: {unit: minute, requests_per_unit: 60}}]\n",
	} {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(c), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	source := rulestore.FileSource{Path: dir, Envoy: rulestore.EnvoyOptions{MergeDomains: true}}
	fromFile, err := source.Load(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	files, err := envoydir.Read(dir)
	if err != nil {
		t.Fatal(err)
	}
	s := New(pool, rulestore.FileSource{}, slog.New(slog.DiscardHandler))
	if err := s.ApplyRules(&applyStream{ctx: context.Background(), msgs: dirMessages(files, MaxChunk, nil)}); err == nil || !strings.Contains(err.Error(), `duplicate domain "edge"`) {
		t.Fatalf("without merge_domains: got %v, want the domain in two files refused", err)
	}
	if err := s.ApplyRules(&applyStream{ctx: context.Background(), msgs: dirMessages(files, MaxChunk, &limiterv1.ApplyRulesRequest{MergeDomains: true})}); err != nil {
		t.Fatalf("with merge_domains: %v", err)
	}
	applied, err := rulestore.Export(context.Background(), pool)
	if err != nil {
		t.Fatal(err)
	}
	got, _ := rulestore.Marshal(ratelimit.Config{Domains: applied.Domains})
	want, _ := rulestore.Marshal(ratelimit.Config{Domains: fromFile.Domains})
	if len(fromFile.Domains["edge"].Rules) != 2 || string(got) != string(want) {
		t.Errorf("applied:\n%s\nthe file source's:\n%s", got, want)
	}
}
