-- jetinbox roles on a shard's database, after grants.sql: a shard is a
-- database like any other (roles.sql, `jetinbox migrate -shards FILE -shard
-- NAME`, grants.sql), plus the partition table that fences a move. Run as
-- jetinbox_migrator after that migrate:
--
--   psql "postgres://jetinbox_migrator@shard-a:5432/jetinbox?sslmode=verify-full" \
--        -v ON_ERROR_STOP=1 -f deploy/postgres/shard-grants.sql
--
-- Idempotent. `jetinbox partitions move` runs as jetinbox_migrator, the
-- owner of the tables: it alone gives partitions away and takes them, and
-- copies inbox rows with their original times.

BEGIN;
SET LOCAL search_path = jetinbox;

REVOKE ALL ON TABLE jetinbox_partitions FROM jetinbox_consumer, jetinbox_relay, jetinbox_verifier, jetinbox_maintainer;

-- The consumer reads which partitions its shard owns and, in every batch,
-- locks their rows FOR SHARE (which needs UPDATE on some column: changed_at,
-- which no statement of the consumer writes). It cannot take or give away a
-- partition: owned stays the migrator's.
GRANT SELECT (scope, partition, owned) ON TABLE jetinbox_partitions TO jetinbox_consumer;
GRANT UPDATE (changed_at) ON TABLE jetinbox_partitions TO jetinbox_consumer;

-- The consumer reads no moved_to (the target a move recorded) and cannot
-- call jetinbox_partition_of (the move's copy filter; grants.sql revokes
-- functions from PUBLIC): both are the migrator's, for the move.

-- verify and partitions list read it.
GRANT SELECT ON TABLE jetinbox_partitions TO jetinbox_verifier;

COMMIT;
