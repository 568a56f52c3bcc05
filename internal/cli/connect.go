// Package cli holds what the binaries share: flags and environment, the
// NATS and PostgreSQL connections, logging, tracing, the /metrics, /healthz
// and /readyz endpoints and exit codes; and the two commands that run in
// production, the consumer and the producer. It must stay light: the
// consumer and producer binaries link it and nothing of the operator CLI
// (package app), the embedded nats-server, the chart library or testing.
package cli

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/url"
	"os"
	"strings"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/jetinbox/jetinbox/jitter"
)

// waits holds one jitter policy per kind of wait; -jitter sets the formula of
// all of them at once.
type waits struct {
	kind                            jitter.Kind
	nak, db, natsReconnect, publish jitter.Policy
}

func defaultWaits() waits {
	return waits{
		kind:          jitter.Decorrelated,
		nak:           jitter.Policy{Base: 250 * time.Millisecond, Cap: 30 * time.Second},
		db:            jitter.Policy{Base: 100 * time.Millisecond, Cap: 5 * time.Second},
		natsReconnect: jitter.Policy{Base: 250 * time.Millisecond, Cap: 5 * time.Second},
		publish:       jitter.Policy{Base: 100 * time.Millisecond, Cap: 10 * time.Second, MaxAttempts: 10},
	}
}

func (w *waits) register(fs FlagSet) {
	fs.Var(&w.kind, "jitter", "jitter policy for every wait (nak delays, publish retries, NATS reconnects, database retries): none, full, equal, decorrelated")
}

// DefaultReconnect is the NATS reconnect policy of the commands without a
// -jitter flag: the default waits, resolved.
func DefaultReconnect() jitter.Policy { return defaultWaits().resolved().natsReconnect }

// resolved returns the policies with the chosen kind.
func (w waits) resolved() waits {
	for _, p := range []*jitter.Policy{&w.nak, &w.db, &w.natsReconnect, &w.publish} {
		p.Kind = w.kind
	}
	return w
}

// Env looks up an environment variable; os.Getenv in the binaries, a map in
// tests.
type Env func(string) string

// Or returns the variable name, or def if it is unset or empty.
func (e Env) Or(name, def string) string {
	if v := e(name); v != "" {
		return v
	}
	return def
}

// NATSFlags are the connection settings the nats CLI also reads.
type NATSFlags struct {
	url, creds, nkey, ca, cert, key string
}

// Register adds the -nats-* flags to fs, with defaults from env.
func (n *NATSFlags) Register(fs FlagSet, env Env) {
	fs.StringVar(&n.url, "nats-url", env.Or("NATS_URL", nats.DefaultURL), "NATS server URL(s), comma separated (env NATS_URL)")
	fs.StringVar(&n.creds, "nats-creds", env("NATS_CREDS"), "NATS credentials file (env NATS_CREDS)")
	fs.StringVar(&n.nkey, "nats-nkey", env("NATS_NKEY"), "NATS nkey seed file (env NATS_NKEY)")
	fs.StringVar(&n.ca, "nats-ca", env("NATS_CA"), "CA certificate to verify the NATS server (env NATS_CA)")
	fs.StringVar(&n.cert, "nats-cert", env("NATS_CERT"), "client certificate for NATS TLS (env NATS_CERT)")
	fs.StringVar(&n.key, "nats-key", env("NATS_KEY"), "client key for NATS TLS (env NATS_KEY)")
}

// Validate checks the settings before any connection is tried: a usable
// URL, a certificate with its key, one kind of credentials, files that exist.
func (n *NATSFlags) Validate() error {
	if n.url == "" {
		return errors.New("no NATS URL: set -nats-url or NATS_URL")
	}
	for _, u := range strings.Split(n.url, ",") {
		if _, err := url.Parse(strings.TrimSpace(u)); err != nil {
			return fmt.Errorf("bad NATS URL %q: %w", u, err)
		}
	}
	if (n.cert == "") != (n.key == "") {
		return errors.New("NATS TLS needs both -nats-cert and -nats-key (NATS_CERT, NATS_KEY)")
	}
	if n.creds != "" && n.nkey != "" {
		return errors.New("set either NATS_CREDS or NATS_NKEY, not both")
	}
	for _, f := range []struct{ name, path string }{{"NATS_CREDS", n.creds}, {"NATS_NKEY", n.nkey}, {"NATS_CA", n.ca}, {"NATS_CERT", n.cert}, {"NATS_KEY", n.key}} {
		if f.path == "" {
			continue
		}
		if _, err := os.Stat(f.path); err != nil {
			return fmt.Errorf("%s: %w", f.name, err)
		}
	}
	return nil
}

