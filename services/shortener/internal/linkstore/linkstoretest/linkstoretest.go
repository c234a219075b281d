// Package linkstoretest is an in-memory stand-in for linkstore.Store, for
// the unit tests of its callers (linkapi). It passes linkstore's contract
// test, as the PostgreSQL store does: the same tenant scoping, taken codes,
// page order and tokens, revocation and queue of invalidations.
package linkstoretest

import (
	"cmp"
	"context"
	"fmt"
	"math"
	"slices"
	"sync"
	"time"

	"kurz.dev/pkg/linkrules"
	"kurz.dev/services/shortener/internal/linkstore"
)

// Fake is an in-memory link store; safe for concurrent use. The zero value
// is not usable: call New.
type Fake struct {
	mu sync.Mutex
	// links holds every link ever inserted, by code: deleted ones stay, as
	// rows do in PostgreSQL, so their codes stay taken.
	links map[string]*row
	queue map[string]*invalidation
	// block is the last value NextBlocks handed out.
	block int64
	// versions is the last Link.Version given to a row: every write takes
	// the next, as xmin takes each write's transaction ID.
	versions uint32
	// fail, when set, is what every call returns.
	fail error
	// Served, when set, answers which hosts are verified custom domains,
	// for Insert's Link.RefuseHosts (the PostgreSQL store reads the
	// domains table); unset, none is.
	Served func(hosts []string) bool
}

type row struct {
	link linkstore.Link
	// requestKey and requestHash are the link's Link.RequestKey and
	// RequestHash, kept out of link: only ByRequest reads them back.
	requestKey, requestHash []byte
	// version counts the link's changes: Refresh keeps an invalidation
	// whose link changed while it was written.
	version int
}

type invalidation struct {
	created, next time.Time
	attempts      int
}

// New returns an empty store.
func New() *Fake {
	return &Fake{links: make(map[string]*row), queue: make(map[string]*invalidation)}
}

// Fail makes every later call return err, as a store that cannot be
// reached would (e.g. a *net.OpError); nil heals it.
func (f *Fake) Fail(err error) {
	f.mu.Lock()
	f.fail = err
	f.mu.Unlock()
}

// lock takes mu and returns the failure set with Fail, if any; the caller
// unlocks (a deferred Unlock may come first).
func (f *Fake) lock() error {
	f.mu.Lock()
	return f.fail
}

// now is PostgreSQL's now() as the store reads it back: microseconds.
func now() time.Time { return time.Now().Truncate(time.Microsecond) }

// clone copies l so that neither the caller nor the store sees the other's
// later changes.
func clone(l linkstore.Link) linkstore.Link {
	l.Tags = append([]string{}, l.Tags...)
	l.URLKey = slices.Clone(l.URLKey)
	if l.Expires != nil {
		e := *l.Expires
		l.Expires = &e
	}
	if l.Deleted != nil {
		d := *l.Deleted
		l.Deleted = &d
	}
	l.Rules = copyRules(l.Rules)
	return l
}

// copyRules deep-copies (and compiles) s through its stored form, as the
// rules column does; nil when empty.
func copyRules(s *linkrules.Set) *linkrules.Set {
	c, err := linkrules.Parse(s.Marshal())
	if err != nil {
		panic(err) // the service only stores compiled sets
	}
	return c
}

// NextBlocks returns n fresh block numbers (codegen.BlockSource).
func (f *Fake) NextBlocks(_ context.Context, n int) ([]int64, error) {
	defer f.mu.Unlock()
	if err := f.lock(); err != nil {
		return nil, err
	}
	out := make([]int64, n)
	for i := range out {
		f.block++
		out[i] = f.block
	}
	return out, nil
}

