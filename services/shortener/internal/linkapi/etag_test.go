package linkapi_test

import (
	"context"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/protobuf/types/known/fieldmaskpb"

	shortenerv1 "kurz.dev/gen/kurz/shortener/v1"
	"kurz.dev/pkg/callmeta"
)

// ifMatch is as(tenant) with the entity tags of an If-Match header.
func ifMatch(tenant string, tags ...string) context.Context {
	ctx := as(tenant)
	for _, t := range tags {
		ctx = metadata.AppendToOutgoingContext(ctx, callmeta.IfMatchKey, t)
	}
	return ctx
}

// Every change of a link gives it a new etag; reads leave it alone.
func TestETagChangesWithEveryChangeOnly(t *testing.T) {
	e := newEnv(t)
	made, err := e.client.CreateLink(as("acme"), &shortenerv1.CreateLinkRequest{LongUrl: "https://example.com/e"})
	if err != nil {
		t.Fatal(err)
	}
	tag := made.GetLink().GetEtag()
	if len(tag) != 16 {
		t.Fatalf("etag %q; want 16 characters", tag)
	}
	code := made.GetLink().GetCode()
	got, err := e.client.GetLink(as("acme"), &shortenerv1.GetLinkRequest{Code: code})
	if err != nil || got.GetLink().GetEtag() != tag {
		t.Fatalf("GetLink: etag %q, %v; want the create's %q", got.GetLink().GetEtag(), err, tag)
	}
	seen := map[string]bool{tag: true}
	for _, disabled := range []bool{true, false, false} { // the last one changes nothing, yet writes
		up, err := e.client.UpdateLink(as("acme"), &shortenerv1.UpdateLinkRequest{
			Link: &shortenerv1.Link{Code: code, Disabled: disabled}, UpdateMask: &fieldmaskpb.FieldMask{Paths: []string{"disabled"}}})
		if err != nil {
			t.Fatal(err)
		}
		if next := up.GetLink().GetEtag(); seen[next] {
			t.Fatalf("an update answered etag %q, seen before", next)
		} else {
			seen[next] = true
		}
	}
}

// A change conditional on an etag applies while the link still has it, and
// is refused (ABORTED, ETAG_MISMATCH, nothing changed) once it changed: by
// If-Match (any of its tags), or by the link's etag field on update.
func TestChangesConditionalOnTheETag(t *testing.T) {
	e := newEnv(t)
	made, err := e.client.CreateLink(as("acme"), &shortenerv1.CreateLinkRequest{LongUrl: "https://example.com/c"})
	if err != nil {
		t.Fatal(err)
	}
	code, first := made.GetLink().GetCode(), made.GetLink().GetEtag()
	update := func(ctx context.Context, url, field string) (*shortenerv1.UpdateLinkResponse, error) {
		return e.client.UpdateLink(ctx, &shortenerv1.UpdateLinkRequest{
			Link:       &shortenerv1.Link{Code: code, LongUrl: url, Etag: field},
			UpdateMask: &fieldmaskpb.FieldMask{Paths: []string{"long_url"}}})
	}

	up, err := update(ifMatch("acme", "no-such-tag", first), "https://example.com/c2", "")
	if err != nil {
		t.Fatalf("update with If-Match holding the current tag: %v", err)
	}
	second := up.GetLink().GetEtag()

	_, err = update(ifMatch("acme", first), "https://example.com/lost", "")
	wantStatus(t, "update with If-Match of a past tag", err, codes.Aborted, callmeta.ReasonETagMismatch, "")
	_, err = update(as("acme"), "https://example.com/lost", first)
	wantStatus(t, "update with a past etag field", err, codes.Aborted, callmeta.ReasonETagMismatch, "")
	_, err = update(ifMatch("acme", second), "https://example.com/lost", first)
	wantStatus(t, "update whose field is past, If-Match current", err, codes.Aborted, callmeta.ReasonETagMismatch, "")
	_, err = update(ifMatch("acme", "W/"+second), "https://example.com/lost", "")
	wantStatus(t, "update with the current tag, weak", err, codes.Aborted, callmeta.ReasonETagMismatch, "")
	_, err = e.client.DeleteLink(ifMatch("acme", first), &shortenerv1.DeleteLinkRequest{Code: code})
	wantStatus(t, "delete with If-Match of a past tag", err, codes.Aborted, callmeta.ReasonETagMismatch, "")
	if got, err := e.client.GetLink(as("acme"), &shortenerv1.GetLinkRequest{Code: code}); err != nil ||
		got.GetLink().GetLongUrl() != "https://example.com/c2" || got.GetLink().GetEtag() != second {
		t.Fatalf("after the refused changes: %v, %v; want the link as the first update left it", got, err)
	}

	// A precondition does not hide what the request would have got without
	// it: another tenant's or an unknown link is not found, a bad request
	// is refused for what is wrong with it.
	_, err = e.client.DeleteLink(ifMatch("globex", second), &shortenerv1.DeleteLinkRequest{Code: code})
	wantStatus(t, "another tenant's delete with the current tag", err, codes.NotFound, "", "")
	_, err = update(ifMatch("acme", first), "ftp://example.com/", "")
	wantStatus(t, "a bad URL with a past tag", err, codes.InvalidArgument, "URL_SCHEME_NOT_ALLOWED", "long_url")

	tooMany := make([]string, callmeta.MaxIfMatch+1)
	for i := range tooMany {
		tooMany[i] = second
	}
	_, err = update(ifMatch("acme", tooMany...), "https://example.com/many", "")
	wantStatus(t, "update with too many tags", err, codes.InvalidArgument, callmeta.ReasonIfMatchInvalid, "etag")

	up, err = update(as("acme"), "https://example.com/c3", second)
	if err != nil {
		t.Fatalf("update with the current etag field: %v", err)
	}
	if _, err := e.client.DeleteLink(ifMatch("acme", up.GetLink().GetEtag()), &shortenerv1.DeleteLinkRequest{Code: code}); err != nil {
		t.Fatalf("delete with If-Match of the current tag: %v", err)
	}
	_, err = e.client.GetLink(as("acme"), &shortenerv1.GetLinkRequest{Code: code})
	wantStatus(t, "the deleted link", err, codes.NotFound, "", "")
}
