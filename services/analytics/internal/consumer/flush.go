package consumer

import (
	"cmp"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/fnv"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"

	"kurz.dev/pkg/clickevent"
	"kurz.dev/pkg/quota"
	"kurz.dev/services/analytics/internal/clickstore"
	"kurz.dev/services/analytics/internal/useragent"
)

// row is one event on its way to ClickHouse.
type row struct {
	click clickstore.Click
	e     *entry
	// check: the raw table may hold this event already; look before
	// inserting. (click.Suspect says whether an insert may duplicate a
	// row that the lookup cannot see yet: see clickstore.)
	check bool
}

// poisoned is an entry that cannot be stored, with the reason.
type poisoned struct {
	e      *entry
	reason string
	kind   string // metric attribute: unparseable, deliveries
}

// work is one batch in flight.
type work struct {
	entries []entry
	rows    []*row
	poison  []poisoned
	flooded bool // flood checks done (they consume quota: never twice)
	visited bool // first-visit marks done
	// answered: the last insert failed with ClickHouse's own error, so
	// rows found stored were kept by a failed insert (clickstore.Answered).
	answered bool
	// links point at the redirect spans of the batch's clicks.
	links []trace.Link
}

// maxLinks caps the span links of one batch (the SDK's default limit).
const maxLinks = 128

// linkTo turns an event's W3C traceparent into a span link.
func linkTo(traceparent string) (trace.Link, bool) {
	if traceparent == "" {
		return trace.Link{}, false
	}
	ctx := propagation.TraceContext{}.Extract(context.Background(), propagation.MapCarrier{"traceparent": traceparent})
	sc := trace.SpanContextFromContext(ctx)
	return trace.Link{SpanContext: sc}, sc.IsValid()
}

// Earliest and latest click times the raw table takes (DateTime is a
// 32-bit Unix time; a click from before 2000 or from far ahead is garbage).
var (
	minClickTime = time.Date(2000, 1, 1, 0, 0, 0, 0, time.UTC)
	maxFuture    = 24 * time.Hour
)

// prepare parses and classifies the entries, sets poison aside, and drops
// repeats of an event within the batch.
func (c *Consumer) prepare(es []entry) *work {
	w := &work{entries: es, rows: make([]*row, 0, len(es))}
	seen := make(map[string]bool, len(es))
	// One allocation for the batch's rows (never grown: w.rows points into
	// it), and the classification of each distinct User-Agent and referrer
	// once per batch: the same few recur in thousands of clicks.
	slab := make([]row, 0, len(es))
	uas := make(map[string]useragent.Class)
	hosts := make(map[string]string)
	now := time.Now()
	for i := range es {
		e := &es[i]
		if e.values == nil {
			// A pending entry trimmed by MAXLEN (read back from the pending
			// list): the click is lost; the dead letter records which.
			c.m.trimmed(1)
			w.poison = append(w.poison, poisoned{e, "entry trimmed from the stream before it was stored", "trimmed"})
			continue
		}
		ev, err := clickevent.Parse(e.values)
		switch {
		case err != nil:
			w.poison = append(w.poison, poisoned{e, err.Error(), "unparseable"})
			continue
		case ev.Tenant == "":
			w.poison = append(w.poison, poisoned{e, "clickevent: tenant is required", "unparseable"})
			continue
		case ev.Time.Before(minClickTime) || ev.Time.After(now.Add(maxFuture)):
			w.poison = append(w.poison, poisoned{e, fmt.Sprintf("clickevent: time %s out of range", ev.Time.UTC().Format(time.RFC3339)), "unparseable"})
			continue
		}
		if seen[ev.ID] {
			c.m.skipped("in_batch", 1)
			continue
		}
		seen[ev.ID] = true
		if len(w.links) < maxLinks {
			if l, ok := linkTo(ev.TraceParent); ok {
				w.links = append(w.links, l)
			}
		}
		ua, ok := uas[ev.UserAgent]
		if !ok {
			ua = useragent.Classify(ev.UserAgent)
			uas[ev.UserAgent] = ua
		}
		host, ok := hosts[ev.Referrer]
		if !ok {
			host = useragent.ReferrerHost(ev.Referrer)
			hosts[ev.Referrer] = host
		}
		slab = append(slab, row{
			e: e,
			// A redelivered entry may be stored already (by its previous
			// consumer, possibly right now: it is suspect). An entry read
			// long ago may have been claimed and stored by another consumer
			// meanwhile: look, but that consumer's copy is the suspect one.
			check: e.redelivered || now.Sub(e.readAt) > c.opts.ClaimIdle/2,
			click: clickstore.Click{
				Tenant: ev.Tenant, Code: ev.Code, Time: ev.Time.UTC().Truncate(time.Second), EventID: ev.ID,
				Visitor: ev.Visitor, Referrer: ev.Referrer, ReferrerHost: host,
				UserAgent: ev.UserAgent, Browser: ua.Browser, OS: ua.OS, Device: ua.Device, Bot: ua.Bot,
				Country: ev.Country, Suspect: e.redelivered || e.unreplicated, Rule: ev.Rule, Variant: ev.Variant,
			},
		})
		w.rows = append(w.rows, &slab[len(slab)-1])
	}
	return w
}

