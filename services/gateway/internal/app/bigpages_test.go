//go:build integration

package app

import (
	"context"
	"encoding/csv"
	"net/http"
	"strings"
	"testing"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/protobuf/proto"

	shortenerv1 "kurz.dev/gen/kurz/shortener/v1"
	"kurz.dev/pkg/callmeta"
	"kurz.dev/pkg/testkit/servertest"
)

// bigLinks is how many links the big-page tests give their tenant, and
// bigURL how long each of their four URLs is: 3,000 links of ~8 KB encode
// to ~24 MiB, a full page of 1,000 to ~8 MiB.
const (
	bigLinks = 3000
	bigURL   = 2000
)

// newBigTenant makes a tenant holding bigLinks links, each with a bigURL
// long URL and three device targets as long. They are written straight to
// PostgreSQL (the shortener would take minutes to check 3,000 URLs); the
// tenant's clean-up deletes them.
func newBigTenant(t *testing.T, gw *servertest.Running) tenant {
	t.Helper()
	tn := newTenant(t, gw, "free")
	pad := strings.Repeat("a", bigURL)
	// created_at steps back a millisecond per link, so the order is fixed.
	_, err := stack.DB.Exec(context.Background(), `
		INSERT INTO links (code, tenant, long_url, ios_url, android_url, desktop_url, created_at)
		SELECT $1 || '-' || i, $1,
			'https://example.com/l/' || $2 || '/' || i, 'https://example.com/i/' || $2 || '/' || i,
			'https://example.com/a/' || $2 || '/' || i, 'https://example.com/d/' || $2 || '/' || i,
			now() - i * interval '1 millisecond'
		FROM generate_series(1, $3::int) AS i`, tn.id, pad, bigLinks)
	if err != nil {
		t.Fatalf("insert %d links: %v", bigLinks, err)
	}
	return tn
}

// An export of 3,000 links with 2 KB URLs and device targets (~24 MiB of
// links, ~8 MiB per 1,000) has every row: the shortener's pages end before
// gRPC's 4 MiB message limit, where a page of 1,000 used to be refused and
// the export answered 429.
func TestExportOfBigLinksHasEveryRow(t *testing.T) {
	gw := startGateway(t, nil)
	tn := newBigTenant(t, gw)
	c := newClient(t, gw, tn.key)

	r := c.do("GET", "/v1/links:export", "")
	if r.code != http.StatusOK {
		t.Fatalf("export: %.300s", r)
	}
	recs, err := csv.NewReader(strings.NewReader(string(r.body))).ReadAll()
	if err != nil {
		t.Fatalf("the export is not CSV: %v", err)
	}
	seen := map[string]bool{}
	for _, rec := range recs[1:] {
		if len(rec[2]) < bigURL || len(rec[9]) < bigURL {
			t.Fatalf("row of %s: long_url %d bytes, ios_url %d; want at least %d", rec[0], len(rec[2]), len(rec[9]), bigURL)
		}
		seen[rec[0]] = true
	}
	if len(recs)-1 != bigLinks || len(seen) != bigLinks {
		t.Errorf("export has %d rows, %d distinct codes; want %d", len(recs)-1, len(seen), bigLinks)
	}
}

// ListLinks with the largest page size answers pages a client with gRPC's
// default 4 MiB receive limit can read, each under linkapi.MaxPageBytes
// (1 MiB) of links and ending early with a next page token, and the pages
// together hold every link once. The gateway's listing gets them all too.
func TestListOfBigLinksPagesUnderTheMessageLimit(t *testing.T) {
	gw := startGateway(t, nil)
	tn := newBigTenant(t, gw)

	// A plain client: gRPC's default receive limit, not the gateway's.
	conn, err := grpc.NewClient(stack.Shortener.GRPCAddr, grpc.WithTransportCredentials(insecure.NewCredentials()),
		servertest.ServiceAuth()) // signed as the gateway signs
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	shortener := shortenerv1.NewShortenerServiceClient(conn)
	ctx := callmeta.Outgoing(context.Background(), tn.id, "")
	req := &shortenerv1.ListLinksRequest{PageSize: 1000}
	seen := map[string]bool{}
	for pages := 1; ; pages++ {
		resp, err := shortener.ListLinks(ctx, req)
		if err != nil {
			t.Fatalf("page %d: %v", pages, err)
		}
		if n := proto.Size(resp); n > 1<<20+1<<10 {
			t.Errorf("page %d: %d bytes, want at most 1 MiB of links", pages, n)
		}
		for _, l := range resp.GetLinks() {
			seen[l.GetCode()] = true
		}
		if resp.GetNextPageToken() == "" {
			break
		}
		if len(resp.GetLinks()) >= 1000 {
			t.Errorf("page %d: %d links with a next page, want it cut by size", pages, len(resp.GetLinks()))
		}
		req.PageToken = resp.GetNextPageToken()
	}
	if len(seen) != bigLinks {
		t.Errorf("the pages hold %d distinct links, want %d", len(seen), bigLinks)
	}
	if got := linkCount(t, newClient(t, gw, tn.key)); got != bigLinks {
		t.Errorf("listed through the gateway with page_size=1000: %d links, want %d", got, bigLinks)
	}
}
