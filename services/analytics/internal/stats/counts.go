package stats

import (
	"context"
	"errors"
	"fmt"
	"time"

	"google.golang.org/protobuf/types/known/timestamppb"

	analyticsv1 "kurz.dev/gen/kurz/analytics/v1"
	"kurz.dev/pkg/linkdomain"
	"kurz.dev/pkg/rpcerr"
	"kurz.dev/services/analytics/internal/clickstore"
)

// MaxCountsLinks bounds the links of one GetLinksClickCounts: the largest
// page the gateway lists (1,000 links), in one ClickHouse read.
const MaxCountsLinks = 1000

// ReasonLinksInvalid is INVALID_ARGUMENT: a GetLinksClickCounts without
// links, or with more than MaxCountsLinks.
const ReasonLinksInvalid = "LINKS_INVALID"

// GetLinksClickCounts returns the caller's click counts of each link of
// the request over one range: one ClickHouse read for them all, admitted
// as one statistics request. Every link answers counts, zeros when it has
// no clicks of the caller's: a link of another tenant answers as an own
// link without clicks does, so the answer tells nothing of links the
// caller cannot see. (GetLinkStats answers NOT_FOUND there, as the
// shortener does for one link; a list cannot refuse one of its links,
// and the gateway asks for the links the shortener listed to the caller.)
func (s *Service) GetLinksClickCounts(ctx context.Context, req *analyticsv1.GetLinksClickCountsRequest) (*analyticsv1.GetLinksClickCountsResponse, error) {
	tenant, err := s.tenant(ctx)
	if err != nil {
		return nil, err
	}
	links := req.GetLinks()
	if n := len(links); n == 0 || n > MaxCountsLinks {
		return nil, rpcerr.BadRequest("links", ReasonLinksInvalid, fmt.Sprintf(
			"links names %d links; name 1 to %d", n, MaxCountsLinks))
	}
	keys := make([]string, 0, len(links))
	seen := make(map[string]bool, len(links))
	for i, l := range links {
		key, err := linkKey(fmt.Sprintf("links[%d].code", i), fmt.Sprintf("links[%d].domain", i), l.GetCode(), l.GetDomain())
		if err != nil {
			return nil, err
		}
		if !seen[key] {
			seen[key] = true
			keys = append(keys, key)
		}
	}
	start, end, _, err := s.parseRange(req.GetStartTime(), req.GetEndTime())
	if err != nil {
		return nil, err
	}
	release, err := s.admit(ctx, tenant)
	if err != nil {
		return nil, err
	}
	defer release()
	got, err := s.linkCounts(ctx, tenant, keys, start, end)
	if err != nil {
		if errors.Is(err, clickstore.ErrBusy) {
			s.refused.Add(ctx, 1, s.busy)
		}
		return nil, rpcerr.ToStatus(ctx, s.log, err, statsErrors)
	}
	resp := &analyticsv1.GetLinksClickCountsResponse{
		Links:     make([]*analyticsv1.LinkClickCounts, 0, len(keys)),
		StartTime: timestamppb.New(start),
		EndTime:   timestamppb.New(end),
	}
	for _, key := range keys {
		domain, code := linkdomain.Split(key)
		lc := &analyticsv1.LinkClickCounts{Code: code, Counts: counts(got[key])}
		if domain != "" {
			lc.Domain = &domain
		}
		resp.Links = append(resp.Links, lc)
	}
	return resp, nil
}

// linkCounts reads keys' counts within the query timeout; a read that
// finished past it answers DEADLINE_EXCEEDED too, as stats does.
func (s *Service) linkCounts(ctx context.Context, tenant string, keys []string, start, end time.Time) (map[string]clickstore.Counts, error) {
	ctx, cancel := context.WithTimeout(ctx, s.opts.QueryTimeout)
	defer cancel()
	got, err := s.store.LinkCounts(ctx, tenant, keys, start, end)
	if err != nil {
		return nil, err
	}
	if err := ctx.Err(); err != nil {
		return nil, fmt.Errorf("link counts read: %w", err)
	}
	return got, nil
}
