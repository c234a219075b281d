-- Issue #20, point 5: codes from the URL. url_key is the SHA-256 of the
-- normalised long URL of a link created with CODE_MODE_FROM_URL (NULL for
-- every other link, and cleared when the link's long_url changes): a tenant
-- has at most one live such link per URL, so concurrent creates of one URL
-- make one link. Deleted links leave the index: shortening the URL again
-- makes a new link with the next free candidate code.
ALTER TABLE links ADD COLUMN url_key bytea;
CREATE UNIQUE INDEX links_tenant_url_key ON links (tenant, url_key)
    WHERE url_key IS NOT NULL AND deleted_at IS NULL;
