package app

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/jetinbox/jetinbox/inbox"
	"github.com/jetinbox/jetinbox/inbox/jsinbox"
	"github.com/jetinbox/jetinbox/internal/cli"
	"github.com/jetinbox/jetinbox/internal/shard"
	"github.com/jetinbox/jetinbox/internal/verify"
)

// errReplayApplied makes replay exit 1: a replayed message would be (or was)
// applied, so the inbox had no row for it.
var errReplayApplied = errors.New("replay: the inbox had no row for some replayed messages (pruned, lost, or the wrong -scope)")

// Replay runs a range of the stream through the inbox of one scope again and
// counts what happens. By default it is a dry run: every batch's claims and
// effects run in a transaction that is rolled back. -apply commits (a real
// re-drive). Neither mode publishes dead letters: a message rejected before
// is counted, not dead-lettered again.
func Replay(ctx context.Context, args []string, env cli.Env, _ io.Reader, stdout, stderr io.Writer) error {
	fs := cli.NewFlagSet("jetinbox replay", "Run a range of the stream through the inbox of one scope again and report what it would change.\n"+
		"By default a dry run: each batch's claims and effects run in a transaction that is rolled back,\n"+
		"so nothing changes. -apply commits instead: a real re-drive. Neither mode dead-letters anything\n"+
		"again; a message rejected before is only counted. Every message should come back a duplicate.\n"+
		"Exit 0 nothing would be applied, 1 something would be (or, with -apply, was) applied: the inbox\n"+
		"had no row for it (pruned, lost, or the wrong -scope), 2 usage error (a reversed range too).", stderr)
	var nf cli.NATSFlags
	nf.Register(fs, env)
	var (
		dbURL    = cli.DatabaseFlag(fs, env, cli.DatabaseUsage)
		stream   = cli.StreamFlag(fs, env, cli.StreamUsage)
		scope    = cli.ScopeFlag(fs, env)
		fromSeq  = fs.Int("from-seq", 1, "first stream sequence to replay")
		toSeq    = fs.Int("to-seq", 0, "last stream sequence to replay (0: the stream's last)")
		fromTime = fs.String("from-time", "", "replay from this RFC 3339 time instead of -from-seq")
		apply    = fs.Bool("apply", false, "commit: apply what the inbox does not have (a real re-drive) instead of rolling back")
		batch    = fs.Int("batch", 500, "most messages per transaction")
		timeout  = fs.Duration("timeout", 10*time.Minute, "give up after this long")
	)
	var sf cli.ShardFlags
	sf.Register(fs, env)
	if err := cli.Parse(fs, args); err != nil {
		return err
	}
	// One shard of a sharded stream: its partitions only, through its
	// database, each message's binding checked as its consumer does.
	var sm *shard.Map
	if sf.File != "" || sf.Name != "" {
		m, s, err := sf.Load(true)
		if err != nil {
			return err
		}
		u, err := s.URL(env)
		if err != nil {
			return cli.UsageError{Err: err}
		}
		sm, *stream, *scope, *dbURL = m, m.Stream, m.Scope, u
	}
	seqSet := false
	fs.Visit(func(f *flag.Flag) { seqSet = seqSet || f.Name == "from-seq" })
	var start *time.Time
	switch {
	case *fromSeq < 1:
		return cli.UsageError{Err: errors.New("-from-seq must be at least 1")}
	case *toSeq < 0:
		return cli.UsageError{Err: errors.New("-to-seq must not be negative")}
	case *toSeq > 0 && *fromSeq > *toSeq:
		return cli.UsageError{Err: fmt.Errorf("-from-seq %d is after -to-seq %d: a reversed range replays nothing", *fromSeq, *toSeq)}
	case *batch < 1:
		return cli.UsageError{Err: errors.New("-batch must be at least 1")}
	case *fromTime != "":
		if seqSet {
			return cli.UsageError{Err: errors.New("set -from-seq or -from-time, not both")}
		}
		t, err := time.Parse(time.RFC3339, *fromTime)
		if err != nil {
			return cli.UsageError{Err: fmt.Errorf("-from-time: %w", err)}
		}
		start = &t
	}
	if err := nf.Validate(); err != nil {
		return cli.UsageError{Err: err}
	}
	if err := cli.CheckScope(*scope); err != nil {
		return err
	}
	if err := cli.RequireDatabase(*dbURL); err != nil {
		return err
	}
	log := cli.EnvLogger(stderr, env, slog.LevelWarn)
	ctx, cancel := context.WithTimeout(ctx, *timeout)
	defer cancel()
	store, err := cli.OpenStore(ctx, *dbURL, 2, log)
	if err != nil {
		return cli.UsageError{Err: err}
	}
	defer store.Close()
	if err := store.CheckSchema(ctx); err != nil {
		return cli.UsageError{Err: err}
	}
	// Even a dry run claims and rolls back: every batch would fail on a
	// read-only session or a pooler that cannot hold a transaction.
	if err := store.CheckWritable(ctx); err != nil {
		return fmt.Errorf("replay: %w", err)
	}
	nc, js, err := nf.Connect("jetinbox-replay", cli.DefaultReconnect(), log)
	if err != nil {
		return cli.UsageError{Err: err}
	}
	defer nc.Close()

	rg := replayRange{from: uint64(*fromSeq), to: uint64(*toSeq), fromTime: start}
	var proc jsinbox.BatchProcessor
	if sm == nil {
		// A shard's database read without its map would apply every
		// partition, outside the fence of a move.
		if err := store.RefuseSharded(ctx, *scope, "replay"); err != nil {
			return err
		}
		newProc := store.DryRunLedgerProcessor
		if *apply {
			newProc = store.LedgerProcessor
		}
		if proc, err = newProc(inbox.Config{Scope: *scope, Logger: log}); err != nil {
			return cli.UsageError{Err: err}
		}
	} else {
		if store.PG == nil {
			return cli.UsageError{Err: errors.New("replay -shards: a shard's database is PostgreSQL")}
		}
		owned, err := shard.Owned(ctx, store.PG, sm.Scope)
		if err != nil {
			return cli.UsageError{Err: err}
		}
		if len(owned) == 0 {
			return cli.UsageError{Err: fmt.Errorf("replay: shard %s owns no partition", sf.Name)}
		}
		// Every batch applies behind the fence: a partition moved away
		// during the replay is refused in the transaction (counted, not
		// applied), whatever the owned set read here says.
		var sp jsinbox.BatchProcessor
		if unsafeReplayPlainProcessor {
			sp, err = newPlainShardProcessor(store, sm, owned, *apply, log)
		} else {
			sp, err = newShardReplayProcessor(store, sm, owned, *apply, log)
		}
		if err != nil {
			return cli.UsageError{Err: err}
		}
		proc = sp
		for _, p := range owned {
			rg.filters = append(rg.filters, sm.Filter(p))
		}
	}
	began := time.Now()
	counts, first, last, err := replay(ctx, js, *stream, rg, *batch, proc)
	if err != nil {
		return err
	}
	if counts.total > 0 {
		some, err := store.HasRows(ctx, *scope)
		if err != nil {
			return fmt.Errorf("replay: %w", err)
		}
		if !some {
			scopes, err := verify.ScopesOn(ctx, verifyDB(store), 20)
			if err != nil {
				return err
			}
			fmt.Fprintln(stdout, "WARNING:", verify.NoRowsWarning(*scope, int(counts.total), scopes))
		}
	}
	mode, applied, rejected := "dry run, rolled back: nothing changed", "would apply", "would be rejected now"
	if *apply {
		mode, applied, rejected = "applied, committed", "applied now", "rejected now"
	}
	fmt.Fprintf(stdout, "replayed %d messages of %s (seq %d-%d) in scope %q in %.1fs (%s)\n",
		counts.total, *stream, first, last, *scope, time.Since(began).Seconds(), mode)
	line := func(label string, n int64, note string) { fmt.Fprintf(stdout, "  %-25s%d%s\n", label, n, note) }
	line("duplicates (no effect)", counts.duplicates, "")
	line("rejected before", counts.rejectedBefore, "  (counted, not dead-lettered again)")
	line("conflicts", counts.conflicts, "  (ID reused with another payload or subject; not applied)")
	if counts.noID > 0 {
		line("without a valid ID", counts.noID, "")
	}
	line(rejected, counts.rejectedNow, "  (no inbox row, and not applicable; not dead-lettered)")
	line(applied, counts.applied, "")
	if counts.notOwned > 0 {
		line("not owned now", counts.notOwned, "  (partitions moved away during the replay: the new owner replays them)")
	}
	if counts.retried > 0 {
		return fmt.Errorf("replay: %d messages failed with retryable errors and were not settled; run replay again", counts.retried)
	}
	if counts.notOwned > 0 {
		return fmt.Errorf("replay: %d messages of partitions moved away during the replay were not replayed here: replay them on the shard that owns them now", counts.notOwned)
	}
	if counts.applied > 0 {
		if *apply {
			return fmt.Errorf("%w: %d applied now", errReplayApplied, counts.applied)
		}
		return fmt.Errorf("%w: %d would be applied; nothing was changed", errReplayApplied, counts.applied)
	}
	fmt.Fprintln(stdout, "effects unchanged: the pipeline is idempotent over this range")
	return nil
}

