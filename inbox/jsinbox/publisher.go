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

// Intent is one thing to happen once: its ID is chosen when the intent is
// created and every publish retry carries it.
type Intent struct {
	ID      string
	Subject string
	Payload []byte
	// Ref is the caller's own reference to the intent (the producer puts
	// the input line number there). The publisher never sends it; it hands
	// it back in the intent's [Failure].
	Ref int
}

// PublisherConfig configures a [Publisher].
type PublisherConfig struct {
	// Stream is the stream every intent must be stored in: an intent whose
	// PubAck comes from another stream (its subject is captured by, say,
	// the dead-letter stream's "dlq.intents.>") fails at once with
	// [ErrWrongStream], naming both streams, and is not retried.
	// Duplicates are read back from this stream (see [ErrConflict]).
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
	// MaxInFlight bounds the publishes awaiting a PubAck. Publish blocks
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
	// Batch, above 1, publishes intents in JetStream atomic batches of up
	// to Batch messages (at most [MaxBatch]): the server stores a batch
	// with one fsync and one PubAck instead of one each, which is what
	// limits a stream with sync_interval: always. The stream must allow
	// atomic publishing (StreamConfig sets it). A batch the server refuses
	// as a whole (an ID it already has, a timeout, a server without atomic
	// publishing) is published again one intent at a time, with the same
	// IDs, so per-intent deduplication is kept. Default 0: one publish per
	// intent.
	Batch int
	// Linger is how long a partial batch waits for more intents before it
	// is sent. Default 1ms.
	Linger time.Duration
}

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
	c.Batch = min(c.Batch, MaxBatch)
	if c.Linger <= 0 {
		c.Linger = time.Millisecond
	}
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
	// an error wrapping [ErrConflict]).
	Conflicts int64
	// Retries: publishes sent again after a timeout or error.
	Retries int64
	// Batches: atomic batches the stream stored; BatchFallbacks: batches
	// it refused as a whole, whose intents were published one by one.
	Batches, BatchFallbacks int64
	// Failed intents, each listed in Failures: retry budget spent
	// without a PubAck, refused for good (a subject another stream
	// captures, [ErrWrongStream]) or a conflict ([ErrConflict]).
	Failed int64
}

// Failure is an intent the publisher could not publish: its retry budget
// ran out, the stream refused it for good, or its ID was reused (Err wraps
// [ErrConflict] or [ErrWrongStream] for those two).
type Failure struct {
	ID string
	// Ref is the intent's [Intent.Ref].
	Ref      int
	Attempts int
	Err      error
}

// ErrConflict reports an intent whose ID the stream already holds, inside
// its duplicate window, with a different payload: JetStream deduplicates by
// ID alone and dropped this intent. It is the "same key, different body"
// case of idempotency keys, never a success. The publisher finds it by
// reading back, on a duplicate PubAck only, the message the PubAck names
// and comparing payload fingerprints ([inbox.Fingerprint]).
var ErrConflict = errors.New("jsinbox: message ID reused with a different payload")

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
// A PubAck must come from the publisher's stream. A duplicate PubAck
// is checked: the publisher reads the stored message it names (the
// STREAM.MSG.GET API, so the producer's NATS user needs publish permission
// on $JS.API.STREAM.MSG.GET.<stream>) and reports a different payload as an
// [ErrConflict] failure. Publishes acknowledged as new never pay for this.
type Publisher struct {
	js     jetstream.JetStream
	cfg    PublisherConfig
	tracer trace.Tracer
	sem    chan struct{}
	wg     sync.WaitGroup
	ctx    context.Context
	stop   context.CancelFunc
	// pending holds sent publishes awaiting a PubAck, in send order.
	pending chan *tracker

	published, duplicates, conflicts, retries, failed atomic.Int64
	batches, batchFallbacks                           atomic.Int64

	// msgGet is the STREAM.MSG.GET API subject of cfg.Stream.
	msgGet string

	// batchIn feeds the batching goroutine when Batch > 1; noBatch is set
	// once the stream turns out not to allow atomic batches.
	batchIn chan *tracker
	noBatch atomic.Bool

	mu       sync.Mutex
	failures []Failure

	// hook, nil unless a harness attached one (internal/hook), loses
	// PubAcks.
	hook hook.Func
}

// NewPublisher returns a Publisher on js. [Publisher.Close] stops it.
func NewPublisher(js jetstream.JetStream, cfg PublisherConfig) (*Publisher, error) {
	cfg = cfg.WithDefaults()
	if err := cfg.Retry.Validate(); err != nil {
		return nil, fmt.Errorf("jsinbox: publisher: %w", err)
	}
	ctx, stop := context.WithCancel(context.Background())
	p := &Publisher{js: js, cfg: cfg, tracer: tracer(cfg.TracerProvider), sem: make(chan struct{}, cfg.MaxInFlight),
		pending: make(chan *tracker, cfg.MaxInFlight), ctx: ctx, stop: stop,
		msgGet: apiPrefix(js.Options()) + "STREAM.MSG.GET." + cfg.Stream}
	go p.waitLoop()
	if cfg.Batch > 1 {
		p.batchIn = make(chan *tracker, cfg.Batch)
		go p.gatherBatches()
	}
	return p, nil
}

