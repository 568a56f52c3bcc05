package testenv

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/url"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/jetinbox/jetinbox/internal/faultconn"
)

// ErrNoAutoFailover is returned when pg_auto_failover is not installed.
var ErrNoAutoFailover = errors.New("testenv: pg_autoctl not found on PATH; install Debian's packages with `apt-get install -y postgresql-15-auto-failover pg-auto-failover-cli` or set JETINBOX_PG_AUTOCTL")

// AutoFailoverPackages are the Debian packages a pg_auto_failover
// formation needs.
const AutoFailoverPackages = "postgresql-15-auto-failover pg-auto-failover-cli"

// FindAutoFailover returns the pg_autoctl binary and the PostgreSQL bin
// directory it must run with (its extension is built for one major
// version: Debian's postgresql-15-auto-failover for 15).
func FindAutoFailover() (autoctl, pgBin string, err error) {
	autoctl = os.Getenv("JETINBOX_PG_AUTOCTL")
	if autoctl != "" {
		if _, err := os.Stat(autoctl); err != nil {
			return "", "", fmt.Errorf("%w (JETINBOX_PG_AUTOCTL=%s does not exist)", ErrNoAutoFailover, autoctl)
		}
	} else {
		if autoctl, err = exec.LookPath("pg_autoctl"); err != nil {
			return "", "", ErrNoAutoFailover
		}
	}
	pgBin = os.Getenv("JETINBOX_PG_AUTOCTL_BIN")
	if pgBin == "" {
		pgBin = "/usr/lib/postgresql/15/bin"
	}
	// The monitor's extension is what the server package ships.
	if _, err := os.Stat(filepath.Join(pgBin, "postgres")); err != nil {
		return "", "", fmt.Errorf("%w (no postgres in %s)", ErrNoAutoFailover, pgBin)
	}
	if m, _ := filepath.Glob("/usr/share/postgresql/15/extension/pgautofailover.control"); len(m) == 0 && os.Getenv("JETINBOX_PG_AUTOCTL_BIN") == "" {
		return "", "", fmt.Errorf("%w (the pgautofailover extension for PostgreSQL 15 is missing: postgresql-15-auto-failover)", ErrNoAutoFailover)
	}
	return autoctl, pgBin, nil
}

// AutoFailoverOptions configures a formation.
type AutoFailoverOptions struct {
	// Logf, if set, receives pg_autoctl's output lines.
	Logf func(format string, args ...any)
}

// AutoFailover is a pg_auto_failover formation: a monitor and two data
// nodes, a primary and a secondary, each a `pg_autoctl run` process run
// as the postgres user in a throwaway directory, listening on loopback
// only. Clients reach the nodes through a TCP proxy each (see
// [AutoFailover.Cut]); [AutoFailover.URL] names both proxies with
// target_session_attrs=read-write, so a client finds the primary.
//
// Every node trusts loopback connections as any user, as the test
// clusters do; unlike [Postgres] it needs TCP (the monitor and the
// standby's replication connect over it), so another local account could
// reach it while it runs.
type AutoFailover struct {
	opts    AutoFailoverOptions
	autoctl string
	pgBin   string
	root    string
	cred    *syscall.Credential
	env     []string
	monPort int
	monDir  string
	nodes   [2]*afNode
	// monitorProc is the monitor's pg_autoctl run.
	monitorProc *afNode
}

type afNode struct {
	name  string
	dir   string
	port  int
	proxy *faultconn.Proxy

	mu   sync.Mutex
	cmd  *exec.Cmd
	done chan struct{}
}

