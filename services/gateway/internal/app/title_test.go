//go:build integration

package app

import (
	"fmt"
	"net/http"
	"strings"
	"testing"
)

// A link's title over the REST API, on the real shortener and
// PostgreSQL: created, read, listed, left alone by a PATCH without it,
// changed, cleared by "" and by null; one too long or with a control
// character is a 400 naming the field, and changes nothing.
func TestLinkTitleOverREST(t *testing.T) {
	gw := startGateway(t, nil)
	c := newClient(t, gw, newTenant(t, gw, "free").key)
	const title = `<script>alert("x")</script> Ünïcödé`
	r := c.do("POST", "/v1/links", fmt.Sprintf(`{"longUrl":"https://example.com/titled","title":%q}`, title))
	m := r.json(t)
	code, _ := m["code"].(string)
	if r.code != http.StatusCreated || m["title"] != title {
		t.Fatalf("create: %s; want 201 with the title as sent", r)
	}
	if got := c.do("GET", "/v1/links/"+code, "").json(t); got["title"] != title {
		t.Errorf("get: %v; want title %q", got, title)
	}
	if got := c.do("PATCH", "/v1/links/"+code, `{"maxVisits":"3"}`).json(t); got["title"] != title || got["maxVisits"] != "3" {
		t.Errorf("PATCH without title: %v; want the title kept", got)
	}
	if got := c.do("PATCH", "/v1/links/"+code, `{"title":"Renamed"}`).json(t); got["title"] != "Renamed" {
		t.Errorf("PATCH of the title: %v", got)
	}
	list := c.do("GET", "/v1/links", "").json(t)
	if links, _ := list["links"].([]any); len(links) != 1 || links[0].(map[string]any)["title"] != "Renamed" {
		t.Errorf("list: %v; want the link titled Renamed", list)
	}
	for _, bad := range []string{`"` + strings.Repeat("é", 513) + `"`, `"two\nlines"`, `"\u001b[31mred"`} {
		r := c.do("PATCH", "/v1/links/"+code, `{"title":`+bad+`}`)
		if m := r.json(t); r.code != http.StatusBadRequest || m["reason"] != "TITLE_INVALID" || !strings.Contains(fmt.Sprint(m["errors"]), "field:title") {
			t.Errorf("PATCH of title %.20s…: %s; want 400 TITLE_INVALID naming title", bad, r)
		}
		r = c.do("POST", "/v1/links", `{"longUrl":"https://example.com/refused","title":`+bad+`}`)
		if r.code != http.StatusBadRequest {
			t.Errorf("create with title %.20s…: %s; want 400", bad, r)
		}
	}
	if got := c.do("GET", "/v1/links/"+code, "").json(t); got["title"] != "Renamed" {
		t.Errorf("after refused changes: %v; want the title as it was", got)
	}
	for _, clear := range []string{`""`, `null`} {
		c.do("PATCH", "/v1/links/"+code, `{"title":"again"}`)
		if got := c.do("PATCH", "/v1/links/"+code, `{"title":`+clear+`}`).json(t); got["title"] != "" {
			t.Errorf("PATCH of title %s: %v; want it cleared", clear, got)
		}
	}
}
