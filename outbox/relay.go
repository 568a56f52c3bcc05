package outbox

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/cenkalti/backoff/v4"
	"github.com/nats-io/nats.go/jetstream"
	"go.opentelemetry.io/otel/trace"

	"github.com/jetinbox/jetinbox/inbox"
	"github.com/jetinbox/jetinbox/inbox/jsinbox"
	"github.com/jetinbox/jetinbox/internal/hook"
	"github.com/jetinbox/jetinbox/jitter"
)

// Channel is the PostgreSQL notification channel the outbox table's trigger
// notifies at each COMMIT that added rows, and relays LISTEN on.
const Channel = "jetinbox_outbox"

// RelayConfig configures a [Relay].
type RelayConfig struct {
	// Stream is the stream every row must be stored in: a row whose
	// subject another stream captures is refused for good (see
	// [jsinbox.ErrWrongStream]) and marked failed. Required.
	Stream string
	// Batch is the most rows one round locks, publishes and marks, in one
	// transaction. Default 500.
	Batch int
	// Publisher configures the publisher the relay sends through; its
	// Stream is the relay's. Its Retry bounds how long one round retries
	// a publish before leaving the row pending for a later round; the
	// default is shorter than the publisher's own (5 retries, 30 s in
	// all), since the round's rows stay locked meanwhile. Its Batch is the
	// group commit of PublishEach; PublishAtomic gathers its own batches.
	Publisher jsinbox.PublisherConfig
	// Publish is how a round publishes its rows: [PublishAtomic] (the
	// default), [PublishEach] or [PublishFast].
	Publish PublishMode
	// Sequential, with PublishAtomic or PublishFast, makes each round mark and commit its
	// rows before the next round takes any. By default, while rows keep
	// coming (a round took Batch rows), a round's marks overlap the next
	// round's take and publish (see [Relay.Drain]).
	Sequential bool
	// Idle times the waits between rounds when there is nothing to send:
	// a relay wakes at once on a notification from PostgreSQL, and polls
	// after these jittered waits (growing from Base to Cap while idle)
	// in case a notification was missed. Default: Decorrelated, 1 s to
	// 10 s.
	Idle jitter.Policy
	// Retry times the waits after a round failed (the database or NATS
	// unreachable, publishes left pending). Default: Decorrelated, 100 ms
	// to 10 s, no limit.
	Retry jitter.Policy
	// NoListen turns LISTEN/NOTIFY off: the relay only polls, with Idle's
	// waits.
	NoListen bool
	// Logger receives a line per failed round and per row refused for
	// good, and is the publisher's unless Publisher.Logger is set.
	// Default: discard.
	Logger *slog.Logger
	// TracerProvider, when set, traces each publish (the publisher's,
	// unless Publisher.TracerProvider is set): the same field as on the
	// processor, the consumer and the publisher.
	TracerProvider trace.TracerProvider
	// Observer, if set, is told after each round that marked rows sent
	// how long each row waited from its transaction's start to being
	// marked (by the database's clock on PostgreSQL, the relay machine's
	// on SQLite). For metrics and measurements. An Observer that also has
	// a method Attach(*Relay) (metrics.Relay does, for its counters) is
	// attached by NewRelay.
	Observer RelayObserver
}

// RelayObserver hears how long the rows a round marked sent waited.
type RelayObserver interface {
	ObserveSent(lags []time.Duration)
}

// SentFunc is a function used as a [RelayObserver].
type SentFunc func(lags []time.Duration)

// ObserveSent calls f(lags).
func (f SentFunc) ObserveSent(lags []time.Duration) { f(lags) }

func (c RelayConfig) withDefaults() RelayConfig {
	if c.Batch <= 0 {
		c.Batch = 500
	}
	if unset(c.Publisher.Retry) {
		c.Publisher.Retry = jitter.Policy{Kind: jitter.Decorrelated, Base: 100 * time.Millisecond, Cap: 5 * time.Second, MaxAttempts: 5, MaxElapsed: 30 * time.Second}
	}
	c.Publisher.Stream = c.Stream
	if unset(c.Idle) {
		c.Idle = jitter.Policy{Kind: jitter.Decorrelated, Base: time.Second, Cap: 10 * time.Second}
	}
	if unset(c.Retry) {
		c.Retry = jitter.Policy{Kind: jitter.Decorrelated, Base: 100 * time.Millisecond, Cap: 10 * time.Second}
	}
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
	return c
}

// unset reports a policy left at its zero value, which takes the relay's
// default rather than jitter's.
func unset(p jitter.Policy) bool {
	return p.Kind == 0 && p.Base == 0 && p.Cap == 0 && p.MaxAttempts == 0 && p.MaxElapsed == 0
}

