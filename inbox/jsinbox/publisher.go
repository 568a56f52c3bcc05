package jsinbox

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/nats-io/nuid"
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
	// Default: jitter.Default(), which gives up after 10 retries (72 s at
	// most), inside JetStream's default 2-minute duplicate window.
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
	// atomic publishing (StreamOptions sets it). A batch the server refuses
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

// PublishStats counts what a Publisher did.
type PublishStats struct {
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
		go p.batchLoop()
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
func (p *Publisher) Stats() PublishStats {
	return PublishStats{Published: p.published.Load(), Duplicates: p.duplicates.Load(), Conflicts: p.conflicts.Load(), Retries: p.retries.Load(),
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

// checkDuplicate settles an intent the stream acknowledged as a duplicate
// of the message at seq: the same payload is a duplicate (published), a
// different one is a conflict. If the message cannot be read back, the
// intent is published again (same ID) within its retry budget, which gives
// a new PubAck to check.
func (t *tracker) checkDuplicate(seq uint64) {
	stored, err := t.p.storedMsg(seq)
	if err == nil && stored.Header.Get(jetstream.MsgIDHeader) != t.in.ID {
		err = fmt.Errorf("it holds ID %q", stored.Header.Get(jetstream.MsgIDHeader))
	}
	if err != nil {
		t.retry(fmt.Errorf("duplicate PubAck: reading back stream %s sequence %d: %w", t.p.cfg.Stream, seq, err))
		return
	}
	if have, want := inbox.Fingerprint(stored.Data), inbox.Fingerprint(t.in.Payload); have != want {
		t.fail(fmt.Errorf("%w: stream %s holds ID %s at sequence %d with payload sha256 %x…, this intent's is %x…",
			ErrConflict, t.p.cfg.Stream, t.in.ID, seq, have[:8], want[:8]))
		return
	}
	t.p.duplicates.Add(1)
	t.p.published.Add(1)
	t.done()
}

// storedMsg reads the message at seq with the STREAM.MSG.GET API, which the
// stream leader answers: unlike a direct get it never returns a replica's
// stale view, and it works whether or not the stream allows direct gets
// (nats.go's Stream.GetMsg switches to them when it does, which would need
// another permission).
func (p *Publisher) storedMsg(seq uint64) (*jetstream.RawStreamMsg, error) {
	ctx, cancel := context.WithTimeout(p.ctx, p.cfg.AckTimeout)
	defer cancel()
	req, err := json.Marshal(struct {
		Seq uint64 `json:"seq"`
	}{seq})
	if err != nil {
		return nil, fmt.Errorf("msg get request: %w", err)
	}
	resp, err := p.js.Conn().RequestWithContext(ctx, p.msgGet, req)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", p.msgGet, err)
	}
	var r struct {
		Message *struct {
			Subject string `json:"subject"`
			Seq     uint64 `json:"seq"`
			Header  []byte `json:"hdrs"`
			Data    []byte `json:"data"`
		} `json:"message"`
		Error *jetstream.APIError `json:"error"`
	}
	if err := json.Unmarshal(resp.Data, &r); err != nil {
		return nil, fmt.Errorf("%s: %w", p.msgGet, err)
	}
	if r.Error != nil {
		return nil, fmt.Errorf("%s: %w", p.msgGet, r.Error)
	}
	if r.Message == nil || r.Message.Seq != seq {
		return nil, fmt.Errorf("%s: no message %d in the reply", p.msgGet, seq)
	}
	m := &jetstream.RawStreamMsg{Subject: r.Message.Subject, Sequence: seq, Data: r.Message.Data}
	if len(r.Message.Header) > 0 {
		if m.Header, err = nats.DecodeHeadersMsg(r.Message.Header); err != nil {
			return nil, fmt.Errorf("%s: headers: %w", p.msgGet, err)
		}
	}
	return m, nil
}

// apiPrefix is the JetStream API prefix js sends its requests with.
func apiPrefix(o jetstream.JetStreamOptions) string {
	switch {
	case o.Domain != "":
		return "$JS." + o.Domain + ".API."
	case o.APIPrefix != "":
		return strings.TrimSuffix(o.APIPrefix, ".") + "."
	}
	return jetstream.DefaultAPIPrefix
}

// errStreamNotMatch is JetStream's error code for a publish whose
// Nats-Expected-Stream is not the stream that captures its subject.
const errStreamNotMatch = 10060

func isStreamNotMatch(err error) bool {
	var apiErr *jetstream.APIError
	return errors.As(err, &apiErr) && apiErr.ErrorCode == errStreamNotMatch
}

// wrongStream fails an intent the server refused because another stream
// captures its subject. The refusal nats.go hands over does not say which
// stream that is, so it asks the server once more with a probe that no
// stream can store (an expected last message ID nothing has) and names the
// stream from its reply.
func (t *tracker) wrongStream(refusal error) {
	other := "another stream"
	if name := t.p.streamOf(t.in.Subject); name != "" {
		other = fmt.Sprintf("stream %q", name)
	}
	t.fail(fmt.Errorf("%w: subject %q of intent %s is captured by %s, not %q: %w", ErrWrongStream, t.in.Subject, t.in.ID, other, t.p.cfg.Stream, refusal))
}

// streamOf returns the name of the stream that refuses a publish on subject
// for expecting cfg.Stream, or "" if the probe gets no such answer.
func (p *Publisher) streamOf(subject string) string {
	ctx, cancel := context.WithTimeout(p.ctx, p.cfg.AckTimeout)
	defer cancel()
	probe := &nats.Msg{Subject: subject, Header: nats.Header{
		jetstream.ExpectedStreamHeader:    []string{p.cfg.Stream},
		jetstream.ExpectedLastMsgIDHeader: []string{"jetinbox-probe-" + nuid.Next()},
	}}
	resp, err := p.js.Conn().RequestMsgWithContext(ctx, probe)
	if err != nil {
		return ""
	}
	var ack batchAck
	if json.Unmarshal(resp.Data, &ack) != nil || ack.Error == nil || ack.Error.ErrCode != errStreamNotMatch {
		return ""
	}
	return ack.Stream
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
// stream captures is not.
func retryable(err error) bool {
	return !errors.Is(err, jetstream.ErrInvalidSubject) && !errors.Is(err, nats.ErrBadSubject) && !errors.Is(err, nats.ErrMaxPayload) &&
		!errors.Is(err, ErrWrongStream) && !errors.Is(err, ErrConflict) && !isStreamNotMatch(err)
}

// batchLoop gathers intents into atomic batches: a batch goes out when it
// is full or when its first intent has waited Linger.
func (p *Publisher) batchLoop() {
	timer := time.NewTimer(time.Hour)
	timer.Stop()
	var cur []*tracker
	for {
		select {
		case t := <-p.batchIn:
			if len(cur) == 0 {
				timer.Reset(p.cfg.Linger)
			}
			cur = append(cur, t)
			if len(cur) < p.cfg.Batch {
				continue
			}
		case <-timer.C:
		case <-p.ctx.Done():
			for _, t := range cur {
				t.retry(p.ctx.Err())
			}
			return
		}
		if len(cur) > 0 {
			timer.Stop()
			p.sendBatch(cur)
			cur = nil
		}
	}
}

// Headers of JetStream's atomic batch publishing (ADR-50).
const (
	batchIDHeader     = "Nats-Batch-Id"
	batchSeqHeader    = "Nats-Batch-Sequence"
	batchCommitHeader = "Nats-Batch-Commit"
)

// sendBatch publishes ts as one atomic batch: every message but the last
// without a reply, the last with the commit header as a request whose
// reply is the batch's PubAck. Each message keeps its headers: the server
// checks Nats-Msg-Id (and Nats-Expected-Stream, if sent) on every message of
// an atomic batch and refuses the whole batch if one fails (an ID it holds,
// another stream). A message whose subject another stream captures leaves
// the batch incomplete in ours, which refuses it too. The intents then go
// one by one, where each gets its own verdict.
func (p *Publisher) sendBatch(ts []*tracker) {
	if p.noBatch.Load() {
		for _, t := range ts {
			t.send()
		}
		return
	}
	nc := p.js.Conn()
	id := nuid.Next()
	for i, t := range ts {
		t.attempts++
		h := make(nats.Header, len(t.header)+3)
		for k, v := range t.header {
			h[k] = v
		}
		h[batchIDHeader] = []string{id}
		h[batchSeqHeader] = []string{strconv.Itoa(i + 1)}
		msg := &nats.Msg{Subject: t.in.Subject, Data: t.in.Payload, Header: h}
		if i < len(ts)-1 {
			// An error here leaves the batch incomplete: the server
			// refuses the commit and every intent goes again on its own.
			_ = nc.PublishMsg(msg)
			continue
		}
		h[batchCommitHeader] = []string{"1"}
		go func() {
			resp, err := nc.RequestMsg(msg, p.cfg.AckTimeout)
			p.settleBatch(ts, resp, err)
		}()
	}
}

// batchAck is the PubAck of an atomic batch, or its error.
type batchAck struct {
	Stream string `json:"stream"`
	Seq    uint64 `json:"seq"`
	Count  int    `json:"count"`
	Error  *struct {
		Code        int    `json:"code"`
		ErrCode     int    `json:"err_code"`
		Description string `json:"description"`
	} `json:"error"`
}

// errAtomicDisabled is JetStream's error code for a batch sent to a stream
// that does not allow atomic publishing.
const errAtomicDisabled = 10174

// settleBatch settles a batch from its commit's reply. Stored: every
// intent is published. Refused, lost or late: every intent is published
// again on its own with its ID, and the stream's duplicate window drops
// those it already stored.
func (p *Publisher) settleBatch(ts []*tracker, resp *nats.Msg, err error) {
	var ack batchAck
	if err == nil {
		if jerr := json.Unmarshal(resp.Data, &ack); jerr != nil {
			err = fmt.Errorf("batch PubAck: %w", jerr)
		} else if ack.Error != nil {
			err = fmt.Errorf("batch refused: %s (%d)", ack.Error.Description, ack.Error.ErrCode)
		} else if ack.Count != len(ts) {
			err = fmt.Errorf("batch PubAck counts %d of %d messages", ack.Count, len(ts))
		} else if ack.Stream != p.cfg.Stream {
			// Each intent goes again on its own and fails with
			// ErrWrongStream there.
			err = fmt.Errorf("batch stored by stream %q, not %q", ack.Stream, p.cfg.Stream)
		}
	}
	if err == nil && p.hook != nil && p.hook(hook.LosePubAck) {
		err = errors.New("batch PubAck lost (simulated)")
	}
	if err == nil {
		p.batches.Add(1)
		for _, t := range ts {
			p.published.Add(1)
			t.done()
		}
		return
	}
	if ack.Error != nil && ack.Error.ErrCode == errAtomicDisabled && !p.noBatch.Swap(true) {
		p.cfg.Logger.Warn("jsinbox: the stream does not allow atomic batches; publishing one intent at a time", "subject", ts[0].in.Subject)
	}
	p.batchFallbacks.Add(1)
	p.cfg.Logger.Debug("jsinbox: batch not stored as a whole; publishing its intents one at a time", "size", len(ts), "err", err)
	for _, t := range ts {
		t.send()
	}
}
