//go:build integration

package app

import (
	"context"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/redis/go-redis/v9"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc/codes"
	"google.golang.org/protobuf/types/known/fieldmaskpb"
	"google.golang.org/protobuf/types/known/timestamppb"

	shortenerv1 "kurz.dev/gen/kurz/shortener/v1"
	"kurz.dev/pkg/linkcache"
	"kurz.dev/pkg/linkpass"
	"kurz.dev/services/shortener/internal/linkapi"
	"kurz.dev/services/shortener/internal/urlcheck"
)

// cacheEntry reads code's write-through entry, failing without one.
func cacheEntry(t *testing.T, rdb redis.Cmdable, code string) linkcache.Entry {
	t.Helper()
	e, found, err := linkcache.Get(context.Background(), rdb, code)
	if err != nil || !found {
		t.Fatalf("redis entry of %s: found %v, %v", code, found, err)
	}
	return e
}

// row is what PostgreSQL holds of a link's new columns.
type row struct {
	tags                        []string
	maxVisits                   int64
	hash, ios, android, desktop *string
}

func readRow(t *testing.T, db *pgxpool.Pool, code string) row {
	t.Helper()
	var r row
	if err := db.QueryRow(context.Background(),
		`SELECT tags, max_visits, password_hash, ios_url, android_url, desktop_url FROM links WHERE code = $1`, code,
	).Scan(&r.tags, &r.maxVisits, &r.hash, &r.ios, &r.android, &r.desktop); err != nil {
		t.Fatalf("row of %s: %v", code, err)
	}
	return r
}

// fieldOf returns the BadRequest field of an INVALID_ARGUMENT.
func fieldOf(t *testing.T, err error) string {
	t.Helper()
	_, st := wantStatus(t, err, codes.InvalidArgument)
	for _, d := range st.Details() {
		if br, ok := d.(*errdetails.BadRequest); ok && len(br.GetFieldViolations()) == 1 {
			return br.GetFieldViolations()[0].GetField()
		}
	}
	t.Fatalf("no BadRequest field violation in %v", st.Details())
	return ""
}

func mask(paths ...string) *fieldmaskpb.FieldMask { return &fieldmaskpb.FieldMask{Paths: paths} }

