// Package stats serves kurz.analytics.v1.AnalyticsService: a link's click
// statistics over a time range, read from the pre-aggregated ClickHouse
// tables (clickstore), scoped to the caller's tenant.
package stats

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"sync"
	"time"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"
	metricnoop "go.opentelemetry.io/otel/metric/noop"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/timestamppb"

	analyticsv1 "kurz.dev/gen/kurz/analytics/v1"
	"kurz.dev/pkg/callmeta"
	"kurz.dev/pkg/capacity"
	"kurz.dev/pkg/linkcode"
	"kurz.dev/pkg/linkdomain"
	"kurz.dev/pkg/rpcerr"
	"kurz.dev/pkg/textcut"
	"kurz.dev/services/analytics/internal/clickstore"
)

// Limits of a request.
const (
	// DefaultRange is the range when the request sets no start.
	DefaultRange = 30 * 24 * time.Hour
	// MaxRange bounds end - start.
	MaxRange = 400 * 24 * time.Hour
	// MaxHourlyRange bounds an hourly series.
	MaxHourlyRange = 31 * 24 * time.Hour
	// AutoHourlyRange is the longest range an unspecified interval serves
	// by the hour.
	AutoHourlyRange = 48 * time.Hour
	// TopN is the length of every top list.
	TopN = 10
	// MaxRules and MaxVariants bound the rules and variants lists: a
	// link's current rules and variants (linkrules' bounds) and some of
	// those it had before.
	MaxRules    = 40
	MaxVariants = 20
	// dimsSlack is the room the dimension read leaves, beyond each list's
	// length, for keys that duplicates lower (see dimLimits).
	dimsSlack = 16
	// maxTenantLen matches the shortener's bound on tenant metadata.
	maxTenantLen = 128
)

// EarliestTime and LatestTime bound start_time and end_time: the times
// ClickHouse's DateTime holds (clickstore.Earliest, clickstore.Latest), in
// the whole hours a range is widened to. Past them ClickHouse would count
// another period.
var (
	EarliestTime = clickstore.Earliest.Truncate(time.Hour)
	LatestTime   = clickstore.Latest.Truncate(time.Hour)
)

// Reasons (google.rpc.ErrorInfo.reason) of INVALID_ARGUMENT, and of
// UNAVAILABLE while ClickHouse is down; shared ones are in rpcerr.
const (
	ReasonCodeInvalid     = "CODE_INVALID"
	ReasonDomainInvalid   = "DOMAIN_INVALID"
	ReasonRangeInvalid    = "RANGE_INVALID"
	ReasonIntervalInvalid = "INTERVAL_INVALID"
	ReasonStoreDown       = "CLICK_STORE_UNAVAILABLE"
	// ReasonBusy: UNAVAILABLE, this replica serves as many statistics
	// requests as it may (Options.MaxRequests); ClickHouse is fine.
	ReasonBusy = "STATS_BUSY"
	// ReasonShareInUse: RESOURCE_EXHAUSTED, the tenant's requests in
	// progress hold its share of them.
	ReasonShareInUse = "STATS_SHARE_IN_USE"
)

// busyRetryAfter is the retry delay of a request refused as busy: the
// requests holding the slots take tens of milliseconds, seconds at most.
const busyRetryAfter = time.Second

// admitWait is how long a request waits for a slot when every one is
// taken: long enough to smooth a burst of fast requests, short enough
// that a refusal comes at once next to a request's own QueryTimeout.
const admitWait = 250 * time.Millisecond

// QueriesPerRequest is how many ClickHouse queries one request runs at once
// (stats): its store's pool needs that many connections per slot.
const QueriesPerRequest = 4

