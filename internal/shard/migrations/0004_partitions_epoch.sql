-- How many times the partition changed hands before this shard took it:
-- a shard that takes it from a source records the source's epoch plus one,
-- and only over a row of its own with a lower epoch. A move run again long
-- after it finished (the partition taken, then moved on from its target)
-- carries the source's old epoch, finds the target's row newer and is
-- refused, instead of making the target an owner beside the one that has
-- the partition now. Rows recorded by migrate start at 0.
ALTER TABLE jetinbox_partitions ADD COLUMN epoch bigint NOT NULL DEFAULT 0;
