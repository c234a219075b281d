//go:build integration

package app

import (
	"context"
	"net/http"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	analyticsv1 "kurz.dev/gen/kurz/analytics/v1"
	shortenerv1 "kurz.dev/gen/kurz/shortener/v1"
	"kurz.dev/pkg/callmeta"
	"kurz.dev/pkg/svcauth"
	"kurz.dev/pkg/testkit/servertest"
)

// Full method names: the audiences of assertions.
const (
	getLinkMethod      = "/kurz.shortener.v1.ShortenerService/GetLink"
	listLinksMethod    = "/kurz.shortener.v1.ShortenerService/ListLinks"
	deleteLinkMethod   = "/kurz.shortener.v1.ShortenerService/DeleteLink"
	getLinkStatsMethod = "/kurz.analytics.v1.AnalyticsService/GetLinkStats"
)

// unsigned dials addr as a pod inside the cluster could: no key.
func unsigned(t *testing.T, addr string) *grpc.ClientConn {
	t.Helper()
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = conn.Close() })
	return conn
}

// as returns a context whose call names tenant in x-kurz-tenant and carries
// assertion ("" for none).
func as(tenant, assertion string) context.Context {
	kv := []string{callmeta.TenantKey, tenant}
	if assertion != "" {
		kv = append(kv, svcauth.AssertionKey, assertion)
	}
	return metadata.NewOutgoingContext(context.Background(), metadata.Pairs(kv...))
}

// victimLink creates a tenant and, through gw, one link of its to longURL.
func victimLink(t *testing.T, gw *servertest.Running, longURL string) (tenant, *client, string) {
	t.Helper()
	victim := newTenant(t, gw, "free")
	vc := newClient(t, gw, victim.key)
	r := vc.do("POST", "/v1/links", `{"longUrl":"`+longURL+`"}`)
	if r.code != http.StatusCreated {
		t.Fatalf("victim creates through the gateway: %s", r)
	}
	return victim, vc, r.json(t)["code"].(string)
}

// A caller that reaches the shortener's and analytics' gRPC ports directly
// and names a tenant in x-kurz-tenant, with no assertion or an invalid,
// expired, wrong-key or other-method one, is refused UNAUTHENTICATED and
// gets none of the tenant's data, and its delete changes nothing; the same
// tenant through the gateway reads its link.
func TestDirectCallsWithoutAValidAssertionAreRefused(t *testing.T) {
	gw := startGateway(t, nil)
	victim, vc, code := victimLink(t, gw, "https://example.com/victims-secret-target")

	keys := servertest.ServiceAuthKeys()
	wrongKey := svcauth.NewKeys([]byte("not-the-services-key-0123456789abcdef"), nil)
	shortener := shortenerv1.NewShortenerServiceClient(unsigned(t, stack.Shortener.GRPCAddr))
	analytics := analyticsv1.NewAnalyticsServiceClient(unsigned(t, stack.Analytics.GRPCAddr))
	for name, assertion := range map[string]func(method string) string{
		"no assertion":      func(string) string { return "" },
		"invalid assertion": func(string) string { return "v1.4102444800.dmljdGlt.not-a-mac" },
		"expired assertion": func(m string) string {
			return keys.SignAt(victim.id, m, time.Now().Add(-svcauth.TTL-svcauth.MaxSkew-time.Minute))
		},
		"wrong key":            func(m string) string { return wrongKey.Sign(victim.id, m) },
		"another method's":     func(string) string { return keys.Sign(victim.id, "/kurz.shortener.v1.ShortenerService/CreateLink") },
		"signed for no method": func(string) string { return keys.Sign(victim.id, "") },
	} {
		get, err := shortener.GetLink(as(victim.id, assertion(getLinkMethod)), &shortenerv1.GetLinkRequest{Code: code})
		if status.Code(err) != codes.Unauthenticated || get != nil {
			t.Errorf("%s: GetLink = %v, %v; want UNAUTHENTICATED and no link", name, get, err)
		}
		list, err := shortener.ListLinks(as(victim.id, assertion(listLinksMethod)), &shortenerv1.ListLinksRequest{PageSize: 100})
		if status.Code(err) != codes.Unauthenticated || list != nil {
			t.Errorf("%s: ListLinks = %v, %v; want UNAUTHENTICATED and no links", name, list, err)
		}
		del, err := shortener.DeleteLink(as(victim.id, assertion(deleteLinkMethod)), &shortenerv1.DeleteLinkRequest{Code: code})
		if status.Code(err) != codes.Unauthenticated || del != nil {
			t.Errorf("%s: DeleteLink = %v, %v; want UNAUTHENTICATED", name, del, err)
		}
		stats, err := analytics.GetLinkStats(as(victim.id, assertion(getLinkStatsMethod)), &analyticsv1.GetLinkStatsRequest{Code: code})
		if status.Code(err) != codes.Unauthenticated || stats != nil {
			t.Errorf("%s: GetLinkStats = %v, %v; want UNAUTHENTICATED and no statistics", name, stats, err)
		}
		if err != nil && strings.Contains(err.Error(), "victims-secret-target") {
			t.Errorf("%s: the refusal holds the victim's data: %v", name, err)
		}
	}
	if r := vc.do("GET", "/v1/links/"+code, ""); r.code != http.StatusOK || r.json(t)["longUrl"] != "https://example.com/victims-secret-target" {
		t.Errorf("victim reads its link through the gateway after the attempts: %s; want 200 with its long URL", r)
	}
}

