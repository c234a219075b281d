//go:build integration

package stats

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/ClickHouse/clickhouse-go/v2/lib/driver"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/timestamppb"

	analyticsv1 "kurz.dev/gen/kurz/analytics/v1"
	"kurz.dev/pkg/callmeta"
	"kurz.dev/pkg/chconn"
	"kurz.dev/pkg/config"
	"kurz.dev/pkg/testkit/servertest"
	"kurz.dev/services/analytics/internal/clickstore"
)

func newStore(t testing.TB, database string) *clickstore.Store {
	t.Helper()
	ch, l := connect(t, database)
	if err := clickstore.Apply(context.Background(), ch, l); err != nil {
		t.Fatal(err)
	}
	return clickstore.New(ch, l)
}

// connect opens the test ClickHouse, on database if set (created if
// missing), and the tables' layout there.
func connect(t testing.TB, database string) (driver.Conn, clickstore.Layout) {
	t.Helper()
	var cfg struct{ ClickHouse chconn.Config }
	if err := config.LoadFrom(servertest.Env(nil), &cfg); err != nil {
		t.Fatal(err)
	}
	if database != "" {
		cfg.ClickHouse.Database = database
	}
	ch, err := chconn.New(context.Background(), cfg.ClickHouse)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = ch.Close() })
	return ch, clickstore.LayoutOf(cfg.ClickHouse)
}

func rnd() string {
	var b [6]byte
	_, _ = rand.Read(b[:])
	return hex.EncodeToString(b[:])
}

func as(tenant string) context.Context {
	if tenant == "" {
		return context.Background()
	}
	return callmeta.WithVerifiedTenant(context.Background(), tenant)
}

func ts(t time.Time) *timestamppb.Timestamp { return timestamppb.New(t) }

// day0 is a fixed UTC midnight the tests put their clicks on.
var day0 = time.Date(2025, 3, 10, 0, 0, 0, 0, time.UTC)

func TestTenantScoping(t *testing.T) {
	t.Parallel()
	store := newStore(t, "")
	owner, other, code, unused := "own-"+rnd(), "other-"+rnd(), "scope"+rnd(), "never"+rnd()
	err := store.Insert(context.Background(), []clickstore.Click{
		{Tenant: owner, Code: code, Time: day0.Add(time.Hour), EventID: rnd(), Visitor: "v1", NewVisitor: true},
		{Tenant: owner, Code: code, Time: day0.Add(2 * time.Hour), EventID: rnd(), Visitor: "v1"},
	})
	if err != nil {
		t.Fatal(err)
	}
	svc := New(store, servertest.Logger(t), Options{})
	anon := New(store, servertest.Logger(t), Options{AllowAnonymous: true})
	req := func(code string) *analyticsv1.GetLinkStatsRequest {
		return &analyticsv1.GetLinkStatsRequest{Code: code, StartTime: ts(day0), EndTime: ts(day0.Add(24 * time.Hour))}
	}
	tests := map[string]struct {
		svc       *Service
		tenant    string
		code      string
		want      codes.Code
		wantTotal int64
	}{
		"owner sees its clicks":                {svc, owner, code, codes.OK, 2},
		"another tenant gets not found":        {svc, other, code, codes.NotFound, 0},
		"a code without clicks answers zeros":  {svc, other, unused, codes.OK, 0},
		"no tenant is unauthenticated":         {svc, "", code, codes.Unauthenticated, 0},
		"anonymous, where allowed, is scoped":  {anon, "", code, codes.NotFound, 0},
		"anonymous sees zeros of unused codes": {anon, "", unused, codes.OK, 0},
		"an oversized tenant is refused":       {svc, strings.Repeat("t", 200), code, codes.Unauthenticated, 0},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			resp, err := tc.svc.GetLinkStats(as(tc.tenant), req(tc.code))
			if got := status.Code(err); got != tc.want {
				t.Fatalf("code %v (%v), want %v", got, err, tc.want)
			}
			if err != nil {
				if strings.Contains(status.Convert(err).Message(), owner) {
					t.Errorf("error %q names the owner", err)
				}
				return
			}
			if got := resp.GetCounts().GetTotal(); got != tc.wantTotal {
				t.Errorf("total %d, want %d", got, tc.wantTotal)
			}
			if got := len(resp.GetSeries()); got != 24 {
				t.Errorf("%d buckets, want 24 hourly buckets", got)
			}
		})
	}
}

