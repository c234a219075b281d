package linkapi_test

import (
	"strings"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	shortenerv1 "kurz.dev/gen/kurz/shortener/v1"
	"kurz.dev/services/shortener/internal/linkapi"
)

// A title is kept as sent on create, read back by Get and List, replaced
// by an update with "title" in the mask, left alone by one without it,
// and cleared by an empty one.
func TestTitleCreateGetUpdateClearList(t *testing.T) {
	e := newEnv(t)
	ctx := as("acme")
	const title = "  Spring sale <script>alert(1)</script> — Ünïcödé ✓ "
	created, err := e.client.CreateLink(ctx, &shortenerv1.CreateLinkRequest{LongUrl: "https://example.com/t", Title: title})
	if err != nil {
		t.Fatal(err)
	}
	code := created.GetLink().GetCode()
	if got := created.GetLink().GetTitle(); got != title {
		t.Errorf("create answered title %q, want %q", got, title)
	}
	get := func() string {
		t.Helper()
		r, err := e.client.GetLink(ctx, &shortenerv1.GetLinkRequest{Code: code})
		if err != nil {
			t.Fatal(err)
		}
		return r.GetLink().GetTitle()
	}
	if got := get(); got != title {
		t.Errorf("get: title %q, want %q", got, title)
	}
	if _, err := e.client.UpdateLink(ctx, &shortenerv1.UpdateLinkRequest{
		Link: &shortenerv1.Link{Code: code, MaxVisits: 5, Title: "not in the mask"}, UpdateMask: mask("max_visits")}); err != nil {
		t.Fatal(err)
	}
	if got := get(); got != title {
		t.Errorf("after an update without title in the mask: title %q, want it kept, %q", got, title)
	}
	up, err := e.client.UpdateLink(ctx, &shortenerv1.UpdateLinkRequest{Link: &shortenerv1.Link{Code: code, Title: "New"}, UpdateMask: mask("title")})
	if err != nil || up.GetLink().GetTitle() != "New" || up.GetLink().GetMaxVisits() != 5 {
		t.Fatalf("update of the title: %v, %v; want title New, the rest kept", up.GetLink(), err)
	}
	list, err := e.client.ListLinks(ctx, &shortenerv1.ListLinksRequest{})
	if err != nil || len(list.GetLinks()) != 1 || list.GetLinks()[0].GetTitle() != "New" {
		t.Errorf("list: %v, %v; want the link with title New", list.GetLinks(), err)
	}
	if _, err := e.client.UpdateLink(ctx, &shortenerv1.UpdateLinkRequest{Link: &shortenerv1.Link{Code: code}, UpdateMask: mask("title")}); err != nil {
		t.Fatal(err)
	}
	if got := get(); got != "" {
		t.Errorf("after clearing: title %q, want none", got)
	}
}

// A title is at most linkapi.MaxTitleLength characters (not bytes)
// without control characters; anything else is refused on create, in a
// batch and on update, naming the field, and changes nothing. (Invalid
// UTF-8 never arrives: proto3 refuses it in a string field on the wire.)
func TestTitleBounds(t *testing.T) {
	e := newEnv(t)
	ctx := as("acme")
	longest := strings.Repeat("ü", linkapi.MaxTitleLength) // 1,024 bytes: characters count
	r, err := e.client.CreateLink(ctx, &shortenerv1.CreateLinkRequest{LongUrl: "https://example.com/b", Title: longest})
	if err != nil || r.GetLink().GetTitle() != longest {
		t.Fatalf("create with a title of %d characters: %v; want it kept", linkapi.MaxTitleLength, err)
	}
	code := r.GetLink().GetCode()
	for name, title := range map[string]string{
		"one character too many": longest + "x",
		"newline":                "two\nlines",
		"tab":                    "a\tb",
		"escape":                 "\x1b[2Jclear",
		"C1 control":             "a\u0085b",
		"DEL":                    "a\x7fb",
	} {
		_, err := e.client.CreateLink(ctx, &shortenerv1.CreateLinkRequest{LongUrl: "https://example.com/refused", Title: title})
		wantStatus(t, "create, "+name, err, codes.InvalidArgument, linkapi.ReasonTitleInvalid, "title")
		if err != nil && !strings.Contains(status.Convert(err).Message(), "title") {
			t.Errorf("create, %s: message %q does not name the title", name, status.Convert(err).Message())
		}
		_, err = e.client.UpdateLink(ctx, &shortenerv1.UpdateLinkRequest{Link: &shortenerv1.Link{Code: code, Title: title}, UpdateMask: mask("title")})
		wantStatus(t, "update, "+name, err, codes.InvalidArgument, linkapi.ReasonTitleInvalid, "title")
		b, err := e.client.BatchCreateLinks(ctx, &shortenerv1.BatchCreateLinksRequest{Requests: []*shortenerv1.CreateLinkRequest{
			{LongUrl: "https://example.com/ok", Title: "fine"}, {LongUrl: "https://example.com/refused", Title: title}}})
		if err != nil || b.GetResults()[0].GetLink().GetTitle() != "fine" || b.GetResults()[1].GetError().GetField() != "title" {
			t.Errorf("batch, %s: %v, %v; want the first item created with its title, the second refused on title", name, b, err)
		}
	}
	got, err := e.client.GetLink(ctx, &shortenerv1.GetLinkRequest{Code: code})
	if err != nil || got.GetLink().GetTitle() != longest {
		t.Errorf("after refused updates: %v; want the title unchanged", err)
	}
}
