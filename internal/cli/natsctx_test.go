package cli

import (
	"bytes"
	"context"
	"flag"
	"io"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"

	"github.com/jetinbox/jetinbox/internal/testenv/natsenv"
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
	srv := natsenv.NewNATS(t, natsenv.NATSOptions{Configure: func(o *server.Options) { o.Username, o.Password = "alice", "ctx-secret" }})
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

	srv := natsenv.NewNATS(t, natsenv.NATSOptions{Configure: func(o *server.Options) {
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

// TestNATSContextConnectionFields: a context's jetstream_domain reaches
// JetStream (a wrong domain finds no stream API, the right one does), a
// socks_proxy carries the connection (through a SOCKS5 server that counts
// what it relayed), and the settings jetinbox cannot honour (nsc lookups,
// an event prefix, Windows certificate stores) are refused by name.
func TestNATSContextConnectionFields(t *testing.T) {
	t.Parallel()
	srv := natsenv.NewNATS(t, natsenv.NATSOptions{Configure: func(o *server.Options) { o.JetStreamDomain = "hub" }})
	home := t.TempDir()
	cfg := filepath.Join(home, ".config")
	log := slog.New(slog.DiscardHandler)
	accountInfo := func(n *NATSFlags) error {
		nc, js, err := n.Connect("t", DefaultReconnect(), log)
		if err != nil {
			return err
		}
		defer nc.Close()
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		_, err = js.AccountInfo(ctx)
		return err
	}

	writeContext(t, cfg, "hub", `{"url":"`+srv.URL()+`","jetstream_domain":"hub"}`)
	writeContext(t, cfg, "elsewhere", `{"url":"`+srv.URL()+`","jetstream_domain":"elsewhere"}`)
	n, err := parseNATS(t, mapEnv(map[string]string{"HOME": home}), "-context", "hub")
	if err != nil || n.jsDomain != "hub" {
		t.Fatalf("context hub: %+v, %v", n, err)
	}
	if err := accountInfo(n); err != nil {
		t.Fatalf("JetStream in the context's domain: %v", err)
	}
	n, err = parseNATS(t, mapEnv(map[string]string{"HOME": home}), "-context", "elsewhere")
	if err != nil {
		t.Fatal(err)
	}
	if err := accountInfo(n); err == nil {
		t.Fatal("a wrong JetStream domain still reached JetStream: the domain is not applied")
	}
	n, err = parseNATS(t, mapEnv(map[string]string{"HOME": home, "NATS_JS_DOMAIN": "hub"}), "-context", "elsewhere")
	if err != nil || n.jsDomain != "hub" || accountInfo(n) != nil {
		t.Fatalf("NATS_JS_DOMAIN over the context: %+v, %v", n, err)
	}

	proxyAddr, relayed := socks5Server(t)
	writeContext(t, cfg, "proxied", `{"url":"`+srv.URL()+`","socks_proxy":"socks5://`+proxyAddr+`"}`)
	n, err = parseNATS(t, mapEnv(map[string]string{"HOME": home}), "-context", "proxied")
	if err != nil {
		t.Fatal(err)
	}
	if err := accountInfo(n); err != nil {
		t.Fatalf("through the SOCKS proxy: %v", err)
	}
	if relayed.Load() == 0 {
		t.Fatal("connected without going through the context's SOCKS proxy")
	}
	if _, err := parseNATS(t, mapEnv(map[string]string{"HOME": home, "NATS_SOCKS_PROXY": "http://x:1"})); err == nil {
		t.Fatal("an http:// SOCKS proxy was accepted")
	}

	for body, want := range map[string]string{
		`{"url":"nats://x:4222","nsc":"nsc://op/acc/user"}`:                 "nsc generate creds",
		`{"url":"nats://x:4222","jetstream_event_prefix":"x.EVENT"}`:        "jetstream_event_prefix",
		`{"url":"nats://x:4222","windows_cert_store":"windowscurrentuser"}`: "windows certificate stores",
		`{"url":"nats://x:4222","user_jwt":"eyJ0"}`:                         "user_jwt needs the user's seed",
	} {
		writeContext(t, cfg, "refused", body)
		if _, err := parseNATS(t, mapEnv(map[string]string{"HOME": home}), "-context", "refused"); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("context %s: %v, want an error naming %q", body, err, want)
		}
	}
}

// socks5Server is a minimal SOCKS5 server (no authentication, CONNECT
// only) on loopback that relays to wherever it is asked and counts the
// connections it relayed.
func socks5Server(t *testing.T) (string, *atomic.Int64) {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var relayed atomic.Int64
	var wg sync.WaitGroup
	t.Cleanup(func() { l.Close(); wg.Wait() })
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			wg.Add(1)
			go func() {
				defer wg.Done()
				defer c.Close()
				buf := make([]byte, 262)
				// Greeting: version, methods; answer "no authentication".
				if _, err := io.ReadFull(c, buf[:2]); err != nil {
					return
				}
				if _, err := io.ReadFull(c, buf[:buf[1]]); err != nil {
					return
				}
				c.Write([]byte{5, 0})
				// Request: version, CONNECT, reserved, address type.
				if _, err := io.ReadFull(c, buf[:4]); err != nil || buf[1] != 1 {
					return
				}
				var host string
				switch buf[3] {
				case 1:
					io.ReadFull(c, buf[:4])
					host = net.IP(buf[:4]).String()
				case 3:
					io.ReadFull(c, buf[:1])
					n := int(buf[0])
					io.ReadFull(c, buf[:n])
					host = string(buf[:n])
				default:
					return
				}
				io.ReadFull(c, buf[:2])
				port := int(buf[0])<<8 | int(buf[1])
				up, err := net.Dial("tcp", net.JoinHostPort(host, strconv.Itoa(port)))
				if err != nil {
					c.Write([]byte{5, 5, 0, 1, 0, 0, 0, 0, 0, 0})
					return
				}
				defer up.Close()
				c.Write([]byte{5, 0, 0, 1, 0, 0, 0, 0, 0, 0})
				relayed.Add(1)
				go func() { io.Copy(up, c); up.Close() }()
				io.Copy(c, up)
			}()
		}
	}()
	return l.Addr().String(), &relayed
}
