//go:build integration

package app

import (
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"
)

// Bad input gets a clear 4xx with a problem detail (a message naming
// the problem) and writes nothing: the tenant's link count and its one link
// are the same after the whole table.
func TestBadInput(t *testing.T) {
	gw := startGateway(t, nil)
	tn := newTenant(t, gw, "free")
	c := newClient(t, gw, tn.key)
	r := c.do("POST", "/v1/links", `{"longUrl":"https://example.com/kept"}`)
	if r.code != http.StatusCreated {
		t.Fatalf("create: %s", r)
	}
	code := r.json(t)["code"].(string)
	before := linkCount(t, c)

	big := `{"longUrl":"https://example.com/` + strings.Repeat("a", 70<<10) + `"}`
	for _, tc := range []struct {
		name, method, path, body string
		header                   []string
		status                   int
		code, msg                string // the error body's code; a part of its message
	}{
		{"malformed JSON", "POST", "/v1/links", `{"longUrl":`, nil, 400, "INVALID_ARGUMENT", "invalid JSON body: unexpected EOF"},
		{"not an object", "POST", "/v1/links", `["https://example.com"]`, nil, 400, "INVALID_ARGUMENT", "invalid JSON body"},
		{"wrong type", "POST", "/v1/links", `{"longUrl":42}`, nil, 400, "INVALID_ARGUMENT", "longUrl"},
		{"unknown enum value", "POST", "/v1/links", `{"longUrl":"https://example.com/","mode":"CODE_MODE_FAST"}`, nil, 400, "INVALID_ARGUMENT", "CODE_MODE_FAST"},
		{"unknown field", "POST", "/v1/links", `{"longUrl":"https://example.com/","colour":"red"}`, nil, 400, "INVALID_ARGUMENT", `unknown field "colour"`},
		{"duplicate field", "POST", "/v1/links", `{"longUrl":"https://a.example/","longUrl":"https://b.example/"}`, nil, 400, "INVALID_ARGUMENT", "duplicate field"},
		{"trailing data", "POST", "/v1/links", `{"longUrl":"https://example.com/"} {}`, nil, 400, "INVALID_ARGUMENT", "invalid JSON body"},
		{"empty body", "POST", "/v1/links", "", nil, 400, "INVALID_ARGUMENT", "the request body is empty"},
		{"oversized body", "POST", "/v1/links", big, nil, 413, "PAYLOAD_TOO_LARGE", "larger than 65536 bytes"},
		{"huge headers", "GET", "/v1/links", "", []string{"X-Big", strings.Repeat("b", 64<<10)}, 431, "HEADERS_TOO_LARGE", "the limit is 16384"},
		{"huge URI", "GET", "/v1/links?page_token=" + strings.Repeat("t", 9<<10), "", nil, 414, "URI_TOO_LONG", "longer than 8192 bytes"},
		{"PUT on a collection", "PUT", "/v1/links", `{}`, nil, 405, "METHOD_NOT_ALLOWED", "allowed: GET, HEAD, POST"},
		{"TRACE", "TRACE", "/v1/links", "", nil, 405, "METHOD_NOT_ALLOWED", "method TRACE is not allowed"},
		{"made-up method on a link", "BREW", "/v1/links/" + code, "", nil, 405, "METHOD_NOT_ALLOWED", "allowed: DELETE, GET, HEAD, PATCH"},
		{"POST on a link", "POST", "/v1/links/" + code, `{"longUrl":"https://example.com/"}`, nil, 405, "METHOD_NOT_ALLOWED", "allowed:"},
		{"PATCH with If-Match", "PATCH", "/v1/links/" + code, `{"disabled":true}`, []string{"If-Match", `"stale-version"`}, 412, "PRECONDITION_FAILED", "changed since you read it"},
		{"DELETE with If-Unmodified-Since", "DELETE", "/v1/links/" + code, "", []string{"If-Unmodified-Since", "Mon, 01 Jan 1990 00:00:00 GMT"}, 412, "PRECONDITION_FAILED", "If-Unmodified-Since cannot hold"},
		{"unknown route", "GET", "/v1/nothing", "", nil, 404, "NOT_FOUND", "no such route"},
		{"path traversal", "GET", "/v1/links/../admin/tenants", "", nil, 400, "INVALID_ARGUMENT", "not canonical"},
		{"encoded path traversal", "DELETE", "/v1/links/..%2F..%2Fadmin%2Ftenants", "", nil, 400, "INVALID_ARGUMENT", "not canonical"},
		{"encoded slash in a code", "DELETE", "/v1/links/ab%2Fcdef", "", nil, 400, "INVALID_ARGUMENT", "not a short code"},
		{"dot segment", "DELETE", "/v1/links/./" + code, "", nil, 400, "INVALID_ARGUMENT", "not canonical"},
		{"double slash", "GET", "//v1/links", "", nil, 400, "INVALID_ARGUMENT", "not canonical"},
		{"code too long", "GET", "/v1/links/" + strings.Repeat("a", 40), "", nil, 400, "INVALID_ARGUMENT", "4 to 32 letters"},
		{"unicode code", "DELETE", "/v1/links/%E2%80%AEabcd", "", nil, 400, "INVALID_ARGUMENT", "not a short code"},
		{"PATCH a code", "PATCH", "/v1/links/" + code, `{"code":"other12"}`, nil, 400, "INVALID_ARGUMENT", `field "code" cannot be changed`},
		{"PATCH a tenant", "PATCH", "/v1/links/" + code, `{"tenant":"someone-else","longUrl":"https://evil.example/"}`, nil, 400, "INVALID_ARGUMENT", "cannot be changed"},
		{"PATCH nothing", "PATCH", "/v1/links/" + code, `{}`, nil, 400, "INVALID_ARGUMENT", "nothing to change"},
		{"PATCH a wrong type", "PATCH", "/v1/links/" + code, `{"disabled":"yes"}`, nil, 400, "INVALID_ARGUMENT", "disabled"},
		{"PATCH a bad URL", "PATCH", "/v1/links/" + code, `{"longUrl":"ftp://example.com/"}`, nil, 400, "INVALID_ARGUMENT", "only http and https"},
		{"unknown query parameter", "GET", "/v1/links?pagesize=2", "", nil, 400, "INVALID_ARGUMENT", `unknown query parameter "pagesize"`},
		{"repeated query parameter", "GET", "/v1/links?page_size=2&page_size=3", "", nil, 400, "INVALID_ARGUMENT", "given 2 times"},
		{"negative page_size", "GET", "/v1/links?page_size=-1", "", nil, 400, "INVALID_ARGUMENT", "page_size"},
		{"page_size not a number", "GET", "/v1/links?page_size=ten", "", nil, 400, "INVALID_ARGUMENT", "page_size"},
		{"forged page_token", "GET", "/v1/links?page_token=garbage", "", nil, 400, "INVALID_ARGUMENT", "page_token"},
		{"stats with a bad time", "GET", "/v1/links/" + code + "/stats?start_time=yesterday", "", nil, 400, "INVALID_ARGUMENT", "RFC 3339"},
		{"stats with a bad interval", "GET", "/v1/links/" + code + "/stats?interval=minute", "", nil, 400, "INVALID_ARGUMENT", "interval"},
		// ClickHouse's DateTime would take these modulo 2^32: 2163 reads as 2026.
		{"stats past 2106", "GET", "/v1/links/" + code + "/stats?start_time=2163-01-10T06:28:16Z&end_time=2163-01-12T06:28:16Z&interval=day", "", nil, 400, "INVALID_ARGUMENT", "end_time 2163-01-12T06:28:16Z is outside the times statistics cover"},
		{"stats before 1970", "GET", "/v1/links/" + code + "/stats?start_time=1969-12-31T00:00:00Z&end_time=1970-01-02T00:00:00Z", "", nil, 400, "INVALID_ARGUMENT", "start_time 1969-12-31T00:00:00Z is outside"},
		{"qr in GIF", "GET", "/v1/links/" + code + "/qr?format=gif", "", nil, 400, "INVALID_ARGUMENT", "format"},
		{"qr too small", "GET", "/v1/links/" + code + "/qr?size=5", "", nil, 400, "INVALID_ARGUMENT", "size"},
		{"javascript: URL", "POST", "/v1/links", `{"longUrl":"javascript:alert(1)"}`, nil, 400, "INVALID_ARGUMENT", "only http and https"},
		{"data: URL", "POST", "/v1/links", `{"longUrl":"data:text/html,<script>alert(1)</script>"}`, nil, 400, "INVALID_ARGUMENT", "only http and https"},
		{"unicode: right-to-left override in the host", "POST", "/v1/links", `{"longUrl":"https://exa\u202emple.com/"}`, nil, 400, "INVALID_ARGUMENT", "host"},
		{"unicode: full-width scheme", "POST", "/v1/links", `{"longUrl":"ｈｔｔｐｓ://example.com/"}`, nil, 400, "INVALID_ARGUMENT", "URL"},
		{"unicode: invalid UTF-8", "POST", "/v1/links", "{\"longUrl\":\"https://example.com/\xff\"}", nil, 400, "INVALID_ARGUMENT", "UTF-8"},
		{"unicode: NUL in the URL", "POST", "/v1/links", `{"longUrl":"https://example.com/\u0000x"}`, nil, 400, "INVALID_ARGUMENT", "URL"},
		{"malformed Authorization", "GET", "/v1/links", "", []string{"Authorization", "", "Authorization", "Basic dXNlcjpwYXNz"}, 401, "UNAUTHENTICATED", "Bearer"},
		{"compat: malformed JSON", "POST", "/links", `{"longUrl":`, nil, 400, "INVALID_ARGUMENT", "the JSON ends too early"},
		{"compat: unknown field", "POST", "/links", `{"longUrl":"https://example.com/","alias":"x"}`, nil, 400, "INVALID_ARGUMENT", `unknown field "alias"`},
		{"compat: wrong type", "POST", "/links", `{"longUrl":["https://example.com/"]}`, nil, 400, "INVALID_ARGUMENT", `field "longUrl" must be a string, not a JSON array`},
		{"compat: unknown mode", "POST", "/links", `{"longUrl":"https://example.com/","mode":"hash"}`, nil, 400, "INVALID_ARGUMENT", "mode"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := c.do(tc.method, tc.path, tc.body, tc.header...)
			if r.code != tc.status {
				t.Fatalf("%s %.60s: %.300s; want %d", tc.method, tc.path, r, tc.status)
			}
			if tc.method == "HEAD" {
				return
			}
			e := r.apiError(t)
			if e["code"] != tc.code || !strings.Contains(fmt.Sprint(e["detail"]), tc.msg) {
				t.Errorf("error %v %q; want %s with %q", e["code"], e["detail"], tc.code, tc.msg)
			}
			if tc.status == 405 && r.header.Get("Allow") == "" {
				t.Error("405 without Allow")
			}
		})
	}

	t.Run("oversized chunked body", func(t *testing.T) {
		req, err := http.NewRequest("POST", gw.HTTP+"/v1/links", io.MultiReader(strings.NewReader(big)))
		if err != nil {
			t.Fatal(err)
		}
		req.Header.Set("Authorization", "Bearer "+tn.key)
		req.Header.Set("X-Forwarded-For", c.ip)
		if r := send(t, req); r.code != http.StatusRequestEntityTooLarge || req.ContentLength != 0 {
			t.Errorf("chunked body over the limit: %s (sent with length %d); want 413", r, req.ContentLength)
		}
	})
	t.Run("header block over net/http's own limit", func(t *testing.T) {
		// Past 1 MiB the server answers 431 itself, before the gateway
		// sees the request: no JSON body, but still a 431.
		r := c.do("GET", "/v1/links", "", "X-Big", strings.Repeat("b", 2<<20))
		if r.code != http.StatusRequestHeaderFieldsTooLarge {
			t.Errorf("2 MiB of headers: %d; want 431", r.code)
		}
	})

	if after := linkCount(t, c); after != before {
		t.Errorf("links after the bad input: %d, before: %d; want nothing written", after, before)
	}
	if r := c.do("GET", "/v1/links/"+code, ""); r.json(t)["longUrl"] != "https://example.com/kept" || r.json(t)["disabled"] != false {
		t.Errorf("the link after the bad input: %s; want it unchanged", r)
	}

	// A valid international URL is no bad input: its host is stored in
	// punycode, its path and query percent-encoded (as the redirect sends
	// them).
	r = c.do("POST", "/v1/links", `{"longUrl":"https://bücher.example/straße?q=ü"}`)
	if r.code != http.StatusCreated || r.json(t)["longUrl"] != "https://xn--bcher-kva.example/stra%C3%9Fe?q=%C3%BC" {
		t.Errorf("IDN URL: %s; want 201 with the host in punycode, path and query escaped", r)
	}
}