// ErrBadIntent is returned by Publish for an intent without a valid ID or
// subject. The publisher never invents an ID.
var ErrBadIntent = errors.New("jsinbox: bad intent")

// Publish starts publishing in; it returns once the intent holds a slot of
// the in-flight window. Its outcome shows in Stats and Failures after Flush.
func (p *Publisher) Publish(ctx context.Context, in Intent) error {
	if err := inbox.ValidateID(in.ID); err != nil {
		return fmt.Errorf("%w: %w", ErrBadIntent, err)
	}
	if in.Subject == "" {
		return fmt.Errorf("%w: %s: empty subject", ErrBadIntent, in.ID)
	}
	select {
	case p.sem <- struct{}{}:
	case <-ctx.Done():
		return ctx.Err()
	}
	p.wg.Add(1)
	t := &tracker{p: p, in: in, header: nats.Header{jetstream.MsgIDHeader: []string{in.ID}}}
	if !p.cfg.SkipExpectedStreamHeader {
		t.header[jetstream.ExpectedStreamHeader] = []string{p.cfg.Stream}
	}
	if p.cfg.TracerProvider != nil {
		var sctx context.Context
		sctx, t.span = p.tracer.Start(ctx, "jetinbox.publish", trace.WithSpanKind(trace.SpanKindProducer),
			trace.WithAttributes(attribute.String("messaging.message.id", in.ID), attribute.String("messaging.destination.name", in.Subject)))
		injectTrace(sctx, t.header)
	}
	if p.batchIn != nil && !p.noBatch.Load() {
		select {
		case p.batchIn <- t:
		case <-p.ctx.Done():
			t.retry(p.ctx.Err()) // closed: reported as failed
		}
		return nil
	}
	t.send()
	return nil
}

// Flush waits until every intent handed to Publish was acknowledged or
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

// Close abandons pending retries.
func (p *Publisher) Close() { p.stop() }

// Stats returns the counters so far.
func (p *Publisher) Stats() PublisherStats {
	return PublisherStats{Published: p.published.Load(), Duplicates: p.duplicates.Load(), Conflicts: p.conflicts.Load(), Retries: p.retries.Load(),
		Failed: p.failed.Load(), Batches: p.batches.Load(), BatchFallbacks: p.batchFallbacks.Load()}
}

// Failures returns the intents that could not be published.
func (p *Publisher) Failures() []Failure {
	p.mu.Lock()
	defer p.mu.Unlock()
	return append([]Failure(nil), p.failures...)
}

type tracker struct {
	p        *Publisher
	in       Intent
	bo       interface{ NextBackOff() time.Duration }
	attempts int
	header   nats.Header
	span     trace.Span // nil unless tracing
	future   jetstream.PubAckFuture
	sent     time.Time
}

func (t *tracker) send() {
	t.attempts++
	msg := &nats.Msg{Subject: t.in.Subject, Data: t.in.Payload, Header: t.header}
	f, err := t.p.js.PublishMsgAsync(msg)
	if err != nil {
		t.retry(err)
		return
	}
	t.future, t.sent = f, time.Now()
	t.p.pending <- t
}

// waitLoop settles publishes in the order they were sent, which is the
// order PubAcks arrive in: one goroutine for the whole window instead of
// one per publish. A publish whose PubAck is late is retried when its
// AckTimeout has passed.
func (p *Publisher) waitLoop() {
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
			go t.checkDuplicate(ack.Sequence)
			return
		}
		t.p.published.Add(1)
		t.done()
	case err := <-f.Err():
		if isStreamNotMatch(err) {
			go t.wrongStream(err)
			return
		}
		t.retry(err)
	case <-timer.C:
		t.retry(fmt.Errorf("no PubAck within %v: %w", t.p.cfg.AckTimeout, context.DeadlineExceeded))
	case <-t.p.ctx.Done():
		t.retry(t.p.ctx.Err())
	}
}

func (t *tracker) retry(err error) {
	if t.bo == nil { // most publishes never retry: no backoff until one does
		t.bo = t.p.cfg.Retry.NewBackOff()
	}
	d := t.bo.NextBackOff()
	if d < 0 || t.p.ctx.Err() != nil || !retryable(err) {
		t.fail(err)
		return
	}
	t.p.retries.Add(1)
	time.AfterFunc(d, t.send)
}

// fail reports the intent as not published, for good.
func (t *tracker) fail(err error) {
	if errors.Is(err, ErrConflict) {
		t.p.conflicts.Add(1)
	}
	t.p.failed.Add(1)
	t.p.mu.Lock()
	t.p.failures = append(t.p.failures, Failure{ID: t.in.ID, Ref: t.in.Ref, Attempts: t.attempts, Err: err})
	t.p.mu.Unlock()
	t.p.cfg.Logger.Warn("jsinbox: intent not published", "id", t.in.ID, "attempts", t.attempts, "err", err)
	if t.span != nil {
		t.span.SetStatus(codes.Error, err.Error())
	}
	t.done()
}

func (t *tracker) done() {
	if t.span != nil {
		t.span.SetAttributes(attribute.Int("jetinbox.publish.attempts", t.attempts))
		t.span.End()
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
		!errors.Is(err, ErrWrongStream) && !errors.Is(err, ErrConflict) && !isStreamNotMatch(err)
}