// A valid assertion for tenant A, sent with x-kurz-tenant naming tenant B,
// acts as A: B's link is not found, not listed and not deleted.
func TestAnAssertionActsOnlyForItsTenant(t *testing.T) {
	gw := startGateway(t, nil)
	victim, _, code := victimLink(t, gw, "https://example.com/b-only")
	attacker := newTenant(t, gw, "free")

	keys := servertest.ServiceAuthKeys()
	shortener := shortenerv1.NewShortenerServiceClient(unsigned(t, stack.Shortener.GRPCAddr))
	get, err := shortener.GetLink(as(victim.id, keys.Sign(attacker.id, getLinkMethod)), &shortenerv1.GetLinkRequest{Code: code})
	if status.Code(err) != codes.NotFound || get != nil {
		t.Errorf("GetLink of B's code as A: %v, %v; want NOT_FOUND", get, err)
	}
	list, err := shortener.ListLinks(as(victim.id, keys.Sign(attacker.id, listLinksMethod)), &shortenerv1.ListLinksRequest{PageSize: 100})
	if err != nil || len(list.GetLinks()) != 0 {
		t.Errorf("ListLinks as A: %d links, %v; want A's none", len(list.GetLinks()), err)
	}
	if _, err := shortener.DeleteLink(as(victim.id, keys.Sign(attacker.id, deleteLinkMethod)), &shortenerv1.DeleteLinkRequest{Code: code}); status.Code(err) != codes.NotFound {
		t.Errorf("DeleteLink of B's code as A: %v; want NOT_FOUND", err)
	}
	// The assertion is what a gateway sends: B's own one reads the link.
	own, err := shortener.GetLink(as(victim.id, keys.Sign(victim.id, getLinkMethod)), &shortenerv1.GetLinkRequest{Code: code})
	if err != nil || own.GetLink().GetLongUrl() != "https://example.com/b-only" {
		t.Errorf("GetLink with B's own assertion: %v, %v; want B's link", own, err)
	}
}

// A gateway whose KURZ_SERVICE_AUTH_KEY differs from the services' is
// refused by them: its client gets a generic 500, not a 401 blaming its API
// key nor the refusal's words, and nothing is created.
func TestGatewayWithAnotherKeyAnswersInternalError(t *testing.T) {
	gw := startGateway(t, nil)
	tn := newTenant(t, gw, "free")
	wrong := startGateway(t, map[string]string{"KURZ_SERVICE_AUTH_KEY": "not-the-services-key-0123456789abcdef"})
	r := newClient(t, wrong, tn.key).do("POST", "/v1/links", `{"longUrl":"https://example.com/never-created"}`)
	if e := r.apiError(t); r.code != http.StatusInternalServerError || e["code"] != "INTERNAL" || strings.Contains(string(r.body), "assertion") {
		t.Errorf("create through a gateway with another key: %s; want a generic 500 INTERNAL", r)
	}
	if n := linkCount(t, newClient(t, gw, tn.key)); n != 0 {
		t.Errorf("the tenant has %d links after the refused create, want 0", n)
	}
}