// replayRange is the part of the stream replay reads: from a sequence or a
// time, up to a sequence (0: the stream's last at the start).
type replayRange struct {
	from, to uint64
	fromTime *time.Time
	// filters, if set, are the only subjects read (a shard's partitions).
	filters []string
}

// replayCounts counts replay outcomes.
type replayCounts struct {
	total, applied, duplicates, rejectedBefore, rejectedNow, conflicts, noID, retried, notOwned int64
	// seen holds the IDs this run applied or rejected itself, so that a
	// later copy in the range counts as what it would meet had the first
	// been committed (a dry run commits nothing).
	seen map[string]inbox.Status
}

func (c *replayCounts) add(m inbox.Message, o inbox.Outcome) {
	c.total++
	if prev, ok := c.seen[m.ID]; ok && m.ID != "" {
		if prev == inbox.StatusApplied {
			c.duplicates++
		} else {
			c.rejectedBefore++
		}
		return
	}
	switch o.Status {
	case inbox.StatusApplied:
		c.applied++
		c.seen[m.ID] = o.Status
	case inbox.StatusDuplicate:
		c.duplicates++
	case inbox.StatusRejected:
		switch {
		case o.AlreadyInInbox:
			c.rejectedBefore++
		case errors.Is(o.Err, inbox.ErrInvalidID):
			c.noID++
		default:
			c.rejectedNow++
			c.seen[m.ID] = o.Status
		}
	case inbox.StatusConflict:
		c.conflicts++
	default:
		if errors.Is(o.Err, shard.ErrNotOwned) {
			c.notOwned++
			return
		}
		c.retried++
	}
}

