package jsinbox

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"

	"github.com/jetinbox/jetinbox/inbox"
	"github.com/jetinbox/jetinbox/internal/hook"
	"github.com/jetinbox/jetinbox/jitter"
)

// PublisherConfig configures a [Publisher].
type PublisherConfig struct {
	// Stream is the stream every intent must be stored in: an intent whose
	// PubAck comes from another stream (its subject is captured by, say,
	// the dead-letter stream's "dlq.intents.>") fails at once with
	// [ErrWrongStream], naming both streams, and is not retried.
	// Duplicates are read back from this stream (see [inbox.ErrConflict]).
	// Default [DefaultStream] ("INTENTS").
	Stream string
	// SkipExpectedStreamHeader stops sending Stream in each publish's
	// Nats-Expected-Stream header. By default it is sent, in single
	// publishes and in atomic batches (the server checks it on every
	// message of a batch), so that the server refuses an intent bound for
	// another stream instead of storing a stray copy there. The server
	// stores the header with the intent; jsinbox's Consumer drops
	// JetStream's headers from its dead letters, but a consumer of your own
	// that re-publishes an intent's headers elsewhere would have that
	// publish refused: skip the header for such a consumer (the PubAck's
	// stream is still checked).
	SkipExpectedStreamHeader bool
	// MaxInFlight bounds the publishes awaiting a PubAck. Publish and PublishAsync block
	// while the window is full. Default 4096.
	MaxInFlight int
	// AckTimeout is how long one publish waits for its PubAck before it is
	// retried. Default 5s.
	AckTimeout time.Duration
	// Retry times the retries of one intent (same ID every time) and bounds
	// them: when its budget is spent the intent is reported as failed.
	// Default: jitter.Default() (10 retries, 72 s of delays at most) given
	// up after 100 s in all, PubAck waits included, so that the last retry
	// stays inside JetStream's default 2-minute duplicate window.
	Retry jitter.Policy
	// Logger receives a line per failed intent. Default: discard.
	Logger *slog.Logger
	// TracerProvider, when set, traces each publish (span
	// "jetinbox.publish") and carries its W3C trace context to the consumer
	// in the message headers. Default: no tracing.
	TracerProvider trace.TracerProvider
	// Batch is the most intents one JetStream atomic batch holds (at most
	// [MaxBatch]): group commit. One group of intents is published at a
	// time; the intents handed over meanwhile, by one caller or by many
	// goroutines, gather into the next group (up to Batch), which goes out
	// as soon as the one before has its PubAcks. It never waits to fill. A
	// group of MinBatch intents or more is one atomic batch: the server
	// stores it with one fsync and one PubAck instead of one each, which is
	// what limits a stream with sync_interval: always, and each intent
	// still gets its own outcome (see [Publisher.Publish]). The stream
	// should allow atomic publishing (StreamConfig sets it); one that does
	// not refuses the first batch, and the publisher says so once in its
	// log and publishes one intent at a time from then on. A batch the
	// server refuses as a whole (an ID it already has, a timeout, a lost
	// PubAck) is published again one intent at a time, with the same IDs,
	// so that deduplication and the conflict check stay per intent.
	// Default [DefaultBatch]; 1 turns group commit off: every intent is
	// published on its own as soon as it is handed over.
	Batch int
	// MinBatch is the fewest intents sent as an atomic batch; a smaller
	// group is published one intent at a time (pipelined), which costs the
	// server less than staging a batch, and keeps a low rate from waiting
	// behind batches. Default [DefaultMinBatch].
	MinBatch int
	// Linger, if set, makes a group wait for more intents until its first
	// intent has waited Linger (or the group is full), even when no group
	// is in flight. Default 0: a group goes as soon as the one before has
	// its PubAcks (the group in flight is what lets the next one fill).
	Linger time.Duration
	// StoredSubject, if set, maps the subject an intent is published on to
	// the subject the stream stores it under, for a stream with a subject
	// transform: a duplicate's stored copy is compared with that, not with
	// the published subject. Default: stored as published.
	StoredSubject func(subject string) string
}

// DefaultBatch and DefaultMinBatch are the defaults of
// [PublisherConfig].Batch and MinBatch.
const (
	DefaultBatch    = 256
	DefaultMinBatch = 32
)

