package deploy_test

import (
	"bytes"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
)

var errNoPostgres = errors.New("PostgreSQL server binaries (initdb, postgres, pg_ctl) not found on PATH or under /usr/lib/postgresql/*/bin; install them with `apt-get install -y postgresql` (Debian) or set JETINBOX_PG_BIN")

// findPostgresBin returns the directory holding the PostgreSQL server
// binaries, preferring JETINBOX_PG_BIN, then PATH, then the newest
// /usr/lib/postgresql/N/bin.
func findPostgresBin() (string, error) {
	if d := os.Getenv("JETINBOX_PG_BIN"); d != "" {
		return d, nil
	}
	if p, err := exec.LookPath("postgres"); err == nil {
		if r, err := filepath.EvalSymlinks(p); err == nil {
			p = r
		}
		return filepath.Dir(p), nil
	}
	matches, _ := filepath.Glob("/usr/lib/postgresql/*/bin/postgres")
	best, bestV := "", -1
	for _, m := range matches {
		v, _ := strconv.Atoi(strings.Split(strings.TrimPrefix(m, "/usr/lib/postgresql/"), "/")[0])
		if v > bestV {
			best, bestV = filepath.Dir(m), v
		}
	}
	if best == "" {
		return "", errNoPostgres
	}
	return best, nil
}

