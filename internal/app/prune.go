package app

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/jetinbox/jetinbox/inbox"
	"github.com/jetinbox/jetinbox/inbox/jsinbox"
)

// Prune deletes old inbox rows. The horizon it must respect is read from
// the servers, not taken on trust: the stream's MaxAge, the dead-letter
// stream's MaxAge (re-drives), and MaxDeliver × the longest delay of the
// durable.
func Prune(ctx context.Context, args []string, env Env, _ io.Reader, stdout, stderr io.Writer) error {
	fs := newFlagSet("jetinbox prune", "Delete inbox rows older than -older-than, in batches. Refuses a horizon shorter than\n"+
		"the time over which a message can come back, read from the stream and the durable.", stderr)
	var nf natsFlags
	nf.register(fs, env)
	var (
		dbURL     = fs.String("database-url", env("DATABASE_URL"), "PostgreSQL connection string (env DATABASE_URL)")
		stream    = fs.String("stream", env.or("JETINBOX_STREAM", jsinbox.DefaultStream), "intents stream")
		scope     = scopeFlag(fs, env)
		durable   = durableFlag(fs, env)
		olderThan = fs.Duration("older-than", 0, "delete rows received longer ago than this; required")
		nakCap    = fs.Duration("nak-cap", 30*time.Second, "the consumer's longest nak delay")
		batch     = fs.Int("batch", 10000, "rows per DELETE")
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
	if *dbURL == "" || *olderThan <= 0 {
		return usageError{errors.New("set -database-url (or DATABASE_URL) and -older-than")}
	}
	log := slog.New(slog.NewTextHandler(stderr, nil))
	nc, js, err := nf.connect("jetinbox-prune", defaultWaits().resolved().natsReconnect, log)
	if err != nil {
		return usageError{err}
	}
	defer nc.Close()
	horizon, why, err := replayHorizon(ctx, js, *stream, *durable, *nakCap)
	if err != nil {
		return err
	}
	pool, err := openDB(ctx, *dbURL, 2, log)
	if err != nil {
		return usageError{err}
	}
	defer pool.Close()
	n, err := inbox.Prune(ctx, pool, inbox.PruneOptions{Scope: *scope, OlderThan: *olderThan, ReplayHorizon: horizon, BatchSize: *batch})
	if errors.Is(err, inbox.ErrUnsafeHorizon) {
		return fmt.Errorf("%w (the horizon is %s)", err, why)
	}
	if err != nil {
		return err
	}
	fmt.Fprintf(stdout, "pruned %d inbox rows of scope %q older than %v (horizon %v: %s)\n", n, *scope, *olderThan, horizon, why)
	return nil
}

// replayHorizon is the longest time after which a message of stream can
// still reach the inbox, and which setting says so. A stream without MaxAge
// keeps messages forever: no horizon is safe, so it is an error.
func replayHorizon(ctx context.Context, js jetstream.JetStream, stream, durable string, nakCap time.Duration) (time.Duration, string, error) {
	s, err := js.Stream(ctx, stream)
	if err != nil {
		return 0, "", fmt.Errorf("prune: stream %s: %w", stream, err)
	}
	cfg := s.CachedInfo().Config
	if cfg.MaxAge == 0 {
		return 0, "", fmt.Errorf("prune: stream %s keeps messages forever (MaxAge 0): any pruned row could be replayed into a duplicate; set a MaxAge first", stream)
	}
	horizon, why := cfg.MaxAge, fmt.Sprintf("stream %s MaxAge", stream)
	if dlq, err := js.Stream(ctx, stream+"_DLQ"); err == nil {
		if a := dlq.CachedInfo().Config.MaxAge; a == 0 || a > horizon {
			if a == 0 {
				return 0, "", fmt.Errorf("prune: dead-letter stream %s_DLQ keeps messages forever: a re-drive could come back after any horizon", stream)
			}
			horizon, why = a, fmt.Sprintf("dead-letter stream %s_DLQ MaxAge", stream)
		}
	}
	if c, err := js.Consumer(ctx, stream, durable); err == nil {
		cc := c.CachedInfo().Config
		step := max(cc.AckWait, nakCap)
		if n := len(cc.BackOff); n > 0 {
			step = max(step, cc.BackOff[n-1])
		}
		if r := time.Duration(cc.MaxDeliver) * step; cc.MaxDeliver > 0 && r > horizon {
			horizon, why = r, fmt.Sprintf("durable %s MaxDeliver × longest delay", durable)
		}
	}
	return horizon, why, nil
}