// Options configure the service.
type Options struct {
	// AllowAnonymous answers calls without x-kurz-tenant as tenant
	// "anonymous" (the shortener's rule: links created without a tenant
	// belong to it); otherwise they are UNAUTHENTICATED.
	AllowAnonymous bool
	// QueryTimeout bounds one request's ClickHouse queries (default 5s).
	QueryTimeout time.Duration
	// MaxRequests bounds the requests served at once (default 4); one
	// tenant's take at most half of them (at least 1). Past either, a
	// request is refused at once with a retry delay, ClickHouse untouched:
	// the store's pool needs QueriesPerRequest connections per request
	// for none of them to wait for one.
	MaxRequests int
	// Meter records the refusals (MetricRefused); nil records nothing.
	Meter metric.Meter
	// now is the clock; tests set it.
	now func() time.Time
}

// Store is what the service reads: a *clickstore.Store.
type Store interface {
	Owners(ctx context.Context, code string) ([]string, error)
	Hourly(ctx context.Context, r clickstore.Range) (map[int64]clickstore.Counts, error)
	Dims(ctx context.Context, r clickstore.Range, limits map[string]int) (map[string]map[string]int64, error)
	Duplicates(ctx context.Context, r clickstore.Range) ([]clickstore.Duplicate, error)
	LinkCounts(ctx context.Context, tenant string, codes []string, start, end time.Time) (map[string]clickstore.Counts, error)
}

// Service implements AnalyticsService.
type Service struct {
	analyticsv1.UnimplementedAnalyticsServiceServer
	store Store
	log   *slog.Logger
	opts  Options

	slots *capacity.Gate
	share int
	// refused counts requests refused for capacity, by reason: an
	// operator tells a replica too small for its tenants (STATS_BUSY)
	// from one tenant holding its share (STATS_SHARE_IN_USE), which the
	// calls' status codes alone do not.
	refused     metric.Int64Counter
	busy, inUse metric.MeasurementOption
	mu          sync.Mutex
	held        map[string]int // requests in progress by tenant
}

// New returns the service over store.
func New(store Store, log *slog.Logger, opts Options) *Service {
	if opts.QueryTimeout <= 0 {
		opts.QueryTimeout = 5 * time.Second
	}
	if opts.now == nil {
		opts.now = time.Now
	}
	if opts.MaxRequests <= 0 {
		opts.MaxRequests = 4
	}
	s := &Service{store: store, log: log, opts: opts,
		slots: capacity.New(opts.MaxRequests, admitWait), share: max(1, opts.MaxRequests/2), held: make(map[string]int),
		refused: metricnoop.Int64Counter{},
		busy:    metric.WithAttributeSet(attribute.NewSet(attribute.String("reason", ReasonBusy))),
		inUse:   metric.WithAttributeSet(attribute.NewSet(attribute.String("reason", ReasonShareInUse))),
	}
	if opts.Meter != nil {
		c, err := opts.Meter.Int64Counter(MetricRefused, metric.WithUnit("{request}"),
			metric.WithDescription("Statistics requests refused for capacity, by reason (STATS_BUSY, STATS_SHARE_IN_USE)"))
		if err != nil {
			otel.Handle(err)
		} else {
			s.refused = c
		}
	}
	return s
}

// MetricRefused counts the statistics requests refused for capacity
// (Prometheus: kurz_analytics_stats_refused_total{reason}).
const MetricRefused = "kurz.analytics.stats.refused"

// admit takes one of the replica's request slots for tenant, and refuses
// the request (a status with a retry delay) when the tenant's requests in
// progress hold its share of them or every slot stays taken for
// admitWait. A 299-day range takes seconds and four connections; without
// the bound, 15 such requests of one free tenant held every ClickHouse
// connection, and the other tenants' statistics, the consumer's inserts
// and the readiness check waited for one until they failed.
func (s *Service) admit(ctx context.Context, tenant string) (release func(), err error) {
	s.mu.Lock()
	if s.held[tenant] >= s.share {
		s.mu.Unlock()
		s.refused.Add(ctx, 1, s.inUse)
		return nil, rpcerr.RetryLater(codes.ResourceExhausted, ReasonShareInUse, fmt.Sprintf(
			"this tenant's statistics requests in progress already hold its share (%d) of those this replica serves at once",
			s.share), busyRetryAfter, nil)
	}
	s.held[tenant]++
	s.mu.Unlock()
	unhold := func() {
		s.mu.Lock()
		if s.held[tenant]--; s.held[tenant] == 0 {
			delete(s.held, tenant)
		}
		s.mu.Unlock()
	}
	free, err := s.slots.Acquire(ctx)
	switch {
	case errors.Is(err, capacity.ErrBusy):
		unhold()
		s.refused.Add(ctx, 1, s.busy)
		return nil, rpcerr.RetryLater(codes.Unavailable, ReasonBusy,
			"statistics are busy right now: too many requests at once", busyRetryAfter, nil)
	case err != nil:
		unhold()
		return nil, status.FromContextError(err).Err()
	}
	return func() { free(); unhold() }, nil
}

