-- Only a verified domain is exclusive. Several tenants may claim a name
-- while nobody has proven it theirs (a claim alone no longer locks the
-- real owner out); the first to verify holds it, and the other claims go.
ALTER TABLE domains DROP CONSTRAINT domains_pkey;
ALTER TABLE domains ADD PRIMARY KEY (name, tenant);
CREATE UNIQUE INDEX domains_verified_name ON domains (name) WHERE verified_at IS NOT NULL;
