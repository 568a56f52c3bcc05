// Package testenv starts real infrastructure for tests and for the demo: a
// throwaway PostgreSQL cluster from the installed binaries and an embedded
// nats-server with JetStream. Nothing here is a mock.
//
// Tests share one PostgreSQL cluster per test binary (see [Main] and
// [NewDatabase]) and isolate themselves by database. Tests that stop or
// restart a server start their own with [StartPostgres] or [StartNATS].
package testenv

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"
)

// ErrNoPostgres is returned when no PostgreSQL server binaries can be found.
var ErrNoPostgres = errors.New("testenv: PostgreSQL server binaries (initdb, postgres) not found on PATH or under /usr/lib/postgresql/*/bin; install them with `apt-get install -y postgresql` (Debian) or set JETINBOX_PG_BIN")

// PostgresOptions configures a throwaway cluster.
type PostgresOptions struct {
	// Dir is the parent directory for the cluster. Default: a new temp dir,
	// removed by Close.
	Dir string
	// Durable keeps fsync on, as in production; with Dir set, initdb
	// also syncs the new cluster.
	// Default false: tests trade durability against an OS crash (which they
	// never simulate) for speed. Process crashes are still safe either way.
	Durable bool
	// MaxConnections is the server's max_connections. Default 200.
	MaxConnections int
	// Settings are extra server settings, "name=value" each, passed as
	// -c name=value at every start, after (so over) the defaults.
	Settings []string
	// Logf, if set, receives the server's output lines.
	Logf func(format string, args ...any)
}

// Postgres is a running (or stopped) throwaway PostgreSQL cluster.
//
// It trusts every connection, as the superuser, so it takes none from other
// local users: it listens on no TCP port, only on a Unix socket in a
// directory that only the server's user (and root) may enter. While it
// runs, another account on the machine cannot reach it, and so cannot
// become its superuser (and run programs with COPY … TO PROGRAM).
type Postgres struct {
	opts    PostgresOptions
	bin     string
	root    string // owned temp root, removed on Close
	dataDir string
	sockDir string
	port    int
	cred    *syscall.Credential

	mu   sync.Mutex
	cmd  *exec.Cmd
	done chan struct{}
}

// DefaultPGSearch is where FindPostgresBin looks for the server binaries
// after JETINBOX_PG_BIN and PATH: Debian's directories, newest first.
const DefaultPGSearch = "/usr/lib/postgresql/*/bin"

// pgSearch is the list of directory globs FindPostgresBin searches after
// PATH: JETINBOX_PG_SEARCH (a PATH-style list, empty for none) if it is
// set, else DefaultPGSearch. A test hides the installed binaries with it.
func pgSearch() string {
	if v, ok := os.LookupEnv("JETINBOX_PG_SEARCH"); ok {
		return v
	}
	return DefaultPGSearch
}

// FindPostgresBin returns the directory holding initdb and postgres: the
// one JETINBOX_PG_BIN names, else the one initdb on PATH is in, else the
// newest under JETINBOX_PG_SEARCH (default DefaultPGSearch).
func FindPostgresBin() (string, error) {
	if d := os.Getenv("JETINBOX_PG_BIN"); d != "" {
		if _, err := os.Stat(filepath.Join(d, "postgres")); err == nil {
			return d, nil
		}
	}
	if p, err := exec.LookPath("initdb"); err == nil {
		if real, err := filepath.EvalSymlinks(p); err == nil {
			d := filepath.Dir(real)
			if _, err := os.Stat(filepath.Join(d, "postgres")); err == nil {
				return d, nil
			}
		}
	}
	var matches []string
	for _, g := range filepath.SplitList(pgSearch()) {
		m, _ := filepath.Glob(filepath.Join(g, "postgres"))
		matches = append(matches, m...)
	}
	sort.Slice(matches, func(i, j int) bool { return pgVersion(matches[i]) > pgVersion(matches[j]) })
	for _, m := range matches {
		if _, err := os.Stat(filepath.Join(filepath.Dir(m), "initdb")); err == nil {
			return filepath.Dir(m), nil
		}
	}
	return "", ErrNoPostgres
}

func pgVersion(p string) int {
	v, _ := strconv.Atoi(filepath.Base(filepath.Dir(filepath.Dir(p))))
	return v
}

