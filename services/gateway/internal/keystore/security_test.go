package keystore

import (
	"go/ast"
	"go/parser"
	"go/token"
	"path/filepath"
	"testing"
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
