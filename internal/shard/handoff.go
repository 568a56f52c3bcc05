// One durable per shard (a map's shard_durables), and the hand-off of a
// partition moved between two such durables.
//
// A shard's durable is filtered on the partitions it owns. NATS never
// moves a durable back when a filter is added: a partition moved to a
// shard would be read from where that shard's durable stands, past every
// message of it the source had not applied yet. And a message the source
// holds keeps being redelivered to it whatever its filter says. So a move
// first makes a hand-off durable on the partition alone, starting right
// after the source durable's ack floor: every message of the partition
// from there on reaches whoever owns it, through the hand-off, and the
// source may ack without applying what still reaches it of the partition
// (its row says from which sequence). The owner runs the hand-off until
// its own durable, now filtered on the partition too, covers the rest,
// then deletes it. A second move of the partition waits for that.

package shard

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/jetinbox/jetinbox/inbox/jsinbox"
)

// ErrHandOffRunning is the error of a move of a partition whose hand-off
// from an earlier move, between other shards, has not ended: the new
// owner is still reading what the old one left. Run the move again once
// it ended (the new owner deletes the hand-off durable).
var ErrHandOffRunning = errors.New("shard: the partition's hand-off from an earlier move is still running")

// ErrRescuePending is the error of a move whose source has messages the
// server gave up on (max deliveries) that its rescue has not applied yet.
// The source's ack floor has passed them, so the hand-off would not
// deliver them, and once the partition is gone the source would not apply
// them either. Run the move again once the source's rescue backlog is
// empty (it applies them while the source owns the partition).
var ErrRescuePending = errors.New("shard: the source's rescue has messages to apply first")

// handOffSettle is how long a move waits, after it read the source's ack
// floor, before it reads the source's rescue backlog: the server queues a
// max-deliveries advisory as it moves the floor past the message, and
// stores it a moment later.
const handOffSettle = time.Second

// The hand-off durable's metadata: the move it belongs to.
const (
	metaHandOffFrom = "jetinbox_handoff_from"
	metaHandOffTo   = "jetinbox_handoff_to"
)

