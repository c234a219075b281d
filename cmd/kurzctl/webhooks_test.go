//go:build integration

package main

import (
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

// TestWebhooks subscribes a loopback receiver (the test stack allow-lists
// loopback), sees a signed event arrive and its delivery listed, then
// deletes the subscription.
func TestWebhooks(t *testing.T) {
	gw := startGateway(t, stack.Limiter)
	_, c := tenantWithKey(t, newCtl(t, gw), "free")
	var mu sync.Mutex
	var got []string
	var sigs []string
	rcv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		mu.Lock()
		defer mu.Unlock()
		got, sigs = append(got, string(b)), append(sigs, r.Header.Get(webhooksig.Header))
	}))
	defer rcv.Close()

	out := c.ok("webhooks", "create", rcv.URL+"/kurz", "--event", "link.created", "--description", "ctl test")
	id, secret := field(t, out, "id"), field(t, out, "secret")
	if !strings.HasPrefix(id, "wh_") || !strings.HasPrefix(secret, "whsec_") || field(t, out, "events") != "link.created" {
		t.Fatalf("webhooks create:\n%s", out)
	}
	if list := c.ok("webhooks", "list"); !strings.Contains(list, id) || strings.Contains(list, secret) {
		t.Errorf("webhooks list (want %s, never the secret):\n%s", id, list)
	}
	code := strings.TrimSpace(c.ok("links", "create", "https://example.com/ctl-hook", "-q"))
	if !servertest.Eventually(10*time.Second, func() bool { mu.Lock(); defer mu.Unlock(); return len(got) > 0 }) {
		t.Fatal("no delivery reached the receiver")
	}
	mu.Lock()
	body, sig := got[0], sigs[0]
	mu.Unlock()
	if err := webhooksig.Verify(secret, sig, []byte(body), time.Now(), 0); err != nil || !strings.Contains(body, `"code":"`+code+`"`) {
		t.Errorf("delivery %s signed %q: %v", body, sig, err)
	}
	if !servertest.Eventually(5*time.Second, func() bool {
		return strings.Contains(c.ok("webhooks", "deliveries", id, "--status", "succeeded"), "link.created")
	}) {
		t.Errorf("webhooks deliveries --status succeeded:\n%s", c.ok("webhooks", "deliveries", id))
	}
	if r := c.run("webhooks", "deliveries", id, "--status", "lost"); r.code != exitUsage {
		t.Errorf("--status lost: %s, want a usage error", r)
	}
	if out := c.ok("webhooks", "delete", id); out != "deleted "+id+"\n" {
		t.Errorf("webhooks delete: %q", out)
	}
	if r := c.run("webhooks", "deliveries", id); r.code != exitError {
		t.Errorf("deliveries of a deleted webhook: %s, want an API error", r)
	}
}