// Every path and query value, on every route, is UTF-8 text without control
// characters, or the request is a 400 naming the parameter: such a value
// could never be valid, and passed on it failed in the gateway (protobuf
// refuses invalid UTF-8) or in PostgreSQL (which refuses a NUL) as a 500.
// Valid non-ASCII text still reaches the service, which answers it.
func TestParametersMustBeText(t *testing.T) {
	gw := startGateway(t, nil)
	tn := newTenant(t, gw, "free")
	c, admin := newClient(t, gw, tn.key), newClient(t, gw, adminToken)
	r := c.do("POST", "/v1/links", `{"longUrl":"https://example.com/text"}`)
	if r.code != http.StatusCreated {
		t.Fatalf("create: %s", r)
	}
	code := r.json(t)["code"].(string)
	tenantPath := "/v1/admin/tenants/" + tn.id

	refused := map[string]struct {
		c                  *client
		method, path, body string
		param              string
	}{
		"webhook id, invalid UTF-8":      {c, "DELETE", "/v1/webhooks/%ff", "", "id"},
		"webhook id, NUL":                {c, "DELETE", "/v1/webhooks/a%00b", "", "id"},
		"deliveries of a webhook":        {c, "GET", "/v1/webhooks/%ff/deliveries", "", "webhookId"},
		"deliveries page_token, NUL":     {c, "GET", "/v1/webhooks/wh_x/deliveries?page_token=a%00b", "", "page_token"},
		"redeliver a delivery":           {c, "POST", "/v1/webhooks/wh_x/deliveries/%ff/redeliver", "", "id"},
		"link domain":                    {c, "GET", "/v1/links/" + code + "?domain=%ff", "", "domain"},
		"link domain, NUL":               {c, "DELETE", "/v1/links/" + code + "?domain=a%00b", "", "domain"},
		"stats domain":                   {c, "GET", "/v1/links/" + code + "/stats?domain=%ff", "", "domain"},
		"qr domain":                      {c, "GET", "/v1/links/" + code + "/qr?domain=%ff", "", "domain"},
		"list tag":                       {c, "GET", "/v1/links?tag=%ff", "", "tag"},
		"list tag, tab":                  {c, "GET", "/v1/links?tag=a%09b", "", "tag"},
		"list tag, C1 control":           {c, "GET", "/v1/links?tag=a%C2%85b", "", "tag"},
		"list page_token":                {c, "GET", "/v1/links?page_token=%ff", "", "page_token"},
		"export tag":                     {c, "GET", "/v1/links:export?tag=%ff", "", "tag"},
		"get a domain":                   {c, "GET", "/v1/domains/%ff", "", "name"},
		"delete a domain":                {c, "DELETE", "/v1/domains/%ff", "", "name"},
		"verify a domain, NUL":           {c, "POST", "/v1/domains/a%00b.example/verify", "", "name"},
		"admin: get a tenant":            {admin, "GET", "/v1/admin/tenants/%ff", "", "tenant"},
		"admin: change a tenant, NUL":    {admin, "PATCH", "/v1/admin/tenants/a%00b", `{"plan":"free"}`, "tenant"},
		"admin: issue a key":             {admin, "POST", "/v1/admin/tenants/%ff/keys", `{"name":"k"}`, "tenant"},
		"admin: list keys, NUL":          {admin, "GET", "/v1/admin/tenants/a%00b/keys", "", "tenant"},
		"admin: revoke a key":            {admin, "DELETE", tenantPath + "/keys/%ff", "", "key"},
		"admin: revoke a key, NUL":       {admin, "DELETE", tenantPath + "/keys/a%00b", "", "key"},
		"admin: revoke, tenant":          {admin, "DELETE", "/v1/admin/tenants/%ff/keys/abc", "", "tenant"},
		"admin: approve, tenant":         {admin, "POST", "/v1/admin/tenants/%ff/domains/a.example/verify", "", "tenant"},
		"admin: approve, domain":         {admin, "POST", tenantPath + "/domains/a%00b.example/verify", "", "name"},
		"admin: NUL in a new plan":       {admin, "PATCH", tenantPath, `{"plan":"fr\u0000ee"}`, "plan"},
		"admin: NUL in a tenant's plan":  {admin, "POST", "/v1/admin/tenants", `{"id":"` + newTenantID(t) + `","name":"n","plan":"fr\u0000ee"}`, "plan"},
		"NUL in a webhook's description": {c, "POST", "/v1/webhooks", `{"url":"https://example.com/hook","events":["link.created"],"description":"a\u0000b"}`, "description"},
	}
	for name, tc := range refused {
		t.Run(name, func(t *testing.T) {
			r := tc.c.do(tc.method, tc.path, tc.body)
			if r.code != http.StatusBadRequest {
				t.Fatalf("%s %s: %s; want 400", tc.method, tc.path, r)
			}
			e := r.apiError(t)
			if e["code"] != "INVALID_ARGUMENT" || !strings.Contains(fmt.Sprint(e["detail"]), tc.param) {
				t.Errorf("error %v %q; want INVALID_ARGUMENT naming %q", e["code"], e["detail"], tc.param)
			}
			if fields, _ := e["errors"].([]any); len(fields) != 1 || fields[0].(map[string]any)["field"] != tc.param {
				t.Errorf("errors %v; want the one field %q", e["errors"], tc.param)
			}
		})
	}

	// Non-ASCII text is no bad input: the service answers it (no such
	// thing, or a tag it does not take), not the gateway's check.
	passed := map[string]struct {
		c            *client
		path         string
		status       int
		wantInDetail string
	}{
		"a tag café":            {c, "/v1/links?tag=caf%C3%A9", 400, `"café" is not a valid tag`},
		"an export by tag café": {c, "/v1/links:export?tag=caf%C3%A9", 400, `"café" is not a valid tag`},
		"an IDN domain":         {c, "/v1/links/" + code + "?domain=b%C3%BCcher.example", 404, "no such link"},
		"an IDN domain's stats": {c, "/v1/links/" + code + "/stats?domain=b%C3%BCcher.example", 404, "no such link"},
		"a domain named in IDN": {c, "/v1/domains/b%C3%BCcher.example", 404, "no such domain"},
		"a tenant named café":   {admin, "/v1/admin/tenants/caf%C3%A9", 404, "no such tenant"},
	}
	for name, tc := range passed {
		t.Run(name, func(t *testing.T) {
			r := tc.c.do("GET", tc.path, "")
			if r.code != tc.status {
				t.Fatalf("GET %s: %s; want %d", tc.path, r, tc.status)
			}
			if d := fmt.Sprint(r.apiError(t)["detail"]); !strings.Contains(d, tc.wantInDetail) {
				t.Errorf("detail %q; want %q", d, tc.wantInDetail)
			}
		})
	}
	if r := c.do("GET", "/v1/links/"+code, ""); r.code != http.StatusOK {
		t.Errorf("the link after the table: %s; want it there", r)
	}
}