// TestTagsAreNormalisedAndValidated: tags are lower-cased, de-duplicated in
// their first order and stored so; a bad tag is INVALID_ARGUMENT naming it,
// and nothing is stored.
func TestTagsAreNormalisedAndValidated(t *testing.T) {
	tenant := uniq("tag-")
	sh := start(t, nil, hooks{})
	db, _ := stores(t, sh.cfg, tenant)
	ctx := as(tenant, "")

	got, err := sh.api.CreateLink(ctx, &shortenerv1.CreateLinkRequest{LongUrl: "https://example.com/t",
		Tags: []string{"Launch", "k8s.io", "launch", "a_b-c", "LAUNCH", "2026"}})
	if err != nil {
		t.Fatal(err)
	}
	want := []string{"launch", "k8s.io", "a_b-c", "2026"}
	if !slices.Equal(got.GetLink().GetTags(), want) {
		t.Errorf("response tags %q, want %q", got.GetLink().GetTags(), want)
	}
	if r := readRow(t, db, got.GetLink().GetCode()); !slices.Equal(r.tags, want) {
		t.Errorf("stored tags %q, want %q", r.tags, want)
	}
	untagged, err := sh.api.CreateLink(ctx, &shortenerv1.CreateLinkRequest{LongUrl: "https://example.com/u"})
	if err != nil {
		t.Fatal(err)
	}
	if r := readRow(t, db, untagged.GetLink().GetCode()); r.tags == nil || len(r.tags) != 0 {
		t.Errorf("untagged link stored tags %#v, want {}", r.tags)
	}
	eleven := []string{"a", "b", "c", "d", "e", "f", "g", "h", "i", "j", "k"}
	if _, err := sh.api.CreateLink(ctx, &shortenerv1.CreateLinkRequest{LongUrl: "https://example.com/ten",
		Tags: append(slices.Clone(eleven[:10]), "A", "b")}); err != nil {
		t.Errorf("ten distinct tags with duplicates: %v", err)
	}

	for name, tc := range map[string]struct {
		tags  []string
		named string // the message quotes it
	}{
		"empty":      {[]string{"ok", ""}, `""`},
		"too long":   {[]string{strings.Repeat("x", 33)}, "xxxxxxxx"},
		"space":      {[]string{"has space"}, `"has space"`},
		"slash":      {[]string{"a/b"}, `"a/b"`},
		"non-ascii":  {[]string{"straße"}, `"stra`},
		"kelvin":     {[]string{"\u212aelvin"}, `elvin"`},
		"eleven":     {eleven, "at most 10"},
		"comma list": {[]string{"a,b"}, `"a,b"`},
	} {
		t.Run(name, func(t *testing.T) {
			_, err := sh.api.CreateLink(ctx, &shortenerv1.CreateLinkRequest{LongUrl: "https://example.com/bad", Tags: tc.tags})
			reason, st := wantStatus(t, err, codes.InvalidArgument)
			if reason != linkapi.ReasonTagsInvalid || !strings.Contains(st.Message(), tc.named) {
				t.Errorf("reason %q message %q; want %s naming %s", reason, st.Message(), linkapi.ReasonTagsInvalid, tc.named)
			}
			if f := fieldOf(t, err); f != "tags" {
				t.Errorf("field %q, want tags", f)
			}
		})
	}
	var n int
	if err := db.QueryRow(context.Background(), `SELECT count(*) FROM links WHERE tenant = $1 AND long_url = 'https://example.com/bad'`, tenant).Scan(&n); err != nil || n != 0 {
		t.Errorf("%d rows stored for refused tags (%v)", n, err)
	}
}

