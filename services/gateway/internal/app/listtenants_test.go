//go:build integration

package app

import (
	"context"
	"fmt"
	"maps"
	"net/http"
	"net/url"
	"reflect"
	"slices"
	"strings"
	"testing"
)

// listAllTenants pages through GET /v1/admin/tenants with query (plus
// page_size), failing the test on any answer but 200, on a page out of
// order (against the page before it too) or past maxPages: every tenant of
// the database, other tests' included, in the order the pages gave.
func listAllTenants(t *testing.T, admin *client, query url.Values, size int) []map[string]any {
	t.Helper()
	const maxPages = 1000
	q := maps.Clone(query)
	if q == nil {
		q = url.Values{}
	}
	q.Set("page_size", fmt.Sprint(size))
	var all []map[string]any
	for range maxPages {
		r := admin.do("GET", "/v1/admin/tenants?"+q.Encode(), "")
		if r.code != http.StatusOK {
			t.Fatalf("list tenants ?%s: %s", q.Encode(), r)
		}
		page := r.json(t)
		items, _ := page["tenants"].([]any)
		if len(items) > size {
			t.Fatalf("page of %d tenants for page_size %d", len(items), size)
		}
		for _, it := range items {
			tn := it.(map[string]any)
			if n := len(all); n > 0 && all[n-1]["id"].(string) >= tn["id"].(string) {
				t.Fatalf("tenant %v listed after %v: want strictly increasing ids", tn["id"], all[n-1]["id"])
			}
			all = append(all, tn)
		}
		next, _ := page["nextPageToken"].(string)
		if next == "" {
			return all
		}
		q.Set("page_token", next)
	}
	t.Fatalf("more than %d pages of tenants", maxPages)
	return nil
}

// mine keeps the tenants whose id starts with prefix, failing the test if
// one is listed twice.
func mine(t *testing.T, all []map[string]any, prefix string) map[string]map[string]any {
	t.Helper()
	out := map[string]map[string]any{}
	for _, tn := range all {
		id := tn["id"].(string)
		if !strings.HasPrefix(id, prefix) {
			continue
		}
		if _, dup := out[id]; dup {
			t.Errorf("tenant %s listed twice", id)
		}
		out[id] = tn
	}
	return out
}

// The admin's tenant list pages through every tenant in id order, each
// once and as GET /v1/admin/tenants/{tenant} shows it, and filters by
// state and plan. Other tests create tenants meanwhile in the same
// database, so only this test's own tenants (a prefix of their own) are
// counted.
func TestListTenantsPagesAndFilters(t *testing.T) {
	gw := startGateway(t, nil)
	admin := newClient(t, gw, adminToken)
	prefix := strings.Replace(newTenantID(t), "gwt-", "gwl-", 1) + "-"
	plans := []string{"free", "pro", "free", "pro", "free"}
	suspended := map[string]bool{prefix + "1": true, prefix + "2": true}
	for i, plan := range plans {
		id := fmt.Sprintf("%s%d", prefix, i)
		cleanupTenants(t, id)
		if r := admin.do("POST", "/v1/admin/tenants", fmt.Sprintf(`{"id":%q,"name":"List %d","plan":%q}`, id, i, plan)); r.code != http.StatusCreated {
			t.Fatalf("create tenant: %s", r)
		}
		if suspended[id] {
			if r := admin.do("POST", "/v1/admin/tenants/"+id+"/suspend", `{"reason":"listing test"}`); r.code != http.StatusOK {
				t.Fatalf("suspend: %s", r)
			}
		}
	}

	// Pages of two: five tenants of ours span at least three pages.
	got := mine(t, listAllTenants(t, admin, nil, 2), prefix)
	if len(got) != len(plans) {
		t.Fatalf("listed %d of the %d tenants created: %v", len(got), len(plans), slices.Sorted(maps.Keys(got)))
	}
	for id, tn := range got {
		if r := admin.do("GET", "/v1/admin/tenants/"+id, ""); !reflect.DeepEqual(r.json(t), tn) {
			t.Errorf("listed %v; GET of the tenant shows %s", tn, r)
		}
	}

	for _, tc := range []struct {
		query url.Values
		want  func(i int, id string) bool
	}{
		{url.Values{"state": {"suspended"}}, func(_ int, id string) bool { return suspended[id] }},
		{url.Values{"state": {"active"}}, func(_ int, id string) bool { return !suspended[id] }},
		{url.Values{"plan": {"pro"}}, func(i int, _ string) bool { return plans[i] == "pro" }},
		{url.Values{"plan": {"free"}, "state": {"suspended"}}, func(i int, id string) bool { return plans[i] == "free" && suspended[id] }},
	} {
		all := listAllTenants(t, admin, tc.query, 1)
		for _, tn := range all {
			if s := tc.query.Get("state"); s != "" && tn["state"] != s {
				t.Errorf("?%s listed %v", tc.query.Encode(), tn)
			}
			if p := tc.query.Get("plan"); p != "" && tn["plan"] != p {
				t.Errorf("?%s listed %v", tc.query.Encode(), tn)
			}
		}
		got := mine(t, all, prefix)
		for i := range plans {
			id := fmt.Sprintf("%s%d", prefix, i)
			if _, listed := got[id]; listed != tc.want(i, id) {
				t.Errorf("?%s: %s listed %v, want %v", tc.query.Encode(), id, listed, tc.want(i, id))
			}
		}
	}
}

