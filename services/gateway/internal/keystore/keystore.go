// Package keystore keeps the gateway's tenants and their API keys in
// PostgreSQL, and writes each tenant's plan where the limiter reads it
// (rl_tenant_plans), in the same transaction.
//
// An API key reads kurz_<id>_<secret>: id is 12 base62 characters (public,
// the key's name in logs, in the limiter and in the admin API), secret is 32
// base62 characters from crypto/rand (about 190 bits). Only SHA-256 of the
// whole key is stored. A fast hash is enough here: slow password hashes
// (bcrypt, argon2) exist to make guessing low-entropy passwords expensive,
// and nobody can enumerate 2^190 secrets at any hash speed; a fast hash keeps
// every authenticated request at one primary-key lookup.
package keystore

import (
	"context"
	"crypto/sha256"
	"crypto/subtle"
	"errors"
	"fmt"
	"regexp"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"kurz.dev/pkg/callmeta"
	"kurz.dev/pkg/linkcode"
)

// Key format: KeyPrefix + id + "_" + secret.
const (
	KeyPrefix    = "kurz_"
	keyIDLen     = 12
	keySecretLen = 32
	maxNameLen   = 200
	// MaxReasonLen bounds a suspension's reason, in bytes.
	MaxReasonLen = 500
)

var (
	// ErrNotFound means no such tenant or key (for this tenant).
	ErrNotFound = errors.New("keystore: not found")
	// ErrExists means a tenant with that ID exists already.
	ErrExists = errors.New("keystore: tenant exists")
	// ErrInvalidKey means a presented API key is malformed, unknown or
	// revoked. Callers must not tell the three apart to the client.
	ErrInvalidKey = errors.New("keystore: invalid API key")
	// ErrTenantSuspended means a presented API key is valid but its tenant
	// is suspended (Suspend): the key is refused until the tenant resumes.
	ErrTenantSuspended = errors.New("keystore: tenant suspended")
	// ErrSuspensionsUnavailable means the shortener's tenant_suspensions
	// table is not in this database (the shortener has not migrated it), so
	// a suspension could not reach the redirect and the webhook sender.
	ErrSuspensionsUnavailable = errors.New("keystore: the shortener's tenant_suspensions table is missing")
	// ErrPlansUnavailable means the limiter's plan tables are not in this
	// database (the limiter has not migrated it, or reads its rules from a
	// file), so a plan cannot be set.
	ErrPlansUnavailable = errors.New("keystore: the limiter's plan tables are missing")
)

// UnknownPlanError is a plan the limiter does not define; Known lists the
// plans it does.
type UnknownPlanError struct {
	Plan  string
	Known []string
}

func (e *UnknownPlanError) Error() string {
	return fmt.Sprintf("unknown plan %q; known plans: %s", e.Plan, strings.Join(e.Known, ", "))
}

// Tenant is a customer of the API.
type Tenant struct {
	ID      string
	Name    string
	Plan    string
	Created time.Time
	// Suspended is when an administrator suspended the tenant; nil while
	// it is active. SuspendReason is the administrator's note.
	Suspended     *time.Time
	SuspendReason string
}

// Key is an API key's metadata; the key itself is never stored.
type Key struct {
	ID      string
	Tenant  string
	Name    string
	Created time.Time
	Revoked *time.Time
}

// Principal is who an authenticated request acts for.
type Principal struct {
	Tenant string
	KeyID  string
}

// Store reads and writes tenants and keys.
type Store struct {
	db      *pgxpool.Pool
	timeout time.Duration
}

// New returns a store on db; timeout bounds every call.
func New(db *pgxpool.Pool, timeout time.Duration) *Store {
	return &Store{db: db, timeout: timeout}
}

var tenantID = regexp.MustCompile(`^[a-z0-9](?:[a-z0-9-]{0,61}[a-z0-9])?$`)

// TenantIDProblem says why id cannot be a tenant ID, or returns "" when it
// can: 1 to 63 lowercase letters, digits or '-', not starting or ending with
// '-', and not the reserved "anonymous".
func TenantIDProblem(id string) string {
	switch {
	case !tenantID.MatchString(id):
		return "id must be 1 to 63 lowercase letters, digits or '-', starting and ending with a letter or digit"
	case id == callmeta.AnonymousTenant:
		return fmt.Sprintf("id %q is reserved for anonymous link creation", id)
	}
	return ""
}

