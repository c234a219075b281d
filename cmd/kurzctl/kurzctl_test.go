//go:build integration

package main

import (
	"encoding/csv"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/timestamppb"

	analyticsv1 "kurz.dev/gen/kurz/analytics/v1"
	"kurz.dev/services/gateway/gatewaytest"
)

// field returns the value of a "name  value" line of a two-column table.
func field(t *testing.T, table, name string) string {
	t.Helper()
	m := regexp.MustCompile(`(?m)^` + regexp.QuoteMeta(name) + `\s{2,}(.*)$`).FindStringSubmatch(table)
	if m == nil {
		t.Fatalf("no %q line in:\n%s", name, table)
	}
	return m[1]
}

// A tenant's links, through every links command: create with every
// setting, get, list by tag, update only what is given, delete.
func TestLinksLifecycle(t *testing.T) {
	gw := startGateway(t, stack.Limiter)
	_, c := tenantWithKey(t, newCtl(t, gw), "free")

	c.stdin = "correct horse battery\n"
	out := c.ok("links", "create", "https://example.com/spring-sale", "--tag", "spring", "--tag", "launch",
		"--max-visits", "100", "--password-stdin", "--ios", "https://apps.example.com/ios",
		"--redirect", "307", "--expire", "72h", "--title", "Spring sale ✓")
	c.stdin = ""
	code := field(t, out, "code")
	for name, want := range map[string]string{
		"short url": shortBase + "/" + code, "long url": "https://example.com/spring-sale", "tags": "spring, launch",
		"max visits": "100", "password": "yes", "redirect": "307", "ios url": "https://apps.example.com/ios", "disabled": "no",
		"title": "Spring sale ✓",
	} {
		if got := field(t, out, name); got != want {
			t.Errorf("create: %s = %q, want %q", name, got, want)
		}
	}
	if exp, err := time.Parse(time.RFC3339, field(t, out, "expires")); err != nil || exp.Before(time.Now().Add(71*time.Hour)) {
		t.Errorf("create --expire 72h: expires %q", field(t, out, "expires"))
	}

	link := decodeJSON(t, c.ok("links", "get", code, "-o", "json"))
	if link["code"] != code || link["passwordProtected"] != true || link["maxVisits"] != "100" {
		t.Errorf("get -o json: %v", link)
	}
	if _, ok := link["password"]; ok {
		t.Errorf("get -o json shows a password: %v", link)
	}
	if got := field(t, c.ok("links", "get", code), "long url"); got != "https://example.com/spring-sale" {
		t.Errorf("get: long url %q", got)
	}

	other := strings.TrimSpace(c.ok("links", "create", "https://example.com/other", "--tag", "autumn", "-q"))
	list := c.ok("links", "list", "--tag", "spring")
	if !strings.Contains(list, code) || strings.Contains(list, other) || !strings.HasPrefix(list, "CODE") || !strings.Contains(list, "Spring sale ✓") {
		t.Errorf("list --tag spring (want %s, not %s):\n%s", code, other, list)
	}
	page := decodeJSON(t, c.ok("links", "list", "--all", "-o", "json"))
	if links, _ := page["links"].([]any); len(links) != 2 {
		t.Errorf("list --all -o json: want 2 links, got %v", page)
	}
	if r := c.run("links", "list", "--page-size", "1"); r.code != 0 || !strings.Contains(r.stderr, "--page-token") {
		t.Errorf("list --page-size 1 of 2 links names no next page: %s", r)
	}
	// --clicks: a CLICKS column (links without clicks: 0), and in -o json
	// one clickCounts entry per link.
	clicks := c.ok("links", "list", "--clicks")
	if lines := strings.Split(strings.TrimSpace(clicks), "\n"); len(lines) != 3 || !strings.Contains(strings.Join(strings.Fields(lines[0]), " "), "TAGS CLICKS CREATED") ||
		clicksOf(lines[1]) != "0" || clicksOf(lines[2]) != "0" {
		t.Errorf("list --clicks, want a CLICKS column of 0 and 0:\n%s", clicks)
	}
	page = decodeJSON(t, c.ok("links", "list", "--clicks", "-o", "json"))
	if counts, _ := page["clickCounts"].([]any); len(counts) != 2 {
		t.Errorf("list --clicks -o json: want 2 clickCounts, got %v", page)
	} else if lc, _ := counts[0].(map[string]any); lc["code"] != other {
		t.Errorf("list --clicks -o json: first clickCounts %v, want the newest link's, %s", lc, other)
	}

	// Only the given fields change; a device flag keeps the other devices.
	c.ok("links", "update", code, "--android", "https://apps.example.com/android", "--clear-tags", "--disable")
	link = decodeJSON(t, c.ok("links", "get", code, "-o", "json"))
	if link["title"] != "Spring sale ✓" {
		t.Errorf("after an update without --title: title %v, want it kept", link["title"])
	}
	targets, _ := link["deviceTargets"].(map[string]any)
	if targets["iosUrl"] != "https://apps.example.com/ios" || targets["androidUrl"] != "https://apps.example.com/android" ||
		link["disabled"] != true || link["longUrl"] != "https://example.com/spring-sale" || link["maxVisits"] != "100" {
		t.Errorf("after update --android --clear-tags --disable: %v", link)
	}
	if tags, _ := link["tags"].([]any); len(tags) != 0 {
		t.Errorf("after --clear-tags: tags %v", tags)
	}
	if got := field(t, c.ok("links", "update", code, "--title", "Renamed"), "title"); got != "Renamed" {
		t.Errorf("update --title Renamed: title %q", got)
	}
	out = c.ok("links", "update", code, "--long-url", "https://example.com/b", "--enable", "--clear-password", "--max-visits", "0", "--clear-expire", "--title", "")
	for name, want := range map[string]string{"long url": "https://example.com/b", "disabled": "no", "password": "no", "max visits": "no limit", "expires": "never", "title": "-"} {
		if got := field(t, out, name); got != want {
			t.Errorf("update: %s = %q, want %q", name, got, want)
		}
	}

	if out := c.ok("links", "delete", code); out != "deleted "+code+"\n" {
		t.Errorf("delete: %q", out)
	}
	r := c.run("links", "get", code)
	if r.code != exitError || !strings.Contains(r.stderr, "no such link") {
		t.Errorf("get after delete: %s", r)
	}
	if got := decodeJSON(t, c.ok("links", "delete", other, "-o", "json")); len(got) != 0 {
		t.Errorf("delete -o json: %v", got)
	}
}

