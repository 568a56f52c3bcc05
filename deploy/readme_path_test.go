package deploy_test

import (
	"cmp"
	"context"
	"fmt"
	"net"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/jetinbox/jetinbox/internal/testenv"
)

// readmeElsewhere are the commands of the "Running the pieces" block of
// docs/operations.md (the operator's path the root README links to) that
// TestReadmePathUnderShippedRoles does not run, and the tests that do: long
// runs with servers of their own.
var readmeElsewhere = map[string]string{
	"chaos":  "internal/chaos TestChaosSmoke",
	"bench":  "make bench-smoke and internal/bench",
	"jitter": "internal/jittersim tests",
}

// readmeRoles is who runs each command of the block, as deploy/README.md
// says: the NATS user (nkey, client certificate) and the database role.
// An empty value is no such connection: the producer never opens the
// database, migrate and accounts never dial NATS.
var readmeRoles = map[string]readmeRole{
	"migrate":  {"", "jetinbox_migrator"},
	"accounts": {"", "jetinbox_migrator"},
	"producer": {"producer", ""},
	"consumer": {"consumer", "jetinbox_consumer"},
	"relay":    {"relay", "jetinbox_relay"},
	// The operator's tools: the admin user, and the database role of
	// each one's job. verify only reads; replay does the consumer's work
	// (rolled back unless -apply); prune and dlq -redrive delete inbox
	// rows, which only the maintainer may.
	"verify": {"admin", "jetinbox_verifier"},
	"dlq":    {"admin", "jetinbox_maintainer"},
	"replay": {"admin", "jetinbox_consumer"},
	"prune":  {"admin", "jetinbox_maintainer"},
	// The HTTP intake (deploy/README.md, "The HTTP intake"): its schema as
	// the owner, the server as jetinbox_intake (postgres/intake.sql), the
	// prune of its keys as the maintainer. It talks to no NATS server.
	"intake -migrate": {"", "jetinbox_migrator"},
	"intake":          {"", "jetinbox_intake"},
	"intake -prune":   {"", "jetinbox_maintainer"},
}

type readmeRole struct{ nats, db string }

func (r readmeRole) String() string {
	return fmt.Sprintf("NATS user %s, database role %s", cmp.Or(r.nats, "-"), cmp.Or(r.db, "-"))
}