// MaxBatch is the largest atomic batch a JetStream server accepts by
// default.
const MaxBatch = 1000

// WithDefaults returns c with defaults filled in.
func (c PublisherConfig) WithDefaults() PublisherConfig {
	if c.Stream == "" {
		c.Stream = DefaultStream
	}
	if c.MaxInFlight <= 0 {
		c.MaxInFlight = 4096
	}
	if c.AckTimeout <= 0 {
		c.AckTimeout = 5 * time.Second
	}
	if r := c.Retry; r.Kind == 0 && r.Base == 0 && r.Cap == 0 && r.MaxAttempts == 0 && r.MaxElapsed == 0 {
		c.Retry = jitter.Default()
		c.Retry.MaxElapsed = 100 * time.Second
	}
	c.Retry = c.Retry.WithDefaults()
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
	if c.Batch == 0 {
		c.Batch = DefaultBatch
	}
	c.Batch = min(c.Batch, MaxBatch)
	if c.MinBatch <= 0 {
		c.MinBatch = DefaultMinBatch
	}
	c.MinBatch = min(c.MinBatch, max(c.Batch, 1))
	c.Linger = max(c.Linger, 0)
	return c
}

// PublisherStats counts what a Publisher did.
type PublisherStats struct {
	// Published intents whose publish was acknowledged by the stream.
	Published int64
	// Duplicates: PubAcks with duplicate=true (the stream already had the
	// ID inside its duplicate window, so this publish was dropped) for
	// which the stored message has the same payload. They count as
	// published too.
	Duplicates int64
	// Conflicts: duplicate PubAcks for which the stored message has a
	// different payload: the ID was reused for another intent, which the
	// stream dropped. Each is also a failure (Failed, and in Failures with
	// an error wrapping [inbox.ErrConflict]).
	Conflicts int64
	// Retries: publishes sent again after a timeout or error.
	Retries int64
	// Batches: atomic batches the stream stored; BatchFallbacks: batches
	// it refused as a whole, whose intents were published one by one.
	Batches, BatchFallbacks int64
	// Failed intents, each listed in Failures: retry budget spent
	// without a PubAck, refused for good (a subject another stream
	// captures, [ErrWrongStream]) or a conflict ([inbox.ErrConflict]).
	Failed int64
}

// Failure is an intent the publisher could not publish: its retry budget
// ran out, the stream refused it for good, or its ID was reused (Err wraps
// [inbox.ErrConflict] or [ErrWrongStream] for those two).
type Failure struct {
	ID string
	// Fingerprint is the intent's [inbox.Fingerprint]: it tells apart two
	// intents handed over under one ID with different payloads, the
	// second of which is the conflict.
	Fingerprint [32]byte
	Attempts    int
	Err         error
}

// ErrWrongStream reports an intent whose subject is captured by a stream
// other than [PublisherConfig.Stream]: the server refused it for its
// Nats-Expected-Stream header or, without the header (see
// [PublisherConfig.SkipExpectedStreamHeader]), that stream stored it
// where no consumer of Stream applies it. Retrying cannot help.
var ErrWrongStream = errors.New("jsinbox: intent's subject belongs to another stream")

