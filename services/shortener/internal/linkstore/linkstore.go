// Package linkstore keeps links in PostgreSQL (schema in kurz.dev/pkg/linkschema)
// and hands out blocks of sequential IDs from the link_block sequence. Every
// read and write of a tenant's links is scoped by tenant: another tenant's
// code looks exactly like a code that does not exist.
package linkstore

import (
	"context"
	"crypto/sha256"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"time"
	"unicode/utf8"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"kurz.dev/pkg/linkrules"
)

var (
	// ErrNotFound: no live link with this code for this tenant.
	ErrNotFound = errors.New("link not found")
	// ErrChanged: a change asked for one state of the link (a version), and
	// the link has changed since.
	ErrChanged = errors.New("link changed since the version given")
	// ErrCodeTaken: the code is already used by some link (any tenant, live
	// or revoked).
	ErrCodeTaken = errors.New("code already taken")

	// ErrDomainGone: a link's domain is no longer its tenant's verified
	// domain (deleted, or lost to another tenant's verification) since the
	// caller checked it; nothing was stored.
	ErrDomainGone = errors.New("the link's domain is no longer the tenant's verified domain")
	// ErrURLTaken: the tenant has a live link made from this URL already
	// (another Link.URLKey equal to this one's): FromURL returns it.
	ErrURLTaken = errors.New("the tenant has a link from this URL already")
	// ErrRequestTaken: the tenant has a live link made by a create with
	// this idempotency key (another Link.RequestKey equal to this one's):
	// ByRequest returns it.
	ErrRequestTaken = errors.New("the tenant has a link made with this idempotency key")
	// ErrHostServed: one of the hosts an insert was to refuse
	// (Link.RefuseHosts) is a verified custom domain: nothing is stored.
	ErrHostServed = errors.New("a destination is on a domain kurz serves")
	// ErrBadPageToken: the page token was not issued by List.
	ErrBadPageToken = errors.New("invalid page token")
	// ErrPageTokenTag: the page token was issued by List with another tag
	// filter than the one it came back with.
	ErrPageTokenTag = errors.New("page token of another tag filter")
	// ErrPageTokenTenant: the page token was issued by List to another
	// tenant than the one it came back from.
	ErrPageTokenTenant = errors.New("page token of another tenant")
)

// Link is one row of links.
type Link struct {
	// Code is the link's key (pkg/linkdomain.Key): the code itself on the
	// default domain, "<domain>/<code>" on a custom one.
	Code string
	// Domain is the link's custom domain; "" for the default domain.
	Domain   string
	Tenant   string
	LongURL  string
	Status   int // 0, 301, 302, 307 or 308; 0 = the redirect's default
	Created  time.Time
	Updated  time.Time
	Expires  *time.Time
	Disabled bool
	// Deleted is set once the link was revoked with DeleteLink.
	Deleted *time.Time
	// Tags are the link's labels, normalised by the caller; never nil when
	// read (an empty slice for none).
	Tags []string
	// Title is the link's title, validated by the caller; "" for none.
	Title string
	// MaxVisits is the visit limit; 0 means none.
	MaxVisits int64
	// PasswordHash is the Argon2id PHC string; empty: no password.
	PasswordHash string
	// IOSURL, AndroidURL and DesktopURL are per-device targets; empty: LongURL.
	IOSURL, AndroidURL, DesktopURL string
	// Rules are the link's redirect rules and variants, compiled; nil for
	// none.
	Rules *linkrules.Set
	// URLKey is set on a link made with codes from the URL: the SHA-256 of
	// LongURL. A tenant has at most one live link per URLKey; an update of
	// LongURL clears it. Nil for every other link.
	URLKey []byte
	// RequestKey is set on a link made by a create with an idempotency key:
	// the SHA-256 of the key. A tenant has at most one live link per
	// RequestKey. RequestHash is the SHA-256 of that create's request, to
	// tell its repeats from another request sent with the same key. Both
	// are written by Insert and read by ByRequest only (nil elsewhere).
	RequestKey, RequestHash []byte
	// Version names the row's current state: PostgreSQL's xmin, which
	// every write of the row (an UPDATE of any column) replaces, and a
	// lock does not. Changes.IfVersion and Delete's ifVersion apply a
	// change only while the row still is in that state.
	Version uint32
	// RefuseHosts (Insert only, not stored): the hosts of the link's
	// destinations; the insert stores nothing (ErrHostServed) when one of
	// them is a verified custom domain as it runs, in the same statement.
	RefuseHosts []string
}

// Store reads and writes links. Every statement is bounded by timeout.
type Store struct {
	db      *pgxpool.Pool
	timeout time.Duration
}

// New returns a Store over db.
func New(db *pgxpool.Pool, timeout time.Duration) *Store {
	return &Store{db: db, timeout: timeout}
}

