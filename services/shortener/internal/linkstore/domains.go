package linkstore

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// verifiedNameIndex makes a verified name one tenant's (0009_domain_claims.sql).
const verifiedNameIndex = "domains_verified_name"

// Errors of the domain statements.
var (
	// ErrDomainNotFound: the tenant holds no domain of this name.
	ErrDomainNotFound = errors.New("domain not found")
	// ErrDomainTaken: another tenant has verified the domain.
	ErrDomainTaken = errors.New("domain registered by another tenant")
	// ErrDomainLimit: the tenant holds as many domains as it may.
	ErrDomainLimit = errors.New("too many domains")
	// ErrDomainInUse: live links are on the domain.
	ErrDomainInUse = errors.New("domain has live links")
)

// Domain is one row of domains.
type Domain struct {
	Name    string
	Tenant  string
	Token   string
	Created time.Time
	// Verified is when the domain was verified; nil while it is not.
	Verified *time.Time
	// VerifiedBy is "dns" or "admin"; "" while unverified.
	VerifiedBy string
}

const domainColumns = `name, tenant, token, created_at, verified_at, COALESCE(verified_by, '')`

func scanDomain(row pgx.Row) (Domain, error) {
	var d Domain
	err := row.Scan(&d.Name, &d.Tenant, &d.Token, &d.Created, &d.Verified, &d.VerifiedBy)
	return d, err
}

// RegisterDomain stores name as tenant's claim, unverified, with token,
// unless tenant holds max domains already (ErrDomainLimit) or another
// tenant has verified name (ErrDomainTaken): other tenants' unverified
// claims on name do not stand in the way, since the first to verify holds
// it (VerifyDomain). If tenant holds name already it returns that row and
// created false. Registrations of one tenant are serialised (an advisory
// lock on the tenant), so concurrent ones cannot pass max together.
func (s *Store) RegisterDomain(ctx context.Context, tenant, name, token string, max int) (d Domain, created bool, err error) {
	ctx, cancel := context.WithTimeout(ctx, s.timeout)
	defer cancel()
	tx, err := s.db.Begin(ctx)
	if err != nil {
		return Domain{}, false, fmt.Errorf("register domain: %w", err)
	}
	defer func() { _ = tx.Rollback(ctx) }()
	if _, err := tx.Exec(ctx, `SELECT pg_advisory_xact_lock(hashtext('kurz.domains:' || $1))`, tenant); err != nil {
		return Domain{}, false, fmt.Errorf("register domain: lock: %w", err)
	}
	d, err = scanDomain(tx.QueryRow(ctx, `SELECT `+domainColumns+` FROM domains
		WHERE name = $1 AND (tenant = $2 OR verified_at IS NOT NULL) ORDER BY tenant = $2 DESC LIMIT 1`, name, tenant))
	switch {
	case err == nil && d.Tenant == tenant:
		return d, false, nil
	case err == nil:
		return Domain{}, false, ErrDomainTaken
	case !errors.Is(err, pgx.ErrNoRows):
		return Domain{}, false, fmt.Errorf("register domain: %w", err)
	}
	var n int
	if err := tx.QueryRow(ctx, `SELECT count(*) FROM domains WHERE tenant = $1`, tenant).Scan(&n); err != nil {
		return Domain{}, false, fmt.Errorf("register domain: count: %w", err)
	}
	if n >= max {
		return Domain{}, false, ErrDomainLimit
	}
	// The tenant's lock keeps its own rows as read; another tenant may
	// verify name meanwhile, which leaves this claim to go with the rest
	// (VerifyDomain deletes the others' claims after taking the name).
	d, err = scanDomain(tx.QueryRow(ctx, `INSERT INTO domains (name, tenant, token) VALUES ($1, $2, $3)
		RETURNING `+domainColumns, name, tenant, token))
	if err != nil {
		return Domain{}, false, fmt.Errorf("register domain: %w", err)
	}
	if err := tx.Commit(ctx); err != nil {
		return Domain{}, false, fmt.Errorf("register domain: commit: %w", err)
	}
	return d, true, nil
}

// GetDomain returns tenant's domain name; another tenant's is
// ErrDomainNotFound, like one nobody holds.
func (s *Store) GetDomain(ctx context.Context, tenant, name string) (Domain, error) {
	ctx, cancel := context.WithTimeout(ctx, s.timeout)
	defer cancel()
	d, err := scanDomain(s.db.QueryRow(ctx, `SELECT `+domainColumns+` FROM domains WHERE name = $1 AND tenant = $2`, name, tenant))
	if errors.Is(err, pgx.ErrNoRows) {
		return Domain{}, ErrDomainNotFound
	}
	if err != nil {
		return Domain{}, fmt.Errorf("get domain: %w", err)
	}
	return d, nil
}

// Served returns those of names (normalised host names) that a tenant has
// verified: hosts the redirect serves, whichever tenant holds them.
func (s *Store) Served(ctx context.Context, names []string) (map[string]bool, error) {
	served := map[string]bool{}
	if len(names) == 0 {
		return served, nil
	}
	ctx, cancel := context.WithTimeout(ctx, s.timeout)
	defer cancel()
	rows, err := s.db.Query(ctx, `SELECT name FROM domains WHERE verified_at IS NOT NULL AND name = ANY($1)`, names)
	if err != nil {
		return nil, fmt.Errorf("served domains: %w", err)
	}
	found, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		return nil, fmt.Errorf("served domains: %w", err)
	}
	for _, n := range found {
		served[n] = true
	}
	return served, nil
}