func TestValidation(t *testing.T) {
	t.Parallel()
	svc := New(newStore(t, ""), servertest.Logger(t), Options{})
	now := time.Now()
	wrap := time.Duration(1<<32) * time.Second // what ClickHouse's toDateTime takes times modulo
	tests := map[string]struct {
		req       *analyticsv1.GetLinkStatsRequest
		field     string
		wantInMsg string
	}{
		"empty code":       {&analyticsv1.GetLinkStatsRequest{}, "code", "not a short code"},
		"code too short":   {&analyticsv1.GetLinkStatsRequest{Code: "ab"}, "code", "4 to 32 characters"},
		"code with slash":  {&analyticsv1.GetLinkStatsRequest{Code: "abc/def"}, "code", "letters, digits"},
		"end before start": {&analyticsv1.GetLinkStatsRequest{Code: "abcd", StartTime: ts(now), EndTime: ts(now.Add(-time.Hour))}, "end_time", "must be after start_time"},
		"empty range":      {&analyticsv1.GetLinkStatsRequest{Code: "abcd", StartTime: ts(now), EndTime: ts(now)}, "end_time", "must be after start_time"},
		"range too long": {&analyticsv1.GetLinkStatsRequest{Code: "abcd", StartTime: ts(now.Add(-401 * 24 * time.Hour))},
			"start_time", "at most 400"},
		"hourly too long": {&analyticsv1.GetLinkStatsRequest{Code: "abcd", StartTime: ts(now.Add(-40 * 24 * time.Hour)), Interval: analyticsv1.Interval_INTERVAL_HOUR},
			"interval", "use INTERVAL_DAY"},
		"hourly an hour too long": {&analyticsv1.GetLinkStatsRequest{Code: "abcd", StartTime: ts(now.Add(-(31*24 + 1) * time.Hour)), EndTime: ts(now), Interval: analyticsv1.Interval_INTERVAL_HOUR},
			"interval", "at most 31 days and this range spans 31 days 1 hour"},
		"range an hour too long": {&analyticsv1.GetLinkStatsRequest{Code: "abcd", StartTime: ts(now.Add(-(400*24 + 1) * time.Hour)), EndTime: ts(now)},
			"start_time", "the range spans 400 days 1 hour; at most 400 days"},
		"unknown interval": {&analyticsv1.GetLinkStatsRequest{Code: "abcd", Interval: 7}, "interval", "unknown interval 7"},
		"bad timestamp":    {&analyticsv1.GetLinkStatsRequest{Code: "abcd", EndTime: &timestamppb.Timestamp{Nanos: -1}}, "end_time", "not a valid timestamp"},
		"range past 2106": {&analyticsv1.GetLinkStatsRequest{Code: "abcd", StartTime: ts(now.Add(wrap)), EndTime: ts(now.Add(wrap + time.Hour))},
			"end_time", "outside the times statistics cover"},
		"start before 1970": {&analyticsv1.GetLinkStatsRequest{Code: "abcd", StartTime: ts(time.Unix(-3600, 0)), EndTime: ts(time.Unix(3600, 0))},
			"start_time", "outside the times statistics cover"},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			_, err := svc.GetLinkStats(as("t-"+rnd()), tc.req)
			wantBadRequest(t, err, tc.field, tc.wantInMsg)
		})
	}
}

// wantBadRequest fails t unless err is INVALID_ARGUMENT with a message
// holding wantInMsg and a BadRequest naming field first.
func wantBadRequest(t *testing.T, err error, field, wantInMsg string) {
	t.Helper()
	st := status.Convert(err)
	if st.Code() != codes.InvalidArgument || !strings.Contains(st.Message(), wantInMsg) {
		t.Fatalf("got %v %q, want InvalidArgument containing %q", st.Code(), st.Message(), wantInMsg)
	}
	var got string
	for _, d := range st.Details() {
		if br, ok := d.(*errdetails.BadRequest); ok && len(br.GetFieldViolations()) > 0 {
			got = br.GetFieldViolations()[0].GetField()
		}
	}
	if got != field {
		t.Errorf("BadRequest field %q, want %q", got, field)
	}
}

