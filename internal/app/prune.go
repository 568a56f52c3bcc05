package app

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/jetinbox/jetinbox/inbox"
	"github.com/jetinbox/jetinbox/inbox/jsinbox"
	"github.com/jetinbox/jetinbox/internal/cli"
	"github.com/jetinbox/jetinbox/internal/jscheck"
	"github.com/jetinbox/jetinbox/outbox"
)

// Prune deletes old inbox rows. The horizon it must respect is read from
// the servers, not taken on trust: the stream's MaxAge and duplicate window,
// the durable's AckWait, BackOff and MaxDeliver, and the dead-letter
// stream's MaxAge (re-drives); see jscheck.ComputeHorizon for the arithmetic.
func Prune(ctx context.Context, args []string, env cli.Env, _ io.Reader, stdout, stderr io.Writer) error {
	fs := cli.NewFlagSet("jetinbox prune", "Delete inbox rows of one scope older than -older-than, in batches, by PostgreSQL's clock.\n"+
		"-older-than must be longer than the horizon over which a message can come back, read from the\n"+
		"stream, the durable and the dead-letter stream, plus -margin. Exit 0 pruned, 1 failure,\n"+
		"2 usage error or an unsafe -older-than (nothing is deleted then).", stderr)
	var nf cli.NATSFlags
	nf.Register(fs, env)
	var (
		dbURL     = cli.DatabaseFlag(fs, env, cli.DatabaseUsage)
		stream    = cli.StreamFlag(fs, env, cli.StreamUsage)
		scope     = cli.ScopeFlag(fs, env)
		durable   = cli.DurableFlag(fs, env)
		olderThan = fs.Duration("older-than", 0, "delete rows received longer ago than this; required")
		nakCap    = fs.Duration("nak-cap", jsinbox.DefaultNakCap, "the consumer's longest nak delay")
		pubRetry  = fs.Duration("publish-retry", jscheck.DefaultPublishRetryHorizon(), "the producers' retry horizon: how long after its first publish an intent may be published again")
		redrive   = fs.Bool("dlq-redrive", true, "dead letters may be re-published into the stream with their message ID while the dead-letter stream keeps them; false leaves its MaxAge out")
		margin    = fs.Duration("margin", inbox.DefaultPruneMargin, "how much longer than the horizon -older-than must be (clock skew between NATS and PostgreSQL, batches in flight)")
		batch     = fs.Int("batch", 10000, "rows per DELETE")
		outboxToo = fs.Bool("outbox", false, "also delete sent outbox rows created longer ago than -older-than, under the same horizon: the parents of follow-ups come from this stream; "+
			"pending rows and rows the stream refused are never deleted")
	)
	var sf cli.ShardFlags
	sf.Register(fs, env)
	if err := cli.Parse(fs, args); err != nil {
		return err
	}
	if sf.File != "" || sf.Name != "" {
		// One shard: its database, the map's stream and scope, and a
		// partition durable's settings (every partition's are the same).
		m, s, err := sf.Load(true)
		if err != nil {
			return err
		}
		u, err := s.URL(env)
		if err != nil {
			return cli.UsageError{Err: err}
		}
		*dbURL, *stream, *scope, *durable = u, m.Stream, m.Scope, m.Durable(0)
		if m.ShardDurables {
			*durable = m.ShardDurable(s.Name)
		}
	}
	if err := nf.Validate(); err != nil {
		return cli.UsageError{Err: err}
	}
	if err := cli.CheckScope(*scope); err != nil {
		return err
	}
	if *dbURL == "" || *olderThan <= 0 {
		return cli.UsageError{Err: errors.New("set -database-url (or DATABASE_URL) and -older-than")}
	}
	if *margin <= 0 {
		return cli.UsageError{Err: errors.New("-margin must be positive")}
	}
	log := cli.EnvLogger(stderr, env, slog.LevelInfo)
	nc, js, err := nf.Connect("jetinbox-prune", cli.DefaultReconnect(), log)
	if err != nil {
		return cli.UsageError{Err: err}
	}
	defer nc.Close()
	span, err := readHorizon(ctx, js, *stream, *durable, jscheck.HorizonInputs{NakCap: *nakCap, PublishRetry: *pubRetry}, *redrive)
	if errors.Is(err, jscheck.ErrUnboundedHorizon) {
		return cli.UsageError{Err: fmt.Errorf("prune: %w", err)}
	}
	if err != nil {
		return err
	}
	if least := span.Total + *margin; *olderThan <= least {
		return cli.UsageError{Err: fmt.Errorf("prune: %w: -older-than %v is not longer than the horizon %v + margin %v; use more than %v (%s)",
			inbox.ErrUnsafeHorizon, *olderThan, span.Total, *margin, least, span.Why)}
	}
	store, err := cli.OpenStore(ctx, *dbURL, 2, log)
	if err != nil {
		return cli.UsageError{Err: err}
	}
	defer store.Close()
	n, err := store.Prune(ctx, inbox.PruneOptions{Scope: *scope, OlderThan: *olderThan, ReplayHorizon: span.Total, Margin: *margin, BatchSize: *batch})
	if err != nil {
		return err
	}
	fmt.Fprintf(stdout, "pruned %d inbox rows of scope %q older than %v (horizon %v: %s)\n", n, *scope, *olderThan, span.Total, span.Why)
	if *outboxToo {
		opts := outbox.PruneOptions{OlderThan: *olderThan, ReplayHorizon: span.Total, Margin: *margin, BatchSize: *batch}
		m, err := store.Outbox().Prune(ctx, opts)
		if err != nil {
			return err
		}
		fmt.Fprintf(stdout, "pruned %d sent outbox rows older than %v\n", m, *olderThan)
	}
	return nil
}

