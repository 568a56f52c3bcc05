-- jetinbox verify reads the ledger entries of 10,000 message IDs at a time
-- (message_id = ANY(...)): without an index each such read scans the whole
-- ledger. Not unique, on purpose (see 0001_ledger.sql). On a large ledger,
-- build it by hand first without blocking writes,
--   CREATE INDEX CONCURRENTLY ledger_entries_scope_message_id ON ledger_entries (scope, message_id);
-- and this migration finds it there.
CREATE INDEX IF NOT EXISTS ledger_entries_scope_message_id ON ledger_entries (scope, message_id);
