-- Issue #20: custom domains per tenant.

-- A tenant's custom domains. A name belongs to one tenant at most (the
-- primary key); it takes links, and the redirect serves it, once verified
-- (verified_at set) by its DNS TXT record or by an administrator.
CREATE TABLE domains (
    name        text        PRIMARY KEY,
    tenant      text        NOT NULL,
    -- The value _kurz-challenge.<name> must hold (TXT) to verify by DNS.
    token       text        NOT NULL,
    created_at  timestamptz NOT NULL DEFAULT now(),
    verified_at timestamptz,
    -- 'dns' or 'admin'; NULL while unverified.
    verified_by text,
    CONSTRAINT domains_verified_check CHECK ((verified_at IS NULL) = (verified_by IS NULL))
);

-- ListDomains and the per-tenant bound count a tenant's domains.
CREATE INDEX domains_tenant ON domains (tenant);

-- The domain a link is on; '' = the default domain. links.code holds the
-- link's key (pkg/linkdomain): the bare code on the default domain,
-- '<domain>/<code>' on a custom one, so that its primary key keeps codes
-- unique per domain and every other table and cache keyed by code (the
-- invalidation outbox, Redis, ClickHouse) needs no change. The check ties
-- the two columns together.
ALTER TABLE links ADD COLUMN domain text NOT NULL DEFAULT '';
ALTER TABLE links ADD CONSTRAINT links_domain_key_check CHECK (
    (domain = '' AND strpos(code, '/') = 0)
    OR (domain <> '' AND left(code, length(domain) + 1) = domain || '/'));
-- DeleteDomain asks whether live links still use a domain.
CREATE INDEX links_domain ON links (domain) WHERE domain <> '' AND deleted_at IS NULL;