func (c RelayConfig) validate() error {
	var errs []error
	if c.Stream == "" {
		errs = append(errs, errors.New("outbox: relay: Stream is required"))
	}
	for _, p := range []struct {
		name string
		p    jitter.Policy
	}{{"Idle", c.Idle}, {"Retry", c.Retry}, {"Publisher.Retry", c.Publisher.Retry}} {
		if err := p.p.Validate(); err != nil {
			errs = append(errs, fmt.Errorf("outbox: relay: %s: %w", p.name, err))
		}
	}
	return errors.Join(errs...)
}

// RelayStats counts what a relay did.
type RelayStats struct {
	// Rounds that locked at least one row.
	Rounds int64
	// Sent: rows marked sent (their publish acknowledged, as new or as a
	// duplicate of a copy the stream already held).
	Sent int64
	// Duplicates: of those, rows the stream already held (published
	// before by a relay that died before marking them, or, on SQLite,
	// that outlived its lease).
	Duplicates int64
	// Failed: rows refused for good and marked failed (an ID the stream
	// holds with another payload, a subject another stream captures).
	Failed int64
	// Retried: rows left pending by a round whose publish did not get
	// through in time; a later round sends them.
	Retried int64
	// TakenOver: rows a round published but could not mark, because its
	// hold had lapsed and another relay had taken them since (on SQLite,
	// a round that outlived its lease). That relay publishes them again
	// and marks them; they are not counted as sent or failed here.
	TakenOver int64
	// Batches: atomic batches the stream stored as a whole (see
	// [PublishAtomic] and [jsinbox.PublisherConfig].Batch); Fallbacks:
	// batches it refused as a whole, whose rows went again one by one.
	Batches, Fallbacks int64
	// FastBatches: fast batches (see [PublishFast]) the stream
	// acknowledged to their last row; FastShort: those it acknowledged
	// only in part, whose other rows went again as atomic batches.
	FastBatches, FastShort int64
}

// Relay publishes the outbox's pending rows to JetStream and marks them sent.
// Run it in every process that should help, or in one: relays share the rows
// without a leader (see the package documentation).
type Relay struct {
	src Source
	js  jetstream.JetStream
	cfg RelayConfig

	mu  sync.Mutex
	pub *jsinbox.Publisher

	rounds, sent, duplicates, failed, retried, takenOver atomic.Int64
	batches, fallbacks                                   atomic.Int64
	fastBatches, fastShort                               atomic.Int64
	// noFast is set once the stream refused a fast batch for not
	// allowing them: PublishFast publishes as PublishAtomic from then on.
	noFast atomic.Bool

	// hook, nil unless a harness attached one (internal/hook), stops the
	// relay at its points; it is attached to the publisher too.
	hook hook.Func
}

func init() {
	hook.Register(func(target any, f hook.Func) bool {
		r, ok := target.(*Relay)
		if ok {
			r.mu.Lock()
			r.hook = f
			hook.Attach(r.pub, f)
			r.mu.Unlock()
		}
		return ok
	})
}

func (r *Relay) fires(pt hook.Point) bool { return r.hook != nil && r.hook(pt) }

// NewRelay returns a relay that takes the outbox's rows from src
// (a *pgoutbox.Store or *sqliteoutbox.Store, such as an inbox store's
// Outbox(), or a Source of the caller's own) and publishes through js.
// [Relay.Run] runs it.
func NewRelay(src Source, js jetstream.JetStream, cfg RelayConfig) (*Relay, error) {
	cfg = cfg.withDefaults()
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	if src == nil || js == nil {
		return nil, errors.New("outbox: relay: a source and a JetStream client are required")
	}
	r := &Relay{src: src, js: js, cfg: cfg}
	if cfg.Publisher.Logger == nil {
		cfg.Publisher.Logger = cfg.Logger
	}
	if cfg.Publisher.TracerProvider == nil {
		cfg.Publisher.TracerProvider = cfg.TracerProvider
	}
	pub, err := jsinbox.NewPublisher(js, cfg.Publisher)
	if err != nil {
		return nil, fmt.Errorf("outbox: relay: %w", err)
	}
	r.pub = pub
	if a, ok := cfg.Observer.(interface{ Attach(*Relay) }); ok {
		a.Attach(r) // its counters read this relay: no second step to forget
	}
	return r, nil
}

// Stats returns the counters so far.
func (r *Relay) Stats() RelayStats {
	return RelayStats{Rounds: r.rounds.Load(), Sent: r.sent.Load(), Duplicates: r.duplicates.Load(), Failed: r.failed.Load(), Retried: r.retried.Load(),
		TakenOver: r.takenOver.Load(), Batches: r.batches.Load(), Fallbacks: r.fallbacks.Load(),
		FastBatches: r.fastBatches.Load(), FastShort: r.fastShort.Load()}
}