const columns = `code, tenant, long_url, redirect_type, created_at, updated_at, expires_at, disabled, deleted_at,
	tags, max_visits, password_hash, ios_url, android_url, desktop_url, rules, url_key, domain, title, xmin`

// scan reads a row of columns, then into extra the row's further columns.
func scan(row pgx.Row, extra ...any) (Link, error) {
	var l Link
	var status int16
	var hash, ios, android, desktop *string
	var rules []byte
	err := row.Scan(append([]any{&l.Code, &l.Tenant, &l.LongURL, &status, &l.Created, &l.Updated, &l.Expires, &l.Disabled, &l.Deleted,
		&l.Tags, &l.MaxVisits, &hash, &ios, &android, &desktop, &rules, &l.URLKey, &l.Domain, &l.Title, &l.Version}, extra...)...)
	if err != nil {
		return l, err
	}
	l.Status = int(status)
	if l.Rules, err = linkrules.Parse(rules); err != nil {
		return l, fmt.Errorf("link %s: %w", l.Code, err)
	}
	l.PasswordHash, l.IOSURL, l.AndroidURL, l.DesktopURL = deref(hash), deref(ios), deref(android), deref(desktop)
	if l.Tags == nil {
		l.Tags = []string{}
	}
	return l, err
}

func deref(s *string) string {
	if s == nil {
		return ""
	}
	return *s
}

// nullIfEmpty stores "" as NULL (no password, no device target).
func nullIfEmpty(s string) *string {
	if s == "" {
		return nil
	}
	return &s
}

// tagsOf never hands pgx a nil slice: that would be NULL, and tags is NOT NULL.
func tagsOf(tags []string) []string {
	if tags == nil {
		return []string{}
	}
	return tags
}

// NextBlocks returns n fresh values of link_block in one round trip: this
// process may use IDs [b*size, (b+1)*size) of each. One nextval per block,
// and one round trip per fetch, is the point of block allocation.
func (s *Store) NextBlocks(ctx context.Context, n int) ([]int64, error) {
	ctx, cancel := context.WithTimeout(ctx, s.timeout)
	defer cancel()
	rows, err := s.db.Query(ctx, `SELECT nextval('link_block') FROM generate_series(1, $1)`, n)
	if err != nil {
		return nil, fmt.Errorf("nextval link_block: %w", err)
	}
	blocks, err := pgx.CollectRows(rows, pgx.RowTo[int64])
	if err != nil {
		return nil, fmt.Errorf("nextval link_block: %w", err)
	}
	if len(blocks) != n {
		return nil, fmt.Errorf("nextval link_block: %d values for %d blocks", len(blocks), n)
	}
	return blocks, nil
}

// insertColumns are the columns Insert and InsertMany write, in the order
// of insertArgs.
const insertColumns = `code, tenant, long_url, redirect_type, expires_at, tags, max_visits, password_hash, ios_url, android_url, desktop_url, rules, domain, title`

func insertArgs(l Link) []any {
	return []any{l.Code, l.Tenant, l.LongURL, int16(l.Status), l.Expires, tagsOf(l.Tags), l.MaxVisits,
		nullIfEmpty(l.PasswordHash), nullIfEmpty(l.IOSURL), nullIfEmpty(l.AndroidURL), nullIfEmpty(l.DesktopURL), rulesJSON(l.Rules),
		l.Domain, l.Title, l.URLKey}
}

// rulesJSON is a Set as the rules column stores it: NULL for none.
func rulesJSON(s *linkrules.Set) *string {
	b := s.Marshal()
	if b == nil {
		return nil
	}
	v := string(b)
	return &v
}

// urlKeyIndex is the unique index of links made from their URL
// (0008_links_from_url.sql).
const urlKeyIndex = "links_tenant_url_key"

// requestKeyIndex is the unique index of links made with an idempotency
// key (0016_links_request_key_index.sql).
const requestKeyIndex = "links_tenant_request_key"

// releaseURLKey takes the URL key ($2) from tenant $1's link of the URL
// that no longer works (disabled, or expired: the redirect's expiry is
// now >= expires_at), so that a new link can hold it. A working link keeps
// it, and the new link's insert meets the unique index.
const releaseURLKey = `UPDATE links SET url_key = NULL
	WHERE tenant = $1 AND url_key = $2 AND deleted_at IS NULL AND (disabled OR expires_at <= now())`