// replay reads the range with an ordered consumer (no durable, nothing
// acked) and runs it through proc batch by batch. It returns the counts and
// the first and last sequence it read.
func replay(ctx context.Context, js jetstream.JetStream, stream string, rg replayRange, batch int, proc jsinbox.BatchProcessor) (*replayCounts, uint64, uint64, error) {
	counts := &replayCounts{seen: map[string]inbox.Status{}}
	s, err := js.Stream(ctx, stream)
	if err != nil {
		if errors.Is(err, jetstream.ErrStreamNotFound) {
			return nil, 0, 0, streamMissing("replay", stream, err)
		}
		return nil, 0, 0, fmt.Errorf("replay: stream %s: %w", stream, err)
	}
	info, err := s.Info(ctx)
	if err != nil {
		if errors.Is(err, jetstream.ErrStreamNotFound) {
			return nil, 0, 0, streamMissing("replay", stream, err)
		}
		return nil, 0, 0, fmt.Errorf("replay: stream %s: %w", stream, err)
	}
	last := info.State.LastSeq
	if len(rg.filters) > 0 {
		// The read ends at the last message of the filtered subjects, not
		// the stream's: it would wait for more that never come.
		var lastOf uint64
		for _, f := range rg.filters {
			m, err := s.GetLastMsgForSubject(ctx, f)
			if errors.Is(err, jetstream.ErrMsgNotFound) {
				continue
			}
			if err != nil {
				return nil, 0, 0, fmt.Errorf("replay: stream %s, last message of %s: %w", stream, f, err)
			}
			lastOf = max(lastOf, m.Sequence)
		}
		last = min(last, lastOf)
	}
	if rg.to > 0 && rg.to < last {
		last = rg.to
	}
	if info.State.Msgs == 0 || last < max(rg.from, info.State.FirstSeq) {
		return counts, 0, 0, nil
	}
	occ := jetstream.OrderedConsumerConfig{DeliverPolicy: jetstream.DeliverByStartSequencePolicy, OptStartSeq: rg.from}
	if rg.fromTime != nil {
		occ = jetstream.OrderedConsumerConfig{DeliverPolicy: jetstream.DeliverByStartTimePolicy, OptStartTime: rg.fromTime}
	}
	occ.FilterSubjects = rg.filters
	oc, err := s.OrderedConsumer(ctx, occ)
	if err != nil {
		return nil, 0, 0, fmt.Errorf("replay: ordered consumer on %s: %w", stream, err)
	}
	// One ordered consumer pulled continuously: nats.go restarts it on a
	// server that lost it (a cluster's leader change), which a Fetch per
	// batch does not.
	it, err := oc.Messages(jetstream.PullMaxMessages(batch))
	if err != nil {
		return nil, 0, 0, cli.UsageError{Err: fmt.Errorf("replay: read %s: %w", stream, err)}
	}
	defer it.Stop()
	var first, seq uint64
	for seq < last {
		msgs := make([]inbox.Message, 0, batch)
		for len(msgs) < batch && seq < last {
			nctx, cancel := context.WithTimeout(ctx, 10*time.Second)
			m, err := it.Next(jetstream.NextContext(nctx))
			cancel()
			if err != nil {
				return nil, 0, 0, cli.UsageError{Err: fmt.Errorf("replay: read %s: stopped at sequence %d of %d: %w", stream, seq, last, err)}
			}
			md, err := m.Metadata()
			if err != nil {
				return nil, 0, 0, cli.UsageError{Err: fmt.Errorf("replay: read %s: %w", stream, err)}
			}
			if md.Sequence.Stream > last {
				seq = last
				break
			}
			seq = md.Sequence.Stream
			if first == 0 {
				first = seq
			}
			// A replayed message has been delivered before: Deliveries 2
			// makes the processor claim it with conflict checks at once.
			im := jsinbox.InboxMessage(m)
			im.Deliveries = 2
			msgs = append(msgs, im)
		}
		if len(msgs) == 0 {
			break
		}
		out, err := proc.Process(ctx, msgs)
		if err != nil {
			return nil, 0, 0, fmt.Errorf("replay: batch ending at sequence %d: %w", seq, err)
		}
		for i := range msgs {
			counts.add(msgs[i], out[i])
		}
		if afterReplayBatch != nil {
			afterReplayBatch(seq)
		}
	}
	return counts, first, seq, nil
}

