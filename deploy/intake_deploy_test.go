package deploy_test

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	composetypes "github.com/compose-spec/compose-go/v2/types"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/jetinbox/jetinbox/internal/testenv"
)

// TestIntakeStackUnderItsRoles runs the project's own binaries as the
// compose file declares the HTTP intake, literally (the command line and
// environment of each service, only addresses and file paths moved to the
// test's servers and to the files cmd/devsecrets wrote): a PostgreSQL server
// of its own set up with roles.sql, `jetinbox intake -migrate` as the schema
// owner (intake-migrate), intake.sql and the role's password
// (intake-db-setup), then `jetinbox intake` as jetinbox_intake over TLS with
// the generated tenants file (intake), posting with the generated token;
// `jetinbox relay` as jetinbox_relay with the producer's NATS user on the
// shipped R3 cluster (intake-relay) publishing the intent into INTENTS;
// `jetinbox intake -prune` as jetinbox_maintainer (intake-prune). Nothing is
// refused; the intake and the relay stop on SIGTERM and exit 0.
//
// Only postgres/intake.sql grants the relay the intake's outbox: the
// intake's database has no inbox, so grants.sql does not run there.
func TestIntakeStackUnderItsRoles(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	root, err := filepath.Abs("..")
	if err != nil {
		t.Fatal(err)
	}
	fsys := loadFiles(t)
	fx := fixture(t)
	defs, err := loadJetStream(fsys)
	if err != nil {
		t.Fatal(err)
	}
	p, err := loadCompose(fsys)
	if err != nil {
		t.Fatal(err)
	}
	work := t.TempDir()
	build := exec.CommandContext(ctx, "go", "build", "-o", filepath.Join(work, "bin")+"/", "./cmd/jetinbox")
	build.Dir = root
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	bin := filepath.Join(work, "bin", "jetinbox")

	// The intake's own server, as intake-postgres initialises it: roles.sql
	// and the passwords cmd/devsecrets wrote.
	pg := startPostgres(t, fx)
	pg.superuser(t, "postgres", "CREATE DATABASE jetinbox")
	pg.superuserFile(t, "jetinbox", "postgres/roles.sql")
	password := func(role string) string {
		b, err := os.ReadFile(filepath.Join(fx.dir, "postgres", role+".password"))
		if err != nil {
			t.Fatal(err)
		}
		return strings.TrimSpace(string(b))
	}
	for _, role := range dbRoles {
		pg.superuser(t, "jetinbox", fmt.Sprintf("ALTER ROLE %s PASSWORD '%s'", role, password(role)))
	}
	urls := startNATSCluster(t, fsys, fx)
	admin := connectAs(t, urls, fx, "admin")
	adminJS, err := jetstream.New(admin.nc)
	if err != nil {
		t.Fatal(err)
	}
	intents := applyJetStream(t, ctx, adminJS, defs)

	// A service's command and environment, moved to the test's servers:
	// /run/jetinbox/NAME is the file of the compose secret NAME (what
	// secrets-init copies there), written by cmd/devsecrets; the pgpass
	// file names this server; 0.0.0.0:PORT is a free loopback port.
	wd, _ := filepath.Abs(".")
	addrs := map[string]string{}
	secretFile := func(name string) string {
		s, ok := p.Secrets[name]
		if !ok {
			t.Fatalf("no compose secret %s", name)
		}
		rel, err := filepath.Rel(filepath.Join(wd, "secrets"), s.File)
		if err != nil || strings.HasPrefix(rel, "..") {
			t.Fatalf("compose secret %s is not under secrets/: %s", name, s.File)
		}
		return filepath.Join(fx.dir, rel)
	}
	move := func(v string) string {
		if strings.HasPrefix(v, "/run/jetinbox/") {
			return secretFile(strings.TrimPrefix(v, "/run/jetinbox/"))
		}
		if strings.HasPrefix(v, "0.0.0.0:") {
			if addrs[v] == "" {
				addrs[v] = readmeFreeAddr(t)
			}
			return addrs[v]
		}
		return v
	}
	service := func(name string) (args, env []string) {
		t.Helper()
		s, ok := p.Services[name]
		if !ok {
			t.Fatalf("compose.yaml has no service %s", name)
		}
		if len(s.Entrypoint) != 1 || s.Entrypoint[0] != "/usr/local/bin/jetinbox" {
			t.Fatalf("%s: entrypoint %v, want /usr/local/bin/jetinbox", name, s.Entrypoint)
		}
		for _, a := range s.Command {
			args = append(args, move(a))
		}
		for _, kv := range os.Environ() {
			k, _, _ := strings.Cut(kv, "=")
			if !strings.HasPrefix(k, "NATS_") && !strings.HasPrefix(k, "PG") && !strings.HasPrefix(k, "JETINBOX_") && k != "DATABASE_URL" {
				env = append(env, kv)
			}
		}
		env = append(env, "JETINBOX_LOG_FORMAT=text")
		var role string
		for k, v := range s.Environment {
			val := *v
			switch k {
			case "DATABASE_URL":
				u, err := url.Parse(val)
				if err != nil || u.User == nil {
					t.Fatalf("%s: DATABASE_URL %q", name, val)
				}
				role = u.User.Username()
				u.Host = fmt.Sprintf("localhost:%d", pg.port)
				q := u.Query()
				q.Set("sslrootcert", pg.ca)
				u.RawQuery = q.Encode()
				val = u.String()
			case "PGPASSFILE":
				continue // below, once the role is known
			case "NATS_URL":
				val = urls
			default:
				val = move(val)
			}
			env = append(env, k+"="+val)
		}
		if role != "" {
			f := filepath.Join(work, name+".pgpass")
			if err := os.WriteFile(f, fmt.Appendf(nil, "localhost:%d:jetinbox:%s:%s\n", pg.port, role, password(role)), 0o600); err != nil {
				t.Fatal(err)
			}
			env = append(env, "PGPASSFILE="+f)
		}
		return args, env
	}
	run := func(name string) string {
		t.Helper()
		args, env := service(name)
		cmd := exec.CommandContext(ctx, bin, args...)
		cmd.Env = env
		out, err := cmd.CombinedOutput()
		if err != nil {
			t.Fatalf("%s (jetinbox %s): %v\n%s", name, strings.Join(args, " "), err, out)
		}
		t.Logf("%s: jetinbox %s\n%s", name, strings.Join(args, " "), lastOutputLines(string(out), 5))
		return string(out)
	}
	type proc struct {
		cmd    *exec.Cmd
		out    *testenv.SyncBuffer
		waited chan error
	}
	start := func(name string) *proc {
		t.Helper()
		args, env := service(name)
		pr := &proc{cmd: exec.Command(bin, args...), out: &testenv.SyncBuffer{}, waited: make(chan error, 1)}
		pr.cmd.Env, pr.cmd.Stdout, pr.cmd.Stderr = env, pr.out, pr.out
		if err := pr.cmd.Start(); err != nil {
			t.Fatal(err)
		}
		go func() { pr.waited <- pr.cmd.Wait() }()
		t.Cleanup(func() {
			_ = pr.cmd.Process.Kill()
		})
		t.Logf("%s: jetinbox %s", name, strings.Join(args, " "))
		return pr
	}
	stop := func(name string, pr *proc) {
		t.Helper()
		if err := pr.cmd.Process.Signal(syscall.SIGTERM); err != nil {
			t.Fatal(err)
		}
		select {
		case err := <-pr.waited:
			if err != nil {
				t.Errorf("%s after SIGTERM: %v\n%s", name, err, lastOutputLines(pr.out.String(), 20))
			}
		case <-time.After(time.Minute):
			t.Errorf("%s did not stop within a minute of SIGTERM", name)
		}
		if v := permissionViolations(pr.out.String()); v != "" || strings.Contains(pr.out.String(), "permission denied") {
			t.Errorf("%s was refused:\n%s", name, lastOutputLines(pr.out.String(), 20))
		}
	}

	// intake-migrate, then intake-db-setup's work: intake.sql as the
	// superuser and the role's password.
	run("intake-migrate")
	if !waitedFor(p.Services["intake-db-setup"], "intake-migrate") {
		t.Fatal("intake-db-setup does not wait for intake-migrate")
	}
	pg.superuserFile(t, "jetinbox", "postgres/intake.sql")
	pg.superuser(t, "jetinbox", fmt.Sprintf("ALTER ROLE jetinbox_intake PASSWORD '%s'", password("jetinbox_intake")))

	intake := start("intake")
	listen, metrics := addrs["0.0.0.0:8443"], addrs["0.0.0.0:9093"]
	if listen == "" || metrics == "" {
		t.Fatalf("the intake's command no longer listens on 0.0.0.0:8443 and 0.0.0.0:9093: %v", p.Services["intake"].Command)
	}
	caPEM, err := os.ReadFile(filepath.Join(fx.dir, "tls", "ca.pem"))
	if err != nil {
		t.Fatal(err)
	}
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(caPEM)
	_, port, _ := net.SplitHostPort(listen)
	base := "https://localhost:" + port
	client := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS12}}}
	eventually(t, ctx, func() error {
		select {
		case err := <-intake.waited:
			t.Fatalf("intake exited: %v\n%s", err, lastOutputLines(intake.out.String(), 20))
		default:
		}
		if err := httpOK("http://" + metrics + "/readyz"); err != nil {
			return err
		}
		resp, err := client.Get(base + "/readyz")
		if err != nil {
			return err
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			return fmt.Errorf("/readyz over TLS: %s", resp.Status)
		}
		return nil
	})
	token, err := os.ReadFile(filepath.Join(fx.dir, "intake", "token"))
	if err != nil {
		t.Fatal(err)
	}
	do := func(method, path, key, body string) (*http.Response, string) {
		t.Helper()
		req, err := http.NewRequestWithContext(ctx, method, base+path, strings.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		req.Header.Set("Authorization", "Bearer "+string(token))
		if key != "" {
			req.Header.Set("Idempotency-Key", key)
		}
		resp, err := client.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp, string(b)
	}
	const body = `{"subject": "intents.ledger", "payload": {"account": 7, "amount": 500}}`
	resp, out := do(http.MethodPost, "/v1/intents", `"order-1042"`, body)
	if resp.StatusCode != http.StatusAccepted {
		t.Fatalf("POST as the generated tenant: %s %s\n%s", resp.Status, out, lastOutputLines(intake.out.String(), 20))
	}
	var accepted struct {
		ID string `json:"id"`
	}
	if err := json.Unmarshal([]byte(out), &accepted); err != nil || !strings.HasPrefix(accepted.ID, "idem:") {
		t.Fatalf("POST answered %s (%v)", out, err)
	}
	if resp, out := do(http.MethodPost, "/v1/intents", `"order-1042"`, body); resp.StatusCode != http.StatusAccepted || resp.Header.Get("Idempotent-Replayed") != "true" {
		t.Fatalf("the retry: %s %v %s", resp.Status, resp.Header, out)
	}
	if resp, out := do(http.MethodPost, "/v1/intents", `"order-1042"`, strings.Replace(body, "500", "501", 1)); resp.StatusCode != http.StatusUnprocessableEntity {
		t.Fatalf("another body under the key: %s %s", resp.Status, out)
	}

	// intake-relay: the producer's NATS user, jetinbox_relay on this server.
	relay := start("intake-relay")
	eventually(t, ctx, func() error {
		select {
		case err := <-relay.waited:
			t.Fatalf("intake-relay exited: %v\n%s", err, lastOutputLines(relay.out.String(), 20))
		default:
		}
		m, err := intents.GetLastMsgForSubject(ctx, "intents.ledger")
		if err != nil {
			return fmt.Errorf("INTENTS: %w (relay: %s)", err, lastOutputLines(relay.out.String(), 3))
		}
		if got := m.Header.Get(jetstream.MsgIDHeader); got != accepted.ID {
			return fmt.Errorf("INTENTS' last intent has Nats-Msg-Id %q, want %q", got, accepted.ID)
		}
		_, state := do(http.MethodGet, "/v1/intents/order-1042", "", "")
		if !strings.Contains(state, `"state":"published"`) {
			return fmt.Errorf("the intent's state: %s", state)
		}
		return nil
	})
	if info, err := intents.Info(ctx); err != nil || info.State.Msgs != 1 {
		t.Fatalf("INTENTS holds %+v (%v), want the one intent", info, err)
	}

	run("intake-prune")
	stop("intake-relay", relay)
	stop("intake", intake)
}

// waitedFor reports whether s waits for the service dep to complete.
func waitedFor(s composetypes.ServiceConfig, dep string) bool {
	return s.DependsOn[dep].Condition == composetypes.ServiceConditionCompletedSuccessfully
}
