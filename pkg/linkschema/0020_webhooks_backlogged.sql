-- A subscription whose receiver is down, or slower than its events, must
-- not grow the queue without end: link.clicked is queued behind
-- KURZ_SHORTENER_WEBHOOK_MAX_PENDING (the click flush counts the backlog),
-- but the link events were queued by the trigger below with no bound, and
-- a tenant at its API quota with 10 subscriptions that never answer queued
-- up to 300,000 deliveries a minute into the shared links database. The
-- webhook senders mark a subscription backlogged when it has MaxPending
-- pending deliveries and clear the mark once it has fewer
-- (services/shortener/internal/webhook, Store.MarkBacklogged): the trigger
-- only reads the flag, so a link write pays no count of the backlog. NOT
-- NULL with a constant default is a catalogue change (PostgreSQL 11 and
-- later), no table rewrite.
ALTER TABLE webhook_subscriptions ADD COLUMN backlogged boolean NOT NULL DEFAULT false;

-- 0019's function with the backlogged subscriptions left out: their link
-- events are not queued (and not sent later) while the mark is set.
CREATE OR REPLACE FUNCTION webhook_enqueue_link_event() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    ev text;
BEGIN
    IF NOT EXISTS (SELECT 1 FROM webhook_subscriptions WHERE tenant = NEW.tenant AND deleted_at IS NULL) THEN
        RETURN NULL;
    END IF;
    IF TG_OP = 'INSERT' THEN
        ev := 'link.created';
    ELSIF OLD.deleted_at IS NULL AND NEW.deleted_at IS NOT NULL THEN
        ev := 'link.deleted';
    ELSIF NEW.deleted_at IS NULL THEN
        ev := 'link.updated';
    ELSE
        RETURN NULL;
    END IF;
    INSERT INTO webhook_deliveries (id, subscription_id, tenant, event_type, data)
    SELECT 'evt_' || replace(gen_random_uuid()::text, '-', ''), s.id, NEW.tenant, ev,
           jsonb_build_object(
               'code', NEW.code,
               'long_url', NEW.long_url,
               'redirect_status', NEW.redirect_type,
               'tags', to_jsonb(NEW.tags),
               'title', NEW.title,
               'disabled', NEW.disabled,
               'max_visits', NEW.max_visits,
               'password_protected', NEW.password_hash IS NOT NULL,
               'ios_url', COALESCE(NEW.ios_url, ''),
               'android_url', COALESCE(NEW.android_url, ''),
               'desktop_url', COALESCE(NEW.desktop_url, ''),
               'expire_time', NEW.expires_at,
               'create_time', NEW.created_at,
               'update_time', NEW.updated_at,
               'delete_time', NEW.deleted_at)
    FROM webhook_subscriptions s
    WHERE s.tenant = NEW.tenant AND ev = ANY (s.events) AND s.deleted_at IS NULL AND NOT s.backlogged
    FOR KEY SHARE OF s;
    RETURN NULL;
END;
$$;
