package linkapi

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"runtime"
	"slices"
	"sync"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"
	"google.golang.org/grpc/codes"

	shortenerv1 "kurz.dev/gen/kurz/shortener/v1"
	"kurz.dev/pkg/callmeta"
	"kurz.dev/pkg/linkdomain"
	"kurz.dev/pkg/rpcerr"
	"kurz.dev/services/shortener/internal/codegen"
	"kurz.dev/services/shortener/internal/linkstore"
)

// MaxBatch is how many links one BatchCreateLinks creates at most.
const MaxBatch = linkstore.MaxInsertMany

// maxBatchRounds bounds the insert rounds of a batch: each round re-codes
// the items whose generated code was taken (a custom alias holding a
// sequential code, a random collision).
const maxBatchRounds = 32

// BatchCreateLinks creates 1 to MaxBatch links. Each item is validated on
// its own and fails on its own (BatchItemError, in the code and words
// CreateLink would use); the call fails as a whole only for a bad batch size,
// a missing tenant, a quota that cannot cover the batch (nothing is created),
// or a store that fails before anything was created.
//
// Cost: one CheckQuota of cost = the number of valid items (not counting
// the items with a password when no hashing slot is free: they fail
// UNAVAILABLE before it, as CreateLink would); passwords hashed on up to
// GOMAXPROCS workers; the sequential codes of the whole batch from
// one block allocation (codegen.Blocks.NextCodes: at most one nextval round
// trip); the rows in one multi-row INSERT ... ON CONFLICT (code) DO NOTHING
// (a taken alias does not abort the others; a generated code that was taken
// gets a fresh code in another, rare, round); the write-through in one Redis
// pipeline. Items with CODE_MODE_FROM_URL whose link exists already (or
// that repeat an earlier item's URL) return that link with created false
// and cost no quota (the batch's links of its URLs are read in one
// FromURLs, their visit counters in one Redis pipeline); the others are
// inserted one by one, as CreateLink does. The anonymous tenant's items
// with CODE_MODE_FROM_URL fail, as CreateLink refuses them. An item whose
// alias is already the tenant's link to the same URL returns that link
// too, created false, at no quota (one Taken and one GetMany for the
// batch's aliases, one pipeline for those links' visits); any other taken
// alias fails ALREADY_EXISTS, before the charge.
func (s *Service) BatchCreateLinks(ctx context.Context, req *shortenerv1.BatchCreateLinksRequest) (*shortenerv1.BatchCreateLinksResponse, error) {
	tenant, err := s.tenant(ctx)
	if err != nil {
		return nil, err
	}
	if k, err := callmeta.IncomingIdempotencyKey(ctx); k != "" || err != nil {
		return nil, rpcerr.WithDetails(codes.InvalidArgument,
			"a batch takes no idempotency key: one key cannot name its links apart; to send a batch again safely, give its items a customAlias or CODE_MODE_FROM_URL",
			rpcerr.Info(callmeta.ReasonIdempotencyKeyUnsupported, nil))
	}
	reqs := req.GetRequests()
	if len(reqs) < 1 || len(reqs) > MaxBatch {
		return nil, toStatus(ctx, s.log, "batch", rpcerr.Invalidf("requests", ReasonBatchSizeInvalid,
			"a batch holds 1 to %d links; this one holds %d", MaxBatch, len(reqs)))
	}

	results := make([]*shortenerv1.BatchCreateResult, len(reqs))
	drafts := make([]*draft, len(reqs)) // nil once the item failed
	fail := func(i int, err error) {
		results[i].Error = itemError(ctx, s.log, err)
		drafts[i] = nil
	}
	aliases := make(map[string]int)
	urls := make(map[string]int) // a from-URL item's URL key: its first item
	repeats := make(map[int]int) // item: the earlier item of the same URL
	var domains *tenantDomains   // read once, if an item names a domain
	valid := 0
	prepared := make([]*draft, len(reqs))  // items valid on their own
	ds := make([][]destination, len(reqs)) // their destinations
	for i, r := range reqs {
		results[i] = &shortenerv1.BatchCreateResult{Index: int32(i)}
		d, err := s.prepare(r)
		if err == nil {
			err = modeAllowed(tenant, d.mode)
		}
		if err != nil {
			fail(i, err)
			continue
		}
		d.link.Tenant = tenant
		if r.GetDomain() != "" && domains == nil {
			if domains, err = s.verifiedDomains(ctx, tenant); err != nil {
				return nil, toStatus(ctx, s.log, "batch", err)
			}
		}
		if d.link.Domain, err = domains.check(r.GetDomain()); err != nil {
			fail(i, err)
			continue
		}
		ds[i] = destinationsOf(d.link)
		if err := loopOn(d.link.Domain, ds[i]); err != nil {
			fail(i, err)
			continue
		}
		prepared[i] = &d
	}
	// Destinations on a domain kurz serves (servedLoops), one statement for
	// the batch, before the items are matched with each other (a refused
	// item takes no alias from a later one) and anything is charged.
	var idx []int
	var dests [][]destination
	for i, d := range prepared {
		if d != nil {
			idx, dests = append(idx, i), append(dests, ds[i])
		}
	}
	refused, err := s.servedLoops(ctx, dests)
	if err != nil {
		return nil, toStatus(ctx, s.log, "batch", err)
	}
	for k, rerr := range refused {
		prepared[idx[k]] = nil
		fail(idx[k], rerr)
	}
	// The tenant's links of the batch's URLs, in one query (and one Redis
	// pipeline for their visits) for the whole batch: an item whose link
	// exists costs no quota, so one read per item would let a batch sent
	// again make a thousand reads a call, call after call, for nothing.
	var keys [][]byte
	seen := make(map[string]bool)
	for _, d := range prepared {
		if d == nil || d.mode != shortenerv1.CodeMode_CODE_MODE_FROM_URL {
			continue
		}
		d.link.URLKey = codegen.URLKey(d.link.Domain, d.link.LongURL)
		if !seen[string(d.link.URLKey)] {
			seen[string(d.link.URLKey)] = true
			keys = append(keys, d.link.URLKey)
		}
	}
	existing, err := s.workingFromURLs(ctx, tenant, keys)
	if err != nil {
		return nil, toStatus(ctx, s.log, "batch", err)
	}
	for i, d := range prepared {
		if d == nil {
			continue
		}
		r := reqs[i]
		if d.mode == shortenerv1.CodeMode_CODE_MODE_CUSTOM {
			d.link.Code = linkdomain.Key(d.link.Domain, d.link.Code)
			if first, dup := aliases[d.link.Code]; dup {
				fail(i, rpcerr.WithDetails(codes.AlreadyExists,
					fmt.Sprintf("the alias %q is already used by item %d of this batch; choose another", r.GetCustomAlias(), first),
					rpcerr.Info(ReasonAliasTaken, map[string]string{"field": "custom_alias"})))
				continue
			}
			aliases[d.link.Code] = i
		}
		if d.mode == shortenerv1.CodeMode_CODE_MODE_FROM_URL {
			if first, dup := urls[string(d.link.URLKey)]; dup {
				repeats[i] = first
				continue
			}
			if l, ok := existing[string(d.link.URLKey)]; ok {
				s.m.repeated.Add(ctx, 1)
				results[i].Link = s.toProto(l)
				continue
			}
			urls[string(d.link.URLKey)] = i
		}
		drafts[i] = d
		valid++
	}
	// A taken alias would fail at the insert after its quota was spent: a
	// batch sent again (an import retried after an error) would spend the
	// quota on the rows that exist and never get further, and an import
	// of codes another tenant holds would pay for them here and again for
	// their new codes. The answer is the same whoever holds the alias, and
	// a live alias's existence is no secret: its short URL redirects. An
	// alias that is already the caller's link to the same URL is an item
	// sent again (its first answer lost, or the batch failed on another
	// item): it answers that link, not created and not charged, as
	// CreateLink answers a create sent again, so that a batch with aliases
	// is safe to send again; unless that link no longer redirects (disabled,
	// expired, its visits spent): the item then fails saying so, for its
	// link is not there as the caller asked for it. The taken aliases'
	// links are read in one query, and their visits in one Redis pipeline,
	// for the whole batch: these items cost no quota either.
	if len(aliases) > 0 {
		taken, err := s.store.Taken(ctx, slices.Collect(maps.Keys(aliases)))
		if err != nil {
			return nil, toStatus(ctx, s.log, "batch", err)
		}
		var mine map[string]linkstore.Link
		if len(taken) > 0 {
			if mine, err = s.store.GetMany(ctx, tenant, slices.Collect(maps.Keys(taken))); err != nil {
				return nil, toStatus(ctx, s.log, "batch", err)
			}
		}
		// Only the links that would answer their item unless their visits
		// are spent have their visits read, as notRedirecting would.
		var live []linkstore.Link
		for code, l := range mine {
			if l.LongURL == drafts[aliases[code]].link.LongURL && notRedirecting(l, false) == "" {
				live = append(live, l)
			}
		}
		spent := s.visitsSpentMany(ctx, live)
		for code := range taken {
			i := aliases[code]
			switch same, ok := mine[code]; {
			case ok && same.LongURL == drafts[i].link.LongURL:
				if why := notRedirecting(same, spent[code]); why != "" {
					fail(i, aliasNotRedirecting(aliasOf(code), why))
					break
				}
				s.m.repeated.Add(ctx, 1)
				results[i].Link = s.toProto(same)
				drafts[i] = nil
			default:
				fail(i, aliasTaken(aliasOf(code)))
			}
			valid--
		}
	}
	// A hashing slot before the charge, as CreateLink takes one: an item
	// refused for hashing capacity asks for the same request again, which
	// must not have cost it a link of the quota, and the slots are shared
	// by every tenant, so another tenant's passwords would decide what
	// this one loses. The batch holds the slot until its last hash, so an
	// item it paid for never fails for want of one.
	releaseHash := func() {}
	if pw := withPassword(drafts); len(pw) > 0 {
		release, err := s.hashSlot(ctx)
		if err != nil {
			for _, i := range pw {
				fail(i, err)
			}
			valid -= len(pw)
		} else {
			releaseHash = release
			defer release()
		}
	}
	if valid > 0 {
		if err := s.checkQuota(ctx, tenant, valid, chargeBatch); err != nil {
			return nil, err
		}
	}
	for i, d := range drafts {
		if d == nil {
			continue
		}
		if err := s.scanLink(ctx, d.link); err != nil {
			fail(i, err)
		}
	}
	for i, err := range s.hashPasswords(ctx, drafts) {
		if err != nil {
			fail(i, err)
		}
	}
	releaseHash()

	stored, err := s.insertBatch(ctx, drafts, fail)
	if err != nil && len(stored) == 0 {
		return nil, toStatus(ctx, s.log, "batch", err)
	}
	for i, d := range drafts {
		if err != nil || d == nil || d.mode != shortenerv1.CodeMode_CODE_MODE_FROM_URL {
			continue
		}
		l, created, ierr := s.insertFromURL(ctx, d.link)
		switch {
		case ierr != nil:
			fail(i, ierr)
		case created:
			stored[i] = l
		default: // a concurrent create won
			results[i].Link = s.toProto(l)
			drafts[i] = nil
		}
	}
	resp := &shortenerv1.BatchCreateLinksResponse{Results: results}
	links := make([]linkstore.Link, 0, len(stored))
	for i, d := range drafts {
		l, ok := stored[i]
		if !ok {
			if d != nil { // neither stored nor failed: the store failed mid-batch
				if err == nil {
					err = errBatchIncomplete
				}
				fail(i, err)
			}
			continue
		}
		results[i].Link, results[i].Created = s.toProto(l), true
		links = append(links, l)
		s.m.created.Add(ctx, 1, metric.WithAttributes(attribute.String("mode", modeName(d.mode))))
	}
	for i, first := range repeats {
		results[i].Link, results[i].Error = results[first].GetLink(), results[first].GetError()
	}
	resp.Created = int32(len(links))
	s.writeThrough(ctx, "batch", links...)
	return resp, nil
}