// flush stores one batch and acknowledges it, retrying with backoff until it
// succeeds or ctx (the hard context) ends. Nothing is acknowledged before
// ClickHouse accepted the rows.
func (c *Consumer) flush(ctx context.Context, es []entry) {
	if len(es) == 0 {
		return
	}
	start := time.Now()
	w := c.prepare(es)
	// One span per batch, linked to each click's redirect span: the trace
	// of a redirect leads to the batch that stored its click.
	ctx, span := c.tracer.Start(ctx, "clicks.flush",
		trace.WithSpanKind(trace.SpanKindConsumer), trace.WithLinks(w.links...),
		trace.WithAttributes(attribute.Int("kurz.batch.entries", len(es)), attribute.Int("kurz.batch.rows", len(w.rows))))
	defer span.End()
	bo := c.backoff()
	var renewed time.Time // the entries may have waited already: renew at the first retry
	for attempt := 0; ; attempt++ {
		if attempt > 0 {
			wait := bo.next()
			if c.opts.hooks.retry != nil {
				c.opts.hooks.retry(attempt, wait)
			}
			if !sleep(ctx, wait) {
				return
			}
			// Keep the batch's entries ours while we retry: a claim by
			// another consumer would count a delivery and race us.
			if time.Since(renewed) > c.opts.ClaimIdle/3 {
				c.renew(ctx, es)
				renewed = time.Now()
			}
		}
		stage, err := c.store1(ctx, w)
		if err != nil {
			if errors.Is(err, redis.ErrClosed) || ctx.Err() != nil {
				return
			}
			c.failed(stage, err)
			continue
		}
		c.succeeded()
		break
	}
	bo.reset()
	for {
		err := c.ack(ctx, es)
		if err == nil {
			break
		}
		if errors.Is(err, redis.ErrClosed) || ctx.Err() != nil {
			return
		}
		wait := bo.next()
		c.log.Warn("click stream ack failed; retrying", "entries", len(es), "retry_in", wait, "err", err)
		if !sleep(ctx, wait) {
			return
		}
	}
	c.m.flushed(len(es), len(w.rows), time.Since(start))
}

// store1 is one attempt at storing w: dead letters, duplicate lookups,
// classification, the insert. It returns the failed stage.
func (c *Consumer) store1(ctx context.Context, w *work) (string, error) {
	if len(w.poison) > 0 {
		if err := c.deadLetter(ctx, w.poison); err != nil {
			return "dead_letter", err
		}
		w.poison = nil
	}
	if err := c.dropExisting(ctx, w); err != nil {
		return "lookup", err
	}
	if !w.flooded {
		c.judgeFloods(ctx, w.rows)
		w.flooded = true
	}
	if !w.visited {
		if err := c.markVisitors(ctx, w.rows); err != nil {
			return "visitors", err
		}
		w.visited = true
	}
	clicks := make([]clickstore.Click, len(w.rows))
	for i, r := range w.rows {
		clicks[i] = r.click
	}
	if h := c.opts.hooks.beforeInsert; h != nil {
		h(ctx, len(clicks))
	}
	ictx, cancel := context.WithTimeout(ctx, c.opts.InsertTimeout)
	err := c.store.Insert(ictx, clicks)
	cancel()
	w.answered = clickstore.Answered(err)
	if err != nil {
		if !errors.Is(err, clickstore.ErrNotSent) {
			// ClickHouse may have stored them, or may yet: look next
			// time, and mark the new copies.
			for _, r := range w.rows {
				r.check, r.click.Suspect = true, true
			}
		}
		return "insert", err
	}
	if h := c.opts.hooks.afterInsert; h != nil {
		h(ctx, len(clicks))
	}
	return "", nil
}