// insert stores l as Insert does, at t; the caller holds mu.
func (f *Fake) insert(l linkstore.Link, t time.Time) (linkstore.Link, bool) {
	if _, taken := f.links[l.Code]; taken {
		return linkstore.Link{}, false
	}
	l.URLKey = slices.Clone(l.URLKey)
	l = clone(l)
	l.RefuseHosts = nil // not stored
	l.Created, l.Updated, l.Disabled, l.Deleted = t, t, false, nil
	f.versions++
	l.Version = f.versions
	r := &row{link: l, requestKey: slices.Clone(l.RequestKey), requestHash: slices.Clone(l.RequestHash)}
	r.link.RequestKey, r.link.RequestHash = nil, nil
	f.links[l.Code] = r
	return clone(r.link), true
}

// Insert stores l unless its code is taken (linkstore.ErrCodeTaken), its
// URLKey is held by a working link (linkstore.ErrURLTaken; a disabled or
// expired holder gives the key up to l) or its RequestKey by a live one
// (linkstore.ErrRequestTaken).
func (f *Fake) Insert(_ context.Context, l linkstore.Link) (linkstore.Link, error) {
	defer f.mu.Unlock()
	if err := f.lock(); err != nil {
		return linkstore.Link{}, err
	}
	if len(l.RefuseHosts) > 0 && f.Served != nil && f.Served(l.RefuseHosts) {
		return linkstore.Link{}, linkstore.ErrHostServed
	}
	t := now()
	// A taken code comes first, as ON CONFLICT (code) DO NOTHING does.
	if _, taken := f.links[l.Code]; !taken {
		if _, held := f.byRequest(l.Tenant, l.RequestKey); held {
			return linkstore.Link{}, linkstore.ErrRequestTaken
		}
	}
	if _, taken := f.links[l.Code]; !taken && l.URLKey != nil {
		if r, ok := f.fromURL(l.Tenant, l.URLKey); ok {
			if working(r.link, t) {
				return linkstore.Link{}, linkstore.ErrURLTaken
			}
			r.link.URLKey = nil // released to l, as the PostgreSQL store does
			f.versions++
			r.link.Version = f.versions
		}
	}
	stored, ok := f.insert(l, t)
	if !ok {
		return linkstore.Link{}, linkstore.ErrCodeTaken
	}
	return stored, nil
}

// working reports whether l serves its destination at t: neither disabled
// nor expired (the redirect's expiry: t at or after Expires).
func working(l linkstore.Link, t time.Time) bool {
	return !l.Disabled && (l.Expires == nil || t.Before(*l.Expires))
}

// fromURL finds tenant's live link with URLKey key, working or not; the
// caller holds mu.
func (f *Fake) fromURL(tenant string, key []byte) (*row, bool) {
	for _, r := range f.links {
		if r.link.Tenant == tenant && r.link.Deleted == nil && r.link.URLKey != nil && string(r.link.URLKey) == string(key) {
			return r, true
		}
	}
	return nil, false
}

// byRequest finds tenant's live link made with RequestKey key; never one
// for a nil key. The caller holds mu.
func (f *Fake) byRequest(tenant string, key []byte) (*row, bool) {
	if key == nil {
		return nil, false
	}
	for _, r := range f.links {
		if r.link.Tenant == tenant && r.link.Deleted == nil && r.requestKey != nil && string(r.requestKey) == string(key) {
			return r, true
		}
	}
	return nil, false
}

// ByRequest returns tenant's live link made with RequestKey key, with its
// RequestKey and RequestHash, or linkstore.ErrNotFound.
func (f *Fake) ByRequest(_ context.Context, tenant string, key []byte) (linkstore.Link, error) {
	defer f.mu.Unlock()
	if err := f.lock(); err != nil {
		return linkstore.Link{}, err
	}
	r, ok := f.byRequest(tenant, key)
	if !ok {
		return linkstore.Link{}, linkstore.ErrNotFound
	}
	l := clone(r.link)
	l.RequestKey, l.RequestHash = slices.Clone(r.requestKey), slices.Clone(r.requestHash)
	return l, nil
}

// FromURL returns tenant's working link made from the URL of key, or
// linkstore.ErrNotFound.
func (f *Fake) FromURL(_ context.Context, tenant string, key []byte) (linkstore.Link, error) {
	defer f.mu.Unlock()
	if err := f.lock(); err != nil {
		return linkstore.Link{}, err
	}
	r, ok := f.fromURL(tenant, key)
	if !ok || !working(r.link, now()) {
		return linkstore.Link{}, linkstore.ErrNotFound
	}
	return clone(r.link), nil
}

