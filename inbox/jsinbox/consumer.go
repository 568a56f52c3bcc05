package jsinbox

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/cenkalti/backoff/v4"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"go.opentelemetry.io/otel/trace"
	"golang.org/x/sync/semaphore"

	"github.com/jetinbox/jetinbox/inbox"
	"github.com/jetinbox/jetinbox/internal/hook"
	"github.com/jetinbox/jetinbox/internal/jscheck"
	"github.com/jetinbox/jetinbox/jitter"
)

// ConsumerConfig configures a [Consumer].
type ConsumerConfig struct {
	// Stream is the intents stream. Default "INTENTS".
	Stream string
	// Durable names the durable pull consumer. Default: the processor's
	// scope.
	Durable string
	// FilterSubjects limits the consumer to some subjects. Default: all.
	FilterSubjects []string
	// DeliverPolicy and OptStartSeq / OptStartTime choose where a new
	// durable starts (replays). Default: DeliverAllPolicy.
	DeliverPolicy jetstream.DeliverPolicy
	OptStartSeq   uint64
	OptStartTime  *time.Time
	// BatchSize is the most messages one transaction takes. Batches are
	// adaptive: a batch takes what has arrived and never waits to fill up,
	// so low load stays fast. Default 6000: under a backlog larger batches
	// amortize per-transaction work and shared-row updates (jetinbox bench
	// measured 6000 × 2 in flight ahead of 3000 × 3 and 8000 × 2).
	BatchSize int
	// InFlight is how many batches are processed at once, each in its own
	// transaction on its own connection: fetching, claiming, committing and
	// acking overlap (effects take turns, see inbox.Config.EffectConcurrency).
	// Default 2: one batch claims while the other applies and commits; a
	// third mostly competes for the same CPUs.
	InFlight int
	// AckWait is the server's redelivery timer; keep it above the p99 batch
	// time. Long batches send InProgress every AckWait/2. Default 30s.
	AckWait time.Duration
	// KeepAlive is how often a batch still working sends InProgress for
	// its messages. Default AckWait/2; negative disables it (tests use that
	// to force redeliveries).
	KeepAlive time.Duration
	// MaxDeliver bounds deliveries; the last one dead-letters what still
	// fails. Default 20.
	MaxDeliver int
	// MaxAckPending bounds unacked messages. Default 4 × BatchSize ×
	// InFlight.
	MaxAckPending int
	// MaxBytes bounds the memory the messages take in the consumer, in
	// bytes (payload, headers, subjects): half for the client's pull buffer
	// (what the server sends ahead, jetstream.PullMaxBytes), half for the
	// batches being formed and in flight (a message waits for room before
	// it joins a batch). Counting messages alone is not enough: 12,000
	// messages of 1 MiB are 12 GiB. At start Run refuses a budget that
	// cannot hold [MinBytesPerMsgSize] messages of the stream's largest
	// size. Default [DefaultConsumerMaxBytes] (64 MiB).
	MaxBytes int64
	// Nak times redeliveries of retried messages by delivery count
	// (NakWithDelay; a bare Nak would redeliver at once). Default:
	// decorrelated jitter from 250ms to 30s.
	Nak jitter.Policy
	// DBWait times the database health checks while the database is
	// down. Default: decorrelated jitter from 100ms to 5s.
	DBWait jitter.Policy
	// DeadLetterRetry times the publishes of a dead letter that the
	// dead-letter stream refused on a message's final delivery; the
	// consumer holds the message and retries until the stream takes it
	// (MaxAttempts and MaxElapsed are ignored: giving up would drop the
	// intent). Default: decorrelated jitter from 250ms to 10s.
	DeadLetterRetry jitter.Policy
	// Observer, when set, is told about every batch after its transaction
	// ended and before its messages are acked: metrics and benchmarks. An
	// Observer that also has a method Attach(*Consumer) (metrics.Consumer
	// does, for its gauges) is attached by NewConsumer.
	Observer Observer
	// Batcher, when set, forms this consumer's batches together with
	// those of the other consumers given it (a shard's partition
	// durables, see [Batcher]); BatchSize and InFlight are then the
	// batcher's. Default: the consumer forms its own.
	Batcher *Batcher

	// Logger receives the consumer's lines: one at Info when Run starts
	// consuming (stream, durable, scope, store), and warnings about the
	// servers. Default: the processor's [inbox.Config.Logger], or none.
	Logger *slog.Logger
	// TracerProvider, when set, traces each batch: span "jetinbox.batch",
	// linked to the producers' spans carried in the messages' headers, with
	// children for fetching, the inbox's claim, effect and commit, and
	// acking. Default: the processor's [inbox.Config.TracerProvider], or none.
	TracerProvider trace.TracerProvider

	// The consumer checks the database through the processor (see
	// [Checker]) at start and while it cannot take batches: it stops
	// fetching until the check passes, so an outage, a read-only node or a
	// missing migration does not turn into a redelivery storm or into dead
	// letters.
}

