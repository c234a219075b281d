-- The gateway's tenants and their API keys. A tenant's plan is written here
-- and, in the same transaction, to the limiter's rl_tenant_plans, which is
-- what every limiter reads (a trigger NOTIFYs them).
CREATE TABLE gw_tenants (
    id         text        PRIMARY KEY,
    name       text        NOT NULL DEFAULT '',
    plan       text        NOT NULL,
    created_at timestamptz NOT NULL DEFAULT now()
);

-- A key reads kurz_<id>_<secret>. The id (the key's prefix) is public: it is
-- the limiter's api_key descriptor and what operators revoke by. Only the
-- SHA-256 of the whole key is stored; the key is shown once, at creation.
CREATE TABLE gw_api_keys (
    id         text        PRIMARY KEY,
    tenant_id  text        NOT NULL REFERENCES gw_tenants ON DELETE CASCADE,
    name       text        NOT NULL DEFAULT '',
    hash       bytea       NOT NULL CHECK (length(hash) = 32),
    created_at timestamptz NOT NULL DEFAULT now(),
    revoked_at timestamptz
);

CREATE INDEX gw_api_keys_tenant ON gw_api_keys (tenant_id, created_at, id);
