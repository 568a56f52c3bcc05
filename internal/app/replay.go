package app

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"strconv"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/jetinbox/jetinbox/inbox"
	"github.com/jetinbox/jetinbox/inbox/jsinbox"
	"github.com/jetinbox/jetinbox/internal/pipeline"
)

// errReplayApplied makes replay exit 1: a replayed message changed effects.
var errReplayApplied = errors.New("replay: some replayed messages were applied: they had not been applied before (lost, or their inbox rows were pruned)")

// replayCounts counts replay outcomes as batches commit.
type replayCounts struct {
	applied, duplicates, rejected, conflicts, retried atomic.Int64
}

func (r *replayCounts) ObserveBatch(b jsinbox.BatchReport) {
	for _, o := range b.Outcomes {
		switch o.Status {
		case inbox.StatusApplied:
			r.applied.Add(1)
		case inbox.StatusDuplicate:
			r.duplicates.Add(1)
		case inbox.StatusRejected:
			r.rejected.Add(1)
		case inbox.StatusConflict:
			r.conflicts.Add(1)
		default:
			r.retried.Add(1)
		}
	}
}

// Replay re-drives a range of the stream through the real consumer path with
// a fresh durable and the same inbox scope. Every message should come back a
// duplicate; that is the proof that the pipeline is idempotent.
func Replay(ctx context.Context, args []string, env Env, _ io.Reader, stdout, stderr io.Writer) error {
	fs := newFlagSet("jetinbox replay", "Re-drive a stream range through the inbox with a fresh durable and the same scope.\n"+
		"Effects must not change: every message comes back a duplicate (or a rejection again). Exit 1 if any was applied.", stderr)
	var nf natsFlags
	nf.register(fs, env)
	var (
		dbURL    = fs.String("database-url", env("DATABASE_URL"), "PostgreSQL connection string (env DATABASE_URL)")
		stream   = fs.String("stream", env.or("JETINBOX_STREAM", jsinbox.DefaultStream), "intents stream")
		scope    = scopeFlag(fs, env)
		fromSeq  = fs.Int("from-seq", 1, "first stream sequence to replay")
		fromTime = fs.String("from-time", "", "replay from this RFC 3339 time instead of -from-seq")
		batch    = fs.Int("batch", 500, "most messages per transaction")
		timeout  = fs.Duration("timeout", 10*time.Minute, "give up after this long")
	)
	if err := fs.Parse(args); err != nil {
		return err
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
	cfg := jsinbox.ConsumerConfig{Stream: *stream, Durable: "replay-" + strconv.FormatInt(time.Now().UnixNano(), 36), BatchSize: *batch}
	if *fromTime != "" {
		t, err := time.Parse(time.RFC3339, *fromTime)
		if err != nil {
			return usageError{fmt.Errorf("-from-time: %w", err)}
		}
		cfg.DeliverPolicy, cfg.OptStartTime = jetstream.DeliverByStartTimePolicy, &t
	} else {
		if *fromSeq < 1 {
			return usageError{errors.New("-from-seq must be at least 1")}
		}
		cfg.DeliverPolicy, cfg.OptStartSeq = jetstream.DeliverByStartSequencePolicy, uint64(*fromSeq)
	}
	log := newLogger(stderr, "text", slog.LevelWarn)
	ctx, cancel := context.WithTimeout(ctx, *timeout)
	defer cancel()
	pool, err := openDB(ctx, *dbURL, 8, log)
	if err != nil {
		return usageError{err}
	}
	defer pool.Close()
	if err := inbox.CheckSchema(ctx, pool); err != nil {
		return usageError{err}
	}
	nc, js, err := nf.connect("jetinbox-replay", defaultWaits().resolved().natsReconnect, log)
	if err != nil {
		return usageError{err}
	}
	defer nc.Close()

	proc, err := newLedgerProcessor(pool, inbox.Config{Scope: *scope, Logger: log})
	if err != nil {
		return usageError{err}
	}
	counts := &replayCounts{}
	cfg.Observer, cfg.DB, cfg.Logger = counts, pool, log
	c, err := jsinbox.NewConsumer(js, proc, cfg)
	if err != nil {
		return usageError{err}
	}
	start := time.Now()
	rctx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- c.Run(rctx) }()
	werr := pipeline.WaitSettled(ctx, js, *stream, cfg.Durable, nil)
	stop()
	if err := <-done; err != nil {
		return err
	}
	// The replay durable was a tool, not state to keep.
	_ = js.DeleteConsumer(context.WithoutCancel(ctx), *stream, cfg.Durable)
	if werr != nil {
		return werr
	}
	s := c.Stats()
	fmt.Fprintf(stdout, "replayed %d messages of %s into scope %q in %.1fs\n", s.Received, *stream, *scope, time.Since(start).Seconds())
	fmt.Fprintf(stdout, "  duplicates (no effect)   %d\n", counts.duplicates.Load())
	fmt.Fprintf(stdout, "  rejected again           %d\n", counts.rejected.Load())
	fmt.Fprintf(stdout, "  conflicts                %d\n", counts.conflicts.Load())
	fmt.Fprintf(stdout, "  applied now              %d\n", counts.applied.Load())
	if counts.applied.Load() > 0 {
		return errReplayApplied
	}
	fmt.Fprintln(stdout, "effects unchanged: the pipeline is idempotent over this range")
	return nil
}