// FromURLs returns tenant's working links made from the URLs of keys, by
// string(URLKey); a key without one is left out.
func (f *Fake) FromURLs(_ context.Context, tenant string, keys [][]byte) (map[string]linkstore.Link, error) {
	defer f.mu.Unlock()
	if err := f.lock(); err != nil {
		return nil, err
	}
	t := now() // one statement: one now()
	out := make(map[string]linkstore.Link)
	for _, k := range keys {
		if r, ok := f.fromURL(tenant, k); ok && working(r.link, t) {
			out[string(k)] = clone(r.link)
		}
	}
	return out, nil
}

// ReleaseURLKey takes the URL key from tenant's link code if it still
// holds key.
func (f *Fake) ReleaseURLKey(_ context.Context, tenant, code string, key []byte) error {
	defer f.mu.Unlock()
	if err := f.lock(); err != nil {
		return err
	}
	if r, ok := f.links[code]; ok && r.link.Tenant == tenant && r.link.URLKey != nil && string(r.link.URLKey) == string(key) {
		r.link.URLKey = nil
		f.versions++
		r.link.Version = f.versions
	}
	return nil
}

// InsertMany stores the links whose codes are free, all at once.
func (f *Fake) InsertMany(_ context.Context, links []linkstore.Link) (map[string]linkstore.Link, error) {
	defer f.mu.Unlock()
	if err := f.lock(); err != nil {
		return nil, err
	}
	if len(links) == 0 || len(links) > linkstore.MaxInsertMany {
		return nil, fmt.Errorf("insert links: %d rows, want 1 to %d", len(links), linkstore.MaxInsertMany)
	}
	for _, l := range links {
		if l.URLKey != nil || l.RequestKey != nil {
			return nil, fmt.Errorf("insert links: %s is made from its URL or with an idempotency key: use Insert", l.Code)
		}
	}
	t := now() // one statement: one now()
	out := make(map[string]linkstore.Link, len(links))
	for _, l := range links {
		if stored, ok := f.insert(l, t); ok {
			out[l.Code] = stored
		}
	}
	return out, nil
}

// Taken returns which of codes any tenant's links hold, revoked ones
// included.
func (f *Fake) Taken(_ context.Context, codes []string) (map[string]bool, error) {
	defer f.mu.Unlock()
	if err := f.lock(); err != nil {
		return nil, err
	}
	out := make(map[string]bool)
	for _, c := range codes {
		if _, ok := f.links[c]; ok {
			out[c] = true
		}
	}
	return out, nil
}

// lockLive takes mu (see lock) and finds tenant's live link code:
// linkstore.ErrNotFound without one.
func (f *Fake) lockLive(tenant, code string) (*row, error) {
	if err := f.lock(); err != nil {
		return nil, err
	}
	r, ok := f.links[code]
	if !ok || r.link.Tenant != tenant || r.link.Deleted != nil {
		return nil, linkstore.ErrNotFound
	}
	return r, nil
}

// Get returns tenant's live link code, or linkstore.ErrNotFound.
func (f *Fake) Get(_ context.Context, tenant, code string) (linkstore.Link, error) {
	defer f.mu.Unlock()
	r, err := f.lockLive(tenant, code)
	if err != nil {
		return linkstore.Link{}, err
	}
	return clone(r.link), nil
}

// GetMany returns tenant's live links with codes, by code; a code without
// one is left out.
func (f *Fake) GetMany(_ context.Context, tenant string, codes []string) (map[string]linkstore.Link, error) {
	defer f.mu.Unlock()
	if err := f.lock(); err != nil {
		return nil, err
	}
	out := make(map[string]linkstore.Link)
	for _, c := range codes {
		if r, ok := f.links[c]; ok && r.link.Tenant == tenant && r.link.Deleted == nil {
			out[c] = clone(r.link)
		}
	}
	return out, nil
}