// Insert stores l (Code, Tenant, LongURL, Status, Expires, Tags, Title, MaxVisits,
// PasswordHash, the device URLs, Rules, URLKey, RequestKey and RequestHash)
// unless its code is taken (ON CONFLICT DO NOTHING: a collision is an
// answer, not an error that aborts anything), its URLKey is (ErrURLTaken)
// or its RequestKey is (ErrRequestTaken: of two concurrent inserts with
// one key, the second waits for the first to commit, then meets its row). It returns the stored
// row. With a URLKey, the tenant's link of the URL that is disabled or
// expired gives the key up to l, in l's transaction: if l is not stored,
// that link keeps it. So the tenant has at most one link per URL key, and
// FromURL finds a working one whenever a create succeeded.
func (s *Store) Insert(ctx context.Context, l Link) (Link, error) {
	ctx, cancel := context.WithTimeout(ctx, s.timeout)
	defer cancel()
	if l.URLKey == nil && l.Domain == "" {
		return insert(ctx, s.db, l)
	}
	tx, err := s.db.Begin(ctx)
	if err != nil {
		return Link{}, fmt.Errorf("insert link: begin: %w", err)
	}
	defer func() { _ = tx.Rollback(ctx) }() // after Commit: a no-op
	if err := lockDomains(ctx, tx, []Link{l}); err != nil {
		return Link{}, err
	}
	// Concurrent creates of the URL queue on the old link's row lock; the
	// later ones find its key gone and meet the first one's link instead
	// (its code, or the unique index).
	if l.URLKey != nil {
		if _, err := tx.Exec(ctx, releaseURLKey, l.Tenant, l.URLKey); err != nil {
			return Link{}, fmt.Errorf("insert link: release url key: %w", err)
		}
	}
	got, err := insert(ctx, tx, l)
	if err != nil {
		return Link{}, err
	}
	if err := tx.Commit(ctx); err != nil {
		return Link{}, fmt.Errorf("insert link: commit: %w", err)
	}
	return got, nil
}

// querier is what insert needs of the pool or of a transaction.
type querier interface {
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}

// servedIn is true when one of the hosts $n (text[]) is a verified domain.
func servedIn(n int) string {
	return fmt.Sprintf(`EXISTS (SELECT 1 FROM domains WHERE verified_at IS NOT NULL AND name = ANY($%d))`, n)
}

// insert is Insert's statement, on db. A row that is not stored was
// refused for its code or, when a refused host is served, for that: told
// apart by a second statement only then.
func insert(ctx context.Context, db querier, l Link) (Link, error) {
	got, err := scan(db.QueryRow(ctx, `
		INSERT INTO links (`+insertColumns+`, url_key, request_key, request_hash)
		SELECT $1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12::jsonb, $13, $14, $15, $16, $17
		WHERE NOT `+servedIn(18)+`
		ON CONFLICT (code) DO NOTHING
		RETURNING `+columns, append(insertArgs(l), l.RequestKey, l.RequestHash, l.RefuseHosts)...))
	if errors.Is(err, pgx.ErrNoRows) {
		if len(l.RefuseHosts) > 0 {
			var served bool
			if err := db.QueryRow(ctx, `SELECT `+servedIn(1), l.RefuseHosts).Scan(&served); err != nil {
				return Link{}, fmt.Errorf("insert link: served domains: %w", err)
			}
			if served {
				return Link{}, ErrHostServed
			}
		}
		return Link{}, ErrCodeTaken
	}
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) && pgErr.Code == "23505" {
		switch pgErr.ConstraintName {
		case urlKeyIndex:
			return Link{}, ErrURLTaken
		case requestKeyIndex:
			return Link{}, ErrRequestTaken
		}
	}
	if err != nil {
		return Link{}, fmt.Errorf("insert link: %w", err)
	}
	return got, nil
}

// MaxInsertMany bounds InsertMany (the arrays it sends grow with it).
const MaxInsertMany = 1000

// insertMany is one statement whatever the number of rows (so pgx prepares
// and caches it once): the rows travel as one array per column and unnest
// back into rows. Tags, an array per row, travel as a JSON array each.
const insertMany = `
	INSERT INTO links (` + insertColumns + `)
	SELECT r.code, r.tenant, r.long_url, r.redirect_type, r.expires_at,
		ARRAY(SELECT t.tag FROM jsonb_array_elements_text(r.tags::jsonb) WITH ORDINALITY AS t(tag, n) ORDER BY t.n),
		r.max_visits, r.password_hash, r.ios_url, r.android_url, r.desktop_url, r.rules::jsonb, r.domain, r.title
	FROM unnest($1::text[], $2::text[], $3::text[], $4::int2[], $5::timestamptz[], $6::text[], $7::int8[],
		$8::text[], $9::text[], $10::text[], $11::text[], $12::text[], $13::text[], $14::text[])
		AS r(code, tenant, long_url, redirect_type, expires_at, tags, max_visits, password_hash, ios_url, android_url, desktop_url, rules, domain, title)
	ON CONFLICT (code) DO NOTHING
	RETURNING ` + columns

