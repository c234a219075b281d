//go:build integration

package linkschema_test

import (
	"context"
	"errors"
	"net/url"
	"os"
	"testing"

	"github.com/jackc/pgx/v5/pgconn"

	"kurz.dev/pkg/config"
	"kurz.dev/pkg/linkschema"
	"kurz.dev/pkg/pgpool"
	"kurz.dev/pkg/testkit/stack"
)

func TestMain(m *testing.M) { stack.Require(m, stack.Postgres) }

// readerURL is the redirect's login on the test database: the local
// stack's kurz_redirect (deploy/local/infra.sh), or
// KURZ_TEST_READER_POSTGRES_URL.
func readerURL(t *testing.T, ownerURL string) string {
	if u := os.Getenv("KURZ_TEST_READER_POSTGRES_URL"); u != "" {
		return u
	}
	u, err := url.Parse(ownerURL)
	if err != nil {
		t.Fatal(err)
	}
	u.User = url.UserPassword("kurz_redirect", "kurz-redirect")
	return u.String()
}

// A login in ReaderRole reads links, domains and the suspended tenants,
// once the shortener has
// granted them, and can write nothing and read nothing else: the redirect,
// which faces the internet, cannot mint API keys or change links.
func TestReaderRoleReadsWhatTheRedirectReadsOnly(t *testing.T) {
	ctx := context.Background()
	var cfg pgpool.Config
	if err := config.Load(&cfg); err != nil {
		t.Fatal(err)
	}
	owner, err := pgpool.New(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer owner.Close()
	if _, err := linkschema.Apply(ctx, owner); err != nil {
		t.Fatal(err)
	}
	if err := linkschema.GrantReader(ctx, owner); err != nil {
		t.Fatal(err)
	}
	cfg.URL = readerURL(t, cfg.URL)
	reader, err := pgpool.New(ctx, cfg)
	if err != nil {
		t.Fatalf("the reader's login (the stack's kurz_redirect, made by deploy/local/infra.sh: run `make up`): %v", err)
	}
	defer reader.Close()
	for _, q := range []string{`SELECT count(*) FROM links`, `SELECT count(*) FROM domains`, `SELECT count(*) FROM tenant_suspensions`} {
		var n int64
		if err := reader.QueryRow(ctx, q).Scan(&n); err != nil {
			t.Errorf("%s as the reader: %v, want it read", q, err)
		}
	}
	for _, q := range []string{
		`INSERT INTO links (code, tenant, long_url) VALUES ('reader-test', 'reader-test', 'https://example.com/')`,
		`UPDATE links SET long_url = 'https://example.com/x' WHERE false`,
		`DELETE FROM domains WHERE false`,
		`INSERT INTO tenant_suspensions (tenant) VALUES ('reader-test')`,
		`SELECT count(*) FROM link_invalidations`,
		`SELECT count(*) FROM webhook_subscriptions`,
		`CREATE TABLE reader_test (x int)`,
	} {
		_, err := reader.Exec(ctx, q)
		if pe := (*pgconn.PgError)(nil); !errors.As(err, &pe) || pe.Code != "42501" {
			t.Errorf("%s as the reader: %v, want insufficient_privilege (42501)", q, err)
		}
	}
}
