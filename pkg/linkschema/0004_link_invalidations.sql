-- Issue #16, finding 5: an outbox of codes whose Redis entry must still be
-- brought up to date (and their invalidation published) after a change. The
-- row is inserted by the very statement that updates or revokes the link, so
-- a committed change is never without one; the shortener deletes it once
-- Redis holds the link's current state, and retries with backoff until then.
CREATE TABLE link_invalidations (
    id          bigserial   PRIMARY KEY,
    code        text        NOT NULL REFERENCES links (code) ON DELETE CASCADE,
    created_at  timestamptz NOT NULL DEFAULT now(),
    -- Failed attempts so far; the next one waits twice as long (bounded).
    attempts    integer     NOT NULL DEFAULT 0,
    next_try_at timestamptz NOT NULL DEFAULT now()
);

CREATE INDEX link_invalidations_code ON link_invalidations (code);
CREATE INDEX link_invalidations_due ON link_invalidations (next_try_at);
