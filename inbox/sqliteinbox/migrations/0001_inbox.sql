-- The inbox on SQLite: the same tables as on PostgreSQL. The primary key is
-- the dedupe; the row commits in the same transaction as the message's
-- effect. Times are microseconds since the Unix epoch (UTC).
CREATE TABLE inbox (
	scope       TEXT    NOT NULL,
	message_id  TEXT    NOT NULL,
	fingerprint BLOB    NOT NULL,
	status      TEXT    NOT NULL DEFAULT 'applied' CHECK (status IN ('applied', 'rejected')),
	reason      TEXT,
	stream_seq  INTEGER NOT NULL DEFAULT 0,
	subject     TEXT    NOT NULL DEFAULT '',
	received_at INTEGER NOT NULL DEFAULT (CAST(unixepoch('subsec') * 1000000 AS INTEGER)),
	PRIMARY KEY (scope, message_id)
) STRICT, WITHOUT ROWID;

-- Retention deletes by age.
CREATE INDEX inbox_received_at ON inbox (received_at);

-- The same ID arriving with a different payload: never applied, kept here
-- for the operator and dead-lettered by the transport. One row per
-- conflicting stream message, however often it is redelivered.
CREATE TABLE inbox_conflicts (
	id          INTEGER PRIMARY KEY,
	scope       TEXT    NOT NULL,
	message_id  TEXT    NOT NULL,
	fingerprint BLOB    NOT NULL,
	stream_seq  INTEGER NOT NULL DEFAULT 0,
	subject     TEXT    NOT NULL DEFAULT '',
	seen_at     INTEGER NOT NULL DEFAULT (CAST(unixepoch('subsec') * 1000000 AS INTEGER))
) STRICT;
CREATE UNIQUE INDEX inbox_conflicts_message ON inbox_conflicts (scope, message_id, stream_seq);