// StartPostgres creates a new cluster in a temp dir and starts it on a Unix
// socket in that dir, which only the server's user may enter (mode 0700):
// no TCP port. When the process runs as root the server runs as the
// "postgres" user, since initdb refuses root; root still connects.
func StartPostgres(ctx context.Context, opts PostgresOptions) (*Postgres, error) {
	if opts.MaxConnections == 0 {
		opts.MaxConnections = 200
	}
	bin, err := FindPostgresBin()
	if err != nil {
		return nil, err
	}
	p := &Postgres{opts: opts, bin: bin}
	if os.Geteuid() == 0 {
		u, err := user.Lookup("postgres")
		if err != nil {
			return nil, fmt.Errorf("testenv: running as root needs a postgres user to run initdb: %w", err)
		}
		uid, _ := strconv.Atoi(u.Uid)
		gid, _ := strconv.Atoi(u.Gid)
		p.cred = &syscall.Credential{Uid: uint32(uid), Gid: uint32(gid)}
	}
	parent := opts.Dir
	if parent == "" {
		parent = os.TempDir()
	}
	root, err := os.MkdirTemp(parent, "jetinbox-pg-")
	if err != nil {
		return nil, fmt.Errorf("testenv: %w", err)
	}
	p.root = root
	p.dataDir = filepath.Join(root, "data")
	p.sockDir = root
	if opts.Dir != "" {
		// The socket stays off the caller's directory, which may be a
		// FUSE mount (where a socket may not work, and which a simulated
		// crash unmounts).
		if p.sockDir, err = os.MkdirTemp("", "jetinbox-pgsock-"); err != nil {
			p.Close()
			return nil, fmt.Errorf("testenv: %w", err)
		}
	}
	for _, d := range []string{root, p.sockDir} {
		if p.cred != nil {
			if err := os.Chown(d, int(p.cred.Uid), int(p.cred.Gid)); err != nil {
				p.Close()
				return nil, fmt.Errorf("testenv: %w", err)
			}
		}
		// The socket's directory is the server user's alone: connecting to a
		// Unix socket takes search permission on its directory.
		if err := os.Chmod(d, 0o700); err != nil {
			p.Close()
			return nil, fmt.Errorf("testenv: %w", err)
		}
	}
	initArgs := []string{"-D", p.dataDir, "-U", "postgres",
		"-A", "trust", "-E", "UTF8", "--locale=C", "--no-instructions"}
	if !opts.Durable || opts.Dir == "" {
		// A durable cluster in a caller's directory (which may be a
		// filesystem that loses unsynced data) is synced from the start,
		// or a power cut could take the catalog. A temp dir never loses
		// power during a test, and syncing costs initdb a second or two.
		initArgs = append(initArgs, "--no-sync")
	}
	initdb := exec.CommandContext(ctx, filepath.Join(bin, "initdb"), initArgs...)
	initdb.SysProcAttr = &syscall.SysProcAttr{Credential: p.cred}
	if out, err := initdb.CombinedOutput(); err != nil {
		p.Close()
		return nil, fmt.Errorf("testenv: initdb: %w: %s", err, out)
	}
	// The port only names the socket (.s.PGSQL.PORT); one free on
	// loopback, so that a TCP connection to it finds nobody listening.
	if p.port, err = freePort(); err != nil {
		p.Close()
		return nil, err
	}
	if sock := filepath.Join(p.sockDir, ".s.PGSQL."+strconv.Itoa(p.port)); len(sock) > 100 {
		p.Close()
		return nil, fmt.Errorf("testenv: the socket path %s is too long for a Unix socket; set TMPDIR to a shorter directory", sock)
	}
	if err := p.Start(ctx); err != nil {
		p.Close()
		return nil, err
	}
	return p, nil
}

// Start starts the server (again) on its port and data dir and waits until it
// accepts connections.
func (p *Postgres) Start(ctx context.Context) error {
	// Right after a Kill the killed backends may still hold the old shared
	// memory for a moment, and the new postmaster refuses to start next to
	// it: try again briefly.
	var err error
	for attempt := 0; attempt < 20; attempt++ {
		if err = p.start(ctx); !errors.Is(err, errExitedDuringStart) {
			return err
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(100 * time.Millisecond):
		}
	}
	return err
}

var errExitedDuringStart = errors.New("testenv: postgres exited during start")

