package keystore

import (
	"context"
	"go/ast"
	"go/parser"
	"go/token"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"kurz.dev/pkg/config"
	"kurz.dev/pkg/pgpool"
)

// secretNames are the identifiers that hold key material or its digest in
// the comparisons checked below.
var secretNames = map[string]bool{"stored": true, "sum": true, "presented": true, "hash": true, "secret": true, "token": true}

// checkConstantTimeCompare fails t unless the body of function fn in file
// compares key material only through crypto/subtle.ConstantTimeCompare: at
// least one such call, no bytes.Equal / bytes.Compare / reflect.DeepEqual /
// strings.EqualFold, and no == or != on an expression naming a secret
// (other than the result of ConstantTimeCompare).
func checkConstantTimeCompare(t *testing.T, file, fn string) {
	t.Helper()
	f, err := parser.ParseFile(token.NewFileSet(), file, nil, 0)
	if err != nil {
		t.Fatal(err)
	}
	var body *ast.BlockStmt
	for _, d := range f.Decls {
		if fd, ok := d.(*ast.FuncDecl); ok && fd.Name.Name == fn {
			body = fd.Body
		}
	}
	if body == nil {
		t.Fatalf("%s: no func %s", file, fn)
	}
	isCall := func(e ast.Expr, pkg, name string) bool {
		c, ok := e.(*ast.CallExpr)
		if !ok {
			return false
		}
		sel, ok := c.Fun.(*ast.SelectorExpr)
		if !ok {
			return false
		}
		x, ok := sel.X.(*ast.Ident)
		return ok && x.Name == pkg && sel.Sel.Name == name
	}
	namesSecret := func(e ast.Expr) bool {
		found := false
		ast.Inspect(e, func(n ast.Node) bool {
			if id, ok := n.(*ast.Ident); ok && secretNames[id.Name] {
				found = true
			}
			return !found
		})
		return found
	}
	constantTime := 0
	ast.Inspect(body, func(n ast.Node) bool {
		switch n := n.(type) {
		case *ast.CallExpr:
			switch {
			case isCall(n, "subtle", "ConstantTimeCompare"):
				constantTime++
			case isCall(n, "bytes", "Equal"), isCall(n, "bytes", "Compare"), isCall(n, "reflect", "DeepEqual"), isCall(n, "strings", "EqualFold"):
				t.Errorf("%s: %s compares with a variable-time function", file, fn)
			}
		case *ast.BinaryExpr:
			if n.Op != token.EQL && n.Op != token.NEQ {
				return true
			}
			if isCall(n.X, "subtle", "ConstantTimeCompare") || isCall(n.Y, "subtle", "ConstantTimeCompare") {
				return true
			}
			if namesSecret(n.X) || namesSecret(n.Y) {
				t.Errorf("%s: %s compares key material with %s", file, fn, n.Op)
			}
		}
		return true
	})
	if constantTime == 0 {
		t.Errorf("%s: %s does not call subtle.ConstantTimeCompare", file, fn)
	}
}

// API keys and the admin token are compared in constant time: Authenticate
// (here) and the admin check (httpapi's authenticateAdmin) compare the
// SHA-256 of what was presented with the expected digest through
// crypto/subtle.ConstantTimeCompare and nothing else. A timing measurement
// would be noise on a shared machine; comparing digests is also what makes
// timing moot, since a client cannot steer a digest's prefix.
func TestKeyAndAdminTokenComparisonsAreConstantTime(t *testing.T) {
	checkConstantTimeCompare(t, "keystore.go", "Authenticate")
	checkConstantTimeCompare(t, filepath.Join("..", "httpapi", "auth.go"), "authenticateAdmin")
}

// queryCount is a pgx tracer counting statements.
type queryCount struct{ n atomic.Int64 }

func (q *queryCount) TraceQueryStart(ctx context.Context, _ *pgx.Conn, _ pgx.TraceQueryStartData) context.Context {
	q.n.Add(1)
	return ctx
}

func (q *queryCount) TraceQueryEnd(context.Context, *pgx.Conn, pgx.TraceQueryEndData) {}

// Every well-formed wrong key costs the same work and gets the same answer:
// an unknown id, a known id with a wrong secret and a revoked key each make
// exactly one lookup and one digest comparison (an unknown id is compared
// against a stand-in digest) and return the very same ErrInvalidKey, so
// neither the answer nor the database work tells them apart.
func TestWrongKeysAreIndistinguishable(t *testing.T) {
	ctx := context.Background()
	s, tenant := newStore(t)
	var cfg pgpool.Config
	if err := config.Load(&cfg); err != nil {
		t.Fatal(err)
	}
	pc, err := pgxpool.ParseConfig(cfg.URL)
	if err != nil {
		t.Fatal(err)
	}
	qc := &queryCount{}
	pc.ConnConfig.Tracer = qc
	db, err := pgxpool.NewWithConfig(ctx, pc)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	traced := New(db, 2*time.Second)

	_, live, err := s.IssueKey(ctx, tenant, "live")
	if err != nil {
		t.Fatal(err)
	}
	k, revoked, err := s.IssueKey(ctx, tenant, "revoked")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.RevokeKey(ctx, tenant, k.ID); err != nil {
		t.Fatal(err)
	}
	id, _ := ParseKeyID(live)
	wrongSecret := KeyPrefix + id + "_" + strings.Repeat("Z", keySecretLen)
	if strings.HasSuffix(live, strings.Repeat("Z", keySecretLen)) {
		wrongSecret = KeyPrefix + id + "_" + strings.Repeat("Y", keySecretLen)
	}
	if _, err := traced.Authenticate(ctx, live); err != nil {
		t.Fatalf("the live key: %v", err)
	}
	for name, key := range map[string]string{
		"unknown id":            KeyPrefix + "AAAAAAAAAAAA_" + live[len(KeyPrefix)+keyIDLen+1:],
		"wrong secret":          wrongSecret,
		"revoked":               revoked,
		"live id, revoked hash": KeyPrefix + id + revoked[len(KeyPrefix)+keyIDLen:],
	} {
		before := qc.n.Load()
		_, err := traced.Authenticate(ctx, key)
		if err != ErrInvalidKey { // the very value, not a wrapped one that could say more
			t.Errorf("%s: %v; want exactly ErrInvalidKey", name, err)
		}
		if n := qc.n.Load() - before; n != 1 {
			t.Errorf("%s: %d statements; want the one lookup every key costs", name, n)
		}
	}
}