// DefaultConsumerMaxBytes is the default [ConsumerConfig.MaxBytes]: 64 MiB, well
// inside the shipped consumer's 512 MiB memory limit.
const DefaultConsumerMaxBytes = 64 << 20

// MinBytesPerMsgSize is how many of the stream's largest messages
// [ConsumerConfig.MaxBytes] must hold: each half (pull buffer, batches)
// then takes at least two, so a pull request always has room for the
// next message.
const MinBytesPerMsgSize = 8

// WithDefaults returns c with defaults filled in.
func (c ConsumerConfig) WithDefaults() ConsumerConfig {
	if c.Stream == "" {
		c.Stream = DefaultStream
	}
	if c.BatchSize <= 0 {
		c.BatchSize = 6000
	}
	if c.InFlight <= 0 {
		c.InFlight = 2
	}
	if c.AckWait <= 0 {
		c.AckWait = 30 * time.Second
	}
	if c.KeepAlive == 0 {
		c.KeepAlive = c.AckWait / 2
	}
	if c.MaxDeliver == 0 {
		c.MaxDeliver = 20
	}
	if c.MaxAckPending <= 0 {
		c.MaxAckPending = 4 * c.BatchSize * c.InFlight
	}
	if c.MaxBytes <= 0 {
		c.MaxBytes = DefaultConsumerMaxBytes
	}
	if c.Nak.Kind == 0 && c.Nak.Base == 0 && c.Nak.Cap == 0 {
		c.Nak = jitter.Policy{Kind: jitter.Decorrelated, Base: 250 * time.Millisecond, Cap: 30 * time.Second}
	}
	if c.DBWait.Kind == 0 && c.DBWait.Base == 0 && c.DBWait.Cap == 0 {
		c.DBWait = jitter.Policy{Kind: jitter.Decorrelated, Base: 100 * time.Millisecond, Cap: 5 * time.Second}
	}
	if c.DeadLetterRetry.Kind == 0 && c.DeadLetterRetry.Base == 0 && c.DeadLetterRetry.Cap == 0 {
		c.DeadLetterRetry = jitter.Policy{Kind: jitter.Decorrelated, Base: 250 * time.Millisecond, Cap: 10 * time.Second}
	}
	c.DeadLetterRetry.MaxAttempts, c.DeadLetterRetry.MaxElapsed = 0, 0
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
	return c
}

func (c ConsumerConfig) validate() error {
	if c.MaxDeliver < 1 {
		return errors.New("jsinbox: MaxDeliver must be finite (>= 1): an unlimited one never dead-letters a message that keeps failing")
	}
	if err := c.Nak.Validate(); err != nil {
		return fmt.Errorf("jsinbox: Nak: %w", err)
	}
	if err := c.DBWait.Validate(); err != nil {
		return fmt.Errorf("jsinbox: DBWait: %w", err)
	}
	if err := c.DeadLetterRetry.Validate(); err != nil {
		return fmt.Errorf("jsinbox: DeadLetterRetry: %w", err)
	}
	return nil
}