// prepareHandOff makes (or finds, for a move run again) partition p's
// hand-off durable and returns its first sequence, and whether the
// source's row said it owned p. The first sequence is right after the ack
// floor of the source's durable: that durable is filtered on p until its
// row records the hand-off (see [Runner]), so its ack floor cannot pass a
// message of p it did not ack, and it acked only what it applied:
// everything of p it did not apply is at or after the start.
//
// While the source owns p, nobody reads a hand-off of it to another shard,
// so one found then (left by a move that stopped before its fence) is made
// anew, from the floor as it is now. One handed back to the source (a
// give-back after the fence) is the source's to read: the move waits for
// it. After the fence, the hand-off must be this move's, and starts where
// the source's row says.
func prepareHandOff(ctx context.Context, m *Map, p int, from, to Side, o MoveOptions) (uint64, bool, error) {
	if o.JS == nil {
		return 0, false, errors.New("shard: the map has shard_durables: a move needs JetStream for the partition's hand-off durable")
	}
	var (
		owned    bool
		recorded *int64
		movedTo  *string
	)
	err := from.Pool.QueryRow(ctx, `SELECT owned, handoff_from, moved_to FROM jetinbox_partitions WHERE scope = $1 AND partition = $2`, m.Scope, p).Scan(&owned, &recorded, &movedTo)
	if errors.Is(err, pgx.ErrNoRows) {
		return 0, false, fmt.Errorf("shard: the source %s never owned partition %d (its table has no row for it): check the map and run jetinbox partitions list", from.Name, p)
	}
	if err != nil {
		return 0, false, fmt.Errorf("shard: source %s: %w", from.Name, err)
	}
	if o.UnsafeNoHandOff {
		return 1, owned, nil
	}
	if !owned && movedTo != nil && *movedTo != to.Name && !o.UnsafeAnyGivenAway {
		// Given to another shard: no hand-off for this target (the fence
		// refuses the move too, but a hand-off made first would stay).
		return 0, false, fmt.Errorf("%w: %s gave partition %d to shard %s, not %s: finish that move (jetinbox partitions move %d --to %s) or move it back (--to %s)",
			ErrOtherTarget, from.Name, p, *movedTo, to.Name, p, *movedTo, from.Name)
	}
	name := m.HandOff(p)
	c, err := o.JS.Consumer(ctx, m.Stream, name)
	switch {
	case errors.Is(err, jetstream.ErrConsumerNotFound):
	case err != nil:
		return 0, false, fmt.Errorf("shard: hand-off durable %s: %w", name, err)
	default:
		md := c.CachedInfo().Config.Metadata
		switch {
		case !owned && md[metaHandOffFrom] == from.Name && md[metaHandOffTo] == from.Name && movedTo != nil && *movedTo == to.Name:
			// A give-back that handed the hand-off to the source and
			// did not commit: nobody has read it; this move's again.
			if err := retargetUnreturned(ctx, m, o.JS, p, from, to.Name); err != nil {
				return 0, false, err
			}
			return c.CachedInfo().Config.OptStartSeq, false, nil
		case md[metaHandOffTo] == from.Name && md[metaHandOffTo] != "":
			// Given back to the source, which reads it to the end.
			_, err := handOffOf(c.CachedInfo(), p, from.Name, to.Name)
			return 0, false, err
		case !owned && md[metaHandOffFrom] == from.Name && md[metaHandOffTo] == to.Name:
			// Made by an earlier run of this move, fenced since.
			return c.CachedInfo().Config.OptStartSeq, false, nil
		case !owned && md[metaHandOffTo] != "":
			_, err := handOffOf(c.CachedInfo(), p, from.Name, to.Name)
			return 0, false, err
		}
		// Left by a move that stopped before its fence, or without the
		// metadata of a move: nobody has read it for the move; made anew.
		if err := deleteUnfencedHandOff(ctx, m, o.JS, p, from); err != nil {
			return 0, false, err
		}
	}
	var start uint64
	if !owned && recorded != nil && *recorded > 0 {
		// Fenced by an earlier run of this move, whose hand-off durable
		// is gone before the target took the partition: the source has
		// acked from the recorded start on, so the hand-off starts there.
		start = uint64(*recorded)
	} else {
		src, err := o.JS.Consumer(ctx, m.Stream, m.ShardDurable(from.Name))
		switch {
		case errors.Is(err, jetstream.ErrConsumerNotFound):
			start = 1 // the source never consumed: all of it
		case err != nil:
			return 0, false, fmt.Errorf("shard: the source's durable %s: %w", m.ShardDurable(from.Name), err)
		default:
			start = src.CachedInfo().AckFloor.Stream + 1
		}
	}
	d := jsinbox.ConsumerConfig{Stream: m.Stream}.WithDefaults()
	cfg := jetstream.ConsumerConfig{
		Durable:       name,
		AckPolicy:     jetstream.AckExplicitPolicy,
		AckWait:       d.AckWait,
		MaxDeliver:    d.MaxDeliver,
		MaxAckPending: d.MaxAckPending,
		MaxWaiting:    512,
		FilterSubject: m.Filter(p),
		DeliverPolicy: jetstream.DeliverByStartSequencePolicy,
		OptStartSeq:   start,
		Metadata:      map[string]string{metaHandOffFrom: from.Name, metaHandOffTo: to.Name},
	}
	if _, err := o.JS.CreateConsumer(ctx, m.Stream, cfg); err != nil {
		if errors.Is(err, jetstream.ErrConsumerExists) {
			// Another move of p made one meanwhile.
			return 0, false, fmt.Errorf("%w: another move of partition %d made %s meanwhile: %v", ErrHandOffRunning, p, name, err)
		}
		return 0, false, fmt.Errorf("shard: make the hand-off durable %s of partition %d: %w", name, p, err)
	}
	if owned {
		// Before the fence, the source's rescue must have applied what
		// the server gave up on (see [ErrRescuePending]); checked after
		// the hand-off is made, so that nothing given up on later escapes
		// both.
		if err := sourceRescued(ctx, m, o.JS, from.Name); err != nil {
			return 0, false, err
		}
	}
	return start, owned, nil
}

