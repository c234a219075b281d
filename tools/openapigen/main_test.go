package main

import (
	"bytes"
	"os"
	"strings"
	"testing"
)

const (
	swaggerFile = "../../gen/openapi/kurz.swagger.json"
	overlayFile = "../../services/gateway/internal/httpapi/openapi.overlay.yaml"
	servedFile  = "../../services/gateway/internal/httpapi/openapi.json"
)

// The committed openapi.json is what the committed sources generate: an
// edit of the overlay or the protos without make gen fails here (and in
// make check-gen, which also regenerates the Swagger spec from the protos).
func TestServedDocumentIsCurrent(t *testing.T) {
	want, err := build(swaggerFile, overlayFile)
	if err != nil {
		t.Fatal(err)
	}
	got, err := os.ReadFile(servedFile)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, want) {
		t.Errorf("%s is stale: run make gen", servedFile)
	}
}

// The merge refuses an overlay that would hand-maintain what the protos
// generate, or that names what does not exist.
func TestMergeRefuses(t *testing.T) {
	sw := func() map[string]any {
		return map[string]any{
			"paths": map[string]any{"/v1/links/{link.code}": map[string]any{"patch": map[string]any{
				"operationId": "S_Update",
				"parameters": []any{
					map[string]any{"name": "link.code", "in": "path", "required": true, "type": "string"},
					map[string]any{"name": "link", "in": "body", "schema": map[string]any{"$ref": "#/definitions/Link"}},
				},
				"responses": map[string]any{"200": map[string]any{"schema": map[string]any{"$ref": "#/definitions/Link"}}},
			}}},
			"definitions": map[string]any{"Link": map[string]any{"type": "object", "properties": map[string]any{
				"password": map[string]any{"type": "string", "description": "Input only, never returned."},
			}}},
		}
	}
	ov := func(extra map[string]any) map[string]any {
		o := map[string]any{"openapi": "3.1.0", "components": map[string]any{"schemas": map[string]any{}}}
		for k, v := range extra {
			o[k] = v
		}
		return o
	}
	for name, tc := range map[string]struct {
		overlay map[string]any
		want    string
	}{
		"a generated schema": {ov(map[string]any{"components": map[string]any{"schemas": map[string]any{"Link": map[string]any{}}}}),
			"components/schemas/Link is a proto message"},
		"a mapped route": {ov(map[string]any{"paths": map[string]any{"/v1/links/{code}": map[string]any{"patch": map[string]any{}}}}),
			"PATCH /v1/links/{code} is a mapped RPC's route"},
		"an unknown operation": {ov(map[string]any{"mapped": map[string]any{"S_Gone": map[string]any{}}}), "mapped.S_Gone names no operation"},
		"an unknown parameter": {ov(map[string]any{"mapped": map[string]any{"S_Update": map[string]any{"parameters": map[string]any{"page": map[string]any{}}}}}),
			`parameter "page" is not one of the operation's`},
		"a dangling ref": {ov(map[string]any{"mapped": map[string]any{"_defaults": map[string]any{"responses": map[string]any{"400": map[string]any{"$ref": "#/components/responses/Nope"}}}}}),
			"$ref #/components/responses/Nope does not resolve"},
	} {
		t.Run(name, func(t *testing.T) {
			_, err := merge(sw(), tc.overlay)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("merge: %v, want an error containing %q", err, tc.want)
			}
		})
	}

	// And the conversion itself: {link.code} is {code}, the body a
	// requestBody, the status the overlay's, the refs components', an
	// input-only field writeOnly.
	doc, err := merge(sw(), ov(map[string]any{"mapped": map[string]any{"S_Update": map[string]any{"status": 202}}}))
	if err != nil {
		t.Fatal(err)
	}
	op := obj(obj(obj(doc["paths"])["/v1/links/{code}"])["patch"])
	if p := obj(arr(op["parameters"])[0]); p["name"] != "code" || p["in"] != "path" {
		t.Errorf("path parameter %v, want code", p)
	}
	schema := obj(obj(obj(obj(op["requestBody"])["content"])["application/json"])["schema"])
	if schema["$ref"] != "#/components/schemas/Link" {
		t.Errorf("request body schema %v", schema)
	}
	if r := obj(op["responses"]); r["202"] == nil || len(r) != 1 {
		t.Errorf("responses %v, want only 202", r)
	}
	if p := obj(obj(obj(obj(obj(doc["components"])["schemas"])["Link"])["properties"])["password"]); p["writeOnly"] != true {
		t.Errorf("Link.password %v, want writeOnly", p)
	}
}
