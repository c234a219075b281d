-- Suspended tenants: an operator's stop button for abuse. The gateway
-- writes a row when an administrator suspends a tenant and deletes it on
-- resume, in the transaction that changes gw_tenants (which keeps the
-- reason, an operator's note the readers here have no use for). The
-- redirect reads the whole table every few seconds into memory and answers
-- the tenant's links 410; the webhook sender holds the tenant's deliveries.
-- The table is small (suspended tenants only) and read whole, so it needs
-- no index beyond its key.
CREATE TABLE tenant_suspensions (
    tenant       text        PRIMARY KEY,
    suspended_at timestamptz NOT NULL DEFAULT now()
);
