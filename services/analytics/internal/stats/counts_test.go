//go:build integration

package stats

import (
	"context"
	"fmt"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	analyticsv1 "kurz.dev/gen/kurz/analytics/v1"
	"kurz.dev/pkg/linkdomain"
	"kurz.dev/pkg/testkit/servertest"
	"kurz.dev/services/analytics/internal/clickstore"
)

// readCounter counts the LinkCounts reads of the store it wraps, and
// keeps the codes of the last.
type readCounter struct {
	*clickstore.Store
	reads atomic.Int32
	codes []string
}

func (r *readCounter) LinkCounts(ctx context.Context, tenant string, codes []string, start, end time.Time) (map[string]clickstore.Counts, error) {
	r.reads.Add(1)
	r.codes = codes
	return r.Store.LinkCounts(ctx, tenant, codes, start, end)
}

// TestLinksClickCounts: each link's counts are GetLinkStats' counts of it
// over the same range, duplicates of stored events subtracted, read in one
// store read with every link once; a link named twice is answered once,
// and a link without clicks, unknown or another tenant's answers zeros.
func TestLinksClickCounts(t *testing.T) {
	t.Parallel()
	store := &readCounter{Store: newStore(t, "")}
	tenant, other := "cnt-"+rnd(), "cnt-other-"+rnd()
	busy, quiet, domained, never, theirs := "busy"+rnd(), "quiet"+rnd(), "dom"+rnd(), "never"+rnd(), "theirs"+rnd()
	domain := "go.cnt" + rnd() + ".example"
	at := day0.Add(3*time.Hour + 10*time.Minute)
	row := func(tenant, code, id string, bot, flood, newVisitor, suspect bool) clickstore.Click {
		return clickstore.Click{Tenant: tenant, Code: code, Time: at, EventID: id, Visitor: "v-" + id,
			Bot: bot, Flood: flood, NewVisitor: newVisitor, Suspect: suspect}
	}
	// busy has TestDuplicatesCountOnce's events: 5 events in 9 rows.
	err := store.Insert(context.Background(), []clickstore.Click{
		row(tenant, busy, "e1", false, false, true, false),
		row(tenant, busy, "e1", false, true, false, true),
		row(tenant, busy, "e2", false, false, true, false),
		row(tenant, busy, "e2", false, false, true, true),
		row(tenant, busy, "e3", true, false, false, false),
		row(tenant, busy, "e3", true, false, false, true),
		row(tenant, busy, "e3", true, false, false, true),
		row(tenant, busy, "e4", false, false, false, true),
		row(tenant, busy, "e5", false, false, true, false),
		row(tenant, quiet, "q1", false, false, true, false),
		row(tenant, linkdomain.Key(domain, domained), "d1", false, false, true, false),
		row(tenant, linkdomain.Key(domain, domained), "d2", true, false, false, false),
		row(other, theirs, "t1", false, false, true, false),
		row(other, busy, "t2", false, false, true, false), // the same code, another tenant's clicks
	})
	if err != nil {
		t.Fatal(err)
	}
	svc := New(store, servertest.Logger(t), Options{})
	resp, err := svc.GetLinksClickCounts(as(tenant), &analyticsv1.GetLinksClickCountsRequest{
		Links: []*analyticsv1.LinkRef{{Code: busy}, {Code: quiet}, {Code: busy}, {Code: domained, Domain: strings.ToUpper(domain)},
			{Code: never}, {Code: theirs}},
		StartTime: ts(day0), EndTime: ts(day0.Add(24 * time.Hour)),
	})
	if err != nil {
		t.Fatal(err)
	}
	if n := store.reads.Load(); n != 1 || len(store.codes) != 5 {
		t.Errorf("%d store reads of %d codes (%v), want 1 read of the 5 distinct links", n, len(store.codes), store.codes)
	}
	type counts = [5]int64 // total, human, bot, flood, unique visitors
	want := []struct {
		code, domain string
		counts       counts
	}{
		{busy, "", counts{5, 3, 1, 1, 2}},
		{quiet, "", counts{1, 1, 0, 0, 1}},
		{domained, domain, counts{2, 1, 1, 0, 1}},
		{never, "", counts{}},
		{theirs, "", counts{}},
	}
	if len(resp.GetLinks()) != len(want) {
		t.Fatalf("%d links answered, want %d: %v", len(resp.GetLinks()), len(want), resp.GetLinks())
	}
	for i, w := range want {
		l := resp.GetLinks()[i]
		c := l.GetCounts()
		got := counts{c.GetTotal(), c.GetHuman(), c.GetBot(), c.GetFlood(), c.GetUniqueVisitors()}
		if l.GetCode() != w.code || l.GetDomain() != w.domain || got != w.counts {
			t.Errorf("link %d: %s on %q %v, want %s on %q %v (total, human, bot, flood, visitors)",
				i, l.GetCode(), l.GetDomain(), got, w.code, w.domain, w.counts)
		}
		if w.code == theirs {
			continue // GetLinkStats answers NOT_FOUND
		}
		st, err := svc.GetLinkStats(as(tenant), &analyticsv1.GetLinkStatsRequest{
			Code: w.code, Domain: w.domain, StartTime: ts(day0), EndTime: ts(day0.Add(24 * time.Hour))})
		if err != nil {
			t.Fatal(err)
		}
		sc := st.GetCounts()
		if one := (counts{sc.GetTotal(), sc.GetHuman(), sc.GetBot(), sc.GetFlood(), sc.GetUniqueVisitors()}); one != got {
			t.Errorf("link %s: %v in the batch, %v from GetLinkStats", w.code, got, one)
		}
	}
	if !resp.GetStartTime().AsTime().Equal(day0) || !resp.GetEndTime().AsTime().Equal(day0.Add(24*time.Hour)) {
		t.Errorf("range answered %v to %v, want the day asked for", resp.GetStartTime().AsTime(), resp.GetEndTime().AsTime())
	}
	// The other tenant sees its own clicks of the shared code only.
	resp, err = svc.GetLinksClickCounts(as(other), &analyticsv1.GetLinksClickCountsRequest{
		Links: []*analyticsv1.LinkRef{{Code: busy}, {Code: theirs}}, StartTime: ts(day0), EndTime: ts(day0.Add(24 * time.Hour))})
	if err != nil {
		t.Fatal(err)
	}
	if a, b := resp.GetLinks()[0].GetCounts().GetTotal(), resp.GetLinks()[1].GetCounts().GetTotal(); a != 1 || b != 1 {
		t.Errorf("the other tenant's totals %d and %d, want its own click of each", a, b)
	}
}