// GetLinkStats returns the link's counts, series and top lists over the
// requested range. A code with no clicks at all answers zeros; a code whose
// clicks all belong to other tenants answers NOT_FOUND, as a code that does
// not exist would for the shortener.
func (s *Service) GetLinkStats(ctx context.Context, req *analyticsv1.GetLinkStatsRequest) (*analyticsv1.GetLinkStatsResponse, error) {
	tenant, err := s.tenant(ctx)
	if err != nil {
		return nil, err
	}
	q, err := s.parse(req)
	if err != nil {
		return nil, err
	}
	q.r.Tenant = tenant
	release, err := s.admit(ctx, tenant)
	if err != nil {
		return nil, err
	}
	defer release()
	resp, err := s.stats(ctx, q)
	if err != nil {
		if errors.Is(err, clickstore.ErrBusy) {
			s.refused.Add(ctx, 1, s.busy)
		}
		return nil, rpcerr.ToStatus(ctx, s.log, err, statsErrors)
	}
	return resp, nil
}

func (s *Service) tenant(ctx context.Context) (string, error) {
	t := callmeta.Tenant(ctx)
	switch {
	case t == "" && s.opts.AllowAnonymous:
		return callmeta.AnonymousTenant, nil
	case t == "":
		return "", rpcerr.WithDetails(codes.Unauthenticated,
			"no tenant: call through the gateway with an API key (anonymous statistics are disabled)",
			rpcerr.Info(rpcerr.ReasonTenantMissing, nil))
	case len(t) > maxTenantLen:
		return "", status.Error(codes.Unauthenticated, "the tenant metadata is not valid")
	}
	return t, nil
}

// query is a validated request.
type query struct {
	r        clickstore.Range
	interval analyticsv1.Interval
	step     time.Duration
}

func (s *Service) parse(req *analyticsv1.GetLinkStatsRequest) (query, error) {
	var q query
	key, err := linkKey("code", "domain", req.GetCode(), req.GetDomain())
	if err != nil {
		return q, err
	}
	q.r.Code = key
	start, end, asked, err := s.parseRange(req.GetStartTime(), req.GetEndTime())
	if err != nil {
		return q, err
	}
	q.r.Start, q.r.End = start, end
	switch iv := req.GetInterval(); iv {
	case analyticsv1.Interval_INTERVAL_UNSPECIFIED:
		q.interval = analyticsv1.Interval_INTERVAL_DAY
		if asked <= AutoHourlyRange {
			q.interval = analyticsv1.Interval_INTERVAL_HOUR
		}
	case analyticsv1.Interval_INTERVAL_HOUR:
		if asked > MaxHourlyRange {
			return q, rpcerr.BadRequest("interval", ReasonIntervalInvalid, fmt.Sprintf(
				"an hourly series covers at most %.0f days and this range spans %s: use INTERVAL_DAY or a shorter range",
				MaxHourlyRange.Hours()/24, span(asked)))
		}
		q.interval = iv
	case analyticsv1.Interval_INTERVAL_DAY:
		q.interval = iv
	default:
		return q, rpcerr.BadRequest("interval", ReasonIntervalInvalid, fmt.Sprintf(
			"unknown interval %d: use INTERVAL_HOUR, INTERVAL_DAY or leave it unspecified", iv))
	}
	q.step = time.Hour
	if q.interval == analyticsv1.Interval_INTERVAL_DAY {
		q.step = 24 * time.Hour
	}
	return q, nil
}