// Consumer runs a durable pull consumer through an inbox processor (a
// [BatchProcessor] on either store): one transaction per batch, ack after
// commit.
type Consumer struct {
	js     jetstream.JetStream
	proc   BatchProcessor
	cfg    ConsumerConfig
	tracer trace.Tracer

	ready    atomic.Bool
	draining atomic.Bool
	crashed  atomic.Bool
	dbDown   atomic.Bool

	received, applied, duplicates, rejected, conflicts       atomic.Int64
	redeliveries, naks, deadLettered, batches, failedBatches atomic.Int64
	inFlight, rescued, rejectedRepeats, deadLettersHeld      atomic.Int64
	rescueExpired, foreignAdvisories, leftForRescue          atomic.Int64
	rescueStaleReads                                         atomic.Int64

	// batchOK is set by every batch that commits: a pause after it starts
	// its waits afresh, one right after a pause goes on with the longer
	// waits (pauses holds them), so a deployment fault that Check cannot
	// see (a handler's table or grant missing) is met once per long wait,
	// not in a spin.
	batchOK atomic.Bool
	pauses  backoff.BackOff

	// dlLog samples the dead-letter warnings.
	dlLog dlSampler

	// stopping is closed when Run's context ends: held dead letters let go.
	stopping <-chan struct{}

	bound atomic.Pointer[jetstream.Consumer]
	// rescueBound is the rescue durable on the advisory stream, once Run
	// has bound it.
	rescueBound atomic.Pointer[jetstream.Consumer]

	// budget holds the bytes of the messages in formed batches and in
	// flight (half of MaxBytes); batchBytes is its size.
	budget     *semaphore.Weighted
	batchBytes int64

	// hook, nil unless a harness attached one (internal/hook), drops the
	// acks of a batch; the processor's own hook crashes it.
	hook hook.Func

	// With a Batcher: the messages handed to it and not yet settled or
	// handed back (Run waits for them), and what a crashed batch calls.
	pending atomic.Int64
	onCrash func(error)
}

func init() {
	hook.Register(func(target any, f hook.Func) bool {
		switch t := target.(type) {
		case *Consumer:
			t.hook = f
		case *Publisher:
			t.hook = f
		default:
			return false
		}
		return true
	})
}

// NewConsumer returns a Consumer. Nothing happens until Run.
func NewConsumer(js jetstream.JetStream, proc BatchProcessor, cfg ConsumerConfig) (*Consumer, error) {
	if isNil(proc) {
		return nil, errors.New("jsinbox: NewConsumer: processor is nil")
	}
	if cfg.Durable == "" {
		cfg.Durable = proc.Scope()
	}
	if cfg.Logger == nil {
		cfg.Logger = proc.Logger()
	}
	if cfg.TracerProvider == nil {
		cfg.TracerProvider = proc.TracerProvider()
	}
	cfg = cfg.WithDefaults()
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	batchBytes := max(cfg.MaxBytes/2, 1)
	c := &Consumer{js: js, proc: proc, cfg: cfg, tracer: tracer(cfg.TracerProvider),
		budget: semaphore.NewWeighted(batchBytes), batchBytes: batchBytes}
	if a, ok := cfg.Observer.(interface{ Attach(*Consumer) }); ok {
		a.Attach(c) // its gauges read this consumer: no second step to forget
	}
	return c, nil
}

// Config returns the consumer's configuration with defaults filled in.
func (c *Consumer) Config() ConsumerConfig { return c.cfg }

// Ready reports whether the consumer is consuming, connected to NATS, with
// a database that takes batches, holds no message that the dead-letter stream
// refused, and is not draining.
func (c *Consumer) Ready() bool {
	return c.ready.Load() && !c.draining.Load() && !c.dbDown.Load() && !c.crashed.Load() &&
		c.deadLettersHeld.Load() == 0 && c.js.Conn().IsConnected()
}

// Draining reports whether Run is shutting down.
func (c *Consumer) Draining() bool { return c.draining.Load() }

// DurableConfig returns the JetStream consumer configuration Run creates
// when the durable does not exist yet.
func (c *Consumer) DurableConfig() jetstream.ConsumerConfig {
	return jetstream.ConsumerConfig{
		Durable:        c.cfg.Durable,
		AckPolicy:      jetstream.AckExplicitPolicy,
		AckWait:        c.cfg.AckWait,
		MaxDeliver:     c.cfg.MaxDeliver,
		MaxAckPending:  c.cfg.MaxAckPending,
		MaxWaiting:     512,
		FilterSubjects: c.cfg.FilterSubjects,
		DeliverPolicy:  c.cfg.DeliverPolicy,
		OptStartSeq:    c.cfg.OptStartSeq,
		OptStartTime:   c.cfg.OptStartTime,
	}
}