// InsertMany stores links in one statement (one round trip, atomic) and
// returns the rows stored, keyed by code. A link whose code is taken is left
// out of the result, not an error (ON CONFLICT DO NOTHING): the others are
// still stored. Codes must be distinct within links (a code twice would make
// the result ambiguous); 1 to MaxInsertMany links. Links made from their
// URL (URLKey set) or with an idempotency key (RequestKey set) go through
// Insert, one by one: InsertMany refuses them.
func (s *Store) InsertMany(ctx context.Context, links []Link) (map[string]Link, error) {
	if len(links) == 0 || len(links) > MaxInsertMany {
		return nil, fmt.Errorf("insert links: %d rows, want 1 to %d", len(links), MaxInsertMany)
	}
	if err := noKeys(links); err != nil {
		return nil, err
	}
	n := len(links)
	var (
		code, tenant, longURL, tags = make([]string, n), make([]string, n), make([]string, n), make([]string, n)
		domain, title               = make([]string, n), make([]string, n)
		status                      = make([]int16, n)
		expires                     = make([]*time.Time, n)
		maxVisits                   = make([]int64, n)
		hash, ios, android, desktop = make([]*string, n), make([]*string, n), make([]*string, n), make([]*string, n)
		rules                       = make([]*string, n)
	)
	for i, l := range links {
		t, err := json.Marshal(tagsOf(l.Tags))
		if err != nil {
			return nil, fmt.Errorf("insert links: encode tags: %w", err)
		}
		code[i], tenant[i], longURL[i], status[i], expires[i], tags[i] = l.Code, l.Tenant, l.LongURL, int16(l.Status), l.Expires, string(t)
		maxVisits[i], hash[i], domain[i], title[i] = l.MaxVisits, nullIfEmpty(l.PasswordHash), l.Domain, l.Title
		ios[i], android[i], desktop[i] = nullIfEmpty(l.IOSURL), nullIfEmpty(l.AndroidURL), nullIfEmpty(l.DesktopURL)
		rules[i] = rulesJSON(l.Rules)
	}
	ctx, cancel := context.WithTimeout(ctx, s.timeout)
	defer cancel()
	tx, err := s.db.Begin(ctx)
	if err != nil {
		return nil, fmt.Errorf("insert links: begin: %w", err)
	}
	defer func() { _ = tx.Rollback(ctx) }() // after Commit: a no-op
	if err := lockDomains(ctx, tx, links); err != nil {
		return nil, err
	}
	rows, err := tx.Query(ctx, insertMany, code, tenant, longURL, status, expires, tags, maxVisits, hash, ios, android, desktop, rules, domain, title)
	if err != nil {
		return nil, fmt.Errorf("insert links: %w", err)
	}
	stored, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (Link, error) { return scan(r) })
	if err != nil {
		return nil, fmt.Errorf("insert links: %w", err)
	}
	if err := tx.Commit(ctx); err != nil {
		return nil, fmt.Errorf("insert links: commit: %w", err)
	}
	out := make(map[string]Link, len(stored))
	for _, l := range stored {
		out[l.Code] = l
	}
	return out, nil
}

// Taken returns which of codes some link holds, any tenant's, revoked
// (deleted) ones included: codes an insert would leave out. It says
// nothing of whose they are. It is a look before the fact (an insert may
// still find a code taken since, and decides); BatchCreateLinks uses it to
// refuse aliases that are taken before it charges their quota: charged,
// an import whose codes another tenant holds paid for them once refused
// and again for their new codes, and on a plan whose burst is the file's
// size never finished.
func (s *Store) Taken(ctx context.Context, codes []string) (map[string]bool, error) {
	if len(codes) == 0 {
		return map[string]bool{}, nil
	}
	ctx, cancel := context.WithTimeout(ctx, s.timeout)
	defer cancel()
	rows, err := s.db.Query(ctx, `SELECT code FROM links WHERE code = ANY($1::text[])`, codes)
	if err != nil {
		return nil, fmt.Errorf("taken codes: %w", err)
	}
	held, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		return nil, fmt.Errorf("taken codes: %w", err)
	}
	out := make(map[string]bool, len(held))
	for _, c := range held {
		out[c] = true
	}
	return out, nil
}

// lockDomains takes a share lock, until tx ends, on the verified domain of
// each link that has one (its tenant's registration), or fails with
// ErrDomainGone: the caller checked the domain earlier (before hashing a
// password, say), and DeleteDomain may have removed it since. DeleteDomain
// locks the row for update before it counts the domain's links, so either
// it waits for these links and sees them (DOMAIN_IN_USE), or they wait for
// it and find the domain gone: no link is left on a domain nobody holds.
func lockDomains(ctx context.Context, tx pgx.Tx, links []Link) error {
	type claim struct{ tenant, name string }
	want := map[claim]bool{}
	var tenants, names []string
	for _, l := range links {
		c := claim{l.Tenant, l.Domain}
		if l.Domain == "" || want[c] {
			continue
		}
		want[c] = true
		tenants, names = append(tenants, c.tenant), append(names, c.name)
	}
	if len(names) == 0 {
		return nil
	}
	rows, err := tx.Query(ctx, `SELECT d.tenant, d.name FROM domains d
		JOIN unnest($1::text[], $2::text[]) AS w(tenant, name) ON d.tenant = w.tenant AND d.name = w.name
		WHERE d.verified_at IS NOT NULL
		FOR SHARE OF d`, tenants, names)
	if err != nil {
		return fmt.Errorf("insert links: lock domains: %w", err)
	}
	held, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (claim, error) {
		var c claim
		return c, r.Scan(&c.tenant, &c.name)
	})
	if err != nil {
		return fmt.Errorf("insert links: lock domains: %w", err)
	}
	if len(held) != len(names) {
		return ErrDomainGone
	}
	return nil
}

