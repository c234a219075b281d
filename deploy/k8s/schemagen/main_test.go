package main

import (
	"encoding/json"
	"testing"
)

// expand inlines references, makes every object with properties strict,
// lets int-or-string and quantities be either, drops descriptions, and
// stops a recursive type at {} instead of looping.
func TestExpand(t *testing.T) {
	var defs map[string]any
	if err := json.Unmarshal([]byte(`{
		"Port": {"description": "d", "type": "object", "required": ["port"], "properties": {
			"port": {"type": "integer"},
			"target": {"$ref": "#/definitions/IntOrString"},
			"limits": {"type": "object", "additionalProperties": {"$ref": "#/definitions/`+quantity+`"}}}},
		"IntOrString": {"type": "string", "format": "int-or-string"},
		"Tree": {"type": "object", "properties": {"children": {"type": "array", "items": {"$ref": "#/definitions/Tree"}}}}
	}`), &defs); err != nil {
		t.Fatal(err)
	}
	for name, want := range map[string]string{
		"Port": `{"additionalProperties":false,"properties":{"limits":{"additionalProperties":{"oneOf":[{"type":"string"},{"type":"number"}]},"type":"object"},` +
			`"port":{"type":"integer"},"target":{"oneOf":[{"type":"string"},{"type":"integer"}]}},"required":["port"],"type":"object"}`,
		"Tree": `{"additionalProperties":false,"properties":{"children":{"items":{},"type":"array"}},"type":"object"}`,
	} {
		got, err := json.Marshal(expand(defs[name], defs, map[string]bool{name: true}))
		if err != nil {
			t.Fatal(err)
		}
		if string(got) != want {
			t.Errorf("%s:\n got %s\nwant %s", name, got, want)
		}
	}
}
