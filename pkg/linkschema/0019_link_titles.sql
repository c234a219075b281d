-- A link's title: what the link is, for people (Shlink's, YOURLS' and
-- Bitly's title, kept by their imports). The shortener bounds it (512
-- characters, valid UTF-8, no control characters); the redirect never reads
-- it. Existing links get the empty title, which is "none": NOT NULL with a
-- constant default is a catalogue change in PostgreSQL 11 and later, no
-- table rewrite, so the migration does not hold the links table long.
ALTER TABLE links ADD COLUMN title text NOT NULL DEFAULT '';

-- Link events carry the title with the link's other fields: 0013's
-- function with 'title' added. A change of the title alone is a
-- link.updated (0010's trigger fires on any change but url_key's).
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
    WHERE s.tenant = NEW.tenant AND ev = ANY (s.events) AND s.deleted_at IS NULL
    FOR KEY SHARE OF s;
    RETURN NULL;
END;
$$;
