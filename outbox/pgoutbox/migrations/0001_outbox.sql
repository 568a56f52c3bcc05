-- The outbox: messages to publish, written in the same transaction as the
-- effect (or the service's own row) they follow from. The relay publishes the
-- pending ones with Nats-Msg-Id = id and marks them sent.
CREATE TABLE outbox (
	seq         bigint      GENERATED ALWAYS AS IDENTITY,
	id          text        PRIMARY KEY,
	subject     text        NOT NULL,
	payload     bytea       NOT NULL,
	fingerprint bytea       NOT NULL,
	-- The message whose effect emitted this one, if any (for checks and
	-- operators).
	parent_id   text        NOT NULL DEFAULT '',
	created_at  timestamptz NOT NULL DEFAULT now(),
	-- NULL while pending; set by the relay once the stream acknowledged it.
	sent_at     timestamptz,
	-- Set instead when the stream refused it for good (an ID it holds with
	-- another payload, a subject another stream captures): the relay stops
	-- trying and an operator decides.
	failed      text
);

-- The relay's queue: pending rows in emit order. Sent and failed rows leave
-- the index.
CREATE INDEX outbox_pending ON outbox (seq) WHERE sent_at IS NULL AND failed IS NULL;

-- Retention deletes sent rows by age; rows arrive in time order.
CREATE INDEX outbox_created_at_brin ON outbox USING brin (created_at);

-- Wake the relays when rows arrive: one notification per statement, and
-- PostgreSQL folds identical notifications of a transaction into one,
-- delivered at COMMIT.
CREATE FUNCTION jetinbox_outbox_notify() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
	PERFORM pg_notify('jetinbox_outbox', '');
	RETURN NULL;
END
$$;
CREATE TRIGGER outbox_notify AFTER INSERT ON outbox FOR EACH STATEMENT EXECUTE FUNCTION jetinbox_outbox_notify();
