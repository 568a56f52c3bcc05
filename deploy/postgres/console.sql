-- The operator console's roles (`jetinbox console`): run as a superuser,
-- connected to the jetinbox database, after roles.sql and grants.sql (and,
-- in the intake's database, after intake.sql):
--
--   psql "postgres://postgres@db:5432/jetinbox?sslmode=verify-full" \
--        -v ON_ERROR_STOP=1 -f deploy/postgres/console.sql
--
-- Idempotent. No password here: set it with \password.
--
--   jetinbox_verifier   (from roles.sql) the console's reads: every page
--                       reads as the verifier (-database-url), whose
--                       sessions are read-only. Here it also gets the
--                       columns of idempotency_keys that name a key and
--                       its answer's status, where that table exists (the
--                       intent page's HTTP hop), never the stored answer's
--                       headers or body.
--   jetinbox_console    the console's re-drive (-redrive-database-url):
--                       it reads an intent's inbox row and deletes it when
--                       it records a rejection, as `jetinbox dlq -redrive`
--                       does, nothing else: no insert or update anywhere,
--                       no ledger, no outbox, no keys, no conflict log.
--                       Its connections are few and short.

DO $$
BEGIN
	IF NOT EXISTS (SELECT FROM pg_roles WHERE rolname = 'jetinbox_console') THEN
		CREATE ROLE jetinbox_console LOGIN;
	END IF;
END
$$;
ALTER ROLE jetinbox_console LOGIN NOSUPERUSER NOCREATEDB NOCREATEROLE NOREPLICATION NOBYPASSRLS NOINHERIT
  CONNECTION LIMIT 4;
GRANT CONNECT ON DATABASE jetinbox TO jetinbox_console;
GRANT USAGE ON SCHEMA jetinbox TO jetinbox_console;
ALTER ROLE jetinbox_console IN DATABASE jetinbox SET search_path = jetinbox;
ALTER ROLE jetinbox_console IN DATABASE jetinbox SET statement_timeout = '10s';
ALTER ROLE jetinbox_console IN DATABASE jetinbox SET lock_timeout = '5s';
ALTER ROLE jetinbox_console IN DATABASE jetinbox SET idle_in_transaction_session_timeout = '30s';

BEGIN;
DO $$
BEGIN
	IF to_regclass('jetinbox.inbox') IS NOT NULL THEN
		REVOKE ALL ON TABLE jetinbox.inbox FROM jetinbox_console;
		GRANT SELECT, DELETE ON TABLE jetinbox.inbox TO jetinbox_console;
	END IF;
	IF to_regclass('jetinbox.idempotency_keys') IS NOT NULL THEN
		GRANT SELECT (scope_hash, principal, method, route, key, status, created_at) ON TABLE jetinbox.idempotency_keys TO jetinbox_verifier;
	END IF;
END
$$;
COMMIT;