// deleteUnfencedHandOff deletes partition p's hand-off durable while the
// source's row, locked, says it owns p: a fence, which must find its own
// hand-off under the same row's lock, cannot commit in between and lose
// the hand-off it made.
func deleteUnfencedHandOff(ctx context.Context, m *Map, js jetstream.JetStream, p int, from Side) error {
	tx, err := from.Pool.Begin(ctx)
	if err != nil {
		return fmt.Errorf("shard: source %s: %w", from.Name, err)
	}
	defer tx.Rollback(ctx) //nolint:errcheck // read only
	if err := moveSettings(ctx, tx); err != nil {
		return fmt.Errorf("shard: source %s: %w", from.Name, err)
	}
	var owned bool
	if err := tx.QueryRow(ctx, `SELECT owned FROM jetinbox_partitions WHERE scope = $1 AND partition = $2 FOR SHARE`, m.Scope, p).Scan(&owned); err != nil {
		return fmt.Errorf("shard: source %s: %w", from.Name, err)
	}
	if !owned {
		return fmt.Errorf("%w: partition %d was fenced by another move meanwhile", ErrHandOffRunning, p)
	}
	if err := js.DeleteConsumer(ctx, m.Stream, m.HandOff(p)); err != nil && !errors.Is(err, jetstream.ErrConsumerNotFound) {
		return fmt.Errorf("shard: replace the hand-off durable %s: %w", m.HandOff(p), err)
	}
	return nil
}

// retargetUnreturned hands partition p's hand-off back to the move's
// target while the source's row, locked, still says p was given to it: a
// give-back, which holds the row FOR UPDATE while it hands the hand-off to
// the source and commits, cannot be undone halfway by this.
func retargetUnreturned(ctx context.Context, m *Map, js jetstream.JetStream, p int, from Side, to string) error {
	tx, err := from.Pool.Begin(ctx)
	if err != nil {
		return fmt.Errorf("shard: source %s: %w", from.Name, err)
	}
	defer tx.Rollback(ctx) //nolint:errcheck // read only
	if err := moveSettings(ctx, tx); err != nil {
		return fmt.Errorf("shard: source %s: %w", from.Name, err)
	}
	var (
		owned   bool
		movedTo *string
	)
	if err := tx.QueryRow(ctx, `SELECT owned, moved_to FROM jetinbox_partitions WHERE scope = $1 AND partition = $2 FOR SHARE`, m.Scope, p).Scan(&owned, &movedTo); err != nil {
		return fmt.Errorf("shard: source %s: %w", from.Name, err)
	}
	if owned || movedTo == nil || *movedTo != to {
		return fmt.Errorf("%w: partition %d was given back to %s meanwhile", ErrHandOffRunning, p, from.Name)
	}
	return retargetHandOff(ctx, m, js, p, to)
}

// handOffStill fails unless partition p's hand-off durable exists and
// hands it from from to to.
func handOffStill(ctx context.Context, m *Map, js jetstream.JetStream, p int, from, to string) error {
	c, err := js.Consumer(ctx, m.Stream, m.HandOff(p))
	if err != nil {
		return fmt.Errorf("shard: the hand-off durable %s of partition %d is gone (%w): run the move again", m.HandOff(p), p, err)
	}
	_, err = handOffOf(c.CachedInfo(), p, from, to)
	return err
}

