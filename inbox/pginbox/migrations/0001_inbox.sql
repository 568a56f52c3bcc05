-- The inbox: one row per (scope, message ID) ever claimed. The primary key is
-- the dedupe; the row commits in the same transaction as the message's effect.
CREATE TABLE inbox (
	scope       text        NOT NULL,
	message_id  text        NOT NULL,
	fingerprint bytea       NOT NULL,
	status      text        NOT NULL DEFAULT 'applied' CHECK (status IN ('applied', 'rejected')),
	reason      text,
	stream_seq  bigint      NOT NULL DEFAULT 0,
	subject     text        NOT NULL DEFAULT '',
	received_at timestamptz NOT NULL DEFAULT now(),
	PRIMARY KEY (scope, message_id)
);

-- Retention deletes by age; rows arrive in time order, so a BRIN index is
-- nearly free on insert.
CREATE INDEX inbox_received_at_brin ON inbox USING brin (received_at);

-- The same ID arriving with a different payload: never applied, kept here
-- for the operator and dead-lettered by the transport.
CREATE TABLE inbox_conflicts (
	id          bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
	scope       text        NOT NULL,
	message_id  text        NOT NULL,
	fingerprint bytea       NOT NULL,
	stream_seq  bigint      NOT NULL DEFAULT 0,
	subject     text        NOT NULL DEFAULT '',
	seen_at     timestamptz NOT NULL DEFAULT now()
);
-- One row per conflicting stream message, however often it is redelivered.
CREATE UNIQUE INDEX inbox_conflicts_message ON inbox_conflicts (scope, message_id, stream_seq);
