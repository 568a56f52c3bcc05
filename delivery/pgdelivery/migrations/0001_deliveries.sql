-- Deliveries: calls to other services decided by an effect, written in the
-- effect's inbox transaction. A dispatcher (jetinbox deliver) leases the due
-- ones, POSTs each with its idempotency key, records the outcome and marks
-- the row delivered or dead, or schedules the next attempt under the same key.
CREATE TABLE deliveries (
	id               bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
	scope            text        NOT NULL,
	message_id       text        NOT NULL,
	endpoint         text        NOT NULL,
	-- Derived from (scope, message_id, endpoint): the same on every attempt.
	idem_key         text        NOT NULL,
	payload          bytea       NOT NULL,
	created_at       timestamptz NOT NULL DEFAULT now(),
	-- pending, delivered or dead.
	state            text        NOT NULL DEFAULT 'pending' CHECK (state IN ('pending', 'delivered', 'dead')),
	next_at          timestamptz NOT NULL DEFAULT now(),
	leased_by        text,
	lease_until      timestamptz,
	attempts         integer     NOT NULL DEFAULT 0,
	-- The key retention runs from the first attempt.
	first_attempt_at timestamptz,
	last_status      integer,
	last_body        bytea,
	last_at          timestamptz,
	reason           text,
	done_at          timestamptz,
	UNIQUE (scope, message_id, endpoint)
);

-- The dispatcher's queue per endpoint: pending rows by due time.
CREATE INDEX deliveries_due ON deliveries (endpoint, next_at) WHERE state = 'pending';
-- Operators list the dead ones.
CREATE INDEX deliveries_dead ON deliveries (endpoint, id) WHERE state = 'dead';