func (p *Postgres) start(ctx context.Context) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.cmd != nil {
		return errors.New("testenv: postgres already running")
	}
	args := []string{"-D", p.dataDir, "-p", strconv.Itoa(p.port), "-k", p.sockDir,
		"-c", "listen_addresses=",
		"-c", "unix_socket_permissions=0700",
		"-c", "max_connections=" + strconv.Itoa(p.opts.MaxConnections),
		"-c", "shared_buffers=128MB",
		"-c", "log_min_messages=warning",
	}
	if !p.opts.Durable {
		// fsync off only risks an OS crash; synchronous_commit stays on so a
		// killed server never loses a commit it reported.
		args = append(args, "-c", "fsync=off", "-c", "full_page_writes=off")
	}
	for _, kv := range p.opts.Settings {
		args = append(args, "-c", kv)
	}
	cmd := exec.Command(filepath.Join(p.bin, "postgres"), args...)
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: p.cred, Setpgid: true}
	if p.opts.Logf != nil {
		w := &lineWriter{logf: p.opts.Logf, prefix: "postgres: "}
		cmd.Stdout, cmd.Stderr = w, w
	}
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("testenv: start postgres: %w", err)
	}
	done := make(chan struct{})
	go func() { _ = cmd.Wait(); close(done) }()
	p.cmd, p.done = cmd, done

	deadline := time.Now().Add(30 * time.Second)
	for {
		c, err := pgx.Connect(ctx, p.URL("postgres"))
		if err == nil {
			c.Close(ctx)
			return nil
		}
		select {
		case <-done:
			p.cmd = nil
			return fmt.Errorf("%w: %w", errExitedDuringStart, err)
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(20 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("testenv: postgres not ready after 30s: %w", err)
		}
	}
}

// Stop shuts the server down (fast mode: active transactions are rolled back),
// keeping its data for a later Start.
func (p *Postgres) Stop() error { return p.signal(syscall.SIGINT) }

// Kill stops the server the hard way (SIGKILL on the postmaster's process
// group), the way a power cut or OOM kill would.
func (p *Postgres) Kill() error { return p.signal(syscall.SIGKILL) }

// KillAll cuts the power to the server: SIGKILL to the postmaster and every
// backend and auxiliary process at once, then it waits until none is left,
// so that whatever they had open is closed and a filesystem under the data
// directory can crash next. A later Start runs crash recovery on what the
// disk kept.
//
// The children are not in the postmaster's process group (each backend
// calls setsid), so they are found as its descendants. All are stopped
// first, so that none acts on the others' death (a backend that sees the
// postmaster gone, a postmaster that sees a child die) before it dies too.
func (p *Postgres) KillAll() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.cmd == nil {
		return nil
	}
	root := p.cmd.Process.Pid
	var tree []int
	for {
		// Stopping the postmaster first ends its forking; a child forked
		// while we stopped the others shows up in the next pass.
		procs, err := processTable()
		if err != nil {
			return err
		}
		next := descendants(procs, root)
		for _, pid := range next {
			_ = syscall.Kill(pid, syscall.SIGSTOP)
		}
		if len(next) == len(tree) {
			tree = next
			break
		}
		tree = next
	}
	for _, pid := range tree {
		_ = syscall.Kill(pid, syscall.SIGKILL)
	}
	<-p.done
	p.cmd = nil
	_ = os.Remove(filepath.Join(p.dataDir, "postmaster.pid"))
	// The children are orphans now, reaped by someone else; a zombie holds
	// no files, so only live ones count.
	deadline := time.Now().Add(30 * time.Second)
	for {
		procs, err := processTable()
		if err != nil {
			return err
		}
		var live []int
		for _, pid := range tree {
			if _, ok := procs[pid]; ok {
				live = append(live, pid)
			}
		}
		if len(live) == 0 {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("testenv: postgres processes %v still alive 30s after SIGKILL", live)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// processTable maps every live (not zombie) process to its parent.
func processTable() (map[int]int, error) {
	ents, err := os.ReadDir("/proc")
	if err != nil {
		return nil, fmt.Errorf("testenv: %w", err)
	}
	procs := make(map[int]int, len(ents))
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		b, err := os.ReadFile(filepath.Join("/proc", e.Name(), "stat"))
		if err != nil {
			continue // gone meanwhile
		}
		// pid (comm) state ppid …; comm may hold spaces and parens.
		s := string(b)
		i := strings.LastIndexByte(s, ')')
		if i < 0 {
			continue
		}
		f := strings.Fields(s[i+1:])
		if len(f) < 2 || f[0] == "Z" || f[0] == "X" {
			continue
		}
		ppid, _ := strconv.Atoi(f[1])
		procs[pid] = ppid
	}
	return procs, nil
}

// descendants lists root and every live process below it, root first.
func descendants(procs map[int]int, root int) []int {
	children := make(map[int][]int)
	for pid, ppid := range procs {
		children[ppid] = append(children[ppid], pid)
	}
	out := []int{root}
	for i := 0; i < len(out); i++ {
		out = append(out, children[out[i]]...)
	}
	return out
}

func (p *Postgres) signal(sig syscall.Signal) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.cmd == nil {
		return nil
	}
	if sig == syscall.SIGKILL {
		_ = syscall.Kill(-p.cmd.Process.Pid, sig)
	} else {
		_ = p.cmd.Process.Signal(sig)
	}
	select {
	case <-p.done:
	case <-time.After(30 * time.Second):
		_ = syscall.Kill(-p.cmd.Process.Pid, syscall.SIGKILL)
		<-p.done
	}
	p.cmd = nil
	if sig == syscall.SIGKILL {
		// Orphaned shared memory or a stale pid file would stop a restart.
		_ = os.Remove(filepath.Join(p.dataDir, "postmaster.pid"))
	}
	return nil
}