func TestIntervalAndRange(t *testing.T) {
	t.Parallel()
	now := time.Date(2030, 1, 15, 10, 30, 0, 0, time.UTC)
	svc := New(newStore(t, ""), servertest.Logger(t), Options{})
	svc.opts.now = func() time.Time { return now }
	tests := map[string]struct {
		start, end           time.Time
		interval             analyticsv1.Interval
		wantInterval         analyticsv1.Interval
		wantStart, wantEnd   time.Time
		wantBuckets          int
		wantFirstBucketStart time.Time
	}{
		"defaults: last 30 days by day": {
			wantInterval: analyticsv1.Interval_INTERVAL_DAY,
			wantStart:    now.Add(-30 * 24 * time.Hour).Truncate(time.Hour), wantEnd: now.Truncate(time.Hour).Add(time.Hour),
			wantBuckets: 31, wantFirstBucketStart: time.Date(2029, 12, 16, 0, 0, 0, 0, time.UTC),
		},
		"48 hours: by hour": {
			start: now.Add(-48 * time.Hour), end: now, wantInterval: analyticsv1.Interval_INTERVAL_HOUR,
			wantStart: now.Add(-48 * time.Hour).Truncate(time.Hour), wantEnd: now.Truncate(time.Hour).Add(time.Hour),
			wantBuckets: 49, wantFirstBucketStart: now.Add(-48 * time.Hour).Truncate(time.Hour),
		},
		"whole hours stay as asked": {
			start: day0, end: day0.Add(48 * time.Hour), wantInterval: analyticsv1.Interval_INTERVAL_HOUR,
			wantStart: day0, wantEnd: day0.Add(48 * time.Hour), wantBuckets: 48, wantFirstBucketStart: day0,
		},
		"49 hours: by day": {
			start: day0, end: day0.Add(49 * time.Hour), wantInterval: analyticsv1.Interval_INTERVAL_DAY,
			wantStart: day0, wantEnd: day0.Add(49 * time.Hour), wantBuckets: 3, wantFirstBucketStart: day0,
		},
		"hourly on request": {
			start: day0, end: day0.Add(72 * time.Hour), interval: analyticsv1.Interval_INTERVAL_HOUR,
			wantInterval: analyticsv1.Interval_INTERVAL_HOUR, wantStart: day0, wantEnd: day0.Add(72 * time.Hour),
			wantBuckets: 72, wantFirstBucketStart: day0,
		},
		"daily on request, partial days": {
			start: day0.Add(90 * time.Minute), end: day0.Add(5 * time.Hour), interval: analyticsv1.Interval_INTERVAL_DAY,
			wantInterval: analyticsv1.Interval_INTERVAL_DAY, wantStart: day0.Add(time.Hour), wantEnd: day0.Add(5 * time.Hour),
			wantBuckets: 1, wantFirstBucketStart: day0,
		},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			req := &analyticsv1.GetLinkStatsRequest{Code: "iv" + rnd(), Interval: tc.interval}
			if !tc.start.IsZero() {
				req.StartTime, req.EndTime = ts(tc.start), ts(tc.end)
			}
			resp, err := svc.GetLinkStats(as("t-"+rnd()), req)
			if err != nil {
				t.Fatal(err)
			}
			if resp.GetInterval() != tc.wantInterval {
				t.Errorf("interval %v, want %v", resp.GetInterval(), tc.wantInterval)
			}
			if s, e := resp.GetStartTime().AsTime(), resp.GetEndTime().AsTime(); !s.Equal(tc.wantStart) || !e.Equal(tc.wantEnd) {
				t.Errorf("range [%s, %s), want [%s, %s)", s, e, tc.wantStart, tc.wantEnd)
			}
			if len(resp.GetSeries()) != tc.wantBuckets {
				t.Fatalf("%d buckets, want %d", len(resp.GetSeries()), tc.wantBuckets)
			}
			if got := resp.GetSeries()[0].GetStartTime().AsTime(); !got.Equal(tc.wantFirstBucketStart) {
				t.Errorf("first bucket at %s, want %s", got, tc.wantFirstBucketStart)
			}
		})
	}
}

