//go:build integration

package app

import (
	"encoding/json"
	"net/http"
	"slices"
	"strings"
	"testing"
)

// The OpenAPI document served at /v1/openapi.json describes exactly the
// routes the gateway serves (the unit test TestOpenAPIDocumentsEveryRoute
// compares it with the API's route table): asked on the running gateway,
// each documented path allows exactly the documented methods (the mux's
// Allow list) and answers each of them from a route, not the router's
// 404/405. Every $ref resolves and every operation has an operationId and
// responses.
func TestOpenAPIMatchesRoutes(t *testing.T) {
	gw := startGateway(t, nil)
	c := newClient(t, gw, "")
	r := c.do("GET", "/v1/openapi.json", "")
	if r.code != http.StatusOK || r.header.Get("Content-Type") != "application/json" {
		t.Fatalf("GET /v1/openapi.json: %d %s", r.code, r.header.Get("Content-Type"))
	}
	var doc struct {
		OpenAPI string                                `json:"openapi"`
		Paths   map[string]map[string]json.RawMessage `json:"paths"`
	}
	if err := json.Unmarshal(r.body, &doc); err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(doc.OpenAPI, "3.") {
		t.Errorf("openapi %q, want 3.x", doc.OpenAPI)
	}

	methods := []string{"get", "put", "post", "delete", "options", "head", "patch", "trace"}
	documented := map[string][]string{} // path -> upper-case methods
	opIDs := map[string]bool{}
	for path, item := range doc.Paths {
		for key, raw := range item {
			if !slices.Contains(methods, key) {
				continue
			}
			m := strings.ToUpper(key)
			documented[path] = append(documented[path], m)
			var op struct {
				OperationID string                     `json:"operationId"`
				Responses   map[string]json.RawMessage `json:"responses"`
			}
			if err := json.Unmarshal(raw, &op); err != nil || op.OperationID == "" || len(op.Responses) == 0 || opIDs[op.OperationID] {
				t.Errorf("%s %s: operationId %q (unique?), %d responses: want both", m, path, op.OperationID, len(op.Responses))
			}
			opIDs[op.OperationID] = true
		}
	}

	// The running gateway: Allow lists exactly the documented methods (and
	// HEAD with GET), and each documented operation reaches a route.
	fill := strings.NewReplacer("{code}", "abcd123", "{tenant}", "no-such-tenant", "{key}", "nokey", "{version}", "v3", "{shortCode}", "abcd123")
	for path, ms := range documented {
		concrete := fill.Replace(path)
		r := c.do("OPTIONS", concrete, "")
		allow := strings.Split(r.header.Get("Allow"), ", ")
		want := slices.Clone(ms)
		if slices.Contains(want, "GET") {
			want = append(want, "HEAD")
		}
		slices.Sort(allow)
		slices.Sort(want)
		if r.code != http.StatusMethodNotAllowed || !slices.Equal(allow, want) {
			t.Errorf("OPTIONS %s: %d, Allow %v; want 405 with the documented methods %v", concrete, r.code, allow, want)
		}
		for _, m := range ms {
			r := c.do(m, concrete, "")
			if r.code == http.StatusMethodNotAllowed || (r.code == http.StatusNotFound && strings.Contains(string(r.body), "no such route")) {
				t.Errorf("%s %s: %s; the router does not serve a documented operation", m, concrete, r)
			}
		}
	}

	// Every local $ref points at something.
	var whole any
	if err := json.Unmarshal(r.body, &whole); err != nil {
		t.Fatal(err)
	}
	var walk func(v any)
	walk = func(v any) {
		switch v := v.(type) {
		case map[string]any:
			if ref, ok := v["$ref"].(string); ok && resolve(whole, ref) == nil {
				t.Errorf("$ref %s does not resolve", ref)
			}
			for _, x := range v {
				walk(x)
			}
		case []any:
			for _, x := range v {
				walk(x)
			}
		}
	}
	walk(whole)
}

// resolve follows a local JSON pointer ref ("#/components/...") in doc.
func resolve(doc any, ref string) any {
	if !strings.HasPrefix(ref, "#/") {
		return nil
	}
	cur := doc
	for _, part := range strings.Split(ref[2:], "/") {
		m, ok := cur.(map[string]any)
		if !ok {
			return nil
		}
		cur = m[strings.NewReplacer("~1", "/", "~0", "~").Replace(part)]
	}
	return cur
}
