-- Every ledger entry names the inbox scope that applied it: the scope is the
-- identity of the effect, and (scope, message ID) is what must be applied at
-- most once. Entries written before this migration were all applied under the
-- default scope, 'ledger'; the default stays for writers that predate the
-- column, while the ledger itself always writes its scope explicitly. Adding
-- a column with a constant default rewrites nothing.
ALTER TABLE ledger_entries ADD COLUMN scope text NOT NULL DEFAULT 'ledger';
