-- kurz:concurrently
-- ListWebhookDeliveries filtered to pending or dead deliveries, newest
-- first. webhook_deliveries_page alone made such a list walk the whole log
-- of the subscription (kept 7 days, millions of succeeded deliveries for a
-- busy link.clicked subscription) to find its few dead ones: 0.4-1.1 s at
-- 1.5M deliveries, past the query timeout at a few million, which is when a
-- tenant needs to find them to redeliver. The unfinished deliveries are few,
-- so is this index.
--
-- Built concurrently (kurz:concurrently, pgpool.ConcurrentDirective):
-- built in a transaction, it would block the table's writes for as long as
-- the build takes, and the links trigger writes here, so every link write
-- of a tenant with subscriptions would wait.
CREATE INDEX CONCURRENTLY IF NOT EXISTS webhook_deliveries_unfinished_page
    ON webhook_deliveries (subscription_id, status, created_at DESC, id DESC)
    WHERE status <> 'succeeded';