// dropExisting removes the rows to check that ClickHouse already holds.
func (c *Consumer) dropExisting(ctx context.Context, w *work) error {
	var check []clickstore.Click
	for _, r := range w.rows {
		if r.check {
			check = append(check, r.click)
		}
	}
	if len(check) == 0 {
		return nil
	}
	lctx, cancel := context.WithTimeout(ctx, c.opts.InsertTimeout)
	found, err := c.store.Existing(lctx, check)
	cancel()
	if err != nil {
		return err
	}
	kept := w.rows[:0]
	for _, r := range w.rows {
		if r.check && found[r.click.EventID] {
			continue
		}
		r.check = false
		kept = append(kept, r)
	}
	if n := len(w.rows) - len(kept); n > 0 && w.answered {
		// Not sent again (the raw table would hold them twice, which the
		// queries cannot tell from a view's count), but likely missing
		// from the hourly and breakdown aggregates: say so, loudly.
		c.m.skipped("kept_by_failed_insert", n)
		c.log.Error("ClickHouse kept rows of an insert it refused; the statistics of their links may not count them",
			"rows", n, "batch", len(w.rows))
	} else if n > 0 {
		c.m.skipped("stored", n)
	}
	clear(w.rows[len(kept):])
	w.rows = kept
	return nil
}

// FloodChecksPerCall is how many (code, visitor) flood checks one
// CheckQuotas call carries.
const FloodChecksPerCall = 100

// floodRounds bounds how often a group is asked again after a denial.
const floodRounds = 4

// judgeFloods asks the limiter about every non-bot click, grouped per
// (code, visitor): one check of cost n for n clicks of a visitor in the
// batch, FloodChecksPerCall checks per CheckQuotas call. Within a group the
// earliest clicks are the allowed ones. A denial consumes nothing, so a
// denied group is asked again for the headroom the limiter reported (up to
// floodRounds times). A limiter that does not answer leaves the clicks
// unflagged, counted as degraded.
func (c *Consumer) judgeFloods(ctx context.Context, rows []*row) {
	type key struct{ code, visitor string }
	index := make(map[key]int)
	var groups []*floodGroup
	for _, r := range rows {
		if r.click.Bot || r.click.Visitor == "" {
			continue
		}
		k := key{r.click.Code, r.click.Visitor}
		i, ok := index[k]
		if !ok {
			i = len(groups)
			index[k] = i
			groups = append(groups, &floodGroup{})
		}
		groups[i].rows = append(groups[i].rows, r)
	}
	for _, g := range groups {
		slices.SortFunc(g.rows, func(a, b *row) int {
			return cmp.Or(a.click.Time.Compare(b.click.Time), cmp.Compare(a.e.id, b.e.id))
		})
		g.cost = len(g.rows)
	}
	pending := groups
	for range floodRounds {
		if len(pending) == 0 {
			break
		}
		c.askFloods(ctx, pending)
		var again []*floodGroup
		for _, g := range pending {
			if !g.done {
				again = append(again, g)
			}
		}
		pending = again
	}
	for _, g := range groups {
		if g.degraded {
			// The limiter checked nothing, but whatever it knew of the
			// visitor it would not have let more than its limit of one
			// check through: the earliest that many stay unflagged,
			// unchecked; the rest are a flood, not a batch of humans.
			if limit := int(c.floodLimit.Load()); limit > 0 && g.allowed > limit {
				g.allowed = limit
			}
			c.m.degraded(g.allowed)
		}
		for _, r := range g.rows[g.allowed:] {
			r.click.Flood = true
		}
		if n := len(g.rows) - g.allowed; n > 0 {
			c.m.floods(n)
		}
	}
}

// floodGroup is the clicks of one (code, visitor) in a batch and what the
// limiter has said of them so far.
type floodGroup struct {
	rows     []*row
	cost     int  // what to ask for next
	allowed  int  // clicks the rule allows, the earliest ones
	done     bool // no more asking
	degraded bool // the limiter did not answer: all allowed, unflagged
}

