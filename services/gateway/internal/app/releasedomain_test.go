//go:build integration

package app

import (
	"context"
	"crypto/rand"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"kurz.dev/pkg/config"
	"kurz.dev/pkg/linkdomain"
	"kurz.dev/pkg/redisconn"
)

// domainChanges subscribes to the shortener's message to the redirect
// pods (linkdomain.ChangedChannel), subscribed when it returns.
func domainChanges(t *testing.T) <-chan *redis.Message {
	t.Helper()
	var cfg redisconn.Config
	if err := config.Load(&cfg); err != nil {
		t.Fatal(err)
	}
	rdb := redis.NewClusterClient(&redis.ClusterOptions{Addrs: cfg.Addrs, Password: cfg.Password, DialTimeout: time.Second})
	t.Cleanup(func() { _ = rdb.Close() })
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	sub := rdb.Subscribe(ctx, linkdomain.ChangedChannel)
	t.Cleanup(func() { _ = sub.Close() })
	if _, err := sub.Receive(ctx); err != nil { // the subscription's confirmation
		t.Fatalf("subscribe to %s: %v", linkdomain.ChangedChannel, err)
	}
	return sub.Channel()
}

// awaitDomainChange waits (at most 10 s) for the message naming domain.
func awaitDomainChange(t *testing.T, ch <-chan *redis.Message, domain string) {
	t.Helper()
	deadline := time.After(10 * time.Second)
	for {
		select {
		case m := <-ch:
			if m.Payload == domain {
				return
			}
		case <-deadline:
			t.Fatalf("no message on %s naming %s: the redirect would serve the released domain until its refresh", linkdomain.ChangedChannel, domain)
		}
	}
}

// The administrator releases a tenant's verified domain: refused while a
// live link of the tenant is on it, like the tenant's own delete; then the
// domain is gone for the tenant, the redirect pods are told, and another
// tenant can register and verify the name. The release is in the log, an
// audit line naming tenant, domain and request.
func TestAdminReleasesTenantDomain(t *testing.T) {
	log, logs := captureLogs(t)
	gw := startGatewayLogging(t, log, nil)
	a, b := newTenant(t, gw, "free"), newTenant(t, gw, "free")
	ca, cb, admin := newClient(t, gw, a.key), newClient(t, gw, b.key), newClient(t, gw, adminToken)
	domain := "rel-" + strings.ToLower(rand.Text()[:10]) + ".acme.test"
	if r := ca.do("POST", "/v1/domains", `{"name":"`+domain+`"}`); r.code != http.StatusCreated {
		t.Fatalf("register: %s", r)
	}
	if r := admin.do("POST", "/v1/admin/tenants/"+a.id+"/domains/"+domain+"/verify", ""); r.code != http.StatusOK {
		t.Fatalf("approve: %s", r)
	}
	r := ca.do("POST", "/v1/links", `{"longUrl":"https://example.com/on-domain","domain":"`+domain+`"}`)
	if r.code != http.StatusCreated {
		t.Fatalf("link on the domain: %s", r)
	}
	code := r.json(t)["code"].(string)

	release := "/v1/admin/tenants/" + a.id + "/domains/" + domain
	if r := admin.do("DELETE", release, ""); r.code != http.StatusBadRequest || r.apiError(t)["reason"] != "DOMAIN_IN_USE" {
		t.Errorf("release while a live link is on it: %s; want 400 DOMAIN_IN_USE, as the tenant's own delete", r)
	}
	if r := ca.do("DELETE", "/v1/links/"+code+"?domain="+domain, ""); r.code != http.StatusNoContent {
		t.Fatalf("delete the link: %s", r)
	}

	changes := domainChanges(t)
	r = admin.do("DELETE", release, "")
	if r.code != http.StatusNoContent || len(r.body) != 0 {
		t.Fatalf("release: %s; want 204", r)
	}
	audit := `"msg":"domain released","tenant":"` + a.id + `","domain":"` + domain + `","request_id":"` + r.header.Get("X-Request-ID") + `"`
	if !strings.Contains(logs.String(), audit) {
		t.Errorf("the gateway's log lacks the release's audit line %s", audit)
	}
	awaitDomainChange(t, changes, domain)
	if r := ca.do("GET", "/v1/domains/"+domain, ""); r.code != http.StatusNotFound {
		t.Errorf("the tenant's domain after release: %s; want 404", r)
	}
	if r := ca.do("GET", "/v1/domains", ""); r.code != http.StatusOK || len(r.json(t)["domains"].([]any)) != 0 {
		t.Errorf("the tenant's domains after release: %s; want none", r)
	}
	if r := admin.do("DELETE", release, ""); r.code != http.StatusNotFound {
		t.Errorf("release again: %s; want 404", r)
	}

	if r := cb.do("POST", "/v1/domains", `{"name":"`+domain+`"}`); r.code != http.StatusCreated {
		t.Fatalf("another tenant registers the released domain: %s; want 201", r)
	}
	r = admin.do("POST", "/v1/admin/tenants/"+b.id+"/domains/"+domain+"/verify", "")
	if v := r.json(t); r.code != http.StatusOK || v["verified"] != true {
		t.Fatalf("another tenant's verification of the released domain: %s", r)
	}
	if r := cb.do("POST", "/v1/links", `{"longUrl":"https://example.com/new-owner","domain":"`+domain+`"}`); r.code != http.StatusCreated {
		t.Errorf("the new owner's link on the domain: %s", r)
	}
	if r := ca.do("POST", "/v1/domains", `{"name":"`+domain+`"}`); r.code != http.StatusConflict {
		t.Errorf("the first tenant registers it again: %s; want 409 (the new owner verified it)", r)
	}
}

// Releasing what the tenant does not hold is 404 (an unknown tenant, an
// unknown domain, another tenant's domain, which stays), and only the
// administrator may release.
func TestAdminReleaseDomainRefusals(t *testing.T) {
	gw := startGateway(t, nil)
	a, b := newTenant(t, gw, "free"), newTenant(t, gw, "free")
	ca, admin := newClient(t, gw, a.key), newClient(t, gw, adminToken)
	domain := "rel-" + strings.ToLower(rand.Text()[:10]) + ".acme.test"
	if r := ca.do("POST", "/v1/domains", `{"name":"`+domain+`"}`); r.code != http.StatusCreated {
		t.Fatalf("register: %s", r)
	}
	for _, path := range []string{
		"/v1/admin/tenants/" + newTenantID(t) + "/domains/" + domain,
		"/v1/admin/tenants/" + a.id + "/domains/unknown-" + domain,
		"/v1/admin/tenants/" + b.id + "/domains/" + domain,
	} {
		if r := admin.do("DELETE", path, ""); r.code != http.StatusNotFound || r.apiError(t)["code"] != "NOT_FOUND" {
			t.Errorf("DELETE %s: %s; want 404", path, r)
		}
	}
	for name, c := range map[string]*client{"the tenant's key": ca, "no credential": newClient(t, gw, "")} {
		if r := c.do("DELETE", "/v1/admin/tenants/"+a.id+"/domains/"+domain, ""); r.code != http.StatusUnauthorized {
			t.Errorf("%s releases: %s; want 401", name, r)
		}
	}
	if r := ca.do("GET", "/v1/domains/"+domain, ""); r.code != http.StatusOK {
		t.Errorf("the tenant's domain after the refusals: %s; want it still there", r)
	}
}
