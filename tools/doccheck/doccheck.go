// Package doccheck checks that the docs match the repository: its tests
// fail when docs/architecture.md's Layout misses a folder or names one that
// is gone, when a service README's table gives a default the code does
// not declare, and when a relative link or #anchor of a Markdown file leads
// nowhere. It holds the checks; the tests run them on the repository.
package doccheck

import (
	"bufio"
	"bytes"
	"fmt"
	"os"
	"path"
	"path/filepath"
	"sort"
	"strings"
)

// levels are the parents whose every folder the Layout must name, as
// path.Match patterns from the repository root ("." is the root).
var levels = []string{
	".", "cmd", "deploy", "pkg", "pkg/testkit", "tools",
	"services", "services/*", "services/*/cmd", "services/*/internal",
}

// ignored are folders no Layout names: version control, the local stack's
// runtime data, build and test output (all git-ignored), and test fixtures.
var ignored = map[string]bool{
	".git": true, ".local": true, "bin": true, "node_modules": true,
	"testdata": true, "dist": true, ".tilt": true, "artifacts": true,
}

// named returns the folders a Layout section names: each list item that
// starts with a backquoted path ending in "/", under the "## Layout"
// heading up to the next "## " heading.
func named(doc []byte) []string {
	var names []string
	in := false
	sc := bufio.NewScanner(bytes.NewReader(doc))
	for sc.Scan() {
		l := sc.Text()
		if strings.HasPrefix(l, "## ") {
			in = l == "## Layout"
			continue
		}
		rest, ok := strings.CutPrefix(l, "- `")
		if !in || !ok {
			continue
		}
		p, _, ok := strings.Cut(rest, "`")
		if ok && strings.HasSuffix(p, "/") {
			names = append(names, strings.TrimSuffix(p, "/"))
		}
	}
	return names
}

// folders lists every folder at the levels under root, slash-separated
// from root, sorted.
func folders(root string) ([]string, error) {
	var found []string
	seen := map[string]bool{}
	err := filepath.WalkDir(root, func(p string, d os.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if !d.IsDir() || p == root {
			return nil
		}
		if ignored[d.Name()] {
			return filepath.SkipDir
		}
		rel, err := filepath.Rel(root, p)
		if err != nil {
			return err
		}
		rel = filepath.ToSlash(rel)
		if atLevel(path.Dir(rel)) && !seen[rel] {
			seen[rel] = true
			found = append(found, rel)
		}
		return nil
	})
	sort.Strings(found)
	return found, err
}

func atLevel(parent string) bool {
	for _, l := range levels {
		if ok, _ := path.Match(l, parent); ok {
			return true
		}
	}
	return false
}

// problems compares a Layout with the tree under root: a folder at the
// levels that it does not name, or a name that is no folder.
func problems(root string, doc []byte) ([]string, error) {
	found, err := folders(root)
	if err != nil {
		return nil, err
	}
	isNamed := map[string]bool{}
	var out []string
	for _, n := range named(doc) {
		isNamed[n] = true
		if fi, err := os.Stat(filepath.Join(root, filepath.FromSlash(n))); err != nil || !fi.IsDir() {
			out = append(out, fmt.Sprintf("the Layout names %s/, which is not a folder", n))
		}
	}
	for _, f := range found {
		if !isNamed[f] {
			out = append(out, fmt.Sprintf("%s/ exists but the Layout does not name it", f))
		}
	}
	return out, nil
}