// askFloods asks the limiter about each group's cost, FloodChecksPerCall
// groups per call with up to FloodParallelism calls at once as the
// consumer's pacer allows (over all its batches), and records the
// answers: allowed (done), degraded (done), or denied with the headroom to
// ask for next (done when there is none).
func (c *Consumer) askFloods(ctx context.Context, groups []*floodGroup) {
	var next atomic.Int64
	// unanswered is set once a call got no answer at all (the limiter down
	// or hung): the batch's other checks are degraded without waiting out
	// a deadline each.
	var unanswered atomic.Bool
	calls := (len(groups) + FloodChecksPerCall - 1) / FloodChecksPerCall
	var wg sync.WaitGroup
	for range min(c.opts.FloodParallelism, calls) {
		wg.Go(func() {
			for {
				start := int(next.Add(1)-1) * FloodChecksPerCall
				if start >= len(groups) {
					return
				}
				chunk := groups[start:min(start+FloodChecksPerCall, len(groups))]
				skip := unanswered.Load() || c.pace.acquire(ctx) != nil
				if !skip && unanswered.Load() { // set while this call waited
					c.pace.release(false)
					skip = true
				}
				if skip {
					for _, g := range chunk {
						g.answer(quota.Decision{Allowed: true, Degraded: true})
					}
					continue
				}
				reqs := make([]quota.Request, len(chunk))
				for i, g := range chunk {
					first := g.rows[0].click
					reqs[i] = quota.Request{Domain: FloodDomain, Descriptors: map[string]string{"code": first.Code, "visitor": first.Visitor}, Cost: uint32(g.cost)}
				}
				decided, answered := true, false
				for i, d := range c.quota.CheckMany(ctx, reqs, quota.FailOpen) {
					decided = decided && !d.Unchecked()
					answered = answered || !d.Degraded
					if !d.Degraded && d.Limit > 0 && d.Limit != c.floodLimit.Load() {
						c.floodLimit.Store(d.Limit)
					}
					chunk[i].answer(d)
				}
				if !answered {
					unanswered.Store(true) // before release: a waiter sees it
				}
				c.pace.release(decided)
			}
		})
	}
	wg.Wait()
}

// answer records one limiter decision about the group's current cost. An
// answer the limiter gave by the rule's failure mode (its Redis was slow or
// down) checked nothing: the group is degraded, as when no answer came.
func (g *floodGroup) answer(d quota.Decision) {
	switch {
	case d.Unchecked():
		g.allowed, g.degraded, g.done = len(g.rows), true, true
	case d.Allowed:
		g.allowed, g.done = g.cost, true
	default:
		g.cost = min(int(d.Remaining), g.cost-1)
		g.done = g.cost <= 0
	}
}

// visitorScript records the first event of each visitor in one link's
// visitor-day hash and says, for each pair, whether the given event is that
// first one. Idempotent: the same event always gets the same answer, so a
// retry or a redelivery cannot count a visitor twice, and two consumers
// racing agree on one first event.
//
// KEYS[1] the (tenant, code, UTC day) hash; ARGV[1] its expiry, Unix ms;
// ARGV[2k], ARGV[2k+1] visitor hash, event EID (8 bytes each). Returns 1
// or 0 per pair.
var visitorScript = redis.NewScript(`
local out = {}
for i = 2, #ARGV, 2 do
  redis.call('HSETNX', KEYS[1], ARGV[i], ARGV[i + 1])
  if redis.call('HGET', KEYS[1], ARGV[i]) == ARGV[i + 1] then
    out[#out + 1] = 1
  else
    out[#out + 1] = 0
  end
end
redis.call('PEXPIREAT', KEYS[1], ARGV[1])
return out
`)

// visitorKeep is how long after its UTC day ends a visitor-day hash lives:
// events arriving later than that (a backlog over two days old) would count
// their visitor again.
const visitorKeep = 48 * time.Hour

// visitorsPerCall bounds the pairs of one script call.
const visitorsPerCall = 500

