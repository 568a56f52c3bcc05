-- jetinbox roles, part 2 of 2: run after every `jetinbox migrate` that adds
-- tables, as jetinbox_migrator (the owner of the tables may grant on them)
-- or a superuser:
--
--   psql "postgres://jetinbox_migrator@db:5432/jetinbox?sslmode=verify-full" \
--        -v ON_ERROR_STOP=1 -f deploy/postgres/grants.sql
--
-- Idempotent. Table by table on purpose, not ALTER DEFAULT PRIVILEGES: the
-- consumer gets exactly what it uses and nothing a later migration adds
-- (jetinbox_migrations, for instance, it may read but never change).

SET search_path = jetinbox;

-- The inbox and its conflict log: claim rows, record rejections, retention
-- deletes old rows. DELETE is for retention only.
GRANT SELECT, INSERT, UPDATE, DELETE ON TABLE inbox, inbox_conflicts TO jetinbox_consumer;

-- The demo effect, the ledger.
GRANT SELECT, INSERT, UPDATE, DELETE ON TABLE accounts, ledger_entries TO jetinbox_consumer;

-- Read-only: lets a consumer check at start that the schema is migrated.
GRANT SELECT ON TABLE jetinbox_migrations TO jetinbox_consumer;

-- Identity columns (inbox_conflicts.id) draw from sequences.
GRANT USAGE ON ALL SEQUENCES IN SCHEMA jetinbox TO jetinbox_consumer;
