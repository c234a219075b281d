-- A busy subscription could not be deleted: its DELETE cascaded over its
-- whole delivery log (kept 7 days) in one statement, which with 1.5M rows
-- outlasted the query timeout every time, the subscription stayed, and the
-- tenant's link writes waited on it meanwhile. A delete now marks the
-- subscription (deleted_at): it leaves the API and gets no more events at
-- once, and its deliveries are neither sent nor counted; the senders then
-- purge its deliveries in batches and remove the row once none is left,
-- when the foreign key's cascade, kept for writers that still delete the
-- row outright (a replica of the previous version during the rollout, an
-- operator), has nothing left to do.
--
-- Safe on a populated database: the column is nullable without a default
-- (no rewrite, the ACCESS EXCLUSIVE lock lasts an instant), the partial
-- index is on the subscriptions, a few per tenant (webhook_deliveries,
-- the large table, is not touched), and the trigger's function is
-- replaced in place.
ALTER TABLE webhook_subscriptions ADD COLUMN deleted_at timestamptz;
-- The senders' look for deleted subscriptions to purge.
CREATE INDEX webhook_subscriptions_deleted ON webhook_subscriptions (deleted_at) WHERE deleted_at IS NOT NULL;

-- 0012's function, which now leaves deleted subscriptions out.
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