// sourceRescued fails with [ErrRescuePending] if the source shard's
// durable has max-deliveries advisories its rescue has not settled: the
// messages they name may be the moved partition's, behind the hand-off's
// start. Their rescue needs the partition, so it must end before the
// fence.
func sourceRescued(ctx context.Context, m *Map, js jetstream.JetStream, source string) error {
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-time.After(handOffSettle):
	}
	durable := m.ShardDurable(source)
	adv, err := js.Stream(ctx, jsinbox.AdvisoryStream(m.Stream))
	if errors.Is(err, jetstream.ErrStreamNotFound) {
		return nil // no advisory was ever kept
	}
	if err != nil {
		return fmt.Errorf("shard: the advisory stream: %w", err)
	}
	var backlog uint64
	rc, err := adv.Consumer(ctx, durable)
	switch {
	case err == nil:
		i := rc.CachedInfo()
		backlog = i.NumPending + uint64(i.NumAckPending)
	case errors.Is(err, jetstream.ErrConsumerNotFound):
		// Never rescued: every advisory kept for the durable waits.
		subject := "$JS.EVENT.ADVISORY.CONSUMER.MAX_DELIVERIES." + m.Stream + "." + durable
		info, err := adv.Info(ctx, jetstream.WithSubjectFilter(subject))
		if err != nil {
			return fmt.Errorf("shard: the advisory stream: %w", err)
		}
		backlog = info.State.Subjects[subject]
	default:
		return fmt.Errorf("shard: the rescue durable %s: %w", durable, err)
	}
	if backlog > 0 {
		return fmt.Errorf("%w: %d advisories of %s await its rescue; run the move again once the source's consumer applied them", ErrRescuePending, backlog, durable)
	}
	return nil
}

// handOffOf returns the start of an existing hand-off durable if it is this
// move's (from and to), and ErrHandOffRunning if it is another's.
func handOffOf(info *jetstream.ConsumerInfo, p int, from, to string) (uint64, error) {
	md := info.Config.Metadata
	if md[metaHandOffFrom] != from || md[metaHandOffTo] != to {
		return 0, fmt.Errorf("%w: %s hands partition %d from %q to %q; move it once %q deleted it",
			ErrHandOffRunning, info.Name, p, md[metaHandOffFrom], md[metaHandOffTo], md[metaHandOffTo])
	}
	return info.Config.OptStartSeq, nil
}

// shardState is what a shard's partition table says, for a runner with
// one durable per shard.
type shardState struct {
	owned Set
	// filter: the partitions the shard's durable reads. Those owned, and
	// those given away with no hand-off recorded, so that the durable's
	// ack floor cannot pass a message of theirs it did not ack.
	filter Set
	// handedOff[p]: the first sequence of p's hand-off, for p given away
	// with one (0: none).
	handedOff []uint64
}

func (r *Runner) readState(ctx context.Context) (shardState, error) {
	rows, err := Rows(ctx, r.Pool, r.Map.Scope)
	if err != nil {
		return shardState{}, err
	}
	st := shardState{handedOff: make([]uint64, r.Map.Partitions)}
	for _, row := range rows {
		if row.Partition >= r.Map.Partitions {
			continue
		}
		switch {
		case row.Owned:
			st.owned = append(st.owned, row.Partition)
			st.filter = append(st.filter, row.Partition)
		case row.HandOffFrom == 0:
			st.filter = append(st.filter, row.Partition)
		default:
			st.handedOff[row.Partition] = row.HandOffFrom
		}
	}
	return st, nil
}

// filters returns the filter subjects of a set of partitions.
func (m *Map) filters(s Set) []string {
	f := make([]string, len(s))
	for i, p := range s {
		f[i] = m.Filter(p)
	}
	return f
}

// applyShard brings the shard's durable and hand-offs in line with st:
// the processor first (it refuses a partition before its durable stops
// reading it), then the durable's filter, then the hand-offs of the
// partitions owned.
func (r *Runner) applyShard(ctx context.Context, st shardState) {
	r.Proc.SetOwned(st.owned)
	r.Proc.SetHandedOff(st.handedOff)
	r.mu.Lock()
	same := r.main != nil && slices.Equal(r.mainFilter, st.filter)
	r.mu.Unlock()
	if !same && (r.main != nil || len(st.filter) > 0) {
		r.restartMain(ctx, st)
	}
	r.runHandOffs(ctx, st)
}