// noKeys refuses links made from their URL or with an idempotency key in
// InsertMany.
func noKeys(links []Link) error {
	for _, l := range links {
		if l.URLKey != nil || l.RequestKey != nil {
			return fmt.Errorf("insert links: %s is made from its URL or with an idempotency key: use Insert", l.Code)
		}
	}
	return nil
}

// FromURL returns tenant's working link made from the URL whose key is key
// (Link.URLKey): not deleted, not disabled, not expired. ErrNotFound
// without one; a disabled or expired link of the URL gives its key up to
// the next Insert of the URL. It is FromURLs of one key: one statement says
// what a working link is.
func (s *Store) FromURL(ctx context.Context, tenant string, key []byte) (Link, error) {
	found, err := s.FromURLs(ctx, tenant, [][]byte{key})
	if err != nil {
		return Link{}, err
	}
	l, ok := found[string(key)]
	if !ok {
		return Link{}, ErrNotFound
	}
	return l, nil
}

// FromURLs is FromURL for many URL keys in one query: tenant's working
// links made from the URLs whose keys are keys, keyed by string(URLKey); a
// key without one is left out. Another tenant's links of the same URLs are
// never returned. BatchCreateLinks looks its whole batch up with it: one
// query per batch, not one per item, for the items a batch sent again
// answers without charging them.
func (s *Store) FromURLs(ctx context.Context, tenant string, keys [][]byte) (map[string]Link, error) {
	if len(keys) == 0 {
		return map[string]Link{}, nil
	}
	return s.linksBy(ctx, "find links from urls", func(l Link) string { return string(l.URLKey) }, `SELECT `+columns+` FROM links
		WHERE tenant = $1 AND url_key = ANY($2::bytea[]) AND deleted_at IS NULL
			AND NOT disabled AND (expires_at IS NULL OR expires_at > now())`, tenant, keys)
}

// linksBy runs query, a SELECT of columns, within the store's timeout and
// returns its links by key(link); what names the query in its errors.
func (s *Store) linksBy(ctx context.Context, what string, key func(Link) string, query string, args ...any) (map[string]Link, error) {
	ctx, cancel := context.WithTimeout(ctx, s.timeout)
	defer cancel()
	rows, err := s.db.Query(ctx, query, args...)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", what, err)
	}
	links, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (Link, error) { return scan(r) })
	if err != nil {
		return nil, fmt.Errorf("%s: %w", what, err)
	}
	out := make(map[string]Link, len(links))
	for _, l := range links {
		out[key(l)] = l
	}
	return out, nil
}

// ByRequest returns tenant's live (not deleted) link made by a create with
// the idempotency key whose SHA-256 is key (Link.RequestKey), with its
// RequestKey and RequestHash; ErrNotFound without one.
func (s *Store) ByRequest(ctx context.Context, tenant string, key []byte) (Link, error) {
	ctx, cancel := context.WithTimeout(ctx, s.timeout)
	defer cancel()
	var hash []byte
	l, err := scan(s.db.QueryRow(ctx, `SELECT `+columns+`, request_hash FROM links
		WHERE tenant = $1 AND request_key = $2 AND deleted_at IS NULL`, tenant, key), &hash)
	if errors.Is(err, pgx.ErrNoRows) {
		return Link{}, ErrNotFound
	}
	if err != nil {
		return Link{}, fmt.Errorf("find link by idempotency key: %w", err)
	}
	l.RequestKey, l.RequestHash = key, hash
	return l, nil
}

// ReleaseURLKey takes the URL key from tenant's link code if it still
// holds key, so that the next link made from the URL takes its place: for
// a link that stopped working in a way PostgreSQL does not know of (its
// visits, counted in Redis, are spent). It is idempotent: a link that no
// longer holds the key is left alone.
func (s *Store) ReleaseURLKey(ctx context.Context, tenant, code string, key []byte) error {
	ctx, cancel := context.WithTimeout(ctx, s.timeout)
	defer cancel()
	if _, err := s.db.Exec(ctx, `UPDATE links SET url_key = NULL
		WHERE tenant = $1 AND code = $2 AND url_key = $3`, tenant, code, key); err != nil {
		return fmt.Errorf("release url key: %w", err)
	}
	return nil
}

