//go:build integration

package clickstore

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/ClickHouse/clickhouse-go/v2"
)

// Duplicates finds exactly the events stored more than once, with every
// copy's flags and the event's fields, among many suspect rows that
// duplicate nothing (a Redis master without its replica stores every click
// as suspect), and more duplicates than one query of their details takes.
// ClickHouse may use 32 MiB for each query (the lookup takes under 24): the
// fields it groups must be the duplicates', not every suspect's (that took
// more than 54 MiB for these).
func TestDuplicatesAmongManySuspectsAreExact(t *testing.T) {
	const suspects, duplicated = 100_000, duplicatesChunk + 200
	s := appliedStore(t)
	tenant, code := "many-"+rnd(), "many"+rnd()
	start := time.Date(2025, 7, 1, 0, 0, 0, 0, time.UTC)
	click := func(i int, id string) Click {
		return Click{Tenant: tenant, Code: code, Time: start.Add(time.Duration(i) * time.Second), EventID: id,
			Visitor: fmt.Sprintf("visitor-%d", i), ReferrerHost: fmt.Sprintf("referrer-%d.example.com", i%5000),
			Browser: "Chrome", OS: "Linux", Device: "desktop", Country: "DE", Rule: "rule-de", Variant: "variant-b",
			UserAgent: "Mozilla/5.0 (X11; Linux x86_64) AppleWebKit/537.36 (KHTML, like Gecko) Chrome/120.0 Safari/537.36",
			Suspect:   true}
	}
	var rows []Click
	for i := range suspects {
		rows = append(rows, click(i, fmt.Sprintf("single-%s-%d", code, i)))
	}
	// Every 50th second also has an event stored twice, its first copy
	// not suspect, its second a flood; every third of them a third copy,
	// a bot.
	want := make(map[uint64]Click)
	copies := make(map[uint64]int)
	for j := range duplicated {
		i := j * 50
		first := click(i, fmt.Sprintf("dup-%s-%d", code, j))
		first.Suspect, first.NewVisitor = false, true
		second := first
		second.Suspect, second.Flood, second.NewVisitor = true, true, false
		rows = append(rows, first, second)
		copies[EID(first.EventID)] = 2
		if j%3 == 0 {
			third := second
			third.Bot, third.Flood = true, false
			rows = append(rows, third)
			copies[EID(first.EventID)] = 3
		}
		want[EID(first.EventID)] = first
	}
	ctx := context.Background()
	if err := s.Insert(ctx, rows); err != nil {
		t.Fatal(err)
	}

	limited := clickhouse.Context(ctx, clickhouse.WithSettings(clickhouse.Settings{"max_memory_usage": 32 << 20}))
	got, err := s.Duplicates(limited, Range{Tenant: tenant, Code: code, Start: start, End: start.Add(48 * time.Hour)})
	if err != nil {
		t.Fatalf("Duplicates: %v", err)
	}
	if len(got) != duplicated {
		t.Errorf("%d duplicates found, want %d", len(got), duplicated)
	}
	for _, d := range got {
		w, ok := want[d.EID]
		if !ok {
			t.Errorf("eid %d found duplicated, stored once", d.EID)
			continue
		}
		delete(want, d.EID)
		if d.Hour != w.Time.Unix()/3600*3600 || d.ReferrerHost != w.ReferrerHost || d.Browser != w.Browser ||
			d.Country != w.Country || d.Rule != w.Rule || d.Variant != w.Variant {
			t.Errorf("duplicate %+v, want the fields of %+v", d, w)
		}
		human, flood, bot := 0, 0, 0
		for _, f := range d.Copies {
			switch {
			case f.Bot:
				bot++
			case f.Flood:
				flood++
			default:
				human++
			}
		}
		if n := copies[d.EID]; len(d.Copies) != n || human != 1 || flood != 1 || bot != n-2 {
			t.Errorf("eid %d: copies %+v, want %d: one human, one flood, %d bot", d.EID, d.Copies, n, n-2)
		}
	}
	if len(want) > 0 {
		t.Errorf("%d duplicated events not found", len(want))
	}
}