// NameProblem says why name cannot be a tenant's or key's display name.
func NameProblem(name string) string {
	if len(name) > maxNameLen {
		return fmt.Sprintf("name must be at most %d bytes", maxNameLen)
	}
	for _, r := range name {
		if r < 0x20 || r == 0x7f {
			return "name must not contain control characters"
		}
	}
	return ""
}

// ReasonProblem says why reason cannot be a suspension's reason, or
// returns "" when it can: 1 to MaxReasonLen bytes of UTF-8 text without
// control characters. A reason is required: it is what the next operator
// reads to know why the tenant is stopped.
func ReasonProblem(reason string) string {
	switch {
	case strings.TrimSpace(reason) == "":
		return "reason is required: say why the tenant is suspended (it is shown to administrators only)"
	case len(reason) > MaxReasonLen:
		return fmt.Sprintf("reason must be at most %d bytes", MaxReasonLen)
	case !utf8.ValidString(reason):
		return "reason must be UTF-8 text"
	}
	for _, r := range reason {
		if r < 0x20 || r == 0x7f {
			return "reason must not contain control characters"
		}
	}
	return ""
}

// CreateTenant inserts t and puts it on t.Plan in the limiter.
func (s *Store) CreateTenant(ctx context.Context, t Tenant) (Tenant, error) {
	ctx, cancel := context.WithTimeout(ctx, s.timeout)
	defer cancel()
	err := pgx.BeginFunc(ctx, s.db, func(tx pgx.Tx) error {
		err := tx.QueryRow(ctx, `INSERT INTO gw_tenants (id, name, plan) VALUES ($1, $2, $3)
			ON CONFLICT (id) DO NOTHING RETURNING created_at`, t.ID, t.Name, t.Plan).Scan(&t.Created)
		if errors.Is(err, pgx.ErrNoRows) {
			return ErrExists
		}
		if err != nil {
			return err
		}
		return setLimiterPlan(ctx, tx, t.ID, t.Plan)
	})
	if err != nil {
		return Tenant{}, s.planError(ctx, "create tenant", t.Plan, err)
	}
	return t, nil
}

// SetPlan moves a tenant to plan, in the gateway's table and the limiter's,
// in one transaction: every limiter applies it within a second (NOTIFY).
func (s *Store) SetPlan(ctx context.Context, id, plan string) (Tenant, error) {
	ctx, cancel := context.WithTimeout(ctx, s.timeout)
	defer cancel()
	t := Tenant{ID: id}
	err := pgx.BeginFunc(ctx, s.db, func(tx pgx.Tx) error {
		err := tx.QueryRow(ctx, `UPDATE gw_tenants SET plan = $2 WHERE id = $1
			RETURNING name, plan, created_at, suspended_at, suspend_reason`,
			id, plan).Scan(&t.Name, &t.Plan, &t.Created, &t.Suspended, &t.SuspendReason)
		if errors.Is(err, pgx.ErrNoRows) {
			return ErrNotFound
		}
		if err != nil {
			return err
		}
		return setLimiterPlan(ctx, tx, id, plan)
	})
	if err != nil {
		return Tenant{}, s.planError(ctx, "set plan", plan, err)
	}
	return t, nil
}

func setLimiterPlan(ctx context.Context, tx pgx.Tx, tenant, plan string) error {
	_, err := tx.Exec(ctx, `INSERT INTO rl_tenant_plans (tenant, plan) VALUES ($1, $2)
		ON CONFLICT (tenant) DO UPDATE SET plan = EXCLUDED.plan`, tenant, plan)
	return err
}

// planError turns the database's answer to a plan write into the package's
// errors: an unknown plan (foreign key to rl_plans) lists the known ones.
func (s *Store) planError(ctx context.Context, op, plan string, err error) error {
	var pgErr *pgconn.PgError
	switch {
	case errors.Is(err, ErrExists), errors.Is(err, ErrNotFound):
		return err
	case errors.As(err, &pgErr) && pgErr.Code == "42P01": // undefined_table
		return ErrPlansUnavailable
	case errors.As(err, &pgErr) && pgErr.Code == "23503" && pgErr.TableName == "rl_tenant_plans": // foreign_key_violation
		known, kerr := s.plans(ctx)
		if kerr != nil {
			return fmt.Errorf("%s: list plans: %w", op, kerr)
		}
		return &UnknownPlanError{Plan: plan, Known: known}
	}
	return fmt.Errorf("%s: %w", op, err)
}