// Get returns tenant's live (not deleted) link with code.
func (s *Store) Get(ctx context.Context, tenant, code string) (Link, error) {
	ctx, cancel := context.WithTimeout(ctx, s.timeout)
	defer cancel()
	l, err := scan(s.db.QueryRow(ctx, `SELECT `+columns+` FROM links
		WHERE code = $1 AND tenant = $2 AND deleted_at IS NULL`, code, tenant))
	if errors.Is(err, pgx.ErrNoRows) {
		return Link{}, ErrNotFound
	}
	if err != nil {
		return Link{}, fmt.Errorf("get link: %w", err)
	}
	return l, nil
}

// GetMany is Get for many codes in one query: tenant's live links with
// codes, keyed by code; a code without one (free, revoked, or another
// tenant's) is left out. BatchCreateLinks reads the links of its taken
// aliases with it: one query per batch, not one per alias.
func (s *Store) GetMany(ctx context.Context, tenant string, codes []string) (map[string]Link, error) {
	if len(codes) == 0 {
		return map[string]Link{}, nil
	}
	return s.linksBy(ctx, "get links", func(l Link) string { return l.Code }, `SELECT `+columns+` FROM links
		WHERE code = ANY($1::text[]) AND tenant = $2 AND deleted_at IS NULL`, codes, tenant)
}

// Page is one page of List.
type Page struct {
	Links []Link
	// Next is the token of the following page; empty on the last one.
	Next string
}

// cursor is a page token's content. Tag ties it to the tag filter of the
// listing that issued it (empty: none), Tenant to the tenant it was issued
// to (tenantMark; empty in the tokens of versions before it, which are
// taken as they always were, so that a listing paged across a rolling
// upgrade goes on).
type cursor struct {
	CreatedUs int64  `json:"c"`
	Code      string `json:"k"`
	Tag       string `json:"g,omitempty"`
	Tenant    string `json:"t,omitempty"`
}

// tenantMark is what a token holds of its tenant: enough to refuse another
// tenant's token with a clear error (the listing is scoped by tenant anyway,
// so a forged mark reads nothing more), without writing the tenant's id
// into a token clients keep and log.
func tenantMark(tenant string) string {
	h := sha256.Sum256([]byte("kurz page token tenant\x00" + tenant))
	return base64.RawURLEncoding.EncodeToString(h[:9])
}

// List returns up to size of tenant's live links, newest first, starting
// after token (empty: from the newest). A non-empty tag keeps only the links
// carrying it; a token is only valid with the tag it was issued for
// (ErrPageTokenTag otherwise) and from the tenant it was issued to
// (ErrPageTokenTenant).
func (s *Store) List(ctx context.Context, tenant string, size int, token, tag string) (Page, error) {
	ctx, cancel := context.WithTimeout(ctx, s.timeout)
	defer cancel()
	where := `tenant = $1 AND deleted_at IS NULL`
	args := []any{tenant}
	if tag != "" {
		args = append(args, []string{tag})
		where += ` AND tags @> $` + strconv.Itoa(len(args)) + `::text[]`
	}
	if token != "" {
		created, code, err := ParseToken(token, tenant, tag)
		if err != nil {
			return Page{}, err
		}
		args = append(args, created, code)
		where += fmt.Sprintf(` AND (created_at, code) < ($%d, $%d)`, len(args)-1, len(args))
	}
	args = append(args, size+1)
	rows, err := s.db.Query(ctx, `SELECT `+columns+` FROM links WHERE `+where+`
		ORDER BY created_at DESC, code DESC LIMIT $`+strconv.Itoa(len(args)), args...)
	if err != nil {
		return Page{}, fmt.Errorf("list links: %w", err)
	}
	links, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (Link, error) { return scan(r) })
	if err != nil {
		return Page{}, fmt.Errorf("list links: %w", err)
	}
	p := Page{Links: links}
	if len(links) > size {
		p.Links = links[:size]
		p.Next = TokenAfter(p.Links[size-1], tag)
	}
	return p, nil
}

// Live returns up to n live links (not deleted, not disabled) of every
// tenant with codes after the given one, in code order: the keyset walk of
// background sweeps.
func (s *Store) Live(ctx context.Context, after string, n int) ([]Link, error) {
	ctx, cancel := context.WithTimeout(ctx, s.timeout)
	defer cancel()
	rows, err := s.db.Query(ctx, `SELECT `+columns+` FROM links
		WHERE code > $1 AND deleted_at IS NULL AND NOT disabled ORDER BY code LIMIT $2`, after, n)
	if err != nil {
		return nil, fmt.Errorf("live links: %w", err)
	}
	links, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (Link, error) { return scan(r) })
	if err != nil {
		return nil, fmt.Errorf("live links: %w", err)
	}
	return links, nil
}

// TokenAfter is the page token that continues a listing (with tag) right
// after l: how a caller that ends a page early, before its last link, names
// where the next page starts.
func TokenAfter(l Link, tag string) string {
	return encodeToken(cursor{CreatedUs: l.Created.UnixMicro(), Code: l.Code, Tag: tag, Tenant: tenantMark(l.Tenant)})
}

