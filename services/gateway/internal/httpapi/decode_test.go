package httpapi

import (
	"strings"
	"testing"

	shortenerv1 "kurz.dev/gen/kurz/shortener/v1"
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

// A refusal repeats a bounded start of what it names: a key, or the token
// protojson stopped at, may be as long as the body (64 KiB), and a client
// must not get its body back in the error.
func TestJSONRefusalsRepeatABoundedKey(t *testing.T) {
	long := strings.Repeat("k", 50_000)
	type tenant struct {
		ID string `json:"id"`
	}
	var v tenant
	msgs := map[string]string{
		"decodeJSON, unknown":    toAPIError(decodeJSON([]byte(`{"`+long+`":1}`), &v)).message,
		"decodeProto, unknown":   toAPIError(decodeProto([]byte(`{"`+long+`":1}`), &shortenerv1.Link{})).message,
		"decodeProto, bad token": toAPIError(decodeProto([]byte(`{"longUrl":`+long+`}`), &shortenerv1.Link{})).message,
	}
	for what, msg := range msgs {
		if len(msg) > 400 || !strings.Contains(msg, "kkk") {
			t.Errorf("%s: a %d-byte message (%.80q...), want the key's start within 400 bytes", what, len(msg), msg)
		}
	}
}
