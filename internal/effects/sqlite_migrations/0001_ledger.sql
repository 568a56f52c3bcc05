-- The demo effect on SQLite: the ledger, as on PostgreSQL after its three
-- migrations. ledger_entries has NO unique constraint on the message ID on
-- purpose: if the inbox ever let a duplicate through, a verifier would see
-- two entries for one message. Times are microseconds since the Unix epoch.
CREATE TABLE accounts (
	id      INTEGER PRIMARY KEY,
	balance INTEGER NOT NULL DEFAULT 0
) STRICT;

CREATE TABLE ledger_entries (
	message_id TEXT    NOT NULL,
	account    INTEGER NOT NULL,
	amount     INTEGER NOT NULL,
	created_at INTEGER NOT NULL DEFAULT (CAST(unixepoch('subsec') * 1000000 AS INTEGER)),
	scope      TEXT    NOT NULL DEFAULT 'ledger'
) STRICT;

CREATE INDEX ledger_entries_scope_message_id ON ledger_entries (scope, message_id);