// afterReplayBatch, if set, runs after each batch (tests move a partition
// there).
var afterReplayBatch func(seq uint64)

// unsafeReplayPlainProcessor restores, for the test that shows the hole, a
// sharded replay through the plain ledger processor with the owned set read
// once at start and no fence.
var unsafeReplayPlainProcessor bool

// newShardReplayProcessor is the shard's processor for a replay: the
// binding check, the fence in every transaction, rolled back unless apply.
func newShardReplayProcessor(store *cli.Store, m *shard.Map, owned shard.Set, apply bool, log *slog.Logger) (jsinbox.BatchProcessor, error) {
	sp, err := store.ShardLedgerProcessor(m, inbox.Config{Logger: log}, !apply)
	if err != nil {
		return nil, err
	}
	sp.SetOwned(owned)
	return sp, nil
}

func newPlainShardProcessor(store *cli.Store, m *shard.Map, owned shard.Set, apply bool, log *slog.Logger) (jsinbox.BatchProcessor, error) {
	newProc := store.DryRunLedgerProcessor
	if apply {
		newProc = store.LedgerProcessor
	}
	proc, err := newProc(inbox.Config{Scope: m.Scope, Logger: log})
	if err != nil {
		return nil, err
	}
	sp := shard.NewProcessor(proc, m)
	sp.SetOwned(owned)
	return sp, nil
}