// TestListByTag: a tag filter lists only the tenant's live links carrying
// it, newest first, across pages; a page token works only with the tag it
// was issued for.
func TestListByTag(t *testing.T) {
	tenant, other := uniq("ltg-"), uniq("ltg-")
	sh := start(t, nil, hooks{})
	stores(t, sh.cfg, tenant, other)
	ctx := as(tenant, "")
	var red []string
	for i := range 9 {
		tags := []string{"blue"}
		if i%3 != 2 {
			tags = []string{"x", "Red"}
		}
		r, err := sh.api.CreateLink(ctx, &shortenerv1.CreateLinkRequest{LongUrl: "https://example.com/l", Tags: tags})
		if err != nil {
			t.Fatal(err)
		}
		if i%3 != 2 {
			red = append(red, r.GetLink().GetCode())
		}
	}
	if _, err := sh.api.CreateLink(as(other, ""), &shortenerv1.CreateLinkRequest{LongUrl: "https://example.com/o", Tags: []string{"red"}}); err != nil {
		t.Fatal(err)
	}
	if _, err := sh.api.DeleteLink(ctx, &shortenerv1.DeleteLinkRequest{Code: red[1]}); err != nil {
		t.Fatal(err)
	}
	var want []string
	for i := len(red) - 1; i >= 0; i-- {
		if i != 1 {
			want = append(want, red[i])
		}
	}

	var got, tokens []string
	token := ""
	for pages := 0; ; pages++ {
		if pages > len(want) {
			t.Fatal("too many pages")
		}
		resp, err := sh.api.ListLinks(ctx, &shortenerv1.ListLinksRequest{PageSize: 2, PageToken: token, Tag: "RED"})
		if err != nil {
			t.Fatal(err)
		}
		for _, l := range resp.GetLinks() {
			if !slices.Contains(l.GetTags(), "red") {
				t.Errorf("link %s listed under red with tags %q", l.GetCode(), l.GetTags())
			}
			got = append(got, l.GetCode())
		}
		if token = resp.GetNextPageToken(); token == "" {
			break
		}
		tokens = append(tokens, token)
	}
	if !slices.Equal(got, want) {
		t.Errorf("listed %v, want %v (newest first, revoked and other tenants left out)", got, want)
	}
	if len(tokens) < 2 {
		t.Fatalf("%d page tokens, want several pages", len(tokens))
	}

	_, err := sh.api.ListLinks(ctx, &shortenerv1.ListLinksRequest{PageSize: 2, PageToken: tokens[0], Tag: "blue"})
	if reason, _ := wantStatus(t, err, codes.InvalidArgument); reason != linkapi.ReasonPageTokenInvalid {
		t.Errorf("red token with tag blue: reason %q", reason)
	}
	_, err = sh.api.ListLinks(ctx, &shortenerv1.ListLinksRequest{PageSize: 2, PageToken: tokens[0]})
	if reason, _ := wantStatus(t, err, codes.InvalidArgument); reason != linkapi.ReasonPageTokenInvalid {
		t.Errorf("red token without a tag: reason %q", reason)
	}
	all, err := sh.api.ListLinks(ctx, &shortenerv1.ListLinksRequest{PageSize: 2})
	if err != nil || all.GetNextPageToken() == "" {
		t.Fatalf("unfiltered list: %v, %v", all, err)
	}
	_, err = sh.api.ListLinks(ctx, &shortenerv1.ListLinksRequest{PageSize: 2, PageToken: all.GetNextPageToken(), Tag: "red"})
	if reason, _ := wantStatus(t, err, codes.InvalidArgument); reason != linkapi.ReasonPageTokenInvalid {
		t.Errorf("unfiltered token with tag red: reason %q", reason)
	}
	_, err = sh.api.ListLinks(ctx, &shortenerv1.ListLinksRequest{Tag: "not a tag"})
	if f := fieldOf(t, err); f != "tag" {
		t.Errorf("bad tag filter: field %q, want tag", f)
	}
	none, err := sh.api.ListLinks(ctx, &shortenerv1.ListLinksRequest{Tag: "green"})
	if err != nil || len(none.GetLinks()) != 0 {
		t.Errorf("tag nobody carries: %v, %v", none.GetLinks(), err)
	}
}

