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
// sslmode=verify-full that jetinbox_consumer can do its work and nothing
// more, and that a connection without TLS is refused.
func TestPostgresRolesAndSettings(t *testing.T) {
	t.Parallel()
	fx := fixture(t)
	pg := startPostgres(t, fx)

	pg.superuser(t, "postgres", "CREATE DATABASE jetinbox")
	pg.superuserFile(t, "jetinbox", "postgres/roles.sql")
	pg.superuser(t, "jetinbox", "ALTER ROLE jetinbox_migrator PASSWORD 'migrator-pw'; ALTER ROLE jetinbox_consumer PASSWORD 'consumer-pw'")

	migrator := pg.as("jetinbox_migrator", "migrator-pw")
	consumer := pg.as("jetinbox_consumer", "consumer-pw")

	// What `jetinbox migrate` does: its bookkeeping table, then each
	// component's SQL files, as the schema owner.
	migrator.must(t, `CREATE TABLE IF NOT EXISTS jetinbox_migrations (component text NOT NULL, version integer NOT NULL, name text NOT NULL, applied_at timestamptz NOT NULL DEFAULT now(), PRIMARY KEY (component, version))`)
	var migrations []string
	for _, dir := range []string{"../inbox/migrations", "../effects/migrations"} {
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

	// The consumer's work: claim, record a conflict, apply the ledger effect,
	// retention.
	for _, q := range []string{
		`INSERT INTO inbox (scope, message_id, fingerprint) VALUES ('ledger', 'm1', '\x01') ON CONFLICT DO NOTHING`,
		`INSERT INTO inbox_conflicts (scope, message_id, fingerprint) VALUES ('ledger', 'm1', '\x02')`,
		`INSERT INTO accounts (id, balance) VALUES (1, 0) ON CONFLICT (id) DO UPDATE SET balance = accounts.balance + 1`,
		`INSERT INTO ledger_entries (message_id, account, amount) VALUES ('m1', 1, 5)`,
		`UPDATE inbox SET status = 'rejected', reason = 'test' WHERE scope = 'ledger' AND message_id = 'm1'`,
		`SELECT count(*) FROM inbox, inbox_conflicts, accounts, ledger_entries`,
		`SELECT count(*) FROM jetinbox_migrations`,
		`DELETE FROM inbox WHERE received_at < now() - interval '30 days'`,
	} {
		consumer.must(t, q)
	}
	// ... and nothing else.
	for _, q := range []string{
		`CREATE TABLE evil (id int)`,
		`CREATE TABLE public.evil (id int)`,
		`DROP TABLE inbox`,
		`TRUNCATE inbox`,
		`ALTER TABLE inbox ADD COLUMN evil int`,
		`DELETE FROM jetinbox_migrations`,
		`INSERT INTO jetinbox_migrations (component, version, name) VALUES ('x', 1, 'x')`,
		`CREATE SCHEMA evil`,
	} {
		consumer.mustFail(t, q, "permission denied", "must be owner")
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
	_ = os.Chmod(root, 0o755)

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
