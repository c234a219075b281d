package linkapi_test

import (
	"context"
	"fmt"
	"maps"
	"sync"
	"testing"

	shortenerv1 "kurz.dev/gen/kurz/shortener/v1"
	"kurz.dev/services/shortener/internal/linkapi"
	"kurz.dev/services/shortener/internal/linkstore"
)

// countingStore counts the reads a batch makes to look its items up: one
// call per item (Get, FromURL) or per batch (Taken, GetMany, FromURLs).
type countingStore struct {
	linkapi.Store
	mu    sync.Mutex
	calls map[string]int
}

func (s *countingStore) count(method string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.calls[method]++
}

// took returns and resets the counts.
func (s *countingStore) took() map[string]int {
	s.mu.Lock()
	defer s.mu.Unlock()
	calls := s.calls
	s.calls = map[string]int{}
	return calls
}

func (s *countingStore) Get(ctx context.Context, tenant, code string) (linkstore.Link, error) {
	s.count("Get")
	return s.Store.Get(ctx, tenant, code)
}

func (s *countingStore) GetMany(ctx context.Context, tenant string, codes []string) (map[string]linkstore.Link, error) {
	s.count("GetMany")
	return s.Store.GetMany(ctx, tenant, codes)
}

func (s *countingStore) FromURL(ctx context.Context, tenant string, key []byte) (linkstore.Link, error) {
	s.count("FromURL")
	return s.Store.FromURL(ctx, tenant, key)
}

func (s *countingStore) FromURLs(ctx context.Context, tenant string, keys [][]byte) (map[string]linkstore.Link, error) {
	s.count("FromURLs")
	return s.Store.FromURLs(ctx, tenant, keys)
}

func (s *countingStore) Taken(ctx context.Context, codes []string) (map[string]bool, error) {
	s.count("Taken")
	return s.Store.Taken(ctx, codes)
}

// The items a batch answers without charging them (links made from their
// URL that exist already; aliases taken, by the caller's link to the same
// URL or by another tenant) are looked up in one store read per kind for
// the whole batch, and their visit counters in one Redis pipeline: not
// one read per item. Such a batch costs no quota, so a tenant sending it
// again and again made a thousand PostgreSQL reads (and Redis GETs) a call
// for nothing. The answers stay those of each item.
func TestBatchLooksItsItemsUpInOneReadPerKind(t *testing.T) {
	counted := &countingStore{calls: map[string]int{}}
	e := newEnvWith(t, func(d *linkapi.Deps) {
		counted.Store = d.Store
		d.Store = counted
	})
	batch := func(tenant string, items []*shortenerv1.CreateLinkRequest) *shortenerv1.BatchCreateLinksResponse {
		t.Helper()
		resp, err := e.client.BatchCreateLinks(as(tenant), &shortenerv1.BatchCreateLinksRequest{Requests: items})
		if err != nil {
			t.Fatal(err)
		}
		return resp
	}
	// sentAgain sends items as acme three times; each time, the batch
	// creates nothing, asks no quota, makes the store reads want and one
	// Redis pipeline of visit counters, and answers each item as check
	// says.
	sentAgain := func(t *testing.T, items []*shortenerv1.CreateLinkRequest, want map[string]int, check func(i int, r *shortenerv1.BatchCreateResult)) {
		t.Helper()
		counted.took()
		e.cache.reads()
		for round := range 3 {
			quota := len(e.limiter.Calls())
			resp := batch("acme", items)
			for i, r := range resp.GetResults() {
				check(i, r)
			}
			if resp.GetCreated() != 0 || len(e.limiter.Calls()) != quota {
				t.Errorf("round %d: created %d, %d quota checks; want none of either", round, resp.GetCreated(), len(e.limiter.Calls())-quota)
			}
			if got := counted.took(); !maps.Equal(got, want) {
				t.Errorf("round %d: store reads %v, want %v", round, got, want)
			}
			if gets, pipelines := e.cache.reads(); gets != 0 || pipelines != 1 {
				t.Errorf("round %d: %d GETs and %d pipelines of them; want one pipeline", round, gets, pipelines)
			}
		}
	}

	t.Run("FromURL", func(t *testing.T) {
		items := make([]*shortenerv1.CreateLinkRequest, linkapi.MaxBatch)
		for i := range items {
			items[i] = &shortenerv1.CreateLinkRequest{LongUrl: fmt.Sprintf("https://example.com/again/%d", i), Mode: fromURL, MaxVisits: 10}
		}
		items[len(items)-1].LongUrl = items[0].GetLongUrl() // answered as item 0
		first := batch("acme", items)
		if first.GetCreated() != linkapi.MaxBatch-1 || first.GetResults()[len(items)-1].GetLink().GetCode() != first.GetResults()[0].GetLink().GetCode() {
			t.Fatalf("first batch created %d, want %d, the last item answered as the first", first.GetCreated(), linkapi.MaxBatch-1)
		}
		sentAgain(t, items, map[string]int{"FromURLs": 1}, func(i int, r *shortenerv1.BatchCreateResult) {
			if want := first.GetResults()[i].GetLink().GetCode(); r.GetCreated() || r.GetError() != nil || r.GetLink().GetCode() != want {
				t.Errorf("item %d sent again: created %v, link %s, error %v; want its link %s, not created", i, r.GetCreated(), r.GetLink().GetCode(), r.GetError(), want)
			}
		})
	})

	t.Run("Aliases", func(t *testing.T) {
		// The first half are acme's aliases to the same URLs, the second
		// half globex's.
		items := make([]*shortenerv1.CreateLinkRequest, linkapi.MaxBatch)
		for i := range items {
			items[i] = &shortenerv1.CreateLinkRequest{LongUrl: fmt.Sprintf("https://example.com/alias/%d", i), CustomAlias: fmt.Sprintf("alias-%04d", i), MaxVisits: 10}
		}
		half := len(items) / 2
		if mine, theirs := batch("acme", items[:half]), batch("globex", items[half:]); mine.GetCreated() != int32(half) || theirs.GetCreated() != int32(len(items)-half) {
			t.Fatalf("the first batches created %d and %d, want %d each", mine.GetCreated(), theirs.GetCreated(), half)
		}
		sentAgain(t, items, map[string]int{"Taken": 1, "GetMany": 1}, func(i int, r *shortenerv1.BatchCreateResult) {
			switch alias := items[i].GetCustomAlias(); {
			case i < half && (r.GetCreated() || r.GetError() != nil || r.GetLink().GetCode() != alias):
				t.Errorf("item %d, acme's alias sent again: created %v, link %s, error %v; want its link, not created", i, r.GetCreated(), r.GetLink().GetCode(), r.GetError())
			case i >= half && (r.GetError().GetCode() != "ALREADY_EXISTS" || r.GetError().GetField() != "custom_alias" || r.GetLink() != nil):
				t.Errorf("item %d, globex's alias: link %v, error %v; want ALREADY_EXISTS on custom_alias", i, r.GetLink(), r.GetError())
			}
		})
	})
}
