-- Which partitions of the sharded stream this shard's database applies, per
-- inbox scope. It is the fence of a partition move: every batch reads its
-- partitions' rows FOR SHARE in its own transaction, so the move's UPDATE
-- that takes a partition away waits for the batches applying it, and no
-- batch applies it once that UPDATE committed. The map file says where
-- partitions start; this table says where they are.
CREATE TABLE jetinbox_partitions (
	scope      text    NOT NULL,
	partition  integer NOT NULL CHECK (partition >= 0),
	owned      boolean NOT NULL,
	changed_at timestamptz NOT NULL DEFAULT now(),
	PRIMARY KEY (scope, partition)
);