func encodeToken(c cursor) string {
	b, _ := json.Marshal(c) // cannot fail: an integer and a string
	return base64.RawURLEncoding.EncodeToString(b)
}

func decodeToken(t string) (cursor, error) {
	b, err := base64.RawURLEncoding.DecodeString(t)
	if err != nil {
		return cursor{}, ErrBadPageToken
	}
	var c cursor
	if err := json.Unmarshal(b, &c); err != nil || c.Code == "" || !plainText(c.Code) || !plainText(c.Tag) ||
		c.CreatedUs < 0 || c.CreatedUs > maxCursorUs {
		return cursor{}, ErrBadPageToken
	}
	return c, nil
}

// maxCursorUs is the end of year 9999 in Unix microseconds: no listing
// writes a time outside 1970..9999 into a token, and PostgreSQL refuses
// (or pgx wraps) times far outside it.
const maxCursorUs = 253402300799999999

// plainText reports whether s is UTF-8 without control characters, as
// every code and tag a listing writes into a token is (json.Unmarshal
// turns bytes that are not UTF-8 into U+FFFD, which no code or tag holds
// either): anything else is a forged token, and PostgreSQL would refuse a
// NUL with an error of its own.
func plainText(s string) bool {
	for _, r := range s {
		if r < 0x20 || r == 0x7f || r == utf8.RuneError {
			return false
		}
	}
	return true
}

// ParseToken reads back a page token of List or TokenAfter that tenant
// sent with the tag filter tag: the listing continues after the link
// created at created with code. ErrBadPageToken if it is not such a token,
// ErrPageTokenTag if it was issued with another tag filter,
// ErrPageTokenTenant if to another tenant. Stores that stand in for this
// one (a test's fake) use it too: they must continue the listings whose
// tokens linkapi makes with TokenAfter.
func ParseToken(token, tenant, tag string) (created time.Time, code string, err error) {
	c, err := decodeToken(token)
	if err != nil {
		return time.Time{}, "", err
	}
	if c.Tenant != "" && c.Tenant != tenantMark(tenant) {
		return time.Time{}, "", ErrPageTokenTenant
	}
	if c.Tag != tag {
		return time.Time{}, "", ErrPageTokenTag
	}
	return time.UnixMicro(c.CreatedUs), c.Code, nil
}

// Changes lists the fields Update writes; nil pointers are left alone.
type Changes struct {
	LongURL  *string
	Status   *int
	Expires  **time.Time // set to a nil *time.Time to clear the expiry
	Disabled *bool
	// Tags replaces the tags (an empty slice clears them).
	Tags *[]string
	// Title replaces the title ("" clears it).
	Title *string
	// MaxVisits replaces the visit limit. The visits counted so far (in
	// Redis) are kept.
	MaxVisits *int64
	// PasswordHash replaces the hash; "" removes the password.
	PasswordHash *string
	// Targets replaces all three device URLs at once; "" clears one.
	Targets *DeviceURLs
	// Rules replaces the redirect rules (an empty slice clears them) and
	// Variants the variants, each leaving the other as it is.
	Rules    *[]linkrules.Rule
	Variants *[]linkrules.Variant
	// IfVersion, when set, applies the changes only if the link is still
	// in this state (Link.Version): ErrChanged if it is not.
	IfVersion *uint32
}

// DeviceURLs are the three per-device targets of a link; "" is none.
type DeviceURLs struct {
	IOS, Android, Desktop string
}

// queueing turns update, an UPDATE of one row of links without RETURNING,
// into one statement that also queues an invalidation of the row's code in
// link_invalidations (unless one is queued already: it stands for this
// change too) and returns the new row: the change and its invalidation
// commit together or not at all. The INSERT reads the UPDATE's output, so it
// runs only once the UPDATE holds the row's lock.
func queueing(update string) string {
	return `WITH changed AS (` + update + ` RETURNING ` + columns + `),
		queued AS (INSERT INTO link_invalidations (code) SELECT code FROM changed ON CONFLICT (code) DO NOTHING)
	SELECT ` + columns + ` FROM changed`
}

