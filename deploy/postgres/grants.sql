-- jetinbox roles, part 2 of 2: run after every `jetinbox migrate` that adds
-- tables, as jetinbox_migrator (the owner of the tables may grant on them)
-- or a superuser:
--
--   psql "postgres://jetinbox_migrator@db:5432/jetinbox?sslmode=verify-full" \
--        -v ON_ERROR_STOP=1 -f deploy/postgres/grants.sql
--
-- Idempotent. Table by table and column by column on purpose, not ALTER
-- DEFAULT PRIVILEGES: each role gets exactly the statements jetinbox runs
-- under it and nothing a later migration adds (jetinbox_migrations, for
-- instance, the consumer may read but never change). The first REVOKE takes
-- back what an earlier version of this file granted; all of it runs in one
-- transaction, so a running consumer never sees its grants half gone.

BEGIN;
SET LOCAL search_path = jetinbox;

REVOKE ALL ON ALL TABLES IN SCHEMA jetinbox FROM jetinbox_consumer, jetinbox_relay, jetinbox_verifier, jetinbox_maintainer;
REVOKE ALL ON ALL SEQUENCES IN SCHEMA jetinbox FROM jetinbox_consumer, jetinbox_relay, jetinbox_verifier, jetinbox_maintainer;
REVOKE ALL ON ALL FUNCTIONS IN SCHEMA jetinbox FROM PUBLIC, jetinbox_consumer, jetinbox_relay, jetinbox_verifier, jetinbox_maintainer;

-- jetinbox_consumer -------------------------------------------------------

-- The inbox: a claim inserts the row (received_at is always the server's
-- now(), which retention relies on, and claim_xid the claiming
-- transaction's ID, which inbox_release goes by: the consumer can set
-- neither), reads the rows that were already there, and a rejection sets
-- status and reason. No DELETE: the claims of messages to retry go back
-- through inbox_release, which removes only rows the calling transaction
-- inserted and has not committed.
GRANT SELECT ON TABLE inbox TO jetinbox_consumer;
GRANT INSERT (scope, message_id, fingerprint, stream_seq, subject) ON TABLE inbox TO jetinbox_consumer;
GRANT UPDATE (status, reason) ON TABLE inbox TO jetinbox_consumer;
GRANT EXECUTE ON FUNCTION inbox_release(text, text[]) TO jetinbox_consumer;

-- The conflict log: append only. ON CONFLICT (scope, message_id,
-- stream_seq) DO NOTHING reads the key columns of its unique index.
GRANT INSERT (scope, message_id, fingerprint, stream_seq, subject) ON TABLE inbox_conflicts TO jetinbox_consumer;
GRANT SELECT (scope, message_id, stream_seq) ON TABLE inbox_conflicts TO jetinbox_consumer;

-- The demo effect, the ledger: entries are appended, never changed or
-- removed; a balance changes, an account's ID never. Accounts are opened
-- by the migrator (`jetinbox accounts -open`).
GRANT INSERT (scope, message_id, account, amount) ON TABLE ledger_entries TO jetinbox_consumer;
GRANT SELECT ON TABLE accounts TO jetinbox_consumer;
GRANT UPDATE (balance) ON TABLE accounts TO jetinbox_consumer;

-- The outbox: an effect's follow-ups are appended in the inbox
-- transaction (created_at is the server's now(): retention relies on it),
-- a repeat is recognised by reading the row that is there. No UPDATE and
-- no DELETE: publishing and marking rows is the relay's job, under its own
-- role (below); sent rows go with `jetinbox prune -outbox`, as the
-- maintainer. (`consumer -relay`, the relay inside the consumer, needs the
-- relay's grants too; the shipped stack runs `jetinbox relay` apart.)
GRANT SELECT ON TABLE outbox TO jetinbox_consumer;
GRANT INSERT (id, subject, payload, fingerprint, parent_id) ON TABLE outbox TO jetinbox_consumer;

-- Read-only: lets a consumer check at start that the schema is migrated.
GRANT SELECT ON TABLE jetinbox_migrations TO jetinbox_consumer;

-- jetinbox_relay ----------------------------------------------------------

-- `jetinbox relay` reads the pending rows, locks a batch (FOR UPDATE SKIP
-- LOCKED needs UPDATE), marks it sent or failed, and counts the backlog
-- for its metrics. It cannot add a row (a message nobody's effect emitted),
-- change a row's ID, subject or payload, or delete one; it sees neither
-- the inbox nor the ledger. LISTEN needs no grant.
GRANT SELECT ON TABLE outbox TO jetinbox_relay;
GRANT UPDATE (sent_at, failed) ON TABLE outbox TO jetinbox_relay;
-- Read-only: lets the relay check at start that the outbox is migrated.
GRANT SELECT ON TABLE jetinbox_migrations TO jetinbox_relay;

-- jetinbox_verifier -------------------------------------------------------

-- `jetinbox verify` reads the inbox, the conflict log, the ledger and (for
-- -next-stream) the outbox, and writes nothing.
GRANT SELECT ON TABLE inbox, inbox_conflicts, accounts, ledger_entries, outbox, jetinbox_migrations TO jetinbox_verifier;

-- jetinbox_maintainer -----------------------------------------------------

-- `jetinbox prune` deletes inbox rows older than the replay horizon;
-- `jetinbox dlq -redrive` deletes the rejected row of an intent it
-- publishes again. Both read the rows they delete. Nothing else: it can
-- neither write an effect nor touch the ledger.
GRANT SELECT, DELETE ON TABLE inbox TO jetinbox_maintainer;
-- `jetinbox prune -outbox` deletes sent outbox rows older than the same
-- horizon. A pending row cannot be deleted, by this role or any other: the
-- outbox's own triggers refuse it (only sent or failed rows go), and they
-- keep the relay from setting a sent row pending again.
GRANT SELECT, DELETE ON TABLE outbox TO jetinbox_maintainer;

COMMIT;
