//go:build integration

package app

import (
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
)

// POST /v1/links with an Idempotency-Key, end to end on the real shortener
// and PostgreSQL: the first create answers 201, the same request sent
// again 200 with the same link (concurrent ones too: one link in all);
// the key with another body 422 IDEMPOTENCY_KEY_REUSED, creating nothing;
// the draft's quoted form is the same key; a bad key 400; a POST route
// that takes no key refuses it rather than ignore it.
func TestIdempotencyKeyOverREST(t *testing.T) {
	gw := startGateway(t, nil)
	c := newClient(t, gw, newTenant(t, gw, "free").key)
	const body = `{"longUrl": "https://example.com/idempotent", "mode": "CODE_MODE_RANDOM", "tags": ["once"]}`
	key := "order-" + runID()

	var first apiLink
	r := c.do("POST", "/v1/links", body, "Idempotency-Key", key)
	decodeAnswer(t, r, http.StatusCreated, &first)
	before := linkCount(t, c)

	const racers = 8
	answers := make([]response, racers)
	var wg sync.WaitGroup
	for i := range racers {
		header := []string{"Idempotency-Key", key}
		if i%2 == 1 {
			header[1] = `"` + key + `"` // the structured-field form
		}
		wg.Go(func() { answers[i] = c.do("POST", "/v1/links", body, header...) })
	}
	wg.Wait()
	for i, r := range answers {
		var again apiLink
		decodeAnswer(t, r, http.StatusOK, &again)
		if again.Code != first.Code || r.header.Get("Location") != "/v1/links/"+first.Code {
			t.Errorf("repeat %d: %s (Location %q); want 200 with link %s", i, r, r.header.Get("Location"), first.Code)
		}
	}

	r = c.do("POST", "/v1/links", strings.Replace(body, "idempotent", "another", 1), "Idempotency-Key", key)
	if e := r.apiError(t); r.code != http.StatusUnprocessableEntity || e["reason"] != "IDEMPOTENCY_KEY_REUSED" {
		t.Errorf("the key with another body: %s; want 422 IDEMPOTENCY_KEY_REUSED", r)
	}
	for name, header := range map[string][]string{
		"two fields":    {"Idempotency-Key", key, "Idempotency-Key", key},
		"too long":      {"Idempotency-Key", strings.Repeat("k", 256)},
		"a bad escape":  {"Idempotency-Key", `"a\nb"`},
		"an empty pair": {"Idempotency-Key", `""`},
	} {
		r := c.do("POST", "/v1/links", strings.Replace(body, "idempotent", "bad-key", 1), header...)
		if e := r.apiError(t); r.code != http.StatusBadRequest || e["reason"] != "IDEMPOTENCY_KEY_INVALID" {
			t.Errorf("%s: %s; want 400 IDEMPOTENCY_KEY_INVALID", name, r)
		}
	}
	r = c.do("POST", "/v1/links:batch", `{"requests": [{"longUrl": "https://example.com/batch-key"}]}`, "Idempotency-Key", "batch-"+key)
	if e := r.apiError(t); r.code != http.StatusBadRequest || e["reason"] != "IDEMPOTENCY_KEY_UNSUPPORTED" {
		t.Errorf("a batch with a key: %s; want 400 IDEMPOTENCY_KEY_UNSUPPORTED", r)
	}
	if n := linkCount(t, c); n != before {
		t.Errorf("the tenant has %d links after the repeats and refusals; want %d", n, before)
	}

	// Without an API key, every anonymous caller shares one tenant: a key
	// would answer one caller with another's link.
	anon := c.with("")
	r = anon.do("POST", "/v1/links", body, "Idempotency-Key", key)
	if e := r.apiError(t); r.code != http.StatusBadRequest || e["reason"] != "IDEMPOTENCY_KEY_UNSUPPORTED" {
		t.Errorf("an anonymous create with a key: %s; want 400 IDEMPOTENCY_KEY_UNSUPPORTED", r)
	}
}

// POST /v1/webhooks with an Idempotency-Key: a repeat answers the
// subscription the key made, 200, without its secret (shown once: the
// key lives as long as the subscription, and any key of the tenant may
// send it); concurrent repeats make one subscription; another request
// with the key is 422.
func TestIdempotencyKeyOnWebhooks(t *testing.T) {
	gw := startGateway(t, nil)
	c := newClient(t, gw, newTenant(t, gw, "free").key)
	rcv := httptest.NewServer(http.HandlerFunc(func(http.ResponseWriter, *http.Request) {}))
	defer rcv.Close()
	body := fmt.Sprintf(`{"url": %q, "events": ["link.created"], "description": "once"}`, rcv.URL+"/in")
	type answer struct {
		Webhook struct {
			ID          string   `json:"id"`
			URL         string   `json:"url"`
			Events      []string `json:"events"`
			Description string   `json:"description"`
			CreateTime  string   `json:"createTime"`
		} `json:"webhook"`
		Secret  string `json:"secret"`
		Created bool   `json:"created"`
	}
	var first answer
	decodeAnswer(t, c.do("POST", "/v1/webhooks", body, "Idempotency-Key", "sub-1"), http.StatusCreated, &first)
	if first.Webhook.ID == "" || first.Secret == "" {
		t.Fatalf("the first create: %+v", first)
	}

	const racers = 6
	answers := make([]response, racers)
	var wg sync.WaitGroup
	for i := range racers {
		wg.Go(func() { answers[i] = c.do("POST", "/v1/webhooks", body, "Idempotency-Key", "sub-1") })
	}
	wg.Wait()
	for i, r := range answers {
		var again answer
		decodeAnswer(t, r, http.StatusOK, &again)
		if again.Webhook.ID != first.Webhook.ID || again.Created || r.header.Get("Cache-Control") != "no-store" {
			t.Errorf("repeat %d: %s; want 200 with %s, not created, not stored", i, r, first.Webhook.ID)
		}
		if again.Secret != "" || strings.Contains(string(r.body), first.Secret) {
			t.Errorf("repeat %d: %s; want it without the secret, shown only in the first answer", i, r)
		}
	}
	r := c.do("POST", "/v1/webhooks", strings.Replace(body, "once", "twice", 1), "Idempotency-Key", "sub-1")
	if e := r.apiError(t); r.code != http.StatusUnprocessableEntity || e["reason"] != "IDEMPOTENCY_KEY_REUSED" {
		t.Errorf("the key with another description: %s; want 422 IDEMPOTENCY_KEY_REUSED", r)
	}
	var list struct {
		Webhooks []json.RawMessage `json:"webhooks"`
	}
	decodeAnswer(t, c.do("GET", "/v1/webhooks", ""), http.StatusOK, &list)
	if len(list.Webhooks) != 1 {
		t.Errorf("the tenant's subscriptions: %+v; want the one", list.Webhooks)
	}
}