// Publisher publishes intents asynchronously with a bounded in-flight window.
// A publish that times out, finds no responders or fails on a disconnect is
// retried with the same Nats-Msg-Id after a jittered delay, so the stream (in
// its duplicate window) or the consumer's inbox (after it) drops the copy.
//
// Intents handed over at the same time, by one caller or by many
// goroutines, are published together in JetStream atomic batches (group
// commit, see [PublisherConfig].Batch): one fsync and one PubAck a batch,
// and each intent's own outcome. [Publisher.PublishAsync] hands an intent over
// and reports outcomes in Stats and Failures; [Publisher.Publish]
// returns the intent's own PubAck or error to its caller.
//
// A PubAck must come from the publisher's stream. A duplicate PubAck
// is checked: the publisher reads the stored message it names (the
// STREAM.MSG.GET API, so the producer's NATS user needs publish permission
// on $JS.API.STREAM.MSG.GET.<stream>) and reports a different payload as an
// [inbox.ErrConflict] failure. Publishes acknowledged as new never pay for this.
type Publisher struct {
	js     jetstream.JetStream
	cfg    PublisherConfig
	tracer trace.Tracer
	sem    chan struct{}
	wg     sync.WaitGroup // intents handed over and not settled yet
	bg     sync.WaitGroup // the publisher's goroutines
	ctx    context.Context
	stop   context.CancelFunc
	// pending holds sent publishes awaiting a PubAck, in send order.
	pending chan *tracker

	// closeMu guards closed: what hands an intent to pending or batchIn
	// holds it for reading, so that Close, once it holds it, knows that
	// nothing is added any more and settles what is left.
	closeMu sync.RWMutex
	closed  bool

	published, duplicates, conflicts, retries, failed atomic.Int64
	batches, batchFallbacks                           atomic.Int64

	// msgGet is the STREAM.MSG.GET API subject of cfg.Stream.
	msgGet string

	// batchIn feeds the group-commit goroutine when Batch > 1, which
	// batchDone tells of each batch settled; noBatch is set once the
	// stream turns out not to allow atomic batches.
	batchIn   chan *tracker
	batchDone chan struct{}
	noBatch   atomic.Bool

	// streamMu guards the last check of cfg.Stream after a publish that
	// nothing answered: its time and its error (a SetupError when the
	// stream does not exist), shared by the intents failing meanwhile.
	streamMu        sync.Mutex
	streamCheckedAt time.Time
	streamCheckErr  error

	mu       sync.Mutex
	failures []Failure

	// hook, nil unless a harness attached one (internal/hook), loses
	// PubAcks.
	hook hook.Func
}

// NewPublisher returns a Publisher on js. [Publisher.Close] stops it.
func NewPublisher(js jetstream.JetStream, cfg PublisherConfig) (*Publisher, error) {
	if cfg.Batch < 0 {
		return nil, fmt.Errorf("jsinbox: publisher: Batch %d: want 0 (default %d), 1 (one publish per intent) or up to %d", cfg.Batch, DefaultBatch, MaxBatch)
	}
	cfg = cfg.WithDefaults()
	if err := cfg.Retry.Validate(); err != nil {
		return nil, fmt.Errorf("jsinbox: publisher: %w", err)
	}
	ctx, stop := context.WithCancel(context.Background())
	p := &Publisher{js: js, cfg: cfg, tracer: tracer(cfg.TracerProvider), sem: make(chan struct{}, cfg.MaxInFlight),
		pending: make(chan *tracker, cfg.MaxInFlight), ctx: ctx, stop: stop,
		msgGet: apiPrefix(js.Options()) + "STREAM.MSG.GET." + cfg.Stream}
	p.bg.Add(1)
	go p.waitLoop()
	if cfg.Batch > 1 {
		p.batchIn = make(chan *tracker, cfg.Batch)
		p.batchDone = make(chan struct{}, 1)
		p.bg.Add(1)
		go p.gatherBatches()
	}
	return p, nil
}

// ErrClosed is returned for an intent handed to a closed [Publisher], and
// is the error of every intent not settled yet when Close was called:
// such an intent may or may not be stored.
var ErrClosed = errors.New("jsinbox: publisher closed")

// PublishAsync starts publishing in and does not wait for its PubAck, as
// nats.go's jetstream.JetStream.PublishAsync does: it returns once the
// intent holds a slot of the in-flight window. Its outcome shows in Stats
// and Failures after Flush. [Publisher.Publish] waits.
func (p *Publisher) PublishAsync(ctx context.Context, in inbox.Intent) error {
	_, err := p.start(ctx, in, false, false)
	return err
}

