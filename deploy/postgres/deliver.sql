-- The delivery dispatcher's role (`jetinbox deliver`): run as a superuser,
-- connected to the jetinbox database, after roles.sql, after `jetinbox
-- migrate` (which applies the deliveries table) and after every run of
-- grants.sql (whose first REVOKE takes back the consumer's grant below):
--
--   psql "postgres://postgres@db:5432/jetinbox?sslmode=verify-full" \
--        -v ON_ERROR_STOP=1 -f deploy/postgres/deliver.sql
--
-- Idempotent. No password here: set it with \password.
--
--   jetinbox_deliver    leases due deliveries and records their outcomes
--                       (deliveries: SELECT, UPDATE of the lease and
--                       outcome columns), and redrives dead ones
--                       (`jetinbox dlq -deliveries -redrive`); nothing
--                       else: it cannot add a delivery (a call no effect
--                       decided), change a row's endpoint, key or payload,
--                       delete one, or see the inbox, the ledger or the
--                       outbox. Endpoint URLs and secrets are not in the
--                       database at all: they come from its endpoints file.
--   jetinbox_consumer   (from roles.sql) adds deliveries in the inbox
--                       transaction (`consumer -deliveries`): INSERT of a
--                       new row's columns, SELECT for ON CONFLICT.
--   jetinbox_verifier   (from roles.sql) the console's reads: SELECT of
--                       where each delivery stands, not of its payload
--                       or the receiver's answer.

DO $$
BEGIN
	IF NOT EXISTS (SELECT FROM pg_roles WHERE rolname = 'jetinbox_deliver') THEN
		CREATE ROLE jetinbox_deliver LOGIN;
	END IF;
END
$$;
ALTER ROLE jetinbox_deliver LOGIN NOSUPERUSER NOCREATEDB NOCREATEROLE NOREPLICATION NOBYPASSRLS NOINHERIT
  CONNECTION LIMIT 32;
GRANT CONNECT ON DATABASE jetinbox TO jetinbox_deliver;
GRANT USAGE ON SCHEMA jetinbox TO jetinbox_deliver;
ALTER ROLE jetinbox_deliver IN DATABASE jetinbox SET search_path = jetinbox;
-- Its statements are single-row or one short lease: no transaction is held
-- across a call (rows are leased, not locked), so these bound mistakes.
ALTER ROLE jetinbox_deliver IN DATABASE jetinbox SET statement_timeout = '30s';
ALTER ROLE jetinbox_deliver IN DATABASE jetinbox SET idle_in_transaction_session_timeout = '1min';

BEGIN;
REVOKE ALL ON TABLE jetinbox.deliveries FROM jetinbox_deliver, jetinbox_consumer;
GRANT SELECT ON TABLE jetinbox.deliveries TO jetinbox_deliver;
GRANT UPDATE (state, next_at, leased_by, lease_until, attempts, first_attempt_at, last_status, last_body, last_at, reason, done_at)
  ON TABLE jetinbox.deliveries TO jetinbox_deliver;
GRANT SELECT ON TABLE jetinbox.jetinbox_migrations TO jetinbox_deliver;
GRANT SELECT ON TABLE jetinbox.deliveries TO jetinbox_consumer;
GRANT INSERT (scope, message_id, endpoint, idem_key, payload) ON TABLE jetinbox.deliveries TO jetinbox_consumer;
-- The console's reads (an intent's outgoing deliveries, the backlog) run as
-- the verifier: where each delivery stands, never its payload or the
-- receiver's answer body.
REVOKE ALL ON TABLE jetinbox.deliveries FROM jetinbox_verifier;
GRANT SELECT (id, scope, message_id, endpoint, idem_key, state, attempts, created_at, next_at, first_attempt_at, last_status, last_at, reason, done_at)
  ON TABLE jetinbox.deliveries TO jetinbox_verifier;
COMMIT;
