//go:build integration

package clickstore

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"
)

// LinkCounts' duplicate correction groups a page's duplicated events by
// link and event: keyed by the link's text (up to 300 bytes on a custom
// domain of the longest name), 100,000 of them took over 80 MiB, and a
// million failed at ClickHouse's 1 GB for one query. The read must fit
// 100,000 in 64 MiB and still count each event once.
func TestLinkCountsOfManyDuplicatesFitTheirMemory(t *testing.T) {
	const links, events = 1000, 100_000
	s := appliedStore(t)
	s.linkCountsMemory = 64 << 20
	tenant := "lcmem-" + rnd()
	label := strings.Repeat("d", 63)
	domain := label + "." + label + "." + label + "." + strings.Repeat("e", 58) + ".io"
	keys := make([]string, links)
	for i := range keys {
		keys[i] = fmt.Sprintf("%s/%s%04d", domain, strings.Repeat("c", 28), i)
	}
	start := time.Date(2025, 8, 1, 0, 0, 0, 0, time.UTC)
	// Every event stored twice, both copies suspect: a Redis master
	// without its replica, and a consumer's redelivery.
	ctx := context.Background()
	for from := 0; from < events; from += 10_000 {
		rows := make([]Click, 0, 20_000)
		for i := from; i < from+10_000; i++ {
			c := Click{Tenant: tenant, Code: keys[i%links], Time: start.Add(time.Duration(i/100) * time.Second),
				EventID: fmt.Sprintf("e%d", i), Visitor: "v", NewVisitor: true, Suspect: true}
			rows = append(rows, c, c)
		}
		if err := s.Insert(ctx, rows); err != nil {
			t.Fatal(err)
		}
	}
	got, err := s.LinkCounts(ctx, tenant, keys, start, start.Add(24*time.Hour))
	if err != nil {
		t.Fatalf("LinkCounts of %d duplicated events on %d links: %v", events, links, err)
	}
	for _, k := range []string{keys[0], keys[links-1]} {
		if c := got[k]; c != (Counts{Total: events / links, Human: events / links, Visitors: events / links}) {
			t.Errorf("%s…: %+v, want each of its %d events once", k[:20], c, events/links)
		}
	}
	if len(got) != links {
		t.Errorf("%d links counted, want %d", len(got), links)
	}
}
