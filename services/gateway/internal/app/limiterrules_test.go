//go:build integration

package app

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"mime/multipart"
	"net/http"
	"strings"
	"testing"
)

// The limiter's rules through the admin API: GET exports them with an
// ETag, PUT of the export changes nothing, a dry run says what a file
// would change and writes nothing, a file applies, and every refusal (a
// rule that does not compile, a stale or weak If-Match, a tenants section
// that moves a tenant, a body over 1 MiB) leaves the rules as they were. The
// test's own domain and plan, removed at the end: the tables are shared.
func TestAdminRulesExportAndApply(t *testing.T) {
	gw := startGateway(t, map[string]string{"KURZ_LIMITER_GRPC_ADDR": stack.LimiterPG.GRPCAddr})
	admin := newClient(t, gw, adminToken)
	domain, plan := "gwtest-"+strings.TrimPrefix(newTenantID(t), "gwt-"), "gwtest-plan-"+strings.TrimPrefix(newTenantID(t), "gwt-")
	t.Cleanup(func() {
		for _, q := range []string{`DELETE FROM rl_domains WHERE domain = $1`, `DELETE FROM rl_plans WHERE plan = $1`} {
			for _, name := range []string{domain, plan} {
				if _, err := stack.DB.Exec(context.Background(), q, name); err != nil {
					t.Errorf("clean up: %v", err)
				}
			}
		}
	})

	get := func() (string, string) {
		t.Helper()
		r := admin.do("GET", "/v1/admin/rules", "")
		if r.code != http.StatusOK || !strings.HasPrefix(r.header.Get("Content-Type"), "application/yaml") || r.header.Get("ETag") == "" {
			t.Fatalf("GET /v1/admin/rules: %s", r)
		}
		return string(r.body), r.header.Get("ETag")
	}
	put := func(query, body string, header ...string) response {
		t.Helper()
		return admin.do("PUT", "/v1/admin/rules"+query, body, append([]string{"Content-Type", "application/yaml"}, header...)...)
	}
	file, etag := get()
	if !strings.Contains(file, "domains:") || strings.Contains(file, "tenants:") {
		t.Fatalf("the export:\n%s", file)
	}
	if r := put("", file, "If-Match", etag); r.code != http.StatusOK || len(r.json(t)["changes"].([]any)) != 0 || r.header.Get("ETag") != etag {
		t.Fatalf("PUT of the export with its ETag: %s; want no change, the same ETag", r)
	}

	mine := func(limit int) string {
		return fmt.Sprintf("domains:\n  %s:\n    rules:\n      - {name: per-ip, key: [ip], algorithm: token_bucket, limit: %d, window: 1s, failure_mode: open}\nplans:\n  %s: {%s/per-ip: {limit: 3}}\n",
			domain, limit, plan, domain)
	}
	r := put("?dry_run=true", mine(10))
	if got := r.json(t); r.code != http.StatusOK || got["dryRun"] != true || len(got["changes"].([]any)) != 4 {
		t.Fatalf("dry run: %s; want the domain, its rule, the plan and its limit added", r)
	}
	if _, now := get(); now != etag {
		t.Fatalf("a dry run changed the rules' ETag")
	}
	if r := put("", mine(10), "If-Match", etag); r.code != http.StatusOK || r.header.Get("ETag") == etag {
		t.Fatalf("PUT of a new domain and plan: %s", r)
	}
	applied, etag := get()
	if !strings.Contains(applied, domain+":") || !strings.Contains(applied, plan+":") {
		t.Fatalf("the export after the apply lacks the domain or plan:\n%s", applied)
	}
	r = admin.do("GET", "/v1/admin/rules", "", "Accept", "application/json")
	if rules := r.json(t); r.code != http.StatusOK || rules["domains"].(map[string]any)[domain] == nil {
		t.Errorf("GET as JSON: %s", r)
	}

	for _, c := range []struct {
		name, query, body string
		header            []string
		status            int
		says              string
	}{
		{"a rule that does not compile", "", strings.Replace(mine(10), "token_bucket", "token_buckets", 1), nil, http.StatusBadRequest, "rule " + domain + `/per-ip: algorithm "token_buckets"`},
		{"a misspelt field", "", strings.Replace(mine(10), "limit: 10", "limt: 10", 1), nil, http.StatusBadRequest, "field limt not found"},
		{"a stale If-Match", "", mine(20), []string{"If-Match", `"stale"`}, http.StatusPreconditionFailed, "the rules changed since they were read"},
		{"a weak If-Match", "", mine(20), []string{"If-Match", "W/" + etag}, http.StatusPreconditionFailed, "is a weak validator, which cannot be used for an apply"},
		{"If-Match * beside a tag", "", mine(20), []string{"If-Match", "*, " + etag}, http.StatusBadRequest, "* stands alone"},
		{"a tenants section that moves a tenant", "", mine(20) + "tenants: {anonymous: " + plan + "}\n", nil, http.StatusConflict, "kurzctl tenants set-plan"},
		{"a body over 1 MiB", "", mine(20) + "#" + strings.Repeat("x", 1<<20), nil, http.StatusRequestEntityTooLarge, "larger than 1048576 bytes"},
		{"a bad dry_run", "?dry_run=maybe", mine(20), nil, http.StatusBadRequest, "dry_run"},
	} {
		r := put(c.query, c.body, c.header...)
		if detail, _ := r.apiError(t)["detail"].(string); r.code != c.status || !strings.Contains(detail, c.says) {
			t.Errorf("%s: %s; want %d saying %q", c.name, r, c.status, c.says)
		}
	}
	if now, nowTag := get(); nowTag != etag || now != applied {
		t.Errorf("refused PUTs changed the rules")
	}
	// If-Match holds when any tag of a list is the rules' ETag, and * when
	// there are rules, which there always are (RFC 9110, 13.1.1).
	for _, ifMatch := range []string{`"stale", ` + etag, "*"} {
		if r := put("", applied, "If-Match", ifMatch); r.code != http.StatusOK || r.header.Get("ETag") != etag {
			t.Errorf("PUT of the export with If-Match %s: %s; want 200", ifMatch, r)
		}
	}
	r = put("", mine(20), "If-Match", etag)
	if changes := r.json(t)["changes"].([]any); r.code != http.StatusOK || len(changes) != 1 || changes[0].(map[string]any)["name"] != domain+"/per-ip" {
		t.Errorf("PUT of a new limit: %s; want one change, the rule", r)
	}

	for name, cl := range map[string]*client{"a tenant's key": newClient(t, gw, newTenant(t, gw, "free").key), "no credential": newClient(t, gw, "")} {
		for _, method := range []string{"GET", "PUT"} {
			if r := cl.do(method, "/v1/admin/rules", mine(30)); r.code != http.StatusUnauthorized {
				t.Errorf("%s /v1/admin/rules with %s: %s, want 401", method, name, r)
			}
		}
	}
}