// TestPasswordIsHashedAndNeverReturned: a password is stored only as an
// Argon2id hash that verifies, carried in the Redis entry, reported as
// password_protected, and never sent back; it can be changed and removed.
func TestPasswordIsHashedAndNeverReturned(t *testing.T) {
	const password = "correct horse battery"
	tenant := uniq("pwd-")
	sh := start(t, nil, hooks{})
	db, rdb := stores(t, sh.cfg, tenant)
	ctx := as(tenant, "")

	made, err := sh.api.CreateLink(ctx, &shortenerv1.CreateLinkRequest{LongUrl: "https://example.com/secret", Password: password})
	if err != nil {
		t.Fatal(err)
	}
	code := made.GetLink().GetCode()
	check := func(when string, l *shortenerv1.Link, protected bool) {
		t.Helper()
		if l.GetPassword() != "" || l.GetPasswordProtected() != protected {
			t.Errorf("%s: password %q, password_protected %v; want none and %v", when, l.GetPassword(), l.GetPasswordProtected(), protected)
		}
	}
	check("create", made.GetLink(), true)
	got, err := sh.api.GetLink(ctx, &shortenerv1.GetLinkRequest{Code: code})
	if err != nil {
		t.Fatal(err)
	}
	check("get", got.GetLink(), true)
	list, err := sh.api.ListLinks(ctx, &shortenerv1.ListLinksRequest{})
	if err != nil || len(list.GetLinks()) != 1 {
		t.Fatalf("list: %v, %v", list, err)
	}
	check("list", list.GetLinks()[0], true)

	r := readRow(t, db, code)
	if r.hash == nil || !strings.HasPrefix(*r.hash, "$argon2id$") {
		t.Fatalf("stored password_hash %v, want an Argon2id PHC string", r.hash)
	}
	if ok, err := linkpass.Verify(*r.hash, password); err != nil || !ok {
		t.Errorf("stored hash does not verify the password: %v, %v", ok, err)
	}
	if ok, _ := linkpass.Verify(*r.hash, password+"!"); ok {
		t.Error("stored hash verifies a wrong password")
	}
	if e := cacheEntry(t, rdb, code); e.PasswordHash != *r.hash {
		t.Errorf("redis entry password hash %q, want the stored %q", e.PasswordHash, *r.hash)
	}

	_, err = sh.api.CreateLink(ctx, &shortenerv1.CreateLinkRequest{LongUrl: "https://example.com/short", Password: "short"})
	reason, st := wantStatus(t, err, codes.InvalidArgument)
	if reason != linkapi.ReasonPasswordInvalid || !strings.Contains(st.Message(), "8 to 128 characters") || strings.Contains(st.Message(), "short\"") {
		t.Errorf("short password: reason %q message %q", reason, st.Message())
	}
	if f := fieldOf(t, err); f != "password" {
		t.Errorf("short password: field %q", f)
	}

	const changed = "another passphrase"
	upd, err := sh.api.UpdateLink(ctx, &shortenerv1.UpdateLinkRequest{Link: &shortenerv1.Link{Code: code, Password: changed}, UpdateMask: mask("password")})
	if err != nil {
		t.Fatal(err)
	}
	check("update", upd.GetLink(), true)
	r = readRow(t, db, code)
	if ok, err := linkpass.Verify(*r.hash, changed); err != nil || !ok {
		t.Errorf("after the change the new password does not verify: %v, %v", ok, err)
	}
	if ok, _ := linkpass.Verify(*r.hash, password); ok {
		t.Error("after the change the old password still verifies")
	}
	if e := cacheEntry(t, rdb, code); e.PasswordHash != *r.hash {
		t.Errorf("redis entry after the change: %q, want %q", e.PasswordHash, *r.hash)
	}
	_, err = sh.api.UpdateLink(ctx, &shortenerv1.UpdateLinkRequest{Link: &shortenerv1.Link{Code: code, Password: "1234567"}, UpdateMask: mask("password")})
	if reason, _ := wantStatus(t, err, codes.InvalidArgument); reason != linkapi.ReasonPasswordInvalid {
		t.Errorf("update to a short password: reason %q", reason)
	}

	upd, err = sh.api.UpdateLink(ctx, &shortenerv1.UpdateLinkRequest{Link: &shortenerv1.Link{Code: code}, UpdateMask: mask("password")})
	if err != nil {
		t.Fatal(err)
	}
	check("removal", upd.GetLink(), false)
	if r := readRow(t, db, code); r.hash != nil {
		t.Errorf("after removal password_hash %q, want NULL", *r.hash)
	}
	if e := cacheEntry(t, rdb, code); e.PasswordHash != "" || e.URL != "https://example.com/secret" {
		t.Errorf("redis entry after removal: %+v", e)
	}
}