// An API error (an unknown code) exits 1 with the API's own message on
// stderr, one line, nothing on stdout.
func TestAPIErrorExitsOne(t *testing.T) {
	gw := startGateway(t, stack.Limiter)
	_, c := tenantWithKey(t, newCtl(t, gw), "free")
	for _, args := range [][]string{{"links", "get", "zzzzzz9"}, {"stats", "zzzzzz9"}, {"links", "delete", "zzzzzz9", "-o", "json"}} {
		r := c.run(args...)
		want := "kurzctl: no such link: check the code (links of other tenants are not visible)\n"
		if r.code != exitError || r.stderr != want || r.stdout != "" {
			t.Errorf("kurzctl %s: %s\nwant exit 1 and stderr %q", strings.Join(args, " "), r, want)
		}
	}
	r := newCtl(t, gw).run("links", "list")
	if r.code != exitError || !strings.Contains(r.stderr, "an API key is required") || !strings.Contains(r.stderr, "KURZ_API_KEY") {
		t.Errorf("list without a key: %s", r)
	}
	r = newCtl(t, gw).run("--url", "http://127.0.0.1:1", "links", "list")
	if r.code != exitError || !strings.Contains(r.stderr, "cannot reach the gateway at http://127.0.0.1:1") {
		t.Errorf("list from nowhere: %s", r)
	}
}