// StartAutoFailover creates a monitor and two nodes and returns once one
// node is primary and the other secondary.
func StartAutoFailover(ctx context.Context, opts AutoFailoverOptions) (_ *AutoFailover, err error) {
	autoctl, pgBin, err := FindAutoFailover()
	if err != nil {
		return nil, err
	}
	f := &AutoFailover{opts: opts, autoctl: autoctl, pgBin: pgBin}
	defer func() {
		if err != nil {
			f.Close()
		}
	}()
	if os.Geteuid() == 0 {
		u, err := user.Lookup("postgres")
		if err != nil {
			return nil, fmt.Errorf("testenv: running as root needs a postgres user for pg_autoctl: %w", err)
		}
		uid, _ := strconv.Atoi(u.Uid)
		gid, _ := strconv.Atoi(u.Gid)
		f.cred = &syscall.Credential{Uid: uint32(uid), Gid: uint32(gid)}
	}
	if f.root, err = os.MkdirTemp("", "jetinbox-paf-"); err != nil {
		return nil, fmt.Errorf("testenv: %w", err)
	}
	if f.cred != nil {
		if err := os.Chown(f.root, int(f.cred.Uid), int(f.cred.Gid)); err != nil {
			return nil, fmt.Errorf("testenv: %w", err)
		}
	}
	if err := os.Chmod(f.root, 0o700); err != nil {
		return nil, fmt.Errorf("testenv: %w", err)
	}
	// pg_autoctl keeps its config and state under XDG directories: the
	// throwaway root's, so that nothing is left in the user's home.
	f.env = []string{"PATH=" + pgBin + ":/usr/bin:/bin", "HOME=" + f.root, "LANG=C.UTF-8",
		"XDG_CONFIG_HOME=" + filepath.Join(f.root, "config"), "XDG_DATA_HOME=" + filepath.Join(f.root, "data"),
		"XDG_RUNTIME_DIR=" + filepath.Join(f.root, "run")}
	if f.monPort, err = freePort(); err != nil {
		return nil, err
	}
	f.monDir = filepath.Join(f.root, "monitor")
	if err := f.autoctlRun(ctx, "create", "monitor", "--pgdata", f.monDir, "--pgport", strconv.Itoa(f.monPort),
		"--hostname", "127.0.0.1", "--auth", "trust", "--no-ssl"); err != nil {
		return nil, err
	}
	// The monitor's postgres listens where its config says: loopback.
	if err := f.autoctlRun(ctx, "config", "set", "--pgdata", f.monDir, "postgresql.listen_addresses", "127.0.0.1"); err != nil {
		return nil, err
	}
	mon := &afNode{name: "monitor", dir: f.monDir, port: f.monPort}
	if err := f.start(mon, "run", "--pgdata", f.monDir); err != nil {
		return nil, err
	}
	f.monitorProc = mon
	if err := f.waitMonitor(ctx); err != nil {
		return nil, err
	}
	// Fail over in seconds, not the default half minute: the monitor
	// checks each node every second, calls one unhealthy after 3s and
	// gives a lost primary 3s to demote itself.
	if err := f.monitorExec(ctx,
		`ALTER SYSTEM SET pgautofailover.health_check_period = 1000`,
		`ALTER SYSTEM SET pgautofailover.health_check_timeout = 1000`,
		`ALTER SYSTEM SET pgautofailover.health_check_max_retries = 1`,
		`ALTER SYSTEM SET pgautofailover.health_check_retry_delay = 500`,
		`ALTER SYSTEM SET pgautofailover.node_considered_unhealthy_timeout = 3000`,
		`ALTER SYSTEM SET pgautofailover.primary_demote_timeout = 3000`,
		`SELECT pg_reload_conf()`); err != nil {
		return nil, err
	}
	for i := range f.nodes {
		n := &afNode{name: fmt.Sprintf("node%d", i+1), dir: filepath.Join(f.root, fmt.Sprintf("node%d", i+1))}
		if n.port, err = freePort(); err != nil {
			return nil, err
		}
		if n.proxy, err = faultconn.NewProxy("127.0.0.1:0", net.JoinHostPort("127.0.0.1", strconv.Itoa(n.port))); err != nil {
			return nil, err
		}
		f.nodes[i] = n
		if err := f.start(n, "create", "postgres", "--pgdata", n.dir, "--pgport", strconv.Itoa(n.port),
			"--listen", "127.0.0.1", "--hostname", "127.0.0.1", "--name", n.name, "--auth", "trust", "--no-ssl",
			"--replication-quorum", "true", "--monitor", f.MonitorURL(), "--run"); err != nil {
			return nil, err
		}
		want := []string{"single"}
		if i == 1 {
			want = []string{"primary", "secondary"}
		}
		if err := f.WaitStates(ctx, 2*time.Minute, want...); err != nil {
			return nil, err
		}
	}
	return f, nil
}