func (s *Store) plans(ctx context.Context) ([]string, error) {
	rows, err := s.db.Query(ctx, `SELECT plan FROM rl_plans ORDER BY plan`)
	if err != nil {
		return nil, err
	}
	return pgx.CollectRows(rows, pgx.RowTo[string])
}

// Tenant returns one tenant.
func (s *Store) Tenant(ctx context.Context, id string) (Tenant, error) {
	ctx, cancel := context.WithTimeout(ctx, s.timeout)
	defer cancel()
	t := Tenant{ID: id}
	err := s.db.QueryRow(ctx, `SELECT name, plan, created_at, suspended_at, suspend_reason FROM gw_tenants WHERE id = $1`, id).
		Scan(&t.Name, &t.Plan, &t.Created, &t.Suspended, &t.SuspendReason)
	if errors.Is(err, pgx.ErrNoRows) {
		return Tenant{}, ErrNotFound
	}
	if err != nil {
		return Tenant{}, fmt.Errorf("get tenant: %w", err)
	}
	return t, nil
}

// TenantFilter narrows ListTenants; zero fields match every tenant.
type TenantFilter struct {
	// Suspended, when set, keeps the suspended tenants (true) or the
	// active ones (false).
	Suspended *bool
	// Plan keeps the tenants on this plan.
	Plan string
}

// ListTenants returns up to size tenants matching f with ids after after
// ("" from the first), in byte order of the ids (COLLATE "C": the same in
// every database, whatever its locale): a keyset walk, so a tenant created
// or deleted meanwhile shifts no other between pages. No index serves it:
// an operator's listing scans the tenants, a few thousand rows where this
// runs, and an index for it is not worth a migration at that scale.
//
// A plan no tenant is on and the limiter does not define is an
// UnknownPlanError, as SetPlan's, not an empty page: a mistyped plan
// would otherwise read as "no tenant on this plan". The check costs a
// query only when the page is empty (a tenant on the plan makes it known,
// whether or not rl_plans still has it).
func (s *Store) ListTenants(ctx context.Context, f TenantFilter, after string, size int) ([]Tenant, error) {
	tenants, err := s.listTenants(ctx, f, after, size)
	if err != nil || len(tenants) > 0 || f.Plan == "" {
		return tenants, err
	}
	return tenants, s.checkPlanFilter(ctx, f.Plan)
}