// restartMain stops the shard durable's consumer, sets the durable's
// filter to st's (creating it if missing) and starts it again, if it has
// partitions to read.
func (r *Runner) restartMain(ctx context.Context, st shardState) {
	r.mu.Lock()
	old, oldFilter := r.main, r.mainFilter
	r.main, r.mainFilter = nil, nil
	r.mu.Unlock()
	if old != nil {
		old.stop()
	}
	durable := r.Map.ShardDurable(r.Name)
	if len(st.filter) == 0 {
		// Every partition handed off: what the durable still holds of them
		// is at or after their hand-offs' starts. Deleted, so that the
		// next partition moved in is not read from where it stopped.
		if err := r.JS.DeleteConsumer(ctx, r.Map.Stream, durable); err != nil && !errors.Is(err, jetstream.ErrConsumerNotFound) {
			r.Logger.Warn("shard: deleting the shard's durable, which has no partition left, failed", "durable", durable, "err", err)
		}
		r.Logger.Info("shard: no partition left to read; the shard's durable stops")
		return
	}
	filter := st.filter
	if err := r.setFilter(ctx, durable, filter); err != nil {
		if old == nil {
			r.Logger.Warn("shard: setting the shard durable's partitions failed; retrying at the next poll", "durable", durable, "err", err)
			return
		}
		// Read on with the partitions it had: the processor already
		// refuses those given away, and the next poll tries again.
		r.Logger.Warn("shard: setting the shard durable's partitions failed; reading on with the ones it had, retrying at the next poll", "durable", durable, "err", err)
		r.mu.Lock()
		filter = oldFilter
		r.mu.Unlock()
	}
	cfg := r.Consumer
	if r.MaxBytes > 0 {
		// Three quarters; the rest for two hand-offs at a time.
		cfg.MaxBytes = max(r.MaxBytes-r.MaxBytes/4, 1<<20)
	}
	cfg.Stream, cfg.Durable, cfg.FilterSubjects = r.Map.Stream, durable, r.Map.filters(filter)
	cfg.Batcher = r.batcher
	run := r.startConsumer(ctx, -1, cfg, r.Proc)
	r.mu.Lock()
	r.main, r.mainFilter = run, slices.Clone(filter)
	r.mu.Unlock()
	r.Logger.Info("shard: the shard's durable reads its partitions", "durable", durable, "partitions", filter.String())
}

// setFilter makes durable read the partitions of filter: it creates it if
// it is missing, or changes its filter subjects. A durable created for
// partitions that all came with hand-offs to this shard starts where the
// earliest of those starts (they deliver everything of their partitions
// from there); any other starts at the stream's beginning.
func (r *Runner) setFilter(ctx context.Context, durable string, filter Set) error {
	subjects := r.Map.filters(filter)
	c, err := r.JS.Consumer(ctx, r.Map.Stream, durable)
	if errors.Is(err, jetstream.ErrConsumerNotFound) {
		d := r.Consumer.WithDefaults()
		cfg := jetstream.ConsumerConfig{
			Durable:        durable,
			AckPolicy:      jetstream.AckExplicitPolicy,
			AckWait:        d.AckWait,
			MaxDeliver:     d.MaxDeliver,
			MaxAckPending:  d.MaxAckPending,
			MaxWaiting:     512,
			FilterSubjects: subjects,
		}
		starts, err := r.handOffStarts(ctx)
		if err != nil {
			return err
		}
		var first uint64
		for _, p := range filter {
			s, ok := starts[p]
			if !ok {
				first = 0
				break
			}
			if first == 0 || s < first {
				first = s
			}
		}
		if first > 0 {
			cfg.DeliverPolicy, cfg.OptStartSeq = jetstream.DeliverByStartSequencePolicy, first
		}
		_, err = r.JS.CreateConsumer(ctx, r.Map.Stream, cfg)
		return err
	}
	if err != nil {
		return err
	}
	cfg := c.CachedInfo().Config
	if slices.Equal(cfg.FilterSubjects, subjects) {
		return nil
	}
	cfg.FilterSubject, cfg.FilterSubjects = "", subjects
	_, err = r.JS.UpdateConsumer(ctx, r.Map.Stream, cfg)
	return err
}

