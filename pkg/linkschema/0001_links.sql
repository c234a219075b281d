-- One nextval per block of IDs per process: see the block allocator.
CREATE SEQUENCE IF NOT EXISTS link_block;

CREATE TABLE links (
    code          text        PRIMARY KEY,
    tenant        text        NOT NULL,
    long_url      text        NOT NULL,
    redirect_type smallint    NOT NULL DEFAULT 302,
    created_at    timestamptz NOT NULL DEFAULT now(),
    updated_at    timestamptz NOT NULL DEFAULT now(),
    expires_at    timestamptz,
    disabled      boolean     NOT NULL DEFAULT false
);

-- ListLinks pages a tenant's links newest first.
CREATE INDEX links_tenant_created ON links (tenant, created_at DESC, code);
