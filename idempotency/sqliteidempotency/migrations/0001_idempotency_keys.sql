-- The keys of an HTTP intake (package idempotency) in SQLite: one row per
-- scoped Idempotency-Key, claimed in the transaction of the request's work
-- and holding the answer that commits with it. created_at is microseconds
-- since the Unix epoch, by the writer's clock.
CREATE TABLE idempotency_keys (
	scope_hash  BLOB    PRIMARY KEY,
	principal   TEXT    NOT NULL,
	method      TEXT    NOT NULL,
	route       TEXT    NOT NULL,
	key         TEXT    NOT NULL CHECK (length(key) BETWEEN 1 AND 255),
	fingerprint TEXT    NOT NULL,
	status      INTEGER NOT NULL DEFAULT 0,
	header      TEXT    NOT NULL DEFAULT '',
	body        BLOB    NOT NULL DEFAULT x'',
	created_at  INTEGER NOT NULL
) STRICT, WITHOUT ROWID;

CREATE INDEX idempotency_keys_created_at ON idempotency_keys (created_at);