// The admin commands: a tenant, its plan, its keys, its suspension; a
// revoked key is refused on the next call.
func TestTenantsAndKeys(t *testing.T) {
	gw := startGateway(t, stack.Limiter)
	c := newCtl(t, gw)
	id := newTenantID(t)
	out := c.ok("tenants", "create", id, "--name", "Acme Inc.", "--plan", "free")
	if field(t, out, "id") != id || field(t, out, "name") != "Acme Inc." || field(t, out, "plan") != "free" {
		t.Errorf("tenants create:\n%s", out)
	}
	if got := decodeJSON(t, c.ok("tenants", "get", id, "-o", "json")); got["id"] != id || got["plan"] != "free" {
		t.Errorf("tenants get -o json: %v", got)
	}
	if got := field(t, c.ok("tenants", "set-plan", id, "pro"), "plan"); got != "pro" {
		t.Errorf("tenants set-plan: plan %q", got)
	}
	if r := c.run("tenants", "create", id); r.code != exitError || !strings.Contains(r.stderr, "exists already") {
		t.Errorf("tenants create twice: %s", r)
	}

	r := c.run("keys", "issue", id, "--name", "laptop")
	if r.code != 0 || !strings.Contains(r.stderr, "shown this once") {
		t.Fatalf("keys issue: %s", r)
	}
	keyID, key := field(t, r.stdout, "id"), field(t, r.stdout, "key")
	issued := decodeJSON(t, c.ok("keys", "issue", id, "--name", "ci", "-o", "json"))
	list := c.ok("keys", "list", id)
	if !strings.Contains(list, keyID) || !strings.Contains(list, issued["id"].(string)) || strings.Contains(list, key) {
		t.Errorf("keys list (want both IDs, never a key):\n%s", list)
	}
	if keys, _ := decodeJSON(t, c.ok("keys", "list", id, "-o", "json"))["keys"].([]any); len(keys) != 2 {
		t.Errorf("keys list -o json: %v", keys)
	}
	tc := c.withKey(key)
	tc.ok("links", "list")
	if out := c.ok("keys", "revoke", id, keyID); !strings.Contains(out, "revoked key "+keyID) {
		t.Errorf("keys revoke: %q", out)
	}
	if r := tc.run("links", "list"); r.code != exitError || r.stderr != "kurzctl: the API key is invalid or revoked\n" {
		t.Errorf("a revoked key: %s", r)
	}
	if r := c.run("tenants", "get", "no-such-tenant-"+id); r.code != exitError || !strings.Contains(r.stderr, "no such tenant") {
		t.Errorf("tenants get of nobody: %s", r)
	}

	// A suspension refuses the tenant's keys, with a message that names
	// the operator and not the reason; resume lets them through again.
	other := decodeJSON(t, c.ok("keys", "issue", id, "-o", "json"))["key"].(string)
	oc := c.withKey(other)
	out = c.ok("tenants", "suspend", id, "--reason", "phishing, ticket ABUSE-12")
	if field(t, out, "state") != "suspended" || field(t, out, "reason") != "phishing, ticket ABUSE-12" || field(t, out, "suspended") == "" {
		t.Errorf("tenants suspend:\n%s", out)
	}
	if r := oc.run("links", "list"); r.code != exitError || !strings.Contains(r.stderr, "contact the operator") || strings.Contains(r.stderr, "ABUSE") {
		t.Errorf("a suspended tenant's key: %s", r)
	}
	if r := c.run("tenants", "suspend", id); r.code != exitError || !strings.Contains(r.stderr, "reason is required") {
		t.Errorf("tenants suspend without a reason: %s", r)
	}
	if got := decodeJSON(t, c.ok("tenants", "resume", id, "-o", "json")); got["state"] != "active" {
		t.Errorf("tenants resume -o json: %v", got)
	}
	oc.ok("links", "list")
	if r := c.run("tenants", "resume", "no-such-tenant-"+id); r.code != exitError || !strings.Contains(r.stderr, "no such tenant") {
		t.Errorf("tenants resume of nobody: %s", r)
	}
}