// runHandOffs starts the consumer of every hand-off durable to this shard
// of a partition it owns, and ends those whose work is done. A hand-off
// to another shard is left alone even while this shard owns its partition:
// its source owns it until the fence, and must neither read it (its
// messages are for the target) nor end it.
func (r *Runner) runHandOffs(ctx context.Context, st shardState) {
	names, err := r.handOffsTo(ctx)
	if err != nil {
		r.Logger.Warn("shard: listing the hand-off durables failed; retrying at the next poll", "err", err)
		return
	}
	// Only this poll changes r.handOffs; the lock is for the readers
	// (Ready, RescueBacklog), never held while a consumer stops.
	r.mu.Lock()
	running := maps.Clone(r.handOffs)
	hasMain := r.main != nil
	r.mu.Unlock()
	stop := func(p int, hr *partitionRun) {
		hr.stop()
		r.mu.Lock()
		delete(r.handOffs, p)
		r.mu.Unlock()
		delete(running, p)
	}
	for p, hr := range running {
		if !slices.Contains(st.owned, p) || !names[p] {
			// Given back before it ended (its next owner runs it), or
			// deleted.
			stop(p, hr)
		}
	}
	for _, p := range st.owned {
		if !names[p] || running[p] != nil {
			continue
		}
		cfg := r.Consumer
		if r.MaxBytes > 0 {
			cfg.MaxBytes = max(r.MaxBytes/8, 1<<20)
		}
		cfg.Stream, cfg.Durable, cfg.FilterSubjects = r.Map.Stream, r.Map.HandOff(p), []string{r.Map.Filter(p)}
		// A batcher of its own: a batcher's batches run through one
		// processor, and the hand-off's never acks unapplied.
		b := jsinbox.NewBatcher(r.Consumer.BatchSize, r.Consumer.InFlight)
		bctx, stopB := context.WithCancel(context.WithoutCancel(ctx))
		bdone := make(chan struct{})
		go func() {
			defer close(bdone)
			b.Run(bctx)
		}()
		cfg.Batcher = b
		hr := r.startConsumer(ctx, p, cfg, r.Proc.HandOffProcessor())
		hr.stopBatcher = func() {
			stopB()
			<-bdone
		}
		r.mu.Lock()
		r.handOffs[p] = hr
		r.mu.Unlock()
		running[p] = hr
		r.Logger.Info("shard: reading a moved partition's hand-off", "partition", p, "durable", cfg.Durable)
	}
	if len(running) == 0 || !hasMain {
		return
	}
	main, err := r.JS.Consumer(ctx, r.Map.Stream, r.Map.ShardDurable(r.Name))
	if err != nil {
		return
	}
	mi := main.CachedInfo()
	for p, hr := range running {
		if !slices.Contains(mi.Config.FilterSubjects, r.Map.Filter(p)) {
			continue
		}
		if done, err := r.handOffDone(ctx, p, hr, mi.Delivered.Stream); err != nil || !done {
			continue
		}
		stop(p, hr)
		name := r.Map.HandOff(p)
		if err := r.JS.DeleteConsumer(ctx, r.Map.Stream, name); err != nil && !errors.Is(err, jetstream.ErrConsumerNotFound) {
			r.Logger.Warn("shard: deleting a finished hand-off durable failed; it is read again until deleted", "durable", name, "err", err)
			continue
		}
		if err := r.JS.DeleteConsumer(ctx, jsinbox.AdvisoryStream(r.Map.Stream), name); err != nil && !errors.Is(err, jetstream.ErrConsumerNotFound) {
			r.Logger.Warn("shard: deleting a finished hand-off's rescue durable failed", "durable", name, "err", err)
		}
		r.Logger.Info("shard: a moved partition's hand-off ended; the shard's durable reads it on its own", "partition", p, "durable", name)
	}
}

