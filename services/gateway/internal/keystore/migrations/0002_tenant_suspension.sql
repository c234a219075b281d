-- A suspended tenant (an operator's stop button for abuse): suspended_at is
-- when, suspend_reason the administrator's note, never shown to the tenant.
-- The same transaction writes the shortener's tenant_suspensions, which the
-- redirect and the webhook sender read (pkg/linkschema).
ALTER TABLE gw_tenants ADD COLUMN suspended_at timestamptz,
    ADD COLUMN suspend_reason text NOT NULL DEFAULT '';
