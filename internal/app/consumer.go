package app

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/jetinbox/jetinbox/inbox"
	"github.com/jetinbox/jetinbox/inbox/jsinbox"
	"github.com/jetinbox/jetinbox/jitter"
	"github.com/jetinbox/jetinbox/metrics"
)

// Consumer runs the inbox consumer until ctx ends (SIGTERM/SIGINT), then
// drains and returns nil.
func Consumer(ctx context.Context, args []string, env Env, stdout, stderr io.Writer) error {
	fs := newFlagSet("consumer", "consumer applies intents from a JetStream stream once per (scope, message ID):\n"+
		"inbox row and ledger effect in one PostgreSQL transaction, ack after commit.\n"+
		"The scope is the identity of the effect and must never change for a running pipeline;\n"+
		"the durable is only the subscription.", stderr)
	var nf natsFlags
	nf.register(fs, env)
	var envErrs []error
	var (
		dbURL        = fs.String("database-url", env("DATABASE_URL"), "PostgreSQL connection string (env DATABASE_URL); required")
		stream       = fs.String("stream", env.or("JETINBOX_STREAM", jsinbox.DefaultStream), "intents stream (env JETINBOX_STREAM)")
		scope        = scopeFlag(fs, env)
		durable      = durableFlag(fs, env)
		batch        = fs.Int("batch", 6000, "most messages per transaction (batches never wait to fill)")
		inflight     = fs.Int("inflight", 2, "batches processed at once, each in its own transaction")
		ackWait      = fs.Duration("ack-wait", 30*time.Second, "AckWait: redelivery timer, above the p99 batch time")
		maxDeliver   = fs.Int("max-deliver", 20, "deliveries before a failing message is dead-lettered (finite)")
		maxAck       = fs.Int("max-ack-pending", 0, "unacked messages in flight (0: 4 × batch × inflight)")
		dbConns      = fs.Int("db-conns", 0, "PostgreSQL pool size (0: inflight + 2)")
		httpAddr     = fs.String("http", env.or("JETINBOX_HTTP_ADDR", ":8080"), "address for /metrics, /healthz and /readyz (env JETINBOX_HTTP_ADDR); empty disables")
		drainTimeout = fs.Duration("drain-timeout", envDuration(env, "JETINBOX_DRAIN_TIMEOUT", 30*time.Second, &envErrs), "longest wait for in-flight batches on shutdown (env JETINBOX_DRAIN_TIMEOUT)")
		logFormat    = fs.String("log-format", env.or("JETINBOX_LOG_FORMAT", "auto"), "json, text or auto (text on a terminal)")
	)
	w := defaultWaits()
	w.register(fs)
	fs.DurationVar(&w.nak.Base, "nak-base", w.nak.Base, "base delay of a nak (NakWithDelay by delivery count)")
	fs.DurationVar(&w.nak.Cap, "nak-cap", w.nak.Cap, "longest nak delay")
	if err := fs.Parse(args); err != nil {
		return err
	}
	w = w.resolved()
	nak := w.nak
	if len(envErrs) > 0 {
		return usageError{errors.Join(envErrs...)}
	}
	if err := nf.validate(); err != nil {
		return usageError{err}
	}
	if err := checkScope(*scope); err != nil {
		return err
	}
	if *dbURL == "" {
		return usageError{errors.New("no database: set -database-url or DATABASE_URL")}
	}
	if *maxDeliver < 1 {
		return usageError{errors.New("-max-deliver must be at least 1: unlimited deliveries never dead-letter a failing message")}
	}
	if *dbConns == 0 {
		*dbConns = *inflight + 2
	}
	log := newLogger(stderr, *logFormat, slog.LevelInfo)

	pool, err := openDB(ctx, *dbURL, int32(*dbConns), log)
	if err != nil {
		return err
	}
	defer pool.Close()
	if err := inbox.CheckSchema(ctx, pool); err != nil {
		return err
	}
	nc, js, err := nf.connect("jetinbox-consumer", w.natsReconnect, log)
	if err != nil {
		return err
	}
	defer nc.Close()

	tp, stopTracing, err := tracing(ctx, env, "jetinbox-consumer", stderr)
	if err != nil {
		return err
	}
	defer stopTracing(context.WithoutCancel(ctx)) //nolint:errcheck // best effort at exit
	txRetry := w.db
	txRetry.Base, txRetry.Cap, txRetry.MaxAttempts = 5*time.Millisecond, 200*time.Millisecond, 3
	proc, err := newLedgerProcessor(pool, inbox.Config{Scope: *scope, Logger: log, TxRetry: txRetry, TracerProvider: tp})
	if err != nil {
		return err
	}
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	m, err := metrics.NewConsumer(reg)
	if err != nil {
		return err
	}
	c, err := jsinbox.NewConsumer(js, proc, jsinbox.ConsumerConfig{
		Stream: *stream, Durable: *durable, BatchSize: *batch, InFlight: *inflight, AckWait: *ackWait,
		MaxDeliver: *maxDeliver, MaxAckPending: *maxAck, Nak: nak, Reconnect: w.db, DB: pool, Logger: log, Observer: m, TracerProvider: tp,
	})
	if err != nil {
		return usageError{err}
	}
	m.Attach(c)
	for _, w := range jitter.Lint(jitter.Settings{AckWait: *ackWait, MaxDeliver: *maxDeliver, NakDelay: &nak}) {
		log.Warn("config: " + w)
	}

	if *httpAddr != "" {
		srv, err := serveHTTP(*httpAddr, c, reg, log)
		if err != nil {
			return err
		}
		defer srv.Close()
	}

	log.Info("consumer: running", "stream", *stream, "scope", *scope, "durable", *durable, "batch", *batch, "inflight", *inflight)
	runCtx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	defer cancel()
	done := make(chan error, 1)
	go func() { done <- c.Run(runCtx) }()
	select {
	case err = <-done:
	case <-ctx.Done():
		log.Info("consumer: draining", "timeout", *drainTimeout)
		cancel()
		select {
		case err = <-done:
		case <-time.After(*drainTimeout):
			return fmt.Errorf("consumer: in-flight batches did not finish within %v; unacked messages will be redelivered", *drainTimeout)
		}
	}
	if err != nil {
		return err
	}
	if err := nc.Drain(); err != nil {
		log.Warn("nats: drain", "err", err)
	}
	s := c.Stats()
	log.Info("consumer: stopped", "received", s.Received, "applied", s.Applied, "duplicates", s.Duplicates,
		"dead_lettered", s.DeadLettered, "naks", s.Naks)
	return nil
}

