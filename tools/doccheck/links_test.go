package doccheck

import (
	"os"
	"path/filepath"
	"reflect"
	"testing"
)

// Every relative link of the repository's Markdown files names a file or
// folder that exists, and every #anchor a heading of the file it names.
func TestDocLinksResolve(t *testing.T) {
	root := filepath.Join("..", "..")
	files, err := markdownFiles(root)
	if err != nil {
		t.Fatal(err)
	}
	if len(files) < 10 {
		t.Fatalf("found %d Markdown files under %s: %v", len(files), root, files)
	}
	got, err := linkProblems(root, files)
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range got {
		t.Error(p)
	}
}

// The anchors GitHub makes of headings: lower case, punctuation dropped,
// spaces as hyphens, a repeated heading numbered, HTML anchors kept; and
// none of a heading inside a code block.
func TestAnchors(t *testing.T) {
	doc := "# The public API\n" +
		"## Coming from envoyproxy/ratelimit\n" +
		"### `KURZ_PPROF` and [pprof](x.md) (on, off)\n" +
		"## Notes\n## Notes\n" +
		"<a id=\"by-hand\"></a>\n" +
		"```sh\n# not a heading\n```\n" +
		"#hashtag\n"
	got := anchors([]byte(doc))
	want := map[string]bool{
		"the-public-api": true, "coming-from-envoyproxyratelimit": true,
		"kurz_pprof-and-pprof-on-off": true, "notes": true, "notes-1": true,
		"by-hand": true,
	}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("anchors = %v, want %v", got, want)
	}
}

// The check on a small tree: a missing file, a missing anchor in another
// file and in the same one, a link out of the repository; and links that
// hold, in code that is not checked, and with a scheme.
func TestLinkProblemsReportsBrokenLinks(t *testing.T) {
	root := t.TempDir()
	write := func(p, s string) {
		if err := os.MkdirAll(filepath.Dir(filepath.Join(root, p)), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(root, p), []byte(s), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	write("docs/b.md", "# B\n## Make targets\n")
	write("pkg/x/x.go", "package x\n")
	write("README.md", "# Top\n"+
		"[ok](docs/b.md#make-targets) [ok](pkg/x/) [ok](#top) [web](https://example.com/#nope)\n"+
		"[gone](docs/c.md) and [no anchor](docs/b.md#make-target)\n"+
		"`[code](docs/none.md)` [self](#bottom)\n"+
		"```\n[block](docs/none.md)\n```\n"+
		"[out](../elsewhere.md) ![img](docs/shot.png)\n"+
		"[ref]: docs/b.md#b\n")
	got, err := linkProblems(root, []string{"README.md"})
	if err != nil {
		t.Fatal(err)
	}
	want := []string{
		"README.md:3: docs/c.md: no such file or folder",
		"README.md:3: docs/b.md#make-target: docs/b.md has no heading or anchor #make-target",
		"README.md:4: #bottom: README.md has no heading or anchor #bottom",
		"README.md:8: ../elsewhere.md: leaves the repository",
		"README.md:8: docs/shot.png: no such file or folder",
	}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("problems:\n%q\nwant:\n%q", got, want)
	}
}