// linkKey validates a link's code and domain (codeField and domainField
// name them in a refusal) and returns its key: the code, or the custom
// domain's key, which clicks of a custom domain's link carry.
func linkKey(codeField, domainField, code, domain string) (string, error) {
	if !linkcode.Plausible(code) {
		return "", rpcerr.BadRequest(codeField, ReasonCodeInvalid, fmt.Sprintf(
			"%s %q is not a short code: %d to %d characters, letters, digits, '-' and '_'",
			codeField, textcut.Echo(code, maxEchoedCode), linkcode.MinLength, linkcode.MaxLength))
	}
	if domain == "" {
		return code, nil
	}
	d, err := linkdomain.Normalize(domain)
	if err != nil {
		return "", rpcerr.BadRequest(domainField, ReasonDomainInvalid, domainField+": "+err.Error())
	}
	return linkdomain.Key(d, code), nil
}

// parseRange validates a request's range (unset start: DefaultRange before
// the end; unset end: now) and returns it widened to whole hours, with
// the length asked for, by which limits and the interval go.
func (s *Service) parseRange(startTS, endTS *timestamppb.Timestamp) (start, end time.Time, asked time.Duration, err error) {
	end = s.opts.now()
	if endTS != nil {
		if err := endTS.CheckValid(); err != nil {
			return start, end, 0, rpcerr.BadRequest("end_time", ReasonRangeInvalid, "end_time is not a valid timestamp")
		}
		end = endTS.AsTime()
	}
	if err := checkCovered("end_time", end, ""); err != nil {
		return start, end, 0, err
	}
	start = end.Add(-DefaultRange)
	unset := " (when unset, 30 days before end_time)"
	if startTS != nil {
		if err := startTS.CheckValid(); err != nil {
			return start, end, 0, rpcerr.BadRequest("start_time", ReasonRangeInvalid, "start_time is not a valid timestamp")
		}
		start, unset = startTS.AsTime(), ""
	}
	if err := checkCovered("start_time", start, unset); err != nil {
		return start, end, 0, err
	}
	if !end.After(start) {
		return start, end, 0, rpcerr.BadRequest("end_time", ReasonRangeInvalid, fmt.Sprintf(
			"end_time (%s) must be after start_time (%s)", end.UTC().Format(time.RFC3339), start.UTC().Format(time.RFC3339)))
	}
	asked = end.Sub(start)
	if asked > MaxRange {
		return start, end, 0, rpcerr.BadRequest("start_time", ReasonRangeInvalid, fmt.Sprintf(
			"the range spans %s; at most %.0f days: narrow it or ask in several requests",
			span(asked), MaxRange.Hours()/24))
	}
	// The range counted is widened to whole hours, the resolution of the
	// aggregates.
	start = start.UTC().Truncate(time.Hour)
	if t := end.UTC().Truncate(time.Hour); t.Equal(end) {
		end = t
	} else {
		end = t.Add(time.Hour)
	}
	return start, end, asked, nil
}

// checkCovered refuses a time of the request (field) outside EarliestTime
// to LatestTime; note explains a value the client did not send.
func checkCovered(field string, t time.Time, note string) error {
	if t.Before(EarliestTime) || t.After(LatestTime) {
		return rpcerr.BadRequest(field, ReasonRangeInvalid, fmt.Sprintf(
			"%s %s%s is outside the times statistics cover: %s to %s",
			field, t.UTC().Format(time.RFC3339), note, EarliestTime.Format(time.RFC3339), LatestTime.Format(time.RFC3339)))
	}
	return nil
}

// errNotFound is a code with clicks of other tenants only.
var errNotFound = errors.New("stats: no such link")