// TestMaxVisits: the limit is stored and written through; out of range is
// INVALID_ARGUMENT; changing it keeps the visits counted so far.
func TestMaxVisits(t *testing.T) {
	tenant := uniq("mxv-")
	sh := start(t, nil, hooks{})
	db, rdb := stores(t, sh.cfg, tenant)
	ctx := as(tenant, "")

	made, err := sh.api.CreateLink(ctx, &shortenerv1.CreateLinkRequest{LongUrl: "https://example.com/m", MaxVisits: 3})
	if err != nil {
		t.Fatal(err)
	}
	code := made.GetLink().GetCode()
	t.Cleanup(func() { rdb.Del(context.Background(), linkcache.VisitsKey(code)) })
	if made.GetLink().GetMaxVisits() != 3 || readRow(t, db, code).maxVisits != 3 || cacheEntry(t, rdb, code).MaxVisits != 3 {
		t.Errorf("max_visits 3: response %d, stored %d, redis %d", made.GetLink().GetMaxVisits(), readRow(t, db, code).maxVisits, cacheEntry(t, rdb, code).MaxVisits)
	}
	for _, bad := range []int64{-1, linkapi.MaxVisitsLimit + 1} {
		_, err := sh.api.CreateLink(ctx, &shortenerv1.CreateLinkRequest{LongUrl: "https://example.com/m", MaxVisits: bad})
		if reason, _ := wantStatus(t, err, codes.InvalidArgument); reason != linkapi.ReasonMaxVisitsInvalid {
			t.Errorf("max_visits %d: reason %q", bad, reason)
		}
		_, err = sh.api.UpdateLink(ctx, &shortenerv1.UpdateLinkRequest{Link: &shortenerv1.Link{Code: code, MaxVisits: bad}, UpdateMask: mask("max_visits")})
		if f := fieldOf(t, err); f != "max_visits" {
			t.Errorf("update to max_visits %d: field %q", bad, f)
		}
	}
	if _, err := sh.api.CreateLink(ctx, &shortenerv1.CreateLinkRequest{LongUrl: "https://example.com/m", MaxVisits: linkapi.MaxVisitsLimit}); err != nil {
		t.Errorf("max_visits at the bound: %v", err)
	}

	// Two visits counted (as the redirect service would INCR them), then the
	// limit raised: the count stays.
	if err := rdb.IncrBy(context.Background(), linkcache.VisitsKey(code), 2).Err(); err != nil {
		t.Fatal(err)
	}
	upd, err := sh.api.UpdateLink(ctx, &shortenerv1.UpdateLinkRequest{Link: &shortenerv1.Link{Code: code, MaxVisits: 10}, UpdateMask: mask("max_visits")})
	if err != nil {
		t.Fatal(err)
	}
	if upd.GetLink().GetMaxVisits() != 10 || readRow(t, db, code).maxVisits != 10 || cacheEntry(t, rdb, code).MaxVisits != 10 {
		t.Errorf("after raising to 10: response %d, stored %d, redis %d", upd.GetLink().GetMaxVisits(), readRow(t, db, code).maxVisits, cacheEntry(t, rdb, code).MaxVisits)
	}
	if n, err := rdb.Get(context.Background(), linkcache.VisitsKey(code)).Int64(); err != nil || n != 2 {
		t.Errorf("visit counter after the change: %d, %v; want 2 kept", n, err)
	}
	upd, err = sh.api.UpdateLink(ctx, &shortenerv1.UpdateLinkRequest{Link: &shortenerv1.Link{Code: code}, UpdateMask: mask("max_visits")})
	if err != nil || upd.GetLink().GetMaxVisits() != 0 || cacheEntry(t, rdb, code).MaxVisits != 0 {
		t.Errorf("limit removed: %v, %v", upd.GetLink(), err)
	}
}