// aliasOf is the code of a link key.
func aliasOf(key string) string {
	_, code := linkdomain.Split(key)
	return code
}

// withPassword is the indices of the drafts that have a password.
func withPassword(drafts []*draft) []int {
	var idx []int
	for i, d := range drafts {
		if d != nil && d.password != "" {
			idx = append(idx, i)
		}
	}
	return idx
}

// hashPasswords hashes the passwords of drafts on at most GOMAXPROCS workers
// (Argon2id costs tens of milliseconds and 19 MiB each: unbounded, a batch of
// 1,000 would take every core and a lot of memory at once). The caller holds
// one of the process's hashing slots (hashSlot) for them: one worker hashes
// in it, and takes every item the others leave, so that none fails for want
// of a slot. The others hash in more slots while some are free, one slot per
// hash (capacity.Gate.TryAcquire: they neither wait nor take a waiting
// call's place), and stop at the first that is not. It returns one error
// per item that failed (the call's context ended), keyed by index.
func (s *Service) hashPasswords(ctx context.Context, drafts []*draft) map[int]error {
	todo := withPassword(drafts)
	errs := make(map[int]error)
	if len(todo) == 0 {
		return errs
	}
	work := make(chan int, len(todo))
	for _, i := range todo {
		work <- i
	}
	close(work)
	var mu sync.Mutex
	hash := func(i int) {
		err := ctx.Err()
		if err == nil {
			drafts[i].link.PasswordHash, err = hashIn(drafts[i].password)
		}
		if err != nil {
			mu.Lock()
			errs[i] = err
			mu.Unlock()
		}
	}
	var wg sync.WaitGroup
	wg.Go(func() { // in the caller's slot
		for i := range work {
			hash(i)
		}
	})
	// More workers than slots would only find them taken.
	for range min(runtime.GOMAXPROCS(0), s.hashes.Slots(), len(todo)) - 1 {
		wg.Go(func() {
			for {
				release, ok := s.hashes.TryAcquire()
				if !ok {
					return
				}
				i, more := <-work
				if more {
					hash(i)
				}
				release()
				if !more {
					return
				}
			}
		})
	}
	wg.Wait()
	return errs
}