// TestLinksClickCountsOfAThousandLongKeys: the most links a call takes,
// each on a custom domain of the longest name, fit one read (the query's
// text is past ClickHouse's default max_query_size).
func TestLinksClickCountsOfAThousandLongKeys(t *testing.T) {
	t.Parallel()
	store := newStore(t, "")
	tenant := "cnt-long-" + rnd()
	label := strings.Repeat("d", 63)
	domain := label + "." + label + "." + label + "." + strings.Repeat("e", 58) + ".io" // 253 characters
	if p := linkdomain.Problem(domain); p != "" || len(domain) != linkdomain.MaxLength {
		t.Fatalf("test domain of %d characters: %s", len(domain), p)
	}
	links := make([]*analyticsv1.LinkRef, MaxCountsLinks)
	for i := range links {
		links[i] = &analyticsv1.LinkRef{Code: fmt.Sprintf("%s%04d", strings.Repeat("c", 28), i), Domain: domain}
	}
	last := links[len(links)-1]
	if err := store.Insert(context.Background(), []clickstore.Click{{Tenant: tenant, Code: linkdomain.Key(domain, last.GetCode()),
		Time: day0.Add(time.Hour), EventID: rnd(), Visitor: "v", NewVisitor: true}}); err != nil {
		t.Fatal(err)
	}
	svc := New(store, servertest.Logger(t), Options{})
	resp, err := svc.GetLinksClickCounts(as(tenant), &analyticsv1.GetLinksClickCountsRequest{
		Links: links, StartTime: ts(day0), EndTime: ts(day0.Add(24 * time.Hour))})
	if err != nil {
		t.Fatal(err)
	}
	if got := resp.GetLinks(); len(got) != MaxCountsLinks || got[len(got)-1].GetCounts().GetTotal() != 1 || got[0].GetCounts().GetTotal() != 0 {
		t.Errorf("%d links answered; want %d, the last with its click", len(got), MaxCountsLinks)
	}
}

