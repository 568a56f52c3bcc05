-- The HTTP intake's role (`jetinbox intake`): run as a superuser, connected
-- to the jetinbox database, after roles.sql and after the migrator applied
-- the key table (`jetinbox intake -migrate`, which also applies the outbox):
--
--   psql "postgres://postgres@db:5432/jetinbox?sslmode=verify-full" \
--        -v ON_ERROR_STOP=1 -f deploy/postgres/intake.sql
--
-- Idempotent. No password here: set it with \password.
--
--   jetinbox_intake     claims keys and stores their answers
--                       (idempotency_keys: SELECT, INSERT, UPDATE of the
--                       answer's columns) and adds intents to the outbox
--                       (SELECT, INSERT of a new row's columns), nothing
--                       else: it cannot delete a key (which would let a
--                       retry run again), change a stored key's scope or
--                       fingerprint, mark or change an outbox row, or see
--                       the inbox or the ledger. Keys are pruned by
--                       jetinbox_maintainer (`jetinbox intake -prune`), so
--                       the intakes run with -prune-interval 0.
--   jetinbox_relay      (from roles.sql) reads the intake's outbox and marks
--                       its rows sent or failed, as in the consumer's
--                       database; it publishes them into INTENTS.
--
-- In the intake's own database (its own server: never the consumer's, whose
-- outbox holds notifications for another stream) run roles.sql, then
-- `jetinbox intake -migrate` as jetinbox_migrator, then this file; grants.sql
-- is not run there (there is no inbox).

DO $$
BEGIN
	IF NOT EXISTS (SELECT FROM pg_roles WHERE rolname = 'jetinbox_intake') THEN
		CREATE ROLE jetinbox_intake LOGIN;
	END IF;
END
$$;
ALTER ROLE jetinbox_intake LOGIN NOSUPERUSER NOCREATEDB NOCREATEROLE NOREPLICATION NOBYPASSRLS NOINHERIT
  CONNECTION LIMIT 64;
GRANT CONNECT ON DATABASE jetinbox TO jetinbox_intake;
GRANT USAGE ON SCHEMA jetinbox TO jetinbox_intake;
ALTER ROLE jetinbox_intake IN DATABASE jetinbox SET search_path = jetinbox;
-- A request's transaction is short: the claim, the handler's insert, the
-- answer. Waiting for a key's row is bounded by the intake's -wait (a
-- transaction-local lock_timeout); these bound everything else.
ALTER ROLE jetinbox_intake IN DATABASE jetinbox SET statement_timeout = '10s';
ALTER ROLE jetinbox_intake IN DATABASE jetinbox SET idle_in_transaction_session_timeout = '30s';

BEGIN;
REVOKE ALL ON TABLE jetinbox.idempotency_keys FROM jetinbox_intake;
GRANT SELECT, INSERT ON TABLE jetinbox.idempotency_keys TO jetinbox_intake;
GRANT UPDATE (status, header, body) ON TABLE jetinbox.idempotency_keys TO jetinbox_intake;
GRANT SELECT ON TABLE jetinbox.outbox TO jetinbox_intake;
GRANT INSERT (id, subject, payload, fingerprint, parent_id) ON TABLE jetinbox.outbox TO jetinbox_intake;
GRANT SELECT ON TABLE jetinbox.jetinbox_migrations TO jetinbox_intake;
-- Retention: `jetinbox intake -prune` under the maintainer, on a schedule.
GRANT SELECT, DELETE ON TABLE jetinbox.idempotency_keys TO jetinbox_maintainer;
-- `jetinbox intake -prune` checks the schema's version first.
GRANT SELECT ON TABLE jetinbox.jetinbox_migrations TO jetinbox_maintainer;
-- The relay that publishes this outbox into INTENTS reads it and marks its
-- rows, nothing else: the same rights grants.sql gives it on the consumer's
-- database. The intake's own database has no inbox, so grants.sql does not
-- run here and these are the relay's only grants in it.
GRANT SELECT ON TABLE jetinbox.outbox TO jetinbox_relay;
GRANT UPDATE (sent_at, failed) ON TABLE jetinbox.outbox TO jetinbox_relay;
GRANT SELECT ON TABLE jetinbox.jetinbox_migrations TO jetinbox_relay;
COMMIT;
