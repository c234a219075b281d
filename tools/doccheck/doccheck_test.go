package doccheck

import (
	"encoding/json"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
)

func TestLayoutNamesEveryFolder(t *testing.T) {
	root := filepath.Join("..", "..")
	doc, err := os.ReadFile(filepath.Join(root, "docs", "architecture.md"))
	if err != nil {
		t.Fatal(err)
	}
	if n := len(named(doc)); n < 20 {
		t.Fatalf("docs/architecture.md's Layout names %d folders; is the section still \"## Layout\" with \"- `path/`: role\" items?", n)
	}
	got, err := problems(root, doc)
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range got {
		t.Errorf("docs/architecture.md: %s", p)
	}
}

// The check on a small tree: a folder the Layout misses, one it names that
// is gone, folders below the levels and ignored ones that it need not name.
func TestProblemsReportsMissingAndStaleFolders(t *testing.T) {
	root := t.TempDir()
	for _, d := range []string{
		"pkg/config", "pkg/extra", "pkg/config/deeper", "pkg/testkit/stack",
		"services/limiter/internal/app", "services/limiter/internal/app/testdata",
		"bin", ".local/log", "testdata",
	} {
		if err := os.MkdirAll(filepath.Join(root, d), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	doc := []byte("# Architecture\n\n## Layout\n\n" +
		"- `pkg/`: shared.\n- `pkg/config/`: config.\n- `pkg/testkit/`: kits.\n- `pkg/testkit/stack/`: the gate.\n" +
		"- `services/`: services.\n- `services/limiter/`: the limiter.\n- `services/limiter/internal/`: its packages.\n" +
		"- `services/limiter/internal/app/`: wiring.\n- `pkg/gone/`: removed.\n\n" +
		"## Next\n\n- `pkg/extra/`: named outside the Layout, so not named.\n")
	got, err := problems(root, doc)
	if err != nil {
		t.Fatal(err)
	}
	want := []string{
		"the Layout names pkg/gone/, which is not a folder",
		"pkg/extra/ exists but the Layout does not name it",
	}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("problems:\n got %q\nwant %q", got, want)
	}
}

// The services' READMEs keep short tables of their own settings; each
// default there must be the one the code declares (docs/configuration.md
// is generated from it), so the two cannot drift apart.
func TestServiceREADMEDefaultsMatchTheCode(t *testing.T) {
	root := filepath.Join("..", "..")
	generated, err := os.ReadFile(filepath.Join(root, "docs", "configuration.md"))
	if err != nil {
		t.Fatal(err)
	}
	readmes, err := filepath.Glob(filepath.Join(root, "services", "*", "README.md"))
	if err != nil || len(readmes) < 5 {
		t.Fatalf("service READMEs: %v %v", readmes, err)
	}
	rows := 0
	for _, p := range readmes {
		readme, err := os.ReadFile(p)
		if err != nil {
			t.Fatal(err)
		}
		rows += len(defaults(readme))
		for _, problem := range staleDefaults(readme, generated) {
			t.Errorf("%s: %s", p, problem)
		}
	}
	if rows < 20 {
		t.Fatalf("found %d variables in the service READMEs' tables; has their format changed?", rows)
	}
}

func TestStaleDefaults(t *testing.T) {
	generated := []byte("| `KURZ_A` | `5s` | `x.A` | a |\n| `KURZ_B` | `1` | `x.B` | b |\n")
	readme := []byte("| `KURZ_A` | `5s` | fine |\n| `KURZ_B` | `2` | stale |\n| `KURZ_C` | `0` | gone |\n| `KURZ_D` | empty | not compared |\n")
	got := staleDefaults(readme, generated)
	want := map[string]bool{
		"KURZ_B: default `2`, docs/configuration.md says [\"1\"]": true,
		"KURZ_C: no such variable in docs/configuration.md":       true,
	}
	if len(got) != len(want) {
		t.Fatalf("got %q, want %d problems", got, len(want))
	}
	for _, g := range got {
		if !want[g] {
			t.Errorf("unexpected problem %q", g)
		}
	}
}

// The project's license is one: LICENSE is the Apache License 2.0, and the
// README and the OpenAPI document name that one.
func TestLicenseIsOneAndNamedEverywhere(t *testing.T) {
	root := filepath.Join("..", "..")
	read := func(p string) string {
		b, err := os.ReadFile(filepath.Join(root, p))
		if err != nil {
			t.Fatal(err)
		}
		return string(b)
	}
	if l := read("LICENSE"); !strings.Contains(l, "Apache License") || !strings.Contains(l, "Version 2.0, January 2004") {
		t.Errorf("LICENSE is not the Apache License 2.0")
	}
	if !strings.Contains(read("README.md"), "[Apache License 2.0](LICENSE)") {
		t.Errorf("README.md does not name the Apache License 2.0 with a link to LICENSE")
	}
	var spec struct {
		Info struct {
			License struct{ Identifier string } `json:"license"`
		} `json:"info"`
	}
	if err := json.Unmarshal([]byte(read("services/gateway/internal/httpapi/openapi.json")), &spec); err != nil {
		t.Fatal(err)
	}
	if spec.Info.License.Identifier != "Apache-2.0" {
		t.Errorf("openapi.json names license %q, want Apache-2.0", spec.Info.License.Identifier)
	}
}
