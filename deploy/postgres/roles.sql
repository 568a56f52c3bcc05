-- jetinbox roles, part 1 of 2: run as a superuser, connected to the
-- jetinbox database, BEFORE the first `jetinbox migrate`:
--
--   psql "postgres://postgres@db:5432/jetinbox?sslmode=verify-full" \
--        -v ON_ERROR_STOP=1 -f deploy/postgres/roles.sql
--
-- Part 2, grants.sql, runs after every migrate (the tables must exist).
-- Idempotent: run it again after an upgrade that adds a role; existing
-- roles keep their passwords. No passwords here: set them afterwards with
-- \password, or let the compose stack's initdb script do it from its secret
-- files.
--
-- Five login roles, each for one job (grants.sql has the table-by-table
-- detail, deploy/README.md the threat model):
--   jetinbox_migrator   owns the schema and every table in it; runs
--                       `jetinbox migrate`, grants.sql and `jetinbox
--                       accounts`. Never used by a running service.
--   jetinbox_consumer   the consumer's login (and `jetinbox replay`'s, which
--                       runs the consumer's work): claims inbox rows, records
--                       rejections and conflicts, appends ledger entries and
--                       updates balances. It cannot delete, truncate or
--                       rewrite anything: no DELETE on any table, no UPDATE
--                       of the ledger, of inbox_conflicts or of an inbox
--                       row's identity, and the claims of messages it retries
--                       it gives back through inbox_release, which removes
--                       only rows its own open transaction inserted. A bug
--                       or a stolen password cannot wipe the inbox or
--                       rewrite the ledger's history.
--   jetinbox_relay      `jetinbox relay`: reads the outbox's pending rows,
--                       locks a batch and marks it sent or failed (SELECT,
--                       UPDATE of sent_at and failed on outbox), nothing
--                       else: it cannot add a row, change what a row says,
--                       delete one, or touch the inbox or the ledger.
--   jetinbox_verifier   `jetinbox verify`: SELECT on the tables it checks,
--                       nothing else; its sessions are read-only too.
--   jetinbox_maintainer `jetinbox prune` (retention) and `jetinbox dlq
--                       -redrive`: SELECT and DELETE on inbox, nothing else.
--                       An operator's tool, run by hand or on a schedule;
--                       never given to a running service.
-- None of them can create, alter, drop or truncate anything but the
-- migrator, which owns the schema.

DO $$
DECLARE
	r text;
BEGIN
	FOREACH r IN ARRAY ARRAY['jetinbox_migrator', 'jetinbox_consumer', 'jetinbox_relay', 'jetinbox_verifier', 'jetinbox_maintainer'] LOOP
		IF NOT EXISTS (SELECT FROM pg_roles WHERE rolname = r) THEN
			EXECUTE format('CREATE ROLE %I LOGIN', r);
		END IF;
	END LOOP;
END
$$;
ALTER ROLE jetinbox_migrator LOGIN NOSUPERUSER NOCREATEDB NOCREATEROLE NOREPLICATION NOBYPASSRLS;
ALTER ROLE jetinbox_consumer LOGIN NOSUPERUSER NOCREATEDB NOCREATEROLE NOREPLICATION NOBYPASSRLS NOINHERIT
  CONNECTION LIMIT 64;
ALTER ROLE jetinbox_relay LOGIN NOSUPERUSER NOCREATEDB NOCREATEROLE NOREPLICATION NOBYPASSRLS NOINHERIT
  CONNECTION LIMIT 16;
ALTER ROLE jetinbox_verifier LOGIN NOSUPERUSER NOCREATEDB NOCREATEROLE NOREPLICATION NOBYPASSRLS NOINHERIT
  CONNECTION LIMIT 8;
ALTER ROLE jetinbox_maintainer LOGIN NOSUPERUSER NOCREATEDB NOCREATEROLE NOREPLICATION NOBYPASSRLS NOINHERIT
  CONNECTION LIMIT 8;

-- Nobody gets in by default; each role is let in by name. Only the
-- migrator may create temporary tables.
REVOKE ALL ON DATABASE jetinbox FROM PUBLIC;
GRANT CONNECT, TEMPORARY ON DATABASE jetinbox TO jetinbox_migrator;
GRANT CONNECT ON DATABASE jetinbox TO jetinbox_consumer, jetinbox_relay, jetinbox_verifier, jetinbox_maintainer;

-- The schema jetinbox holds everything and belongs to the migrator. The
-- public schema is closed (PostgreSQL 15 already takes CREATE away from
-- PUBLIC; this also takes USAGE, so nothing resolves there by accident).
REVOKE ALL ON SCHEMA public FROM PUBLIC;
CREATE SCHEMA IF NOT EXISTS jetinbox AUTHORIZATION jetinbox_migrator;
GRANT USAGE ON SCHEMA jetinbox TO jetinbox_consumer, jetinbox_relay, jetinbox_verifier, jetinbox_maintainer;

-- The code uses unqualified table names; this is where they resolve.
ALTER ROLE jetinbox_migrator IN DATABASE jetinbox SET search_path = jetinbox;
ALTER ROLE jetinbox_consumer IN DATABASE jetinbox SET search_path = jetinbox;
ALTER ROLE jetinbox_relay IN DATABASE jetinbox SET search_path = jetinbox;
ALTER ROLE jetinbox_verifier IN DATABASE jetinbox SET search_path = jetinbox;
ALTER ROLE jetinbox_maintainer IN DATABASE jetinbox SET search_path = jetinbox;

-- Timeouts for the consumer's sessions (the server-wide values are in
-- postgresql.conf.snippet; these are tighter and apply to this role only).
-- A batch waits on a row lock only while another worker holds the same
-- message ID, which is short; waiting longer means something is stuck, and
-- the message is better nak'ed and redelivered than held past its AckWait.
ALTER ROLE jetinbox_consumer IN DATABASE jetinbox SET lock_timeout = '5s';
ALTER ROLE jetinbox_consumer IN DATABASE jetinbox SET statement_timeout = '20s';
ALTER ROLE jetinbox_consumer IN DATABASE jetinbox SET idle_in_transaction_session_timeout = '30s';

-- The relay's rounds are short: a batch locked, published, marked. A lock
-- held longer than the statement timeout means something is stuck; the
-- rows are better given back (another relay takes them) than held.
ALTER ROLE jetinbox_relay IN DATABASE jetinbox SET lock_timeout = '5s';
ALTER ROLE jetinbox_relay IN DATABASE jetinbox SET idle_in_transaction_session_timeout = '2min';

-- The verifier only reads: even a statement its grants allowed could not
-- write in a read-only transaction.
ALTER ROLE jetinbox_verifier IN DATABASE jetinbox SET default_transaction_read_only = on;
