-- A tenant's plan change names the tenant in its notification
-- ('rl_tenant_plans:<tenant>'), so limiters read that tenant's row instead of
-- every tenant's: at 500,000 tenants a whole reload costs ~0.5 CPU-s. A
-- statement that changes more than 100 tenants, or one with a tenant ID
-- over 1,000 bytes (a notification holds under 8,000), sends the table's
-- name alone, as before: every tenant is reloaded. Limiters from before
-- this migration ignore payloads and reload everything at any of these.
DROP TRIGGER rl_tenant_plans_notify ON rl_tenant_plans;

CREATE FUNCTION rl_notify_tenants() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    t text;
BEGIN
    IF (SELECT count(*) > 100 OR coalesce(max(octet_length(tenant)), 0) > 1000 FROM changed) THEN
        PERFORM pg_notify('kurz_ratelimit_rules', 'rl_tenant_plans');
    ELSE
        FOR t IN SELECT tenant FROM changed LOOP
            PERFORM pg_notify('kurz_ratelimit_rules', 'rl_tenant_plans:' || t);
        END LOOP;
    END IF;
    RETURN NULL;
END $$;

-- A trigger with transition tables has one event; an update notifies both
-- its old and its new tenants (an update may rename one).
CREATE TRIGGER rl_tenant_plans_insert AFTER INSERT ON rl_tenant_plans
    REFERENCING NEW TABLE AS changed FOR EACH STATEMENT EXECUTE FUNCTION rl_notify_tenants();
CREATE TRIGGER rl_tenant_plans_update_new AFTER UPDATE ON rl_tenant_plans
    REFERENCING NEW TABLE AS changed FOR EACH STATEMENT EXECUTE FUNCTION rl_notify_tenants();
CREATE TRIGGER rl_tenant_plans_update_old AFTER UPDATE ON rl_tenant_plans
    REFERENCING OLD TABLE AS changed FOR EACH STATEMENT EXECUTE FUNCTION rl_notify_tenants();
CREATE TRIGGER rl_tenant_plans_delete AFTER DELETE ON rl_tenant_plans
    REFERENCING OLD TABLE AS changed FOR EACH STATEMENT EXECUTE FUNCTION rl_notify_tenants();
CREATE TRIGGER rl_tenant_plans_truncate AFTER TRUNCATE ON rl_tenant_plans
    FOR EACH STATEMENT EXECUTE FUNCTION rl_notify();