// NewAutoFailover starts a formation for a test and stops it when the test
// ends. A missing pg_auto_failover fails the test, naming the packages.
func NewAutoFailover(t testing.TB, opts AutoFailoverOptions) *AutoFailover {
	t.Helper()
	if opts.Logf == nil {
		tail := NewLogTail(200)
		opts.Logf = func(format string, args ...any) { fmt.Fprintf(tail, format+"\n", args...) }
		t.Cleanup(func() {
			if t.Failed() {
				t.Logf("pg_autoctl's last lines:\n%s", tail)
			}
		})
	}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	f, err := StartAutoFailover(ctx, opts)
	if err != nil {
		t.Fatalf("pg_auto_failover is required for this test: %v", err)
	}
	t.Cleanup(func() { _ = f.Close() })
	return f
}

// autoctlRun runs a pg_autoctl command to its end.
func (f *AutoFailover) autoctlRun(ctx context.Context, args ...string) error {
	cmd := exec.CommandContext(ctx, f.autoctl, args...)
	cmd.Env = f.env
	cmd.Dir = f.root
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: f.cred, Setpgid: true}
	out, err := cmd.CombinedOutput()
	if err != nil {
		return fmt.Errorf("testenv: pg_autoctl %s: %w: %s", strings.Join(args[:min(2, len(args))], " "), err, tailOf(out))
	}
	return nil
}

func tailOf(b []byte) string {
	if len(b) > 2000 {
		b = b[len(b)-2000:]
	}
	return string(b)
}

// start starts a long-running pg_autoctl process for n.
func (f *AutoFailover) start(n *afNode, args ...string) error {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.cmd != nil {
		return fmt.Errorf("testenv: %s already running", n.name)
	}
	cmd := exec.Command(f.autoctl, args...)
	cmd.Env = f.env
	cmd.Dir = f.root
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: f.cred, Setpgid: true}
	if f.opts.Logf != nil {
		w := &lineWriter{logf: f.opts.Logf, prefix: n.name + ": "}
		cmd.Stdout, cmd.Stderr = w, w
	}
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("testenv: start pg_autoctl for %s: %w", n.name, err)
	}
	done := make(chan struct{})
	go func() { _ = cmd.Wait(); close(done) }()
	n.cmd, n.done = cmd, done
	return nil
}

// stop ends n's pg_autoctl and its postgres: SIGTERM (a fast shutdown),
// or SIGKILL on the whole process group, as a machine that dies.
func (n *afNode) stop(sig syscall.Signal) {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.cmd == nil {
		return
	}
	if sig == syscall.SIGKILL {
		_ = syscall.Kill(-n.cmd.Process.Pid, syscall.SIGKILL)
	} else {
		_ = n.cmd.Process.Signal(sig)
	}
	select {
	case <-n.done:
	case <-time.After(30 * time.Second):
		_ = syscall.Kill(-n.cmd.Process.Pid, syscall.SIGKILL)
		<-n.done
	}
	// A postgres the keeper started may outlive a killed keeper a moment.
	_ = syscall.Kill(-n.cmd.Process.Pid, syscall.SIGKILL)
	n.cmd = nil
}

// MonitorURL is the monitor's connection string, for pg_autoctl.
func (f *AutoFailover) MonitorURL() string {
	return fmt.Sprintf("postgres://autoctl_node@127.0.0.1:%d/pg_auto_failover?sslmode=disable", f.monPort)
}

func (f *AutoFailover) waitMonitor(ctx context.Context) error {
	deadline := time.Now().Add(time.Minute)
	for {
		c, err := pgx.Connect(ctx, f.monitorAdminURL())
		if err == nil {
			c.Close(ctx)
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("testenv: pg_auto_failover monitor not ready after a minute: %w", err)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(100 * time.Millisecond):
		}
	}
}

func (f *AutoFailover) monitorAdminURL() string {
	return fmt.Sprintf("postgres://postgres@127.0.0.1:%d/pg_auto_failover?sslmode=disable", f.monPort)
}

func (f *AutoFailover) monitorExec(ctx context.Context, stmts ...string) error {
	c, err := pgx.Connect(ctx, f.monitorAdminURL())
	if err != nil {
		return fmt.Errorf("testenv: monitor: %w", err)
	}
	defer c.Close(ctx)
	for _, s := range stmts {
		if _, err := c.Exec(ctx, s); err != nil {
			return fmt.Errorf("testenv: monitor: %s: %w", s, err)
		}
	}
	return nil
}

// NodeState is one data node as the monitor sees it.
type NodeState struct {
	Name     string
	Port     int
	Reported string
	Goal     string
}

