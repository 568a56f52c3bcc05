// Package cli holds what the binaries share: flags and environment, the
// NATS and PostgreSQL connections, logging, tracing, the /metrics, /healthz
// and /readyz endpoints and exit codes; and the two commands that run in
// production, the consumer and the producer. It must stay light: the
// consumer and producer binaries link it and nothing of the operator CLI
// (package app), the embedded nats-server, the chart library or testing.
package cli

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/url"
	"os"
	"regexp"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"golang.org/x/net/proxy"
	"golang.org/x/term"

	"github.com/jetinbox/jetinbox/internal/pgwatch"
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

// NATSFlags are the connection settings the nats CLI also reads, with its
// flag names, environment variables and contexts. Explicit flags win over
// the environment, the environment over the context.
type NATSFlags struct {
	url, creds, nkey, ca, cert, key, user, password, token, context string
	inboxPrefix, jsDomain, jsAPIPrefix, socksProxy, userJWT         string
	tlsFirst                                                        bool

	env      Env
	ctxName  string // the context in use, if any
	resolved bool
}

// Register adds the connection flags to fs: -s (also -server, -nats-url),
// -creds, -nkey, -tlscert, -tlskey, -tlsca, -user, -password, -token,
// -inbox-prefix and -context, and the older -nats-creds, -nats-nkey, -nats-ca, -nats-cert,
// -nats-key. Their defaults come from env after parsing (see Validate), so
// no secret from the environment is ever shown by -h.
func (n *NATSFlags) Register(fs FlagSet, env Env) {
	n.env = env
	urlUsage := "NATS server URL(s), comma separated (env NATS_URL; else the context's; else " + nats.DefaultURL + ")"
	for _, name := range []string{"s", "server", "nats-url"} {
		fs.StringVar(&n.url, name, "", urlUsage)
	}
	for _, f := range []struct {
		p           *string
		names       []string
		envVar, use string
	}{
		{&n.creds, []string{"creds", "nats-creds"}, "NATS_CREDS", "NATS credentials file"},
		{&n.nkey, []string{"nkey", "nats-nkey"}, "NATS_NKEY", "NATS nkey seed file"},
		{&n.ca, []string{"tlsca", "nats-ca"}, "NATS_CA", "CA certificate to verify the NATS server"},
		{&n.cert, []string{"tlscert", "nats-cert"}, "NATS_CERT", "client certificate for NATS TLS"},
		{&n.key, []string{"tlskey", "nats-key"}, "NATS_KEY", "client key for NATS TLS"},
		{&n.user, []string{"user"}, "NATS_USER", "NATS user name"},
		{&n.password, []string{"password"}, "NATS_PASSWORD", "NATS password (prefer the environment: flags show in ps)"},
		{&n.token, []string{"token"}, "NATS_TOKEN", "NATS authentication token (prefer the environment: flags show in ps)"},
		{&n.jsDomain, []string{"js-domain"}, "NATS_JS_DOMAIN", "JetStream domain of the streams (a leaf node's or another cluster's)"},
		{&n.jsAPIPrefix, []string{"js-api-prefix"}, "NATS_JS_API_PREFIX", "JetStream API subject prefix, for streams imported from another account"},
		{&n.socksProxy, []string{"socks-proxy"}, "NATS_SOCKS_PROXY", "SOCKS5 proxy to dial the servers through, host:port"},
		{&n.inboxPrefix, []string{"inbox-prefix"}, "NATS_INBOX_PREFIX", "prefix of the reply subjects (request replies, PubAcks, pulled messages) instead of _INBOX; " +
			"give each user its own and let it subscribe to that alone, so no other user can read its replies"},
	} {
		for _, name := range f.names {
			fs.StringVar(f.p, name, "", f.use+" (env "+f.envVar+")")
		}
	}
	fs.BoolVar(&n.tlsFirst, "tlsfirst", false, "TLS handshake before the server's greeting, for servers with handshake_first (or the context's tls_first)")
	fs.StringVar(&n.context, "context", "", "nats CLI context to take unset connection settings from: a name in ~/.config/nats/context, or a file path "+
		"(env NATS_CONTEXT; else the context the nats CLI has selected)")
}