// Publish publishes in and waits for its outcome: the PubAck of the
// stream that stored it (Duplicate set, with the sequence of the message
// stored first, when the stream already held the ID with the same payload),
// or the reason it was not published, which wraps [inbox.ErrConflict],
// [ErrWrongStream], [ErrClosed] or the last publish error once the retry
// budget is spent. Call it from as many goroutines as there are requests:
// intents published at the same time share atomic batches (see
// [PublisherConfig].Batch), and each caller gets its own intent's outcome.
// Its failures are counted in Stats but not listed in Failures.
//
// If ctx ends first, Publish returns ctx's error; an intent already
// handed over is still published (publishing it again with the same ID is
// safe), and Flush waits for it.
func (p *Publisher) Publish(ctx context.Context, in inbox.Intent) (*jetstream.PubAck, error) {
	t, err := p.start(ctx, in, true, false)
	if err != nil {
		return nil, err
	}
	select {
	case <-t.res:
		if t.err != nil {
			return nil, t.err
		}
		ack := t.ack
		return &ack, nil
	case <-ctx.Done():
		return nil, fmt.Errorf("jsinbox: intent %s: outcome not known yet: %w", in.ID, ctx.Err())
	}
}

// start validates in, takes a slot of the window and hands the intent over
// (unless held: PublishAll sends it in a batch of its own).
func (p *Publisher) start(ctx context.Context, in inbox.Intent, wait, held bool) (*tracker, error) {
	// The one validator the outbox and the relay use too; the publisher
	// never invents an ID.
	if err := in.Validate(); err != nil {
		return nil, err
	}
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	select {
	case p.sem <- struct{}{}:
	case <-ctx.Done():
		return nil, ctx.Err()
	case <-p.ctx.Done():
		return nil, ErrClosed
	}
	t := &tracker{p: p, in: in, header: nats.Header{jetstream.MsgIDHeader: []string{in.ID}}}
	if wait {
		t.res = make(chan struct{})
	}
	if !p.cfg.SkipExpectedStreamHeader {
		t.header[jetstream.ExpectedStreamHeader] = []string{p.cfg.Stream}
	}
	p.closeMu.RLock()
	if p.closed {
		p.closeMu.RUnlock()
		<-p.sem
		return nil, ErrClosed
	}
	p.wg.Add(1)
	if p.cfg.TracerProvider != nil {
		var sctx context.Context
		sctx, t.span = p.tracer.Start(ctx, "jetinbox.publish", trace.WithSpanKind(trace.SpanKindProducer),
			trace.WithAttributes(attribute.String("messaging.message.id", in.ID), attribute.String("messaging.destination.name", in.Subject)))
		injectTrace(sctx, t.header)
	}
	if held {
		p.closeMu.RUnlock()
		return t, nil
	}
	if p.batchIn != nil && !p.noBatch.Load() {
		select {
		case p.batchIn <- t:
			p.closeMu.RUnlock()
		case <-p.ctx.Done():
			p.closeMu.RUnlock()
			t.fail(ErrClosed)
		}
		return t, nil
	}
	p.closeMu.RUnlock()
	t.send()
	return t, nil
}

