// Command schemagen writes the JSON schemas kubeconform validates the
// rendered overlays against (make tools runs it). kubeconform reads JSON
// schemas, which no package registry reachable here carries; the
// Kubernetes API's own OpenAPI document does come with the k8s.io/kubernetes
// module (api/openapi-spec/swagger.json, checked against the Go checksum
// database like any module download), so this converts that, the way
// openapi2jsonschema --kubernetes --stand-alone --strict builds
// yannh/kubernetes-json-schema: one schema per kind, every $ref inlined,
// additionalProperties false wherever properties are listed (kubectl's
// strict validation), int-or-string and quantities accepting both forms.
// Descriptions are dropped. The layout is kubeconform's:
// OUT/VERSION-standalone-strict/<kind>-<group>-<version>.json.
package main

import (
	"archive/zip"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
)

func main() {
	version := flag.String("version", "", "the k8s.io/kubernetes module version (v1.x.y)")
	out := flag.String("out", "", "where to write VERSION-standalone-strict/")
	flag.Parse()
	if err := run(*version, *out); err != nil {
		fmt.Fprintln(os.Stderr, "schemagen:", err)
		os.Exit(1)
	}
}

func run(version, out string) error {
	if version == "" || out == "" {
		return fmt.Errorf("want -version and -out")
	}
	spec, err := openAPISpec(version)
	if err != nil {
		return err
	}
	var doc struct {
		Definitions map[string]any `json:"definitions"`
	}
	if err := json.Unmarshal(spec, &doc); err != nil {
		return fmt.Errorf("swagger.json: %w", err)
	}
	dir := filepath.Join(out, version+"-standalone-strict")
	if err := os.RemoveAll(dir); err != nil { // no schema of an older run stays
		return err
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	for name, def := range doc.Definitions {
		gvks, _ := def.(map[string]any)["x-kubernetes-group-version-kind"].([]any)
		if len(gvks) == 0 {
			continue // not a kind of its own
		}
		data, err := json.Marshal(expand(def, doc.Definitions, map[string]bool{name: true}))
		if err != nil {
			return err
		}
		for _, g := range gvks {
			gvk, _ := g.(map[string]any)
			group, _ := gvk["group"].(string)
			v, _ := gvk["version"].(string)
			kind, _ := gvk["kind"].(string)
			suffix := "-" + v // kubeconform's KindSuffix: the group's first label, then the version
			if group != "" {
				suffix = "-" + strings.ToLower(strings.Split(group, ".")[0]) + suffix
			}
			if err := os.WriteFile(filepath.Join(dir, strings.ToLower(kind)+suffix+".json"), data, 0o644); err != nil {
				return err
			}
		}
	}
	return nil
}

// openAPISpec returns api/openapi-spec/swagger.json of k8s.io/kubernetes at
// version, downloaded (and verified) by the go command.
func openAPISpec(version string) ([]byte, error) {
	mod := "k8s.io/kubernetes@" + version
	cmd := exec.Command("go", "mod", "download", "-json", mod)
	cmd.Dir = os.TempDir() // outside any module: nothing is added to a go.sum
	cmd.Stderr = os.Stderr
	out, err := cmd.Output()
	if err != nil {
		return nil, fmt.Errorf("go mod download %s: %w", mod, err)
	}
	var dl struct{ Zip, Error string }
	if err := json.Unmarshal(out, &dl); err != nil || dl.Error != "" {
		return nil, fmt.Errorf("go mod download %s: %v %s", mod, err, dl.Error)
	}
	zr, err := zip.OpenReader(dl.Zip)
	if err != nil {
		return nil, err
	}
	defer zr.Close()
	f, err := zr.Open(mod + "/api/openapi-spec/swagger.json")
	if err != nil {
		return nil, err
	}
	defer f.Close()
	return io.ReadAll(f)
}

// quantity is resource.Quantity, a string in the OpenAPI document that the
// API also decodes from a number (cpu: 1).
const quantity = "io.k8s.apimachinery.pkg.api.resource.Quantity"

func stringOr(typ string) map[string]any {
	return map[string]any{"oneOf": []any{map[string]any{"type": "string"}, map[string]any{"type": typ}}}
}

// expand returns v with every $ref inlined (seen holds the definitions
// being expanded: a recursive type becomes {}, anything), strict objects
// and the two types the API decodes from a string or a number.
func expand(v any, defs map[string]any, seen map[string]bool) any {
	switch v := v.(type) {
	case []any:
		out := make([]any, len(v))
		for i, x := range v {
			out[i] = expand(x, defs, seen)
		}
		return out
	case map[string]any:
		if ref, ok := v["$ref"].(string); ok {
			name := strings.TrimPrefix(ref, "#/definitions/")
			if name == quantity {
				return stringOr("number")
			}
			if seen[name] {
				return map[string]any{}
			}
			seen[name] = true
			defer delete(seen, name)
			return expand(defs[name], defs, seen)
		}
		if v["format"] == "int-or-string" {
			return stringOr("integer")
		}
		out := map[string]any{}
		for k, x := range v {
			if k != "description" {
				out[k] = expand(x, defs, seen)
			}
		}
		if _, ok := out["properties"]; ok && out["additionalProperties"] == nil {
			out["additionalProperties"] = false
		}
		return out
	}
	return v
}
