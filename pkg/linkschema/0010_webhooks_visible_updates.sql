-- link.updated only for a change a subscriber can see: an update that
-- changes nothing but url_key (a CODE_MODE_FROM_URL link giving its URL
-- up to a new link, or once its visits are spent) queued one, under a
-- new event id, for an unchanged link. The function is 0007's otherwise.
CREATE OR REPLACE FUNCTION webhook_enqueue_link_event() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    ev text;
BEGIN
    IF NOT EXISTS (SELECT 1 FROM webhook_subscriptions WHERE tenant = NEW.tenant) THEN
        RETURN NULL;
    END IF;
    IF TG_OP = 'UPDATE' AND (to_jsonb(OLD) - 'url_key') = (to_jsonb(NEW) - 'url_key') THEN
        RETURN NULL; -- nothing a subscriber can see changed
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
    WHERE s.tenant = NEW.tenant AND ev = ANY (s.events);
    RETURN NULL;
END;
$$;