// statsErrors are what clients see of the errors stats returns; anything
// else is INTERNAL (rpcerr.ToStatus).
var statsErrors = []rpcerr.Sentinel{
	{Err: errNotFound, Code: codes.NotFound,
		Message: "no such link: check the code (links of other tenants are not visible)"},
	{Err: context.DeadlineExceeded, Code: codes.DeadlineExceeded,
		Message: "the statistics took too long; try again or narrow the range"},
	// A ClickHouse outage, not a fault of the request: worth retrying.
	{Err: clickstore.ErrUnavailable, Code: codes.Unavailable, Reason: ReasonStoreDown,
		Message: "statistics are unavailable right now", RetryAfter: time.Second},
	// Every connection of the statistics' pool in use: the admission
	// bound should prevent it; still not an outage.
	{Err: clickstore.ErrBusy, Code: codes.Unavailable, Reason: ReasonBusy,
		Message: "statistics are busy right now: too many requests at once", RetryAfter: busyRetryAfter},
}

// stats runs the four independent queries concurrently and assembles them.
func (s *Service) stats(ctx context.Context, q query) (*analyticsv1.GetLinkStatsResponse, error) {
	ctx, cancel := context.WithTimeout(ctx, s.opts.QueryTimeout)
	defer cancel()
	var (
		wg     sync.WaitGroup
		owners []string
		hourly map[int64]clickstore.Counts
		dims   map[string]map[string]int64
		dups   []clickstore.Duplicate
		errs   [4]error
	)
	wg.Go(func() { owners, errs[0] = s.store.Owners(ctx, q.r.Code) })
	wg.Go(func() { hourly, errs[1] = s.store.Hourly(ctx, q.r) })
	wg.Go(func() { dims, errs[2] = s.store.Dims(ctx, q.r, dimLimits(dimsSlack)) })
	wg.Go(func() { dups, errs[3] = s.store.Duplicates(ctx, q.r) })
	wg.Wait()
	if err := errors.Join(errs[:]...); err != nil {
		return nil, err
	}
	// Reads that finished past the timeout answer DEADLINE_EXCEEDED too:
	// the bound holds whichever step passed it.
	if err := ctx.Err(); err != nil {
		return nil, fmt.Errorf("stats reads: %w", err)
	}
	if len(owners) > 0 && !slices.Contains(owners, q.r.Tenant) {
		return nil, errNotFound
	}
	lowered := 0
	for _, d := range dups {
		if d.Excess().Human > 0 {
			lowered++
		}
	}
	if lowered > dimsSlack {
		// Rare (an incident left many duplicates in the range): read the
		// dimensions again with room for every key the correction lowers.
		var err error
		if dims, err = s.store.Dims(ctx, q.r, dimLimits(lowered)); err != nil {
			return nil, err
		}
	}
	for _, d := range dups {
		if c, ok := hourly[d.Hour]; ok {
			c.Sub(d.Excess())
			hourly[d.Hour] = c
		}
		// The breakdowns count human copies only, and the event once if
		// its most severe copy is human.
		extra := d.Excess().Human
		if extra == 0 {
			continue
		}
		for dim, key := range map[string]string{
			clickstore.DimReferrer: d.ReferrerHost, clickstore.DimBrowser: d.Browser,
			clickstore.DimOS: d.OS, clickstore.DimDevice: d.Device, clickstore.DimCountry: d.Country,
			clickstore.DimRule: d.Rule, clickstore.DimVariant: d.Variant,
		} {
			if m := dims[dim]; m != nil {
				m[key] -= extra
			}
		}
	}

	domain, code := linkdomain.Split(q.r.Code)
	var domainField *string // absent for the default domain
	if domain != "" {
		domainField = &domain
	}
	resp := &analyticsv1.GetLinkStatsResponse{
		Domain:              domainField,
		Code:                code,
		StartTime:           timestamppb.New(q.r.Start),
		EndTime:             timestamppb.New(q.r.End),
		Interval:            q.interval,
		TopReferrers:        top(dims[clickstore.DimReferrer]),
		TopBrowsers:         top(dims[clickstore.DimBrowser]),
		TopOperatingSystems: top(dims[clickstore.DimOS]),
		TopDevices:          top(dims[clickstore.DimDevice]),
		TopCountries:        top(dims[clickstore.DimCountry]),
		Rules:               named(dims[clickstore.DimRule], MaxRules),
		Variants:            named(dims[clickstore.DimVariant], MaxVariants),
	}
	var total clickstore.Counts
	buckets := make(map[int64]clickstore.Counts)
	step := int64(q.step / time.Second)
	for h, c := range hourly {
		total.Add(c)
		b := buckets[h/step*step]
		b.Add(c)
		buckets[h/step*step] = b
	}
	for t := q.r.Start.Unix() / step * step; t < q.r.End.Unix(); t += step {
		resp.Series = append(resp.Series, &analyticsv1.TimeBucket{
			StartTime: timestamppb.New(time.Unix(t, 0)), Counts: counts(buckets[t])})
	}
	resp.Counts = counts(total)
	if total.Total > 0 {
		resp.BotShare = float64(total.Bot) / float64(total.Total)
		resp.FloodShare = float64(total.Flood) / float64(total.Total)
	}
	return resp, nil
}