// The tenant list refuses what it cannot honour with 400 naming the
// parameter, and anyone but the administrator with 401.
func TestListTenantsRefusals(t *testing.T) {
	gw := startGateway(t, nil)
	admin := newClient(t, gw, adminToken)
	a := newTenant(t, gw, "free")
	newTenant(t, gw, "free") // at least two tenants: the first page of one has a next page

	r := admin.do("GET", "/v1/admin/tenants?page_size=1&state=active", "")
	next, _ := r.json(t)["nextPageToken"].(string)
	if r.code != http.StatusOK || next == "" {
		t.Fatalf("first page of one: %s; want 200 with a next page token", r)
	}
	if r := admin.do("GET", "/v1/admin/tenants?page_size=1000", ""); r.code != http.StatusOK {
		t.Errorf("page_size=1000: %s; want 200", r)
	}
	for _, tc := range []struct{ query, field string }{
		{"page_size=0", "page_size"},
		{"page_size=1001", "page_size"},
		{"page_size=", "page_size"},
		{"page_size=ten", "page_size"},
		{"page_token=not-a-token", "page_token"},
		{"page_token=eyJhIjoiIn0", "page_token"},          // {"a":""}: no id
		{"page_token=eyJhIjoieFx1MDAwMCJ9", "page_token"}, // {"a":"x\u0000"}: no id PostgreSQL could hold
		{"page_token=" + next, "page_token"},              // issued with state=active
		{"page_token=" + next + "&state=suspended", "page_token"},
		{"state=deleted", "state"},
		{"plan=" + strings.Repeat("p", 201), "plan"},
		{"plan=%00", "plan"},
		{"plan=no-such-plan", "plan"},
		{"plan=no-such-plan&state=suspended", "plan"},
		{"tenant=x", ""},
	} {
		r := admin.do("GET", "/v1/admin/tenants?"+tc.query, "")
		e := r.apiError(t)
		if r.code != http.StatusBadRequest || e["code"] != "INVALID_ARGUMENT" || (tc.field != "" && !strings.Contains(r.String(), `"`+tc.field+`"`)) {
			t.Errorf("?%s: %s; want 400 INVALID_ARGUMENT naming %q", tc.query, r, tc.field)
		}
	}
	if r := admin.do("GET", "/v1/admin/tenants?state=active&page_size=1&page_token="+next, ""); r.code != http.StatusOK {
		t.Errorf("the next page with its own filters: %s; want 200", r)
	}
	if r := admin.do("GET", "/v1/admin/tenants?plan=no-such-plan", ""); !strings.Contains(r.String(), `no-such-plan`) || !strings.Contains(r.String(), "free") {
		t.Errorf("?plan=no-such-plan: %s; want the plan named, and the known ones (free)", r)
	}
	for name, c := range map[string]*client{"a tenant's key": newClient(t, gw, a.key), "no credential": newClient(t, gw, "")} {
		if r := c.do("GET", "/v1/admin/tenants", ""); r.code != http.StatusUnauthorized {
			t.Errorf("%s lists tenants: %s; want 401", name, r)
		}
	}
}