func TestLinksClickCountsValidation(t *testing.T) {
	t.Parallel()
	svc := New(newStore(t, ""), servertest.Logger(t), Options{})
	now := time.Now()
	tooMany := make([]*analyticsv1.LinkRef, MaxCountsLinks+1)
	for i := range tooMany {
		tooMany[i] = &analyticsv1.LinkRef{Code: "abcd"} // one link, named too often: still refused
	}
	tests := map[string]struct {
		req       *analyticsv1.GetLinksClickCountsRequest
		field     string
		wantInMsg string
	}{
		"no links":         {&analyticsv1.GetLinksClickCountsRequest{}, "links", "name 1 to 1000"},
		"too many links":   {&analyticsv1.GetLinksClickCountsRequest{Links: tooMany}, "links", "names 1001 links; name 1 to 1000"},
		"a code too short": {&analyticsv1.GetLinksClickCountsRequest{Links: []*analyticsv1.LinkRef{{Code: "abcd"}, {Code: "ab"}}}, "links[1].code", "4 to 32 characters"},
		"a bad domain": {&analyticsv1.GetLinksClickCountsRequest{Links: []*analyticsv1.LinkRef{{Code: "abcd", Domain: "no_domain"}}},
			"links[0].domain", "links[0].domain: "},
		"range too long": {&analyticsv1.GetLinksClickCountsRequest{Links: []*analyticsv1.LinkRef{{Code: "abcd"}}, StartTime: ts(now.Add(-401 * 24 * time.Hour))},
			"start_time", "at most 400"},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			_, err := svc.GetLinksClickCounts(as("t-"+rnd()), tc.req)
			wantBadRequest(t, err, tc.field, tc.wantInMsg)
		})
	}
	if _, err := svc.GetLinksClickCounts(context.Background(), &analyticsv1.GetLinksClickCountsRequest{
		Links: []*analyticsv1.LinkRef{{Code: "abcd"}}}); status.Code(err) != codes.Unauthenticated {
		t.Errorf("no tenant: %v, want Unauthenticated", err)
	}
}

// The tenant is the assertion's bytes, whatever they are, and the counts
// query writes it as a literal: a tenant whose name would end the literal
// (a quote, a backslash, a NUL, bytes that are not UTF-8) counts its own
// clicks of a code, not another tenant's of it.
func TestLinksClickCountsOfTenantsWithAnyName(t *testing.T) {
	t.Parallel()
	store := newStore(t, "")
	svc := New(store, servertest.Logger(t), Options{})
	base, code := "odd-"+rnd(), "odd"+rnd()
	click := func(tenant string) clickstore.Click {
		return clickstore.Click{Tenant: tenant, Code: code, Time: day0.Add(time.Hour), EventID: rnd(), Visitor: "v"}
	}
	if err := store.Insert(context.Background(), []clickstore.Click{click(base), click(base)}); err != nil {
		t.Fatal(err)
	}
	for _, tenant := range []string{
		base + `' OR tenant != '`, base + `\' OR 1 = 1 -- `, base + `\`, base + "\x00' OR 1 --", base + "\xff'\xfe",
		base + "?", base + "\n'; SELECT 1 --", base + `\x27 OR 1`,
	} {
		if err := store.Insert(context.Background(), []clickstore.Click{click(tenant)}); err != nil {
			t.Fatal(err)
		}
		resp, err := svc.GetLinksClickCounts(as(tenant), &analyticsv1.GetLinksClickCountsRequest{
			Links: []*analyticsv1.LinkRef{{Code: code}}, StartTime: ts(day0), EndTime: ts(day0.Add(24 * time.Hour))})
		if err != nil {
			t.Errorf("tenant %q: %v", tenant, err)
			continue
		}
		if got := resp.GetLinks()[0].GetCounts().GetTotal(); got != 1 {
			t.Errorf("tenant %q: %d clicks, want its own 1 (another tenant has 2)", tenant, got)
		}
	}
}