// resolve fills what no flag set from the environment, then from the nats
// context, then the default URL.
func (n *NATSFlags) resolve() error {
	if n.resolved {
		return nil
	}
	n.resolved = true
	env := n.env
	if env == nil {
		env = func(string) string { return "" }
	}
	for _, f := range []struct {
		p      *string
		envVar string
	}{{&n.url, "NATS_URL"}, {&n.creds, "NATS_CREDS"}, {&n.nkey, "NATS_NKEY"}, {&n.ca, "NATS_CA"}, {&n.cert, "NATS_CERT"}, {&n.key, "NATS_KEY"},
		{&n.user, "NATS_USER"}, {&n.password, "NATS_PASSWORD"}, {&n.token, "NATS_TOKEN"}, {&n.inboxPrefix, "NATS_INBOX_PREFIX"},
		{&n.jsDomain, "NATS_JS_DOMAIN"}, {&n.jsAPIPrefix, "NATS_JS_API_PREFIX"}, {&n.socksProxy, "NATS_SOCKS_PROXY"},
		{&n.context, "NATS_CONTEXT"}} {
		if *f.p == "" {
			*f.p = env(f.envVar)
		}
	}
	c, name, err := loadNATSContext(env, n.context)
	if err != nil {
		return err
	}
	n.ctxName = name
	for _, f := range []struct {
		dst *string
		v   string
	}{{&n.url, c.URL}, {&n.creds, c.Creds}, {&n.nkey, c.NKey}, {&n.ca, c.CA}, {&n.cert, c.Cert}, {&n.key, c.Key},
		{&n.user, c.User}, {&n.password, c.Password}, {&n.token, c.Token}, {&n.inboxPrefix, c.InboxPrefix},
		{&n.jsDomain, c.JSDomain}, {&n.jsAPIPrefix, c.JSAPIPrefix}, {&n.socksProxy, c.SocksProxy}, {&n.userJWT, c.UserJWT}} {
		if *f.dst == "" {
			*f.dst = f.v
		}
	}
	n.tlsFirst = n.tlsFirst || c.TLSFirst
	if n.url == "" {
		n.url = nats.DefaultURL
	}
	return nil
}