// TestPostgresRolesAndSettings runs deploy/postgres on a real, throwaway
// PostgreSQL: postgresql.conf.snippet included (TLS on, with the dev
// certificates), pg_hba.conf, roles.sql as the superuser, jetinbox's own
// migrations as jetinbox_migrator, grants.sql, and then checks over
// sslmode=verify-full that each role can do its work and nothing more:
// the consumer appends and claims but cannot delete or rewrite history,
// the verifier only reads, the maintainer only deletes inbox rows; and
// that a connection without TLS is refused.
func TestPostgresRolesAndSettings(t *testing.T) {
	t.Parallel()
	fx := fixture(t)
	pg := startPostgres(t, fx)

	pg.superuser(t, "postgres", "CREATE DATABASE jetinbox")
	pg.superuserFile(t, "jetinbox", "postgres/roles.sql")
	// roles.sql is idempotent: an upgrade runs it again to add roles.
	pg.superuserFile(t, "jetinbox", "postgres/roles.sql")
	pg.superuser(t, "jetinbox", "ALTER ROLE jetinbox_migrator PASSWORD 'migrator-pw'; ALTER ROLE jetinbox_consumer PASSWORD 'consumer-pw'; "+
		"ALTER ROLE jetinbox_verifier PASSWORD 'verifier-pw'; ALTER ROLE jetinbox_maintainer PASSWORD 'maintainer-pw'; ALTER ROLE jetinbox_relay PASSWORD 'relay-pw'")

	migrator := pg.as("jetinbox_migrator", "migrator-pw")
	consumer := pg.as("jetinbox_consumer", "consumer-pw")
	verifier := pg.as("jetinbox_verifier", "verifier-pw")
	maintainer := pg.as("jetinbox_maintainer", "maintainer-pw")
	relay := pg.as("jetinbox_relay", "relay-pw")

	// What `jetinbox migrate` does: its bookkeeping table, then each
	// component's SQL files, as the schema owner.
	migrator.must(t, `CREATE TABLE IF NOT EXISTS jetinbox_migrations (component text NOT NULL, version integer NOT NULL, name text NOT NULL, applied_at timestamptz NOT NULL DEFAULT now(), PRIMARY KEY (component, version))`)
	var migrations []string
	for _, dir := range []string{"../inbox/pginbox/migrations", "../internal/effects/migrations", "../outbox/pgoutbox/migrations"} {
		m, _ := filepath.Glob(filepath.Join(dir, "*.sql"))
		if len(m) == 0 {
			t.Fatalf("no migrations in %s: has the schema moved? deploy/postgres/grants.sql must follow it", dir)
		}
		migrations = append(migrations, m...)
	}
	for _, m := range migrations {
		migrator.mustFile(t, m)
	}
	migrator.mustFile(t, "postgres/grants.sql")
	// grants.sql is idempotent: it runs after every migrate.
	migrator.mustFile(t, "postgres/grants.sql")
	// `jetinbox accounts -open` runs as the migrator.
	migrator.must(t, `INSERT INTO accounts (id) VALUES (1), (2) ON CONFLICT DO NOTHING`)
	migrator.must(t, `INSERT INTO inbox (scope, message_id, fingerprint, received_at) VALUES ('ledger', 'old', '\x01', now() - interval '60 days'), ('ledger', 'rejected', '\x01', now())`)
	migrator.must(t, `UPDATE inbox SET status = 'rejected' WHERE message_id = 'rejected'`)

	// The consumer's work, the statements inbox, effects and jsinbox run:
	// claim, read what was there, record a rejection and a conflict, give
	// back the claim of a message to retry, apply the ledger effect.
	for _, q := range []string{
		`INSERT INTO inbox (scope, message_id, fingerprint, stream_seq, subject) SELECT 'ledger', t.id, '\x01', 1, 'intents.x' FROM unnest(ARRAY['m1']) AS t(id) ON CONFLICT (scope, message_id) DO NOTHING RETURNING message_id`,
		`SELECT message_id, fingerprint, status, coalesce(reason, ''), stream_seq FROM inbox WHERE scope = 'ledger' AND message_id = ANY(ARRAY['m1'])`,
		`UPDATE inbox SET status = 'rejected', reason = t.reason FROM unnest(ARRAY['m1'], ARRAY['test']) AS t(id, reason) WHERE inbox.scope = 'ledger' AND inbox.message_id = t.id`,
		`INSERT INTO inbox_conflicts (scope, message_id, fingerprint, stream_seq, subject) SELECT 'ledger', 'm1', '\x02', 3, 'intents.x' ON CONFLICT (scope, message_id, stream_seq) DO NOTHING`,
		`WITH upd AS (UPDATE accounts a SET balance = a.balance + u.total FROM unnest(ARRAY[1::bigint], ARRAY[5::bigint]) AS u(id, total) WHERE a.id = u.id) SELECT u.id FROM unnest(ARRAY[1::bigint]) AS u(id) WHERE NOT EXISTS (SELECT 1 FROM accounts a WHERE a.id = u.id)`,
		`INSERT INTO ledger_entries (scope, message_id, account, amount) VALUES ('ledger', 'm1', 1, 5)`,
		`SELECT coalesce(max(version), 0) FROM jetinbox_migrations WHERE component = 'inbox'`,
		// The outbox: follow-ups added in the inbox transaction (the
		// trigger notifies the relays as the consumer), a repeat read back.
		`INSERT INTO outbox (id, subject, payload, fingerprint, parent_id) SELECT * FROM unnest(ARRAY['notify:m1'], ARRAY['notifications.1'], ARRAY['\x01'::bytea], ARRAY['\x02'::bytea], ARRAY['m1']) ON CONFLICT (id) DO NOTHING RETURNING id`,
		`SELECT id, subject, fingerprint FROM outbox WHERE id = ANY(ARRAY['notify:m1'])`,
		`SELECT coalesce(max(version), 0) FROM jetinbox_migrations WHERE component = 'outbox'`,
	} {
		consumer.must(t, q)
	}
	if got := consumer.must(t, `BEGIN; INSERT INTO inbox (scope, message_id, fingerprint) VALUES ('ledger', 'retry', '\x01'); SELECT inbox_release('ledger', ARRAY['retry']); COMMIT`); got != "1" {
		t.Errorf("consumer: inbox_release of its own claim removed %q rows, want 1", got)
	}
	// inbox_release removes nothing committed: not the applied, the
	// rejected or the old row, whoever asks.
	if got := consumer.must(t, `SELECT inbox_release('ledger', ARRAY['m1', 'old', 'rejected', 'retry'])`); got != "0" {
		t.Errorf("consumer: inbox_release of committed rows removed %q rows, want 0", got)
	}
	denied := []string{"permission denied", "must be owner"}
	// ... and nothing else: no history rewritten, nothing deleted.
	for _, q := range []string{
		`UPDATE ledger_entries SET amount = 0`,
		`DELETE FROM ledger_entries`,
		`TRUNCATE ledger_entries`,
		`INSERT INTO ledger_entries (scope, message_id, account, amount, created_at) VALUES ('ledger', 'm2', 1, 5, now() - interval '1 year')`,
		`DELETE FROM inbox`,
		`DELETE FROM inbox WHERE received_at < now() - interval '30 days'`,
		`UPDATE inbox SET received_at = now()`,
		`UPDATE inbox SET message_id = 'other' WHERE message_id = 'm1'`,
		`UPDATE inbox SET fingerprint = '\x02'`,
		// Only the claim's own default writes claim_xid, which is what
		// inbox_release goes by.
		`UPDATE inbox SET claim_xid = NULL`,
		`INSERT INTO inbox (scope, message_id, fingerprint, claim_xid) VALUES ('ledger', 'm4', '\x01', pg_current_xact_id())`,
		`DELETE FROM outbox`,
		`UPDATE outbox SET payload = '\x03'`,
		// Marking rows sent is the relay's job: a consumer cannot drop a
		// follow-up by marking it.
		`UPDATE outbox SET sent_at = now()`,
		`BEGIN; SELECT id FROM outbox WHERE sent_at IS NULL FOR UPDATE SKIP LOCKED; COMMIT`,
		`INSERT INTO outbox (id, subject, payload, fingerprint, created_at) VALUES ('o2', 'notifications.1', '', '\x01', now() - interval '1 year')`,
		`INSERT INTO inbox (scope, message_id, fingerprint, received_at) VALUES ('ledger', 'm3', '\x01', now())`,
		`DELETE FROM accounts`,
		`INSERT INTO accounts (id) VALUES (3)`,
		`UPDATE accounts SET id = 4 WHERE id = 1`,
		`UPDATE inbox_conflicts SET fingerprint = '\x03'`,
		`DELETE FROM inbox_conflicts`,
		`CREATE TABLE evil (id int)`,
		`CREATE TABLE public.evil (id int)`,
		`CREATE TEMP TABLE evil (id int)`,
		`DROP TABLE inbox`,
		`TRUNCATE inbox`,
		`ALTER TABLE inbox ADD COLUMN evil int`,
		`DROP FUNCTION inbox_release(text, text[])`,
		`DELETE FROM jetinbox_migrations`,
		`INSERT INTO jetinbox_migrations (component, version, name) VALUES ('x', 1, 'x')`,
		`CREATE SCHEMA evil`,
	} {
		consumer.mustFail(t, q, denied...)
	}
	// Nor by making itself the writer of a committed row (UPDATE of
	// reason) and releasing it in the same transaction. (The same with
	// the transaction started in the microsecond of the claim, which needs
	// a second session in between, is staged in inbox's
	// TestReleaseRefusesRowsOthersClaimed.)
	if got := consumer.must(t, `BEGIN; UPDATE inbox SET reason = reason WHERE message_id = 'm1'; SELECT inbox_release('ledger', ARRAY['m1']); COMMIT`); got != "0" {
		t.Errorf("consumer: inbox_release of a committed row it rewrote removed %q rows, want 0", got)
	}
	if got := migrator.must(t, `SELECT count(*) FROM inbox WHERE message_id IN ('m1', 'old', 'rejected')`); got != "3" {
		t.Errorf("%s of the 3 committed inbox rows are left after the consumer's attempts", got)
	}

	// The relay: the statements of outbox.Relay's round and its metrics,
	// and nothing else.
	for _, q := range []string{
		`SELECT coalesce(max(version), 0) FROM jetinbox_migrations WHERE component = 'outbox'`,
		`BEGIN; SELECT id, subject, payload FROM outbox WHERE sent_at IS NULL AND failed IS NULL ORDER BY seq LIMIT 10 FOR UPDATE SKIP LOCKED; ` +
			`UPDATE outbox SET sent_at = clock_timestamp() WHERE id = ANY(ARRAY['notify:m1']) RETURNING extract(epoch FROM sent_at - created_at)::float8; COMMIT`,
		`UPDATE outbox SET failed = f.reason FROM unnest(ARRAY['none'], ARRAY['x']) AS f(id, reason) WHERE outbox.id = f.id`,
		`SELECT count(*), coalesce(extract(epoch FROM now() - min(created_at)), 0) FROM outbox WHERE sent_at IS NULL AND failed IS NULL`,
		`LISTEN jetinbox_outbox`,
	} {
		relay.must(t, q)
	}
	// A sent row stays sent: set pending again, it would be published again
	// once the stream's duplicate window has passed.
	for _, q := range []string{
		`UPDATE outbox SET sent_at = NULL WHERE id = 'notify:m1'`,
		`UPDATE outbox SET sent_at = now() - interval '1 day' WHERE id = 'notify:m1'`,
		`BEGIN; SELECT id FROM outbox FOR UPDATE SKIP LOCKED; UPDATE outbox SET sent_at = NULL; COMMIT`,
	} {
		relay.mustFail(t, q, "sent_at never changes once set")
	}
	for _, q := range []string{
		`INSERT INTO outbox (id, subject, payload, fingerprint) VALUES ('forged', 'notifications.1', '', '\x01')`,
		`UPDATE outbox SET payload = '\x03'`,
		`UPDATE outbox SET subject = 'intents.1'`,
		`UPDATE outbox SET id = 'other'`,
		`DELETE FROM outbox`,
		`TRUNCATE outbox`,
		`SELECT count(*) FROM inbox`,
		`INSERT INTO inbox (scope, message_id, fingerprint) VALUES ('ledger', 'r', '\x01')`,
		`SELECT count(*) FROM ledger_entries`,
		`UPDATE accounts SET balance = 0`,
		`SELECT inbox_release('ledger', ARRAY['m1'])`,
		`DELETE FROM jetinbox_migrations`,
		`CREATE TABLE evil (id int)`,
		`CREATE TEMP TABLE evil (id int)`,
	} {
		relay.mustFail(t, q, denied...)
	}

	// The verifier reads what verify reads, and writes nothing.
	for _, q := range []string{
		`SELECT count(*) FROM inbox, inbox_conflicts, accounts, ledger_entries`,
		`SELECT count(*) FROM jetinbox_migrations`,
		`SELECT id FROM outbox WHERE sent_at IS NULL AND failed IS NULL`,
	} {
		verifier.must(t, q)
	}
	for _, q := range []string{
		`INSERT INTO inbox (scope, message_id, fingerprint) VALUES ('ledger', 'v', '\x01')`,
		`UPDATE inbox SET status = 'applied'`,
		`DELETE FROM inbox`,
		`INSERT INTO inbox_conflicts (scope, message_id, fingerprint) VALUES ('ledger', 'v', '\x01')`,
		`DELETE FROM inbox_conflicts`,
		`INSERT INTO ledger_entries (scope, message_id, account, amount) VALUES ('ledger', 'v', 1, 1)`,
		`UPDATE ledger_entries SET amount = 0`,
		`DELETE FROM ledger_entries`,
		`UPDATE accounts SET balance = 0`,
		`INSERT INTO accounts (id) VALUES (9)`,
		`DELETE FROM accounts`,
		`TRUNCATE inbox`,
		`SELECT inbox_release('ledger', ARRAY['m1'])`,
		`UPDATE outbox SET sent_at = now()`,
		`DELETE FROM outbox`,
		`DELETE FROM jetinbox_migrations`,
		`CREATE TEMP TABLE evil (id int)`,
		`CREATE TABLE evil (id int)`,
		// Even with read-only turned off, the grants refuse.
		`SET default_transaction_read_only = off; DELETE FROM inbox`,
		`BEGIN READ WRITE; INSERT INTO ledger_entries (scope, message_id, account, amount) VALUES ('ledger', 'v', 1, 1); COMMIT`,
	} {
		verifier.mustFail(t, q, append(denied, "read-only transaction")...)
	}
	if got := verifier.must(t, "SHOW default_transaction_read_only"); got != "on" {
		t.Errorf("verifier default_transaction_read_only = %q, want on", got)
	}

	// A pending follow-up and one the stream refused for good.
	consumer.must(t, `INSERT INTO outbox (id, subject, payload, fingerprint, parent_id) VALUES ('notify:pending', 'notifications.1', '\x01', '\x02', 'm1'), ('notify:refused', 'notifications.1', '\x01', '\x02', 'm1')`)
	relay.must(t, `UPDATE outbox SET failed = 'refused' WHERE id = 'notify:refused'`)
	// The maintainer: retention (the inbox store's Prune statements) and a dead
	// letter's re-drive (jetinbox dlq -redrive), nothing else.
	for _, q := range []string{
		`DELETE FROM inbox WHERE ctid = ANY (ARRAY (SELECT ctid FROM inbox WHERE received_at < now() - interval '30 days' AND ('' = '' OR scope = '') LIMIT 10000))`,
		`WITH del AS (DELETE FROM inbox WHERE scope = 'ledger' AND message_id = 'rejected' AND status = 'rejected' RETURNING status) SELECT coalesce((SELECT status FROM del), (SELECT status FROM inbox WHERE scope = 'ledger' AND message_id = 'rejected'), '')`,
		// the outbox store's Prune statement (prune -outbox).
		`DELETE FROM outbox WHERE ctid = ANY (ARRAY (SELECT ctid FROM outbox WHERE created_at < now() - interval '30 days' AND sent_at IS NOT NULL LIMIT 10000))`,
	} {
		maintainer.must(t, q)
	}
	// A pending outbox row cannot be deleted: its notification would never
	// go out. A failed one can, once an operator has dealt with it.
	for _, q := range []string{
		`DELETE FROM outbox WHERE id = 'notify:pending'`,
		`DELETE FROM outbox`,
		`DELETE FROM outbox WHERE sent_at IS NULL`,
	} {
		maintainer.mustFail(t, q, "only a sent or failed row can be deleted")
	}
	maintainer.must(t, `DELETE FROM outbox WHERE id = 'notify:refused'`)
	if got := migrator.must(t, `SELECT string_agg(id, ',' ORDER BY id) FROM outbox`); got != "notify:m1,notify:pending" {
		t.Errorf("outbox after the maintainer's attempts: %q, want notify:m1 (sent, young) and notify:pending", got)
	}
	if got := migrator.must(t, `SELECT string_agg(message_id, ',' ORDER BY message_id) FROM inbox`); got != "m1" {
		t.Errorf("inbox after retention and a re-drive: %q, want only m1 left", got)
	}
	for _, q := range []string{
		`INSERT INTO inbox (scope, message_id, fingerprint) VALUES ('ledger', 'x', '\x01')`,
		`UPDATE inbox SET status = 'applied'`,
		`TRUNCATE inbox`,
		`SELECT count(*) FROM ledger_entries`,
		`DELETE FROM ledger_entries`,
		`UPDATE accounts SET balance = 0`,
		`DELETE FROM accounts`,
		`DELETE FROM inbox_conflicts`,
		`SELECT inbox_release('ledger', ARRAY['m1'])`,
		`CREATE TABLE evil (id int)`,
		`DROP TABLE inbox`,
	} {
		maintainer.mustFail(t, q, denied...)
	}

	// Per-role settings from roles.sql.
	for setting, want := range map[string]string{"search_path": "jetinbox", "lock_timeout": "5s", "statement_timeout": "20s", "idle_in_transaction_session_timeout": "30s"} {
		if got := consumer.must(t, "SHOW "+setting); got != want {
			t.Errorf("consumer %s = %q, want %q", setting, got, want)
		}
	}
	// Server-wide settings from the snippet are in force.
	for setting, want := range map[string]string{"fsync": "on", "synchronous_commit": "on", "ssl": "on", "password_encryption": "scram-sha-256"} {
		if got := migrator.must(t, "SHOW "+setting); got != want {
			t.Errorf("%s = %q, want %q", setting, got, want)
		}
	}
	// pg_hba.conf: TLS or nothing.
	plain := pg.as("jetinbox_consumer", "consumer-pw")
	plain.sslmode = "disable"
	plain.mustFail(t, "SELECT 1", "no pg_hba.conf entry", "rejects connection", "reject")
}

