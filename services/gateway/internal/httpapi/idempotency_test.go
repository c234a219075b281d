package httpapi

import (
	"net/http/httptest"
	"strings"
	"testing"

	"kurz.dev/pkg/callmeta"
)

func TestParseIdempotencyKey(t *testing.T) {
	for in, want := range map[string]string{
		"8e03978e-40d5-43e8-bc93-6894a57f9324":   "8e03978e-40d5-43e8-bc93-6894a57f9324",
		`"8e03978e-40d5-43e8-bc93-6894a57f9324"`: "8e03978e-40d5-43e8-bc93-6894a57f9324",
		` order 4711 `:                           "order 4711",
		`"say \"hi\" \\ there"`:                  `say "hi" \ there`,
		`a"b`:                                    `a"b`,
		`"a, b"`:                                 "a, b",
		strings.Repeat("k", callmeta.MaxIdempotencyKey): strings.Repeat("k", callmeta.MaxIdempotencyKey),
	} {
		if got, err := parseIdempotencyKey(in); err != nil || got != want {
			t.Errorf("parseIdempotencyKey(%q) = %q, %v; want %q", in, got, err, want)
		}
	}
	for _, bad := range []string{"", `""`, "a, b", "k1,k2", `"a"b"`, `"a\nb"`, `"trailing\"`, "a\x01b", "schlüssel",
		strings.Repeat("k", callmeta.MaxIdempotencyKey+1)} {
		if got, err := parseIdempotencyKey(bad); err == nil {
			t.Errorf("parseIdempotencyKey(%q) = %q; want an error", bad, got)
		}
	}
}

// The header is read on the route that takes it, refused on a POST route
// that does not (the client would think the POST safe to repeat), and
// left alone on other methods.
func TestIdempotencyKeyByRoute(t *testing.T) {
	takes := route{pattern: "POST /v1/links", rpc: &mapping{idempotent: true}}
	for _, tc := range []struct {
		rt      route
		method  string
		values  []string
		key     string
		refusal string
	}{
		{takes, "POST", []string{`"k-1"`}, "k-1", ""},
		{takes, "POST", nil, "", ""},
		{takes, "POST", []string{"k-1", "k-2"}, "", callmeta.ReasonIdempotencyKeyInvalid},
		{takes, "POST", []string{"   "}, "", callmeta.ReasonIdempotencyKeyInvalid},
		{route{pattern: "POST /v1/links:batch", rpc: &mapping{}}, "POST", []string{"k-1"}, "", callmeta.ReasonIdempotencyKeyUnsupported},
		{route{pattern: "POST /links"}, "POST", []string{"k-1"}, "", callmeta.ReasonIdempotencyKeyUnsupported},
		{route{pattern: "PATCH /v1/links/{code}", rpc: &mapping{}}, "PATCH", []string{"k-1"}, "", ""},
	} {
		r := httptest.NewRequest(tc.method, "/x", nil)
		for _, v := range tc.values {
			r.Header.Add(idempotencyHeader, v)
		}
		c := &call{r: r}
		err := idempotencyKey(c, tc.rt)
		what := tc.rt.pattern + " " + strings.Join(tc.values, ",")
		switch e := toAPIError(err); {
		case tc.refusal == "" && err != nil:
			t.Errorf("%s: %v; want it taken", what, err)
		case tc.refusal != "" && (err == nil || e.status != 400 || e.reason != tc.refusal):
			t.Errorf("%s: %v; want 400 %s", what, err, tc.refusal)
		case c.idempotencyKey != tc.key:
			t.Errorf("%s: key %q, want %q", what, c.idempotencyKey, tc.key)
		}
	}
}
