//go:build integration

package linkschema_test

import (
	"context"
	"fmt"
	"io/fs"
	"testing"
	"testing/fstest"
	"time"

	"kurz.dev/pkg/config"
	"kurz.dev/pkg/linkschema"
	"kurz.dev/pkg/pgpool"
)

// upTo is the migrations of FS up to and including last: the schema as a
// release that did not know the later ones left it.
func upTo(t *testing.T, last string) fs.FS {
	t.Helper()
	names, err := fs.Glob(linkschema.FS, "*.sql")
	if err != nil {
		t.Fatal(err)
	}
	out := fstest.MapFS{}
	for _, n := range names {
		if n > last {
			continue
		}
		b, err := fs.ReadFile(linkschema.FS, n)
		if err != nil {
			t.Fatal(err)
		}
		out[n] = &fstest.MapFile{Data: b}
	}
	return out
}

// 0019 on a database that has links already: each keeps its fields and
// gets the empty title (none), links made afterwards without one too, and
// a change of the title alone is a link.updated whose data carries it.
// On a database of its own, so that the migration's half-way state is
// seen by no other test.
func TestLinkTitlesMigrateALinksTableWithRows(t *testing.T) {
	ctx := context.Background()
	var cfg pgpool.Config
	if err := config.Load(&cfg); err != nil {
		t.Fatal(err)
	}
	admin, err := pgpool.New(ctx, cfg)
	if err != nil {
		t.Fatalf("local PostgreSQL (make up): %v", err)
	}
	t.Cleanup(admin.Close) // after the drop below: cleanups run last first
	name := fmt.Sprintf("kurz_titles_%d", time.Now().UnixNano())
	if _, err := admin.Exec(ctx, "CREATE DATABASE "+name); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _, _ = admin.Exec(context.Background(), "DROP DATABASE IF EXISTS "+name+" WITH (FORCE)") })
	cc := admin.Config().ConnConfig
	db, err := pgpool.New(ctx, pgpool.Config{URL: fmt.Sprintf("postgres://%s:%s@%s:%d/%s?sslmode=disable", cc.User, cc.Password, cc.Host, cc.Port, name),
		MaxConns: 2, QueryTimeout: 10 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()

	if _, err := pgpool.Migrate(ctx, db, linkschema.Component, upTo(t, "0018_tenant_suspensions.sql")); err != nil {
		t.Fatalf("the schema before titles: %v", err)
	}
	if _, err := db.Exec(ctx, `INSERT INTO links (code, tenant, long_url, tags, max_visits)
		VALUES ('old1', 'acme', 'https://example.com/old1', '{a,b}', 5), ('old2', 'acme', 'https://example.com/old2', '{}', 0)`); err != nil {
		t.Fatal(err)
	}
	applied, err := linkschema.Apply(ctx, db)
	if err != nil || len(applied) == 0 || applied[0] != "0019_link_titles.sql" {
		t.Fatalf("Apply over links with rows: %v, %v; want 0019_link_titles.sql first", applied, err)
	}
	var n int
	if err := db.QueryRow(ctx, `SELECT count(*) FROM links WHERE title = '' AND
		((code = 'old1' AND tags = '{a,b}' AND max_visits = 5) OR (code = 'old2' AND long_url = 'https://example.com/old2'))`).Scan(&n); err != nil || n != 2 {
		t.Errorf("the links made before: %d of 2 with an empty title and their fields (%v)", n, err)
	}
	if _, err := db.Exec(ctx, `INSERT INTO links (code, tenant, long_url) VALUES ('new1', 'acme', 'https://example.com/new1')`); err != nil {
		t.Errorf("a link inserted without a title (a writer of the release before): %v", err)
	}

	if _, err := db.Exec(ctx, `INSERT INTO webhook_subscriptions (id, tenant, url, events, secret)
		VALUES ('wh_t', 'acme', 'https://hooks.example.com/', '{link.updated}', '\x00')`); err != nil {
		t.Fatal(err)
	}
	if _, err := db.Exec(ctx, `UPDATE links SET title = 'Spring <sale>' WHERE code = 'old1'`); err != nil {
		t.Fatal(err)
	}
	var title string
	err = db.QueryRow(ctx, `SELECT data->>'title' FROM webhook_deliveries WHERE subscription_id = 'wh_t' AND event_type = 'link.updated'`).Scan(&title)
	if err != nil || title != "Spring <sale>" {
		t.Errorf("the link.updated of a title change: title %q, %v; want Spring <sale>", title, err)
	}
}