// serveHTTP serves /metrics, and for a consumer /healthz (the process is
// alive) and /readyz (consuming with NATS and PostgreSQL reachable; 503
// while draining).
func serveHTTP(addr string, c *jsinbox.Consumer, reg *prometheus.Registry, log *slog.Logger) (*http.Server, error) {
	mux := http.NewServeMux()
	mux.Handle("/metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
	if c != nil {
		registerHealth(mux, c)
	}
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("http: %w", err)
	}
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second}
	go func() {
		if err := srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
			log.Error("http", "err", err)
		}
	}()
	log.Info("http: serving", "addr", ln.Addr().String())
	return srv, nil
}

func registerHealth(mux *http.ServeMux, c *jsinbox.Consumer) {
	mux.HandleFunc("/healthz", func(w http.ResponseWriter, _ *http.Request) { fmt.Fprintln(w, "ok") })
	mux.HandleFunc("/readyz", func(w http.ResponseWriter, _ *http.Request) {
		switch {
		case c.Draining():
			http.Error(w, "draining", http.StatusServiceUnavailable)
		case !c.Ready():
			http.Error(w, "not ready: not consuming, or NATS or PostgreSQL unreachable", http.StatusServiceUnavailable)
		default:
			fmt.Fprintln(w, "ready")
		}
	})
}

// usageError marks errors in flags or environment: exit code 2.
type usageError struct{ err error }

func (u usageError) Error() string { return u.err.Error() }
func (u usageError) Unwrap() error { return u.err }

// ExitCode maps a command's error to a process exit code: 0 success, 2 for
// usage and configuration errors (and -h), 1 otherwise.
func ExitCode(err error) int {
	var u usageError
	switch {
	case err == nil:
		return 0
	case errors.Is(err, flag.ErrHelp):
		return 0
	case errors.As(err, &u):
		return 2
	}
	return 1
}