// TestDuplicatesCountOnce stores events more than once, with flags that
// differ between copies, as racing consumers can: every statistic counts
// each event once, with the most severe copy's flags, and the breakdowns
// count it only if that copy is human.
func TestDuplicatesCountOnce(t *testing.T) {
	t.Parallel()
	store := newStore(t, "")
	tenant, code := "dup-"+rnd(), "dup"+rnd()
	at := day0.Add(3*time.Hour + 10*time.Minute)
	// e1 went where rule "de" said, e2 and e5 to variant a, e4 to b.
	rules := map[string]string{"e1": "de"}
	variants := map[string]string{"e2": "a", "e5": "a", "e4": "b"}
	row := func(id, ref, browser string, bot, flood, newVisitor, suspect bool) clickstore.Click {
		return clickstore.Click{Tenant: tenant, Code: code, Time: at, EventID: id, Visitor: "v-" + id,
			ReferrerHost: ref, Browser: browser, OS: "Linux", Device: "desktop",
			Bot: bot, Flood: flood, NewVisitor: newVisitor, Suspect: suspect, Rule: rules[id], Variant: variants[id]}
	}
	err := store.Insert(context.Background(), []clickstore.Click{
		row("e1", "a.com", "Chrome", false, false, true, false), // human, first visit...
		row("e1", "a.com", "Chrome", false, true, false, true),  // ...and a flood copy: a flood
		row("e2", "b.com", "Firefox", false, false, true, false),
		row("e2", "b.com", "Firefox", false, false, true, true), // the same human twice
		row("e3", "", "Bot", true, false, false, false),
		row("e3", "", "Bot", true, false, false, true),
		row("e3", "", "Bot", true, false, false, true),          // a bot three times
		row("e4", "a.com", "Chrome", false, false, false, true), // redelivered, stored once
		row("e5", "c.com", "Chrome", false, false, true, false), // never suspect
	})
	if err != nil {
		t.Fatal(err)
	}
	svc := New(store, servertest.Logger(t), Options{})
	resp, err := svc.GetLinkStats(as(tenant), &analyticsv1.GetLinkStatsRequest{
		Code: code, StartTime: ts(day0), EndTime: ts(day0.Add(24 * time.Hour))})
	if err != nil {
		t.Fatal(err)
	}
	c := resp.GetCounts()
	got := [5]int64{c.GetTotal(), c.GetHuman(), c.GetBot(), c.GetFlood(), c.GetUniqueVisitors()}
	if want := [5]int64{5, 3, 1, 1, 2}; got != want {
		t.Errorf("(total, human, bot, flood, unique visitors) = %v, want %v", got, want)
	}
	if b := resp.GetSeries()[3].GetCounts(); b.GetTotal() != 5 || b.GetHuman() != 3 {
		t.Errorf("03:00 bucket %v, want the same counts as the total", b)
	}
	// The breakdowns count the three human events: e1 is a flood (its
	// human copy, and its rule, are subtracted), e3 a bot.
	wantTop := map[string]map[string]int64{
		"referrers": {"a.com": 1, "b.com": 1, "c.com": 1},
		"browsers":  {"Chrome": 2, "Firefox": 1},
		"os":        {"Linux": 3},
		"devices":   {"desktop": 3},
		"rules":     {},
		"variants":  {"a": 2, "b": 1},
	}
	for name, list := range map[string][]*analyticsv1.KeyCount{
		"referrers": resp.GetTopReferrers(), "browsers": resp.GetTopBrowsers(),
		"os": resp.GetTopOperatingSystems(), "devices": resp.GetTopDevices(),
		"rules": resp.GetRules(), "variants": resp.GetVariants(),
	} {
		gotTop := map[string]int64{}
		for _, kc := range list {
			gotTop[kc.GetKey()] = kc.GetCount()
		}
		if len(gotTop) != len(wantTop[name]) {
			t.Errorf("top %s %v, want %v", name, gotTop, wantTop[name])
		}
		for k, n := range wantTop[name] {
			if gotTop[k] != n {
				t.Errorf("top %s %v, want %v", name, gotTop, wantTop[name])
				break
			}
		}
	}
	if resp.GetBotShare() != 0.2 || resp.GetFloodShare() != 0.2 {
		t.Errorf("shares bot %v flood %v, want 0.2 and 0.2", resp.GetBotShare(), resp.GetFloodShare())
	}
	if got := resp.GetTopBrowsers()[0].GetKey(); got != "Chrome" {
		t.Errorf("top browser %q, want Chrome", got)
	}
}

