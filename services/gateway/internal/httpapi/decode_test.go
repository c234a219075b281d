package httpapi

import (
	"strings"
	"testing"
)

// The JSON bodies decoded into structs (the admin API, the prototype's
// POST /links) are refused as the protojson routes refuse them: a key twice,
// or a name in another case, is a 400 naming the key, not the last value
// or a case-folded match.
func TestDecodeJSONRefusesDuplicateAndMiscasedKeys(t *testing.T) {
	type tenant struct {
		ID   string `json:"id"`
		Plan string `json:"plan"`
	}
	for body, want := range map[string]string{
		`{"id":"a","plan":"free","plan":"pro"}`: `field "plan" appears twice`,
		`{"ID":"a","plan":"free"}`:              `unknown field "ID"`,
		`{"id":"a","Plan":"pro"}`:               `unknown field "Plan"`,
		`{"id":"a","colour":"red"}`:             `unknown field "colour"`,
		`{"id":"a","plan":1}`:                   `field "plan" must be a string`,
		`["id"]`:                                `not a JSON array`,
		`{"id":"a"} {"id":"b"}`:                 "unexpected data after the JSON object",
	} {
		var v tenant
		err := decodeJSON([]byte(body), &v)
		if err == nil || !strings.Contains(toAPIError(err).message, want) {
			t.Errorf("%s: %v, want an error containing %q", body, err, want)
		}
	}
	var v tenant
	if err := decodeJSON([]byte(`{"id":"a","plan":"pro"}`), &v); err != nil || v != (tenant{"a", "pro"}) {
		t.Errorf("a proper body: %v, %+v", err, v)
	}
}
