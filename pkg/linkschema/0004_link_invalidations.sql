-- Issue #16, finding 5: an outbox of links whose current state must still
-- reach Redis (and their invalidation be published) after a change. The row
-- is inserted by the very statement that updates or revokes the link, so a
-- committed change is never without one; the shortener deletes it once Redis
-- holds the link's current state, and retries with backoff until then. One
-- row per code at most: it names the link, not a state, so the table is
-- bounded by the number of links, however often they change.
CREATE TABLE link_invalidations (
    code        text        PRIMARY KEY REFERENCES links (code) ON DELETE CASCADE,
    -- When the oldest change not yet in Redis was made.
    created_at  timestamptz NOT NULL DEFAULT now(),
    -- Failed attempts so far; the next one waits twice as long (bounded).
    attempts    integer     NOT NULL DEFAULT 0,
    next_try_at timestamptz NOT NULL DEFAULT now()
);

CREATE INDEX link_invalidations_due ON link_invalidations (next_try_at);