// States returns the data nodes' states, in node order, as the monitor
// has them.
func (f *AutoFailover) States(ctx context.Context) ([]NodeState, error) {
	c, err := pgx.Connect(ctx, f.monitorAdminURL())
	if err != nil {
		return nil, fmt.Errorf("testenv: monitor: %w", err)
	}
	defer c.Close(ctx)
	rows, err := c.Query(ctx, `SELECT nodename, nodeport, reportedstate::text, goalstate::text FROM pgautofailover.node ORDER BY nodeid`)
	if err != nil {
		return nil, fmt.Errorf("testenv: monitor: %w", err)
	}
	return pgx.CollectRows(rows, func(r pgx.CollectableRow) (NodeState, error) {
		var s NodeState
		err := r.Scan(&s.Name, &s.Port, &s.Reported, &s.Goal)
		return s, err
	})
}

// WaitStates waits until the data nodes, in some order, report and are
// meant to be in exactly the states want (e.g. "primary", "secondary").
func (f *AutoFailover) WaitStates(ctx context.Context, timeout time.Duration, want ...string) error {
	deadline := time.Now().Add(timeout)
	var last []NodeState
	for {
		st, err := f.States(ctx)
		if err == nil {
			last = st
			if statesAre(st, want) {
				return nil
			}
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("testenv: pg_auto_failover: nodes not %v after %v: %+v (%v)", want, timeout, last, err)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(200 * time.Millisecond):
		}
	}
}

func statesAre(st []NodeState, want []string) bool {
	if len(st) != len(want) {
		return false
	}
	left := append([]string(nil), want...)
	for _, s := range st {
		if s.Reported != s.Goal {
			return false
		}
		found := false
		for i, w := range left {
			if w == s.Reported {
				left = append(left[:i], left[i+1:]...)
				found = true
				break
			}
		}
		if !found {
			return false
		}
	}
	return true
}

// Primary returns the index (0 or 1) of the node the monitor has as
// primary (or wait_primary), -1 if none.
func (f *AutoFailover) Primary(ctx context.Context) (int, error) {
	st, err := f.States(ctx)
	if err != nil {
		return -1, err
	}
	for _, s := range st {
		// A dead primary still reports "primary": the goal says what the
		// monitor made of it.
		if s.Reported == s.Goal && (s.Reported == "primary" || s.Reported == "wait_primary") {
			for i, n := range f.nodes {
				if n.port == s.Port {
					return i, nil
				}
			}
		}
	}
	return -1, nil
}

