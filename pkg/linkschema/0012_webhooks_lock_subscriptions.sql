-- A link write must not fail because its tenant's subscription is being
-- deleted. 0007's trigger read the subscriptions without a lock: it saw
-- one whose DELETE had not committed yet, the delivery's foreign key
-- check then waited for that DELETE and, once it committed, failed with
-- 23503, and the link's INSERT or UPDATE with it (a create, a PATCH, a
-- revocation, a batch, an import, a blocklist sweep). The subscriptions
-- are now read FOR KEY SHARE, the lock the foreign key check takes anyway
-- (so it costs nothing more): a concurrent DELETE is waited for, and a
-- subscription it removed is skipped (READ COMMITTED rechecks a locked
-- row and leaves out one deleted meanwhile), and a subscription locked
-- first cannot be deleted until the write commits (the DELETE's cascade
-- then removes its delivery). The function alone is replaced: no table is
-- locked beyond the instant the replacement takes.
CREATE OR REPLACE FUNCTION webhook_enqueue_link_event() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    ev text;
BEGIN
    IF NOT EXISTS (SELECT 1 FROM webhook_subscriptions WHERE tenant = NEW.tenant) THEN
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
    WHERE s.tenant = NEW.tenant AND ev = ANY (s.events)
    FOR KEY SHARE OF s;
    RETURN NULL;
END;
$$;