// Run consumes until ctx ends, then stops fetching, finishes the batches in
// flight (their commits and acks are not cut short), hands back what it held
// but had not started, and returns nil.
//
// It first checks the database through the processor (see
// [Checker]) and returns a [SetupError] if the database
// answers but cannot take batches as it is set up: the inbox schema
// missing or old, a read-only session, a connection that cannot hold a
// transaction (a pooler in statement mode), a grant missing. A database
// that does not answer now is waited for, as one that fails later.
func (c *Consumer) Run(ctx context.Context) error {
	defer c.dlLog.flush(c.cfg.Logger)
	if err := c.checkDatabase(ctx); err != nil {
		return err
	}
	// Messages the server gave up on after MaxDeliver, now or while no
	// consumer ran, are rescued from their stored advisories: the rescue
	// durable is bound with the main one.
	var cons, rescueCons jetstream.Consumer
	err := c.setUp(ctx, func() (err error) {
		if cons, err = c.bind(ctx); err != nil {
			return err
		}
		c.bound.Store(&cons)
		c.fitAckPending(cons.CachedInfo().Config.MaxAckPending)
		if err := c.checkSizes(ctx); err != nil {
			return err
		}
		rescueCons, err = c.bindRescue(ctx)
		return err
	})
	if err != nil {
		return err
	}
	stopping, stop := context.WithCancel(ctx)
	c.stopping = stopping.Done()
	crash := make(chan struct{})
	var crashOnce sync.Once
	var crashed error
	onCrash := func(err error) {
		crashOnce.Do(func() { crashed = err; c.crashed.Store(true); close(crash); stop() })
	}
	c.onCrash = onCrash
	stopRescue, err := c.startRescue(context.WithoutCancel(ctx), rescueCons, onCrash)
	if err != nil {
		stop()
		return err
	}
	c.cfg.Logger.Info("jsinbox: consuming", "stream", c.cfg.Stream, "durable", c.cfg.Durable,
		"scope", c.proc.Scope(), "store", storeName(c.proc), "batch_size", c.cfg.BatchSize, "in_flight", c.cfg.InFlight)
	// Open and prepare a connection per batch in flight while the first
	// pull is on its way, not before it: a restarted or autoscaled worker
	// then pulls at once, and the first batch waits for a connection only
	// if it arrives before the connections are ready. A database that is
	// down now is handled like one that fails later.
	warmed := make(chan struct{})
	go func() {
		defer close(warmed)
		if err := c.proc.Warm(ctx, c.cfg.InFlight); err != nil {
			c.cfg.Logger.Warn("jsinbox: warming the database connections failed", "err", err)
		}
	}()
	defer func() { <-warmed }()        // last: nothing of Run outlives it
	work := context.WithoutCancel(ctx) // batches finish even when ctx ends
	slots := make(chan struct{}, c.cfg.InFlight)
	var wg sync.WaitGroup
	defer func() {
		c.ready.Store(false)
		stopRescue()
		wg.Wait()
		for c.pending.Load() > 0 { // what the Batcher holds of this consumer's
			time.Sleep(5 * time.Millisecond)
		}
	}()
	defer stop() // first: a batch holding a dead letter lets go

	for {
		msgs := make(chan delivery, c.cfg.BatchSize)
		stopped := make(chan struct{})
		stoppedCtx, stopWaiting := context.WithCancel(context.WithoutCancel(ctx))
		cc, err := cons.Consume(func(m jetstream.Msg) {
			select {
			case <-stopped: // once stopping, never into msgs: nobody reads it
				c.handBack(work, m)
				return
			default:
			}
			// Room in the byte budget first: while the batches hold it
			// all, this callback waits, and the client's pull buffer
			// (PullMaxBytes) stops asking the server for more.
			n := c.held(m)
			if err := c.budget.Acquire(stoppedCtx, n); err != nil {
				c.handBack(work, m)
				return
			}
			if b := c.cfg.Batcher; b != nil {
				c.pending.Add(1)
				select {
				case b.in <- delivery{m: m, c: c, at: time.Now()}:
				case <-stopped:
					c.pending.Add(-1)
					c.budget.Release(n)
					c.handBack(work, m)
				}
				return
			}
			select {
			case msgs <- delivery{m: m, c: c, at: time.Now()}:
			case <-stopped:
				c.budget.Release(n)
				c.handBack(work, m)
			}
		}, jetstream.PullMaxBytes(int(c.cfg.MaxBytes-c.batchBytes)), jetstream.PullExpiry(5*time.Second),
			jetstream.ConsumeErrHandler(func(_ jetstream.ConsumeContext, err error) {
				if errors.Is(err, jetstream.ErrConsumerDeleted) || errors.Is(err, jetstream.ErrBadRequest) {
					// The client stops the subscription after these.
					c.cfg.Logger.Warn("jsinbox: the server ended the pull subscription", "durable", c.cfg.Durable, "err", err)
					return
				}
				c.cfg.Logger.Debug("jsinbox: consume", "err", err)
			}))
		if err != nil {
			stopWaiting()
			return fmt.Errorf("jsinbox: consume: %w", err)
		}
		c.ready.Store(true)
		// Closed fires when we stop or drain the subscription below, and
		// also when the client stops it by itself: only the latter can
		// happen while formBatches waits.
		var reason stopReason
		if c.cfg.Batcher != nil {
			reason = c.waitShared(ctx, cc.Closed(), crash)
		} else {
			reason = c.formBatches(ctx, work, msgs, cc.Closed(), slots, &wg, onCrash, crash)
		}
		if reason == stopShutdown {
			c.draining.Store(true)
		}
		close(stopped)
		stopWaiting()
		if reason == stopCrash {
			cc.Stop() // a dead process hands nothing back
		} else {
			// Whatever the client buffered or we hold but did not start
			// goes back now, with a short jittered delay, instead of
			// waiting out AckWait.
			cc.Drain()
			select {
			case <-cc.Closed():
			case <-time.After(5 * time.Second):
				cc.Stop()
			}
			for drained := false; !drained; {
				select {
				case d := <-msgs:
					c.budget.Release(c.held(d.m))
					c.handBack(work, d.m)
				default:
					drained = true
				}
			}
		}
		switch reason {
		case stopCrash:
			wg.Wait()
			return fmt.Errorf("jsinbox: consumer stopped: %w", crashed)
		case stopShutdown:
			c.draining.Store(true)
			return nil
		case stopDBDown:
			c.ready.Store(false)
			if err := c.waitForDB(ctx); err != nil {
				c.draining.Store(true)
				return nil
			}
		case stopResubscribe:
			c.ready.Store(false)
			if cons, err = c.rebind(ctx); err != nil {
				if ctx.Err() != nil {
					c.draining.Store(true)
					return nil
				}
				return err
			}
			c.bound.Store(&cons)
		}
	}
}

