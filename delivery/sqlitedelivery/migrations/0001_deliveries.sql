-- Deliveries in SQLite: calls to other services decided by an effect,
-- written in the effect's inbox transaction. Times are microseconds since
-- the Unix epoch, by the writing machine's clock. A dispatcher (jetinbox
-- deliver) leases the due ones in one short write, POSTs each with its
-- idempotency key outside any transaction, and records the outcome in
-- another short write: the row is delivered or dead, or pending again under
-- the same key. SQLite has one writer and no row locks to hold across a call.
CREATE TABLE deliveries (
	id               INTEGER PRIMARY KEY AUTOINCREMENT,
	scope            TEXT    NOT NULL,
	message_id       TEXT    NOT NULL,
	endpoint         TEXT    NOT NULL,
	-- Derived from (scope, message_id, endpoint): the same on every attempt.
	idem_key         TEXT    NOT NULL,
	payload          BLOB    NOT NULL,
	created_at       INTEGER NOT NULL,
	-- pending, delivered or dead.
	state            TEXT    NOT NULL DEFAULT 'pending' CHECK (state IN ('pending', 'delivered', 'dead')),
	next_at          INTEGER NOT NULL,
	leased_by        TEXT,
	lease_until      INTEGER,
	attempts         INTEGER NOT NULL DEFAULT 0,
	-- The key retention runs from the first attempt.
	first_attempt_at INTEGER,
	last_status      INTEGER,
	last_body        BLOB,
	last_at          INTEGER,
	reason           TEXT,
	done_at          INTEGER,
	UNIQUE (scope, message_id, endpoint)
);

-- The dispatcher's queue per endpoint: pending rows by due time.
CREATE INDEX deliveries_due ON deliveries (endpoint, next_at) WHERE state = 'pending';
-- Operators list the dead ones.
CREATE INDEX deliveries_dead ON deliveries (endpoint, id) WHERE state = 'dead';
-- The backlog: the oldest pending row.
CREATE INDEX deliveries_pending_created ON deliveries (created_at) WHERE state = 'pending';
