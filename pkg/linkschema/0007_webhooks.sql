-- Issue #20, point 3: signed webhooks.

-- A tenant's subscriptions: where events are POSTed, and which ones.
CREATE TABLE webhook_subscriptions (
    id          text        PRIMARY KEY,
    tenant      text        NOT NULL,
    url         text        NOT NULL,
    events      text[]      NOT NULL,
    description text        NOT NULL DEFAULT '',
    -- The signing secret, AES-256-GCM-sealed (nonce || ciphertext) under
    -- KURZ_SHORTENER_WEBHOOK_KEY: the sender needs it in clear to sign, so
    -- it cannot be hashed; sealed, a dump of the table does not give it away.
    secret      bytea       NOT NULL,
    created_at  timestamptz NOT NULL DEFAULT now()
);

CREATE INDEX webhook_subscriptions_tenant ON webhook_subscriptions (tenant, created_at);

-- The durable queue: one row per event per subscription. The sender claims
-- due rows with SELECT ... FOR UPDATE SKIP LOCKED (so replicas share the
-- work) and pushes next_attempt_at past the attempt's timeout: a sender
-- that dies mid-attempt leaves the row to be claimed again once that lease
-- passes (at-least-once; receivers dedup by id).
CREATE TABLE webhook_deliveries (
    id              text        PRIMARY KEY,
    subscription_id text        NOT NULL REFERENCES webhook_subscriptions (id) ON DELETE CASCADE,
    tenant          text        NOT NULL,
    event_type      text        NOT NULL,
    data            jsonb       NOT NULL,
    status          text        NOT NULL DEFAULT 'pending'
                    CHECK (status IN ('pending', 'succeeded', 'dead')),
    attempts        integer     NOT NULL DEFAULT 0,
    last_error      text        NOT NULL DEFAULT '',
    last_status     integer     NOT NULL DEFAULT 0,
    -- When the event happened (the body's "time").
    created_at      timestamptz NOT NULL DEFAULT now(),
    -- When the current run of attempts began: the event, or the last
    -- redelivery; the retry window counts from here.
    queued_at       timestamptz NOT NULL DEFAULT now(),
    last_attempt_at timestamptz,
    next_attempt_at timestamptz NOT NULL DEFAULT now()
);

-- The sender's claim: each subscription's due pending rows, oldest due
-- first (a few per subscription, so one backlog cannot crowd out others).
CREATE INDEX webhook_deliveries_due ON webhook_deliveries (subscription_id, next_attempt_at) WHERE status = 'pending';
-- The retention's deletes: finished deliveries by their last attempt.
CREATE INDEX webhook_deliveries_finished ON webhook_deliveries (last_attempt_at) WHERE status <> 'pending';
-- ListWebhookDeliveries: a subscription's deliveries, newest first.
CREATE INDEX webhook_deliveries_page ON webhook_deliveries (subscription_id, created_at DESC, id DESC);

-- The events are queued by a trigger on links, in the transaction of the
-- change itself: a committed change always has its deliveries queued, and
-- every writer (creates, batches, imports, updates, revocations, blocklist
-- sweeps) is covered without code of its own. A tenant without
-- subscriptions costs one index probe per written link. The data never
-- carries the password hash.
CREATE FUNCTION webhook_enqueue_link_event() RETURNS trigger LANGUAGE plpgsql AS $$
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
    WHERE s.tenant = NEW.tenant AND ev = ANY (s.events);
    RETURN NULL;
END;
$$;

CREATE TRIGGER links_webhooks AFTER INSERT OR UPDATE ON links
    FOR EACH ROW EXECUTE FUNCTION webhook_enqueue_link_event();
