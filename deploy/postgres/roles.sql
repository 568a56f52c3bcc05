-- jetinbox roles, part 1 of 2: run ONCE, as a superuser, connected to the
-- jetinbox database, BEFORE the first `jetinbox migrate`:
--
--   psql "postgres://postgres@db:5432/jetinbox?sslmode=verify-full" \
--        -v ON_ERROR_STOP=1 -f deploy/postgres/roles.sql
--
-- Part 2, grants.sql, runs after every migrate (the tables must exist).
-- No passwords here: set them afterwards with \password, or let the
-- compose stack's initdb script do it from its secret files.
--
-- Two roles:
--   jetinbox_migrator  owns the schema and every table in it; runs
--                      `jetinbox migrate`. Never used by a running service.
--   jetinbox_consumer  the consumer's login: CONNECT, USAGE on the schema and
--                      SELECT/INSERT/UPDATE/DELETE on the four tables it
--                      touches (grants.sql). It cannot create, alter, drop or
--                      truncate anything, so a bug or a stolen password cannot
--                      change the schema or wipe the inbox in one statement.

CREATE ROLE jetinbox_migrator LOGIN NOSUPERUSER NOCREATEDB NOCREATEROLE NOREPLICATION;
CREATE ROLE jetinbox_consumer LOGIN NOSUPERUSER NOCREATEDB NOCREATEROLE NOREPLICATION NOINHERIT
  CONNECTION LIMIT 64;

-- Nobody gets in by default; each role is let in by name.
REVOKE ALL ON DATABASE jetinbox FROM PUBLIC;
GRANT CONNECT, TEMPORARY ON DATABASE jetinbox TO jetinbox_migrator;
GRANT CONNECT ON DATABASE jetinbox TO jetinbox_consumer;

-- The schema jetinbox holds everything and belongs to the migrator. The
-- public schema is closed (PostgreSQL 15 already takes CREATE away from
-- PUBLIC; this also takes USAGE, so nothing resolves there by accident).
REVOKE ALL ON SCHEMA public FROM PUBLIC;
CREATE SCHEMA jetinbox AUTHORIZATION jetinbox_migrator;
GRANT USAGE ON SCHEMA jetinbox TO jetinbox_consumer;

-- The code uses unqualified table names; this is where they resolve.
ALTER ROLE jetinbox_migrator IN DATABASE jetinbox SET search_path = jetinbox;
ALTER ROLE jetinbox_consumer IN DATABASE jetinbox SET search_path = jetinbox;

-- Timeouts for the consumer's sessions (the server-wide values are in
-- postgresql.conf.snippet; these are tighter and apply to this role only).
-- A batch waits on a row lock only while another worker holds the same
-- message ID, which is short; waiting longer means something is stuck, and
-- the message is better nak'ed and redelivered than held past its AckWait.
ALTER ROLE jetinbox_consumer IN DATABASE jetinbox SET lock_timeout = '5s';
ALTER ROLE jetinbox_consumer IN DATABASE jetinbox SET statement_timeout = '20s';
ALTER ROLE jetinbox_consumer IN DATABASE jetinbox SET idle_in_transaction_session_timeout = '30s';
