-- With one durable per shard (a map's shard_durables), a partition given
-- away is handed to its next owner by a hand-off durable that starts at
-- handoff_from, the first stream sequence after the source's ack floor.
-- The source acks, without applying, the messages of the partition at or
-- after it that still reach it: the hand-off durable delivers them to the
-- owner. NULL where there is no hand-off (the partition owned, or moved
-- with one durable per partition); cleared when the partition is taken
-- again.
ALTER TABLE jetinbox_partitions ADD COLUMN handoff_from bigint;