// markVisitors sets NewVisitor on each human click that is its visitor's
// first of the UTC day on its link.
func (c *Consumer) markVisitors(ctx context.Context, rows []*row) error {
	type call struct {
		key  string
		args []any
		rows []*row
		cmd  *redis.Cmd
	}
	byKey := make(map[string][]*call)
	var calls []*call
	now := time.Now()
	for _, r := range rows {
		cl := &r.click
		cl.NewVisitor = false
		if cl.Bot || cl.Flood || cl.Visitor == "" {
			continue
		}
		day := cl.Time.UTC().Truncate(24 * time.Hour)
		h := fnv.New64a()
		_, _ = fmt.Fprintf(h, "%s\x00%s\x00%d", cl.Tenant, cl.Code, day.Unix())
		key := fmt.Sprintf("%s-visitors:{%016x}", c.opts.StreamPrefix, h.Sum64())
		cs := byKey[key]
		if len(cs) == 0 || len(cs[len(cs)-1].rows) == visitorsPerCall {
			expire := max(day.Add(24*time.Hour+visitorKeep).UnixMilli(), now.Add(time.Hour).UnixMilli())
			cs = append(cs, &call{key: key, args: []any{expire}})
			byKey[key] = cs
			calls = append(calls, cs[len(cs)-1])
		}
		last := cs[len(cs)-1]
		// 8 bytes each: a 64-bit hash of the visitor (a collision within
		// one link-day is negligible) and the event's EID.
		last.args = append(last.args, string(binary.BigEndian.AppendUint64(nil, clickstore.EID(cl.Visitor))),
			string(binary.BigEndian.AppendUint64(nil, clickstore.EID(cl.EventID))))
		last.rows = append(last.rows, r)
	}
	if len(calls) == 0 {
		return nil
	}
	rctx, cancel := context.WithTimeout(ctx, c.opts.InsertTimeout)
	defer cancel()
	pipe := c.rdb.Pipeline()
	for _, cl := range calls {
		cl.cmd = visitorScript.EvalSha(rctx, pipe, []string{cl.key}, cl.args...)
	}
	_, _ = pipe.Exec(rctx) // errors are per command, below
	for _, cl := range calls {
		if err := cl.cmd.Err(); err != nil && redis.HasErrorPrefix(err, "NOSCRIPT") {
			cl.cmd = visitorScript.Run(rctx, c.rdb, []string{cl.key}, cl.args...)
		}
		flags, err := cl.cmd.Int64Slice()
		if err != nil {
			return fmt.Errorf("redis first-visit marks: %w", err)
		}
		if len(flags) != len(cl.rows) {
			return fmt.Errorf("redis first-visit marks: %d answers for %d visitors", len(flags), len(cl.rows))
		}
		for i, r := range cl.rows {
			r.click.NewVisitor = flags[i] == 1
		}
	}
	return nil
}

// ack acknowledges entries, per shard.
func (c *Consumer) ack(ctx context.Context, es []entry) error {
	ids := make([][]string, len(c.keys))
	for _, e := range es {
		ids[e.shard] = append(ids[e.shard], e.id)
	}
	actx, cancel := context.WithTimeout(ctx, c.opts.InsertTimeout)
	defer cancel()
	pipe := c.rdb.Pipeline()
	for shard, list := range ids {
		for start := 0; start < len(list); start += 1000 {
			pipe.XAck(actx, c.keys[shard], c.opts.Group, list[start:min(start+1000, len(list))]...)
		}
	}
	if _, err := pipe.Exec(actx); err != nil {
		return fmt.Errorf("redis xack: %w", err)
	}
	return nil
}

// renew resets the idle time of entries this consumer still works on, so
// no other consumer claims them (XCLAIM JUSTID does not count a delivery).
func (c *Consumer) renew(ctx context.Context, es []entry) {
	ids := make([][]string, len(c.keys))
	for _, e := range es {
		ids[e.shard] = append(ids[e.shard], e.id)
	}
	rctx, cancel := context.WithTimeout(ctx, c.opts.InsertTimeout)
	defer cancel()
	pipe := c.rdb.Pipeline()
	for shard, list := range ids {
		for start := 0; start < len(list); start += 1000 {
			pipe.XClaimJustID(rctx, &redis.XClaimArgs{Stream: c.keys[shard], Group: c.opts.Group,
				Consumer: c.opts.Name, Messages: list[start:min(start+1000, len(list))]})
		}
	}
	if _, err := pipe.Exec(rctx); err != nil {
		c.log.Warn("click stream lease renewal failed", "err", err)
	}
}
