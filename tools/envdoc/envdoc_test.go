package main

import (
	"bytes"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	"kurz.dev/pkg/config"
)

// root is the repository root, from this package's folder.
var root = filepath.Join("..", "..")

func TestConfigurationDocIsCurrent(t *testing.T) {
	services, err := scan(root)
	if err != nil {
		t.Fatal(err)
	}
	want := render(services)
	got, err := os.ReadFile(filepath.Join(root, "docs", "configuration.md"))
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, want) {
		t.Errorf("docs/configuration.md is stale: run make docs")
	}
}

func TestPrefixIsConfigPrefix(t *testing.T) {
	if prefix != config.Prefix {
		t.Errorf("prefix %q, pkg/config reads %q", prefix, config.Prefix)
	}
}

// The fixture in testdata has what pkg/config descends into (an embedded
// struct from another package, a named field of a local type, a struct two
// levels down) and what it does not (time.Time, a pointer, an unexported
// field, a plain int without a tag).
func TestScanWalksConfigAsPkgConfigDoes(t *testing.T) {
	services, err := scan(filepath.Join("testdata"))
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, s := range services {
		names = append(names, s.Name)
	}
	if got, want := strings.Join(names, ","), "demo,other"; got != want {
		t.Fatalf("services %s, want %s (a folder without internal/app is no service)", got, want)
	}
	want := []variable{
		{Name: "KURZ_LOG_LEVEL", Default: "info", Doc: "Level is the log level.", Where: "pkg/logging", Field: "logging.Config.Level"},
		{Name: "KURZ_SHARED_ADDR", Default: "127.0.0.1:1", Doc: "Addr is where it listens.", Where: "pkg/shared", Field: "shared.Block.Addr"},
		{Name: "KURZ_SHARED_TIMEOUT", Default: "1s", Doc: "Timeout bounds a call.", Where: "pkg/shared", Field: "shared.Block.Timeout"},
		{Name: "KURZ_SHARED_DEPTH", Default: "2", Where: "pkg/shared", Field: "shared.inner.Depth"},
		{Name: "KURZ_DEMO_TOKEN", Required: true, Doc: "Token is required: it has no default.", Where: "services/demo/internal/app", Field: "app.Config.Token"},
		{Name: "KURZ_DEMO_RATE", Default: "10", Doc: "Rate and Burst bound the demo together.", Where: "services/demo/internal/app", Field: "app.Config.Rate"},
		{Name: "KURZ_DEMO_BURST", Default: "", Doc: "Rate and Burst bound the demo together.", Where: "services/demo/internal/app", Field: "app.Config.Burst"},
		{Name: "KURZ_DEMO_UNDOCUMENTED", Default: "3", Where: "services/demo/internal/app", Field: "app.Config.Undocumented"},
		{Name: "KURZ_DEMO_NAME", Default: "demo", Doc: "Name is declared in the service's own package.", Where: "services/demo/internal/app", Field: "app.local.Name"},
	}
	if got := services[0].Vars; !reflect.DeepEqual(got, want) {
		t.Errorf("demo's variables:\n got %+v\nwant %+v", got, want)
	}
	if got := shared(services); len(got) != 1 || got[0].Name != "KURZ_LOG_LEVEL" {
		t.Errorf("shared: got %+v, want KURZ_LOG_LEVEL alone", got)
	}
}

func TestRenderMarksRequiredEmptyAndEscapes(t *testing.T) {
	doc := string(render([]service{{Name: "svc", Vars: []variable{
		{Name: "KURZ_A", Required: true, Doc: "a | b", Field: "app.Config.A"},
		{Name: "KURZ_B", Field: "app.Config.B"},
	}}}))
	for _, want := range []string{"| `KURZ_A` | required | `app.Config.A` | a \\| b |", "| `KURZ_B` | empty | `app.Config.B` |"} {
		if !strings.Contains(doc, want) {
			t.Errorf("rendered document lacks %q:\n%s", want, doc)
		}
	}
}

// Every variable is described where it is declared: its field's doc
// comment is the documentation, so a field without one fails here.
func TestEveryVariableHasADocComment(t *testing.T) {
	services, err := scan(root)
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range services {
		for _, v := range s.Vars {
			if v.Doc == "" {
				t.Errorf("%s (%s) has no doc comment", v.Name, v.Field)
			}
		}
	}
}
