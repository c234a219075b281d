-- Idempotency keys of webhook subscriptions (the Idempotency-Key header on
-- POST /v1/webhooks): request_key is the SHA-256 of the key a subscription
-- was created with, request_hash the SHA-256 of that create's request. A
-- create sent again with the key answers the subscription (and its
-- secret); one with the key and another request is refused. Creates of a
-- tenant's subscriptions run under its advisory lock, which makes the
-- lookup and the insert one step: no unique index is needed, and a
-- tenant has at most KURZ_SHORTENER_WEBHOOK_MAX_SUBSCRIPTIONS rows to look
-- through.
ALTER TABLE webhook_subscriptions ADD COLUMN request_key bytea, ADD COLUMN request_hash bytea;