// WaitPrimary polls Primary until the formation has one (the monitor's
// states are briefly in between during a failover) or timeout passes.
func (f *AutoFailover) WaitPrimary(ctx context.Context, timeout time.Duration) (int, error) {
	deadline := time.Now().Add(timeout)
	for {
		p, err := f.Primary(ctx)
		if err == nil && p >= 0 {
			return p, nil
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
			if err == nil {
				err = fmt.Errorf("testenv: no primary within %v", timeout)
			}
			return -1, err
		}
		select {
		case <-ctx.Done():
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// URL returns a multi-host connection string for database db, as the
// superuser, through both nodes' proxies, with
// target_session_attrs=read-write: pgx tries the hosts in turn and keeps
// the one that accepts writes.
func (f *AutoFailover) URL(db string) string {
	return fmt.Sprintf("postgres://postgres@%s,%s/%s?sslmode=disable&target_session_attrs=read-write&connect_timeout=5",
		f.nodes[0].proxy.Addr(), f.nodes[1].proxy.Addr(), url.PathEscape(db))
}

// NodeURL is node i's own connection string for db, not through its proxy.
func (f *AutoFailover) NodeURL(i int, db string) string {
	return fmt.Sprintf("postgres://postgres@127.0.0.1:%d/%s?sslmode=disable", f.nodes[i].port, url.PathEscape(db))
}

// Name is node i's name.
func (f *AutoFailover) Name(i int) string { return f.nodes[i].name }

// CreateDatabase creates database name on the primary (the standby gets it
// by replication) and returns its multi-host URL.
func (f *AutoFailover) CreateDatabase(ctx context.Context, name string) (string, error) {
	return createDatabase(ctx, f.URL, name)
}

// SyncStandbyNames returns the primary's synchronous_standby_names: what
// pg_auto_failover set for the secondary ("" when replication is async).
func (f *AutoFailover) SyncStandbyNames(ctx context.Context) (string, error) {
	c, err := pgx.Connect(ctx, f.URL("postgres"))
	if err != nil {
		return "", fmt.Errorf("testenv: %w", err)
	}
	defer c.Close(ctx)
	var s string
	if err := c.QueryRow(ctx, "SHOW synchronous_standby_names").Scan(&s); err != nil {
		return "", fmt.Errorf("testenv: %w", err)
	}
	return s, nil
}

// KillPostgres SIGKILLs node i's postmaster, as an OOM kill would; its
// pg_autoctl stays and starts it again (crash recovery), without a
// failover unless it stays down.
func (f *AutoFailover) KillPostgres(i int) error {
	b, err := os.ReadFile(filepath.Join(f.nodes[i].dir, "postmaster.pid"))
	if err != nil {
		return fmt.Errorf("testenv: %s: %w", f.nodes[i].name, err)
	}
	pid, err := strconv.Atoi(strings.TrimSpace(strings.SplitN(string(b), "\n", 2)[0]))
	if err != nil || pid <= 0 {
		return fmt.Errorf("testenv: %s: bad postmaster.pid", f.nodes[i].name)
	}
	if err := syscall.Kill(pid, syscall.SIGKILL); err != nil {
		return fmt.Errorf("testenv: kill %s's postgres: %w", f.nodes[i].name, err)
	}
	return nil
}

// KillNode SIGKILLs node i's pg_autoctl and postgres together, as a
// machine that dies: the monitor fails over to the other node once it
// finds this one unhealthy.
func (f *AutoFailover) KillNode(i int) { f.nodes[i].stop(syscall.SIGKILL) }

// StartNode runs node i's pg_autoctl again: an old primary rejoins as a
// secondary (pg_autoctl rewinds it if it must).
func (f *AutoFailover) StartNode(i int) error {
	n := f.nodes[i]
	return f.start(n, "run", "--pgdata", n.dir)
}

// PerformFailover asks the monitor for a planned failover and waits for it
// (`pg_autoctl perform failover`).
func (f *AutoFailover) PerformFailover(ctx context.Context) error {
	return f.autoctlRun(ctx, "perform", "failover", "--pgdata", f.monDir, "--wait", "120")
}

// Cut closes node i's proxy and every client connection through it: the
// node is cut off from its clients (not from the monitor or the other
// node, so no failover follows). Mend undoes it.
func (f *AutoFailover) Cut(i int) { f.nodes[i].proxy.Cut() }

// Mend lets clients reach node i again.
func (f *AutoFailover) Mend(i int) error { return f.nodes[i].proxy.Mend() }

// Close stops every process and removes the files.
func (f *AutoFailover) Close() error {
	for _, n := range f.nodes {
		if n != nil {
			n.stop(syscall.SIGTERM)
			if n.proxy != nil {
				n.proxy.Cut()
			}
		}
	}
	if f.monitorProc != nil {
		f.monitorProc.stop(syscall.SIGTERM)
	}
	if f.root != "" {
		_ = os.RemoveAll(f.root)
	}
	return nil
}

// PauseWALReceiver stops node i's WAL receiver (SIGSTOP), as a standby
// whose link stalls: it reads no WAL until release is called. A primary
// with this node as synchronous standby holds its commits meanwhile; one
// replicating asynchronously goes on committing what the standby does not
// have. release(true) kills the receiver (SIGKILL) instead of letting it
// go on, dropping the WAL still unread in its socket, as a network that
// fails with the primary loses what was on the wire; the standby restarts
// its processes and recovers what it had.
func (f *AutoFailover) PauseWALReceiver(ctx context.Context, i int) (release func(drop bool), err error) {
	c, err := pgx.Connect(ctx, f.NodeURL(i, "postgres"))
	if err != nil {
		return nil, fmt.Errorf("testenv: %w", err)
	}
	defer c.Close(ctx)
	var pid int
	if err := c.QueryRow(ctx, "SELECT pid FROM pg_stat_wal_receiver").Scan(&pid); err != nil {
		return nil, fmt.Errorf("testenv: %s's WAL receiver: %w", f.nodes[i].name, err)
	}
	if err := syscall.Kill(pid, syscall.SIGSTOP); err != nil {
		return nil, fmt.Errorf("testenv: stop %s's WAL receiver: %w", f.nodes[i].name, err)
	}
	return func(drop bool) {
		if drop {
			_ = syscall.Kill(pid, syscall.SIGKILL)
		}
		_ = syscall.Kill(pid, syscall.SIGCONT)
	}, nil
}
