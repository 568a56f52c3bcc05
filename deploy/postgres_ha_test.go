package deploy_test

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"io/fs"
	"net/url"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/jetinbox/jetinbox/internal/testenv"
	"github.com/jetinbox/jetinbox/internal/testenv/natsenv"
)

// TestPostgresHAFiles runs deploy/postgres/ha as an operator would on three
// hosts, here on loopback in temp dirs as the postgres user: pgaf.sh's
// monitor step, then its node step on each of two data nodes (each
// followed by the `pg_autoctl run` a service manager would start), its
// roles step on the primary and its userlist step, then a pgbouncer per
// node with the shipped pgbouncer.ini (paths and ports moved into the
// test's dirs, TLS from the development certificates). Through the
// DATABASE_URL the ini's header names (both poolers,
// target_session_attrs=read-write) the project's own binaries run:
// migrate, accounts, a consumer applying a few hundred intents with
// follow-ups, and verify, which must find every intent applied once; then
// the relay, its rows through the poolers and its LISTEN on the ini's
// direct JETINBOX_LISTEN_DATABASE_URL, must send every notification the
// consumer added. The formation must replicate synchronously: the primary
// names the standby in synchronous_standby_names, pg_stat_replication has
// it as a synchronous (or quorum) standby, and synchronous_commit is on.
func TestPostgresHAFiles(t *testing.T) {
	t.Parallel()
	started := time.Now()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	autoctl, err := exec.LookPath("pg_autoctl")
	if err != nil {
		t.Fatalf("pg_autoctl not found: install Debian's postgresql-15-auto-failover pg-auto-failover-cli (%v)", err)
	}
	pgBin := os.Getenv("JETINBOX_PG_AUTOCTL_BIN")
	if pgBin == "" {
		pgBin = "/usr/lib/postgresql/15/bin"
	}
	bouncer, err := exec.LookPath("pgbouncer")
	if err != nil {
		bouncer = "/usr/sbin/pgbouncer"
		if _, err := os.Stat(bouncer); err != nil {
			t.Fatal("pgbouncer not found: install Debian's pgbouncer")
		}
	}
	fx := fixture(t)
	var cred *syscall.Credential
	uid, gid := os.Getuid(), os.Getgid()
	if os.Geteuid() == 0 {
		// PostgreSQL, pg_autoctl and pgbouncer refuse to run as root.
		u, err := user.Lookup("postgres")
		if err != nil {
			t.Fatalf("running as root needs a postgres user: %v", err)
		}
		uid, _ = strconv.Atoi(u.Uid)
		gid, _ = strconv.Atoi(u.Gid)
		cred = &syscall.Credential{Uid: uint32(uid), Gid: uint32(gid)}
	}
	// A short root: Unix socket paths are limited to about 100 bytes.
	root, err := os.MkdirTemp("", "jetinbox-ha-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(root) })

	// The shipped files, where the postgres user may read them.
	copyFile := func(src, dst string, mode os.FileMode) {
		t.Helper()
		b, err := os.ReadFile(src)
		if err != nil {
			t.Fatal(err)
		}
		if err := os.MkdirAll(filepath.Dir(dst), 0o700); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(dst, b, mode); err != nil {
			t.Fatal(err)
		}
	}
	sqlDir := filepath.Join(root, "sql")
	for _, f := range []string{"roles.sql", "postgresql.conf.snippet", "ha/pgaf.sh"} {
		copyFile(filepath.Join("postgres", f), filepath.Join(sqlDir, f), 0o700)
	}
	// Passwords: the formation's own two logins, and the project's roles
	// (the ones cmd/devsecrets wrote).
	secrets := filepath.Join(root, "secrets")
	passwords := map[string]string{}
	for _, role := range []string{"autoctl_node", "pgautofailover_replicator"} {
		b := make([]byte, 16)
		_, _ = rand.Read(b)
		passwords[role] = hex.EncodeToString(b)
	}
	for _, role := range dbRoles {
		pw, err := os.ReadFile(filepath.Join(fx.dir, "postgres", role+".password"))
		if err != nil {
			t.Fatal(err)
		}
		passwords[role] = strings.TrimSpace(string(pw))
	}
	for role, pw := range passwords {
		if err := os.MkdirAll(secrets, 0o700); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(secrets, role+".password"), []byte(pw+"\n"), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	// Every host's certificate: the development one, for 127.0.0.1.
	tlsDir := filepath.Join(root, "tls")
	for src, dst := range map[string]string{"postgres.pem": "server.crt", "postgres-key.pem": "server.key", "ca.pem": "ca.crt"} {
		copyFile(filepath.Join(fx.dir, "tls", src), filepath.Join(tlsDir, dst), 0o600)
	}
	if err := filepath.WalkDir(root, func(path string, _ fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		return os.Lchown(path, uid, gid)
	}); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(root, 0o700); err != nil {
		t.Fatal(err)
	}

	env := []string{"PATH=" + pgBin + ":" + filepath.Dir(autoctl) + ":/usr/bin:/bin", "HOME=" + root, "TMPDIR=" + root, "LANG=C.UTF-8",
		"XDG_CONFIG_HOME=" + filepath.Join(root, "config"), "XDG_DATA_HOME=" + filepath.Join(root, "data"), "XDG_RUNTIME_DIR=" + filepath.Join(root, "run"),
		"PGAF_SECRETS=" + secrets, "PGAF_SQL_DIR=" + sqlDir, "PGAF_HOSTNAME=127.0.0.1", "PGAF_LISTEN=127.0.0.1", "PGAF_CLIENTS=127.0.0.1/32",
		"PGAF_SSL_CA_FILE=" + filepath.Join(tlsDir, "ca.crt"), "PGAF_SSL_CERT=" + filepath.Join(tlsDir, "server.crt"), "PGAF_SSL_KEY=" + filepath.Join(tlsDir, "server.key")}
	command := func(ctx context.Context, extra []string, name string, args ...string) *exec.Cmd {
		cmd := exec.CommandContext(ctx, name, args...)
		cmd.Env = append(append([]string(nil), env...), extra...)
		cmd.Dir = root
		cmd.SysProcAttr = &syscall.SysProcAttr{Credential: cred, Setpgid: true}
		return cmd
	}
	step := func(name string, extra ...string) string {
		t.Helper()
		began := time.Now()
		sctx, cancel := context.WithTimeout(ctx, 3*time.Minute)
		defer cancel()
		out, err := command(sctx, extra, "sh", filepath.Join(sqlDir, "ha", "pgaf.sh"), name).CombinedOutput()
		if err != nil {
			t.Fatalf("pgaf.sh %s %v: %v\n%s", name, extra, err, lastOutputLines(string(out), 40))
		}
		t.Logf("pgaf.sh %s %v (%v)", name, extra, time.Since(began).Round(time.Millisecond))
		return string(out)
	}
	// background starts a long-running process as the service manager
	// would, and stops it (SIGTERM, then SIGKILL of its group) at the end.
	background := func(name string, args ...string) *testenv.SyncBuffer {
		t.Helper()
		out := &testenv.SyncBuffer{}
		cmd := command(context.Background(), nil, name, args...)
		cmd.Stdout, cmd.Stderr = out, out
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		done := make(chan struct{})
		go func() { _ = cmd.Wait(); close(done) }()
		t.Cleanup(func() {
			_ = cmd.Process.Signal(syscall.SIGTERM)
			select {
			case <-done:
			case <-time.After(30 * time.Second):
			}
			_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
			<-done
			if t.Failed() {
				t.Logf("%s %v, last lines:\n%s", name, args, lastOutputLines(out.String(), 20))
			}
		})
		return out
	}
	// local runs SQL as the postgres user over pgdata's socket.
	local := func(pgdata string, port int, db, sql string) (string, error) {
		pid, err := os.ReadFile(filepath.Join(pgdata, "postmaster.pid"))
		if err != nil {
			return "", err
		}
		lines := strings.Split(string(pid), "\n")
		if len(lines) < 5 {
			return "", fmt.Errorf("short postmaster.pid")
		}
		out, err := command(ctx, nil, "psql", "-X", "-At", "-v", "ON_ERROR_STOP=1", "-h", lines[4], "-p", strconv.Itoa(port), "-d", db, "-c", sql).CombinedOutput()
		return strings.TrimSpace(string(out)), err
	}
	ports := freePorts(t, 5)
	monPort, nodePorts, bouncerPorts := ports[0], ports[1:3], ports[3:5]
	monDir := filepath.Join(root, "monitor")
	states := func() string {
		s, _ := local(monDir, monPort, "pg_auto_failover", `SELECT string_agg(nodename || ':' || reportedstate || '/' || goalstate, ',' ORDER BY nodeid) FROM pgautofailover.node`)
		return s
	}
	waitStates := func(want string) {
		t.Helper()
		deadline := time.Now().Add(3 * time.Minute)
		for states() != want {
			if time.Now().After(deadline) {
				t.Fatalf("the formation is %q, not %q, after 3 minutes", states(), want)
			}
			time.Sleep(200 * time.Millisecond)
		}
	}

	step("monitor", "PGDATA="+monDir, fmt.Sprintf("PGPORT=%d", monPort))
	background(autoctl, "run", "--pgdata", monDir)
	var nodeDirs []string
	for i, want := range []string{"node1:single/single", "node1:primary/primary,node2:secondary/secondary"} {
		dir := filepath.Join(root, fmt.Sprintf("node%d", i+1))
		nodeDirs = append(nodeDirs, dir)
		step("node", "PGDATA="+dir, fmt.Sprintf("PGPORT=%d", nodePorts[i]), fmt.Sprintf("PGAF_NAME=node%d", i+1),
			"PGAF_MONITOR_HOST=127.0.0.1", fmt.Sprintf("PGAF_MONITOR_PORT=%d", monPort))
		background(autoctl, "run", "--pgdata", dir)
		waitStates(want)
	}
	t.Logf("formation up in %v: %s", time.Since(started).Round(time.Millisecond), states())

	// Synchronous: pg_auto_failover named the standby, and the primary
	// waits for it.
	if s, err := local(nodeDirs[0], nodePorts[0], "postgres", "SHOW synchronous_standby_names"); err != nil || s == "" {
		t.Errorf("the primary's synchronous_standby_names = %q (%v), want the standby named", s, err)
	}
	if s, err := local(nodeDirs[0], nodePorts[0], "postgres", "SELECT string_agg(sync_state, ',') FROM pg_stat_replication"); err != nil || (s != "sync" && s != "quorum") {
		t.Errorf("the primary's standbys replicate %q (%v), want one sync or quorum", s, err)
	}
	if s, err := local(nodeDirs[0], nodePorts[0], "postgres", "SHOW synchronous_commit"); err != nil || s != "on" {
		t.Errorf("the primary's synchronous_commit = %q (%v), want on", s, err)
	}

	if s := func() string {
		s, _ := local(monDir, monPort, "pg_auto_failover", `SELECT (SELECT number_sync_standbys FROM pgautofailover.formation WHERE formationid = 'default') || '/' || bool_and(replicationquorum) FROM pgautofailover.node`)
		return s
	}(); s != "0/true" {
		t.Errorf("the monitor has number_sync_standbys/replication quorum %q, want 0/true", s)
	}

	step("roles", "PGDATA="+nodeDirs[0], fmt.Sprintf("PGPORT=%d", nodePorts[0]))
	userlist := step("userlist", "PGDATA="+nodeDirs[0], fmt.Sprintf("PGPORT=%d", nodePorts[0]))
	if n := strings.Count(userlist, "SCRAM-SHA-256$"); n != len(dbRoles) {
		t.Fatalf("pgaf.sh userlist wrote %d SCRAM secrets, want %d:\n%s", n, len(dbRoles), userlist)
	}

	// A pgbouncer per node, with the shipped ini.
	ini, err := os.ReadFile("postgres/ha/pgbouncer.ini")
	if err != nil {
		t.Fatal(err)
	}
	for i := range nodeDirs {
		dir := filepath.Join(root, fmt.Sprintf("pgb%d", i+1))
		body := string(ini)
		for _, r := range [][2]string{
			{"port=5432", fmt.Sprintf("port=%d", nodePorts[i])},
			{"listen_addr = *", "listen_addr = 127.0.0.1"},
			{"listen_port = 6432", fmt.Sprintf("listen_port = %d", bouncerPorts[i])},
			{"/var/run/postgresql/pgbouncer.pid", filepath.Join(dir, "pgbouncer.pid")},
			{"/var/run/postgresql", dir},
			{"/var/log/postgresql/pgbouncer.log", filepath.Join(dir, "pgbouncer.log")},
			{"/etc/pgbouncer/userlist.txt", filepath.Join(dir, "userlist.txt")},
			{"/etc/postgresql/tls/", tlsDir + "/"},
		} {
			if !strings.Contains(body, r[0]) {
				t.Fatalf("postgres/ha/pgbouncer.ini no longer has %q: this test moves it into its own dirs", r[0])
			}
			body = strings.ReplaceAll(body, r[0], r[1])
		}
		if err := os.MkdirAll(dir, 0o700); err != nil {
			t.Fatal(err)
		}
		for name, b := range map[string]string{"pgbouncer.ini": body, "userlist.txt": userlist} {
			if err := os.WriteFile(filepath.Join(dir, name), []byte(b), 0o600); err != nil {
				t.Fatal(err)
			}
		}
		for _, p := range []string{dir, filepath.Join(dir, "pgbouncer.ini"), filepath.Join(dir, "userlist.txt")} {
			if err := os.Lchown(p, uid, gid); err != nil {
				t.Fatal(err)
			}
		}
		background(bouncer, filepath.Join(dir, "pgbouncer.ini"))
	}

	// The project's binaries, with the ini's DATABASE_URL: both poolers.
	work := t.TempDir()
	build := exec.CommandContext(ctx, "go", "build", "-o", filepath.Join(work, "bin")+"/", "./cmd/jetinbox", "./cmd/producer", "./cmd/consumer")
	build.Dir = ".."
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	m := regexp.MustCompile(`DATABASE_URL='([^']*)'`).FindStringSubmatch(string(ini))
	if m == nil {
		t.Fatal("postgres/ha/pgbouncer.ini no longer names the consumer's DATABASE_URL")
	}
	shipped, err := url.Parse(m[1])
	if err != nil {
		t.Fatal(err)
	}
	if q := shipped.Query(); q.Get("target_session_attrs") != "read-write" || q.Get("sslmode") != "verify-full" || !strings.Contains(shipped.Host, ",") {
		t.Errorf("the shipped DATABASE_URL %s must name both poolers with target_session_attrs=read-write and sslmode=verify-full", m[1])
	}
	pgpass := filepath.Join(work, "pgpass")
	var lines []string
	for _, role := range dbRoles {
		lines = append(lines, fmt.Sprintf("127.0.0.1:*:jetinbox:%s:%s", role, passwords[role]))
	}
	if err := os.WriteFile(pgpass, []byte(strings.Join(lines, "\n")+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	nats := natsenv.NewNATS(t, natsenv.NATSOptions{})
	dbURL := func(role string) string {
		u := *shipped
		u.User = url.User(role)
		u.Host = fmt.Sprintf("127.0.0.1:%d,127.0.0.1:%d", bouncerPorts[0], bouncerPorts[1])
		q := u.Query()
		q.Set("sslrootcert", filepath.Join(fx.dir, "tls", "ca.pem"))
		if role == "jetinbox_verifier" {
			// As the ini says: the verifier's sessions are read-only.
			q.Set("target_session_attrs", "primary")
		}
		u.RawQuery = q.Encode()
		return u.String()
	}
	jenv := func(role string) []string {
		var e []string
		for _, kv := range os.Environ() {
			k, _, _ := strings.Cut(kv, "=")
			if strings.HasPrefix(k, "NATS_") || strings.HasPrefix(k, "PG") || strings.HasPrefix(k, "JETINBOX_") || k == "DATABASE_URL" {
				continue
			}
			e = append(e, kv)
		}
		return append(e, "NATS_URL="+nats.URL(), "DATABASE_URL="+dbURL(role), "PGPASSFILE="+pgpass, "JETINBOX_LOG_FORMAT=text",
			"JETINBOX_HTTP_ADDR="+readmeFreeAddr(t))
	}
	jrun := func(role string, args ...string) (string, error) {
		cctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
		defer cancel()
		cmd := exec.CommandContext(cctx, filepath.Join(work, "bin", args[0]), args[1:]...)
		cmd.Env, cmd.Dir = jenv(role), work
		out, err := cmd.CombinedOutput()
		return string(out), err
	}
	mustRun := func(role string, args ...string) string {
		t.Helper()
		out, err := jrun(role, args...)
		if err != nil {
			t.Fatalf("%v as %s: %v\n%s", args, role, err, lastOutputLines(out, 30))
		}
		return out
	}
	mustRun("jetinbox_migrator", "jetinbox", "migrate")
	// grants.sql after the migrate, as the owner of the tables, through
	// the poolers like everything else.
	copyFile("postgres/grants.sql", filepath.Join(work, "grants.sql"), 0o600)
	psql := exec.CommandContext(ctx, filepath.Join(pgBin, "psql"), "-X", "-q", "-v", "ON_ERROR_STOP=1", "-f", filepath.Join(work, "grants.sql"), dbURL("jetinbox_migrator"))
	psql.Env = jenv("jetinbox_migrator")
	if out, err := psql.CombinedOutput(); err != nil {
		t.Fatalf("grants.sql: %v\n%s", err, out)
	}
	mustRun("jetinbox_migrator", "jetinbox", "accounts", "-open", "1-16")
	const intents = 300
	mustRun("", "producer", "-count", strconv.Itoa(intents), "-accounts", "16")

	consumerOut := &testenv.SyncBuffer{}
	// As docs/operations.md runs it: each credit adds a notification to
	// the outbox, for the relay below.
	consumer := exec.Command(filepath.Join(work, "bin", "consumer"), "-follow-ups", "notifications")
	consumer.Env, consumer.Dir = jenv("jetinbox_consumer"), work
	consumer.Stdout, consumer.Stderr = consumerOut, consumerOut
	if err := consumer.Start(); err != nil {
		t.Fatal(err)
	}
	waited := make(chan error, 1)
	go func() { waited <- consumer.Wait() }()
	t.Cleanup(func() { _ = consumer.Process.Kill() })
	deadline := time.Now().Add(3 * time.Minute)
	var verify string
	for {
		out, err := jrun("jetinbox_verifier", "jetinbox", "verify")
		verify = out
		if err == nil && regexp.MustCompile(fmt.Sprintf(`applied once +%d\b`, intents)).MatchString(out) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("verify through the poolers never found all %d intents applied once: %v\n%s\nconsumer:\n%s", intents, err, out, lastOutputLines(consumerOut.String(), 30))
		}
		select {
		case err := <-waited:
			t.Fatalf("the consumer stopped: %v\n%s", err, lastOutputLines(consumerOut.String(), 30))
		case <-time.After(time.Second):
		}
	}
	t.Logf("verify through the poolers:\n%s", verify)
	if !strings.Contains(consumerOut.String(), "connection pooler answers") {
		t.Errorf("the consumer did not find the pooler in front of the server:\n%s", lastOutputLines(consumerOut.String(), 20))
	}
	if v := permissionViolations(consumerOut.String()); v != "" {
		t.Errorf("the consumer was refused by the server:\n%s", v)
	}
	_ = consumer.Process.Signal(syscall.SIGTERM)
	select {
	case err := <-waited:
		if err != nil {
			t.Errorf("consumer after SIGTERM: %v\n%s", err, lastOutputLines(consumerOut.String(), 30))
		}
	case <-time.After(time.Minute):
		t.Error("the consumer did not drain within a minute of SIGTERM")
	}
	// The relay: its rows through the poolers, its LISTEN on the direct URL
	// the ini names, to the nodes themselves.
	lm := regexp.MustCompile(`JETINBOX_LISTEN_DATABASE_URL='([^']*)'`).FindStringSubmatch(string(ini))
	if lm == nil {
		t.Fatal("postgres/ha/pgbouncer.ini no longer names the relay's JETINBOX_LISTEN_DATABASE_URL")
	}
	listen, err := url.Parse(lm[1])
	if err != nil {
		t.Fatal(err)
	}
	listen.Host = fmt.Sprintf("127.0.0.1:%d,127.0.0.1:%d", nodePorts[0], nodePorts[1])
	lq := listen.Query()
	lq.Set("sslrootcert", filepath.Join(fx.dir, "tls", "ca.pem"))
	listen.RawQuery = lq.Encode()
	relayOut := &testenv.SyncBuffer{}
	relay := exec.Command(filepath.Join(work, "bin", "jetinbox"), "relay", "-create-stream", "notifications")
	relay.Env, relay.Dir = append(jenv("jetinbox_relay"), "JETINBOX_LISTEN_DATABASE_URL="+listen.String()), work
	relay.Stdout, relay.Stderr = relayOut, relayOut
	if err := relay.Start(); err != nil {
		t.Fatal(err)
	}
	relayDone := make(chan error, 1)
	go func() { relayDone <- relay.Wait() }()
	t.Cleanup(func() { _ = relay.Process.Kill() })
	deadline = time.Now().Add(2 * time.Minute)
	for {
		n, err := local(nodeDirs[0], nodePorts[0], "jetinbox", `SELECT count(*) FILTER (WHERE sent_at IS NOT NULL) || '/' || count(*) FROM jetinbox.outbox`)
		if err == nil && n == fmt.Sprintf("%d/%d", intents, intents) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the relay sent %s outbox rows, want all of the %d notifications (%v):\n%s", n, intents, err, lastOutputLines(relayOut.String(), 30))
		}
		select {
		case err := <-relayDone:
			t.Fatalf("the relay stopped: %v\n%s", err, lastOutputLines(relayOut.String(), 30))
		case <-time.After(500 * time.Millisecond):
		}
	}
	_ = relay.Process.Signal(syscall.SIGTERM)
	select {
	case err := <-relayDone:
		if err != nil {
			t.Errorf("relay after SIGTERM: %v\n%s", err, lastOutputLines(relayOut.String(), 30))
		}
	case <-time.After(time.Minute):
		t.Error("the relay did not stop within a minute of SIGTERM")
	}
	t.Logf("the shipped HA topology, set up and used: %v", time.Since(started).Round(time.Millisecond))
}
