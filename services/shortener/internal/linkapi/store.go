package linkapi

import (
	"context"
	"time"

	"kurz.dev/services/shortener/internal/linkstore"
)

// Store is what the Service needs of the link store: linkstore.Store, or
// linkstoretest.Fake in the unit tests (both pass the same contract test,
// in linkstore).
type Store interface {
	Insert(ctx context.Context, l linkstore.Link) (linkstore.Link, error)
	InsertMany(ctx context.Context, links []linkstore.Link) (map[string]linkstore.Link, error)
	Taken(ctx context.Context, codes []string) (map[string]bool, error)
	Get(ctx context.Context, tenant, code string) (linkstore.Link, error)
	GetMany(ctx context.Context, tenant string, codes []string) (map[string]linkstore.Link, error)
	FromURL(ctx context.Context, tenant string, key []byte) (linkstore.Link, error)
	FromURLs(ctx context.Context, tenant string, keys [][]byte) (map[string]linkstore.Link, error)
	ByRequest(ctx context.Context, tenant string, key []byte) (linkstore.Link, error)
	ReleaseURLKey(ctx context.Context, tenant, code string, key []byte) error
	List(ctx context.Context, tenant string, size int, token, tag string) (linkstore.Page, error)
	Live(ctx context.Context, after string, n int) ([]linkstore.Link, error)
	Update(ctx context.Context, tenant, code string, ch linkstore.Changes) (linkstore.Link, error)
	Delete(ctx context.Context, tenant, code string, ifVersion *uint32) (linkstore.Link, error)
	Refresh(ctx context.Context, code string, write func(context.Context, linkstore.Link) error) error
	DueInvalidations(ctx context.Context, limit int) ([]string, error)
	Postpone(ctx context.Context, code string, base, maxDelay time.Duration) error
	PendingInvalidations(ctx context.Context) (n int64, oldest time.Duration, err error)
}
