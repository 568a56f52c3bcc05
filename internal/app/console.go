package app

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"strings"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/jetinbox/jetinbox/console"
	"github.com/jetinbox/jetinbox/internal/cli"
	"github.com/jetinbox/jetinbox/internal/dlq"
)

// Console serves the operator console.
func Console(ctx context.Context, args []string, env cli.Env, _ io.Reader, stdout, stderr io.Writer) error {
	fs := cli.NewFlagSet("jetinbox console", "Serve the operator console: overview, an intent's timeline by ID or Idempotency-Key, dead letters\n"+
		"(re-drive after a confirmation), verify over a range, partitions when sharded. Reads run under the verifier's\n"+
		"database role and NATS user (-database-url, NATS flags); it is read-only unless -operator-token-file (or -client-ca)\n"+
		"and the re-drive role (-redrive-database-url, -redrive-creds) are given. Listens on loopback unless told otherwise.\n"+
		"Exit 0 on SIGTERM, 1 failure, 2 usage error.", stderr)
	var nf cli.NATSFlags
	nf.Register(fs, env)
	dbURL := cli.DatabaseFlag(fs, env, "the inbox's database, under the verifier's read-only role (env DATABASE_URL)")
	stream := cli.StreamFlag(fs, env, "intents stream")
	scope := cli.ScopeFlag(fs, env)
	durable := cli.DurableFlag(fs, env)
	listen := fs.String("listen", "127.0.0.1:8089", "address to serve on (loopback only by default)")
	prefix := fs.String("prefix", "", "path prefix to serve under, e.g. /console")
	tokenFile := fs.String("operator-token-file", env("JETINBOX_CONSOLE_TOKEN_FILE"), "file holding the operator token (at least 16 bytes; not readable by others); without it (or -client-ca) the console is read-only")
	redriveURL := fs.String("redrive-database-url", env("JETINBOX_CONSOLE_REDRIVE_DATABASE_URL"), "the inbox's database under the console's re-drive role (deletes rejected rows); empty: no re-drive")
	redriveCreds := fs.String("redrive-creds", env("JETINBOX_CONSOLE_REDRIVE_CREDS"), "NATS credentials of the console's re-drive user (publishes to the intents stream); empty: the read connection's")
	tlsCert := fs.String("tls-cert", "", "serve HTTPS with this certificate")
	tlsKey := fs.String("tls-key", "", "the key of -tls-cert")
	clientCA := fs.String("client-ca", "", "with -tls-cert: a client certificate signed by this CA makes its holder an operator (mTLS), no token needed")
	checkpoint := fs.String("verify-checkpoint", "", "the checkpoint file of jetinbox verify -watch, shown on the verify page")
	retention := fs.Duration("retention", 0, "the inbox retention in use, for the horizon check; 0: never pruned")
	shots := fs.String("screenshots", "", "take a PNG of each page into this directory with headless Chromium, then exit")
	var sf cli.ShardFlags
	sf.Register(fs, env)
	if err := cli.Parse(fs, args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return cli.UsageError{Err: fmt.Errorf("unexpected argument %q", fs.Arg(0))}
	}
	if (*tlsCert == "") != (*tlsKey == "") || (*clientCA != "" && *tlsCert == "") {
		return cli.UsageError{Err: errors.New("-tls-cert and -tls-key go together; -client-ca needs them")}
	}
	if err := nf.Validate(); err != nil {
		return cli.UsageError{Err: err}
	}
	log := cli.EnvLogger(stderr, env, slog.LevelInfo)
	token, err := readToken(*tokenFile)
	if err != nil {
		return cli.UsageError{Err: err}
	}
	nc, js, err := nf.Connect("jetinbox-console", cli.DefaultReconnect(), log)
	if err != nil {
		return cli.UsageError{Err: err}
	}
	defer nc.Close()
	cfg := console.Config{Prefix: *prefix, JS: js, Stream: *stream, Scope: *scope, Durable: *durable, OperatorToken: token,
		VerifyCheckpoint: *checkpoint, Retention: *retention, Logger: log}
	var closers []func()
	defer func() {
		for _, c := range closers {
			c()
		}
	}()
	if sf.File != "" {
		m, _, err := sf.Load(false)
		if err != nil {
			return err
		}
		cfg.Shards, cfg.Stream, cfg.Scope = m, m.Stream, m.Scope
		cfg.ShardPools = map[string]*pgxpool.Pool{}
		for i := range m.Shards {
			st, err := cli.OpenShard(ctx, &m.Shards[i], env, 2, log)
			if err != nil {
				return err
			}
			closers = append(closers, st.Close)
			cfg.ShardPools[m.Shards[i].Name] = st.PG
			if cfg.ReadPG == nil {
				cfg.ReadPG = st.PG
			}
		}
	} else {
		if err := cli.RequireDatabase(*dbURL); err != nil {
			return err
		}
		st, err := cli.OpenStore(ctx, *dbURL, 4, log)
		if err != nil {
			return cli.UsageError{Err: err}
		}
		closers = append(closers, st.Close)
		cfg.ReadPG, cfg.ReadSQLite = st.PG, st.SQLite
	}
	if *redriveURL != "" || (sf.File != "" && (token != "" || *clientCA != "")) {
		rd := &console.Redrive{JS: js}
		if *redriveCreds != "" {
			rnc, rjs, err := nf.WithCreds(*redriveCreds).Connect("jetinbox-console-redrive", cli.DefaultReconnect(), log)
			if err != nil {
				return cli.UsageError{Err: err}
			}
			defer rnc.Close()
			rd.JS = rjs
		}
		if cfg.Shards != nil {
			route, closeAll, err := dlq.ShardRoute(ctx, cfg.Shards, env, log)
			if err != nil {
				return err
			}
			closers = append(closers, closeAll)
			rd.Route = route
		} else {
			st, err := cli.OpenStore(ctx, *redriveURL, 2, log)
			if err != nil {
				return cli.UsageError{Err: err}
			}
			closers = append(closers, st.Close)
			rd.Store = st
		}
		cfg.Redrive = rd
	}
	var tlsCfg *tls.Config
	if *tlsCert != "" {
		cert, err := tls.LoadX509KeyPair(*tlsCert, *tlsKey)
		if err != nil {
			return cli.UsageError{Err: err}
		}
		tlsCfg = &tls.Config{Certificates: []tls.Certificate{cert}, MinVersion: tls.VersionTLS12}
		if *clientCA != "" {
			pem, err := os.ReadFile(*clientCA)
			if err != nil {
				return cli.UsageError{Err: err}
			}
			pool := x509.NewCertPool()
			if !pool.AppendCertsFromPEM(pem) {
				return cli.UsageError{Err: fmt.Errorf("-client-ca %s: no certificate in it", *clientCA)}
			}
			tlsCfg.ClientCAs, tlsCfg.ClientAuth = pool, tls.VerifyClientCertIfGiven
			cfg.Authorize = func(r *http.Request) bool { return r.TLS != nil && len(r.TLS.VerifiedChains) > 0 }
		}
	}
	h, err := console.New(cfg)
	if err != nil {
		return cli.UsageError{Err: err}
	}
	if host, _, err := net.SplitHostPort(*listen); err == nil {
		if ip := net.ParseIP(host); (ip == nil || !ip.IsLoopback()) && host != "localhost" && tlsCfg == nil {
			log.Warn("console: serving beyond loopback without TLS: the operator token and session cookie cross the network in the clear", "listen", *listen)
		}
	}
	ln, err := net.Listen("tcp", *listen)
	if err != nil {
		return cli.UsageError{Err: err}
	}
	scheme := "http"
	if tlsCfg != nil {
		ln, scheme = tls.NewListener(ln, tlsCfg), "https"
	}
	url := fmt.Sprintf("%s://%s%s/", scheme, ln.Addr(), strings.TrimSuffix(*prefix, "/"))
	srv := serveConsole(ln, h)
	defer srv.Close()
	if *shots != "" {
		return console.Screenshots(ctx, url, *shots, console.DefaultShots(cfg.Shards != nil), stdout)
	}
	fmt.Fprintf(stdout, "console on %s (%s)\n", url, map[bool]string{true: "operator actions enabled", false: "read-only"}[cfg.Redrive != nil && (token != "" || cfg.Authorize != nil)])
	<-ctx.Done()
	sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	return srv.Shutdown(sctx)
}

func serveConsole(ln net.Listener, h http.Handler) *http.Server {
	mux := http.NewServeMux()
	mux.Handle("/", h)
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second, ReadTimeout: 30 * time.Second,
		WriteTimeout: 5 * time.Minute, IdleTimeout: time.Minute, MaxHeaderBytes: 16 << 10}
	go func() { _ = srv.Serve(ln) }()
	return srv
}

// readToken reads the operator token: at least 16 bytes, from a file
// others cannot read.
func readToken(path string) (string, error) {
	if path == "" {
		return "", nil
	}
	fi, err := os.Stat(path)
	if err != nil {
		return "", fmt.Errorf("-operator-token-file: %w", err)
	}
	if fi.Mode().Perm()&0o044 != 0 {
		return "", fmt.Errorf("-operator-token-file %s is readable by group or others (mode %v): chmod 600 it", path, fi.Mode().Perm())
	}
	b, err := os.ReadFile(path)
	if err != nil {
		return "", fmt.Errorf("-operator-token-file: %w", err)
	}
	t := strings.TrimSpace(string(b))
	if len(t) < 16 {
		return "", fmt.Errorf("-operator-token-file %s: the token must be at least 16 bytes", path)
	}
	return t, nil
}