// readHorizon reads the settings the horizon depends on from the servers:
// the stream, the durable (its defaults if it does not exist, as the
// consumer would create it) and, if re-drives count, the dead-letter stream.
func readHorizon(ctx context.Context, js jetstream.JetStream, stream, durable string, in jscheck.HorizonInputs, redrive bool) (jscheck.HorizonSpan, error) {
	s, err := js.Stream(ctx, stream)
	if err != nil {
		return jscheck.HorizonSpan{}, fmt.Errorf("prune: stream %s: %w", stream, err)
	}
	in.Stream = s.CachedInfo().Config
	if redrive {
		dlq, err := js.Stream(ctx, jsinbox.DeadLetterStream(stream))
		switch {
		case err == nil:
			cfg := dlq.CachedInfo().Config
			in.DeadLetters = &cfg
		case !errors.Is(err, jetstream.ErrStreamNotFound):
			return jscheck.HorizonSpan{}, fmt.Errorf("prune: dead-letter stream %s_DLQ: %w", stream, err)
		}
	}
	c, err := js.Consumer(ctx, stream, durable)
	switch {
	case err == nil:
		cfg := c.CachedInfo().Config
		in.Consumer = &cfg
	case !errors.Is(err, jetstream.ErrConsumerNotFound):
		return jscheck.HorizonSpan{}, fmt.Errorf("prune: durable %s: %w", durable, err)
	}
	return jscheck.ComputeHorizon(in)
}

// streamMissing turns a stream the server does not have into an error that
// says what to check, and leaves other errors alone. Either way the command
// exits 2 on it (cli.IsConfigError).
func streamMissing(cmd, stream string, err error) error {
	if !errors.Is(err, jetstream.ErrStreamNotFound) {
		return err
	}
	return fmt.Errorf("%s: stream %s not found on this server: check -stream (JETINBOX_STREAM) and the server or "+
		"context you connected to; the producer creates it, or nats stream add %s --config deploy/jetstream/intents-stream.json: %w",
		cmd, stream, stream, err)
}
