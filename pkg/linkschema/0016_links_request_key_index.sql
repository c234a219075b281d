-- kurz:concurrently
-- A tenant has at most one live link per idempotency key (0015): of two
-- creates racing with one key, the second's insert waits for the first's
-- commit and meets its row. A deleted link leaves the index, so its key
-- makes a new link again.
--
-- Built concurrently (kurz:concurrently, pgpool.ConcurrentDirective): built
-- in a transaction, it would block every write of links for as long as the
-- build takes over the whole table.
CREATE UNIQUE INDEX CONCURRENTLY IF NOT EXISTS links_tenant_request_key
    ON links (tenant, request_key)
    WHERE request_key IS NOT NULL AND deleted_at IS NULL;
