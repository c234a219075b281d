-- Which bootstrap items (domains, rules, plans, plan limits) have been seeded
-- once: a rule added to bootstrap.yaml reaches an existing database at the
-- next start, while a rule an operator deleted or edited stays as they left it.
CREATE TABLE rl_bootstrap_seen (
    item    text        PRIMARY KEY,
    seen_at timestamptz NOT NULL DEFAULT now()
);
