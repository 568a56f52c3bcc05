package testenv

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
)

// ErrNoPgBouncer is returned when no pgbouncer binary can be found.
var ErrNoPgBouncer = errors.New("testenv: pgbouncer not found on PATH or in /usr/sbin; install it with `apt-get install -y pgbouncer` (Debian) or set JETINBOX_PGBOUNCER")

// PgBouncerOptions configures a PgBouncer in front of a [Postgres].
type PgBouncerOptions struct {
	// PoolSize is the number of server connections per database and user
	// (default_pool_size). Default 2: fewer than any pool of clients, so
	// that clients really share server connections.
	PoolSize int
	// Logf, if set, receives pgbouncer's log lines.
	Logf func(format string, args ...any)
	// PoolMode is pgbouncer's pool_mode: transaction (the default),
	// session or statement (which refuses every transaction of more than
	// one statement).
	PoolMode string
}

// PgBouncer is a running pgbouncer (in transaction pooling mode unless
// [PgBouncerOptions.PoolMode] says otherwise) in front of
// a [Postgres]: every database on the cluster is reachable through it, by
// the same name. Like the cluster it listens on no TCP port (so it never
// meets a pgbouncer service the package installed on 6432), only on a Unix
// socket in a directory that only the server's user (and root) may enter.
type PgBouncer struct {
	root string
	port int

	mu   sync.Mutex
	cmd  *exec.Cmd
	done chan struct{}
}

// FindPgBouncer returns the pgbouncer binary: JETINBOX_PGBOUNCER, else
// pgbouncer on PATH, else Debian's /usr/sbin/pgbouncer (not on a user's
// PATH).
func FindPgBouncer() (string, error) {
	if p := os.Getenv("JETINBOX_PGBOUNCER"); p != "" {
		if _, err := os.Stat(p); err == nil {
			return p, nil
		}
		return "", fmt.Errorf("%w (JETINBOX_PGBOUNCER=%s does not exist)", ErrNoPgBouncer, p)
	}
	if p, err := exec.LookPath("pgbouncer"); err == nil {
		return p, nil
	}
	if _, err := os.Stat("/usr/sbin/pgbouncer"); err == nil {
		return "/usr/sbin/pgbouncer", nil
	}
	return "", ErrNoPgBouncer
}

// StartPgBouncer starts pgbouncer in transaction pooling mode in front of
// pg, with a config and auth file of its own in a new temp dir, as the
// server's user (pgbouncer refuses to run as root), and waits until it
// passes a query through.
func StartPgBouncer(ctx context.Context, pg *Postgres, opts PgBouncerOptions) (*PgBouncer, error) {
	if opts.PoolSize == 0 {
		opts.PoolSize = 2
	}
	switch opts.PoolMode {
	case "":
		opts.PoolMode = "transaction"
	case "transaction", "session", "statement":
	default:
		return nil, fmt.Errorf("testenv: pgbouncer pool_mode %q: want transaction, session or statement", opts.PoolMode)
	}
	bin, err := FindPgBouncer()
	if err != nil {
		return nil, err
	}
	root, err := os.MkdirTemp(pg.opts.Dir, "jetinbox-pgb-")
	if err != nil {
		return nil, fmt.Errorf("testenv: %w", err)
	}
	b := &PgBouncer{root: root}
	if b.port, err = freePort(); err != nil {
		b.Close()
		return nil, err
	}
	if sock := filepath.Join(root, ".s.PGSQL."+strconv.Itoa(b.port)); len(sock) > 100 {
		b.Close()
		return nil, fmt.Errorf("testenv: the socket path %s is too long for a Unix socket; set TMPDIR to a shorter directory", sock)
	}
	// The server trusts its socket's users; pgbouncer checks no password
	// either (trust), but only lets in the users its auth file names.
	ini := fmt.Sprintf(`[databases]
* = host=%s port=%d

[pgbouncer]
pool_mode = %s
listen_addr =
listen_port = %d
unix_socket_dir = %s
unix_socket_mode = 0700
auth_type = trust
auth_file = %s
default_pool_size = %d
min_pool_size = 0
reserve_pool_size = 0
max_client_conn = 500
max_db_connections = 0
ignore_startup_parameters = extra_float_digits
server_check_delay = 0
logfile =
pidfile =
log_connections = 0
log_disconnections = 0
`, pg.SocketDir(), pg.Port(), opts.PoolMode, b.port, root, filepath.Join(root, "userlist.txt"), opts.PoolSize)
	for name, body := range map[string]string{"pgbouncer.ini": ini, "userlist.txt": `"postgres" ""` + "\n"} {
		if err := os.WriteFile(filepath.Join(root, name), []byte(body), 0o600); err != nil {
			b.Close()
			return nil, fmt.Errorf("testenv: %w", err)
		}
	}
	if pg.cred != nil {
		for _, p := range []string{root, filepath.Join(root, "pgbouncer.ini"), filepath.Join(root, "userlist.txt")} {
			if err := os.Chown(p, int(pg.cred.Uid), int(pg.cred.Gid)); err != nil {
				b.Close()
				return nil, fmt.Errorf("testenv: %w", err)
			}
		}
	}
	if err := os.Chmod(root, 0o700); err != nil {
		b.Close()
		return nil, fmt.Errorf("testenv: %w", err)
	}
	cmd := exec.Command(bin, filepath.Join(root, "pgbouncer.ini"))
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: pg.cred, Setpgid: true}
	if opts.Logf != nil {
		w := &lineWriter{logf: opts.Logf, prefix: "pgbouncer: "}
		cmd.Stdout, cmd.Stderr = w, w
	}
	out := &tailBuffer{}
	if opts.Logf == nil {
		cmd.Stdout, cmd.Stderr = out, out
	}
	if err := cmd.Start(); err != nil {
		b.Close()
		return nil, fmt.Errorf("testenv: start pgbouncer: %w", err)
	}
	done := make(chan struct{})
	go func() { _ = cmd.Wait(); close(done) }()
	b.cmd, b.done = cmd, done

	deadline := time.Now().Add(30 * time.Second)
	for {
		c, err := pgx.Connect(ctx, b.URL("postgres"))
		if err == nil {
			var one int
			err = c.QueryRow(ctx, "SELECT 1").Scan(&one)
			c.Close(ctx)
			if err == nil {
				return b, nil
			}
		}
		select {
		case <-done:
			b.mu.Lock()
			b.cmd = nil
			b.mu.Unlock()
			b.Close()
			return nil, fmt.Errorf("testenv: pgbouncer exited during start: %w: %s", err, out.String())
		case <-ctx.Done():
			b.Close()
			return nil, ctx.Err()
		case <-time.After(20 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			b.Close()
			return nil, fmt.Errorf("testenv: pgbouncer not ready after 30s: %w: %s", err, out.String())
		}
	}
}

