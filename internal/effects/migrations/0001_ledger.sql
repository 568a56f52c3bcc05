-- The demo effect: a ledger. ledger_entries has NO unique constraint on
-- message_id on purpose: if the inbox ever let a duplicate through, a
-- verifier would see two entries for one message. A check that cannot fail
-- proves nothing.
CREATE TABLE accounts (
	id      bigint PRIMARY KEY,
	balance bigint NOT NULL DEFAULT 0
);

CREATE TABLE ledger_entries (
	message_id text        NOT NULL,
	account    bigint      NOT NULL,
	amount     bigint      NOT NULL,
	created_at timestamptz NOT NULL DEFAULT now()
);