// newestFirst orders links as List does: created_at DESC, code DESC.
func newestFirst(a, b linkstore.Link) int {
	if c := b.Created.Compare(a.Created); c != 0 {
		return c
	}
	return cmp.Compare(b.Code, a.Code)
}

// List pages through tenant's live links (with tag, only those carrying
// it), newest first, after token.
func (f *Fake) List(_ context.Context, tenant string, size int, token, tag string) (linkstore.Page, error) {
	defer f.mu.Unlock()
	if err := f.lock(); err != nil {
		return linkstore.Page{}, err
	}
	var after linkstore.Link // the cursor, as a link; zero: none
	if token != "" {
		created, code, err := linkstore.ParseToken(token, tenant, tag)
		if err != nil {
			return linkstore.Page{}, err
		}
		after = linkstore.Link{Created: created, Code: code}
	}
	var links []linkstore.Link
	for _, r := range f.links {
		l := r.link
		if l.Tenant != tenant || l.Deleted != nil || (tag != "" && !slices.Contains(l.Tags, tag)) ||
			(token != "" && newestFirst(l, after) <= 0) {
			continue
		}
		links = append(links, clone(l))
	}
	slices.SortFunc(links, newestFirst)
	p := linkstore.Page{Links: links}
	if len(links) > size {
		p.Links = links[:size]
		p.Next = linkstore.TokenAfter(p.Links[size-1], tag)
	}
	return p, nil
}

// Live returns up to n live, enabled links of every tenant with codes after
// the given one, in code order.
func (f *Fake) Live(_ context.Context, after string, n int) ([]linkstore.Link, error) {
	defer f.mu.Unlock()
	if err := f.lock(); err != nil {
		return nil, err
	}
	var links []linkstore.Link
	for code, r := range f.links {
		if code > after && r.link.Deleted == nil && !r.link.Disabled {
			links = append(links, clone(r.link))
		}
	}
	slices.SortFunc(links, func(a, b linkstore.Link) int { return cmp.Compare(a.Code, b.Code) })
	return links[:min(n, len(links))], nil
}

// change applies edit to tenant's live link code and queues its
// invalidation, as Update and Delete do.
func (f *Fake) change(tenant, code string, ifVersion *uint32, edit func(*linkstore.Link, time.Time)) (linkstore.Link, error) {
	defer f.mu.Unlock()
	r, err := f.lockLive(tenant, code)
	if err != nil {
		return linkstore.Link{}, err
	}
	if ifVersion != nil && *ifVersion != r.link.Version {
		return linkstore.Link{}, linkstore.ErrChanged
	}
	t := now()
	edit(&r.link, t)
	r.link.Updated = t
	r.version++
	f.versions++
	r.link.Version = f.versions
	if _, queued := f.queue[code]; !queued {
		f.queue[code] = &invalidation{created: t, next: t}
	}
	return clone(r.link), nil
}

// Update applies ch to tenant's live link code and queues an invalidation.
func (f *Fake) Update(_ context.Context, tenant, code string, ch linkstore.Changes) (linkstore.Link, error) {
	return f.change(tenant, code, ch.IfVersion, func(l *linkstore.Link, _ time.Time) {
		if ch.LongURL != nil {
			if *ch.LongURL != l.LongURL {
				l.URLKey = nil
			}
			l.LongURL = *ch.LongURL
		}
		if ch.Status != nil {
			l.Status = *ch.Status
		}
		if ch.Expires != nil {
			l.Expires = nil
			if *ch.Expires != nil {
				e := **ch.Expires
				l.Expires = &e
			}
		}
		if ch.Disabled != nil {
			l.Disabled = *ch.Disabled
		}
		if ch.Tags != nil {
			l.Tags = append([]string{}, *ch.Tags...)
		}
		if ch.Title != nil {
			l.Title = *ch.Title
		}
		if ch.MaxVisits != nil {
			l.MaxVisits = *ch.MaxVisits
		}
		if ch.PasswordHash != nil {
			l.PasswordHash = *ch.PasswordHash
		}
		if ch.Targets != nil {
			l.IOSURL, l.AndroidURL, l.DesktopURL = ch.Targets.IOS, ch.Targets.Android, ch.Targets.Desktop
		}
		if ch.Rules != nil || ch.Variants != nil {
			var s linkrules.Set
			if l.Rules != nil {
				s.Rules, s.Variants = l.Rules.Rules, l.Rules.Variants
			}
			if ch.Rules != nil {
				s.Rules = *ch.Rules
			}
			if ch.Variants != nil {
				s.Variants = *ch.Variants
			}
			l.Rules = copyRules(&s)
		}
	})
}

