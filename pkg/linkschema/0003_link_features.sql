-- Issue #10: tags, visit limits, passwords and per-device targets.

-- Free-form labels; ListLinks filters on one (tags @> ARRAY[tag]).
ALTER TABLE links ADD COLUMN tags text[] NOT NULL DEFAULT '{}';
-- 0 = no limit; visits are counted in Redis (see linkcache.VisitsKey).
ALTER TABLE links ADD COLUMN max_visits bigint NOT NULL DEFAULT 0;
ALTER TABLE links ADD CONSTRAINT links_max_visits_check CHECK (max_visits >= 0);
-- Argon2id PHC string; NULL = no password.
ALTER TABLE links ADD COLUMN password_hash text;
-- Per-device destinations; NULL = long_url.
ALTER TABLE links ADD COLUMN ios_url text;
ALTER TABLE links ADD COLUMN android_url text;
ALTER TABLE links ADD COLUMN desktop_url text;

-- A tenant's live links by tag.
CREATE INDEX links_tags ON links USING gin (tags) WHERE deleted_at IS NULL;