// checkDatabase runs the processor's Check once at start: a database that
// answers but is unfit for batches (unmigrated, read-only, behind a
// statement pooler, without a grant) is a [SetupError]; one that does not
// answer is only logged, and the consumer pauses on its first batch.
func (c *Consumer) checkDatabase(ctx context.Context) error {
	cctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	err := check(cctx, c.proc)
	switch {
	case err == nil:
		return nil
	case unfit(err):
		return &SetupError{Err: fmt.Errorf("jsinbox: the database cannot take batches: %w", err)}
	}
	c.cfg.Logger.Warn("jsinbox: the database check failed; consuming, and pausing while it fails", "err", err)
	return nil
}

// unfit reports whether err says the database answers but cannot take
// batches until an operator changes it.
func unfit(err error) bool {
	return errors.Is(err, inbox.ErrNotMigrated) || errors.Is(err, inbox.ErrDatabaseUnfit)
}

// ClosedForGood returns an error if nc is closed: nats.go never reopens a
// connection it has closed (Close, or a protocol error such as a line over
// the server's limits, which the server answers by closing it), whatever
// MaxReconnects says. Nothing on it can work again; a process that depends
// on it must end, for its supervisor to start it afresh, not wait for a
// reconnect that cannot come. It wraps [nats.ErrConnectionClosed] and says
// what the connection's last error was.
func ClosedForGood(nc *nats.Conn) error {
	if nc == nil || !nc.IsClosed() {
		return nil
	}
	last := "none"
	if err := nc.LastError(); err != nil {
		last = err.Error()
	}
	return fmt.Errorf("the NATS connection is closed for good (its last error: %s); nats.go does not reopen it, so this process must be restarted: %w",
		last, nats.ErrConnectionClosed)
}

