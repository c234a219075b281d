-- DeleteLink revokes: the row stays (its code is never reused and answers
-- 410), hidden from the tenant's API.
ALTER TABLE links ADD COLUMN deleted_at timestamptz;

-- 0 = the redirect service's configured default (KURZ_REDIRECT_DEFAULT_STATUS).
ALTER TABLE links ALTER COLUMN redirect_type SET DEFAULT 0;
ALTER TABLE links ADD CONSTRAINT links_redirect_type_check
    CHECK (redirect_type IN (0, 301, 302, 307, 308));

-- ListLinks: a tenant's live links, newest first, keyset-paginated on
-- (created_at, code), both descending.
DROP INDEX IF EXISTS links_tenant_created;
CREATE INDEX links_tenant_page ON links (tenant, created_at DESC, code DESC)
    WHERE deleted_at IS NULL;