// Delete revokes tenant's live link code and queues an invalidation.
func (f *Fake) Delete(_ context.Context, tenant, code string, ifVersion *uint32) (linkstore.Link, error) {
	return f.change(tenant, code, ifVersion, func(l *linkstore.Link, t time.Time) { l.Deleted = &t })
}

// Refresh is refreshMany of one code, write called with its link.
func (f *Fake) Refresh(ctx context.Context, code string, write func(context.Context, linkstore.Link) error) error {
	return f.refreshMany(ctx, []string{code}, func(ctx context.Context, links []linkstore.Link) error {
		if len(links) == 0 {
			return nil
		}
		return write(ctx, links[0])
	})
}

// refreshMany hands the codes' links to write and, once it succeeded, drops
// their queued invalidations, unless a link changed meanwhile (the
// PostgreSQL store's row lock makes that change wait and queue anew: the
// same outcome). Codes without a link have theirs dropped at once.
func (f *Fake) refreshMany(ctx context.Context, codes []string, write func(context.Context, []linkstore.Link) error) error {
	if err := f.lock(); err != nil {
		f.mu.Unlock()
		return err
	}
	var links []linkstore.Link
	versions := map[string]int{}
	for _, code := range codes {
		r, ok := f.links[code]
		if !ok {
			delete(f.queue, code)
			continue
		}
		links = append(links, clone(r.link))
		versions[code] = r.version
	}
	f.mu.Unlock()
	if len(links) > 0 {
		if err := write(ctx, links); err != nil {
			return err
		}
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	for code, v := range versions {
		if f.links[code].version == v {
			delete(f.queue, code)
		}
	}
	return nil
}

// DueInvalidations returns up to limit codes whose invalidation is due,
// oldest first.
func (f *Fake) DueInvalidations(_ context.Context, limit int) ([]string, error) {
	defer f.mu.Unlock()
	if err := f.lock(); err != nil {
		return nil, err
	}
	t := now()
	var due []string
	for code, inv := range f.queue {
		if !inv.next.After(t) {
			due = append(due, code)
		}
	}
	slices.SortFunc(due, func(a, b string) int { return f.queue[a].created.Compare(f.queue[b].created) })
	return due[:min(limit, len(due))], nil
}

// Postpone delays code's invalidation by base, doubled per earlier
// failure, at most maxDelay.
func (f *Fake) Postpone(_ context.Context, code string, base, maxDelay time.Duration) error {
	defer f.mu.Unlock()
	if err := f.lock(); err != nil {
		return err
	}
	inv, ok := f.queue[code]
	if !ok {
		return nil
	}
	secs := min(base.Seconds()*math.Pow(2, float64(min(inv.attempts, 30))), maxDelay.Seconds())
	inv.next = now().Add(time.Duration(secs * float64(time.Second)))
	inv.attempts++
	return nil
}

// PendingInvalidations returns how many invalidations are queued and how
// long the oldest has waited.
func (f *Fake) PendingInvalidations(context.Context) (int64, time.Duration, error) {
	defer f.mu.Unlock()
	if err := f.lock(); err != nil {
		return 0, 0, err
	}
	var oldest time.Duration
	t := now()
	for _, inv := range f.queue {
		oldest = max(oldest, t.Sub(inv.created))
	}
	return int64(len(f.queue)), oldest, nil
}
