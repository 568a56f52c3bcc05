-- The key, reordered to (message_id, scope) and compared byte by byte.
-- Every claim inserts one entry into the key's btree, whose descent
-- compares the new key with about a dozen others. Led by the scope, which
-- is the same for nearly every row, each comparison compared the scope
-- first, found it equal, and then compared the ID; led by the ID, the
-- first column decides. In a database whose default collation is not "C"
-- (en_US.UTF-8, C.UTF-8, ...) each of those comparisons also went through
-- the locale's collation rules; "C" compares bytes. Equal keys are the same
-- bytes under any deterministic collation, so what is a duplicate does not
-- change; only the key's order does, which no query depends on (the claims
-- sort their IDs by byte order themselves). A claim of 6,000 rows took
-- about an eighth less server CPU in a "C" database, a fifth to a third
-- less in an en_US.UTF-8 one.
--
-- This rebuilds the key, holding the inbox locked while it does. On a
-- large inbox build the new key by hand first, without blocking claims:
--   CREATE UNIQUE INDEX CONCURRENTLY inbox_key ON inbox (message_id COLLATE "C", scope COLLATE "C");
-- and this migration makes it the primary key instead of building one.
ALTER TABLE inbox DROP CONSTRAINT inbox_pkey,
	ALTER COLUMN scope TYPE text COLLATE "C",
	ALTER COLUMN message_id TYPE text COLLATE "C";
DO $$
BEGIN
	IF EXISTS (SELECT 1 FROM pg_index i JOIN pg_class c ON c.oid = i.indexrelid
	           WHERE i.indrelid = 'inbox'::regclass AND c.relname = 'inbox_key') THEN
		ALTER TABLE inbox ADD CONSTRAINT inbox_pkey PRIMARY KEY USING INDEX inbox_key;
	ELSE
		ALTER TABLE inbox ADD CONSTRAINT inbox_pkey PRIMARY KEY (message_id, scope);
	END IF;
END
$$;