// NewPgBouncer starts a pgbouncer in transaction pooling mode in front of
// the test binary's shared cluster and stops it when the test ends. A
// missing pgbouncer fails the test with a message saying what to install;
// like a missing PostgreSQL, it never skips.
func NewPgBouncer(t testing.TB, opts PgBouncerOptions) *PgBouncer {
	t.Helper()
	pg := SharedPostgres(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	b, err := StartPgBouncer(ctx, pg, opts)
	if err != nil {
		t.Fatalf("PgBouncer is required for this test: %v", err)
	}
	t.Cleanup(func() { _ = b.Close() })
	return b
}

// URL returns a connection string for database db through the pooler, as
// the superuser, over its Unix socket. It sets no statement mode: the
// caller adds default_query_exec_mode (see [WithQueryExecMode]).
func (b *PgBouncer) URL(db string) string {
	return fmt.Sprintf("postgres://postgres@/%s?host=%s&port=%d&sslmode=disable", url.PathEscape(db), url.QueryEscape(b.root), b.port)
}

// SocketDir is the directory holding the pooler's Unix socket.
func (b *PgBouncer) SocketDir() string { return b.root }

// Port is the port number in the Unix socket's name (.s.PGSQL.PORT in
// [PgBouncer.SocketDir]); the pooler listens on no TCP port.
func (b *PgBouncer) Port() int { return b.port }

// WithQueryExecMode returns dbURL with pgx's default_query_exec_mode
// parameter set to mode (exec, cache_describe, ...).
func WithQueryExecMode(dbURL, mode string) string {
	sep := "?"
	if strings.Contains(dbURL, "?") {
		sep = "&"
	}
	return dbURL + sep + "default_query_exec_mode=" + url.QueryEscape(mode)
}

// Close stops pgbouncer (SIGTERM: at once, dropping its clients) and
// removes its files.
func (b *PgBouncer) Close() error {
	b.mu.Lock()
	if b.cmd != nil {
		_ = b.cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-b.done:
		case <-time.After(10 * time.Second):
			_ = syscall.Kill(-b.cmd.Process.Pid, syscall.SIGKILL)
			<-b.done
		}
		b.cmd = nil
	}
	b.mu.Unlock()
	if b.root != "" {
		_ = os.RemoveAll(b.root)
	}
	return nil
}

// tailBuffer keeps the last few KiB a process wrote, for an error message.
type tailBuffer struct {
	mu  sync.Mutex
	buf []byte
}

func (w *tailBuffer) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.buf = append(w.buf, p...)
	if len(w.buf) > 4096 {
		w.buf = w.buf[len(w.buf)-4096:]
	}
	return len(p), nil
}

func (w *tailBuffer) String() string {
	w.mu.Lock()
	defer w.mu.Unlock()
	return string(w.buf)
}