// TestReadmePathUnderShippedRoles builds the binaries and runs every command
// of the "Running the pieces" block of docs/operations.md, read from that
// file on each run, literally, on the shipped deployment: an R3 cluster from
// deploy/nats with the shipped auth.conf over mutual TLS, the streams and
// consumers the admin creates from deploy/jetstream, and a PostgreSQL set
// up from deploy/postgres (roles.sql once, grants.sql after the migrate).
// Only the export line's values change: NATS_URL names the three servers,
// DATABASE_URL keeps the README's database and sslmode with the local host
// and the role's name, and each command gets the credentials of the role
// that runs it (readmeRoles): NATS_NKEY, NATS_CERT, NATS_KEY, NATS_CA,
// NATS_INBOX_PREFIX (the role's own reply prefix), and PGPASSFILE (passwords never go into DATABASE_URL).
//
// migrate, accounts, the producer (the generated load and the README's
// JSONL example), the consumer until SIGTERM, the relay until SIGTERM,
// verify (with the chain into NOTIFICATIONS too), dlq, replay and prune
// must all run, none refused anything; /readyz answers 200 while the
// consumer runs, /healthz while the relay runs; the relay publishes every
// notification the consumer added to the outbox; verify reports every
// intent applied once and the chain clean; the consumer and the relay stop
// on SIGTERM and exit 0.
func TestReadmePathUnderShippedRoles(t *testing.T) {
	t.Parallel()
	started := time.Now()
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Minute)
	defer cancel()
	root, err := filepath.Abs("..")
	if err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(filepath.Join(root, "docs", "operations.md"))
	if err != nil {
		t.Fatal(err)
	}
	readme := string(b)
	lines := readmeBlock(t, readme, "## Running the pieces", "sh")
	jsonl := readmeBlock(t, readme, "## Running the pieces", "json")

	fsys := loadFiles(t)
	fx := fixture(t)
	defs, err := loadJetStream(fsys)
	if err != nil {
		t.Fatal(err)
	}
	work := t.TempDir()
	if err := os.WriteFile(filepath.Join(work, "intents.jsonl"), []byte(strings.Join(jsonl, "\n")), 0o600); err != nil {
		t.Fatal(err)
	}

	// PostgreSQL as deploy/README.md sets it up: roles.sql as the
	// superuser, a password per role (the ones cmd/devsecrets wrote), and a
	// pgpass file per role for this server. The schema is left to the
	// README's `jetinbox migrate`; grants.sql follows it.
	pg := startPostgres(t, fx)
	pg.superuser(t, "postgres", "CREATE DATABASE jetinbox")
	pg.superuserFile(t, "jetinbox", "postgres/roles.sql")
	passwords := map[string]string{}
	pgpass := map[string]string{}
	for _, role := range dbRoles {
		pw, err := os.ReadFile(filepath.Join(fx.dir, "postgres", role+".password"))
		if err != nil {
			t.Fatal(err)
		}
		passwords[role] = strings.TrimSpace(string(pw))
		pg.superuser(t, "jetinbox", fmt.Sprintf("ALTER ROLE %s PASSWORD '%s'", role, passwords[role]))
		pgpass[role] = filepath.Join(work, role+".pgpass")
		line := fmt.Sprintf("localhost:%d:jetinbox:%s:%s\n", pg.port, role, passwords[role])
		if err := os.WriteFile(pgpass[role], []byte(line), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	// The intake's role comes from intake.sql after its migrate (below);
	// its password and tenants file are the ones cmd/devsecrets wrote.
	if pw, err := os.ReadFile(filepath.Join(fx.dir, "postgres", "jetinbox_intake.password")); err != nil {
		t.Fatal(err)
	} else {
		passwords["jetinbox_intake"] = strings.TrimSpace(string(pw))
		pgpass["jetinbox_intake"] = filepath.Join(work, "jetinbox_intake.pgpass")
		line := fmt.Sprintf("localhost:%d:jetinbox:jetinbox_intake:%s\n", pg.port, passwords["jetinbox_intake"])
		if err := os.WriteFile(pgpass["jetinbox_intake"], []byte(line), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	if b, err := os.ReadFile(filepath.Join(fx.dir, "intake", "tenants.json")); err != nil {
		t.Fatal(err)
	} else if err := os.WriteFile(filepath.Join(work, "tenants.json"), b, 0o600); err != nil {
		t.Fatal(err)
	}

	// NATS as the operator runs it: the three nodes, then the admin applies
	// deploy/jetstream.
	urls := startNATSCluster(t, fsys, fx)
	admin := connectAs(t, urls, fx, "admin")
	adminJS, err := jetstream.New(admin.nc)
	if err != nil {
		t.Fatal(err)
	}
	applyJetStream(t, ctx, adminJS, defs)
	t.Logf("servers up and streams applied in %v", time.Since(started).Round(time.Millisecond))

	// The environment of every command: nothing of the caller's NATS,
	// PostgreSQL or jetinbox settings.
	var base []string
	for _, kv := range os.Environ() {
		k, _, _ := strings.Cut(kv, "=")
		if strings.HasPrefix(k, "NATS_") || strings.HasPrefix(k, "PG") || strings.HasPrefix(k, "JETINBOX_") || k == "DATABASE_URL" {
			continue
		}
		base = append(base, kv)
	}
	httpAddr, relayAddr, intakeHTTP := readmeFreeAddr(t), readmeFreeAddr(t), readmeFreeAddr(t)
	base = append(base, "JETINBOX_HTTP_ADDR="+httpAddr, "JETINBOX_RELAY_HTTP_ADDR="+relayAddr, "JETINBOX_INTAKE_HTTP_ADDR="+intakeHTTP, "JETINBOX_LOG_FORMAT=text")
	var dbURL *url.URL // the README's DATABASE_URL, once the export line is read
	envFor := func(name string) []string {
		t.Helper()
		role, ok := readmeRoles[name]
		if !ok {
			t.Fatalf("the README runs %q, and this test does not know which NATS user and database role run it: add it to readmeRoles", name)
		}
		if dbURL == nil {
			t.Fatalf("the README runs %s before its export line", name)
		}
		env := append([]string(nil), base...)
		if role.nats != "" {
			tls := filepath.Join(fx.dir, "tls")
			env = append(env, "NATS_URL="+urls,
				"NATS_NKEY="+filepath.Join(fx.dir, "nkeys", role.nats+".nk"),
				"NATS_CERT="+filepath.Join(tls, role.nats+".pem"),
				"NATS_KEY="+filepath.Join(tls, role.nats+"-key.pem"),
				"NATS_CA="+filepath.Join(tls, "ca.pem"))
			// The role's own reply prefix, as compose and Kubernetes set it;
			// the admin user may subscribe anywhere and keeps _INBOX.
			if p := inboxPrefix[role.nats]; p != "" {
				env = append(env, "NATS_INBOX_PREFIX="+p)
			}
		}
		if role.db != "" {
			u := *dbURL
			u.User = url.User(role.db)
			u.Host = fmt.Sprintf("localhost:%d", pg.port)
			q := u.Query()
			q.Set("sslrootcert", pg.ca)
			u.RawQuery = q.Encode()
			env = append(env, "DATABASE_URL="+u.String(), "PGPASSFILE="+pgpass[role.db])
		}
		return env
	}
	run := func(name, line string) string {
		t.Helper()
		var out []byte
		var err error
		began := time.Now()
		cctx, cancel := context.WithTimeout(ctx, 5*time.Minute)
		cmd := exec.CommandContext(cctx, "sh", "-c", line)
		cmd.Dir, cmd.Env = work, envFor(name)
		out, err = cmd.CombinedOutput()
		cancel()
		if err != nil {
			t.Fatalf("%s (as %v): %v\n%s", line, readmeRoles[name], err, lastOutputLines(string(out), 30))
		}
		if v := permissionViolations(string(out)); v != "" {
			t.Errorf("%s (as %v) was refused by the server:\n%s", line, readmeRoles[name], v)
		}
		t.Logf("%s (as %v, %v)\n%s", line, readmeRoles[name], time.Since(began).Round(time.Millisecond), lastOutputLines(string(out), 12))
		return string(out)
	}

	var consumer *exec.Cmd
	consumerOut := &testenv.SyncBuffer{}
	// The consumer's Wait result, once; exited closes after it.
	waited, exited := make(chan error, 1), make(chan struct{})
	t.Cleanup(func() {
		if consumer == nil {
			return
		}
		select {
		case <-exited:
		default:
			_ = consumer.Process.Kill()
			<-exited
		}
	})
	var relay *exec.Cmd
	relayOut := &testenv.SyncBuffer{}
	relayWaited, relayExited := make(chan error, 1), make(chan struct{})
	t.Cleanup(func() {
		if relay == nil {
			return
		}
		select {
		case <-relayExited:
		default:
			_ = relay.Process.Kill()
			<-relayExited
		}
	})
	// outboxPending counts the outbox rows not yet published, read as the
	// schema owner.
	outboxPending := func() (int, error) {
		out, err := pg.as("jetinbox_migrator", passwords["jetinbox_migrator"]).psql("-c", `SELECT count(*) FROM outbox WHERE sent_at IS NULL AND failed IS NULL`)
		if err != nil {
			return 0, fmt.Errorf("%w: %s", err, out)
		}
		return strconv.Atoi(strings.TrimSpace(out))
	}
	var produced int
	ran := map[string]bool{}
	for _, raw := range lines {
		line, _, _ := strings.Cut(raw, " #")
		line = strings.TrimSpace(line)
		if line == "" {
			continue
		}
		fields := strings.Fields(line)
		switch {
		case strings.HasPrefix(line, "go build -o bin/ "):
			// Built from the repository into the test's own bin/.
			began := time.Now()
			cmd := exec.CommandContext(ctx, "go", "build", "-o", filepath.Join(work, "bin")+"/", fields[len(fields)-1])
			cmd.Dir = root
			if out, err := cmd.CombinedOutput(); err != nil {
				t.Fatalf("%s: %v\n%s", line, err, out)
			}
			t.Logf("%s (%v)", line, time.Since(began).Round(time.Millisecond))
			ran["build"] = true
			continue
		case strings.HasPrefix(line, "export "):
			// The README's placeholders name its hosts; the test's servers
			// stand in for them, and each command's role for the user.
			m := regexp.MustCompile(`\bDATABASE_URL=('[^']*'|"[^"]*"|\S+)`).FindStringSubmatch(line)
			if m == nil || !regexp.MustCompile(`\bNATS_URL=`).MatchString(line) {
				t.Fatalf("the export line no longer sets DATABASE_URL and NATS_URL: %s", line)
			}
			dbURL, err = url.Parse(strings.Trim(m[1], `'"`))
			if err != nil {
				t.Fatalf("the export line's DATABASE_URL: %v", err)
			}
			if sslmode := dbURL.Query().Get("sslmode"); sslmode != "verify-full" {
				t.Errorf("the export line's DATABASE_URL has sslmode=%q; the shipped pg_hba.conf and deploy/README.md want verify-full", sslmode)
			}
			ran["export"] = true
			continue
		}
		name := filepath.Base(fields[0])
		if name == "jetinbox" && len(fields) > 1 {
			name = fields[1]
		}
		// The intake's one-shot modes run under other roles than its server.
		if name == "intake" && len(fields) > 2 && (fields[2] == "-migrate" || fields[2] == "-prune") {
			name += " " + fields[2]
		}
		if why, ok := readmeElsewhere[name]; ok {
			t.Logf("not run here (%s runs it): %s", why, line)
			continue
		}
		ran[name] = true
		switch name {
		case "migrate":
			run(name, line)
			// deploy/README.md: grants.sql after every migrate, as the
			// owner of the tables.
			pg.as("jetinbox_migrator", passwords["jetinbox_migrator"]).mustFile(t, "postgres/grants.sql")
		case "intake -migrate":
			run(name, line)
			// deploy/README.md: intake.sql as the superuser after it, and
			// the role's password.
			pg.superuserFile(t, "jetinbox", "postgres/intake.sql")
			pg.superuser(t, "jetinbox", fmt.Sprintf("ALTER ROLE jetinbox_intake PASSWORD '%s'", passwords["jetinbox_intake"]))
		case "intake":
			// A server until SIGTERM. Its -listen moves to a free port (the
			// README's :8080 may be taken on the test's machine); /readyz
			// (the database answers as jetinbox_intake) on both addresses.
			listen := readmeFreeAddr(t)
			l := regexp.MustCompile(`-listen \S+`).ReplaceAllString(line, "-listen "+listen)
			out := &testenv.SyncBuffer{}
			cmd := exec.Command("sh", "-c", "exec "+l)
			cmd.Dir, cmd.Env, cmd.Stdout, cmd.Stderr = work, envFor(name), out, out
			if err := cmd.Start(); err != nil {
				t.Fatal(err)
			}
			done := make(chan error, 1)
			go func() { done <- cmd.Wait() }()
			eventually(t, ctx, func() error {
				select {
				case err := <-done:
					t.Fatalf("%s (as %v) exited: %v\n%s", l, readmeRoles[name], err, lastOutputLines(out.String(), 20))
				default:
				}
				if err := httpOK("http://" + intakeHTTP + "/readyz"); err != nil {
					return err
				}
				return httpOK("http://" + listen + "/readyz")
			})
			if err := cmd.Process.Signal(syscall.SIGTERM); err != nil {
				t.Fatal(err)
			}
			select {
			case err := <-done:
				if err != nil {
					t.Fatalf("%s after SIGTERM: %v\n%s", l, err, lastOutputLines(out.String(), 20))
				}
			case <-time.After(time.Minute):
				_ = cmd.Process.Kill()
				t.Fatalf("%s did not stop within a minute of SIGTERM", l)
			}
			if strings.Contains(out.String(), "level=ERROR") {
				t.Errorf("%s (as %v) logged errors:\n%s", l, readmeRoles[name], consumerLogSummary(out.String()))
			}
			t.Logf("%s (as %v): ready, stopped on SIGTERM", l, readmeRoles[name])
		case "producer":
			run(name, line)
			n := regexp.MustCompile(`-count (\d+)`).FindStringSubmatch(line)
			if n == nil {
				t.Fatalf("the producer line has no -count: %s", line)
			}
			c, _ := strconv.Atoi(n[1])
			produced += c
			// The alternative in the comment: the README's JSONL example.
			if strings.Contains(raw, "-input intents.jsonl") {
				run(name, "bin/producer -input intents.jsonl")
				produced += len(nonEmptyLines(jsonl))
			}
		case "consumer":
			cmd := exec.Command("sh", "-c", "exec "+line)
			cmd.Dir, cmd.Env = work, envFor(name)
			cmd.Stdout, cmd.Stderr = consumerOut, consumerOut
			began := time.Now()
			if err := cmd.Start(); err != nil {
				t.Fatal(err)
			}
			consumer = cmd
			go func() { waited <- consumer.Wait(); close(exited) }()
			if err := waitApplied(ctx, adminJS, defs.intents.Name, defs.ledger.Durable, defs.advisories.Name, exited, 0); err != nil {
				t.Fatalf("%s: %v\n%s", line, err, lastOutputLines(consumerOut.String(), 30))
			}
			t.Logf("%s (as %v): applied everything in %v", line, readmeRoles[name], time.Since(began).Round(time.Millisecond))
			for _, path := range []string{"/readyz", "/healthz", "/metrics"} {
				if err := httpOK("http://" + httpAddr + path); err != nil {
					t.Errorf("consumer %s: %v", path, err)
				}
			}
		case "relay":
			if consumer == nil {
				t.Fatalf("the README runs the relay before the consumer: nothing would be in the outbox")
			}
			cmd := exec.Command("sh", "-c", "exec "+line)
			cmd.Dir, cmd.Env = work, envFor(name)
			cmd.Stdout, cmd.Stderr = relayOut, relayOut
			began := time.Now()
			if err := cmd.Start(); err != nil {
				t.Fatal(err)
			}
			relay = cmd
			go func() { relayWaited <- relay.Wait(); close(relayExited) }()
			// Every notification the consumer added is published and marked.
			eventually(t, ctx, func() error {
				select {
				case <-relayExited:
					t.Fatalf("%s stopped:\n%s", line, lastOutputLines(relayOut.String(), 30))
				default:
				}
				n, err := outboxPending()
				if err == nil && n > 0 {
					err = fmt.Errorf("%d outbox rows pending", n)
				}
				return err
			})
			notes, err := adminJS.Stream(ctx, defs.notifications.Name)
			if err != nil {
				t.Fatal(err)
			}
			info, err := notes.Info(ctx)
			if err != nil || info.State.Msgs != uint64(produced) {
				t.Fatalf("%s holds %+v (%v), want the %d notifications of the applied intents", defs.notifications.Name, info, err, produced)
			}
			t.Logf("%s (as %v): published %d notifications in %v", line, readmeRoles[name], produced, time.Since(began).Round(time.Millisecond))
			if err := httpOK("http://" + relayAddr + "/healthz"); err != nil {
				t.Errorf("relay /healthz: %v", err)
			}
		default:
			out := run(name, line)
			if name == "verify" && !regexp.MustCompile(fmt.Sprintf(`applied once +%d\b`, produced)).MatchString(out) {
				t.Errorf("verify does not report all %d intents applied once:\n%s", produced, out)
			}
			if name == "verify" && strings.Contains(line, "-next-stream") {
				ran["verify -next-stream"] = true
				for _, want := range []string{fmt.Sprintf(`applied parents +%d\b`, produced), fmt.Sprintf(`follow-ups in %s +%d\b`, defs.notifications.Name, produced), `lost +0 +ok`, `without applied parent +0 +ok`} {
					if !regexp.MustCompile(want).MatchString(out) {
						t.Errorf("verify -next-stream lacks %q:\n%s", want, out)
					}
				}
			}
		}
	}
	for _, want := range []string{"build", "export", "migrate", "accounts", "producer", "consumer", "relay", "verify", "verify -next-stream", "dlq", "replay", "prune", "intake -migrate", "intake", "intake -prune"} {
		if !ran[want] {
			t.Errorf("the README's path no longer runs %s", want)
		}
	}
	if consumer == nil || relay == nil {
		return
	}
	// SIGTERM: the relay ends its round and exits 0.
	if err := relay.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-relayWaited:
		if err != nil {
			t.Fatalf("relay after SIGTERM: %v\n%s", err, lastOutputLines(relayOut.String(), 30))
		}
	case <-time.After(time.Minute):
		t.Fatal("relay did not stop within a minute of SIGTERM")
	}
	if v := permissionViolations(relayOut.String()); v != "" {
		t.Errorf("the relay was refused by the server:\n%s", v)
	}
	t.Logf("relay log (problems and the stop):\n%s", consumerLogSummary(relayOut.String()))
	// A dead letter re-driven under the maintainer role: a poison intent is
	// rejected and dead-lettered by the running consumer, and `jetinbox dlq
	// -redrive` deletes its rejected inbox row as jetinbox_maintainer. (The
	// stream still remembers the ID for its duplicate window, so the copy
	// is dropped and reported; the row is gone either way.)
	poison, err := adminJS.Publish(ctx, "intents.ledger", []byte(`{"account":1,"amount":"five"}`), jetstream.WithMsgID("readme-poison"))
	if err != nil {
		t.Fatal(err)
	}
	if err := waitApplied(ctx, adminJS, defs.intents.Name, defs.ledger.Durable, defs.advisories.Name, exited, poison.Sequence); err != nil {
		t.Fatalf("the poison intent: %v\n%s", err, lastOutputLines(consumerOut.String(), 30))
	}
	migrator := pg.as("jetinbox_migrator", passwords["jetinbox_migrator"])
	if got := migrator.must(t, `SELECT status FROM inbox WHERE message_id = 'readme-poison'`); got != "rejected" {
		t.Fatalf("the poison intent's inbox row: %q, want rejected", got)
	}
	ran["dlq -redrive"] = true
	out := run("dlq", "bin/jetinbox dlq -redrive -id readme-poison")
	if !strings.Contains(out, "readme-poison") && !strings.Contains(out, "re-driven 1") {
		t.Errorf("dlq -redrive does not report the intent:\n%s", out)
	}
	if got := migrator.must(t, `SELECT count(*) FROM inbox WHERE message_id = 'readme-poison'`); got != "0" {
		t.Errorf("dlq -redrive as jetinbox_maintainer left the rejected row (%s rows)", got)
	}
	// SIGTERM: the consumer drains and exits 0.
	if err := consumer.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-waited:
		if err != nil || !strings.Contains(consumerOut.String(), "draining") {
			t.Fatalf("consumer after SIGTERM: %v\n%s", err, lastOutputLines(consumerOut.String(), 30))
		}
	case <-time.After(time.Minute):
		t.Fatal("consumer did not drain within a minute of SIGTERM")
	}
	if v := permissionViolations(consumerOut.String()); v != "" {
		t.Errorf("the consumer was refused by the server:\n%s", v)
	}
	t.Logf("consumer log (problems and the drain):\n%s", consumerLogSummary(consumerOut.String()))
	t.Logf("the README's path under the shipped roles: %v", time.Since(started).Round(time.Millisecond))
}

// waitApplied waits until the durable has nothing pending or unacked, and
// neither has the rescue consumer of the same name: everything published
// was applied or dead-lettered. The durable's ack floor must also reach
// atLeast (a stream sequence; 0 for none): a consumer info read between the
// PubAck and the server's count of the new message can show nothing
// pending. exited closes if the consumer stops first.
func waitApplied(ctx context.Context, js jetstream.JetStream, stream, durable, advisories string, exited <-chan struct{}, atLeast uint64) error {
	wctx, cancel := context.WithTimeout(ctx, 5*time.Minute)
	defer cancel()
	var last error
	for {
		last = func() error {
			for _, s := range []string{stream, advisories} {
				c, err := js.Consumer(wctx, s, durable)
				if err != nil {
					return err
				}
				ci := c.CachedInfo()
				if s == stream && ci.Delivered.Stream == 0 {
					return fmt.Errorf("%s/%s: nothing delivered yet", s, durable)
				}
				if s == stream && ci.AckFloor.Stream < atLeast {
					return fmt.Errorf("%s/%s: ack floor at stream sequence %d, waiting for %d", s, durable, ci.AckFloor.Stream, atLeast)
				}
				if ci.NumPending != 0 || ci.NumAckPending != 0 {
					return fmt.Errorf("%s/%s: %d pending, %d unacked", s, durable, ci.NumPending, ci.NumAckPending)
				}
			}
			return nil
		}()
		if last == nil {
			return nil
		}
		select {
		case <-exited:
			return fmt.Errorf("the consumer exited (%v)", last)
		case <-wctx.Done():
			return fmt.Errorf("not settled: %v", last)
		case <-time.After(250 * time.Millisecond):
		}
	}
}

// readmeBlock returns the lines of the first fenced block after heading.
func readmeBlock(t *testing.T, readme, heading, fence string) []string {
	t.Helper()
	i := strings.Index(readme, "\n"+heading+"\n")
	if i < 0 {
		t.Fatalf("README has no %q", heading)
	}
	rest := readme[i:]
	j := strings.Index(rest, "```"+fence+"\n")
	if j < 0 {
		t.Fatalf("no ```%s block after %q", fence, heading)
	}
	rest = rest[j+len("```"+fence+"\n"):]
	end := strings.Index(rest, "```")
	if end < 0 {
		t.Fatalf("the ```%s block after %q does not end", fence, heading)
	}
	return strings.Split(rest[:end], "\n")
}

// permissionViolations returns the lines of out that report a permissions
// violation (nats.go prints them to stderr, or the binaries log them).
func permissionViolations(out string) string {
	var v []string
	for _, l := range strings.Split(out, "\n") {
		if strings.Contains(strings.ToLower(l), "permissions violation") {
			v = append(v, l)
		}
	}
	return strings.Join(v, "\n")
}

// consumerLogSummary returns the warnings and errors of a text log, and
// the lines about draining.
func consumerLogSummary(out string) string {
	var keep []string
	for _, l := range strings.Split(out, "\n") {
		if strings.Contains(l, "level=WARN") || strings.Contains(l, "level=ERROR") || strings.Contains(l, "drain") {
			keep = append(keep, l)
		}
	}
	return strings.Join(keep, "\n")
}

func readmeFreeAddr(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().String()
}

func httpOK(url string) error {
	c := &http.Client{Timeout: 10 * time.Second}
	resp, err := c.Get(url)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("%s: %s", url, resp.Status)
	}
	return nil
}

func nonEmptyLines(lines []string) []string {
	var out []string
	for _, l := range lines {
		if strings.TrimSpace(l) != "" {
			out = append(out, l)
		}
	}
	return out
}

func lastOutputLines(s string, n int) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	return strings.Join(lines[max(0, len(lines)-n):], "\n")
}