// Close stops the server and removes its files.
func (p *Postgres) Close() error {
	err := p.Stop()
	if p.root != "" {
		_ = os.RemoveAll(p.root)
	}
	if p.sockDir != "" && p.sockDir != p.root {
		_ = os.RemoveAll(p.sockDir)
	}
	return err
}

// Port is the port number in the Unix socket's name (.s.PGSQL.PORT in
// [Postgres.SocketDir]); the server listens on no TCP port.
func (p *Postgres) Port() int { return p.port }

// SocketDir is the directory holding the server's Unix socket, which only
// the server's user (and root) may enter.
func (p *Postgres) SocketDir() string { return p.sockDir }

// URL returns a connection string for database db as the superuser, over
// the Unix socket.
func (p *Postgres) URL(db string) string {
	return fmt.Sprintf("postgres://postgres@/%s?host=%s&port=%d&sslmode=disable", url.PathEscape(db), url.QueryEscape(p.sockDir), p.port)
}

// CreateDatabase creates a new empty database and returns its URL.
func (p *Postgres) CreateDatabase(ctx context.Context, name string) (string, error) {
	return createDatabase(ctx, p.URL, name)
}

// createDatabase creates database name through url("postgres") and
// returns url(name).
func createDatabase(ctx context.Context, url func(db string) string, name string) (string, error) {
	c, err := pgx.Connect(ctx, url("postgres"))
	if err != nil {
		return "", fmt.Errorf("testenv: %w", err)
	}
	defer c.Close(ctx)
	if _, err := c.Exec(ctx, "CREATE DATABASE "+pgx.Identifier{name}.Sanitize()); err != nil {
		return "", fmt.Errorf("testenv: create database %s: %w", name, err)
	}
	return url(name), nil
}

// DropDatabase drops a database, closing its connections.
func (p *Postgres) DropDatabase(ctx context.Context, name string) error {
	c, err := pgx.Connect(ctx, p.URL("postgres"))
	if err != nil {
		return fmt.Errorf("testenv: %w", err)
	}
	defer c.Close(ctx)
	if _, err := c.Exec(ctx, "DROP DATABASE IF EXISTS "+pgx.Identifier{name}.Sanitize()+" WITH (FORCE)"); err != nil {
		return fmt.Errorf("testenv: drop database %s: %w", name, err)
	}
	return nil
}

// Settle waits, up to max, until no autovacuum worker is running, after a
// CHECKPOINT: a measurement that starts then is not sharing the machine
// with the cleanup of earlier work.
func (p *Postgres) Settle(ctx context.Context, max time.Duration) error {
	c, err := pgx.Connect(ctx, p.URL("postgres"))
	if err != nil {
		return fmt.Errorf("testenv: %w", err)
	}
	defer c.Close(ctx)
	if _, err := c.Exec(ctx, "CHECKPOINT"); err != nil {
		return fmt.Errorf("testenv: checkpoint: %w", err)
	}
	deadline := time.Now().Add(max)
	for time.Now().Before(deadline) {
		var n int
		if err := c.QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity WHERE backend_type = 'autovacuum worker'`).Scan(&n); err != nil {
			return fmt.Errorf("testenv: %w", err)
		}
		if n == 0 {
			return nil
		}
		time.Sleep(100 * time.Millisecond)
	}
	return nil
}

type lineWriter struct {
	logf   func(string, ...any)
	prefix string
}

func (w *lineWriter) Write(b []byte) (int, error) {
	for _, line := range strings.Split(strings.TrimRight(string(b), "\n"), "\n") {
		w.logf("%s%s", w.prefix, line)
	}
	return len(b), nil
}