// ListDomains returns tenant's domains by name, at most limit.
func (s *Store) ListDomains(ctx context.Context, tenant string, limit int) ([]Domain, error) {
	ctx, cancel := context.WithTimeout(ctx, s.timeout)
	defer cancel()
	rows, err := s.db.Query(ctx, `SELECT `+domainColumns+` FROM domains WHERE tenant = $1 ORDER BY name LIMIT $2`, tenant, limit)
	if err != nil {
		return nil, fmt.Errorf("list domains: %w", err)
	}
	ds, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (Domain, error) { return scanDomain(r) })
	if err != nil {
		return nil, fmt.Errorf("list domains: %w", err)
	}
	return ds, nil
}

// VerifyDomain marks tenant's domain name verified by by ("dns" or
// "admin"); a verified domain keeps its first verification. The first
// tenant to verify name holds it: another's verification is then
// ErrDomainTaken (the unique index on verified names decides a race), and
// the other tenants' claims on name are deleted with the verification
// (verifications of one name are serialised by an advisory lock).
func (s *Store) VerifyDomain(ctx context.Context, tenant, name, by string) (Domain, error) {
	ctx, cancel := context.WithTimeout(ctx, s.timeout)
	defer cancel()
	tx, err := s.db.Begin(ctx)
	if err != nil {
		return Domain{}, fmt.Errorf("verify domain: %w", err)
	}
	defer func() { _ = tx.Rollback(ctx) }()
	// Verifications of one name are serialised: two tenants' at once would
	// otherwise each wait for the other (one on the unique index, the other
	// deleting the first's claim).
	if _, err := tx.Exec(ctx, `SELECT pg_advisory_xact_lock(hashtext('kurz.domain-name:' || $1))`, name); err != nil {
		return Domain{}, fmt.Errorf("verify domain: lock: %w", err)
	}
	var held bool
	if err := tx.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM domains WHERE name = $1 AND tenant <> $2 AND verified_at IS NOT NULL)`,
		name, tenant).Scan(&held); err != nil {
		return Domain{}, fmt.Errorf("verify domain: %w", err)
	}
	if held {
		return Domain{}, ErrDomainTaken
	}
	d, err := scanDomain(tx.QueryRow(ctx, `UPDATE domains SET verified_at = COALESCE(verified_at, now()),
			verified_by = COALESCE(verified_by, $3)
		WHERE name = $1 AND tenant = $2 RETURNING `+domainColumns, name, tenant, by))
	var pgErr *pgconn.PgError
	switch {
	case errors.Is(err, pgx.ErrNoRows):
		return Domain{}, ErrDomainNotFound
	case errors.As(err, &pgErr) && pgErr.Code == "23505" && pgErr.ConstraintName == verifiedNameIndex:
		return Domain{}, ErrDomainTaken
	case err != nil:
		return Domain{}, fmt.Errorf("verify domain: %w", err)
	}
	if _, err := tx.Exec(ctx, `DELETE FROM domains WHERE name = $1 AND tenant <> $2`, name, tenant); err != nil {
		return Domain{}, fmt.Errorf("verify domain: other claims: %w", err)
	}
	if err := tx.Commit(ctx); err != nil {
		return Domain{}, fmt.Errorf("verify domain: commit: %w", err)
	}
	return d, nil
}

// DeleteDomain removes tenant's domain name unless live links are on it
// (ErrDomainInUse). Revoked links keep their rows: their keys stay taken,
// and the redirect serves a link only on a domain its own tenant holds.
// verified reports whether the row deleted was verified (read under the
// row's lock, so a verification that committed first counts): only then
// did what the redirect serves change.
func (s *Store) DeleteDomain(ctx context.Context, tenant, name string) (verified bool, err error) {
	ctx, cancel := context.WithTimeout(ctx, s.timeout)
	defer cancel()
	tx, err := s.db.Begin(ctx)
	if err != nil {
		return false, fmt.Errorf("delete domain: %w", err)
	}
	defer func() { _ = tx.Rollback(ctx) }()
	// The row's lock first, the count in a statement of its own: that
	// statement sees every link whose insert held the domain (lockDomains)
	// and committed while this one waited for the lock. Only the tenant's
	// own links count: another tenant's cannot be on its verified domain.
	err = tx.QueryRow(ctx, `SELECT verified_at IS NOT NULL FROM domains WHERE name = $1 AND tenant = $2 FOR UPDATE`, name, tenant).Scan(&verified)
	switch {
	case errors.Is(err, pgx.ErrNoRows):
		return false, ErrDomainNotFound
	case err != nil:
		return false, fmt.Errorf("delete domain: %w", err)
	}
	var inUse bool
	err = tx.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM links WHERE domain = $1 AND tenant = $2 AND deleted_at IS NULL)`,
		name, tenant).Scan(&inUse)
	switch {
	case err != nil:
		return false, fmt.Errorf("delete domain: %w", err)
	case inUse:
		return false, ErrDomainInUse
	}
	if _, err := tx.Exec(ctx, `DELETE FROM domains WHERE name = $1 AND tenant = $2`, name, tenant); err != nil {
		return false, fmt.Errorf("delete domain: %w", err)
	}
	if err := tx.Commit(ctx); err != nil {
		return false, fmt.Errorf("delete domain: commit: %w", err)
	}
	return verified, nil
}
