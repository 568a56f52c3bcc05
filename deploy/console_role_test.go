package deploy_test

import (
	"fmt"
	"path/filepath"
	"testing"
)

// TestConsoleRoles runs postgres/console.sql on a real, throwaway
// PostgreSQL after roles.sql, the migrations and grants.sql, and checks
// that the console's reads run as jetinbox_verifier (the statements of its
// overview and intent pages, the HTTP key's columns included, never a
// stored answer's body), and that its re-drive role jetinbox_console can
// release a rejected inbox row as `jetinbox dlq -redrive` does and nothing
// else: no write to the ledger, the outbox, the keys or the conflict log,
// no insert or update of the inbox.
func TestConsoleRoles(t *testing.T) {
	t.Parallel()
	fx := fixture(t)
	pg := startPostgres(t, fx)
	pg.superuser(t, "postgres", "CREATE DATABASE jetinbox")
	pg.superuserFile(t, "jetinbox", "postgres/roles.sql")
	pg.superuser(t, "jetinbox", "ALTER ROLE jetinbox_migrator PASSWORD 'migrator-pw'; ALTER ROLE jetinbox_verifier PASSWORD 'verifier-pw'")
	migrator := pg.as("jetinbox_migrator", "migrator-pw")
	migrator.must(t, `CREATE TABLE IF NOT EXISTS jetinbox_migrations (component text NOT NULL, version integer NOT NULL, name text NOT NULL, applied_at timestamptz NOT NULL DEFAULT now(), PRIMARY KEY (component, version))`)
	for _, dir := range []string{"../inbox/pginbox/migrations", "../internal/effects/migrations", "../outbox/pgoutbox/migrations", "../idempotency/pgidempotency/migrations"} {
		m, _ := filepath.Glob(filepath.Join(dir, "*.sql"))
		if len(m) == 0 {
			t.Fatalf("no migrations in %s", dir)
		}
		for _, f := range m {
			migrator.mustFile(t, f)
		}
	}
	migrator.mustFile(t, "postgres/grants.sql")
	pg.superuserFile(t, "jetinbox", "postgres/console.sql")
	pg.superuserFile(t, "jetinbox", "postgres/console.sql") // idempotent
	pg.superuser(t, "jetinbox", "ALTER ROLE jetinbox_console PASSWORD 'console-pw'")
	migrator.must(t, `INSERT INTO inbox (scope, message_id, fingerprint, stream_seq, subject) VALUES ('ledger', 'ok', '\x01', 1, 'intents.1'), ('ledger', 'bad', '\x01', 2, 'intents.1')`)
	migrator.must(t, `UPDATE inbox SET status = 'rejected', reason = 'unknown account' WHERE message_id = 'bad'`)
	migrator.must(t, `INSERT INTO idempotency_keys (scope_hash, principal, method, route, key, fingerprint, status, body) VALUES ('\x01', 'acme', 'POST', '/v1/intents', 'order-1', 'x', 202, 'secret answer')`)

	// The console's reads (console/timeline.go, console/overview.go) as
	// the verifier.
	verifier := pg.as("jetinbox_verifier", "verifier-pw")
	for _, q := range []string{
		`SELECT principal, method, route, key, status, created_at FROM idempotency_keys WHERE key = 'order-1' LIMIT 20`,
		`SELECT principal, method, route, key, status, created_at FROM idempotency_keys WHERE scope_hash >= '\x00' AND scope_hash <= '\xff' LIMIT 20`,
		`SELECT subject, created_at, sent_at, coalesce(failed, '') FROM outbox WHERE id = 'ok'`,
		`SELECT status, coalesce(reason, ''), stream_seq, subject, received_at FROM inbox WHERE scope = 'ledger' AND message_id = 'ok'`,
		`SELECT stream_seq, subject, seen_at FROM inbox_conflicts WHERE scope = 'ledger' AND message_id = 'ok' ORDER BY stream_seq LIMIT 50`,
		`SELECT account, amount, created_at FROM ledger_entries WHERE scope = 'ledger' AND message_id = 'ok' LIMIT 50`,
		`SELECT id, subject, created_at, sent_at, coalesce(failed, '') FROM outbox WHERE parent_id = 'ok' LIMIT 20`,
		`SELECT status, count(*) FROM inbox WHERE scope = 'ledger' GROUP BY status ORDER BY status`,
	} {
		verifier.must(t, q)
	}
	denied := []string{"permission denied"}
	for _, q := range []string{
		`SELECT body FROM idempotency_keys`,
		`SELECT header FROM idempotency_keys`,
		`DELETE FROM idempotency_keys`,
	} {
		verifier.mustFail(t, q, append(denied, "read-only transaction")...)
	}

	// The re-drive: the statement of `jetinbox dlq -redrive` (cli.Store's
	// ReleaseRejected), for a rejected row and an applied one.
	console := pg.as("jetinbox_console", "console-pw")
	release := `WITH del AS (DELETE FROM inbox WHERE scope = 'ledger' AND message_id = '%s' AND status = 'rejected' RETURNING status) SELECT coalesce((SELECT status FROM del), (SELECT status FROM inbox WHERE scope = 'ledger' AND message_id = '%s'), '')`
	if got := console.must(t, fmt.Sprintf(release, "bad", "bad")); got != "rejected" {
		t.Errorf("re-drive of a rejected row: %q, want rejected", got)
	}
	if got := console.must(t, fmt.Sprintf(release, "ok", "ok")); got != "applied" {
		t.Errorf("re-drive of an applied row: %q, want applied (kept)", got)
	}
	for _, q := range []string{
		`INSERT INTO inbox (scope, message_id, fingerprint) VALUES ('ledger', 'x', '\x01')`,
		`UPDATE inbox SET status = 'rejected'`,
		`TRUNCATE inbox`,
		`SELECT count(*) FROM ledger_entries`,
		`INSERT INTO ledger_entries (scope, message_id, account, amount) VALUES ('ledger', 'x', 1, 1)`,
		`UPDATE accounts SET balance = 0`,
		`SELECT count(*) FROM outbox`,
		`INSERT INTO outbox (id, subject, payload, fingerprint) VALUES ('x', 'intents.1', '\x01', '\x01')`,
		`DELETE FROM outbox`,
		`SELECT count(*) FROM idempotency_keys`,
		`DELETE FROM idempotency_keys`,
		`DELETE FROM inbox_conflicts`,
		`SELECT inbox_release('ledger', ARRAY['ok'])`,
		`CREATE TABLE evil (id int)`,
		`CREATE TEMP TABLE evil (id int)`,
	} {
		console.mustFail(t, q, append(denied, "must be owner")...)
	}
}