// insertBatch gives the drafts their codes and inserts them, in rounds of one
// multi-row INSERT: a custom alias that is taken fails its item
// (ALREADY_EXISTS); a generated code that is taken, or that another item of
// the round holds, is drawn again in the next round. It returns the stored
// rows by item index; on an error, the rows of the earlier rounds (which are
// committed) and the error, which the caller reports for the rest.
func (s *Service) insertBatch(ctx context.Context, drafts []*draft, fail func(int, error)) (map[int]linkstore.Link, error) {
	stored := make(map[int]linkstore.Link)
	attempts := make(map[int]int) // random draws per item
	var pending []int
	// Custom aliases first, so that a generated code equal to one is the
	// one to yield.
	for i, d := range drafts {
		if d != nil && d.mode == shortenerv1.CodeMode_CODE_MODE_CUSTOM {
			pending = append(pending, i)
		}
	}
	for i, d := range drafts {
		if d != nil && d.mode != shortenerv1.CodeMode_CODE_MODE_CUSTOM && d.mode != shortenerv1.CodeMode_CODE_MODE_FROM_URL {
			pending = append(pending, i)
		}
	}
	for round := 1; len(pending) > 0; round++ {
		if round > maxBatchRounds {
			return stored, fmt.Errorf("batch: codes still taken after %d rounds", maxBatchRounds)
		}
		sequential := 0
		for _, i := range pending {
			if drafts[i].mode == shortenerv1.CodeMode_CODE_MODE_SEQUENTIAL {
				sequential++
			}
		}
		var seq []string
		if sequential > 0 {
			var err error
			if seq, err = s.blocks.NextCodes(ctx, sequential); err != nil {
				return stored, err
			}
		}
		var rows []linkstore.Link
		var owners, next []int
		inRound := make(map[string]bool, len(pending))
		for _, i := range pending {
			d := drafts[i]
			switch d.mode {
			case shortenerv1.CodeMode_CODE_MODE_SEQUENTIAL:
				d.link.Code, seq = linkdomain.Key(d.link.Domain, seq[0]), seq[1:]
			case shortenerv1.CodeMode_CODE_MODE_RANDOM:
				code, err := s.random.Code()
				if err != nil {
					return stored, err
				}
				d.link.Code = linkdomain.Key(d.link.Domain, code)
				attempts[i]++
			}
			if inRound[d.link.Code] { // only a generated code: aliases are distinct and come first
				next = append(next, i)
				continue
			}
			inRound[d.link.Code] = true
			rows = append(rows, d.link)
			owners = append(owners, i)
		}
		got, err := s.store.InsertMany(ctx, rows)
		if err != nil {
			return stored, err
		}
		for k, i := range owners {
			if l, ok := got[rows[k].Code]; ok {
				stored[i] = l
				continue
			}
			switch drafts[i].mode {
			case shortenerv1.CodeMode_CODE_MODE_CUSTOM:
				fail(i, aliasTaken(aliasOf(rows[k].Code)))
			case shortenerv1.CodeMode_CODE_MODE_RANDOM:
				if attempts[i] >= RandomAttempts {
					s.m.randomFailed.Add(ctx, 1)
					fail(i, rpcerr.RetryLater(codes.Unavailable, ReasonCodesExhausted,
						fmt.Sprintf("no free random code found in %d attempts; try again, or use sequential mode", RandomAttempts),
						time.Second, nil))
					continue
				}
				s.m.randomRetries.Add(ctx, 1)
				next = append(next, i)
			default:
				s.m.seqSkipped.Add(ctx, 1)
				next = append(next, i)
			}
		}
		pending = next
	}
	return stored, nil
}

// errBatchIncomplete stands for an item left unstored without a reason of
// its own (it cannot happen: every item is stored or failed).
var errBatchIncomplete = errors.New("batch: item neither stored nor failed")