// quota explain names the rule CheckQuota would decide by, and says why;
// quota check consumes and reports the same rule.
func TestQuotaExplainNamesDecidingRule(t *testing.T) {
	gw := startGateway(t, stack.Limiter)
	c := newCtl(t, gw)
	desc := func() []string {
		return []string{"--domain", "links.create", "--descriptor", "tenant=" + newTenantID(t), "--descriptor", "ip=" + gatewaytest.NewIP()}
	}

	// 6000 hits are more than test-per-tenant's burst of 5000: it denies,
	// per-ip (6000 a minute) alone would allow.
	out := c.ok(append([]string{"quota", "explain", "--hits", "6000"}, desc()...)...)
	for _, want := range []string{
		"6000 hits in links.create would be denied; 2 rules match\n",
		"test-per-tenant decides: it denies: 6000 hits exceed its capacity of 5000",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("explain --hits 6000: no %q in\n%s", want, out)
		}
	}
	if !regexp.MustCompile(`(?m)^▶ test-per-tenant\s+token_bucket\s+-\s+60000/1m\s+5000\s+.*\s+open\s+deny$`).MatchString(out) ||
		!regexp.MustCompile(`(?m)^  per-ip\s+sliding_window\S*\s+-\s+6000/1m\s+.*\s+local\s+allow$`).MatchString(out) {
		t.Errorf("explain --hits 6000: rows do not mark test-per-tenant as deciding:\n%s", out)
	}

	// Allowed: the deciding rule is the one CheckQuota names.
	args := desc()
	check := decodeJSON(t, c.ok(append([]string{"quota", "check", "--hits", "0", "-o", "json"}, args...)...))
	decidingRule, _ := check["decidingRule"].(string)
	if check["allowed"] != true || decidingRule == "" {
		t.Fatalf("check -o json: %v", check)
	}
	out = c.ok(append([]string{"quota", "explain"}, args...)...)
	if !strings.Contains(out, decidingRule+" decides: it has the least headroom") || !strings.Contains(out, "▶ "+decidingRule+" ") {
		t.Errorf("explain names another rule than CheckQuota's %s:\n%s", decidingRule, out)
	}
	explained := decodeJSON(t, c.ok(append([]string{"quota", "explain", "-o", "json"}, args...)...))
	if rules, _ := explained["rules"].([]any); len(rules) != 2 || explained["allowed"] != true {
		t.Errorf("explain -o json: %v", explained)
	}

	out = c.ok(append([]string{"quota", "check", "--hits", "5"}, args...)...)
	if !strings.HasPrefix(out, "allowed 5 hits in links.create; deciding rule ") {
		t.Errorf("check:\n%s", out)
	}
	// auth's rule is keyed by ip: without one, no rule applies.
	if out := c.ok("quota", "explain", "--domain", "auth", "--descriptor", "tenant=x"); out != "1 hits in auth would be allowed: no rule of the domain matches these descriptors\n" {
		t.Errorf("explain without a matching rule: %q", out)
	}
	if r := c.run("quota", "explain", "--domain", "no.such.domain"); r.code != exitError || !strings.Contains(r.stderr, `kurzctl: unknown domain "no.such.domain"`) {
		t.Errorf("explain of an unknown domain: %s", r)
	}
	r := c.run("--limiter", "127.0.0.1:1", "--timeout", "2s", "quota", "explain", "--domain", "api")
	if r.code != exitError || !strings.Contains(r.stderr, "cannot reach the limiter at 127.0.0.1:1") {
		t.Errorf("explain without a limiter: %s", r)
	}
}

// stats of a link without clicks: the totals, "no clicks", and the API's
// JSON.
func TestStats(t *testing.T) {
	gw := startGateway(t, stack.Limiter)
	_, c := tenantWithKey(t, newCtl(t, gw), "free")
	code := strings.TrimSpace(c.ok("links", "create", "https://example.com/stats", "-q"))
	out := c.ok("stats", code, "--since", "7d")
	if !strings.HasPrefix(out, "link "+code+": clicks from ") || field(t, out, "total") != "0" ||
		field(t, out, "bot") != "0 (0.0%)" || !strings.HasSuffix(out, "\nno clicks in this range\n") {
		t.Errorf("stats:\n%s", out)
	}
	got := decodeJSON(t, c.ok("stats", code, "--start", time.Now().Add(-48*time.Hour).Format(time.DateOnly), "--interval", "hour", "-o", "json"))
	if got["code"] != code || got["interval"] != "INTERVAL_HOUR" {
		t.Errorf("stats -o json: %v", got)
	}
	if series, _ := got["series"].([]any); len(series) < 48 {
		t.Errorf("stats --interval hour over 2+ days: %d buckets", len(series))
	}
}