// A gateway in front of a limiter on a rules file shows the file and
// refuses to apply one, naming the file to edit.
func TestAdminRulesOfAFileLimiterAreReadOnly(t *testing.T) {
	gw := startGateway(t, nil) // the stack's file limiter
	admin := newClient(t, gw, adminToken)
	r := admin.do("GET", "/v1/admin/rules", "")
	if r.code != http.StatusOK || r.header.Get("X-Kurz-Rules-Source") != "file" {
		t.Fatalf("GET of a file limiter's rules: %s", r)
	}
	r = admin.do("PUT", "/v1/admin/rules", string(r.body), "Content-Type", "application/yaml")
	if detail, _ := r.apiError(t)["detail"].(string); r.code != http.StatusConflict || !strings.Contains(detail, stack.roomyFile) || !strings.Contains(detail, "edit it") {
		t.Errorf("PUT to a file limiter: %s; want 409 naming %s", r, stack.roomyFile)
	}
}

// An envoyproxy/ratelimit file PUT as it is applies as its translation,
// the answer saying it was read as one: a dry run names the domain and the
// rules it would add, the apply adds them, and the export has the domain
// as kurz rules (fixed_window, as envoyproxy/ratelimit counts). The test's
// own domain, removed at the end.
func TestAdminRulesApplyAnEnvoyFile(t *testing.T) {
	gw := startGateway(t, map[string]string{"KURZ_LIMITER_GRPC_ADDR": stack.LimiterPG.GRPCAddr})
	admin := newClient(t, gw, adminToken)
	domain := "gwenvoy-" + strings.TrimPrefix(newTenantID(t), "gwt-")
	t.Cleanup(func() {
		if _, err := stack.DB.Exec(context.Background(), `DELETE FROM rl_domains WHERE domain = $1`, domain); err != nil {
			t.Errorf("clean up: %v", err)
		}
	})
	envoy := fmt.Sprintf("domain: %s\ndescriptors:\n  - key: generic_key\n    value: login\n    rate_limit: {unit: minute, requests_per_unit: 20}\n    descriptors:\n      - key: remote_address\n        rate_limit: {unit: second, requests_per_unit: 2, name: login-per-ip}\n", domain)
	put := func(query string) response {
		t.Helper()
		return admin.do("PUT", "/v1/admin/rules"+query, envoy, "Content-Type", "application/yaml")
	}
	names := func(r response) []string {
		var out []string
		for _, c := range r.json(t)["changes"].([]any) {
			c := c.(map[string]any)
			out = append(out, fmt.Sprint(c["kind"], " ", c["name"], " ", c["change"]))
		}
		return out
	}
	want := []string{"domain " + domain + " added", "rule " + domain + "/generic_key_login added", "rule " + domain + "/login-per-ip added"}

	r := put("?dry_run=true")
	if r.code != http.StatusOK || r.json(t)["format"] != "envoy" || r.json(t)["dryRun"] != true || fmt.Sprint(names(r)) != fmt.Sprint(want) {
		t.Fatalf("dry run of an envoyproxy/ratelimit file: %s; want format envoy and the changes %v", r, want)
	}
	r = put("")
	if r.code != http.StatusOK || r.json(t)["format"] != "envoy" || fmt.Sprint(names(r)) != fmt.Sprint(want) {
		t.Fatalf("PUT of an envoyproxy/ratelimit file: %s", r)
	}
	r = admin.do("GET", "/v1/admin/rules", "", "Accept", "application/json")
	d, _ := r.json(t)["domains"].(map[string]any)[domain].(map[string]any)
	rules, _ := d["rules"].([]any)
	if r.code != http.StatusOK || len(rules) != 2 || rules[1].(map[string]any)["name"] != "login-per-ip" || rules[1].(map[string]any)["algorithm"] != "fixed_window" {
		t.Errorf("the export after the apply has %s as %v; want its two rules, translated", domain, d)
	}
	if r := put(""); r.code != http.StatusOK || len(names(r)) != 0 {
		t.Errorf("the Envoy file applied again: %s; want no change", r)
	}
}