// TestDeviceTargets: each target is validated like long_url (javascript:,
// the own domain refused, naming the field), stored in normal form, written
// through, and replaced or cleared as a whole by an update.
func TestDeviceTargets(t *testing.T) {
	tenant := uniq("dev-")
	sh := start(t, map[string]string{"KURZ_SHORTENER_BASE_URL": "https://kurz.example"}, hooks{})
	db, rdb := stores(t, sh.cfg, tenant)
	ctx := as(tenant, "")

	plain, err := sh.api.CreateLink(ctx, &shortenerv1.CreateLinkRequest{LongUrl: "https://example.com/p"})
	if err != nil {
		t.Fatal(err)
	}
	if plain.GetLink().GetDeviceTargets() != nil || cacheEntry(t, rdb, plain.GetLink().GetCode()).Targets != nil {
		t.Errorf("a link without targets has %v / %+v, want nil", plain.GetLink().GetDeviceTargets(), cacheEntry(t, rdb, plain.GetLink().GetCode()).Targets)
	}

	made, err := sh.api.CreateLink(ctx, &shortenerv1.CreateLinkRequest{LongUrl: "https://example.com/app",
		DeviceTargets: &shortenerv1.DeviceTargets{IosUrl: " HTTPS://Apps.Apple.com/app/x ", AndroidUrl: "https://play.google.com/store/apps/details?id=x"}})
	if err != nil {
		t.Fatal(err)
	}
	code := made.GetLink().GetCode()
	wantIOS, wantAndroid := "https://apps.apple.com/app/x", "https://play.google.com/store/apps/details?id=x"
	if dt := made.GetLink().GetDeviceTargets(); dt.GetIosUrl() != wantIOS || dt.GetAndroidUrl() != wantAndroid || dt.GetDesktopUrl() != "" {
		t.Errorf("response targets %v", dt)
	}
	if r := readRow(t, db, code); r.ios == nil || *r.ios != wantIOS || r.android == nil || *r.android != wantAndroid || r.desktop != nil {
		t.Errorf("stored targets %v %v %v", r.ios, r.android, r.desktop)
	}
	if e := cacheEntry(t, rdb, code); e.Targets == nil || *e.Targets != (linkcache.Targets{IOS: wantIOS, Android: wantAndroid}) {
		t.Errorf("redis targets %+v", e.Targets)
	}

	for name, tc := range map[string]struct {
		dt            *shortenerv1.DeviceTargets
		field, reason string
	}{
		"javascript android": {&shortenerv1.DeviceTargets{AndroidUrl: "javascript:alert(1)"}, "device_targets.android_url", urlcheck.ReasonScheme},
		"data desktop":       {&shortenerv1.DeviceTargets{DesktopUrl: "data:text/html,hi"}, "device_targets.desktop_url", urlcheck.ReasonScheme},
		"own domain ios":     {&shortenerv1.DeviceTargets{IosUrl: "https://kurz.example/abcd"}, "device_targets.ios_url", urlcheck.ReasonLoop},
		"private ios":        {&shortenerv1.DeviceTargets{IosUrl: "http://10.0.0.1/"}, "device_targets.ios_url", urlcheck.ReasonPrivateHost},
	} {
		t.Run(name, func(t *testing.T) {
			_, err := sh.api.CreateLink(ctx, &shortenerv1.CreateLinkRequest{LongUrl: "https://example.com/ok", DeviceTargets: tc.dt})
			if reason, _ := wantStatus(t, err, codes.InvalidArgument); reason != tc.reason {
				t.Errorf("create: reason %q, want %s", reason, tc.reason)
			}
			if f := fieldOf(t, err); f != tc.field {
				t.Errorf("create: field %q, want %s", f, tc.field)
			}
			_, err = sh.api.UpdateLink(ctx, &shortenerv1.UpdateLinkRequest{Link: &shortenerv1.Link{Code: code, DeviceTargets: tc.dt}, UpdateMask: mask("device_targets")})
			if f := fieldOf(t, err); f != tc.field {
				t.Errorf("update: field %q, want %s", f, tc.field)
			}
		})
	}
	if e := cacheEntry(t, rdb, code); e.Targets == nil || e.Targets.IOS != wantIOS {
		t.Errorf("refused updates changed the entry: %+v", e.Targets)
	}

	upd, err := sh.api.UpdateLink(ctx, &shortenerv1.UpdateLinkRequest{
		Link:       &shortenerv1.Link{Code: code, DeviceTargets: &shortenerv1.DeviceTargets{DesktopUrl: "https://example.com/desk"}},
		UpdateMask: mask("device_targets")})
	if err != nil {
		t.Fatal(err)
	}
	if dt := upd.GetLink().GetDeviceTargets(); dt.GetIosUrl() != "" || dt.GetAndroidUrl() != "" || dt.GetDesktopUrl() != "https://example.com/desk" {
		t.Errorf("after replacing: %v", dt)
	}
	if e := cacheEntry(t, rdb, code); e.Targets == nil || *e.Targets != (linkcache.Targets{Desktop: "https://example.com/desk"}) {
		t.Errorf("redis after replacing: %+v", e.Targets)
	}
	upd, err = sh.api.UpdateLink(ctx, &shortenerv1.UpdateLinkRequest{Link: &shortenerv1.Link{Code: code}, UpdateMask: mask("device_targets")})
	if err != nil {
		t.Fatal(err)
	}
	if upd.GetLink().GetDeviceTargets() != nil || cacheEntry(t, rdb, code).Targets != nil {
		t.Errorf("after clearing: %v / %+v", upd.GetLink().GetDeviceTargets(), cacheEntry(t, rdb, code).Targets)
	}
	if r := readRow(t, db, code); r.ios != nil || r.android != nil || r.desktop != nil {
		t.Errorf("stored after clearing: %v %v %v", r.ios, r.android, r.desktop)
	}
}