// TestTopCountries: clicks break down by the country the redirect found,
// "" for clicks of unknown country, and an event stored twice counts once
// in its country.
func TestTopCountries(t *testing.T) {
	t.Parallel()
	store := newStore(t, "")
	tenant, code := "geo-"+rnd(), "geo"+rnd()
	at := day0.Add(5 * time.Hour)
	row := func(id, country string, suspect bool) clickstore.Click {
		return clickstore.Click{Tenant: tenant, Code: code, Time: at, EventID: id, Visitor: "v-" + id,
			Browser: "Chrome", OS: "Linux", Device: "desktop", Country: country, NewVisitor: true, Suspect: suspect}
	}
	if err := store.Insert(context.Background(), []clickstore.Click{
		row("e1", "DE", false), row("e2", "DE", false), row("e3", "JP", false), row("e4", "", false),
		row("e2", "DE", true), // e2 stored twice
	}); err != nil {
		t.Fatal(err)
	}
	resp, err := New(store, servertest.Logger(t), Options{}).GetLinkStats(as(tenant), &analyticsv1.GetLinkStatsRequest{
		Code: code, StartTime: ts(day0), EndTime: ts(day0.Add(24 * time.Hour))})
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, kc := range resp.GetTopCountries() {
		got = append(got, fmt.Sprintf("%s=%d", kc.GetKey(), kc.GetCount()))
	}
	if want := []string{"DE=2", "=1", "JP=1"}; !slices.Equal(got, want) {
		t.Errorf("top countries %v, want %v", got, want)
	}
}