// Flush waits until every intent handed to PublishAsync was acknowledged or
// failed, or ctx ends.
func (p *Publisher) Flush(ctx context.Context) error {
	done := make(chan struct{})
	go func() { p.wg.Wait(); close(done) }()
	select {
	case <-done:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// Close stops the publisher: every intent not settled yet fails with
// [ErrClosed] (it may or may not have been stored) and its waiting caller
// returns; the publisher's goroutines have ended when Close returns. Call
// Flush first to wait for the intents in flight.
func (p *Publisher) Close() {
	p.stop()
	p.closeMu.Lock()
	already := p.closed
	p.closed = true
	p.closeMu.Unlock()
	if already {
		return
	}
	p.bg.Wait()
	// Nothing is added to these any more; their loops have ended.
	for {
		select {
		case t := <-p.pending:
			t.fail(ErrClosed)
			continue
		case t := <-p.batchIn: // nil without group commit
			t.fail(ErrClosed)
			continue
		default:
		}
		break
	}
	// Intents between two attempts or reading a duplicate back see ctx
	// end and settle at once.
	p.wg.Wait()
	p.bg.Wait()
}

// Stats returns the counters so far.
func (p *Publisher) Stats() PublisherStats {
	return PublisherStats{Published: p.published.Load(), Duplicates: p.duplicates.Load(), Conflicts: p.conflicts.Load(), Retries: p.retries.Load(),
		Failed: p.failed.Load(), Batches: p.batches.Load(), BatchFallbacks: p.batchFallbacks.Load()}
}

// Failures returns the intents handed to PublishAsync that could not be
// published.
func (p *Publisher) Failures() []Failure {
	p.mu.Lock()
	defer p.mu.Unlock()
	return append([]Failure(nil), p.failures...)
}

type tracker struct {
	p        *Publisher
	in       inbox.Intent
	bo       interface{ NextBackOff() time.Duration }
	attempts int
	header   nats.Header
	span     trace.Span // nil unless tracing
	future   jetstream.PubAckFuture
	sent     time.Time
	// grp, while set, is the group commit's group this intent was
	// published one by one in.
	grp *group
	// res, for Publish, is closed once ack or err is set.
	res chan struct{}
	ack jetstream.PubAck
	err error
}

func (t *tracker) send() {
	t.p.closeMu.RLock()
	if t.p.closed {
		t.p.closeMu.RUnlock()
		t.fail(ErrClosed)
		return
	}
	t.attempts++
	msg := &nats.Msg{Subject: t.in.Subject, Data: t.in.Payload, Header: t.header}
	f, err := t.p.js.PublishMsgAsync(msg)
	if err != nil {
		t.p.closeMu.RUnlock()
		t.leaveGroup()
		t.retry(err)
		return
	}
	t.future, t.sent = f, time.Now()
	t.p.pending <- t // never blocks: the window bounds the trackers
	t.p.closeMu.RUnlock()
}

// waitLoop settles publishes in the order they were sent, which is the
// order PubAcks arrive in: one goroutine for the whole window instead of
// one per publish. A publish whose PubAck is late is retried when its
// AckTimeout has passed.
func (p *Publisher) waitLoop() {
	defer p.bg.Done()
	timer := time.NewTimer(time.Hour)
	defer timer.Stop()
	for {
		var t *tracker
		select {
		case t = <-p.pending:
		case <-p.ctx.Done():
			return
		}
		timer.Reset(max(time.Until(t.sent.Add(p.cfg.AckTimeout)), 0))
		t.wait(timer)
		if !timer.Stop() {
			select {
			case <-timer.C:
			default:
			}
		}
	}
}

func (t *tracker) wait(timer *time.Timer) {
	f := t.future
	t.future = nil
	select {
	case ack := <-f.Ok():
		t.leaveGroup()
		if t.p.hook != nil && t.p.hook(hook.LosePubAck) {
			t.retry(errors.New("PubAck lost (simulated)"))
			return
		}
		if ack.Stream != t.p.cfg.Stream {
			t.fail(fmt.Errorf("%w: subject %q of intent %s is captured by stream %q, not %q; %q stored it", ErrWrongStream, t.in.Subject, t.in.ID, ack.Stream, t.p.cfg.Stream, ack.Stream))
			return
		}
		if ack.Duplicate {
			// Reading the stored message back takes a round trip: off
			// this loop, and the intent stays in flight (Flush waits)
			// until it is settled.
			t.p.goBG(func() { t.checkDuplicate(*ack) }, func() { t.fail(ErrClosed) })
			return
		}
		t.p.published.Add(1)
		t.ack = *ack
		t.done()
	case err := <-f.Err():
		t.leaveGroup()
		if isStreamNotMatch(err) {
			t.p.goBG(func() { t.wrongStream(err) }, func() { t.fail(ErrClosed) })
			return
		}
		t.retry(err)
	case <-timer.C:
		t.leaveGroup()
		t.retry(fmt.Errorf("no PubAck within %v: %w", t.p.cfg.AckTimeout, context.DeadlineExceeded))
	case <-t.p.ctx.Done():
		t.leaveGroup()
		t.retry(t.p.ctx.Err())
	}
}

// goBG runs f on a goroutine Close waits for, or, once Close began, runs
// closed instead, at once.
func (p *Publisher) goBG(f, closed func()) {
	p.closeMu.RLock()
	if p.closed {
		p.closeMu.RUnlock()
		closed()
		return
	}
	p.bg.Add(1)
	p.closeMu.RUnlock()
	go func() {
		defer p.bg.Done()
		f()
	}()
}

func (t *tracker) retry(err error) {
	if t.p.ctx.Err() != nil {
		t.fail(fmt.Errorf("%w: %w", ErrClosed, err))
		return
	}
	if isNoResponders(err) {
		// Nothing answered: a stream that does not exist fails the
		// intent at once, naming the call that creates it, instead of
		// spending the retry budget on it.
		closed := func() { t.fail(fmt.Errorf("%w: %w", ErrClosed, err)) }
		t.p.goBG(func() {
			if serr := t.p.checkStream(); serr != nil {
				t.fail(fmt.Errorf("jsinbox: intent %s: %w", t.in.ID, serr))
				return
			}
			t.backOff(err)
		}, closed)
		return
	}
	t.backOff(err)
}

// checkStream looks cfg.Stream up, at most once a second for all the
// intents that ask meanwhile, and returns a [SetupError] if the server has
// no such stream. Any other answer, or none, returns nil: the publish is
// then retried as usual.
func (p *Publisher) checkStream() error {
	p.streamMu.Lock()
	defer p.streamMu.Unlock()
	if !p.streamCheckedAt.IsZero() && time.Since(p.streamCheckedAt) < time.Second {
		return p.streamCheckErr
	}
	ctx, cancel := context.WithTimeout(p.ctx, p.cfg.AckTimeout)
	defer cancel()
	_, err := p.js.Stream(ctx, p.cfg.Stream)
	p.streamCheckedAt, p.streamCheckErr = time.Now(), nil
	if errors.Is(err, jetstream.ErrStreamNotFound) {
		p.streamCheckErr = streamNotFound(p.cfg.Stream, err)
	}
	return p.streamCheckErr
}

// backOff retries the intent after the next delay of its retry policy, or
// fails it when the policy is spent or err is not worth a retry.
func (t *tracker) backOff(err error) {
	if t.bo == nil { // most publishes never retry: no backoff until one does
		t.bo = t.p.cfg.Retry.NewBackOff()
	}
	d := t.bo.NextBackOff()
	if d < 0 || !retryable(err) {
		t.fail(err)
		return
	}
	t.p.retries.Add(1)
	closed := func() { t.fail(fmt.Errorf("%w: %w", ErrClosed, err)) }
	t.p.goBG(func() {
		timer := time.NewTimer(d)
		defer timer.Stop()
		select {
		case <-timer.C:
			t.send()
		case <-t.p.ctx.Done():
			closed()
		}
	}, closed)
}

// fail reports the intent as not published, for good.
func (t *tracker) fail(err error) {
	t.leaveGroup()
	if errors.Is(err, inbox.ErrConflict) {
		t.p.conflicts.Add(1)
	}
	t.p.failed.Add(1)
	if t.res == nil { // Publish returns it instead
		t.p.mu.Lock()
		t.p.failures = append(t.p.failures, Failure{ID: t.in.ID, Fingerprint: inbox.Fingerprint(t.in.Payload), Attempts: t.attempts, Err: err})
		t.p.mu.Unlock()
	}
	t.p.cfg.Logger.Warn("jsinbox: intent not published", "id", t.in.ID, "attempts", t.attempts, "err", err)
	if t.span != nil {
		t.span.SetStatus(codes.Error, err.Error())
	}
	t.err = err
	t.done()
}

// done settles the intent: t.ack or t.err is set.
func (t *tracker) done() {
	if t.span != nil {
		t.span.SetAttributes(attribute.Int("jetinbox.publish.attempts", t.attempts))
		t.span.End()
	}
	if t.res != nil {
		close(t.res)
	}
	<-t.p.sem
	t.p.wg.Done()
}

// retryable: timeouts, no responders, disconnects and stalls are worth a
// retry with the same ID; a rejection by the stream (full with DiscardNew)
// is too, within the budget, since space may free up. A subject another
// stream captures is not, nor a message bigger than the stream's
// max_msg_size or the server's max_payload.
func retryable(err error) bool {
	return !errors.Is(err, jetstream.ErrInvalidSubject) && !errors.Is(err, nats.ErrBadSubject) && !errors.Is(err, nats.ErrMaxPayload) &&
		!errors.Is(err, jetstream.ErrStreamMessageExceedsMaximum) &&
		!errors.Is(err, ErrWrongStream) && !errors.Is(err, inbox.ErrConflict) && !isStreamNotMatch(err)
}