// TestUpdateTagsAndMaskPaths: tags are replaced (normalised) and cleared by
// an update; unknown paths stay INVALID_ARGUMENT and change nothing.
func TestUpdateTagsAndMaskPaths(t *testing.T) {
	tenant := uniq("utg-")
	sh := start(t, nil, hooks{})
	db, _ := stores(t, sh.cfg, tenant)
	ctx := as(tenant, "")
	made, err := sh.api.CreateLink(ctx, &shortenerv1.CreateLinkRequest{LongUrl: "https://example.com/u", Tags: []string{"old"}})
	if err != nil {
		t.Fatal(err)
	}
	code := made.GetLink().GetCode()
	upd, err := sh.api.UpdateLink(ctx, &shortenerv1.UpdateLinkRequest{Link: &shortenerv1.Link{Code: code, Tags: []string{"New", "new", "q3"}}, UpdateMask: mask("tags")})
	if err != nil {
		t.Fatal(err)
	}
	if want := []string{"new", "q3"}; !slices.Equal(upd.GetLink().GetTags(), want) || !slices.Equal(readRow(t, db, code).tags, want) {
		t.Errorf("after update: response %q, stored %q; want %q", upd.GetLink().GetTags(), readRow(t, db, code).tags, want)
	}
	_, err = sh.api.UpdateLink(ctx, &shortenerv1.UpdateLinkRequest{Link: &shortenerv1.Link{Code: code, Tags: []string{"bad tag"}}, UpdateMask: mask("tags")})
	if reason, _ := wantStatus(t, err, codes.InvalidArgument); reason != linkapi.ReasonTagsInvalid {
		t.Errorf("bad tag update: reason %q", reason)
	}
	for _, p := range []string{"password_protected", "tenant", "code", "device_targets.ios_url"} {
		_, err := sh.api.UpdateLink(ctx, &shortenerv1.UpdateLinkRequest{Link: &shortenerv1.Link{Code: code}, UpdateMask: mask("tags", p)})
		if reason, _ := wantStatus(t, err, codes.InvalidArgument); reason != linkapi.ReasonUpdateMaskInvalid {
			t.Errorf("path %q: reason %q", p, reason)
		}
	}
	if got := readRow(t, db, code).tags; !slices.Equal(got, []string{"new", "q3"}) {
		t.Errorf("refused updates changed the tags to %q", got)
	}
	upd, err = sh.api.UpdateLink(ctx, &shortenerv1.UpdateLinkRequest{Link: &shortenerv1.Link{Code: code}, UpdateMask: mask("tags")})
	if err != nil || len(upd.GetLink().GetTags()) != 0 || len(readRow(t, db, code).tags) != 0 {
		t.Errorf("clearing tags: %v, %v", upd.GetLink().GetTags(), err)
	}
}