// commitWatcher is a source that can tell whether its pool reports a
// COMMIT whose wait for the synchronous standby was cancelled
// (pgoutbox.Store).
type commitWatcher interface {
	CheckCommitWatch(ctx context.Context) error
}

// Close stops the relay's publisher, abandoning publishes in flight (their
// rows stay pending). Run closes it when it returns; call Close after using
// only [Relay.Round]. It is safe to call more than once.
func (r *Relay) Close() { r.publisher().Close() }

// Run relays until ctx ends, then returns nil. It returns with an error
// once its NATS connection
// is closed for good (see [jsinbox.ClosedForGood]): nothing can be published
// on it again. Errors of a round (the database or NATS away) are logged and
// retried after a jittered wait. At start it logs a warning if the
// source's pool cannot see a mark commit the synchronous standby never
// confirmed (see pgoutbox.WatchCommits).
func (r *Relay) Run(ctx context.Context) error {
	defer r.Close()
	var ln Waiter
	defer func() {
		if ln != nil {
			ln.Close()
		}
	}()
	listener, canListen := r.src.(Listener)
	if w, ok := r.src.(commitWatcher); ok {
		// A source on a pool that cannot see a mark commit the
		// synchronous standby never confirmed counts such rows sent.
		cctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		if err := w.CheckCommitWatch(cctx); err != nil && ctx.Err() == nil {
			r.cfg.Logger.Warn("outbox: relay: could not confirm that the database pool watches its commits (make it with pginbox.NewPool or pgoutbox.WatchCommits)", "err", err)
		}
		cancel()
	}
	idle, fail := r.cfg.Idle.NewBackOff(), r.cfg.Retry.NewBackOff()
	full := false // the last round took Batch rows: drain the backlog
	for {
		if err := jsinbox.ClosedForGood(r.js.Conn()); err != nil {
			return fmt.Errorf("outbox: relay: %w", err) // every round would fail
		}
		if ln == nil && canListen && !r.cfg.NoListen {
			var err error
			if ln, err = listener.Listen(ctx); err != nil && ctx.Err() == nil {
				ln = nil
				r.cfg.Logger.Warn("outbox: relay: listening for new rows failed; polling until it works", "err", err)
			}
		}
		var (
			n   int
			err error
		)
		if full {
			n, err = r.Drain(ctx)
		} else {
			n, err = r.Round(ctx)
		}
		full = err == nil && n >= r.cfg.Batch
		if ctx.Err() != nil {
			return nil
		}
		var crash *hook.Crash
		if errors.As(err, &crash) {
			return err
		}
		var d time.Duration
		switch {
		case err != nil:
			r.cfg.Logger.Warn("outbox: relay: round failed", "err", err)
			d = next(fail, r.cfg.Retry)
		case n >= r.cfg.Batch:
			fail.Reset()
			idle.Reset()
			continue
		default:
			fail.Reset()
			if n > 0 {
				idle.Reset()
			}
			d = next(idle, r.cfg.Idle)
		}
		if ln == nil || err != nil {
			if !sleep(ctx, d) {
				return nil
			}
			continue
		}
		if werr := ln.Wait(ctx, d); werr != nil {
			if ctx.Err() != nil {
				return nil
			}
			r.cfg.Logger.Warn("outbox: relay: lost the listener connection; polling until it is back", "err", werr)
			ln.Close()
			ln = nil
		}
	}
}

// next returns the next wait of b, or p's Cap once b has stopped.
func next(b backoff.BackOff, p jitter.Policy) time.Duration {
	if d := b.NextBackOff(); d != backoff.Stop {
		return d
	}
	return p.WithDefaults().Cap
}

func sleep(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-ctx.Done():
		return false
	}
}

func (r *Relay) publisher() *jsinbox.Publisher {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.pub
}

// renewPublisher replaces the publisher: after a crash in the PubAck wait
// (its publishes are abandoned, as a dead process's would be), or when its
// list of failures has grown long.
func (r *Relay) renewPublisher() error {
	pub, err := jsinbox.NewPublisher(r.js, r.cfg.Publisher)
	if err != nil {
		return fmt.Errorf("outbox: relay: %w", err)
	}
	r.mu.Lock()
	old := r.pub
	r.pub = pub
	if r.hook != nil {
		hook.Attach(pub, r.hook)
	}
	r.mu.Unlock()
	old.Close()
	return nil
}