// rebind binds the durable again after the client ended the pull
// subscription, with jittered waits while the server cannot answer (a
// consumer leader being elected). A durable that is gone is created again
// where the consumer may (the inbox makes the redelivery that follows
// harmless); where it may not, the SetupError says so and Run returns it.
func (c *Consumer) rebind(ctx context.Context) (jetstream.Consumer, error) {
	bo := c.cfg.DBWait.NewBackOff()
	for {
		if err := ClosedForGood(c.js.Conn()); err != nil {
			return nil, fmt.Errorf("jsinbox: durable %s: %w", c.cfg.Durable, err)
		}
		cons, err := c.bind(ctx)
		if err == nil {
			c.cfg.Logger.Info("jsinbox: pulling again", "durable", c.cfg.Durable)
			return cons, nil
		}
		if errors.Is(err, nats.ErrPermissionViolation) {
			return nil, err // may not create it: an operator must
		}
		d := bo.NextBackOff()
		if d < 0 {
			return nil, err
		}
		c.cfg.Logger.Warn("jsinbox: binding the durable again failed; retrying", "durable", c.cfg.Durable, "err", err, "in", d)
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-time.After(d):
		}
	}
}

// bind uses the durable if it exists (an operator may have created it, and
// the consumer may lack the permission to change it), after checking it is
// safe, and creates it otherwise. The server's AckWait and MaxDeliver win
// over the configured ones.
func (c *Consumer) bind(ctx context.Context) (jetstream.Consumer, error) {
	cons, err := withAPI(ctx, func(ctx context.Context) (jetstream.Consumer, error) {
		return c.js.Consumer(ctx, c.cfg.Stream, c.cfg.Durable)
	})
	if errors.Is(err, jetstream.ErrConsumerNotFound) {
		cons, err = withAPI(ctx, func(ctx context.Context) (jetstream.Consumer, error) {
			return c.js.CreateConsumer(ctx, c.cfg.Stream, c.DurableConfig())
		})
		if errors.Is(err, jetstream.ErrConsumerExists) {
			cons, err = withAPI(ctx, func(ctx context.Context) (jetstream.Consumer, error) {
				return c.js.Consumer(ctx, c.cfg.Stream, c.cfg.Durable)
			})
		}
	}
	if errors.Is(err, jetstream.ErrStreamNotFound) {
		return nil, streamNotFound(c.cfg.Stream, err)
	}
	if cerr := ClosedForGood(c.js.Conn()); err != nil && cerr != nil {
		// Not a refusal: no request got through.
		return nil, fmt.Errorf("jsinbox: durable %s on %s: %w", c.cfg.Durable, c.cfg.Stream, cerr)
	}
	if err != nil {
		return nil, setupError(fmt.Errorf("jsinbox: durable %s on %s (refused by the server: check the account's permissions and the durable's settings, "+
			"or create it with nats consumer add %s --config deploy/jetstream/ledger-consumer.json): %w", c.cfg.Durable, c.cfg.Stream, c.cfg.Stream, err))
	}
	info := cons.CachedInfo().Config
	if problems := CheckConsumer(info); len(problems) > 0 {
		return nil, &SetupError{Err: fmt.Errorf("jsinbox: durable %s on %s is unsafe: %s; fix it, or delete it (nats consumer rm %s %s) for the consumer to create a safe one",
			c.cfg.Durable, c.cfg.Stream, strings.Join(problems, "; "), c.cfg.Stream, c.cfg.Durable)}
	}
	if info.AckWait != c.cfg.AckWait {
		if c.cfg.KeepAlive == c.cfg.AckWait/2 {
			c.cfg.KeepAlive = info.AckWait / 2
		}
		c.cfg.AckWait = info.AckWait
	}
	c.cfg.MaxDeliver = info.MaxDeliver
	for _, w := range jscheck.LintConsumer(jscheck.ConsumerTiming{AckWait: info.AckWait, MaxDeliver: info.MaxDeliver, BackOff: info.BackOff, NakDelay: &c.cfg.Nak}) {
		c.cfg.Logger.Warn("jsinbox: config: "+w, "durable", c.cfg.Durable)
	}
	return cons, nil
}