// TestDeleteRemovesVisitCounter: deleting a link deletes v:<code> as well as
// writing the gone entry.
func TestDeleteRemovesVisitCounter(t *testing.T) {
	tenant := uniq("dvc-")
	sh := start(t, nil, hooks{})
	_, rdb := stores(t, sh.cfg, tenant)
	ctx := as(tenant, "")
	made, err := sh.api.CreateLink(ctx, &shortenerv1.CreateLinkRequest{LongUrl: "https://example.com/d", MaxVisits: 5})
	if err != nil {
		t.Fatal(err)
	}
	code := made.GetLink().GetCode()
	key := linkcache.VisitsKey(code)
	t.Cleanup(func() { rdb.Del(context.Background(), key) })
	if err := rdb.Set(context.Background(), key, 4, 0).Err(); err != nil {
		t.Fatal(err)
	}
	if _, err := sh.api.DeleteLink(ctx, &shortenerv1.DeleteLinkRequest{Code: code}); err != nil {
		t.Fatal(err)
	}
	if n, err := rdb.Exists(context.Background(), key).Result(); err != nil || n != 0 {
		t.Errorf("%s after delete: exists=%d (%v), want gone", key, n, err)
	}
	if e := cacheEntry(t, rdb, code); e.State != linkcache.Gone {
		t.Errorf("entry after delete: %+v", e)
	}
}

// TestVisitCounterFollowsExpiry: every change of a link gives its visit
// counter the lifetime of the link's current expiry (plus the grace), with
// no visit in between: a cleared expiry makes the counter permanent, a
// later one moves its end along. A counter that ended before its link
// would hand out the spent visits again. The count itself is kept, and a
// link with no counter yet gets none.
func TestVisitCounterFollowsExpiry(t *testing.T) {
	tenant := uniq("vce-")
	sh := start(t, nil, hooks{})
	_, rdb := stores(t, sh.cfg, tenant)
	ctx := as(tenant, "")
	bg := context.Background()
	soon := time.Now().Add(20 * time.Second).Truncate(time.Millisecond)
	made, err := sh.api.CreateLink(ctx, &shortenerv1.CreateLinkRequest{LongUrl: "https://example.com/e", MaxVisits: 1,
		ExpireTime: timestamppb.New(soon)})
	if err != nil {
		t.Fatal(err)
	}
	code := made.GetLink().GetCode()
	key := linkcache.VisitsKey(code)
	t.Cleanup(func() { rdb.Del(bg, key) })
	expire := func(at *time.Time) {
		t.Helper()
		l := &shortenerv1.Link{Code: code}
		if at != nil {
			l.ExpireTime = timestamppb.New(*at)
		}
		if _, err := sh.api.UpdateLink(ctx, &shortenerv1.UpdateLinkRequest{Link: l, UpdateMask: mask("expire_time")}); err != nil {
			t.Fatal(err)
		}
	}
	ttl := func() time.Duration {
		t.Helper()
		d, err := rdb.PTTL(bg, key).Result()
		if err != nil {
			t.Fatal(err)
		}
		return d
	}

	later := time.Now().Add(3 * time.Hour).Truncate(time.Millisecond)
	expire(&later)
	if n := rdb.Exists(bg, key).Val(); n != 0 {
		t.Fatalf("an unvisited link's update created its counter")
	}
	// The link spent (two visits on one), its counter ending with the link
	// plus the grace, as the redirect leaves it.
	if err := rdb.Set(bg, key, 2, 0).Err(); err != nil {
		t.Fatal(err)
	}
	if err := rdb.PExpireAt(bg, key, soon.Add(linkcache.VisitsGrace)).Err(); err != nil {
		t.Fatal(err)
	}

	expire(nil)
	if got := ttl(); got != -1 {
		t.Errorf("counter TTL %v after the expiry was cleared, want none (-1)", got)
	}
	expire(&later)
	// Redis rounds to its own clock: allow it a second either way.
	if got, want := ttl(), time.Until(later)+linkcache.VisitsGrace; (got - want).Abs() > time.Second {
		t.Errorf("counter TTL %v after the expiry moved 3 h on, want %v: the new expiry plus the grace", got, want)
	}
	if n, err := rdb.Get(bg, key).Int64(); err != nil || n != 2 {
		t.Errorf("visit count %d (%v) after the expiry changes, want 2 kept", n, err)
	}
}
