package main

import (
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"os"
	"path"
	"path/filepath"
	"reflect"
	"sort"
	"strconv"
	"strings"
)

// prefix starts every variable's name; pkg/config.Prefix (envdoc does not
// import pkg/config so that it depends on nothing it documents, and the
// test checks the two agree).
const prefix = "KURZ_"

// module is the repository's module path: imports under it are followed.
const module = "kurz.dev"

// variable is one environment variable a service reads.
type variable struct {
	Name     string // with the prefix
	Default  string
	Required bool   // no default tag: the service refuses to start without it
	Doc      string // the declaring field's doc comment, on one line
	Where    string // the declaring package's folder, slash-separated from the root
	Field    string // Type.Field, for a reader who looks for the code
}

// service is one service and the variables it reads, in declaration order.
type service struct {
	Name string
	Vars []variable
}

// scan reads every service under root/services, in name order.
func scan(root string) ([]service, error) {
	entries, err := os.ReadDir(filepath.Join(root, "services"))
	if err != nil {
		return nil, err
	}
	s := &scanner{root: root, fset: token.NewFileSet(), pkgs: map[string]*pkg{}}
	var services []service
	for _, e := range entries {
		app := path.Join("services", e.Name(), "internal", "app")
		if !e.IsDir() {
			continue
		}
		if _, err := os.Stat(filepath.Join(root, filepath.FromSlash(app))); err != nil {
			continue
		}
		// pkg/server.Main loads the logging settings first, then the
		// service's Config.
		var vars []variable
		for _, t := range []struct{ dir, typ string }{{"pkg/logging", "Config"}, {app, "Config"}} {
			got, err := s.structVars(t.dir, t.typ)
			if err != nil {
				return nil, fmt.Errorf("%s: %w", e.Name(), err)
			}
			vars = append(vars, got...)
		}
		services = append(services, service{Name: e.Name(), Vars: vars})
	}
	if len(services) == 0 {
		return nil, fmt.Errorf("no services/*/internal/app under %s", root)
	}
	return services, nil
}

// pkg is one parsed package: its type declarations and the file of each,
// whose imports resolve the selectors in it.
type pkg struct {
	types map[string]*ast.TypeSpec
	files map[string]*ast.File
}

type scanner struct {
	root string
	fset *token.FileSet
	pkgs map[string]*pkg // by folder
}

// load parses the non-test Go files of a folder once.
func (s *scanner) load(dir string) (*pkg, error) {
	if p, ok := s.pkgs[dir]; ok {
		return p, nil
	}
	full := filepath.Join(s.root, filepath.FromSlash(dir))
	entries, err := os.ReadDir(full)
	if err != nil {
		return nil, err
	}
	p := &pkg{types: map[string]*ast.TypeSpec{}, files: map[string]*ast.File{}}
	for _, e := range entries {
		name := e.Name()
		if e.IsDir() || !strings.HasSuffix(name, ".go") || strings.HasSuffix(name, "_test.go") {
			continue
		}
		f, err := parser.ParseFile(s.fset, filepath.Join(full, name), nil, parser.ParseComments|parser.SkipObjectResolution)
		if err != nil {
			return nil, err
		}
		for _, d := range f.Decls {
			g, ok := d.(*ast.GenDecl)
			if !ok || g.Tok != token.TYPE {
				continue
			}
			for _, spec := range g.Specs {
				ts := spec.(*ast.TypeSpec)
				p.types[ts.Name.Name] = ts
				p.files[ts.Name.Name] = f
			}
		}
	}
	s.pkgs[dir] = p
	return p, nil
}

