// Package linkstore keeps links in PostgreSQL (schema in kurz.dev/pkg/linkschema)
// and hands out blocks of sequential IDs from the link_block sequence. Every
// read and write of a tenant's links is scoped by tenant: another tenant's
// code looks exactly like a code that does not exist.
package linkstore

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

var (
	// ErrNotFound: no live link with this code for this tenant.
	ErrNotFound = errors.New("link not found")
	// ErrCodeTaken: the code is already used by some link (any tenant, live
	// or revoked).
	ErrCodeTaken = errors.New("code already taken")
	// ErrBadPageToken: the page token was not issued by List.
	ErrBadPageToken = errors.New("invalid page token")
)

// Link is one row of links.
type Link struct {
	Code     string
	Tenant   string
	LongURL  string
	Status   int // 0, 301, 302, 307 or 308; 0 = the redirect's default
	Created  time.Time
	Updated  time.Time
	Expires  *time.Time
	Disabled bool
	// Deleted is set once the link was revoked with DeleteLink.
	Deleted *time.Time
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

const columns = `code, tenant, long_url, redirect_type, created_at, updated_at, expires_at, disabled, deleted_at`

func scan(row pgx.Row) (Link, error) {
	var l Link
	var status int16
	err := row.Scan(&l.Code, &l.Tenant, &l.LongURL, &status, &l.Created, &l.Updated, &l.Expires, &l.Disabled, &l.Deleted)
	l.Status = int(status)
	return l, err
}

// NextBlock returns the next value of link_block: this process may use IDs
// [n*size, (n+1)*size). One call per block is the point of block allocation.
func (s *Store) NextBlock(ctx context.Context) (int64, error) {
	ctx, cancel := context.WithTimeout(ctx, s.timeout)
	defer cancel()
	var n int64
	if err := s.db.QueryRow(ctx, `SELECT nextval('link_block')`).Scan(&n); err != nil {
		return 0, fmt.Errorf("nextval link_block: %w", err)
	}
	return n, nil
}

// Insert stores l (Code, Tenant, LongURL, Status, Expires) unless its code is
// taken (ON CONFLICT DO NOTHING: a collision is an answer, not an error
// that aborts anything). It returns the stored row.
func (s *Store) Insert(ctx context.Context, l Link) (Link, error) {
	ctx, cancel := context.WithTimeout(ctx, s.timeout)
	defer cancel()
	got, err := scan(s.db.QueryRow(ctx, `
		INSERT INTO links (code, tenant, long_url, redirect_type, expires_at)
		VALUES ($1, $2, $3, $4, $5)
		ON CONFLICT (code) DO NOTHING
		RETURNING `+columns, l.Code, l.Tenant, l.LongURL, int16(l.Status), l.Expires))
	if errors.Is(err, pgx.ErrNoRows) {
		return Link{}, ErrCodeTaken
	}
	if err != nil {
		return Link{}, fmt.Errorf("insert link: %w", err)
	}
	return got, nil
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

// Page is one page of List.
type Page struct {
	Links []Link
	// Next is the token of the following page; empty on the last one.
	Next string
}

type cursor struct {
	CreatedUs int64  `json:"c"`
	Code      string `json:"k"`
}

// List returns up to size of tenant's live links, newest first, starting
// after token (empty: from the newest).
func (s *Store) List(ctx context.Context, tenant string, size int, token string) (Page, error) {
	ctx, cancel := context.WithTimeout(ctx, s.timeout)
	defer cancel()
	var rows pgx.Rows
	var err error
	if token == "" {
		rows, err = s.db.Query(ctx, `SELECT `+columns+` FROM links
			WHERE tenant = $1 AND deleted_at IS NULL
			ORDER BY created_at DESC, code DESC LIMIT $2`, tenant, size+1)
	} else {
		c, derr := decodeToken(token)
		if derr != nil {
			return Page{}, derr
		}
		rows, err = s.db.Query(ctx, `SELECT `+columns+` FROM links
			WHERE tenant = $1 AND deleted_at IS NULL AND (created_at, code) < ($2, $3)
			ORDER BY created_at DESC, code DESC LIMIT $4`, tenant, time.UnixMicro(c.CreatedUs), c.Code, size+1)
	}
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
		last := p.Links[size-1]
		p.Next = encodeToken(cursor{CreatedUs: last.Created.UnixMicro(), Code: last.Code})
	}
	return p, nil
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
	if err := json.Unmarshal(b, &c); err != nil || c.Code == "" {
		return cursor{}, ErrBadPageToken
	}
	return c, nil
}

// Changes lists the fields Update writes; nil pointers are left alone.
type Changes struct {
	LongURL  *string
	Status   *int
	Expires  **time.Time // set to a nil *time.Time to clear the expiry
	Disabled *bool
}

// Update applies ch to tenant's live link code and returns the new row.
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
	l, err := scan(s.db.QueryRow(ctx, `
		UPDATE links SET
			long_url      = COALESCE($3, long_url),
			redirect_type = COALESCE($4, redirect_type),
			expires_at    = CASE WHEN $5 THEN $6 ELSE expires_at END,
			disabled      = COALESCE($7, disabled),
			updated_at    = now()
		WHERE code = $1 AND tenant = $2 AND deleted_at IS NULL
		RETURNING `+columns, code, tenant, ch.LongURL, status, ch.Expires != nil, expires, ch.Disabled))
	if errors.Is(err, pgx.ErrNoRows) {
		return Link{}, ErrNotFound
	}
	if err != nil {
		return Link{}, fmt.Errorf("update link: %w", err)
	}
	return l, nil
}

// Delete revokes tenant's live link code: the row stays, marked deleted, so
// the code is never handed out again and keeps answering 410.
func (s *Store) Delete(ctx context.Context, tenant, code string) (Link, error) {
	ctx, cancel := context.WithTimeout(ctx, s.timeout)
	defer cancel()
	l, err := scan(s.db.QueryRow(ctx, `
		UPDATE links SET deleted_at = now(), updated_at = now()
		WHERE code = $1 AND tenant = $2 AND deleted_at IS NULL
		RETURNING `+columns, code, tenant))
	if errors.Is(err, pgx.ErrNoRows) {
		return Link{}, ErrNotFound
	}
	if err != nil {
		return Link{}, fmt.Errorf("delete link: %w", err)
	}
	return l, nil
}