// fitAckPending lowers the batch size when the durable's MaxAckPending
// cannot hold InFlight full batches: the server would stop delivering at
// its limit, and the batches would silently stay smaller than configured
// while the pull buffer waits. It says so once.
func (c *Consumer) fitAckPending(maxAckPending int) {
	if maxAckPending <= 0 || c.cfg.BatchSize*c.cfg.InFlight <= maxAckPending {
		return
	}
	batch := max(1, maxAckPending/c.cfg.InFlight)
	c.cfg.Logger.Warn("jsinbox: the durable's MaxAckPending cannot hold the batches in flight; lowering the batch size",
		"durable", c.cfg.Durable, "max_ack_pending", maxAckPending, "batch", c.cfg.BatchSize, "in_flight", c.cfg.InFlight, "new_batch", batch)
	c.cfg.BatchSize = batch
}

// held is what m takes of the batches' byte budget: its size (payload,
// headers, subject, reply), at most the whole budget, so that one message
// bigger than the budget still gets through alone instead of waiting for
// ever.
func (c *Consumer) held(m jetstream.Msg) int64 {
	n := len(m.Data()) + len(m.Subject()) + len(m.Reply())
	for k, vs := range m.Headers() {
		for _, v := range vs {
			n += len(k) + len(v) + 4 // "k: v\r\n"
		}
	}
	return min(int64(n), c.batchBytes)
}

// checkSizes looks at the intents stream and its dead-letter stream before
// the first message: the largest intent with its dead-letter headers must
// fit the dead-letter stream and the server's max_payload
// (the dead-letter fit check), and MaxBytes must hold [MinBytesPerMsgSize] of
// the largest messages. Either failing is a [SetupError]. A missing
// dead-letter stream is only a warning: dead letters wait for it.
func (c *Consumer) checkSizes(ctx context.Context) error {
	s, err := c.stream(ctx, c.cfg.Stream)
	if err != nil {
		return setupError(fmt.Errorf("jsinbox: stream %s: %w", c.cfg.Stream, err))
	}
	dlqName := DeadLetterStream(c.cfg.Stream)
	maxPayload := c.js.Conn().MaxPayload()
	intents := s.CachedInfo().Config
	dlq, err := c.stream(ctx, dlqName)
	switch {
	case errors.Is(err, jetstream.ErrStreamNotFound):
		// Not fatal: a message to dead-letter on its last delivery is held
		// until the stream exists (see [ConsumerConfig.DeadLetterRetry]).
		c.cfg.Logger.Warn("jsinbox: the dead-letter stream does not exist; messages to dead-letter are held until it does",
			"dead_letter_stream", dlqName)
		if problems := jscheck.CheckDeadLetterFit(intents, jetstream.StreamConfig{Name: dlqName}, maxPayload); len(problems) > 0 {
			return &SetupError{Err: fmt.Errorf("jsinbox: stream %s: %s", c.cfg.Stream, strings.Join(problems, "; "))}
		}
	case err != nil:
		return setupError(fmt.Errorf("jsinbox: dead-letter stream %s: %w", dlqName, err))
	default:
		if problems := jscheck.CheckDeadLetterFit(intents, dlq.CachedInfo().Config, maxPayload); len(problems) > 0 {
			return &SetupError{Err: fmt.Errorf("jsinbox: streams %s and %s: %s", c.cfg.Stream, dlqName, strings.Join(problems, "; "))}
		}
	}
	largest := int64(intents.MaxMsgSize)
	if largest <= 0 || (maxPayload > 0 && maxPayload < largest) {
		largest = maxPayload
	}
	if need := MinBytesPerMsgSize * largest; c.cfg.MaxBytes < need {
		return &SetupError{Err: fmt.Errorf("jsinbox: MaxBytes %d cannot hold %d messages of %s's largest size %d: raise it to at least %d, or lower the stream's max_msg_size",
			c.cfg.MaxBytes, MinBytesPerMsgSize, c.cfg.Stream, largest, need)}
	}
	return nil
}

// storeName names the processor's store for the start-up line: its
// StoreName if it has one (an *inbox.Processor does), else its type.
func storeName(p BatchProcessor) string {
	if n, ok := p.(interface{ StoreName() string }); ok {
		return n.StoreName()
	}
	return fmt.Sprintf("%T", p)
}