// Validate resolves the settings (flags, then environment, then nats
// context) and checks them before any connection is tried: a usable URL,
// a certificate with its key, one kind of credentials, files that exist.
func (n *NATSFlags) Validate() error {
	if err := n.resolve(); err != nil {
		return err
	}
	for _, u := range strings.Split(n.url, ",") {
		if _, err := url.Parse(strings.TrimSpace(u)); err != nil {
			if i := strings.LastIndex(u, "@"); i >= 0 {
				u = "…" + u[i:] // never echo a password
			}
			return fmt.Errorf("bad NATS URL %q: %w", u, errors.Unwrap(err))
		}
	}
	if (n.cert == "") != (n.key == "") {
		return errors.New("NATS TLS needs both -nats-cert and -nats-key (-tlscert, -tlskey; NATS_CERT, NATS_KEY)")
	}
	kinds := 0
	for _, set := range []bool{n.creds != "", n.nkey != "", n.token != "", n.user != "" || n.password != ""} {
		if set {
			kinds++
		}
	}
	if kinds > 1 {
		return errors.New("set one kind of NATS credentials: a creds file (NATS_CREDS), an nkey (NATS_NKEY), a token (NATS_TOKEN) or a user and password (NATS_USER, NATS_PASSWORD)")
	}
	if n.password != "" && n.user == "" {
		return errors.New("a NATS password (-password, NATS_PASSWORD) needs a user (-user, NATS_USER)")
	}
	if err := CheckInboxPrefix(n.inboxPrefix); err != nil {
		return err
	}
	if n.jsDomain != "" && n.jsAPIPrefix != "" {
		return errors.New("set a JetStream domain (-js-domain) or an API prefix (-js-api-prefix), not both")
	}
	if n.userJWT != "" && n.nkey == "" {
		return errors.New("the nats context's user_jwt needs the user's seed in nkey")
	}
	if n.socksProxy != "" {
		if _, err := socksAddr(n.socksProxy); err != nil {
			return err
		}
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
	if err := n.resolve(); err != nil {
		return nil, nil, err
	}
	if n.creds != "" {
		opts = append(opts, nats.UserCredentials(n.creds))
	}
	if n.user != "" {
		opts = append(opts, nats.UserInfo(n.user, n.password))
	}
	if n.token != "" {
		opts = append(opts, nats.Token(n.token))
	}
	switch {
	case n.nkey != "" && n.userJWT != "":
		seed, err := os.ReadFile(n.nkey)
		if err != nil {
			return nil, nil, fmt.Errorf("NATS_NKEY: %w", err)
		}
		opts = append(opts, nats.UserJWTAndSeed(n.userJWT, strings.TrimSpace(string(seed))))
	case n.nkey != "":
		o, err := nats.NkeyOptionFromSeed(n.nkey)
		if err != nil {
			return nil, nil, fmt.Errorf("NATS_NKEY: %w", err)
		}
		opts = append(opts, o)
	}
	if n.tlsFirst {
		opts = append(opts, nats.TLSHandshakeFirst())
	}
	if n.socksProxy != "" {
		addr, _ := socksAddr(n.socksProxy) // checked by Validate
		d, err := proxy.SOCKS5("tcp", addr, nil, &net.Dialer{Timeout: 5 * time.Second})
		if err != nil {
			return nil, nil, fmt.Errorf("NATS SOCKS proxy %s: %w", addr, err)
		}
		opts = append(opts, nats.SetCustomDialer(socksDialer{d}))
	}
	if n.inboxPrefix != "" {
		opts = append(opts, nats.CustomInboxPrefix(n.inboxPrefix))
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
	var js jetstream.JetStream
	switch {
	case n.jsDomain != "":
		js, err = jetstream.NewWithDomain(nc, n.jsDomain)
	case n.jsAPIPrefix != "":
		js, err = jetstream.NewWithAPIPrefix(nc, n.jsAPIPrefix)
	default:
		js, err = jetstream.New(nc)
	}
	if err != nil {
		nc.Close()
		return nil, nil, fmt.Errorf("jetstream: %w", err)
	}
	return nc, js, nil
}

// socksAddr takes a SOCKS5 proxy as host:port or socks5://host:port.
func socksAddr(s string) (string, error) {
	addr := s
	if strings.Contains(s, "://") {
		u, err := url.Parse(s)
		if err != nil || u.Scheme != "socks5" || u.Host == "" {
			return "", fmt.Errorf("SOCKS proxy %q: want host:port or socks5://host:port", s)
		}
		addr = u.Host
	}
	if _, _, err := net.SplitHostPort(addr); err != nil {
		return "", fmt.Errorf("SOCKS proxy %q: want host:port or socks5://host:port: %w", s, err)
	}
	return addr, nil
}

// socksDialer adapts a proxy.Dialer to nats.CustomDialer.
type socksDialer struct{ d proxy.Dialer }

func (s socksDialer) Dial(network, address string) (net.Conn, error) {
	return s.d.Dial(network, address)
}

// InboxPrefix returns the reply-subject prefix in use ("" for nats.go's
// default, _INBOX), once the settings are resolved.
func (n *NATSFlags) InboxPrefix() string { return n.inboxPrefix }

// CheckInboxPrefix checks a reply-subject prefix (-inbox-prefix,
// NATS_INBOX_PREFIX, a context's inbox_prefix): empty (the default,
// _INBOX), or subject tokens without wildcards, spaces or control
// characters, not ending in a dot.
func CheckInboxPrefix(p string) error {
	if p == "" {
		return nil
	}
	bad := func(why string) error {
		return fmt.Errorf("NATS inbox prefix %q (-inbox-prefix, NATS_INBOX_PREFIX, a context's inbox_prefix): %s", p, why)
	}
	for _, tok := range strings.Split(p, ".") {
		switch {
		case tok == "":
			return bad("empty subject token (a leading, trailing or double dot)")
		case tok == "*" || tok == ">" || strings.ContainsAny(tok, "*>"):
			return bad("wildcards are not allowed")
		case strings.IndexFunc(tok, func(r rune) bool { return r <= ' ' || r == 0x7f }) >= 0:
			return bad("spaces and control characters are not allowed")
		}
	}
	return nil
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

// OpenDB opens a pool and checks the server answers. Its connections
// report a COMMIT whose wait for the synchronous standby was cancelled
// (pginbox.WatchCommits). Behind a connection
// pooler (see [BehindPooler]) whose URL names no default_query_exec_mode,
// the pool runs its statements in [PoolerExecMode]: pgx's default caches
// named prepared statements per connection, which a pooler in transaction
// mode hands to another client's transaction (SQLSTATE 26000, 42P05).
func OpenDB(ctx context.Context, dsn string, maxConns int32, log *slog.Logger) (*pgxpool.Pool, error) {
	pool, _, err := openDB(ctx, dsn, maxConns, log)
	return pool, err
}

// PoolerExecMode is the statement mode of a pool behind a connection
// pooler: each statement parsed (unnamed), bound and run in one round
// trip, so nothing needs to outlive its transaction on the server
// connection; the parameter and result types pgx learns on a statement's
// first use stay cached on the client. Measured on the consumer's batch
// path through pgbouncer, it runs 1.3 times as fast as
// QueryExecModeExec, which sends and reads everything as text.
// QueryExecModeDescribeExec is no choice: it describes and runs in two
// round trips, which a pooler may send to two server connections.
const PoolerExecMode = pgx.QueryExecModeCacheDescribe

// openDB is OpenDB, also reporting whether a pooler answers for the server.
func openDB(ctx context.Context, dsn string, maxConns int32, log *slog.Logger) (*pgxpool.Pool, bool, error) {
	cfg, err := pgxpool.ParseConfig(dsn)
	if err != nil {
		return nil, false, fmt.Errorf("DATABASE_URL: %w", err) // pgx does not echo the password
	}
	if maxConns > 0 {
		cfg.MaxConns = maxConns
	}
	if _, set := cfg.ConnConfig.RuntimeParams["client_encoding"]; !set {
		// The server converts between the database's encoding and UTF-8,
		// which Go's strings hold; on a SQL_ASCII database it passes the
		// bytes as they are. pgx refuses the simple protocol on any
		// other client encoding.
		cfg.ConnConfig.RuntimeParams["client_encoding"] = "UTF8"
	}
	// Every commit the pool makes reports a wait for the synchronous
	// standby that was cancelled, which pgx takes for a success.
	pgwatch.Install(cfg.ConnConfig)
	if h := cfg.ConnConfig.Host; !isLocal(h) && (cfg.ConnConfig.TLSConfig == nil || cfg.ConnConfig.TLSConfig.InsecureSkipVerify) {
		log.Warn("database: TLS is weaker than sslmode=verify-full toward a non-local host", "host", h)
	}
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return nil, false, fmt.Errorf("database: %w", err)
	}
	pctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	where := func(err error) error {
		return fmt.Errorf("database at %s:%d: %w", cfg.ConnConfig.Host, cfg.ConnConfig.Port, err)
	}
	if err := pool.Ping(pctx); err != nil {
		pool.Close()
		return nil, false, where(err)
	}
	pooled, err := BehindPooler(pctx, pool)
	if err != nil {
		pool.Close()
		return nil, false, where(err)
	}
	if err := checkEncoding(pctx, pool); err != nil {
		pool.Close()
		return nil, false, UsageError{Err: where(err)}
	}
	if !pooled || hasParam(dsn, "default_query_exec_mode") {
		return pool, pooled, nil
	}
	// Only new connections take the mode: start the pool again with it.
	pool.Close()
	cfg.ConnConfig.DefaultQueryExecMode = PoolerExecMode
	log.Info("database: a connection pooler answers for the server; running statements without named prepared statements",
		"default_query_exec_mode", "cache_describe", "hint", "set default_query_exec_mode in the database URL to choose the mode")
	if pool, err = pgxpool.NewWithConfig(ctx, cfg); err != nil {
		return nil, false, fmt.Errorf("database: %w", err)
	}
	return pool, true, nil
}

// BehindPooler reports whether a connection pooler (PgBouncer, and the
// others that hand server connections from client to client) answers for
// the server: the backend that runs a query is not the one the
// connection's start-up named. The server names its own process; a pooler
// makes up a key of its own, as it cannot give a client a backend for
// good.
func BehindPooler(ctx context.Context, pool *pgxpool.Pool) (bool, error) {
	c, err := pool.Acquire(ctx)
	if err != nil {
		return false, err
	}
	defer c.Release()
	var pid uint32
	// An unnamed statement, parsed and run in one round trip: a named
	// prepared statement of the probe would itself collide, behind a
	// pooler, with another client's, and the simple protocol, which pgx
	// runs only with client_encoding UTF8, would refuse a session in any
	// other encoding.
	if err := c.QueryRow(ctx, "SELECT pg_backend_pid()", pgx.QueryExecModeExec).Scan(&pid); err != nil {
		return false, err
	}
	return pid != c.Conn().PgConn().PID(), nil
}

// checkEncoding refuses the one combination that cannot work: statements in
// pgx's simple protocol (default_query_exec_mode=simple_protocol in the
// URL) on a session whose client_encoding is not UTF8, which pgx refuses
// for every statement with arguments. The default sessions ask for UTF8
// (see openDB), which every server encoding takes.
func checkEncoding(ctx context.Context, pool *pgxpool.Pool) error {
	c, err := pool.Acquire(ctx)
	if err != nil {
		return err
	}
	defer c.Release()
	enc := c.Conn().PgConn().ParameterStatus("client_encoding")
	if c.Conn().Config().DefaultQueryExecMode == pgx.QueryExecModeSimpleProtocol && enc != "UTF8" {
		return fmt.Errorf("default_query_exec_mode=simple_protocol needs client_encoding UTF8, and the session's is %s: "+
			"drop client_encoding from the URL (jetinbox asks for UTF8) or choose another default_query_exec_mode", enc)
	}
	return nil
}

// hasParam reports whether the connection string dsn (a URL or key=value
// pairs) sets the parameter name.
func hasParam(dsn, name string) bool {
	if strings.HasPrefix(dsn, "postgres://") || strings.HasPrefix(dsn, "postgresql://") {
		u, err := url.Parse(dsn)
		return err == nil && u.Query().Has(name)
	}
	return regexp.MustCompile(`(^|\s)` + regexp.QuoteMeta(name) + `\s*=`).MatchString(dsn)
}

func isLocal(host string) bool {
	return host == "" || host == "localhost" || strings.HasPrefix(host, "127.") || host == "::1" || strings.HasPrefix(host, "/")
}

// NewLogger returns JSON logs in production and text on a terminal:
// format is json, text, or auto (or empty): text when w is a terminal.
// Durations are rendered as strings ("1.5s"), in JSON too.
func NewLogger(w io.Writer, format string, level slog.Level) *slog.Logger {
	opts := &slog.HandlerOptions{Level: level, ReplaceAttr: durationsAsStrings}
	if logFormat(w, format) == "text" {
		return slog.New(slog.NewTextHandler(w, opts))
	}
	return slog.New(slog.NewJSONHandler(w, opts))
}

// EnvLogger is the logger of the operator commands: JETINBOX_LOG_FORMAT
// (json, text, auto), text when it is unset.
func EnvLogger(w io.Writer, env Env, level slog.Level) *slog.Logger {
	return NewLogger(w, env.Or("JETINBOX_LOG_FORMAT", "text"), level)
}

// logFormat resolves auto to json or text for w.
func logFormat(w io.Writer, format string) string {
	if format == "auto" || format == "" {
		if f, ok := w.(*os.File); ok && IsTerminal(f) {
			return "text"
		}
		return "json"
	}
	return format
}

// durationsAsStrings renders time.Duration values with String(): slog's
// JSON handler would write nanoseconds.
func durationsAsStrings(_ []string, a slog.Attr) slog.Attr {
	if a.Value.Kind() == slog.KindDuration {
		a.Value = slog.StringValue(a.Value.Duration().String())
	}
	return a
}

// IsTerminal reports whether f is a terminal (not merely a character
// device such as /dev/null).
func IsTerminal(f *os.File) bool { return term.IsTerminal(int(f.Fd())) }

// ProgressWriter is where a measuring command (bench, chaos, jitter) writes
// its progress lines: w itself when JETINBOX_LOG_FORMAT is text (the
// default for operator commands), else a writer that turns each line into
// one JSON log record, so a log collector reading stderr sees only JSON.
func ProgressWriter(w io.Writer, env Env) io.Writer {
	format := env.Or("JETINBOX_LOG_FORMAT", "text")
	if logFormat(w, format) == "text" {
		return w
	}
	return &lineLogger{log: NewLogger(w, "json", slog.LevelInfo)}
}

// lineLogger logs every complete line written to it as one record; a
// partial line waits for its newline. Safe for concurrent writers.
type lineLogger struct {
	mu  sync.Mutex
	log *slog.Logger
	buf []byte
}

func (l *lineLogger) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.buf = append(l.buf, p...)
	for {
		i := bytes.IndexByte(l.buf, '\n')
		if i < 0 {
			return len(p), nil
		}
		if line := strings.TrimRight(string(l.buf[:i]), "\r"); strings.TrimSpace(line) != "" {
			l.log.Info(line)
		}
		l.buf = l.buf[i+1:]
	}
}