// form is a multipart/form-data body of files (name, content; a name ""
// makes a plain field) and its Content-Type.
func form(t *testing.T, files ...[2]string) (string, string) {
	t.Helper()
	var b bytes.Buffer
	w := multipart.NewWriter(&b)
	for i, f := range files {
		var err error
		var part io.Writer
		if f[0] == "" {
			part, err = w.CreateFormField(fmt.Sprint("f", i))
		} else {
			part, err = w.CreateFormFile(fmt.Sprint("f", i), f[0])
		}
		if err != nil {
			t.Fatal(err)
		}
		if _, err := io.WriteString(part, f[1]); err != nil {
			t.Fatal(err)
		}
	}
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	return b.String(), w.FormDataContentType()
}

// A directory of envoyproxy/ratelimit files PUT as a form (curl -F, one
// part per file) applies in one step: a dry run names both files'
// domains, the apply adds them. A form's parts are bounded and checked:
// a field without a filename, a dot file's name, a kurz rules file among
// them, the same domain twice, over 1,000 parts, files over 1 MiB together
// are refused and change nothing; files of 1 MiB together are not, though
// the parts' headers take the body past it. The test's own domains, removed at the end.
func TestAdminRulesApplyADirectoryAsAForm(t *testing.T) {
	gw := startGateway(t, map[string]string{"KURZ_LIMITER_GRPC_ADDR": stack.LimiterPG.GRPCAddr})
	admin := newClient(t, gw, adminToken)
	id := strings.TrimPrefix(newTenantID(t), "gwt-")
	one, two := "gwdir1-"+id, "gwdir2-"+id
	t.Cleanup(func() {
		if _, err := stack.DB.Exec(context.Background(), `DELETE FROM rl_domains WHERE domain = ANY($1)`, []string{one, two}); err != nil {
			t.Errorf("clean up: %v", err)
		}
	})
	file := func(domain string) string {
		return fmt.Sprintf("domain: %s\ndescriptors: [{key: remote_address, rate_limit: {unit: second, requests_per_unit: 5}}]\n", domain)
	}
	put := func(query, body, ctype string) response {
		t.Helper()
		return admin.do("PUT", "/v1/admin/rules"+query, body, "Content-Type", "", "Content-Type", ctype)
	}
	body, ctype := form(t, [2]string{"one.yaml", file(one)}, [2]string{"ratelimit.conf", file(two)})
	want := fmt.Sprint([]string{"domain " + one + " added", "rule " + one + "/remote_address added", "domain " + two + " added", "rule " + two + "/remote_address added"})
	changes := func(r response) string {
		var out []string
		for _, c := range r.json(t)["changes"].([]any) {
			c := c.(map[string]any)
			out = append(out, fmt.Sprint(c["kind"], " ", c["name"], " ", c["change"]))
		}
		return fmt.Sprint(out)
	}
	if r := put("?dry_run=true", body, ctype); r.code != http.StatusOK || r.json(t)["format"] != "envoy" || changes(r) != want {
		t.Fatalf("dry run of a form of two files: %s; want format envoy and the changes %s", r, want)
	}
	// Files of 1 MiB together, as a directory the limiter reads may hold:
	// the form's part headers take the body past 1 MiB, and it applies.
	pad := func(f string, n int) string { return f + "#" + strings.Repeat("x", n-len(f)-2) + "\n" }
	full, fullType := form(t, [2]string{"one.yaml", pad(file(one), 1<<19)}, [2]string{"ratelimit.conf", pad(file(two), 1<<19)})
	if r := put("?dry_run=true", full, fullType); len(full) <= 1<<20 || r.code != http.StatusOK || changes(r) != want {
		t.Fatalf("dry run of a form of two files of 1 MiB together (a body of %d bytes): %s; want the changes %s", len(full), r, want)
	}

	many := make([][2]string, 1001)
	for i := range many {
		many[i] = [2]string{fmt.Sprintf("d%d.yaml", i), file(fmt.Sprintf("gwmany%d-%s", i, id))}
	}
	big := strings.Repeat("#"+strings.Repeat("x", 1000)+"\n", 600)
	// A part header multipart cannot read is not repeated whole.
	bad := "--b\r\n" + strings.Repeat("x", 50_000) + "\r\n\r\ndomain: x\n--b--\r\n"
	if r := put("", bad, "multipart/form-data; boundary=b"); r.code != http.StatusBadRequest || len(r.body) > 1024 || !strings.Contains(string(r.body), "does not parse") {
		t.Errorf("a form with a malformed part header of 50,000 bytes: %d, %d bytes %.300q; want 400 saying it does not parse, in under 1 KiB", r.code, len(r.body), r.body)
	}
	for _, c := range []struct {
		name  string
		files [][2]string
		code  int
		want  string
	}{
		{"a field without a filename", [][2]string{{"one.yaml", file(one)}, {"", file(two)}}, http.StatusBadRequest, "part 2 of the form has no filename"},
		{"a dot file", [][2]string{{"one.yaml", file(one)}, {".two.yaml", file(two)}}, http.StatusBadRequest, "dot file"},
		{"a kurz file among them", [][2]string{{"one.yaml", file(one)}, {"kurz.yaml", "domains: {}\n"}}, http.StatusBadRequest, "kurz.yaml: not an envoyproxy/ratelimit file"},
		{"the same domain twice", [][2]string{{"one.yaml", file(one)}, {"two.yaml", file(one)}}, http.StatusBadRequest, "duplicate domain"},
		{"over 1,000 parts", many, http.StatusBadRequest, "over 1000 files"},
		{"over 1 MiB", [][2]string{{"one.yaml", file(one) + big}, {"two.yaml", file(two) + big}}, http.StatusRequestEntityTooLarge, "files are larger than 1048576 bytes together"},
	} {
		body, ctype := form(t, c.files...)
		r := put("", body, ctype)
		if r.code != c.code || !strings.Contains(string(r.body), c.want) {
			t.Errorf("%s: %s; want %d with %q", c.name, r, c.code, c.want)
		}
	}
	r := admin.do("GET", "/v1/admin/rules", "", "Accept", "application/json")
	for _, d := range []string{one, two} {
		if _, ok := r.json(t)["domains"].(map[string]any)[d]; ok {
			t.Fatalf("after the dry run and the refusals the rules have %s", d)
		}
	}

	if r := put("", body, ctype); r.code != http.StatusOK || changes(r) != want {
		t.Fatalf("PUT of a form of two files: %s; want the changes %s", r, want)
	}
	r = admin.do("GET", "/v1/admin/rules", "", "Accept", "application/json")
	for _, d := range []string{one, two} {
		if _, ok := r.json(t)["domains"].(map[string]any)[d]; !ok {
			t.Errorf("the export after the apply lacks %s", d)
		}
	}
}