// Round runs one round: it locks up to Batch pending rows (skipping rows
// another relay holds), publishes them, waits for every PubAck, marks the
// acknowledged rows sent and those refused for good failed, and commits. It
// returns how many rows it locked. A row whose publish did not get through
// stays pending for a later round, and the round returns an error saying
// how many. Run calls Round in a loop; call it directly to drain the outbox
// in a test or a one-off job, never at the same time as Run or another
// Round of the same relay (use another Relay for that).
func (r *Relay) Round(ctx context.Context) (int, error) {
	rd, err := r.send(ctx)
	if rd == nil {
		return 0, err
	}
	defer rd.taken.Abandon(context.WithoutCancel(ctx)) // after Finish this is a no-op
	if err != nil {
		return len(rd.batch), err
	}
	return len(rd.batch), r.mark(ctx, rd)
}

// round is a round between its publishes and its marks.
type round struct {
	taken Taken
	batch []inbox.Intent
	out   outcome
}

// send takes a round's rows and publishes them: the first half of a
// round. It returns nil when it took nothing; otherwise the caller
// abandons rd.taken once done with it (after Finish that does nothing).
func (r *Relay) send(ctx context.Context) (*round, error) {
	taken, err := r.src.Take(ctx, r.cfg.Batch)
	if err != nil {
		return nil, fmt.Errorf("outbox: relay: %w", err)
	}
	rows := taken.Rows()
	batch := make([]inbox.Intent, len(rows))
	for i, row := range rows {
		batch[i] = inbox.Intent{ID: row.ID, Subject: row.Subject, Payload: row.Payload}
	}
	if len(batch) == 0 {
		taken.Abandon(context.WithoutCancel(ctx))
		return nil, nil
	}
	rd := &round{taken: taken, batch: batch}
	r.rounds.Add(1)
	if r.fires(hook.RelayBeforePublish) {
		return rd, &hook.Crash{Point: hook.RelayBeforePublish}
	}
	pub := r.publisher()
	ps := pub.Stats()
	var out outcome
	switch r.cfg.Publish {
	case PublishEach:
		out, err = r.publishEach(ctx, pub, batch)
	case PublishFast:
		out, err = r.publishFast(ctx, pub, batch)
	default:
		out, err = r.publishAll(ctx, pub, batch)
	}
	if err != nil {
		return rd, err
	}
	ps2 := pub.Stats()
	r.batches.Add(ps2.Batches - ps.Batches)
	r.fallbacks.Add(ps2.BatchFallbacks - ps.BatchFallbacks)
	rd.out = out
	return rd, nil
}

// mark marks a round's rows by their outcomes and commits: the second
// half of a round.
func (r *Relay) mark(ctx context.Context, rd *round) error {
	batch, taken, out := rd.batch, rd.taken, rd.out
	refused, unsent, pending := out.refused, out.unsent, len(out.unsent)
	if r.fires(hook.RelayBeforeMark) {
		return &hook.Crash{Point: hook.RelayBeforeMark}
	}
	ids := make([]string, 0, len(batch))
	for _, in := range batch {
		if _, bad := refused[in.ID]; !bad && !unsent[in.ID] {
			ids = append(ids, in.ID)
		}
	}
	for id, why := range refused {
		r.cfg.Logger.Error("outbox: relay: the stream refused a row for good; marked failed", "id", id, "err", why)
	}
	lags, err := taken.Finish(ctx, ids, refused)
	sentN, failedN := len(ids), len(refused)
	var notHeld *NotHeldError
	if errors.As(err, &notHeld) {
		// The marks of the rows still held committed; the others are
		// another relay's now, which publishes and marks them.
		err = nil
		for _, id := range notHeld.IDs {
			if _, bad := refused[id]; bad {
				failedN--
			} else {
				sentN--
			}
		}
		r.takenOver.Add(int64(len(notHeld.IDs)))
		r.cfg.Logger.Warn("outbox: relay: the round outlived its hold on rows another relay has taken over since; that relay sends them again and marks them (make the lease longer than a round can last)",
			"rows", len(notHeld.IDs), "err", notHeld)
	}
	if err != nil {
		// Unknown outcome at worst: the rows are published, and sent
		// again with the same IDs if the marks did not commit.
		return fmt.Errorf("outbox: relay: mark: %w", err)
	}
	r.sent.Add(int64(sentN))
	r.failed.Add(int64(failedN))
	r.retried.Add(int64(pending))
	r.duplicates.Add(out.duplicates)
	if r.cfg.Observer != nil && len(lags) > 0 {
		r.cfg.Observer.ObserveSent(lags)
	}
	if out.renew {
		if err := r.renewPublisher(); err != nil {
			return err
		}
	}
	if pending > 0 {
		return fmt.Errorf("outbox: relay: %d of %d rows not acknowledged in time; they stay pending", pending, len(batch))
	}
	return nil
}
