package cli

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/jetinbox/jetinbox/inbox/jsinbox"
	"github.com/jetinbox/jetinbox/internal/effects"
	"github.com/jetinbox/jetinbox/jitter"
	"github.com/jetinbox/jetinbox/outbox"
	"github.com/jetinbox/jetinbox/outbox/pgoutbox"
)

// The outbox's defaults in the commands: the ledger's follow-ups go to
// "notifications.<n>", which the NOTIFICATIONS stream captures.
const (
	DefaultRelayStream    = "NOTIFICATIONS"
	DefaultFollowUpPrefix = "notifications"
)

// consumerRelay holds the consumer's outbox flags.
type consumerRelay struct {
	run       bool
	stream    string
	batch     int
	followUps string
	noListen  bool
	listenURL string
	env       Env
}

func (r *consumerRelay) register(fs FlagSet, env Env) {
	fs.BoolVar(&r.run, "relay", false, "also run the outbox relay in this process: publish the outbox's pending rows (follow-ups, a service's own intents) to -relay-stream and mark them sent; any number of relays may run")
	fs.StringVar(&r.stream, "relay-stream", env.Or("JETINBOX_RELAY_STREAM", DefaultRelayStream), "-relay: the stream every outbox row must land in (env JETINBOX_RELAY_STREAM)")
	fs.IntVar(&r.batch, "relay-batch", 500, "-relay: most outbox rows per relay transaction")
	fs.BoolVar(&r.noListen, "relay-no-listen", false, "-relay: poll only, without LISTEN/NOTIFY")
	// The environment's URL is read after parsing (see listenDatabase), so
	// that -h shows no password.
	r.env = env
	fs.StringVar(&r.listenURL, "relay-listen-database", "", "-relay: "+ListenDatabaseUsage)
	fs.StringVar(&r.followUps, "follow-ups", "", "the ledger adds a follow-up intent per applied credit to the outbox, in the inbox transaction, on subject PREFIX.<account mod 16> "+
		"with ID notify:<message ID> (e.g. -follow-ups "+DefaultFollowUpPrefix+"); empty: none. Needs the outbox schema (jetinbox migrate)")
}

func (r *consumerRelay) check(c *checks) {
	c.atLeast("relay-batch", r.batch, 1)
	if r.run && r.stream == "" {
		c.add(errors.New("-relay-stream: empty"))
	}
	if r.followUps != "" {
		if _, err := effects.NewLedger().WithFollowUps(effects.FollowUps{Subject: r.followUps}); err != nil {
			c.add(fmt.Errorf("-follow-ups: %w", err))
		}
	}
}

// listenDatabase is -relay-listen-database, else JETINBOX_LISTEN_DATABASE_URL.
func (r *consumerRelay) listenDatabase() string {
	if r.listenURL == "" && r.env != nil {
		return r.env("JETINBOX_LISTEN_DATABASE_URL")
	}
	return r.listenURL
}

// RelayConfigFor returns the relay's configuration with every wait of the
// chosen jitter kind.
func RelayConfigFor(stream string, batch, publishBatch int, kind jitter.Kind, log *slog.Logger) outbox.RelayConfig {
	return outbox.RelayConfig{
		Stream: stream,
		Batch:  batch,
		Publisher: jsinbox.PublisherConfig{Batch: publishBatch, Logger: log,
			Retry: jitter.Policy{Kind: kind, Base: 100 * time.Millisecond, Cap: 5 * time.Second, MaxAttempts: 5, MaxElapsed: 30 * time.Second}},
		Idle:   jitter.Policy{Kind: kind, Base: time.Second, Cap: 10 * time.Second},
		Retry:  jitter.Policy{Kind: kind, Base: 100 * time.Millisecond, Cap: 10 * time.Second},
		Logger: log,
	}
}

// CheckRelayStream reports a relay's target stream that the server does
// not have as a configuration error that says what to do.
func CheckRelayStream(ctx context.Context, js jetstream.JetStream, stream string) error {
	if _, err := js.Stream(ctx, stream); err != nil {
		if errors.Is(err, jetstream.ErrStreamNotFound) {
			return UsageError{Err: fmt.Errorf("relay: stream %s not found: create it (jetinbox relay -create-stream, or nats stream add) before relaying into it: %w", stream, err)}
		}
		return fmt.Errorf("relay: stream %s: %w", stream, err)
	}
	return nil
}

// EnsureRelayStream creates the relay's target stream, capturing
// "<subject>.>", with its dead-letter and advisory streams, if it does not
// exist; with fast, the stream allows fast batches (allow_batched), which
// the relay's fast mode needs.
func EnsureRelayStream(ctx context.Context, js jetstream.JetStream, stream, subject string, fast bool) error {
	cfg := jsinbox.StreamConfig{Name: stream, Subjects: []string{subject + ".>"}, AllowFastBatches: fast}
	if _, err := jsinbox.EnsureStream(ctx, js, cfg); err != nil {
		return fmt.Errorf("relay: create stream %s: %w", stream, err)
	}
	return nil
}

// StartRelay checks the outbox schema, that the database takes the relay's
// transactions (see [Store.CheckWritable]) and the target stream, then runs a
// relay on store's outbox (PostgreSQL: SKIP LOCKED batches and LISTEN;
// SQLite: leased batches and polling) until ctx ends. The returned channel
// yields Run's result.
func StartRelay(ctx context.Context, store *Store, js jetstream.JetStream, cfg outbox.RelayConfig) (*outbox.Relay, <-chan error, error) {
	src := store.Outbox()
	if err := src.CheckSchema(ctx); err != nil {
		return nil, nil, UsageError{Err: err}
	}
	if err := store.CheckWritable(ctx); err != nil {
		return nil, nil, fmt.Errorf("relay: %w", err)
	}
	if pg, ok := src.(*pgoutbox.Store); ok {
		if err := pg.CheckCommitWatch(ctx); err != nil {
			return nil, nil, err
		}
	}
	switch {
	case store.SQLite != nil, cfg.NoListen, store.listen != nil:
	case store.Pooled:
		// A LISTEN through a pooler in transaction mode is run on
		// whichever server connection is free and forgotten with it: the
		// relay would seem to listen and never hear a notification.
		return nil, nil, UsageError{Err: errors.New("relay: a connection pooler answers at the database URL, and LISTEN does not work through a pooler in transaction mode: " +
			"give the relay a direct URL to the server for LISTEN (JETINBOX_LISTEN_DATABASE_URL; jetinbox relay -listen-database, consumer -relay-listen-database), " +
			"or let it poll only (jetinbox relay -no-listen, consumer -relay-no-listen)")}
	}
	if err := CheckRelayStream(ctx, js, cfg.Stream); err != nil {
		return nil, nil, err
	}
	r, err := outbox.NewRelay(src, js, cfg)
	if err != nil {
		return nil, nil, UsageError{Err: err}
	}
	done := make(chan error, 1)
	go func() { done <- r.Run(ctx) }()
	return r, done, nil
}

// RelayBacklog returns how the relay metrics count the outbox's pending
// rows on store.
func RelayBacklog(store *Store) func(context.Context) (int64, time.Duration, error) {
	return store.Outbox().Backlog
}

// ServeMetrics serves /metrics from reg, and /healthz (503 once nc is
// closed for good), on addr until the returned server is closed.
func ServeMetrics(addr string, nc *nats.Conn, reg *prometheus.Registry, log *slog.Logger) (io.Closer, error) {
	return serveHTTP(addr, nil, nc, reg, log)
}