// handOffDone reports whether partition p's hand-off has delivered, and
// seen settled, every message of p up to through, the last sequence the
// shard's durable had passed when it already read p: from there on the
// durable delivers p itself. Or, with nothing left of p in the stream to
// deliver and nothing unacked, everything there is.
func (r *Runner) handOffDone(ctx context.Context, p int, hr *partitionRun, through uint64) (bool, error) {
	hr.mu.Lock()
	c := hr.c
	hr.mu.Unlock()
	if c == nil || !c.Ready() {
		return false, nil
	}
	done := func() (bool, uint64, error) {
		h, err := r.JS.Consumer(ctx, r.Map.Stream, r.Map.HandOff(p))
		if err != nil {
			return false, 0, err
		}
		i := h.CachedInfo()
		return i.NumAckPending == 0 && (i.Delivered.Stream >= through || i.NumPending == 0), i.Delivered.Stream, nil
	}
	if ok, _, err := done(); err != nil || !ok {
		return false, err
	}
	// The hand-off's own give-ups first: a message dropped at its last
	// delivery leaves the pending count before its advisory is stored, so
	// the advisories are counted a moment after the count looked done, and
	// the count must still look so, with nothing delivered since.
	_, delivered, _ := done()
	select {
	case <-ctx.Done():
		return false, ctx.Err()
	case <-time.After(handOffSettle):
	}
	if n, err := c.RescueBacklog(ctx); err != nil || n > 0 {
		return false, err
	}
	ok, again, err := done()
	return ok && again == delivered, err
}

// handOffsTo returns the partitions whose hand-off durables exist and
// hand them to this shard.
func (r *Runner) handOffsTo(ctx context.Context) (map[int]bool, error) {
	starts, err := r.handOffStarts(ctx)
	out := make(map[int]bool, len(starts))
	for p := range starts {
		out[p] = true
	}
	return out, err
}

// handOffStarts returns, for each partition whose hand-off durable exists
// and hands it to this shard, the hand-off's first sequence.
func (r *Runner) handOffStarts(ctx context.Context) (map[int]uint64, error) {
	prefix := r.Map.DurablePrefix + "_h"
	s, err := r.JS.Stream(ctx, r.Map.Stream)
	if err != nil {
		return nil, err
	}
	infos := s.ListConsumers(ctx)
	out := map[int]uint64{}
	for i := range infos.Info() {
		if rest, ok := strings.CutPrefix(i.Name, prefix); ok && i.Config.Metadata[metaHandOffTo] == r.Name {
			if p, err := strconv.Atoi(rest); err == nil && r.Map.HandOff(p) == i.Name {
				out[p] = i.Config.OptStartSeq
			}
		}
	}
	return out, infos.Err()
}

// retargetHandOff makes partition p's hand-off durable, if any, hand the
// partition to shard to (its source given it back, see [UnfenceWith]).
func retargetHandOff(ctx context.Context, m *Map, js jetstream.JetStream, p int, to string) error {
	c, err := js.Consumer(ctx, m.Stream, m.HandOff(p))
	if errors.Is(err, jetstream.ErrConsumerNotFound) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("shard: hand-off durable %s: %w", m.HandOff(p), err)
	}
	cfg := c.CachedInfo().Config
	if cfg.Metadata[metaHandOffTo] == to {
		return nil
	}
	md := map[string]string{}
	for k, v := range cfg.Metadata {
		md[k] = v
	}
	md[metaHandOffTo] = to
	cfg.Metadata = md
	if _, err := js.UpdateConsumer(ctx, m.Stream, cfg); err != nil {
		return fmt.Errorf("shard: hand the hand-off durable %s to %s: %w", m.HandOff(p), to, err)
	}
	return nil
}