// checkPlanFilter is an UnknownPlanError when no tenant is on plan and
// rl_plans does not have it. Without rl_plans (a limiter that reads a
// rules file) only the tenants tell, and none is on it: no error, since
// which plans the limiter knows cannot be said.
func (s *Store) checkPlanFilter(ctx context.Context, plan string) error {
	ctx, cancel := context.WithTimeout(ctx, s.timeout)
	defer cancel()
	var known bool
	err := s.db.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM gw_tenants WHERE plan = $1)
		OR EXISTS (SELECT 1 FROM rl_plans WHERE plan = $1)`, plan).Scan(&known)
	var pgErr *pgconn.PgError
	switch {
	case errors.As(err, &pgErr) && pgErr.Code == "42P01": // undefined_table
		return nil
	case err != nil:
		return fmt.Errorf("list tenants: check plan: %w", err)
	case known:
		return nil
	}
	plans, err := s.plans(ctx)
	if err != nil {
		return fmt.Errorf("list tenants: list plans: %w", err)
	}
	return &UnknownPlanError{Plan: plan, Known: plans}
}

func (s *Store) listTenants(ctx context.Context, f TenantFilter, after string, size int) ([]Tenant, error) {
	ctx, cancel := context.WithTimeout(ctx, s.timeout)
	defer cancel()
	// $3 and $4 are NULL when their filter is unset.
	var plan *string
	if f.Plan != "" {
		plan = &f.Plan
	}
	rows, err := s.db.Query(ctx, `SELECT id, name, plan, created_at, suspended_at, suspend_reason FROM gw_tenants
		WHERE id COLLATE "C" > $1 AND ($3::text IS NULL OR plan = $3) AND ($4::bool IS NULL OR (suspended_at IS NOT NULL) = $4)
		ORDER BY id COLLATE "C" LIMIT $2`, after, size, plan, f.Suspended)
	if err != nil {
		return nil, fmt.Errorf("list tenants: %w", err)
	}
	tenants, err := pgx.CollectRows(rows, func(row pgx.CollectableRow) (Tenant, error) {
		var t Tenant
		err := row.Scan(&t.ID, &t.Name, &t.Plan, &t.Created, &t.Suspended, &t.SuspendReason)
		return t, err
	})
	if err != nil {
		return nil, fmt.Errorf("list tenants: %w", err)
	}
	return tenants, nil
}

// Suspend suspends a tenant: its API keys are refused (ErrTenantSuspended)
// from the next request on, the redirect stops its links and the webhook
// sender holds its deliveries, both within their refresh of
// tenant_suspensions, which this writes in the transaction that marks
// gw_tenants. Suspending a suspended tenant keeps the time it was first
// suspended and takes the new reason (an administrator may amend it).
func (s *Store) Suspend(ctx context.Context, id, reason string) (Tenant, error) {
	ctx, cancel := context.WithTimeout(ctx, s.timeout)
	defer cancel()
	t := Tenant{ID: id}
	err := pgx.BeginFunc(ctx, s.db, func(tx pgx.Tx) error {
		err := tx.QueryRow(ctx, `UPDATE gw_tenants SET suspended_at = coalesce(suspended_at, now()), suspend_reason = $2
			WHERE id = $1 RETURNING name, plan, created_at, suspended_at, suspend_reason`, id, reason).
			Scan(&t.Name, &t.Plan, &t.Created, &t.Suspended, &t.SuspendReason)
		if errors.Is(err, pgx.ErrNoRows) {
			return ErrNotFound
		}
		if err != nil {
			return err
		}
		_, err = tx.Exec(ctx, `INSERT INTO tenant_suspensions (tenant, suspended_at) VALUES ($1, $2)
			ON CONFLICT (tenant) DO NOTHING`, id, *t.Suspended)
		return err
	})
	if err != nil {
		return Tenant{}, suspensionError("suspend tenant", err)
	}
	return t, nil
}

// Resume ends a tenant's suspension: everything works again as it did
// before (links disabled before stay disabled: the suspension never
// touched them). Resuming an active tenant changes nothing.
func (s *Store) Resume(ctx context.Context, id string) (Tenant, error) {
	ctx, cancel := context.WithTimeout(ctx, s.timeout)
	defer cancel()
	t := Tenant{ID: id}
	err := pgx.BeginFunc(ctx, s.db, func(tx pgx.Tx) error {
		err := tx.QueryRow(ctx, `UPDATE gw_tenants SET suspended_at = NULL, suspend_reason = ''
			WHERE id = $1 RETURNING name, plan, created_at`, id).Scan(&t.Name, &t.Plan, &t.Created)
		if errors.Is(err, pgx.ErrNoRows) {
			return ErrNotFound
		}
		if err != nil {
			return err
		}
		_, err = tx.Exec(ctx, `DELETE FROM tenant_suspensions WHERE tenant = $1`, id)
		return err
	})
	if err != nil {
		return Tenant{}, suspensionError("resume tenant", err)
	}
	return t, nil
}

func suspensionError(op string, err error) error {
	var pgErr *pgconn.PgError
	switch {
	case errors.Is(err, ErrNotFound):
		return err
	case errors.As(err, &pgErr) && pgErr.Code == "42P01": // undefined_table
		return ErrSuspensionsUnavailable
	}
	return fmt.Errorf("%s: %w", op, err)
}

// IssueKey creates an API key for tenant and returns it with the full key,
// which is not stored and cannot be shown again.
func (s *Store) IssueKey(ctx context.Context, tenant, name string) (Key, string, error) {
	id, err := linkcode.Random(nil, keyIDLen)
	if err != nil {
		return Key{}, "", fmt.Errorf("issue key: %w", err)
	}
	secret, err := linkcode.Random(nil, keySecretLen)
	if err != nil {
		return Key{}, "", fmt.Errorf("issue key: %w", err)
	}
	full := KeyPrefix + id + "_" + secret
	sum := sha256.Sum256([]byte(full))
	ctx, cancel := context.WithTimeout(ctx, s.timeout)
	defer cancel()
	k := Key{ID: id, Tenant: tenant, Name: name}
	err = s.db.QueryRow(ctx, `INSERT INTO gw_api_keys (id, tenant_id, name, hash) VALUES ($1, $2, $3, $4)
		RETURNING created_at`, id, tenant, name, sum[:]).Scan(&k.Created)
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) && pgErr.Code == "23503" {
		return Key{}, "", ErrNotFound
	}
	if err != nil {
		return Key{}, "", fmt.Errorf("issue key: %w", err)
	}
	return k, full, nil
}

// Keys lists a tenant's keys, oldest first, revoked ones included.
func (s *Store) Keys(ctx context.Context, tenant string) ([]Key, error) {
	ctx, cancel := context.WithTimeout(ctx, s.timeout)
	defer cancel()
	if _, err := s.Tenant(ctx, tenant); err != nil {
		return nil, err
	}
	rows, err := s.db.Query(ctx, `SELECT id, tenant_id, name, created_at, revoked_at FROM gw_api_keys
		WHERE tenant_id = $1 ORDER BY created_at, id`, tenant)
	if err != nil {
		return nil, fmt.Errorf("list keys: %w", err)
	}
	keys, err := pgx.CollectRows(rows, func(row pgx.CollectableRow) (Key, error) {
		var k Key
		err := row.Scan(&k.ID, &k.Tenant, &k.Name, &k.Created, &k.Revoked)
		return k, err
	})
	if err != nil {
		return nil, fmt.Errorf("list keys: %w", err)
	}
	return keys, nil
}

// RevokeKey revokes one of tenant's keys; the next request with it fails.
// Revoking a revoked key keeps its first revocation time.
func (s *Store) RevokeKey(ctx context.Context, tenant, id string) (Key, error) {
	ctx, cancel := context.WithTimeout(ctx, s.timeout)
	defer cancel()
	k := Key{ID: id, Tenant: tenant}
	err := s.db.QueryRow(ctx, `UPDATE gw_api_keys SET revoked_at = coalesce(revoked_at, now())
		WHERE tenant_id = $1 AND id = $2 RETURNING name, created_at, revoked_at`, tenant, id).
		Scan(&k.Name, &k.Created, &k.Revoked)
	if errors.Is(err, pgx.ErrNoRows) {
		return Key{}, ErrNotFound
	}
	if err != nil {
		return Key{}, fmt.Errorf("revoke key: %w", err)
	}
	return k, nil
}

// dummyHash stands in for an unknown key's hash, so an unknown ID costs the
// same comparison as a known one.
var dummyHash = sha256.Sum256([]byte("kurz: no such key"))

// Authenticate checks a presented key: its ID is looked up with its
// tenant's suspension (one primary-key read, no cache, so a revocation or
// a suspension applies to the very next request) and its SHA-256 compared
// in constant time. Any mismatch is ErrInvalidKey; a valid key of a
// suspended tenant is ErrTenantSuspended (only then: a wrong key learns
// nothing about its tenant), returned with the key's Principal so that
// the refusal can still be held to the tenant's rate limits; other errors
// mean the database could not answer.
func (s *Store) Authenticate(ctx context.Context, presented string) (Principal, error) {
	id, ok := ParseKeyID(presented)
	if !ok {
		return Principal{}, ErrInvalidKey
	}
	ctx, cancel := context.WithTimeout(ctx, s.timeout)
	defer cancel()
	var tenant string
	var stored []byte
	var revoked *time.Time
	var suspended bool
	err := s.db.QueryRow(ctx, `SELECT k.tenant_id, k.hash, k.revoked_at, t.suspended_at IS NOT NULL
		FROM gw_api_keys k JOIN gw_tenants t ON t.id = k.tenant_id WHERE k.id = $1`, id).
		Scan(&tenant, &stored, &revoked, &suspended)
	if errors.Is(err, pgx.ErrNoRows) {
		stored = dummyHash[:]
	} else if err != nil {
		return Principal{}, fmt.Errorf("authenticate: %w", err)
	}
	sum := sha256.Sum256([]byte(presented))
	if subtle.ConstantTimeCompare(sum[:], stored) != 1 || tenant == "" || revoked != nil {
		return Principal{}, ErrInvalidKey
	}
	if suspended {
		return Principal{Tenant: tenant, KeyID: id}, ErrTenantSuspended
	}
	return Principal{Tenant: tenant, KeyID: id}, nil
}

// ParseKeyID returns the ID of a well-formed key; ok is false for anything
// that cannot be a kurz API key.
func ParseKeyID(key string) (id string, ok bool) {
	rest, found := strings.CutPrefix(key, KeyPrefix)
	if !found || len(rest) != keyIDLen+1+keySecretLen || rest[keyIDLen] != '_' {
		return "", false
	}
	id, secret := rest[:keyIDLen], rest[keyIDLen+1:]
	if !base62(id) || !base62(secret) {
		return "", false
	}
	return id, true
}

func base62(s string) bool {
	for i := range len(s) {
		if strings.IndexByte(linkcode.Alphabet, s[i]) < 0 {
			return false
		}
	}
	return true
}
