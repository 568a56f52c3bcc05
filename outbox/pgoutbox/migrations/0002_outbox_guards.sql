-- What may happen to a row, whoever asks (any role, the owner too; only
-- ALTER TABLE ... DISABLE TRIGGER, which needs the owner, gets past it):
--
--   * sent_at, once set, never changes. A row set pending again is
--     published again, and once the stream's duplicate window has passed
--     the stream stores a second copy; a row stamped again lies about when
--     it went out.
--   * A pending row (neither sent nor failed) cannot be deleted: its
--     message would never be published. A sent row may go (retention), and
--     so may a failed one, once an operator has dealt with it.
--
-- failed stays free: clearing it gives a refused row another try, which
-- publishes nothing twice.
--
-- The WHEN conditions are checked without calling the function, so the
-- relay's marks and retention's deletes pay next to nothing for them.
CREATE FUNCTION jetinbox_outbox_guard() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
	IF TG_OP = 'UPDATE' THEN
		RAISE EXCEPTION 'outbox: row % was sent at %: sent_at never changes once set', OLD.id, OLD.sent_at
			USING ERRCODE = 'check_violation';
	END IF;
	RAISE EXCEPTION 'outbox: row % is pending: only a sent or failed row can be deleted', OLD.id
		USING ERRCODE = 'restrict_violation';
END
$$;

CREATE TRIGGER outbox_sent_stays BEFORE UPDATE ON outbox FOR EACH ROW
	WHEN (OLD.sent_at IS NOT NULL AND NEW.sent_at IS DISTINCT FROM OLD.sent_at)
	EXECUTE FUNCTION jetinbox_outbox_guard();

CREATE TRIGGER outbox_pending_stays BEFORE DELETE ON outbox FOR EACH ROW
	WHEN (OLD.sent_at IS NULL AND OLD.failed IS NULL)
	EXECUTE FUNCTION jetinbox_outbox_guard();