// Connect dials NATS. Reconnects are unlimited with jittered waits; a first
// connection that fails (wrong credentials, nothing listening) is an error,
// not a retry loop.
func (n *NATSFlags) Connect(name string, reconnect jitter.Policy, log *slog.Logger) (*nats.Conn, jetstream.JetStream, error) {
	opts := []nats.Option{
		nats.Name(name),
		nats.MaxReconnects(-1),
		// Reconnect timing comes from the same jitter policies as every
		// other wait, by attempt number.
		nats.CustomReconnectDelay(func(attempts int) time.Duration { return reconnect.Delay(attempts) }),
		nats.DisconnectErrHandler(func(_ *nats.Conn, err error) {
			if err != nil {
				log.Warn("nats: disconnected", "err", err)
			}
		}),
		nats.ReconnectHandler(func(c *nats.Conn) { log.Info("nats: reconnected", "url", c.ConnectedUrlRedacted()) }),
	}
	if n.creds != "" {
		opts = append(opts, nats.UserCredentials(n.creds))
	}
	if n.nkey != "" {
		o, err := nats.NkeyOptionFromSeed(n.nkey)
		if err != nil {
			return nil, nil, fmt.Errorf("NATS_NKEY: %w", err)
		}
		opts = append(opts, o)
	}
	if n.ca != "" {
		opts = append(opts, nats.RootCAs(n.ca))
	}
	if n.cert != "" {
		opts = append(opts, nats.ClientCert(n.cert, n.key))
	}
	nc, err := nats.Connect(n.url, opts...)
	if err != nil {
		return nil, nil, fmt.Errorf("connect to NATS at %s: %w", Redact(n.url), err)
	}
	js, err := jetstream.New(nc)
	if err != nil {
		nc.Close()
		return nil, nil, fmt.Errorf("jetstream: %w", err)
	}
	return nc, js, nil
}

// Redact hides passwords in URLs before they reach a log or an error.
func Redact(s string) string {
	parts := strings.Split(s, ",")
	for i, p := range parts {
		if u, err := url.Parse(strings.TrimSpace(p)); err == nil && u.User != nil {
			parts[i] = u.Redacted()
		}
	}
	return strings.Join(parts, ",")
}

// OpenDB opens a pool and checks the server answers.
func OpenDB(ctx context.Context, dsn string, maxConns int32, log *slog.Logger) (*pgxpool.Pool, error) {
	cfg, err := pgxpool.ParseConfig(dsn)
	if err != nil {
		return nil, fmt.Errorf("DATABASE_URL: %w", err) // pgx does not echo the password
	}
	if maxConns > 0 {
		cfg.MaxConns = maxConns
	}
	if h := cfg.ConnConfig.Host; !isLocal(h) && (cfg.ConnConfig.TLSConfig == nil || cfg.ConnConfig.TLSConfig.InsecureSkipVerify) {
		log.Warn("database: TLS is weaker than sslmode=verify-full toward a non-local host", "host", h)
	}
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return nil, fmt.Errorf("database: %w", err)
	}
	pctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	if err := pool.Ping(pctx); err != nil {
		pool.Close()
		return nil, fmt.Errorf("database at %s:%d: %w", cfg.ConnConfig.Host, cfg.ConnConfig.Port, err)
	}
	return pool, nil
}

func isLocal(host string) bool {
	return host == "" || host == "localhost" || strings.HasPrefix(host, "127.") || host == "::1" || strings.HasPrefix(host, "/")
}

// NewLogger returns JSON logs in production and text on a terminal.
func NewLogger(w io.Writer, format string, level slog.Level) *slog.Logger {
	opts := &slog.HandlerOptions{Level: level}
	if format == "auto" || format == "" {
		format = "json"
		if f, ok := w.(*os.File); ok && IsTerminal(f) {
			format = "text"
		}
	}
	if format == "text" {
		return slog.New(slog.NewTextHandler(w, opts))
	}
	return slog.New(slog.NewJSONHandler(w, opts))
}

// IsTerminal reports whether f is a terminal.
func IsTerminal(f *os.File) bool {
	st, err := f.Stat()
	return err == nil && st.Mode()&os.ModeCharDevice != 0
}