// Update applies ch to tenant's live link code, queues an invalidation of
// code (see Refresh) and returns the new row.
func (s *Store) Update(ctx context.Context, tenant, code string, ch Changes) (Link, error) {
	ctx, cancel := context.WithTimeout(ctx, s.timeout)
	defer cancel()
	var status *int16
	if ch.Status != nil {
		v := int16(*ch.Status)
		status = &v
	}
	var expires *time.Time
	if ch.Expires != nil {
		expires = *ch.Expires
	}
	var tags []string
	if ch.Tags != nil {
		tags = tagsOf(*ch.Tags)
	}
	var hash *string
	if ch.PasswordHash != nil {
		hash = nullIfEmpty(*ch.PasswordHash)
	}
	var targets DeviceURLs
	if ch.Targets != nil {
		targets = *ch.Targets
	}
	l, err := scan(s.db.QueryRow(ctx, queueing(`
		UPDATE links SET
			long_url      = COALESCE($3, long_url),
			redirect_type = COALESCE($4, redirect_type),
			expires_at    = CASE WHEN $5 THEN $6 ELSE expires_at END,
			disabled      = COALESCE($7, disabled),
			tags          = CASE WHEN $8 THEN $9::text[] ELSE tags END,
			max_visits    = COALESCE($10, max_visits),
			password_hash = CASE WHEN $11 THEN $12 ELSE password_hash END,
			ios_url       = CASE WHEN $13 THEN $14 ELSE ios_url END,
			android_url   = CASE WHEN $13 THEN $15 ELSE android_url END,
			desktop_url   = CASE WHEN $13 THEN $16 ELSE desktop_url END,
			rules         = CASE WHEN $17 OR $19 THEN NULLIF(COALESCE(rules, '{}'::jsonb)
				- (CASE WHEN $17 THEN 'r' ELSE '' END) - (CASE WHEN $19 THEN 'v' ELSE '' END)
				|| COALESCE($18::jsonb, '{}'::jsonb) || COALESCE($20::jsonb, '{}'::jsonb), '{}'::jsonb) ELSE rules END,
			url_key       = CASE WHEN $3::text IS DISTINCT FROM NULL AND $3::text <> long_url THEN NULL ELSE url_key END,
			title         = COALESCE($22, title),
			updated_at    = now()
		WHERE code = $1 AND tenant = $2 AND deleted_at IS NULL AND `+inVersion(21)), code, tenant, ch.LongURL, status, ch.Expires != nil, expires, ch.Disabled,
		ch.Tags != nil, tags, ch.MaxVisits, ch.PasswordHash != nil, hash,
		ch.Targets != nil, nullIfEmpty(targets.IOS), nullIfEmpty(targets.Android), nullIfEmpty(targets.Desktop),
		ch.Rules != nil, rulesPart(ch.Rules, nil), ch.Variants != nil, rulesPart(nil, ch.Variants), versionArg(ch.IfVersion), ch.Title))
	if errors.Is(err, pgx.ErrNoRows) {
		return Link{}, s.missing(ctx, tenant, code, ch.IfVersion)
	}
	if err != nil {
		return Link{}, fmt.Errorf("update link: %w", err)
	}
	return l, nil
}

// inVersion is the condition of a change made only in one state of the
// row: parameter $n (a bigint, NULL for any state) is its Link.Version.
// Under READ COMMITTED a row changed by a transaction this one waited for
// is checked again in its new state, whose xmin differs.
func inVersion(n int) string {
	return fmt.Sprintf(`($%d::bigint IS NULL OR xmin::text::bigint = $%[1]d)`, n)
}

func versionArg(v *uint32) *int64 {
	if v == nil {
		return nil
	}
	n := int64(*v)
	return &n
}

// missing tells why a change of tenant's link code found no row: the link
// is not there, or (with a version) it changed since that version.
func (s *Store) missing(ctx context.Context, tenant, code string, ifVersion *uint32) error {
	if ifVersion == nil {
		return ErrNotFound
	}
	var live bool
	if err := s.db.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM links WHERE code = $1 AND tenant = $2 AND deleted_at IS NULL)`,
		code, tenant).Scan(&live); err != nil {
		return fmt.Errorf("change link: %w", err)
	}
	if live {
		return ErrChanged
	}
	return ErrNotFound
}

// rulesPart is the rules or the variants of Changes as a JSON object of the
// rules column ({"r": [...]} or {"v": [...]}), NULL when unset or empty.
func rulesPart(rules *[]linkrules.Rule, variants *[]linkrules.Variant) *string {
	var s linkrules.Set
	if rules != nil {
		s.Rules = *rules
	}
	if variants != nil {
		s.Variants = *variants
	}
	return rulesJSON(&s)
}

// Delete revokes tenant's live link code: the row stays, marked deleted, so
// the code is never handed out again and keeps answering 410. Like Update, it
// queues an invalidation of code, and with ifVersion deletes only the link
// in that state (ErrChanged otherwise).
func (s *Store) Delete(ctx context.Context, tenant, code string, ifVersion *uint32) (Link, error) {
	ctx, cancel := context.WithTimeout(ctx, s.timeout)
	defer cancel()
	l, err := scan(s.db.QueryRow(ctx, queueing(`
		UPDATE links SET deleted_at = now(), updated_at = now()
		WHERE code = $1 AND tenant = $2 AND deleted_at IS NULL AND `+inVersion(3)), code, tenant, versionArg(ifVersion)))
	if errors.Is(err, pgx.ErrNoRows) {
		return Link{}, s.missing(ctx, tenant, code, ifVersion)
	}
	if err != nil {
		return Link{}, fmt.Errorf("delete link: %w", err)
	}
	return l, nil
}
