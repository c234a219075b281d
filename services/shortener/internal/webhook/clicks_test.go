package webhook

import (
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"kurz.dev/pkg/clickevent"
)

// click is a stream entry of one click of tenant's code at t.
func click(id, tenant, code string, t time.Time) redis.XMessage {
	vals := clickevent.Event{ID: clickevent.NewID(t), Code: code, Tenant: tenant, Time: t}.Values()
	m := map[string]any{}
	for i := 0; i < len(vals); i += 2 {
		m[vals[i]] = vals[i+1]
	}
	return redis.XMessage{ID: id, Values: m}
}

// TestClickBatchWaitsAnIntervalFromItsFirstClick: the batch's interval ran
// from its creation (the last flush), so after a quiet spell the first
// read flushed at once and a link's clicks of a few seconds came as two
// link.clicked events. It runs from the first click now.
func TestClickBatchWaitsAnIntervalFromItsFirstClick(t *testing.T) {
	const interval = time.Minute
	tenants := map[string]bool{"acme": true}
	b := newClickBatch()
	created := time.Now()
	if b.due(created.Add(10*interval), interval) {
		t.Fatal("an empty batch is due")
	}
	first := created.Add(10 * interval) // after a quiet spell
	b.add("clicks:{0}", []redis.XMessage{click("1-0", "acme", "abc", first)}, tenants, first)
	if b.due(first.Add(400*time.Millisecond), interval) {
		t.Fatal("the batch is due 0.4 s after its first click, want an interval after it")
	}
	later := first.Add(interval / 2)
	b.add("clicks:{0}", []redis.XMessage{click("2-0", "acme", "abc", later)}, tenants, later)
	if b.due(first.Add(interval-time.Millisecond), interval) {
		t.Fatal("the batch is due before an interval has passed since its first click")
	}
	if !b.due(first.Add(interval), interval) {
		t.Fatal("the batch is not due an interval after its first click")
	}
	if c := b.links[linkKey{"acme", "abc"}]; c == nil || c.n != 2 {
		t.Fatalf("the link's count is %+v, want its 2 clicks in one batch", c)
	}
}
