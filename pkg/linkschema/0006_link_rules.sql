-- Issue #20 point 2: redirect rules and A/B-test variants.

-- The link's rules and variants in pkg/linkrules' compact JSON (the same
-- form the linkcache entry carries); NULL = none.
ALTER TABLE links ADD COLUMN rules jsonb;