func counts(c clickstore.Counts) *analyticsv1.ClickCounts {
	return &analyticsv1.ClickCounts{Total: c.Total, Human: c.Human, UniqueVisitors: c.Visitors, Bot: c.Bot, Flood: c.Flood}
}

// dimLimits are how many keys of each dimension to read when the duplicate
// correction lowers at most lowered of them: the list's length and lowered
// more. The top n after the correction is then among what was read: a key
// not read has no more clicks than any key read, and at least n of those
// read are not lowered (ties go by key, in the read as in the lists).
func dimLimits(lowered int) map[string]int {
	limits := map[string]int{clickstore.DimRule: MaxRules + lowered, clickstore.DimVariant: MaxVariants + lowered}
	for _, dim := range []string{clickstore.DimReferrer, clickstore.DimBrowser, clickstore.DimOS, clickstore.DimDevice, clickstore.DimCountry} {
		limits[dim] = TopN + lowered
	}
	return limits
}

// named returns the clicks of m's named keys (rules or variants; "" is
// the clicks none of them chose), at most n, by count, ties by key.
func named(m map[string]int64, n int) []*analyticsv1.KeyCount {
	delete(m, "")
	return topN(m, n)
}

// top returns the TopN keys by count, ties by key.
func top(m map[string]int64) []*analyticsv1.KeyCount { return topN(m, TopN) }

// topN returns the n keys of m by count, ties by key.
func topN(m map[string]int64, n int) []*analyticsv1.KeyCount {
	out := make([]*analyticsv1.KeyCount, 0, min(len(m), TopN))
	for k, n := range m {
		if n > 0 {
			out = append(out, &analyticsv1.KeyCount{Key: k, Count: n})
		}
	}
	slices.SortFunc(out, func(a, b *analyticsv1.KeyCount) int {
		return cmp.Or(cmp.Compare(b.GetCount(), a.GetCount()), cmp.Compare(a.GetKey(), b.GetKey()))
	})
	return out[:min(len(out), n)]
}

// maxEchoedCode bounds what an error repeats of a code a client sent.
const maxEchoedCode = 40

// span says how long a refused range is, its hours rounded up, so that it
// never reads as the bound it passed ("31 days 1 hour", not "31").
func span(d time.Duration) string {
	hours := int64((d + time.Hour - 1) / time.Hour)
	days, hours := hours/24, hours%24
	out := plural(days, "day")
	if hours > 0 {
		out += " " + plural(hours, "hour")
	}
	return out
}

func plural(n int64, unit string) string {
	if n == 1 {
		return "1 " + unit
	}
	return fmt.Sprintf("%d %ss", n, unit)
}
