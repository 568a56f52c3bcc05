-- The outbox in SQLite: messages to publish, written in the same transaction
-- as the effect or the service's own row. Times are microseconds since the
-- Unix epoch. A relay leases a batch (lease_until) in a short transaction,
-- publishes it, and marks it sent in another: SQLite has one writer and no
-- row locks to hold across the publishes.
CREATE TABLE outbox (
	seq         INTEGER PRIMARY KEY AUTOINCREMENT,
	id          TEXT    NOT NULL UNIQUE,
	subject     TEXT    NOT NULL,
	payload     BLOB    NOT NULL,
	fingerprint BLOB    NOT NULL,
	parent_id   TEXT    NOT NULL DEFAULT '',
	created_at  INTEGER NOT NULL,
	sent_at     INTEGER,
	failed      TEXT,
	lease_until INTEGER
);

CREATE INDEX outbox_pending ON outbox (seq) WHERE sent_at IS NULL AND failed IS NULL;
CREATE INDEX outbox_created_at ON outbox (created_at);
