package cli

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"

	"github.com/jetinbox/jetinbox/delivery"
	"github.com/jetinbox/jetinbox/inbox"
	"github.com/jetinbox/jetinbox/inbox/jsinbox"
	"github.com/jetinbox/jetinbox/internal/jscheck"
	"github.com/jetinbox/jetinbox/metrics"
)

// Consumer runs the inbox consumer until ctx ends (SIGTERM/SIGINT), then
// drains and returns nil.
func Consumer(ctx context.Context, args []string, env Env, stdout, stderr io.Writer) error {
	fs := NewFlagSet("consumer", "consumer applies intents from a JetStream stream once per (scope, message ID):\n"+
		"inbox row and ledger effect in one database transaction (PostgreSQL, or a SQLite file), ack after commit.\n"+
		"The scope is the identity of the effect and must never change for a running pipeline;\n"+
		"the durable is only the subscription.", stderr)
	var nf NATSFlags
	nf.Register(fs, env)
	var envErrs []error
	var (
		dbURL      = DatabaseFlag(fs, env, DatabaseUsage+"; required")
		stream     = StreamFlag(fs, env, StreamUsage)
		scope      = ScopeFlag(fs, env)
		durable    = DurableFlag(fs, env)
		batch      = fs.Int("batch", 6000, "most messages per transaction (batches never wait to fill)")
		inflight   = fs.Int("inflight", 2, "batches processed at once, each in its own transaction")
		ackWait    = fs.Duration("ack-wait", 30*time.Second, "AckWait: redelivery timer, above the p99 batch time")
		maxDeliver = fs.Int("max-deliver", 20, "deliveries before a failing message is dead-lettered (finite)")
		maxAck     = fs.Int("max-ack-pending", 0, "unacked messages in flight (0: 4 × batch × inflight)")
		dbConns    = fs.Int("db-conns", 0, "PostgreSQL pool size (0: inflight + 2)")
		httpAddr   = fs.String("http", env.Or("JETINBOX_HTTP_ADDR", DefaultHTTPAddr), "address for /metrics, /healthz and /readyz (env JETINBOX_HTTP_ADDR); "+
			"loopback only by default: set 0.0.0.0:8080 (or the pod's address) where probes and scrapes come from elsewhere; empty disables")
		drainTimeout = fs.Duration("drain-timeout", envDuration(env, "JETINBOX_DRAIN_TIMEOUT", 30*time.Second, &envErrs), "longest wait for in-flight batches on shutdown (env JETINBOX_DRAIN_TIMEOUT)")
		logFormat    = fs.String("log-format", env.Or("JETINBOX_LOG_FORMAT", "auto"), "json, text or auto (text on a terminal)")
	)
	maxBytes := envSize(env, "JETINBOX_MAX_BYTES", &envErrs)
	fs.Var(&maxBytes, "max-bytes", "most bytes of messages held at once, e.g. 64MiB: half for the pull buffer, half for the batches formed and in flight; "+
		"keep it well inside the memory limit (env JETINBOX_MAX_BYTES; 0: 64MiB)")
	var relay consumerRelay
	relay.register(fs, env)
	routesFile := fs.String("deliveries", "", "a routes file ({\"subject\": [\"endpoint\", …]}, '*' and '>' wildcards): every applied message whose subject matches gets a delivery row per endpoint "+
		"in the inbox transaction, its payload sent by `jetinbox deliver` (PostgreSQL or SQLite; needs the delivery schema: jetinbox migrate)")
	var sf ShardFlags
	sf.Register(fs, env)
	fs.BoolVar(&sf.PartitionBatches, "partition-batches", false, "with -shards: each partition's consumer forms batches of its own messages, -batch and -inflight per partition "+
		"(the default: one batcher forms the shard's batches from all its partitions, -batch and -inflight per shard)")
	w := defaultWaits()
	w.register(fs)
	fs.DurationVar(&w.nak.Base, "nak-base", w.nak.Base, "base delay of a nak (NakWithDelay by delivery count)")
	fs.DurationVar(&w.nak.Cap, "nak-cap", w.nak.Cap, "longest nak delay")
	if err := Parse(fs, args); err != nil {
		return err
	}
	w = w.resolved()
	nak := w.nak
	if len(envErrs) > 0 {
		return UsageError{Err: errors.Join(envErrs...)}
	}
	if err := nf.Validate(); err != nil {
		return UsageError{Err: err}
	}
	if err := CheckScope(*scope); err != nil {
		return err
	}
	if sf.File == "" && sf.Name == "" {
		if err := RequireDatabase(*dbURL); err != nil {
			return err
		}
	} else if relay.run || relay.followUps != "" || *routesFile != "" {
		return UsageError{Err: errors.New("-shards runs the ledger alone: -relay, -follow-ups and -deliveries are not supported on a shard")}
	}
	if *maxDeliver < 1 {
		return UsageError{Err: errors.New("-max-deliver must be at least 1: unlimited deliveries never dead-letter a failing message")}
	}
	var bad checks
	bad.atLeast("batch", *batch, 1)
	bad.atLeast("inflight", *inflight, 1)
	bad.positive("ack-wait", *ackWait)
	bad.atLeast("max-ack-pending", *maxAck, 0)
	bad.atLeast("db-conns", *dbConns, 0)
	bad.positive("drain-timeout", *drainTimeout)
	bad.positive("nak-base", w.nak.Base)
	bad.positive("nak-cap", w.nak.Cap)
	bad.add(CheckLogFormat(*logFormat))
	bad.add(CheckListenAddr("http", *httpAddr))
	relay.check(&bad)
	if err := bad.err(); err != nil {
		return err
	}
	if *dbConns == 0 {
		*dbConns = *inflight + 2
		if relay.run {
			*dbConns += 2 // the relay's rounds and its listener
		}
	}
	log := NewLogger(stderr, *logFormat, slog.LevelInfo)
	if sf.File != "" || sf.Name != "" {
		// One shard of a partitioned stream: stream, scope, durables and
		// database come from the map.
		tp, stopTracing, err := tracing(ctx, env, "jetinbox-consumer", stderr)
		if err != nil {
			return err
		}
		defer stopTracing(context.WithoutCancel(ctx)) //nolint:errcheck // best effort at exit
		txRetry := w.db
		txRetry.Base, txRetry.Cap, txRetry.MaxAttempts = 5*time.Millisecond, 200*time.Millisecond, 3
		reg := prometheus.NewRegistry()
		reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
		m, err := metrics.NewConsumer(reg)
		if err != nil {
			return err
		}
		return consumeShard(ctx, sf, env, &nf, w, jsinbox.ConsumerConfig{BatchSize: *batch, InFlight: *inflight, AckWait: *ackWait,
			MaxDeliver: *maxDeliver, MaxAckPending: *maxAck, MaxBytes: int64(maxBytes), Nak: nak, DBWait: w.db, Observer: m},
			inbox.Config{Logger: log, TxRetry: txRetry, TracerProvider: tp}, *dbConns, *httpAddr, reg, *drainTimeout, log)
	}

	var store *Store
	var err error
	switch v := env(UnsafeSQLiteSynchronousEnv); v {
	case "":
		store, err = OpenStore(ctx, *dbURL, int32(*dbConns), log)
	case "NORMAL":
		log.Error("UNSAFE: "+UnsafeSQLiteSynchronousEnv+"=NORMAL: the SQLite file runs with synchronous=NORMAL; "+
			"a power loss can lose commits whose messages were already acked. Only the power-loss chaos run sets this.", "database", *dbURL)
		store, err = openSQLiteUnsafeNormal(ctx, *dbURL)
	default:
		return UsageError{Err: fmt.Errorf("%s=%q: the only value is NORMAL (unsafe; unset it for the guarantee)", UnsafeSQLiteSynchronousEnv, v)}
	}
	if err != nil {
		return err
	}
	defer store.Close()
	if err := store.CheckSchema(ctx); err != nil {
		return err
	}
	if err := store.RefuseSharded(ctx, *scope, "consumer"); err != nil {
		return err
	}
	if *routesFile != "" {
		routes, err := delivery.LoadRoutes(*routesFile)
		if err != nil {
			return UsageError{Err: fmt.Errorf("-deliveries: %w", err)}
		}
		if err := store.DeliveryStore().CheckSchema(ctx); err != nil {
			return UsageError{Err: fmt.Errorf("-deliveries: %w", err)}
		}
		store.Deliveries = routes
	}
	nc, js, err := nf.Connect("jetinbox-consumer", w.natsReconnect, log)
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
	pcfg := inbox.Config{Scope: *scope, Logger: log, TxRetry: txRetry, TracerProvider: tp}
	var proc jsinbox.BatchProcessor
	if relay.followUps != "" {
		if err := store.Outbox().CheckSchema(ctx); err != nil {
			return UsageError{Err: err}
		}
		proc, err = store.FollowUpLedgerProcessor(pcfg, relay.followUps)
	} else {
		proc, err = store.LedgerProcessor(pcfg)
	}
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
		MaxDeliver: *maxDeliver, MaxAckPending: *maxAck, MaxBytes: int64(maxBytes), Nak: nak, DBWait: w.db, Observer: m,
	})
	if err != nil {
		return UsageError{Err: err}
	}
	for _, w := range jscheck.LintConsumer(jscheck.ConsumerTiming{AckWait: *ackWait, MaxDeliver: *maxDeliver, NakDelay: &nak}) {
		log.Warn("config: " + w)
	}

	if *httpAddr != "" {
		srv, err := serveHTTP(*httpAddr, c, nc, reg, log)
		if err != nil {
			return err
		}
		defer srv.Close()
	}

	log.Info("consumer: running", "store", store.String(), "stream", *stream, "scope", *scope, "durable", *durable, "batch", *batch, "inflight", *inflight, "max_bytes", c.Config().MaxBytes)
	runCtx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	defer cancel()
	stopRelay := func() {}
	if relay.run {
		rm, err := metrics.NewRelay(reg, RelayBacklog(store))
		if err != nil {
			return err
		}
		cfg := RelayConfigFor(relay.stream, relay.batch, 0, w.kind, log)
		cfg.Observer = rm
		cfg.NoListen = relay.noListen
		if u := relay.listenDatabase(); u != "" && !relay.noListen && store.PG != nil {
			if err := store.OpenListen(ctx, u, log); err != nil {
				return err
			}
		}
		r, relayDone, err := StartRelay(runCtx, store, js, cfg)
		if err != nil {
			return err
		}
		// The relay stops with the consumer, before NATS drains.
		stopRelay = sync.OnceFunc(func() {
			cancel()
			if err := <-relayDone; err != nil {
				log.Warn("relay: stopped", "err", err)
			}
			s := r.Stats()
			log.Info("relay: stopped", "sent", s.Sent, "duplicates", s.Duplicates, "failed", s.Failed, "retried", s.Retried, "taken_over", s.TakenOver)
		})
		defer stopRelay()
		log.Info("relay: running", "stream", relay.stream, "batch", relay.batch)
	}
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
			return fmt.Errorf("in-flight batches did not finish within %v; unacked messages will be redelivered", *drainTimeout)
		}
	}
	stopRelay()
	var setup *jsinbox.SetupError
	if errors.As(err, &setup) {
		return UsageError{Err: err}
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
