-- A partition given away names the shard it was given to, in the statement
-- that fences it: a move resumed later must finish the move to that shard
-- and no other, and the target takes ownership only while the source's row,
-- locked, still names it. NULL on an owned row, and on a row fenced before
-- this column existed (its move names its target when resumed).
ALTER TABLE jetinbox_partitions ADD COLUMN moved_to text;

-- The partition of a message ID, as shard.PartitionOf computes it and the
-- stream's transform stores it: FNV-1a (32 bits) of the key token (the hex
-- of the first 8 bytes of the ID's SHA-256) modulo n. A move copies a
-- partition's inbox rows with it, so it filters in the database and reads
-- no other partition's rows.
CREATE FUNCTION jetinbox_partition_of(id text, n integer) RETURNS integer
LANGUAGE plpgsql IMMUTABLE STRICT PARALLEL SAFE AS $$
DECLARE
	k bytea := convert_to(encode(substring(sha256(convert_to(id, 'UTF8')) FROM 1 FOR 8), 'hex'), 'UTF8');
	h bigint := 2166136261;
BEGIN
	IF n <= 0 THEN
		RETURN 0;
	END IF;
	FOR i IN 0 .. length(k) - 1 LOOP
		h := ((h # get_byte(k, i)) * 16777619) & 4294967295;
	END LOOP;
	RETURN (h % n)::integer;
END
$$;