type postgresServer struct {
	bin, psql string
	root      string // owned by the server's user
	sockDir   string
	port      int
	cred      *syscall.Credential
	ca        string
}

func startPostgres(t *testing.T, fx *secretsFixture) *postgresServer {
	t.Helper()
	bin, err := findPostgresBin()
	if err != nil {
		t.Fatal(err)
	}
	p := &postgresServer{bin: bin, psql: filepath.Join(bin, "psql")}
	if _, err := os.Stat(p.psql); err != nil {
		if p.psql, err = exec.LookPath("psql"); err != nil {
			t.Fatal("psql not found: ", errNoPostgres)
		}
	}
	uid, gid := os.Getuid(), os.Getgid()
	if os.Geteuid() == 0 {
		// initdb and postgres refuse to run as root.
		u, err := user.Lookup("postgres")
		if err != nil {
			t.Fatalf("running as root needs a postgres user to run the server: %v", err)
		}
		uid, _ = strconv.Atoi(u.Uid)
		gid, _ = strconv.Atoi(u.Gid)
		p.cred = &syscall.Credential{Uid: uint32(uid), Gid: uint32(gid)}
	}
	root, err := os.MkdirTemp("", "jetinbox-deploy-pg-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(root) })
	p.root, p.sockDir = root, root
	data := filepath.Join(root, "data")
	tlsDir := filepath.Join(root, "tls")

	// The server's TLS files, owned by the server's user, key 0600, at the
	// snippet's paths moved under root.
	if err := os.Mkdir(tlsDir, 0o700); err != nil {
		t.Fatal(err)
	}
	for src, dst := range map[string]string{"postgres.pem": "server.crt", "postgres-key.pem": "server.key", "ca.pem": "ca.crt"} {
		b, err := os.ReadFile(filepath.Join(fx.dir, "tls", src))
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(tlsDir, dst), b, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	p.ca = filepath.Join(fx.dir, "tls", "ca.pem")
	snippet, err := os.ReadFile("postgres/postgresql.conf.snippet")
	if err != nil {
		t.Fatal(err)
	}
	snippet = bytes.ReplaceAll(snippet, []byte("/etc/postgresql/tls/"), []byte(tlsDir+"/"))
	if err := os.WriteFile(filepath.Join(root, "jetinbox.conf"), snippet, 0o644); err != nil {
		t.Fatal(err)
	}
	hba, err := os.ReadFile("postgres/pg_hba.conf")
	if err != nil {
		t.Fatal(err)
	}
	if p.cred == nil {
		// Peer authentication maps the OS user to the role; without root
		// the OS user is not "postgres", so trust the socket instead.
		hba = regexp.MustCompile(`(?m)^(local\s+all\s+postgres\s+)peer`).ReplaceAll(hba, []byte("${1}trust"))
	}
	if err := filepath.WalkDir(root, func(path string, _ fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		return os.Lchown(path, uid, gid)
	}); err != nil {
		t.Fatal(err)
	}
	// The socket directory is the server user's alone: no other local user
	// reaches the socket, where the non-root run trusts the postgres role.
	_ = os.Chmod(root, 0o700)

	p.run(t, filepath.Join(bin, "initdb"), "-D", data, "-U", "postgres", "-A", "trust", "-E", "UTF8", "--locale=C", "--no-sync", "--no-instructions")
	if err := os.WriteFile(filepath.Join(data, "pg_hba.conf"), hba, 0o600); err != nil {
		t.Fatal(err)
	}
	conf := fmt.Sprintf("\nlisten_addresses = '127.0.0.1'\nunix_socket_directories = '%s'\ninclude '%s'\n",
		p.sockDir, filepath.Join(root, "jetinbox.conf"))
	if err := appendFile(filepath.Join(data, "postgresql.conf"), conf); err != nil {
		t.Fatal(err)
	}
	if p.cred != nil {
		_ = os.Lchown(filepath.Join(data, "pg_hba.conf"), uid, gid)
	}
	// The port is picked before the server binds it; another process may
	// take it in between, so try a few.
	for attempt := 1; ; attempt++ {
		p.port = freePorts(t, 1)[0]
		if err := appendFile(filepath.Join(data, "postgresql.conf"), fmt.Sprintf("port = %d\n", p.port)); err != nil {
			t.Fatal(err)
		}
		out, err := p.exec(filepath.Join(bin, "pg_ctl"), "-D", data, "-l", filepath.Join(root, "server.log"), "-w", "-t", "30", "start")
		if err == nil {
			break
		}
		log, _ := os.ReadFile(filepath.Join(root, "server.log"))
		if attempt == 3 || !bytes.Contains(log, []byte("could not bind")) {
			t.Fatalf("pg_ctl start: %v\n%s\n%s", err, out, log)
		}
	}
	t.Cleanup(func() {
		cmd := exec.Command(filepath.Join(bin, "pg_ctl"), "-D", data, "-m", "immediate", "-w", "stop")
		cmd.SysProcAttr = &syscall.SysProcAttr{Credential: p.cred}
		_ = cmd.Run()
	})
	return p
}

func appendFile(path, s string) error {
	f, err := os.OpenFile(path, os.O_APPEND|os.O_WRONLY, 0)
	if err != nil {
		return err
	}
	_, err = f.WriteString(s)
	return errors.Join(err, f.Close())
}

// exec runs a command as the server's user.
func (p *postgresServer) exec(name string, args ...string) ([]byte, error) {
	cmd := exec.Command(name, args...)
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: p.cred}
	cmd.Dir = p.root
	return cmd.CombinedOutput()
}

func (p *postgresServer) run(t *testing.T, name string, args ...string) {
	t.Helper()
	if out, err := p.exec(name, args...); err != nil {
		log, _ := os.ReadFile(filepath.Join(p.root, "server.log"))
		t.Fatalf("%s %v: %v\n%s\n%s", filepath.Base(name), args, err, out, log)
	}
}

// superuser runs SQL as postgres over the local socket.
func (p *postgresServer) superuser(t *testing.T, db, sql string) {
	t.Helper()
	p.run(t, p.psql, "-X", "-q", "-v", "ON_ERROR_STOP=1", "-h", p.sockDir, "-p", strconv.Itoa(p.port), "-U", "postgres", "-d", db, "-c", sql)
}

func (p *postgresServer) superuserFile(t *testing.T, db, file string) {
	t.Helper()
	abs, err := filepath.Abs(file)
	if err != nil {
		t.Fatal(err)
	}
	p.run(t, p.psql, "-X", "-q", "-v", "ON_ERROR_STOP=1", "-h", p.sockDir, "-p", strconv.Itoa(p.port), "-U", "postgres", "-d", db, "-f", abs)
}

type pgSession struct {
	p              *postgresServer
	user, password string
	sslmode        string
}

// as connects like the deployed services do: TCP, sslmode=verify-full
// against the dev CA, password authentication.
func (p *postgresServer) as(user, password string) *pgSession {
	return &pgSession{p: p, user: user, password: password, sslmode: "verify-full"}
}

func (s *pgSession) psql(args ...string) (string, error) {
	conn := fmt.Sprintf("host=localhost port=%d dbname=jetinbox user=%s sslmode=%s sslrootcert=%s", s.p.port, s.user, s.sslmode, s.p.ca)
	cmd := exec.Command(s.p.psql, append([]string{"-X", "-q", "-A", "-t", "-v", "ON_ERROR_STOP=1", conn}, args...)...)
	cmd.Env = append(os.Environ(), "PGPASSWORD="+s.password, "PGCONNECT_TIMEOUT=10")
	out, err := cmd.CombinedOutput()
	return strings.TrimSpace(string(out)), err
}

func (s *pgSession) must(t *testing.T, sql string) string {
	t.Helper()
	out, err := s.psql("-c", sql)
	if err != nil {
		t.Fatalf("%s: %s: %v\n%s", s.user, sql, err, out)
	}
	return out
}

func (s *pgSession) mustFile(t *testing.T, file string) {
	t.Helper()
	if out, err := s.psql("-f", file); err != nil {
		t.Fatalf("%s: %s: %v\n%s", s.user, file, err, out)
	}
}

func (s *pgSession) mustFail(t *testing.T, sql string, reasons ...string) {
	t.Helper()
	out, err := s.psql("-c", sql)
	if err == nil {
		t.Errorf("%s may run %s", s.user, sql)
		return
	}
	for _, r := range reasons {
		if strings.Contains(out, r) {
			return
		}
	}
	t.Errorf("%s: %s failed for another reason than %q: %s", s.user, sql, reasons, out)
}