// A plan filter is refused only when nothing has the plan: one the limiter
// defines that no tenant is on lists an empty page, and one a tenant is on
// that rl_plans does not have (written by SQL, or left by an older
// version) lists that tenant.
func TestListTenantsByAPlanTheLimiterOrATenantHas(t *testing.T) {
	gw := startGateway(t, nil)
	admin := newClient(t, gw, adminToken)
	ctx := t.Context()
	suffix := strings.TrimPrefix(newTenantID(t), "gwt-")
	empty, orphan, orphanTenant := "gwl-empty-"+suffix, "gwl-orphan-"+suffix, "gwl-"+suffix
	if _, err := stack.DB.Exec(ctx, `INSERT INTO rl_plans (plan) VALUES ($1)`, empty); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if _, err := stack.DB.Exec(context.Background(), `DELETE FROM rl_plans WHERE plan = $1`, empty); err != nil {
			t.Error(err)
		}
	})
	cleanupTenants(t, orphanTenant)
	if _, err := stack.DB.Exec(ctx, `INSERT INTO gw_tenants (id, plan) VALUES ($1, $2)`, orphanTenant, orphan); err != nil {
		t.Fatal(err)
	}

	r := admin.do("GET", "/v1/admin/tenants?plan="+empty, "")
	if items, _ := r.json(t)["tenants"].([]any); r.code != http.StatusOK || len(items) != 0 {
		t.Errorf("?plan= a plan of rl_plans no tenant is on: %s; want 200 and no tenant", r)
	}
	all := listAllTenants(t, admin, url.Values{"plan": {orphan}}, 10)
	if len(all) != 1 || all[0]["id"] != orphanTenant {
		t.Errorf("?plan= a plan only a tenant has: %v; want %s", all, orphanTenant)
	}
}

// gw_tenants has no check on ids: a tenant written by SQL or an older
// version may have one the create route refuses (upper case, '_', a
// leading '-'). Such a tenant is listed, and a page that ends on it gives
// a token that continues the walk past it.
func TestListTenantsWalksPastIDsTheCreateRouteRefuses(t *testing.T) {
	gw := startGateway(t, nil)
	admin := newClient(t, gw, adminToken)
	suffix := strings.TrimPrefix(newTenantID(t), "gwt-")
	plan := "gwl-legacy-" + suffix // only these tenants are on it: a short walk
	ids := []string{"Legacy_" + suffix, "-legacy-" + suffix, "legacy_" + suffix, "legacy-" + suffix}
	slices.Sort(ids) // byte order, as the list's COLLATE "C"
	cleanupTenants(t, ids...)
	for _, id := range ids {
		if _, err := stack.DB.Exec(t.Context(), `INSERT INTO gw_tenants (id, plan) VALUES ($1, $2)`, id, plan); err != nil {
			t.Fatal(err)
		}
	}
	var got []string
	for _, tn := range listAllTenants(t, admin, url.Values{"plan": {plan}}, 1) {
		got = append(got, tn["id"].(string))
	}
	if !slices.Equal(got, ids) {
		t.Errorf("pages of one on plan %s listed %v, want %v", plan, got, ids)
	}
}
