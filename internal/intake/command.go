package intake

import (
	"bufio"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/jetinbox/jetinbox/idempotency"
	"github.com/jetinbox/jetinbox/idempotency/pgidempotency"
	"github.com/jetinbox/jetinbox/idempotency/sqliteidempotency"
	"github.com/jetinbox/jetinbox/internal/cli"
)

// Summary is the command's line in `jetinbox -h`.
const Summary = "the HTTP intake: clients POST intents with an Idempotency-Key; key, answer and outbox row commit in one transaction"

// Main is `jetinbox intake`.
func Main(ctx context.Context, args []string, env cli.Env, stdin io.Reader, stdout, stderr io.Writer) error {
	fs := cli.NewFlagSet("jetinbox intake", "Serve POST "+Route+" (JSON {\"subject\": ..., \"payload\": ...}, header Idempotency-Key, Authorization: Bearer TOKEN):\n"+
		"each request stores its key, its answer and an outbox row (ID derived from tenant + key) in one transaction and answers 202\n"+
		"once it committed; `jetinbox relay` publishes the row with Nats-Msg-Id = that ID. A retry with the same key gets the same answer\n"+
		"(Idempotent-Replayed: true), another body under it 422, a retry while the first still runs waits -wait, then 409. GET "+Route+"/KEY\n"+
		"tells an intent's state. Several intakes may serve one database behind a load balancer. Stops on SIGTERM after draining.", stderr)
	var (
		dbURL       = cli.DatabaseFlag(fs, env, cli.DatabaseUsage+"; required")
		listen      = fs.String("listen", env.Or("JETINBOX_INTAKE_LISTEN", "127.0.0.1:8080"), "address to serve the intake on (env JETINBOX_INTAKE_LISTEN)")
		httpAddr    = fs.String("http", env.Or("JETINBOX_INTAKE_HTTP_ADDR", "127.0.0.1:9093"), "address for /metrics, /healthz and /readyz (env JETINBOX_INTAKE_HTTP_ADDR); loopback by default; empty disables. /healthz and /readyz are on -listen too")
		tenantsPath = fs.String("tenants", env("JETINBOX_INTAKE_TENANTS"), "JSON file of tenants: {\"tenants\": [{\"name\": \"acme\", \"token_sha256\": \"<hex>\", \"subjects\": \"intents.\", \"rate\": 100, \"burst\": 200}]} (env JETINBOX_INTAKE_TENANTS); required")
		tlsCert     = fs.String("tls-cert", env("JETINBOX_INTAKE_TLS_CERT"), "serve TLS with this certificate (PEM); with -tls-key")
		tlsKey      = fs.String("tls-key", env("JETINBOX_INTAKE_TLS_KEY"), "the certificate's private key (PEM)")
		prefix      = fs.String("subject-prefix", "intents.", "subjects a tenant may post to, when its entry names none")
		rate        = fs.Float64("rate", 200, "requests per second per tenant, when its entry names none (0: unlimited)")
		burst       = fs.Int("burst", 400, "burst per tenant, when its entry names none")
		maxBody     = cli.Size(64 << 10)
		maxHeader   = cli.Size(16 << 10)
		wait        = fs.Duration("wait", 5*time.Second, "how long a duplicate waits for the request in flight with its key before it gets 409")
		readTimeout = fs.Duration("read-timeout", 10*time.Second, "longest time to read a request, body included (slow clients are cut off)")
		readHeader  = fs.Duration("read-header-timeout", 5*time.Second, "longest time to read a request's headers")
		writeTO     = fs.Duration("write-timeout", 30*time.Second, "longest time from the end of the request's headers to the end of the answer; longer than -wait")
		idleTO      = fs.Duration("idle-timeout", 60*time.Second, "how long a keep-alive connection may idle")
		retention   = fs.Duration("retention", idempotency.DefaultRetention, "how long keys are kept at least (clients must not retry one key longer); the intake prunes older ones")
		pruneEvery  = fs.Duration("prune-interval", time.Hour, "how often to delete keys older than -retention (0: never; -prune deletes them once)")
		drainDelay  = fs.Duration("drain-delay", 5*time.Second, "on SIGTERM, answer /readyz 503 this long before closing the listener, so the load balancer stops sending")
		drainTO     = fs.Duration("drain-timeout", 30*time.Second, "then wait at most this long for requests in flight")
		conns       = fs.Int("max-conns", 20, "PostgreSQL connections (each request in flight holds one for its transaction)")
		migrate     = fs.Bool("migrate", false, "apply the key table's and the outbox's migrations, then exit")
		prune       = fs.Bool("prune", false, "delete keys older than -retention once, then exit")
		hashToken   = fs.Bool("hash-token", false, "read a bearer token from stdin and print its token_sha256 for the tenants file, then exit")
		partitioned = fs.String("partition-prefix", "", "on a sharded pipeline: the partitioned stream's subject prefix (e.g. pintents); a posted subject PREFIX.KIND is published as PREFIX.<the ID's key token>.KIND, so the stream puts it in the ID's partition. Keys and outbox stay in this intake's database")
		keyOptional = fs.Bool("unsafe-key-optional", false, "accept a POST without an Idempotency-Key as a new intent each time, so that a client retrying it sends it twice: for showing what the key prevents (jetinbox chaos -http); never in production")
		logFormat   = fs.String("log-format", env.Or("JETINBOX_LOG_FORMAT", "auto"), "json, text or auto (text on a terminal)")
	)
	fs.Var(&maxBody, "max-body", "largest request body (413 above)")
	fs.Var(&maxHeader, "max-header", "largest request header block")
	if err := cli.Parse(fs, args); err != nil {
		return err
	}
	if *hashToken {
		line, err := bufio.NewReader(stdin).ReadString('\n')
		if err != nil && !errors.Is(err, io.EOF) {
			return err
		}
		line = strings.TrimRight(line, "\r\n")
		if line == "" {
			return cli.UsageError{Err: errors.New("-hash-token: no token on stdin")}
		}
		fmt.Fprintln(stdout, HashToken(line))
		return nil
	}
	var bad []error
	bad = append(bad, cli.CheckLogFormat(*logFormat), cli.CheckListenAddr("listen", *listen), cli.CheckListenAddr("http", *httpAddr))
	if (*tlsCert == "") != (*tlsKey == "") {
		bad = append(bad, errors.New("-tls-cert and -tls-key go together"))
	}
	for name, d := range map[string]time.Duration{"wait": *wait, "read-timeout": *readTimeout, "read-header-timeout": *readHeader, "write-timeout": *writeTO, "idle-timeout": *idleTO, "retention": *retention} {
		if d <= 0 {
			bad = append(bad, fmt.Errorf("-%s %v: must be positive", name, d))
		}
	}
	if *writeTO <= *wait {
		bad = append(bad, fmt.Errorf("-write-timeout %v must be longer than -wait %v, or a waiting duplicate loses its answer", *writeTO, *wait))
	}
	if *rate < 0 || *burst < 0 || *conns < 1 || maxBody < 1 || maxHeader < 1024 {
		bad = append(bad, errors.New("-rate, -burst must be >= 0, -max-conns >= 1, -max-body >= 1, -max-header >= 1KiB"))
	}
	if *pruneEvery < 0 || *drainDelay < 0 || *drainTO <= 0 {
		bad = append(bad, errors.New("-prune-interval and -drain-delay must be >= 0, -drain-timeout positive"))
	}
	if !*migrate && !*prune && *tenantsPath == "" {
		bad = append(bad, errors.New("-tenants: required (a JSON file of tenants and their token hashes)"))
	}
	if err := errors.Join(bad...); err != nil {
		return cli.UsageError{Err: err}
	}
	if err := cli.RequireDatabase(*dbURL); err != nil {
		return err
	}
	log := cli.NewLogger(stderr, *logFormat, slog.LevelInfo)
	store, err := cli.OpenStore(ctx, *dbURL, int32(*conns), log)
	if err != nil {
		return cli.UsageError{Err: err}
	}
	defer store.Close()
	keys := keyStore(store)
	if *migrate {
		n, err := keys.Migrate(ctx)
		if err != nil {
			return err
		}
		o, err := store.Outbox().Migrate(ctx)
		if err != nil {
			return err
		}
		fmt.Fprintf(stdout, "applied %d idempotency and %d outbox migrations\n", n, o)
		return nil
	}
	if err := keys.CheckSchema(ctx); err != nil {
		return cli.UsageError{Err: fmt.Errorf("%w (run `jetinbox intake -migrate`)", err)}
	}
	if err := store.Outbox().CheckSchema(ctx); err != nil {
		return cli.UsageError{Err: err}
	}
	pruneOnce := func() (int64, error) {
		return keys.Prune(ctx, idempotency.PruneOptions{OlderThan: *retention, Retention: *retention})
	}
	if *prune {
		n, err := pruneOnce()
		if err != nil {
			return err
		}
		fmt.Fprintf(stdout, "pruned %d keys older than %v\n", n, *retention)
		return nil
	}
	tenants, err := LoadTenants(*tenantsPath)
	if err != nil {
		return cli.UsageError{Err: err}
	}
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	cfg := Config{Tenants: tenants, SubjectPrefix: *prefix, Rate: *rate, Burst: *burst, MaxBody: int64(maxBody), Wait: *wait, Log: log, Registry: reg, KeyOptional: *keyOptional, PartitionPrefix: *partitioned}
	var srv *Server
	if store.SQLite != nil {
		srv, err = NewSQLite(store.SQLite, cfg)
	} else {
		srv, err = NewPG(store.PG, cfg)
	}
	if err != nil {
		return err
	}
	ln, err := net.Listen("tcp", *listen)
	if err != nil {
		return cli.UsageError{Err: fmt.Errorf("-listen %s: %w", *listen, err)}
	}
	hs := &http.Server{
		Handler: srv, ReadTimeout: *readTimeout, ReadHeaderTimeout: *readHeader, WriteTimeout: *writeTO, IdleTimeout: *idleTO,
		MaxHeaderBytes: int(maxHeader), ErrorLog: slog.NewLogLogger(log.Handler(), slog.LevelWarn),
	}
	if *tlsCert != "" {
		cert, err := tls.LoadX509KeyPair(*tlsCert, *tlsKey)
		if err != nil {
			ln.Close()
			return cli.UsageError{Err: fmt.Errorf("-tls-cert/-tls-key: %w", err)}
		}
		hs.TLSConfig = &tls.Config{Certificates: []tls.Certificate{cert}, MinVersion: tls.VersionTLS12}
		ln = tls.NewListener(ln, hs.TLSConfig)
	}
	if *httpAddr != "" {
		mux := http.NewServeMux()
		mux.Handle("/metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
		mux.Handle("/healthz", srv)
		mux.Handle("/readyz", srv)
		mln, err := net.Listen("tcp", *httpAddr)
		if err != nil {
			ln.Close()
			return cli.UsageError{Err: fmt.Errorf("-http %s: %w", *httpAddr, err)}
		}
		ms := &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second}
		go ms.Serve(mln)
		defer ms.Close()
	}
	if *pruneEvery > 0 {
		go func() {
			t := time.NewTicker(*pruneEvery)
			defer t.Stop()
			for {
				select {
				case <-ctx.Done():
					return
				case <-t.C:
					if n, err := pruneOnce(); err != nil {
						log.Warn("intake: prune", "err", err)
					} else if n > 0 {
						log.Info("intake: pruned keys", "deleted", n, "older_than", *retention)
					}
				}
			}
		}()
	}
	served := make(chan error, 1)
	go func() { served <- hs.Serve(ln) }()
	if *keyOptional {
		log.Error("intake: -unsafe-key-optional: requests without an Idempotency-Key are accepted, and their retries are new intents")
	}
	log.Info("intake: serving", "listen", ln.Addr().String(), "tls", *tlsCert != "", "store", store.Kind(), "tenants", len(tenants), "retention", *retention)
	select {
	case err := <-served:
		return fmt.Errorf("intake: serve: %w", err)
	case <-ctx.Done():
	}
	srv.Drain()
	log.Info("intake: draining", "delay", *drainDelay)
	time.Sleep(*drainDelay)
	sctx, cancel := context.WithTimeout(context.Background(), *drainTO)
	defer cancel()
	if err := hs.Shutdown(sctx); err != nil {
		return fmt.Errorf("intake: drain: %w", err)
	}
	log.Info("intake: stopped")
	return nil
}

// keys is what the command needs of a key store besides serving.
type keys interface {
	Migrate(ctx context.Context) (int, error)
	CheckSchema(ctx context.Context) error
	Prune(ctx context.Context, opts idempotency.PruneOptions) (int64, error)
}

func keyStore(s *cli.Store) keys {
	if s.SQLite != nil {
		return sqliteidempotency.New(s.SQLite)
	}
	return pgidempotency.New(s.PG)
}
