-- The limiter's rules, plans and tenant plans. Every change NOTIFYs channel
-- kurz_ratelimit_rules, so every limiter reloads within a second.
CREATE TABLE rl_domains (
    domain   text  PRIMARY KEY,
    defaults jsonb NOT NULL DEFAULT '{}'
);

CREATE TABLE rl_rules (
    domain   text  NOT NULL REFERENCES rl_domains ON DELETE CASCADE,
    name     text  NOT NULL,
    position int   NOT NULL,
    spec     jsonb NOT NULL,
    PRIMARY KEY (domain, name)
);

CREATE TABLE rl_plans (
    plan text PRIMARY KEY
);

-- rule_id is "domain/name"; spec holds limit, window and burst overrides.
CREATE TABLE rl_plan_limits (
    plan    text  NOT NULL REFERENCES rl_plans ON DELETE CASCADE,
    rule_id text  NOT NULL,
    spec    jsonb NOT NULL,
    PRIMARY KEY (plan, rule_id)
);

CREATE TABLE rl_tenant_plans (
    tenant text PRIMARY KEY,
    plan   text NOT NULL REFERENCES rl_plans
);

CREATE FUNCTION rl_notify() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_notify('kurz_ratelimit_rules', TG_TABLE_NAME);
    RETURN NULL;
END $$;

CREATE TRIGGER rl_domains_notify AFTER INSERT OR UPDATE OR DELETE OR TRUNCATE ON rl_domains
    FOR EACH STATEMENT EXECUTE FUNCTION rl_notify();
CREATE TRIGGER rl_rules_notify AFTER INSERT OR UPDATE OR DELETE OR TRUNCATE ON rl_rules
    FOR EACH STATEMENT EXECUTE FUNCTION rl_notify();
CREATE TRIGGER rl_plans_notify AFTER INSERT OR UPDATE OR DELETE OR TRUNCATE ON rl_plans
    FOR EACH STATEMENT EXECUTE FUNCTION rl_notify();
CREATE TRIGGER rl_plan_limits_notify AFTER INSERT OR UPDATE OR DELETE OR TRUNCATE ON rl_plan_limits
    FOR EACH STATEMENT EXECUTE FUNCTION rl_notify();
CREATE TRIGGER rl_tenant_plans_notify AFTER INSERT OR UPDATE OR DELETE OR TRUNCATE ON rl_tenant_plans
    FOR EACH STATEMENT EXECUTE FUNCTION rl_notify();
