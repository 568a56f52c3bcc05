-- Releasing a claim by the transaction that made it, not by a time stamp.
-- inbox_release used to take "received_at is the caller's start time and
-- the row's writer is still in progress" as "the caller inserted it"; but
-- a role that may UPDATE status or reason becomes the writer of any row it
-- touches, and a session that began in the same microsecond as the claim
-- could then release a committed row, so that its redelivery was applied
-- twice.
--
-- claim_xid is the top-level transaction ID of the claim (also when the
-- claim ran under a savepoint). Only its default writes it: the claiming
-- role is granted INSERT and UPDATE on other columns only. Added without
-- a default, then given one, so that a big table is not rewritten: the
-- rows already there keep NULL, which no transaction's ID equals (they
-- are committed and never releasable).
ALTER TABLE inbox ADD COLUMN claim_xid xid8;
ALTER TABLE inbox ALTER COLUMN claim_xid SET DEFAULT pg_current_xact_id();

-- Removes the rows of release_ids in release_scope that the calling
-- transaction claimed, and returns how many. Runs with its owner's rights
-- (SECURITY DEFINER) so that the claiming role needs no DELETE on inbox.
-- A row whose claim_xid is the caller's own transaction ID was inserted by
-- that transaction, which is in progress: a committed row, the record that
-- a message was applied or rejected, never matches. A caller without a
-- transaction ID has written nothing and removes nothing.
CREATE OR REPLACE FUNCTION inbox_release(release_scope text, release_ids text[]) RETURNS bigint
LANGUAGE sql VOLATILE STRICT SECURITY DEFINER SET search_path FROM CURRENT
AS $$
WITH del AS (
	DELETE FROM inbox
	WHERE inbox.scope = release_scope AND inbox.message_id = ANY (release_ids)
	  AND inbox.claim_xid = pg_current_xact_id_if_assigned()
	RETURNING 1
)
SELECT count(*) FROM del
$$;

-- CREATE OR REPLACE keeps the function's privileges; said again so that
-- this file stands on its own.
REVOKE ALL ON FUNCTION inbox_release(text, text[]) FROM PUBLIC;
