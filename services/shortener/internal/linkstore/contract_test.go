package linkstore_test

import (
	"context"
	"crypto/rand"
	"encoding/base64"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
	"testing"
	"time"

	"kurz.dev/pkg/linkrules"
	"kurz.dev/services/shortener/internal/linkapi"
	"kurz.dev/services/shortener/internal/linkstore"
	"kurz.dev/services/shortener/internal/linkstore/linkstoretest"
)

// contractStore is what the contract checks: what linkapi needs of a store,
// and the block source of codegen.
type contractStore interface {
	linkapi.Store
	NextBlocks(ctx context.Context, n int) ([]int64, error)
}

// newRun returns a fresh prefix for a contract run's codes and tenants: the
// PostgreSQL store's run shares its database with other tests.
func newRun() string { return "ct" + strings.ToLower(rand.Text()[:10]) }

// The in-memory store linkapi's unit tests use behaves as the PostgreSQL
// store does (TestPostgresStoreMeetsTheContract, integration tier).
func TestFakeStoreMeetsTheContract(t *testing.T) {
	testContract(t, linkstoretest.New(), newRun())
}

// testContract checks s: every code and tenant it makes starts with run.
func testContract(t *testing.T, s contractStore, run string) {
	ctx := context.Background()
	tenant, other := run+"-a", run+"-b"
	insert := func(t *testing.T, l linkstore.Link) linkstore.Link {
		t.Helper()
		got, err := s.Insert(ctx, l)
		if err != nil {
			t.Fatalf("Insert %s: %v", l.Code, err)
		}
		return got
	}
	pending := func(t *testing.T, code string) bool {
		t.Helper()
		due, err := s.DueInvalidations(ctx, 1_000_000)
		if err != nil {
			t.Fatal(err)
		}
		return slices.Contains(due, code)
	}

	t.Run("InsertThenGetReturnsEveryField", func(t *testing.T) {
		exp := time.Now().Add(time.Hour).Truncate(time.Microsecond)
		want := linkstore.Link{Code: run + "f1", Tenant: tenant, LongURL: "https://example.com/f", Status: 308,
			Expires: &exp, Tags: []string{"b", "a"}, MaxVisits: 7, PasswordHash: "$argon2id$x",
			IOSURL: "https://example.com/ios", DesktopURL: "https://example.com/desk", Title: " Ünïcödé <b>title</b> "}
		stored := insert(t, want)
		got, err := s.Get(ctx, tenant, want.Code)
		if err != nil {
			t.Fatal(err)
		}
		for name, l := range map[string]linkstore.Link{"Insert": stored, "Get": got} {
			if l.Code != want.Code || l.Tenant != tenant || l.LongURL != want.LongURL || l.Status != 308 ||
				l.Expires == nil || !l.Expires.Equal(exp) || !slices.Equal(l.Tags, want.Tags) || l.MaxVisits != 7 ||
				l.PasswordHash != want.PasswordHash || l.IOSURL != want.IOSURL || l.AndroidURL != "" ||
				l.DesktopURL != want.DesktopURL || l.Title != want.Title || l.Disabled || l.Deleted != nil || l.Created.IsZero() || !l.Updated.Equal(l.Created) {
				t.Errorf("%s returned %+v; want the fields inserted, %+v", name, l, want)
			}
		}
		bare := insert(t, linkstore.Link{Code: run + "f2", Tenant: tenant, LongURL: "https://example.com/bare"})
		if bare.Tags == nil || len(bare.Tags) != 0 || bare.Expires != nil || bare.Title != "" {
			t.Errorf("a link without tags, expiry or title: tags %#v, expiry %v, title %q; want an empty slice, nil and none", bare.Tags, bare.Expires, bare.Title)
		}
	})

	t.Run("OneLiveLinkPerTenantAndURLKey", func(t *testing.T) {
		key := []byte(run + "-url-key-0123456789abcdef")
		a := insert(t, linkstore.Link{Code: run + "h1", Tenant: tenant, LongURL: "https://example.com/u", URLKey: key})
		if string(a.URLKey) != string(key) {
			t.Fatalf("Insert returned URLKey %q, want %q", a.URLKey, key)
		}
		if _, err := s.Insert(ctx, linkstore.Link{Code: run + "h2", Tenant: tenant, LongURL: "https://example.com/u", URLKey: key}); !errors.Is(err, linkstore.ErrURLTaken) {
			t.Errorf("a second live link of the tenant with the key: %v, want ErrURLTaken", err)
		}
		if _, err := s.Insert(ctx, linkstore.Link{Code: run + "h1", Tenant: tenant, LongURL: "https://example.com/u", URLKey: key}); !errors.Is(err, linkstore.ErrCodeTaken) {
			t.Errorf("a taken code with a taken key: %v, want ErrCodeTaken", err)
		}
		insert(t, linkstore.Link{Code: run + "h3", Tenant: run + "-c", LongURL: "https://example.com/u", URLKey: key})
		if got, err := s.FromURL(ctx, tenant, key); err != nil || got.Code != a.Code {
			t.Errorf("FromURL = %s, %v; want %s", got.Code, err, a.Code)
		}
		if _, err := s.InsertMany(ctx, []linkstore.Link{{Code: run + "h4", Tenant: tenant, LongURL: "https://example.com/v", URLKey: []byte("k")}}); err == nil {
			t.Error("InsertMany stored a link with a URLKey")
		}

		// A new long URL: the link is no longer the URL's.
		moved := "https://example.com/moved"
		if l, err := s.Update(ctx, tenant, a.Code, linkstore.Changes{LongURL: &moved}); err != nil || l.URLKey != nil {
			t.Fatalf("Update long_url: URLKey %q, %v; want none", l.URLKey, err)
		}
		if _, err := s.FromURL(ctx, tenant, key); !errors.Is(err, linkstore.ErrNotFound) {
			t.Errorf("FromURL after the URL changed: %v, want ErrNotFound", err)
		}
		// A deleted link leaves the key free (its code stays taken).
		b := insert(t, linkstore.Link{Code: run + "h5", Tenant: tenant, LongURL: "https://example.com/u", URLKey: key})
		if _, err := s.Delete(ctx, tenant, b.Code, nil); err != nil {
			t.Fatal(err)
		}
		if _, err := s.FromURL(ctx, tenant, key); !errors.Is(err, linkstore.ErrNotFound) {
			t.Errorf("FromURL after Delete: %v, want ErrNotFound", err)
		}
		insert(t, linkstore.Link{Code: run + "h6", Tenant: tenant, LongURL: "https://example.com/u", URLKey: key})
	})

	t.Run("OneLiveLinkPerTenantAndRequestKey", func(t *testing.T) {
		key, hash := []byte(run+"-request-key-0123456789ab"), []byte("hash-of-the-first-request-0123456")
		a := insert(t, linkstore.Link{Code: run + "ik1", Tenant: tenant, LongURL: "https://example.com/q", RequestKey: key, RequestHash: hash})
		if a.RequestKey != nil || a.RequestHash != nil {
			t.Errorf("Insert returned RequestKey %q, RequestHash %q; want them read by ByRequest only", a.RequestKey, a.RequestHash)
		}
		got, err := s.ByRequest(ctx, tenant, key)
		if err != nil || got.Code != a.Code || string(got.RequestKey) != string(key) || string(got.RequestHash) != string(hash) || got.LongURL != a.LongURL {
			t.Fatalf("ByRequest = %+v, %v; want %s with its key and hash", got, err, a.Code)
		}
		if g, err := s.Get(ctx, tenant, a.Code); err != nil || g.RequestKey != nil || g.RequestHash != nil {
			t.Errorf("Get = RequestKey %q, RequestHash %q, %v; want neither", g.RequestKey, g.RequestHash, err)
		}
		if _, err := s.Insert(ctx, linkstore.Link{Code: run + "ik2", Tenant: tenant, LongURL: "https://example.com/q2", RequestKey: key, RequestHash: []byte("h2")}); !errors.Is(err, linkstore.ErrRequestTaken) {
			t.Errorf("a second live link of the tenant with the key: %v, want ErrRequestTaken", err)
		}
		if _, err := s.Insert(ctx, linkstore.Link{Code: run + "ik1", Tenant: tenant, LongURL: "https://example.com/q", RequestKey: key, RequestHash: hash}); !errors.Is(err, linkstore.ErrCodeTaken) {
			t.Errorf("a taken code with a taken key: %v, want ErrCodeTaken", err)
		}
		if _, err := s.ByRequest(ctx, other, key); !errors.Is(err, linkstore.ErrNotFound) {
			t.Errorf("another tenant's ByRequest: %v, want ErrNotFound", err)
		}
		insert(t, linkstore.Link{Code: run + "ik3", Tenant: run + "-d", LongURL: "https://example.com/q", RequestKey: key, RequestHash: hash})
		if _, err := s.InsertMany(ctx, []linkstore.Link{{Code: run + "ik4", Tenant: tenant, LongURL: "https://example.com/v", RequestKey: []byte("k")}}); err == nil {
			t.Error("InsertMany stored a link with a RequestKey")
		}
		// A deleted link leaves the key free.
		if _, err := s.Delete(ctx, tenant, a.Code, nil); err != nil {
			t.Fatal(err)
		}
		if _, err := s.ByRequest(ctx, tenant, key); !errors.Is(err, linkstore.ErrNotFound) {
			t.Errorf("ByRequest after Delete: %v, want ErrNotFound", err)
		}
		insert(t, linkstore.Link{Code: run + "ik5", Tenant: tenant, LongURL: "https://example.com/q", RequestKey: key, RequestHash: hash})
	})

	t.Run("DisabledOrExpiredLinkGivesUpItsURLKey", func(t *testing.T) {
		disabled := true
		past := time.Now().Add(-time.Minute)
		expiry := &past
		for name, kill := range map[string]linkstore.Changes{"disabled": {Disabled: &disabled}, "expired": {Expires: &expiry}} {
			key := []byte(run + "-dead-" + name)
			prefix := run + "d" + name[:1]
			old := insert(t, linkstore.Link{Code: prefix + "1", Tenant: tenant, LongURL: "https://example.com/d", URLKey: key})
			if _, err := s.Update(ctx, tenant, old.Code, kill); err != nil {
				t.Fatal(err)
			}
			if got, err := s.FromURL(ctx, tenant, key); !errors.Is(err, linkstore.ErrNotFound) {
				t.Errorf("%s: FromURL = %s, %v; want ErrNotFound", name, got.Code, err)
			}
			// An insert that fails on its code changes nothing: the old
			// link keeps the key.
			if _, err := s.Insert(ctx, linkstore.Link{Code: old.Code, Tenant: tenant, LongURL: "https://example.com/d", URLKey: key}); !errors.Is(err, linkstore.ErrCodeTaken) {
				t.Errorf("%s: insert under the old link's code: %v, want ErrCodeTaken", name, err)
			}
			if l, err := s.Get(ctx, tenant, old.Code); err != nil || string(l.URLKey) != string(key) {
				t.Errorf("%s: after the failed insert the old link has URLKey %q, %v; want it kept", name, l.URLKey, err)
			}
			fresh, err := s.Insert(ctx, linkstore.Link{Code: prefix + "2", Tenant: tenant, LongURL: "https://example.com/d", URLKey: key})
			if err != nil {
				t.Fatalf("%s: a new link of the URL: %v, want it stored", name, err)
			}
			if got, err := s.FromURL(ctx, tenant, key); err != nil || got.Code != fresh.Code {
				t.Errorf("%s: FromURL = %s, %v; want the new link %s", name, got.Code, err, fresh.Code)
			}
			if l, err := s.Get(ctx, tenant, old.Code); err != nil || l.URLKey != nil {
				t.Errorf("%s: the old link: URLKey %q, %v; want it kept without a key", name, l.URLKey, err)
			}
			// The new link works: it keeps the key against the next one.
			if _, err := s.Insert(ctx, linkstore.Link{Code: prefix + "3", Tenant: tenant, LongURL: "https://example.com/d", URLKey: key}); !errors.Is(err, linkstore.ErrURLTaken) {
				t.Errorf("%s: a third link of the URL: %v, want ErrURLTaken", name, err)
			}
		}
	})

	t.Run("ReleaseURLKeyFreesTheURLForTheNextLink", func(t *testing.T) {
		key := []byte(run + "-release")
		old := insert(t, linkstore.Link{Code: run + "rk1", Tenant: tenant, LongURL: "https://example.com/r", URLKey: key, MaxVisits: 1})
		// Another tenant's call and another code change nothing.
		for _, who := range [][2]string{{"someone-else", old.Code}, {tenant, run + "rk9"}} {
			if err := s.ReleaseURLKey(ctx, who[0], who[1], key); err != nil {
				t.Fatal(err)
			}
		}
		if got, err := s.FromURL(ctx, tenant, key); err != nil || got.Code != old.Code {
			t.Fatalf("after releases by another tenant or code: FromURL = %s, %v; want %s still", got.Code, err, old.Code)
		}
		for range 2 { // idempotent
			if err := s.ReleaseURLKey(ctx, tenant, old.Code, key); err != nil {
				t.Fatalf("ReleaseURLKey: %v", err)
			}
		}
		if got, err := s.FromURL(ctx, tenant, key); !errors.Is(err, linkstore.ErrNotFound) {
			t.Errorf("after the release: FromURL = %s, %v; want ErrNotFound", got.Code, err)
		}
		if l, err := s.Get(ctx, tenant, old.Code); err != nil || l.URLKey != nil || l.Disabled {
			t.Errorf("the released link: %+v, %v; want it kept as it was, without a key", l, err)
		}
		fresh, err := s.Insert(ctx, linkstore.Link{Code: run + "rk2", Tenant: tenant, LongURL: "https://example.com/r", URLKey: key})
		if err != nil {
			t.Fatalf("a new link of the URL: %v", err)
		}
		if err := s.ReleaseURLKey(ctx, tenant, old.Code, key); err != nil {
			t.Fatal(err)
		}
		if got, err := s.FromURL(ctx, tenant, key); err != nil || got.Code != fresh.Code {
			t.Errorf("a late release by the old link: FromURL = %s, %v; want the new link %s kept", got.Code, err, fresh.Code)
		}
	})

	t.Run("FromURLsFindsOnlyTheTenantsWorkingLinks", func(t *testing.T) {
		// Not other: AnotherTenantsLinkIsNotFound expects it to hold no links.
		neighbour := run + "-urls"
		key := func(name string) []byte { return []byte(run + "-urls-" + name) }
		mine := insert(t, linkstore.Link{Code: run + "us1", Tenant: tenant, LongURL: "https://example.com/shared", URLKey: key("shared")})
		theirs := insert(t, linkstore.Link{Code: run + "us2", Tenant: neighbour, LongURL: "https://example.com/shared", URLKey: key("shared")})
		only := insert(t, linkstore.Link{Code: run + "us3", Tenant: neighbour, LongURL: "https://example.com/theirs", URLKey: key("theirs")})
		disabled, past := true, time.Now().Add(-time.Minute)
		expired := &past
		for name, kill := range map[string]func(code string) error{
			"disabled": func(code string) error {
				_, err := s.Update(ctx, tenant, code, linkstore.Changes{Disabled: &disabled})
				return err
			},
			"expired": func(code string) error {
				_, err := s.Update(ctx, tenant, code, linkstore.Changes{Expires: &expired})
				return err
			},
			"deleted": func(code string) error {
				_, err := s.Delete(ctx, tenant, code, nil)
				return err
			},
		} {
			l := insert(t, linkstore.Link{Code: run + "us" + name, Tenant: tenant, LongURL: "https://example.com/" + name, URLKey: key(name)})
			if err := kill(l.Code); err != nil {
				t.Fatal(err)
			}
		}
		keys := [][]byte{key("shared"), key("theirs"), key("disabled"), key("expired"), key("deleted"), key("none")}
		for _, c := range []struct {
			tenant string
			want   map[string]string // URL key: code
		}{
			{tenant, map[string]string{string(key("shared")): mine.Code}},
			{neighbour, map[string]string{string(key("shared")): theirs.Code, string(key("theirs")): only.Code}},
			{run + "-nobody", map[string]string{}},
		} {
			got, err := s.FromURLs(ctx, c.tenant, keys)
			if err != nil {
				t.Fatal(err)
			}
			codes := make(map[string]string, len(got))
			for k, l := range got {
				if l.Tenant != c.tenant || string(l.URLKey) != k {
					t.Errorf("FromURLs as %s: %q holds %+v, another tenant's link or another URL's", c.tenant, k, l)
				}
				codes[k] = l.Code
			}
			if !maps.Equal(codes, c.want) {
				t.Errorf("FromURLs as %s = %v, want %v (working links of the tenant only)", c.tenant, codes, c.want)
			}
		}
		if got, err := s.FromURLs(ctx, tenant, nil); err != nil || len(got) != 0 {
			t.Errorf("FromURLs of no keys = %v, %v; want none", got, err)
		}
	})

	t.Run("GetManyFindsOnlyTheTenantsLiveLinks", func(t *testing.T) {
		neighbour := run + "-many"
		mine := insert(t, linkstore.Link{Code: run + "gm1", Tenant: tenant, LongURL: "https://example.com/gm1", Tags: []string{"x"}})
		theirs := insert(t, linkstore.Link{Code: run + "gm2", Tenant: neighbour, LongURL: "https://example.com/gm2"})
		revoked := insert(t, linkstore.Link{Code: run + "gm3", Tenant: tenant, LongURL: "https://example.com/gm3"})
		if _, err := s.Delete(ctx, tenant, revoked.Code, nil); err != nil {
			t.Fatal(err)
		}
		disabled := true
		off, err := s.Update(ctx, tenant, insert(t, linkstore.Link{Code: run + "gm4", Tenant: tenant, LongURL: "https://example.com/gm4"}).Code,
			linkstore.Changes{Disabled: &disabled})
		if err != nil {
			t.Fatal(err)
		}
		codes := []string{mine.Code, theirs.Code, revoked.Code, off.Code, run + "gm5"}
		for _, c := range []struct {
			tenant string
			want   []linkstore.Link
		}{
			{tenant, []linkstore.Link{mine, off}},
			{neighbour, []linkstore.Link{theirs}},
			{run + "-nobody", nil},
		} {
			got, err := s.GetMany(ctx, c.tenant, codes)
			if err != nil {
				t.Fatal(err)
			}
			if len(got) != len(c.want) {
				t.Errorf("GetMany as %s returned %d links %v, want %d", c.tenant, len(got), slices.Collect(maps.Keys(got)), len(c.want))
			}
			for _, w := range c.want {
				one, err := s.Get(ctx, c.tenant, w.Code)
				if err != nil {
					t.Fatal(err)
				}
				if l, ok := got[w.Code]; !ok || l.Tenant != c.tenant || l.LongURL != w.LongURL || !slices.Equal(l.Tags, one.Tags) ||
					l.Disabled != one.Disabled || l.Version != one.Version {
					t.Errorf("GetMany as %s: %s = %+v, %v; want it as Get returns it, %+v", c.tenant, w.Code, l, ok, one)
				}
			}
		}
		if got, err := s.GetMany(ctx, tenant, nil); err != nil || len(got) != 0 {
			t.Errorf("GetMany of no codes = %v, %v; want none", got, err)
		}
	})

	t.Run("CodesStayTakenAcrossTenantsAndRevocation", func(t *testing.T) {
		l := insert(t, linkstore.Link{Code: run + "t1", Tenant: tenant, LongURL: "https://example.com/t"})
		if _, err := s.Insert(ctx, linkstore.Link{Code: l.Code, Tenant: other, LongURL: "https://example.com/o"}); !errors.Is(err, linkstore.ErrCodeTaken) {
			t.Errorf("Insert of a code another tenant holds: %v, want ErrCodeTaken", err)
		}
		if _, err := s.Delete(ctx, tenant, l.Code, nil); err != nil {
			t.Fatal(err)
		}
		if _, err := s.Insert(ctx, l); !errors.Is(err, linkstore.ErrCodeTaken) {
			t.Errorf("Insert of a revoked link's code: %v, want ErrCodeTaken", err)
		}
		if _, err := s.Get(ctx, tenant, l.Code); !errors.Is(err, linkstore.ErrNotFound) {
			t.Errorf("Get of a revoked link: %v, want ErrNotFound", err)
		}
		if _, err := s.Delete(ctx, tenant, l.Code, nil); !errors.Is(err, linkstore.ErrNotFound) {
			t.Errorf("Delete of a revoked link: %v, want ErrNotFound", err)
		}
	})

	t.Run("AnotherTenantsLinkIsNotFound", func(t *testing.T) {
		l := insert(t, linkstore.Link{Code: run + "i1", Tenant: tenant, LongURL: "https://example.com/i"})
		disabled := true
		if _, err := s.Get(ctx, other, l.Code); !errors.Is(err, linkstore.ErrNotFound) {
			t.Errorf("Get as another tenant: %v, want ErrNotFound", err)
		}
		if _, err := s.Update(ctx, other, l.Code, linkstore.Changes{Disabled: &disabled}); !errors.Is(err, linkstore.ErrNotFound) {
			t.Errorf("Update as another tenant: %v, want ErrNotFound", err)
		}
		if _, err := s.Delete(ctx, other, l.Code, nil); !errors.Is(err, linkstore.ErrNotFound) {
			t.Errorf("Delete as another tenant: %v, want ErrNotFound", err)
		}
		page, err := s.List(ctx, other, 100, "", "")
		if err != nil {
			t.Fatal(err)
		}
		if len(page.Links) != 0 {
			t.Errorf("another tenant lists %d links, want none", len(page.Links))
		}
		if got, err := s.Get(ctx, tenant, l.Code); err != nil || got.Disabled {
			t.Errorf("after the other tenant's calls: %+v, %v; want the link unchanged", got, err)
		}
	})

	t.Run("InsertManyLeavesTakenCodesOut", func(t *testing.T) {
		insert(t, linkstore.Link{Code: run + "m1", Tenant: tenant, LongURL: "https://example.com/m1"})
		got, err := s.InsertMany(ctx, []linkstore.Link{
			{Code: run + "m1", Tenant: other, LongURL: "https://example.com/taken"},
			{Code: run + "m2", Tenant: other, LongURL: "https://example.com/m2", Tags: []string{"x"}, Title: "M2, \"quoted\""},
			{Code: run + "m3", Tenant: other, LongURL: "https://example.com/m3"},
		})
		if err != nil {
			t.Fatal(err)
		}
		if len(got) != 2 || got[run+"m2"].LongURL != "https://example.com/m2" || !slices.Equal(got[run+"m2"].Tags, []string{"x"}) ||
			got[run+"m2"].Title != "M2, \"quoted\"" || got[run+"m3"].Title != "" || got[run+"m3"].Tenant != other || got[run+"m3"].Tags == nil {
			t.Errorf("InsertMany returned %+v; want m2 and m3 stored as given, m1 left out", got)
		}
		if l, err := s.Get(ctx, tenant, run+"m1"); err != nil || l.LongURL != "https://example.com/m1" {
			t.Errorf("the taken code's link: %+v, %v; want the first one kept", l, err)
		}
		if _, err := s.InsertMany(ctx, nil); err == nil {
			t.Error("InsertMany of no links succeeded, want an error")
		}
	})

	t.Run("TakenNamesEveryTenantsCodesRevokedIncluded", func(t *testing.T) {
		mine := insert(t, linkstore.Link{Code: run + "k1", Tenant: tenant, LongURL: "https://example.com/k1"})
		theirs := insert(t, linkstore.Link{Code: run + "k2", Tenant: other, LongURL: "https://example.com/k2"})
		revoked := insert(t, linkstore.Link{Code: run + "k3", Tenant: tenant, LongURL: "https://example.com/k3"})
		if _, err := s.Delete(ctx, tenant, revoked.Code, nil); err != nil {
			t.Fatal(err)
		}
		got, err := s.Taken(ctx, []string{mine.Code, theirs.Code, revoked.Code, run + "k4"})
		if err != nil {
			t.Fatal(err)
		}
		if want := map[string]bool{mine.Code: true, theirs.Code: true, revoked.Code: true}; !maps.Equal(got, want) {
			t.Errorf("Taken = %v, want %v", got, want)
		}
		if got, err := s.Taken(ctx, nil); err != nil || len(got) != 0 {
			t.Errorf("Taken of no codes = %v, %v; want none", got, err)
		}
	})

	t.Run("ListPagesNewestFirstByTag", func(t *testing.T) {
		lt := run + "-list"
		var all []linkstore.Link
		for i, tags := range [][]string{{"red"}, nil, {"red", "big"}, {"red"}, nil} {
			all = append(all, insert(t, linkstore.Link{Code: run + "l" + string(rune('a'+i)), Tenant: lt,
				LongURL: "https://example.com/l", Tags: tags}))
		}
		gone := insert(t, linkstore.Link{Code: run + "lz", Tenant: lt, LongURL: "https://example.com/gone", Tags: []string{"red"}})
		if _, err := s.Delete(ctx, lt, gone.Code, nil); err != nil {
			t.Fatal(err)
		}
		slices.SortFunc(all, func(a, b linkstore.Link) int {
			if c := b.Created.Compare(a.Created); c != 0 {
				return c
			}
			return strings.Compare(b.Code, a.Code)
		})
		codes := func(ls []linkstore.Link) []string {
			var out []string
			for _, l := range ls {
				out = append(out, l.Code)
			}
			return out
		}
		list := func(tag string) []string {
			var got []string
			token := ""
			for range len(all) + 1 {
				page, err := s.List(ctx, lt, 2, token, tag)
				if err != nil {
					t.Fatalf("List tag %q: %v", tag, err)
				}
				if len(page.Links) > 2 {
					t.Fatalf("List of size 2 returned %d links", len(page.Links))
				}
				got = append(got, codes(page.Links)...)
				if token = page.Next; token == "" {
					return got
				}
			}
			t.Fatalf("List tag %q never ended", tag)
			return nil
		}
		if got, want := list(""), codes(all); !slices.Equal(got, want) {
			t.Errorf("pages of 2: %v, want %v (newest first, the revoked link left out)", got, want)
		}
		var red []linkstore.Link
		for _, l := range all {
			if slices.Contains(l.Tags, "red") {
				red = append(red, l)
			}
		}
		if got, want := list("red"), codes(red); !slices.Equal(got, want) {
			t.Errorf("pages of 2 tagged red: %v, want %v", got, want)
		}
		page, err := s.List(ctx, lt, 10, linkstore.TokenAfter(all[1], ""), "")
		if err != nil {
			t.Fatal(err)
		}
		if got, want := codes(page.Links), codes(all[2:]); !slices.Equal(got, want) || page.Next != "" {
			t.Errorf("after TokenAfter(the second link): %v next %q, want %v and no next", got, page.Next, want)
		}
		first, err := s.List(ctx, lt, 1, "", "red")
		if err != nil {
			t.Fatal(err)
		}
		if _, err := s.List(ctx, lt, 1, first.Next, "big"); !errors.Is(err, linkstore.ErrPageTokenTag) {
			t.Errorf("a red listing's token with tag big: %v, want ErrPageTokenTag", err)
		}
		if _, err := s.List(ctx, other, 1, first.Next, "red"); !errors.Is(err, linkstore.ErrPageTokenTenant) {
			t.Errorf("a red listing's token sent by another tenant: %v, want ErrPageTokenTenant", err)
		}
		// A token of the versions before tokens named their tenant: the
		// listing goes on (a rolling upgrade does not break it).
		legacy := base64.RawURLEncoding.EncodeToString(fmt.Appendf(nil, `{"c":%d,"k":%q}`, all[1].Created.UnixMicro(), all[1].Code))
		if page, err := s.List(ctx, lt, 10, legacy, ""); err != nil || !slices.Equal(codes(page.Links), codes(all[2:])) {
			t.Errorf("after a token without a tenant naming the second link: %v, %v; want %v", codes(page.Links), err, codes(all[2:]))
		}
		if _, err := s.List(ctx, lt, 1, "not-a-token", ""); !errors.Is(err, linkstore.ErrBadPageToken) {
			t.Errorf("a made-up token: %v, want ErrBadPageToken", err)
		}
		// Well-formed tokens holding what no listing writes: text
		// PostgreSQL refuses (NUL, bytes that are not UTF-8) is the
		// caller's error, not the store's.
		for name, cursor := range map[string]string{
			"NUL in the code":    `{"c":1,"k":"ab\u0000c"}`,
			"NUL in the tag":     `{"c":1,"k":"abc","g":"r\u0000"}`,
			"code not UTF-8":     "{\"c\":1,\"k\":\"ab\xffc\"}",
			"control characters": `{"c":1,"k":"ab\u0007c"}`,
			"a time before 1970": `{"c":-1000000000000000000,"k":"abc"}`,
			"a time that wraps":  `{"c":-9223372036854775000,"k":"abc"}`,
			"a time after 9999":  `{"c":253402300800000000,"k":"abc"}`,
		} {
			token := base64.RawURLEncoding.EncodeToString([]byte(cursor))
			if _, err := s.List(ctx, lt, 1, token, ""); !errors.Is(err, linkstore.ErrBadPageToken) {
				t.Errorf("a token with %s: %v, want ErrBadPageToken", name, err)
			}
		}
	})

	t.Run("UpdateChangesOnlyTheGivenFields", func(t *testing.T) {
		exp := time.Now().Add(time.Hour)
		l := insert(t, linkstore.Link{Code: run + "u1", Tenant: tenant, LongURL: "https://example.com/u", Status: 301,
			Expires: &exp, Tags: []string{"a"}, MaxVisits: 3, PasswordHash: "h", AndroidURL: "https://example.com/and", Title: "kept"})
		newURL, disabled, noExpiry := "https://example.com/u2", true, (*time.Time)(nil)
		got, err := s.Update(ctx, tenant, l.Code, linkstore.Changes{LongURL: &newURL, Disabled: &disabled,
			Expires: &noExpiry, Targets: &linkstore.DeviceURLs{IOS: "https://example.com/ios"}})
		if err != nil {
			t.Fatal(err)
		}
		if got.LongURL != newURL || !got.Disabled || got.Expires != nil || got.IOSURL != "https://example.com/ios" ||
			got.AndroidURL != "" || got.Status != 301 || !slices.Equal(got.Tags, []string{"a"}) || got.MaxVisits != 3 ||
			got.PasswordHash != "h" || got.Title != "kept" || got.Updated.Before(l.Updated) {
			t.Errorf("after Update: %+v; want long_url, disabled, expiry and targets changed, the rest kept", got)
		}
		if read, err := s.Get(ctx, tenant, l.Code); err != nil || read.LongURL != newURL || !read.Disabled {
			t.Errorf("Get after Update: %+v, %v", read, err)
		}
		title := "new title"
		if got, err = s.Update(ctx, tenant, l.Code, linkstore.Changes{Title: &title}); err != nil || got.Title != title || got.LongURL != newURL {
			t.Errorf("changing the title: %+v, %v", got, err)
		}
		empty, none := []string{}, ""
		got, err = s.Update(ctx, tenant, l.Code, linkstore.Changes{Tags: &empty, PasswordHash: &none, Title: &none})
		if err != nil || got.Tags == nil || len(got.Tags) != 0 || got.PasswordHash != "" || got.Title != "" || got.LongURL != newURL {
			t.Errorf("clearing tags, password and title: %+v, %v", got, err)
		}
	})

	t.Run("ChangesInAVersionApplyOnlyToIt", func(t *testing.T) {
		l := insert(t, linkstore.Link{Code: run + "v1", Tenant: tenant, LongURL: "https://example.com/v"})
		if read, err := s.Get(ctx, tenant, l.Code); err != nil || read.Version != l.Version {
			t.Fatalf("Get after Insert: version %d, %v; Insert returned %d", read.Version, err, l.Version)
		}
		first := l.Version
		d := true
		got, err := s.Update(ctx, tenant, l.Code, linkstore.Changes{Disabled: &d, IfVersion: &first})
		if err != nil || !got.Disabled {
			t.Fatalf("Update in the current version: %+v, %v", got, err)
		}
		if got.Version == first {
			t.Fatalf("Update left the version at %d", first)
		}
		// The same write again, as its first version: the link is in another.
		d = false
		if _, err := s.Update(ctx, tenant, l.Code, linkstore.Changes{Disabled: &d, IfVersion: &first}); !errors.Is(err, linkstore.ErrChanged) {
			t.Errorf("Update in a past version: %v, want ErrChanged", err)
		}
		if _, err := s.Delete(ctx, tenant, l.Code, &first); !errors.Is(err, linkstore.ErrChanged) {
			t.Errorf("Delete in a past version: %v, want ErrChanged", err)
		}
		if read, err := s.Get(ctx, tenant, l.Code); err != nil || !read.Disabled || read.Version != got.Version {
			t.Errorf("after the refused changes: %+v, %v; want the link as the first Update left it", read, err)
		}
		if _, err := s.Delete(ctx, other, l.Code, &got.Version); !errors.Is(err, linkstore.ErrNotFound) {
			t.Errorf("Delete of another tenant's link in its version: %v, want ErrNotFound", err)
		}
		if _, err := s.Delete(ctx, tenant, l.Code, &got.Version); err != nil {
			t.Fatalf("Delete in the current version: %v", err)
		}
		if _, err := s.Update(ctx, tenant, l.Code, linkstore.Changes{Disabled: &d, IfVersion: &got.Version}); !errors.Is(err, linkstore.ErrNotFound) {
			t.Errorf("Update of a deleted link: %v, want ErrNotFound", err)
		}
	})

	t.Run("RulesAndVariantsAreStoredAndReplacedApart", func(t *testing.T) {
		rules := func(names ...string) []linkrules.Rule {
			var out []linkrules.Rule
			for _, n := range names {
				out = append(out, linkrules.Rule{Name: n, If: []linkrules.Condition{{Languages: []string{"de"}}}, URL: "https://example.com/" + n})
			}
			return out
		}
		names := func(l linkstore.Link) (r, v []string) {
			if l.Rules == nil {
				return nil, nil
			}
			for _, x := range l.Rules.Rules {
				r = append(r, x.Name)
			}
			for _, x := range l.Rules.Variants {
				v = append(v, x.Name)
			}
			return r, v
		}
		set := &linkrules.Set{Rules: rules("de"), Variants: []linkrules.Variant{{Name: "a", URL: "https://example.com/a", Weight: 2}}}
		if err := set.Compile(); err != nil {
			t.Fatal(err)
		}
		l := insert(t, linkstore.Link{Code: run + "r1", Tenant: tenant, LongURL: "https://example.com/r", Rules: set})
		if r, v := names(l); !slices.Equal(r, []string{"de"}) || !slices.Equal(v, []string{"a"}) {
			t.Fatalf("inserted: rules %v variants %v", r, v)
		}
		req := linkrules.Request{AcceptLanguage: "de"}
		if u, _, ok := l.Rules.Match(&req); !ok || u != "https://example.com/de" {
			t.Fatalf("stored rules are not compiled: %q %v", u, ok)
		}
		newRules := rules("x", "y")
		got, err := s.Update(ctx, tenant, l.Code, linkstore.Changes{Rules: &newRules})
		if r, v := names(got); err != nil || !slices.Equal(r, []string{"x", "y"}) || !slices.Equal(v, []string{"a"}) {
			t.Fatalf("replacing the rules: rules %v variants %v, %v; want x, y and a kept", r, v, err)
		}
		none := []linkrules.Variant{}
		got, err = s.Update(ctx, tenant, l.Code, linkstore.Changes{Variants: &none})
		if r, v := names(got); err != nil || !slices.Equal(r, []string{"x", "y"}) || v != nil {
			t.Fatalf("clearing the variants: rules %v variants %v, %v", r, v, err)
		}
		noRules := []linkrules.Rule{}
		got, err = s.Update(ctx, tenant, l.Code, linkstore.Changes{Rules: &noRules})
		if err != nil || got.Rules != nil {
			t.Fatalf("clearing both: %+v, %v; want no rules at all", got.Rules, err)
		}
	})

	t.Run("LiveWalksEnabledLinksInCodeOrder", func(t *testing.T) {
		lr := run + "v"
		disabled := true
		for _, c := range []string{"c", "a", "d", "b"} {
			insert(t, linkstore.Link{Code: lr + c, Tenant: other, LongURL: "https://example.com/v"})
		}
		if _, err := s.Update(ctx, other, lr+"b", linkstore.Changes{Disabled: &disabled}); err != nil {
			t.Fatal(err)
		}
		if _, err := s.Delete(ctx, other, lr+"d", nil); err != nil {
			t.Fatal(err)
		}
		// The run's codes come first after lr: every code between lr and
		// the next prefix starts with lr.
		links, err := s.Live(ctx, lr, 3)
		if err != nil {
			t.Fatal(err)
		}
		var got []string
		for _, l := range links {
			if strings.HasPrefix(l.Code, lr) {
				got = append(got, strings.TrimPrefix(l.Code, lr))
			}
		}
		if want := []string{"a", "c"}; !slices.Equal(got, want) {
			t.Errorf("Live after %s: %v, want %v (disabled and revoked left out)", lr, got, want)
		}
		if links, err := s.Live(ctx, lr+"a", 1); err != nil || len(links) != 1 || links[0].Code != lr+"c" {
			t.Errorf("Live after %sa, 1: %+v, %v; want %sc", lr, links, err, lr)
		}
	})

	t.Run("ChangesQueueAnInvalidationUntilRefreshed", func(t *testing.T) {
		l := insert(t, linkstore.Link{Code: run + "q1", Tenant: tenant, LongURL: "https://example.com/q"})
		if pending(t, l.Code) {
			t.Fatal("a new link has an invalidation queued; want none")
		}
		v2 := "https://example.com/q2"
		if _, err := s.Update(ctx, tenant, l.Code, linkstore.Changes{LongURL: &v2}); err != nil {
			t.Fatal(err)
		}
		if !pending(t, l.Code) {
			t.Fatal("no invalidation queued after Update")
		}
		if n, oldest, err := s.PendingInvalidations(ctx); err != nil || n < 1 || oldest < 0 {
			t.Errorf("PendingInvalidations: %d, %v, %v; want at least this one", n, oldest, err)
		}
		failed := errors.New("redis down")
		if err := s.Refresh(ctx, l.Code, func(context.Context, linkstore.Link) error { return failed }); !errors.Is(err, failed) {
			t.Errorf("Refresh whose write failed: %v, want the write's error", err)
		}
		if !pending(t, l.Code) {
			t.Error("a failed Refresh dropped the invalidation")
		}
		if err := s.Postpone(ctx, l.Code, time.Hour, time.Hour); err != nil {
			t.Fatal(err)
		}
		if pending(t, l.Code) {
			t.Error("a postponed invalidation is due at once")
		}
		var written []linkstore.Link
		write := func(_ context.Context, l linkstore.Link) error { written = append(written, l); return nil }
		if err := s.Refresh(ctx, l.Code, write); err != nil {
			t.Fatal(err)
		}
		if len(written) != 1 || written[0].LongURL != v2 {
			t.Errorf("Refresh wrote %+v, want the link's current state once", written)
		}
		if _, err := s.Delete(ctx, tenant, l.Code, nil); err != nil {
			t.Fatal(err)
		}
		if !pending(t, l.Code) {
			t.Error("no invalidation queued after Delete")
		}
		written = nil
		if err := s.Refresh(ctx, l.Code, write); err != nil {
			t.Fatal(err)
		}
		if len(written) != 1 || written[0].Deleted == nil {
			t.Errorf("Refresh of a revoked link wrote %+v, want it with its revocation", written)
		}
		if pending(t, l.Code) {
			t.Error("the invalidation is still due after a successful Refresh")
		}
		written = nil
		if err := s.Refresh(ctx, run+"nosuch", write); err != nil || len(written) != 0 {
			t.Errorf("Refresh of a code without a link: %v, wrote %+v; want nil and nothing written", err, written)
		}
	})

	t.Run("RefreshWritesTheCurrentState", func(t *testing.T) {
		l := insert(t, linkstore.Link{Code: run + "wc1", Tenant: tenant, LongURL: "https://example.com/wc1"})
		if _, err := s.Delete(ctx, tenant, l.Code, nil); err != nil {
			t.Fatal(err)
		}
		var got []linkstore.Link
		if err := s.Refresh(ctx, l.Code, func(_ context.Context, l linkstore.Link) error {
			got = append(got, l)
			return nil
		}); err != nil {
			t.Fatal(err)
		}
		if len(got) != 1 || got[0].Deleted == nil {
			t.Errorf("Refresh of a deleted link wrote %+v; want it once, deleted", got)
		}
		failed := errors.New("redis down")
		if err := s.Refresh(ctx, l.Code, func(context.Context, linkstore.Link) error { return failed }); !errors.Is(err, failed) {
			t.Errorf("Refresh whose write failed: %v, want the write's error", err)
		}
	})

	t.Run("NextBlocksNeverRepeat", func(t *testing.T) {
		a, err := s.NextBlocks(ctx, 3)
		if err != nil {
			t.Fatal(err)
		}
		b, err := s.NextBlocks(ctx, 2)
		if err != nil {
			t.Fatal(err)
		}
		all := append(a, b...)
		if len(a) != 3 || len(b) != 2 || !slices.IsSorted(all) || len(slices.Compact(slices.Clone(all))) != len(all) {
			t.Errorf("NextBlocks(3), NextBlocks(2): %v, %v; want 5 increasing values", a, b)
		}
	})
}
