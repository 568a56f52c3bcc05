package app

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"strings"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"

	"github.com/jetinbox/jetinbox/inbox/jsinbox"
	"github.com/jetinbox/jetinbox/internal/cli"
	"github.com/jetinbox/jetinbox/jitter"
	"github.com/jetinbox/jetinbox/metrics"
	"github.com/jetinbox/jetinbox/outbox"
)

// reconnect is the default NATS reconnect policy with the chosen kind.
func reconnect(kind jitter.Kind) jitter.Policy {
	p := cli.DefaultReconnect()
	p.Kind = kind
	return p
}

// Relay is `jetinbox relay`: the outbox relay on its own.
func Relay(ctx context.Context, args []string, env cli.Env, _ io.Reader, _, stderr io.Writer) error {
	fs := cli.NewFlagSet("jetinbox relay", "Publish the outbox's pending rows to a JetStream stream with Nats-Msg-Id = the row's ID, wait for the PubAck,\n"+
		"then mark them sent. Rows come from pgoutbox.Add (or sqliteoutbox.Add) in an effect's or a service's own\n"+
		"transaction. Any number of relays may run: each locks its own batch of rows (FOR UPDATE SKIP LOCKED). It wakes on PostgreSQL\n"+
		"notifications, polls with jittered waits as a safety net, and stops on SIGTERM/SIGINT after its round.", stderr)
	var nf cli.NATSFlags
	nf.Register(fs, env)
	var (
		dbURL        = cli.DatabaseFlag(fs, env, cli.DatabaseUsage+"; required")
		stream       = fs.String("stream", env.Or("JETINBOX_RELAY_STREAM", cli.DefaultRelayStream), "the stream every outbox row must land in (env JETINBOX_RELAY_STREAM)")
		batch        = fs.Int("batch", 500, "most outbox rows per relay transaction")
		publishBatch = fs.Int("publish-batch", 0, "-publish each: gather rows published together into JetStream atomic batches of up to this many (0: 256; 1: one publish and PubAck per row)")
		publishMode  = fs.String("publish", "atomic", "atomic: a round's rows as JetStream atomic batches of up to 1000, one write and one PubAck each (fastest where the stream fsyncs every write, sync_interval: always); fast: a round's rows as one JetStream fast batch, marked sent up to the row the server acknowledged (fastest on a stream that does not fsync every write; needs allow_batched on the stream, else it publishes as atomic); each: each row published on its own, pipelined")
		create       = fs.String("create-stream", "", "create -stream, capturing SUBJECT.>, if it does not exist (e.g. -create-stream "+cli.DefaultFollowUpPrefix+"); with -publish fast it allows fast batches (allow_batched)")
		httpAddr     = fs.String("http", env.Or("JETINBOX_RELAY_HTTP_ADDR", "127.0.0.1:9092"), "address for /metrics (jetinbox_outbox_*) and /healthz (env JETINBOX_RELAY_HTTP_ADDR); loopback only by default: set 0.0.0.0:9092 where scrapes come from elsewhere; empty disables")
		noListen     = fs.Bool("no-listen", false, "poll only, without LISTEN/NOTIFY (for a connection pooler in transaction mode, without -listen-database)")
		listenURL    = fs.String("listen-database", "", cli.ListenDatabaseUsage) // the environment's after parsing: -h shows no password
		logFormat    = fs.String("log-format", env.Or("JETINBOX_LOG_FORMAT", "auto"), "json, text or auto (text on a terminal)")
	)
	kind := jitter.Decorrelated
	fs.Var(&kind, "jitter", "jitter policy for every wait (publish retries, polls, retries after errors, NATS reconnects): none, full, equal, decorrelated")
	if err := cli.Parse(fs, args); err != nil {
		return err
	}
	if err := nf.Validate(); err != nil {
		return cli.UsageError{Err: err}
	}
	var bad []error
	if *batch < 1 {
		bad = append(bad, fmt.Errorf("-batch %d: must be at least 1", *batch))
	}
	if *publishBatch < 0 || *publishBatch > jsinbox.MaxBatch {
		bad = append(bad, fmt.Errorf("-publish-batch %d: must be within [0, %d]", *publishBatch, jsinbox.MaxBatch))
	}
	mode, merr := outbox.ParsePublishMode(*publishMode)
	bad = append(bad, merr, cli.CheckLogFormat(*logFormat), cli.CheckListenAddr("http", *httpAddr))
	if *stream == "" {
		bad = append(bad, errors.New("-stream: empty"))
	}
	if *create != "" && (strings.ContainsAny(*create, " *>") || strings.HasSuffix(*create, ".")) {
		bad = append(bad, fmt.Errorf("-create-stream %q: want a subject prefix such as %q", *create, cli.DefaultFollowUpPrefix))
	}
	if err := errors.Join(bad...); err != nil {
		return cli.UsageError{Err: err}
	}
	if err := cli.RequireDatabase(*dbURL); err != nil {
		return err
	}
	log := cli.NewLogger(stderr, *logFormat, slog.LevelInfo)
	store, err := cli.OpenStore(ctx, *dbURL, 3, log)
	if err != nil {
		return cli.UsageError{Err: err}
	}
	defer store.Close()
	if store.SQLite != nil && !*noListen {
		*noListen = true // SQLite has no notifications: the relay polls with jittered waits
	}
	if *listenURL == "" {
		*listenURL = env("JETINBOX_LISTEN_DATABASE_URL")
	}
	if *listenURL != "" && !*noListen {
		if err := store.OpenListen(ctx, *listenURL, log); err != nil {
			return err
		}
	}
	nc, js, err := nf.Connect("jetinbox-relay", reconnect(kind), log)
	if err != nil {
		return cli.UsageError{Err: err}
	}
	defer nc.Close()
	if *create != "" {
		if err := cli.EnsureRelayStream(ctx, js, *stream, *create, mode == outbox.PublishFast); err != nil {
			return err
		}
	}
	cfg := cli.RelayConfigFor(*stream, *batch, *publishBatch, kind, log)
	cfg.NoListen = *noListen
	cfg.Publish = mode
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	m, err := metrics.NewRelay(reg, cli.RelayBacklog(store))
	if err != nil {
		return err
	}
	cfg.Observer = m
	r, done, err := cli.StartRelay(ctx, store, js, cfg)
	if err != nil {
		return err
	}
	if *httpAddr != "" {
		srv, err := cli.ServeMetrics(*httpAddr, nc, reg, log)
		if err != nil {
			return err
		}
		defer srv.Close()
	}
	log.Info("relay: running", "stream", *stream, "batch", *batch, "listen", !*noListen)
	err = <-done
	s := r.Stats()
	log.Info("relay: stopped", "sent", s.Sent, "duplicates", s.Duplicates, "failed", s.Failed, "retried", s.Retried, "taken_over", s.TakenOver, "rounds", s.Rounds)
	return err
}
