//go:build integration

package keystore

import (
	"context"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"kurz.dev/pkg/config"
	"kurz.dev/pkg/pgpool"
)

// queryCount is a pgx tracer counting statements.
type queryCount struct{ n atomic.Int64 }

func (q *queryCount) TraceQueryStart(ctx context.Context, _ *pgx.Conn, _ pgx.TraceQueryStartData) context.Context {
	q.n.Add(1)
	return ctx
}

func (q *queryCount) TraceQueryEnd(context.Context, *pgx.Conn, pgx.TraceQueryEndData) {}

// Every well-formed wrong key costs the same work and gets the same answer:
// an unknown id, a known id with a wrong secret and a revoked key each make
// exactly one lookup and one digest comparison (an unknown id is compared
// against a stand-in digest) and return the very same ErrInvalidKey, so
// neither the answer nor the database work tells them apart.
func TestWrongKeysAreIndistinguishable(t *testing.T) {
	ctx := context.Background()
	s, tenant := newStore(t)
	var cfg pgpool.Config
	if err := config.Load(&cfg); err != nil {
		t.Fatal(err)
	}
	pc, err := pgxpool.ParseConfig(cfg.URL)
	if err != nil {
		t.Fatal(err)
	}
	qc := &queryCount{}
	pc.ConnConfig.Tracer = qc
	db, err := pgxpool.NewWithConfig(ctx, pc)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	traced := New(db, 2*time.Second)

	_, live, err := s.IssueKey(ctx, tenant, "live")
	if err != nil {
		t.Fatal(err)
	}
	k, revoked, err := s.IssueKey(ctx, tenant, "revoked")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.RevokeKey(ctx, tenant, k.ID); err != nil {
		t.Fatal(err)
	}
	id, _ := ParseKeyID(live)
	wrongSecret := KeyPrefix + id + "_" + strings.Repeat("Z", keySecretLen)
	if strings.HasSuffix(live, strings.Repeat("Z", keySecretLen)) {
		wrongSecret = KeyPrefix + id + "_" + strings.Repeat("Y", keySecretLen)
	}
	if _, err := traced.Authenticate(ctx, live); err != nil {
		t.Fatalf("the live key: %v", err)
	}
	for name, key := range map[string]string{
		"unknown id":            KeyPrefix + "AAAAAAAAAAAA_" + live[len(KeyPrefix)+keyIDLen+1:],
		"wrong secret":          wrongSecret,
		"revoked":               revoked,
		"live id, revoked hash": KeyPrefix + id + revoked[len(KeyPrefix)+keyIDLen:],
	} {
		before := qc.n.Load()
		_, err := traced.Authenticate(ctx, key)
		if err != ErrInvalidKey { // the very value, not a wrapped one that could say more
			t.Errorf("%s: %v; want exactly ErrInvalidKey", name, err)
		}
		if n := qc.n.Load() - before; n != 1 {
			t.Errorf("%s: %d statements; want the one lookup every key costs", name, n)
		}
	}
}
