-- Idempotency keys of creates (the Idempotency-Key header; gRPC metadata
-- idempotency-key). request_key is the SHA-256 of the key a link was
-- created with, request_hash the SHA-256 of that create's request (its
-- password left out): a create sent again with the key answers the link,
-- one with the key and another request is refused. NULL for every link
-- created without a key. The unique index that makes concurrent creates
-- with one key make one link is 0016 (built concurrently).
ALTER TABLE links ADD COLUMN request_key bytea, ADD COLUMN request_hash bytea;
