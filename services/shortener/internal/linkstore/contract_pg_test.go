//go:build integration

package linkstore_test

import (
	"context"
	"testing"
	"time"

	"kurz.dev/services/shortener/internal/linkstore"
)

// The PostgreSQL store meets the contract its fake is held to
// (TestFakeStoreMeetsTheContract).
func TestPostgresStoreMeetsTheContract(t *testing.T) {
	db := linkstore.Connect(t, "")
	run := newRun()
	t.Cleanup(func() {
		// The run's queued invalidations go with their links (ON DELETE CASCADE).
		if _, err := db.Exec(context.Background(), `DELETE FROM links WHERE code LIKE $1`, run+"%"); err != nil {
			t.Errorf("clean up: %v", err)
		}
	})
	testContract(t, linkstore.New(db, 5*time.Second), run)
}
