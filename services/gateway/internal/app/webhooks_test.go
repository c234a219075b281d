//go:build integration

package app

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"kurz.dev/pkg/testkit/servertest"
	"kurz.dev/pkg/webhooksig"
)

// TestWebhooksThroughREST subscribes a loopback receiver (the test stack's
// shortener allow-lists loopback), receives a signed link.created, lists
// the delivery, and checks another tenant sees none of it.
func TestWebhooksThroughREST(t *testing.T) {
	gw := startGateway(t, nil)
	tn := newTenant(t, gw, "free")
	c := newClient(t, gw, tn.key)

	var mu sync.Mutex
	var bodies [][]byte
	var sigs []string
	fail := true
	rcv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		mu.Lock()
		defer mu.Unlock()
		bodies = append(bodies, b)
		sigs = append(sigs, r.Header.Get(webhooksig.Header))
		if fail && strings.Contains(string(b), "/dead") {
			w.WriteHeader(http.StatusServiceUnavailable)
		}
	}))
	defer rcv.Close()

	r := c.do("POST", "/v1/webhooks", fmt.Sprintf(`{"url":%q,"events":["link.created"],"description":"test"}`, rcv.URL+"/in"))
	if r.code != http.StatusCreated || r.header.Get("Cache-Control") != "no-store" || r.header.Get("Location") != "/v1/webhooks" {
		t.Fatalf("create webhook: %s (Cache-Control %q, Location %q)", r, r.header.Get("Cache-Control"), r.header.Get("Location"))
	}
	var created struct {
		Webhook struct {
			ID     string   `json:"id"`
			Events []string `json:"events"`
		} `json:"webhook"`
		Secret string `json:"secret"`
	}
	if err := json.Unmarshal(r.body, &created); err != nil || created.Secret == "" || created.Webhook.ID == "" {
		t.Fatalf("create webhook body %s: %v", r.body, err)
	}

	if r := c.do("POST", "/v1/links", `{"longUrl":"https://example.com/webhooked"}`); r.code != http.StatusCreated {
		t.Fatalf("create link: %s", r)
	}
	if !servertest.Eventually(10*time.Second, func() bool { mu.Lock(); defer mu.Unlock(); return len(bodies) > 0 }) {
		t.Fatal("no delivery")
	}
	mu.Lock()
	body, sig := bodies[0], sigs[0]
	mu.Unlock()
	if err := webhooksig.Verify(created.Secret, sig, body, time.Now(), 0); err != nil {
		t.Errorf("signature %q: %v", sig, err)
	}
	var ev struct {
		ID, Type, Tenant string
		Data             map[string]any
	}
	if err := json.Unmarshal(body, &ev); err != nil || ev.Type != "link.created" || ev.Tenant != tn.id || ev.Data["long_url"] != "https://example.com/webhooked" {
		t.Errorf("event %s (%v)", body, err)
	}

	list := c.do("GET", "/v1/webhooks", "")
	if list.code != 200 || strings.Contains(string(list.body), created.Secret) || strings.Contains(string(list.body), "secret") {
		t.Errorf("list: %s (must not carry the secret)", list)
	}
	path := "/v1/webhooks/" + created.Webhook.ID + "/deliveries"
	if !servertest.Eventually(5*time.Second, func() bool {
		r := c.do("GET", path+"?status=WEBHOOK_DELIVERY_STATUS_SUCCEEDED", "")
		return r.code == 200 && strings.Contains(string(r.body), ev.ID)
	}) {
		t.Errorf("GET %s: %s, want the succeeded delivery %s", path, c.do("GET", path, ""), ev.ID)
	}

	// A failing receiver: dead after the stack's 2 attempts, then redelivered.
	if r := c.do("POST", "/v1/links", `{"longUrl":"https://example.com/dead"}`); r.code != http.StatusCreated {
		t.Fatalf("create link: %s", r)
	}
	var deadID string
	if !servertest.Eventually(10*time.Second, func() bool {
		var page struct {
			Deliveries []struct{ ID string } `json:"deliveries"`
		}
		r := c.do("GET", path+"?status=WEBHOOK_DELIVERY_STATUS_DEAD", "")
		if json.Unmarshal(r.body, &page) != nil || len(page.Deliveries) != 1 {
			return false
		}
		deadID = page.Deliveries[0].ID
		return true
	}) {
		t.Fatalf("no dead delivery: %s", c.do("GET", path, ""))
	}
	mu.Lock()
	fail = false
	mu.Unlock()
	if r := c.do("POST", path+"/"+deadID+"/redeliver", ""); r.code != 200 || !strings.Contains(string(r.body), "WEBHOOK_DELIVERY_STATUS_PENDING") {
		t.Errorf("redeliver: %s", r)
	}
	if !servertest.Eventually(10*time.Second, func() bool {
		r := c.do("GET", path+"?status=WEBHOOK_DELIVERY_STATUS_SUCCEEDED", "")
		return strings.Contains(string(r.body), deadID)
	}) {
		t.Errorf("the redelivery did not succeed: %s", c.do("GET", path, ""))
	}

	other := newClient(t, gw, newTenant(t, gw, "free").key)
	if r := other.do("GET", path, ""); r.code != http.StatusNotFound {
		t.Errorf("another tenant's GET %s: %s, want 404", path, r)
	}
	if r := other.do("DELETE", "/v1/webhooks/"+created.Webhook.ID, ""); r.code != http.StatusNotFound {
		t.Errorf("another tenant's DELETE: %s, want 404", r)
	}
	if r := c.do("POST", "/v1/webhooks", `{"url":"https://10.0.0.1/x"}`); r.code != http.StatusBadRequest {
		t.Errorf("a private receiver: %s, want 400", r)
	} else if e := r.apiError(t); !strings.Contains(e["detail"].(string), "non-public") {
		t.Errorf("detail %q", e["detail"])
	}
	if r := c.do("DELETE", "/v1/webhooks/"+created.Webhook.ID, ""); r.code != http.StatusNoContent {
		t.Errorf("delete: %s", r)
	}
	if r := c.do("GET", path, ""); r.code != http.StatusNotFound {
		t.Errorf("deliveries of a deleted webhook: %s, want 404", r)
	}
}
