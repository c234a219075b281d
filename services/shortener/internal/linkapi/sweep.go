package linkapi

import (
	"context"
	"errors"
	"fmt"
	"net/url"

	"kurz.dev/services/shortener/internal/linkstore"
)

// sweepPage is how many links one query of a sweep reads.
const sweepPage = 500

// Swept is a link a sweep disabled.
type Swept struct {
	Tenant, Code string
	// Why names the list entry that matched.
	Why string
}

// SweepReport is what one sweep did.
type SweepReport struct {
	Scanned  int
	Disabled []Swept
}

// SweepBlocked disables every live link whose long URL, device target, rule
// or variant destination the
// scanner blocks now: a domain added to the blocklist reaches the links
// created before it, not only new ones. Each is disabled as UpdateLink
// would (its invalidation queued and written through, retried until Redis
// has it: the link answers 410), logged with its tenant, and counted. Its
// tenant cannot enable it again while the destination stays blocked:
// UpdateLink scans every destination of a link it enables.
// Replicas may sweep at once: disabling is idempotent. It stops at the first
// store or scanner error, with what it did so far.
func (s *Service) SweepBlocked(ctx context.Context) (SweepReport, error) {
	var rep SweepReport
	disabled := true
	for after := ""; ; {
		links, err := s.store.Live(ctx, after, sweepPage)
		if err != nil {
			return rep, err
		}
		for _, l := range links {
			rep.Scanned++
			why, err := s.blockedBy(ctx, l)
			if err != nil || why == "" {
				if err != nil {
					return rep, err
				}
				continue
			}
			nl, err := s.store.Update(ctx, l.Tenant, l.Code, linkstore.Changes{Disabled: &disabled})
			switch {
			case errors.Is(err, linkstore.ErrNotFound): // deleted meanwhile
				continue
			case err != nil:
				return rep, err
			}
			s.refresh(ctx, "blocklist", nl.Code)
			s.m.swept.Add(ctx, 1)
			s.log.WarnContext(ctx, "link disabled: its destination is on the blocklist now",
				"tenant", l.Tenant, "code", l.Code, "why", why)
			rep.Disabled = append(rep.Disabled, Swept{Tenant: l.Tenant, Code: l.Code, Why: why})
		}
		if len(links) < sweepPage {
			return rep, nil
		}
		after = links[len(links)-1].Code
	}
}

// blockedBy returns why the scanner blocks one of l's destinations, or "".
func (s *Service) blockedBy(ctx context.Context, l linkstore.Link) (string, error) {
	targets := []string{l.LongURL, l.IOSURL, l.AndroidURL, l.DesktopURL}
	if l.Rules != nil {
		for _, r := range l.Rules.Rules {
			targets = append(targets, r.URL)
		}
		for _, v := range l.Rules.Variants {
			targets = append(targets, v.URL)
		}
	}
	for _, target := range targets {
		if target == "" {
			continue
		}
		u, err := url.Parse(target)
		if err != nil {
			continue // stored URLs are normalised; nothing to match
		}
		v, err := s.scanner.Scan(ctx, u)
		if err != nil {
			return "", fmt.Errorf("scan %s's destination: %w", l.Code, err)
		}
		if v.Blocked {
			return v.Why, nil
		}
	}
	return "", nil
}