// structVars lists the variables of the struct type typ in dir, descending
// into nested structs without an env tag as pkg/config does.
func (s *scanner) structVars(dir, typ string) ([]variable, error) {
	p, err := s.load(dir)
	if err != nil {
		return nil, err
	}
	ts, ok := p.types[typ]
	if !ok {
		return nil, fmt.Errorf("no type %s in %s", typ, dir)
	}
	st, ok := ts.Type.(*ast.StructType)
	if !ok {
		return nil, nil // not a struct: pkg/config does not descend into it
	}
	var vars []variable
	var prev *ast.Field
	for _, f := range st.Fields.List {
		doc := docText(f, prev, s.fset)
		prev = f
		names := fieldNames(f)
		if len(names) == 0 || !ast.IsExported(names[0]) {
			continue
		}
		tag := fieldTag(f)
		if env, ok := tag.Lookup("env"); ok {
			def, hasDefault := tag.Lookup("default")
			for _, n := range names {
				vars = append(vars, variable{
					Name: prefix + env, Default: def, Required: !hasDefault,
					Doc: doc, Where: dir, Field: path.Base(dir) + "." + typ + "." + n,
				})
			}
			continue
		}
		nestedDir, nestedTyp, ok := s.resolve(dir, p.files[typ], f.Type)
		if !ok {
			continue
		}
		nested, err := s.structVars(nestedDir, nestedTyp)
		if err != nil {
			return nil, err
		}
		for range names {
			vars = append(vars, nested...)
		}
	}
	return vars, nil
}

// resolve finds where a field's named type is declared, if in this module:
// a bare name in the same package, or pkg.Name through the file's imports.
// Pointers and types from elsewhere (time.Time) are not descended into.
func (s *scanner) resolve(dir string, file *ast.File, expr ast.Expr) (string, string, bool) {
	switch t := expr.(type) {
	case *ast.Ident:
		_, declared := s.pkgs[dir].types[t.Name] // else predeclared: int, string
		return dir, t.Name, declared
	case *ast.SelectorExpr:
		x, ok := t.X.(*ast.Ident)
		if !ok {
			return "", "", false
		}
		for _, imp := range file.Imports {
			p, _ := strconv.Unquote(imp.Path.Value)
			name := path.Base(p)
			if imp.Name != nil {
				name = imp.Name.Name
			}
			rest, ours := strings.CutPrefix(p, module+"/")
			if name == x.Name && ours {
				return rest, t.Sel.Name, true
			}
		}
	}
	return "", "", false
}

// fieldNames are a field's names; an embedded field is named by its type.
func fieldNames(f *ast.Field) []string {
	if len(f.Names) > 0 {
		names := make([]string, len(f.Names))
		for i, n := range f.Names {
			names[i] = n.Name
		}
		return names
	}
	switch t := f.Type.(type) {
	case *ast.Ident:
		return []string{t.Name}
	case *ast.SelectorExpr:
		return []string{t.Sel.Name}
	}
	return nil
}

func fieldTag(f *ast.Field) reflect.StructTag {
	if f.Tag == nil {
		return ""
	}
	raw, err := strconv.Unquote(f.Tag.Value)
	if err != nil {
		return ""
	}
	return reflect.StructTag(raw)
}

// docText is a field's doc comment (or its line comment) on one line. A
// field without one shares the doc of the field on the line just above it
// when that doc names it ("WalkRate and WalkBurst bound ...").
func docText(f, prev *ast.Field, fset *token.FileSet) string {
	c := f.Doc
	if c == nil {
		c = f.Comment
	}
	if c == nil && prev != nil && prev.Doc != nil && len(f.Names) > 0 &&
		fset.Position(f.Pos()).Line == fset.Position(prev.End()).Line+1 &&
		strings.Contains(prev.Doc.Text(), f.Names[0].Name) {
		c = prev.Doc
	}
	if c == nil {
		return ""
	}
	return strings.Join(strings.Fields(c.Text()), " ")
}

// shared splits off the variables every service reads from the same field
// with the same default, in the first service's order.
func shared(services []service) []variable {
	count := map[variable]int{}
	for _, svc := range services {
		for _, v := range svc.Vars {
			count[v]++
		}
	}
	var all []variable
	for _, v := range services[0].Vars {
		if count[v] == len(services) {
			all = append(all, v)
		}
	}
	sort.SliceStable(all, func(i, j int) bool { return all[i].Where < all[j].Where })
	return all
}
