package cli

import (
	"bytes"
	"context"
	"flag"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"

	"github.com/jetinbox/jetinbox/internal/testenv"
)

// writeContext writes a nats CLI context file under dir/nats/context.
func writeContext(t *testing.T, dir, name, body string) {
	t.Helper()
	d := filepath.Join(dir, "nats", "context")
	if err := os.MkdirAll(d, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(d, name+".json"), []byte(body), 0o600); err != nil {
		t.Fatal(err)
	}
}

func parseNATS(t *testing.T, env Env, args ...string) (*NATSFlags, error) {
	t.Helper()
	var n NATSFlags
	fs := flag.NewFlagSet("t", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	n.Register(fs, env)
	if err := fs.Parse(args); err != nil {
		t.Fatal(err)
	}
	return &n, n.Validate()
}

// TestNATSContextAndPrecedence: settings come from explicit flags, then the
// environment, then the nats CLI context (-context, NATS_CONTEXT, or the
// selected one in context.txt), under a temporary HOME or XDG_CONFIG_HOME.
func TestNATSContextAndPrecedence(t *testing.T) {
	t.Parallel()
	home := t.TempDir()
	cfg := filepath.Join(home, ".config")
	writeContext(t, cfg, "prod", `{"url":"nats://ctx:4222","user":"alice","password":"ctx-secret"}`)
	writeContext(t, cfg, "other", `{"url":"nats://other:4222","token":"tok"}`)
	if err := os.WriteFile(filepath.Join(cfg, "nats", "context.txt"), []byte("prod\n"), 0o600); err != nil {
		t.Fatal(err)
	}

	n, err := parseNATS(t, mapEnv(map[string]string{"HOME": home}))
	if err != nil || n.url != "nats://ctx:4222" || n.user != "alice" || n.password != "ctx-secret" || n.ctxName != "prod" {
		t.Fatalf("selected context: %+v, %v", n, err)
	}
	n, err = parseNATS(t, mapEnv(map[string]string{"HOME": home, "NATS_URL": "nats://env:4222", "NATS_CONTEXT": "other"}))
	if err != nil || n.url != "nats://env:4222" || n.token != "tok" || n.ctxName != "other" {
		t.Fatalf("env over context: %+v, %v", n, err)
	}
	n, err = parseNATS(t, mapEnv(map[string]string{"HOME": home, "NATS_URL": "nats://env:4222"}), "-s", "nats://flag:4222", "-context", "other")
	if err != nil || n.url != "nats://flag:4222" || n.token != "tok" {
		t.Fatalf("flag over env: %+v, %v", n, err)
	}
	n, err = parseNATS(t, mapEnv(map[string]string{"XDG_CONFIG_HOME": cfg}), "-server", "nats://flag:4222", "-user", "bob", "-password", "pw")
	if err != nil || n.url != "nats://flag:4222" || n.user != "bob" || n.password != "pw" {
		t.Fatalf("XDG_CONFIG_HOME and flags: %+v, %v", n, err)
	}
	if _, err := parseNATS(t, mapEnv(map[string]string{"HOME": home}), "-context", "missing"); err == nil || !strings.Contains(err.Error(), `nats context "missing"`) {
		t.Fatalf("missing context: %v", err)
	}
	if _, err := parseNATS(t, mapEnv(map[string]string{"HOME": home, "NATS_TOKEN": "t"}), "-context", "prod"); err == nil {
		t.Fatal("a token and a user/password at once were accepted")
	}
	n, err = parseNATS(t, mapEnv(nil))
	if err != nil || n.url != "nats://127.0.0.1:4222" || n.ctxName != "" {
		t.Fatalf("no HOME, no context: %+v, %v", n, err)
	}

	// The context's user and password reach the server, and the password
	// never reaches -h or the logs.
	srv := testenv.NewNATS(t, testenv.NATSOptions{Configure: func(o *server.Options) { o.Username, o.Password = "alice", "ctx-secret" }})
	writeContext(t, cfg, "local", `{"url":"`+srv.URL()+`","user":"alice","password":"ctx-secret"}`)
	env := mapEnv(map[string]string{"HOME": home, "NATS_CONTEXT": "local", "NATS_PASSWORD": "env-secret-never-shown"})
	var logs bytes.Buffer
	n, err = parseNATS(t, mapEnv(map[string]string{"HOME": home, "NATS_CONTEXT": "local"}))
	if err != nil {
		t.Fatal(err)
	}
	nc, _, err := n.Connect("t", DefaultReconnect(), slog.New(slog.NewJSONHandler(&logs, nil)))
	if err != nil {
		t.Fatalf("connect with the context's user: %v", err)
	}
	nc.Close()
	var help bytes.Buffer
	fs := NewFlagSet("t", "t", &help)
	new(NATSFlags).Register(fs, env)
	fs.Usage()
	for _, want := range []string{"-s string", "-server", "-creds", "-nkey", "-tlscert", "-tlskey", "-tlsca", "-user", "-password", "-token", "-context", "NATS_CONTEXT", "NATS_TOKEN"} {
		if !strings.Contains(help.String(), want) {
			t.Errorf("-h lacks %q", want)
		}
	}
	if out := help.String() + logs.String(); strings.Contains(out, "secret") {
		t.Errorf("a password was shown:\n%s", out)
	}
}

// TestInboxPrefix: -inbox-prefix, NATS_INBOX_PREFIX and a context's
// inbox_prefix (the nats CLI's names) set the reply subjects, in that order
// of precedence; a prefix that is not a plain subject is a usage error; and
// a user that may subscribe to its own prefix only gets its JetStream
// replies with it, and none without it.
func TestInboxPrefix(t *testing.T) {
	t.Parallel()
	home := t.TempDir()
	cfg := filepath.Join(home, ".config")
	writeContext(t, cfg, "ctx", `{"url":"nats://ctx:4222","inbox_prefix":"_INBOX_ctx"}`)
	for _, c := range []struct {
		env  map[string]string
		args []string
		want string
	}{
		{map[string]string{"HOME": home}, nil, ""},
		{map[string]string{"HOME": home, "NATS_CONTEXT": "ctx"}, nil, "_INBOX_ctx"},
		{map[string]string{"HOME": home, "NATS_CONTEXT": "ctx", "NATS_INBOX_PREFIX": "_INBOX_env"}, nil, "_INBOX_env"},
		{map[string]string{"HOME": home, "NATS_CONTEXT": "ctx", "NATS_INBOX_PREFIX": "_INBOX_env"}, []string{"-inbox-prefix", "_INBOX_flag.a"}, "_INBOX_flag.a"},
	} {
		n, err := parseNATS(t, mapEnv(c.env), c.args...)
		if err != nil || n.InboxPrefix() != c.want {
			t.Errorf("env %v, args %v: prefix %q, %v; want %q", c.env, c.args, n.InboxPrefix(), err, c.want)
		}
	}
	for _, bad := range []string{"_INBOX.>", "a.*.b", "trailing.", ".lead", "a..b", "sp ace", "tab\tx"} {
		if _, err := parseNATS(t, mapEnv(nil), "-inbox-prefix", bad); err == nil || !strings.Contains(err.Error(), "inbox prefix") {
			t.Errorf("-inbox-prefix %q: %v, want an error naming it", bad, err)
		}
	}

	srv := testenv.NewNATS(t, testenv.NATSOptions{Configure: func(o *server.Options) {
		o.Users = []*server.User{{Username: "p", Password: "pw", Permissions: &server.Permissions{
			Publish:   &server.SubjectPermission{Allow: []string{"$JS.API.INFO"}},
			Subscribe: &server.SubjectPermission{Allow: []string{"_INBOX_p.>"}},
		}}}
	}})
	for _, c := range []struct {
		prefix string
		ok     bool
	}{{"_INBOX_p", true}, {"", false}, {"_INBOX_q", false}} {
		args := []string{"-s", srv.URL(), "-user", "p", "-password", "pw"}
		if c.prefix != "" {
			args = append(args, "-inbox-prefix", c.prefix)
		}
		n, err := parseNATS(t, mapEnv(nil), args...)
		if err != nil {
			t.Fatal(err)
		}
		nc, js, err := n.Connect("t", DefaultReconnect(), slog.New(slog.DiscardHandler))
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		_, err = js.AccountInfo(ctx)
		cancel()
		nc.Close()
		if (err == nil) != c.ok {
			t.Errorf("prefix %q: account info %v, want ok=%v", c.prefix, err, c.ok)
		}
	}
}