// The chart scales the busiest bucket to the full width, human clicks in
// blocks to an eighth of a cell, bot and flood clicks shaded, and shows any
// non-zero part.
func TestChart(t *testing.T) {
	day := time.Date(2026, 3, 1, 0, 0, 0, 0, time.UTC)
	bucket := func(i int, human, bot, flood int64) *analyticsv1.TimeBucket {
		return &analyticsv1.TimeBucket{StartTime: timestamppb.New(day.AddDate(0, 0, i)),
			Counts: &analyticsv1.ClickCounts{Total: human + bot + flood, Human: human, Bot: bot, Flood: flood}}
	}
	got := chart([]*analyticsv1.TimeBucket{bucket(0, 80, 0, 0), bucket(1, 30, 8, 2), bucket(2, 0, 0, 0), bucket(3, 1, 1, 0)}, analyticsv1.Interval_INTERVAL_DAY, 8)
	want := "2026-03-01  ████████   80\n" +
		"2026-03-02  ███░       40 (10 bot/flood)\n" +
		"2026-03-03             0\n" +
		"2026-03-04  ▏░         2 (1 bot/flood)\n"
	if got != want {
		t.Errorf("chart:\n%s\nwant:\n%s", got, want)
	}
	if got := formatDuration(durationpb.New(90 * time.Second)); got != "1m30s" {
		t.Errorf("formatDuration(90s) = %q", got)
	}
}

// links import: a Bitly export in batches, a progress line per batch on
// stderr, a summary and the failed rows; the links carry the import tag.
// links export writes them back as CSV, to stdout or a file.
func TestImportAndExport(t *testing.T) {
	gw := startGateway(t, stack.Limiter)
	_, c := tenantWithKey(t, newCtl(t, gw), "pro")
	dir := t.TempDir()
	file := filepath.Join(dir, "bitly.csv")
	// Fresh aliases, so each keeps its code (codes are global).
	src := newTenantID(t)[4:]
	csvText := "long_url,link,title,created_at,tags\n" +
		"https://example.com/1,bit.ly/" + src + "a,One,2024-01-02T03:04:05Z,news\n" +
		"https://example.com/2,bit.ly/" + src + "b,Two,2024-01-02T03:04:05Z,\n" +
		"javascript:alert(1),bit.ly/" + src + "c,Bad,2024-01-02T03:04:05Z,\n" +
		"https://example.com/4,bit.ly/" + src + "d,Four,2024-01-02T03:04:05Z,news\n" +
		",bit.ly/" + src + "e,Empty,2024-01-02T03:04:05Z,\n"
	if err := os.WriteFile(file, []byte(csvText), 0o600); err != nil {
		t.Fatal(err)
	}
	r := c.run("links", "import", file, "--batch", "2")
	if r.code != exitRowsFailed {
		t.Fatalf("import with two bad rows: %s; want exit %d", r, exitRowsFailed)
	}
	wantProgress := "imported 2/5 rows (2 created, 0 failed)\nimported 4/5 rows (3 created, 1 failed)\nimported 5/5 rows (3 created, 2 failed)\n" +
		"kurzctl: 2 of 5 rows got no link (see the report)\n"
	if r.stderr != wantProgress {
		t.Errorf("import progress:\n%s\nwant:\n%s", r.stderr, wantProgress)
	}
	if !strings.HasPrefix(r.stdout, "imported 5 rows of a bitly export: 3 created (3 kept their code), 2 failed\n") ||
		!regexp.MustCompile(`(?m)^4\s+`+src+`c\s+INVALID_ARGUMENT: `).MatchString(r.stdout) ||
		!regexp.MustCompile(`(?m)^6\s+`+src+`e\s+INVALID_ARGUMENT: line 6 has no URL$`).MatchString(r.stdout) {
		t.Errorf("import summary:\n%s", r.stdout)
	}
	page := decodeJSON(t, c.ok("links", "list", "--tag", "import-bitly", "--all", "-o", "json"))
	if links, _ := page["links"].([]any); len(links) != 3 {
		t.Errorf("links tagged import-bitly: %v", page)
	}
	if got := field(t, c.ok("links", "get", src+"a"), "long url"); got != "https://example.com/1" {
		t.Errorf("the imported link %sa leads to %q", src, got)
	}

	out := c.ok("links", "export", "--tag", "news")
	recs, err := csv.NewReader(strings.NewReader(out)).ReadAll()
	if err != nil || len(recs) != 3 || recs[0][0] != "code" {
		t.Fatalf("export --tag news (want a header and 2 rows): %v\n%s", err, out)
	}
	exported := filepath.Join(dir, "out.csv")
	if r := c.run("links", "export", "-f", exported); r.code != 0 || !strings.Contains(r.stderr, "wrote ") {
		t.Fatalf("export -f: %s", r)
	}
	b, err := os.ReadFile(exported)
	if err != nil {
		t.Fatal(err)
	}
	if recs, err := csv.NewReader(strings.NewReader(string(b))).ReadAll(); err != nil || len(recs) != 4 {
		t.Errorf("export -f (want a header and 3 rows): %v\n%s", err, b)
	}
	r = c.run("links", "import", file, "-o", "json")
	if r.code != exitRowsFailed {
		t.Fatalf("import again with two bad rows: %s; want exit %d", r, exitRowsFailed)
	}
	rep := decodeJSON(t, r.stdout)
	// Again: the codes are these very links, to the same URLs, so nothing
	// is created twice; the two bad rows fail again.
	if rep["format"] != "bitly" || rep["rows"] != float64(5) || rep["created"] != float64(0) || rep["existing"] != float64(3) ||
		rep["failed"] != float64(2) {
		t.Errorf("import -o json: %v", rep)
	}
	if page := decodeJSON(t, c.ok("links", "list", "--tag", "import-bitly", "--all", "-o", "json")); len(page["links"].([]any)) != 3 {
		t.Errorf("links tagged import-bitly after importing the file again: %v", page)
	}
}