// TestBreakdownsCountHumansOnly: bots and floods are in the counts, and in
// none of the breakdowns. One flooder, sticky to one A/B variant, does not
// tilt the variants, and a bot's fake Referer hosts are not listed.
func TestBreakdownsCountHumansOnly(t *testing.T) {
	t.Parallel()
	store := newStore(t, "")
	tenant, code := "hum-"+rnd(), "hum"+rnd()
	at := day0.Add(7 * time.Hour)
	var rows []clickstore.Click
	add := func(n int, c clickstore.Click) {
		for range n {
			c.Tenant, c.Code, c.Time, c.EventID = tenant, code, at, rnd()
			rows = append(rows, c)
		}
	}
	add(3, clickstore.Click{Visitor: "h1", ReferrerHost: "news.example", Browser: "Firefox", OS: "Linux",
		Device: "desktop", Country: "DE", Variant: "a", NewVisitor: true})
	add(2, clickstore.Click{Visitor: "h2", ReferrerHost: "t.co", Browser: "Safari", OS: "iOS",
		Device: "mobile", Country: "JP", Rule: "ios", NewVisitor: true})
	add(40, clickstore.Click{Visitor: "flooder", ReferrerHost: "flood.example", Browser: "Chrome", OS: "Windows",
		Device: "desktop", Country: "US", Variant: "b", Rule: "win", Flood: true})
	for i := range 30 {
		add(1, clickstore.Click{Visitor: "bot", ReferrerHost: fmt.Sprintf("r%d.spam.example", i), Browser: "Bot", OS: "Other",
			Device: "bot", Country: "NL", Variant: "b", Rule: "win", Bot: true})
	}
	if err := store.Insert(context.Background(), rows); err != nil {
		t.Fatal(err)
	}
	resp, err := New(store, servertest.Logger(t), Options{}).GetLinkStats(as(tenant), &analyticsv1.GetLinkStatsRequest{
		Code: code, StartTime: ts(day0), EndTime: ts(day0.Add(24 * time.Hour))})
	if err != nil {
		t.Fatal(err)
	}
	c := resp.GetCounts()
	if got, want := [4]int64{c.GetTotal(), c.GetHuman(), c.GetBot(), c.GetFlood()}, [4]int64{75, 5, 30, 40}; got != want {
		t.Errorf("(total, human, bot, flood) = %v, want %v", got, want)
	}
	list := func(kcs []*analyticsv1.KeyCount) string {
		var out []string
		for _, kc := range kcs {
			out = append(out, fmt.Sprintf("%s=%d", kc.GetKey(), kc.GetCount()))
		}
		return strings.Join(out, " ")
	}
	for name, tc := range map[string]struct {
		got  []*analyticsv1.KeyCount
		want string
	}{
		"referrers": {resp.GetTopReferrers(), "news.example=3 t.co=2"},
		"browsers":  {resp.GetTopBrowsers(), "Firefox=3 Safari=2"},
		"os":        {resp.GetTopOperatingSystems(), "Linux=3 iOS=2"},
		"devices":   {resp.GetTopDevices(), "desktop=3 mobile=2"},
		"countries": {resp.GetTopCountries(), "DE=3 JP=2"},
		"rules":     {resp.GetRules(), "ios=2"},
		"variants":  {resp.GetVariants(), "a=3"},
	} {
		if got := list(tc.got); got != tc.want {
			t.Errorf("%s: %q, want %q (human clicks only)", name, got, tc.want)
		}
	}
}

// TestTopListsAreExactAfterDuplicates: ClickHouse picks the top keys
// before the duplicate correction, yet the lists are the top after it. 60
// referrer hosts have 2 events each, every one stored twice (4 rows, 2
// clicks); c.example has 3 clicks in 3 rows, fewer rows than 60 others, and
// is the top referrer.
func TestTopListsAreExactAfterDuplicates(t *testing.T) {
	t.Parallel()
	store := newStore(t, "")
	tenant, code := "exact-"+rnd(), "exact"+rnd()
	at := day0.Add(9 * time.Hour)
	row := func(id, host string, suspect bool) clickstore.Click {
		return clickstore.Click{Tenant: tenant, Code: code, Time: at, EventID: id, Visitor: "v-" + id,
			ReferrerHost: host, Browser: "Firefox", OS: "Linux", Device: "desktop", Suspect: suspect}
	}
	var rows []clickstore.Click
	for h := range 60 {
		host := fmt.Sprintf("d%02d.example", h)
		for e := range 2 {
			id := fmt.Sprintf("%s-%d", host, e)
			rows = append(rows, row(id, host, false), row(id, host, true))
		}
	}
	for e := range 3 {
		rows = append(rows, row(fmt.Sprintf("c-%d", e), "c.example", false))
	}
	if err := store.Insert(context.Background(), rows); err != nil {
		t.Fatal(err)
	}
	resp, err := New(store, servertest.Logger(t), Options{}).GetLinkStats(as(tenant), &analyticsv1.GetLinkStatsRequest{
		Code: code, StartTime: ts(day0), EndTime: ts(day0.Add(24 * time.Hour))})
	if err != nil {
		t.Fatal(err)
	}
	if got := resp.GetCounts().GetTotal(); got != 123 {
		t.Errorf("total %d, want 123", got)
	}
	var got []string
	for _, kc := range resp.GetTopReferrers() {
		got = append(got, fmt.Sprintf("%s=%d", kc.GetKey(), kc.GetCount()))
	}
	want := []string{"c.example=3"}
	for h := range TopN - 1 {
		want = append(want, fmt.Sprintf("d%02d.example=2", h))
	}
	if !slices.Equal(got, want) {
		t.Errorf("top referrers %v, want %v", got, want)
	}
}
