-- Releasing the claims of messages to retry. A batch claims every message,
-- runs the effects, and for a message whose effect failed for a passing
-- reason removes the row it inserted, in the same transaction, so that the
-- redelivery claims it afresh. This function does that removal, so that the
-- role that claims needs no DELETE on inbox: it runs with its owner's
-- rights (SECURITY DEFINER) and removes only rows the calling transaction
-- inserted itself and has not committed:
--
--   * received_at is the calling transaction's start time (the column's
--     default, now(): a role granted INSERT on the claim's columns only
--     cannot set it), and
--   * the row's inserting transaction is still in progress while it is
--     visible to the caller: only the caller's own transaction (or one of
--     its savepoints) is. Rows other transactions have not committed are
--     invisible; rows they committed are not in progress.
--
-- A committed row, the record that a message was applied or rejected, is
-- never removed here. It returns how many rows it removed: the caller
-- compares that with the claims it released.
CREATE FUNCTION inbox_release(release_scope text, release_ids text[]) RETURNS bigint
LANGUAGE sql VOLATILE STRICT SECURITY DEFINER SET search_path FROM CURRENT
AS $$
WITH me AS (
	-- The caller's top-level transaction ID; its savepoints' IDs follow it.
	SELECT pg_current_xact_id_if_assigned()::text::bigint AS top
), del AS (
	DELETE FROM inbox USING me
	WHERE inbox.scope = release_scope AND inbox.message_id = ANY (release_ids)
	  AND me.top IS NOT NULL
	  -- xmin is 32 bits: widen it by its distance after the top-level ID.
	  -- Asked only of rows stamped with the caller's start time, all
	  -- written after it had begun.
	  AND CASE WHEN inbox.received_at = now()
	      THEN pg_xact_status((me.top + (inbox.xmin::text::bigint - me.top % 4294967296 + 4294967296) % 4294967296)::text::xid8) = 'in progress'
	      ELSE false END
	RETURNING 1
)
SELECT count(*) FROM del
$$;

-- Nobody but the owner by default; deploy/postgres/grants.sql lets the
-- consumer role in.
REVOKE ALL ON FUNCTION inbox_release(text, text[]) FROM PUBLIC;