// links create --idempotency-key: the same create run twice is one link,
// the second saying so on stderr; another create with the key fails,
// naming why.
func TestLinksCreateIdempotencyKey(t *testing.T) {
	gw := startGateway(t, stack.Limiter)
	_, c := tenantWithKey(t, newCtl(t, gw), "free")
	first := c.run("links", "create", "https://example.com/idempotent", "--idempotency-key", "run-42", "-q")
	if first.code != 0 || strings.Contains(first.stderr, "exists already") {
		t.Fatalf("first create: %s", first)
	}
	again := c.run("links", "create", "https://example.com/idempotent", "--idempotency-key", "run-42", "-q")
	if again.code != 0 || again.stdout != first.stdout || !strings.Contains(again.stderr, "exists already") {
		t.Errorf("the same create again: %s\nwant code %s and a note that it exists", again, first.stdout)
	}
	other := c.run("links", "create", "https://example.com/another", "--idempotency-key", "run-42")
	if other.code != 1 || !strings.Contains(other.stderr, "this idempotency key made a link for another request") {
		t.Errorf("another create with the key: %s; want exit 1 naming the reuse", other)
	}
	if page := decodeJSON(t, c.ok("links", "list", "-o", "json")); len(page["links"].([]any)) != 1 {
		t.Errorf("links after the three creates: %v; want one", page)
	}
}

// links create --from-url: the same URL twice is one link; the second
// create says on stderr that it existed, and -q prints its code.
func TestLinksCreateFromURL(t *testing.T) {
	gw := startGateway(t, stack.Limiter)
	_, c := tenantWithKey(t, newCtl(t, gw), "free")
	first := c.run("links", "create", "https://example.com/from-url", "--from-url", "--tag", "one")
	if first.code != 0 || strings.Contains(first.stderr, "exists already") {
		t.Fatalf("first create: %s", first)
	}
	code := field(t, first.stdout, "code")
	again := c.run("links", "create", "https://example.com/from-url", "--from-url", "-q")
	if again.code != 0 || strings.TrimSpace(again.stdout) != code || !strings.Contains(again.stderr, "exists already") {
		t.Errorf("second create: %s\nwant code %s and a note that it exists", again, code)
	}
	if tags := field(t, c.ok("links", "get", code), "tags"); tags != "one" {
		t.Errorf("the repeat changed the link: tags %q", tags)
	}
}
