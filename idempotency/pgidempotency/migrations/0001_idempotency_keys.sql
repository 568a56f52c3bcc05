-- The keys of an HTTP intake (package idempotency): one row per scoped
-- Idempotency-Key, claimed with INSERT ... ON CONFLICT DO NOTHING in the
-- transaction of the request's work and holding the answer that commits
-- with it. A row is never committed without its answer (status 0 exists
-- only inside the claiming transaction).
CREATE TABLE idempotency_keys (
	-- SHA-256 of (principal, method, route, key), each length-prefixed.
	scope_hash  bytea       PRIMARY KEY,
	principal   text        NOT NULL,
	method      text        NOT NULL,
	route       text        NOT NULL,
	key         text        NOT NULL CHECK (length(key) BETWEEN 1 AND 255),
	-- "part=hash" lines: method, route, body, the headers the route names.
	fingerprint text        NOT NULL,
	status      integer     NOT NULL DEFAULT 0,
	header      text        NOT NULL DEFAULT '',
	body        bytea       NOT NULL DEFAULT '',
	created_at  timestamptz NOT NULL DEFAULT now()
);

-- Retention deletes by age; rows arrive in time order.
CREATE INDEX idempotency_keys_created_at_brin ON idempotency_keys USING brin (created_at);
