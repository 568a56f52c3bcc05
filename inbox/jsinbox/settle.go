// Settling a batch: run it through the inbox, then ack, nak, or hand the
// message to its last try or the dead-letter stream.

package jsinbox

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/trace"

	"github.com/jetinbox/jetinbox/inbox"
	"github.com/jetinbox/jetinbox/internal/hook"
)

// InboxMessage converts a JetStream delivery to the inbox's [inbox.Message]:
// the ID from its Nats-Msg-Id header, the payload and subject and, from its
// metadata, the stream sequence, the delivery count and when the stream
// stored it. Final stays false: it depends on the durable's MaxDeliver.
func InboxMessage(m jetstream.Msg) inbox.Message {
	im := inbox.Message{ID: m.Headers().Get(jetstream.MsgIDHeader), Payload: m.Data(), Subject: m.Subject()}
	if md, ok := parseAckReply(m.Reply()); ok {
		im.StreamSeq, im.Deliveries, im.Published = md.streamSeq, md.delivered, md.stored
	} else if md, err := m.Metadata(); err == nil {
		im.StreamSeq, im.Deliveries, im.Published = md.Sequence.Stream, md.NumDelivered, md.Timestamp
	}
	return im
}

// messagePool keeps the inbox messages of finished batches for the next
// ones: a batch of 6,000 is about 600 KB that would otherwise be allocated
// and collected for every batch.
var messagePool sync.Pool

// getMessages returns a slice of n zero messages.
func getMessages(n int) []inbox.Message {
	if p, ok := messagePool.Get().(*[]inbox.Message); ok && cap(*p) >= n {
		return (*p)[:n]
	}
	return make([]inbox.Message, n)
}

// putMessages returns msgs to the pool, cleared, so that it holds on to no
// payload. Nothing may use msgs afterwards: the processor, the observer and
// the settling of the batch are done with it when processBatch returns.
func putMessages(msgs []inbox.Message) {
	clear(msgs)
	messagePool.Put(&msgs)
}

// processBatch runs one batch through the inbox and settles every message
// with JetStream. It returns an error only for a simulated crash.
func (c *Consumer) processBatch(ctx context.Context, batch []jetstream.Msg, fetchStart time.Time) error {
	ds := make([]delivery, len(batch))
	now := time.Now()
	for i, m := range batch {
		ds[i] = delivery{m: m, c: c, at: now}
	}
	return processDeliveries(ctx, ds, fetchStart)
}

// processDeliveries runs one batch through the inbox in one transaction and
// settles every message with the consumer whose durable delivered it: a
// shard's [Batcher] forms batches of several partition durables. The
// first message's consumer runs the processor (every consumer of a batch
// shares it), traces and observes the batch. It returns an error only for
// a simulated crash.
func processDeliveries(ctx context.Context, batch []delivery, fetchStart time.Time) error {
	c := batch[0].c
	if c.cfg.TracerProvider != nil {
		links := make([]trace.Link, 0, min(len(batch), 64))
		for _, d := range batch[:min(len(batch), 64)] {
			if l, ok := extractLink(d.m.Headers()); ok {
				links = append(links, l)
			}
		}
		var span trace.Span
		ctx, span = c.tracer.Start(ctx, "jetinbox.batch", trace.WithSpanKind(trace.SpanKindConsumer), trace.WithLinks(links...),
			trace.WithTimestamp(fetchStart), trace.WithAttributes(attribute.Int("messaging.batch.message_count", len(batch)),
				attribute.String("messaging.consumer.group.name", c.cfg.Durable)))
		defer span.End()
		_, fetch := c.tracer.Start(ctx, "jetinbox.fetch", trace.WithTimestamp(fetchStart))
		fetch.End()
	}
	msgs := getMessages(len(batch))
	defer putMessages(msgs)
	// The consumers of the batch, each once: most batches have one.
	cons := []*Consumer{c}
	for i, d := range batch {
		msgs[i] = InboxMessage(d.m)
		msgs[i].Final = d.c.cfg.MaxDeliver > 0 && msgs[i].Deliveries >= uint64(d.c.cfg.MaxDeliver)
		if msgs[i].Deliveries > 1 {
			d.c.redeliveries.Add(1)
		}
		d.c.received.Add(1)
		if d.c != cons[len(cons)-1] && !slices.Contains(cons, d.c) {
			cons = append(cons, d.c)
		}
	}
	stopProgress := make(chan struct{})
	go c.keepAlive(batch, stopProgress)
	defer close(stopProgress) // keep the batch alive while it is settled too
	pctx := ctx
	var steps *inbox.StepTimes
	if _, ok := c.cfg.Observer.(AckObserver); ok {
		steps = new(inbox.StepTimes)
		pctx = inbox.WithStepTimes(ctx, steps)
	}
	began := time.Now()
	out, err := c.proc.Process(pctx, msgs)
	c.batches.Add(1)
	report := BatchReport{Messages: msgs, Outcomes: out, Err: err, Began: began, Ended: time.Now()}
	if steps != nil {
		report.Steps = *steps
	}
	if c.cfg.Observer != nil {
		c.cfg.Observer.ObserveBatch(report)
	}

	var crash *hook.Crash
	if errors.As(err, &crash) {
		c.cfg.Logger.Warn("jsinbox: simulated crash", "point", crash.Point, "batch", len(batch))
		return err
	}
	if err != nil {
		c.failedBatches.Add(1)
		if c.pauseAfter(ctx, err, out) {
			for _, k := range cons {
				k.dbDown.Store(true)
			}
		}
		c.cfg.Logger.Warn("jsinbox: batch failed; naking with jittered delay", "batch", len(batch), "err", err)
	} else {
		for _, k := range cons {
			k.batchOK.Store(true)
		}
	}
	// Each consumer's hook is asked once per batch.
	skip := make([]bool, len(cons))
	for j, k := range cons {
		skip[j] = k.hook != nil && k.hook(hook.SkipAck)
	}
	skipAck := func(k *Consumer) bool { return skip[slices.Index(cons, k)] }
	if c.cfg.TracerProvider != nil {
		var ack trace.Span
		ctx, ack = c.tracer.Start(ctx, "jetinbox.ack")
		defer ack.End()
	}
	// Acks and naks first, then what goes to the dead-letter stream: a
	// dead letter held on an outage must not hold back its neighbours' acks.
	var later []int
	for i, d := range batch {
		o, m, k := out[i], d.m, d.c
		switch {
		case o.Ackable():
			if o.Status == inbox.StatusApplied {
				k.applied.Add(1)
			} else {
				k.duplicates.Add(1)
			}
			if !skipAck(k) {
				if err := m.Ack(); err != nil {
					k.cfg.Logger.Debug("jsinbox: ack failed; the message will be redelivered and found in the inbox",
						"id", msgs[i].ID, "stream_seq", msgs[i].StreamSeq, "deliveries", msgs[i].Deliveries, "err", err)
				}
			}
		case o.Status == inbox.StatusRejected || o.Status == inbox.StatusConflict || msgs[i].Final:
			later = append(later, i)
		default:
			k.naks.Add(1)
			_ = m.NakWithDelay(k.cfg.Nak.Delay(int(max(msgs[i].Deliveries, 1))))
		}
	}
	if a, ok := c.cfg.Observer.(AckObserver); ok {
		report.Received = make([]time.Time, len(batch))
		for i, d := range batch {
			report.Received[i] = d.at
		}
		report.Acked = time.Now()
		a.ObserveAcked(report)
	}
	for _, i := range later {
		k := batch[i].c
		if o := out[i]; o.Status == inbox.StatusRejected || o.Status == inbox.StatusConflict {
			k.settleRejected(ctx, batch[i].m, &msgs[i], o)
		} else {
			k.lastTry(ctx, batch[i].m, &msgs[i], o)
		}
	}
	return nil
}

// lastTry settles a message whose last delivery ended in retry. The batch
// may have failed with its commit outcome unknown, in which case the message
// may well be applied: one more transaction of its own finds out. Applied
// (now or before) is acked; rejected is dead-lettered with the reason; a
// retry that is not the message's fault ([inbox.Outcome.NotMessageFault]:
// the database unavailable or unfit, the message's partition moved away)
// is left unsettled for the rescue, as is any failure while the database
// is down; anything else is dead-lettered as given up.
func (c *Consumer) lastTry(ctx context.Context, m jetstream.Msg, im *inbox.Message, o inbox.Outcome) {
	if c.dbDown.Load() {
		// Known down: another try would only wait for its connect timeout.
		c.leaveForRescue(im, "the database is unavailable", o.Err)
		return
	}
	if o.NotMessageFault && !errors.Is(o.Err, inbox.ErrOutcomeUnknown) {
		// The same try would fail the same way: nothing to find out.
		c.leaveForRescue(im, "not the message's fault", o.Err)
		return
	}
	_ = m.InProgress()
	out, err := c.proc.Process(ctx, []inbox.Message{*im})
	if len(out) == 1 {
		o = out[0]
	}
	var crash *hook.Crash
	switch {
	case errors.As(err, &crash):
		// A dead process settles nothing.
	case o.Ackable():
		c.duplicates.Add(1)
		_ = m.Ack()
	case o.Status == inbox.StatusRejected || o.Status == inbox.StatusConflict:
		c.settleRejected(ctx, m, im, o)
	case o.NotMessageFault:
		c.leaveForRescue(im, "not the message's fault", err)
	case err != nil && c.lettingGo(ctx):
		c.leaveForRescue(im, "stopping while the database is unavailable", err)
	default:
		c.deadLetter(ctx, m, im, "gave-up", fmt.Sprintf("gave up after %d deliveries: %s", im.Deliveries, o.Reason))
	}
}

// leaveForRescue leaves a message on its last delivery unsettled: what kept
// it from being applied is not its fault, and giving up on it would
// record a failure the intent never had. The server gives up on it after
// AckWait, keeps its max-deliveries advisory in the advisory stream, and
// the rescue applies it once the cause is gone.
func (c *Consumer) leaveForRescue(im *inbox.Message, why string, err error) {
	c.leftForRescue.Add(1)
	c.cfg.Logger.Warn("jsinbox: leaving a message on its last delivery unsettled for the rescue: "+why,
		"id", im.ID, "stream_seq", im.StreamSeq, "deliveries", im.Deliveries, "err", err)
}

// pauseAfter reports whether a failed batch pauses fetching: its database
// fails the processor's Check (unreachable, read-only, unmigrated, behind a
// statement pooler, a grant missing), or the batch failed for a reason
// that is no message's (a handler's table or grant missing, which Check
// cannot see). A commit whose outcome is unknown pauses only if Check
// fails.
func (c *Consumer) pauseAfter(ctx context.Context, err error, out []inbox.Outcome) bool {
	cctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	if check(cctx, c.proc) != nil {
		return true
	}
	if errors.Is(err, inbox.ErrOutcomeUnknown) {
		return false
	}
	for _, o := range out {
		if o.NotMessageFault {
			return true
		}
	}
	return false
}

// lettingGo reports whether a message whose last try failed as a whole
// (the database could not commit it) should be left unsettled: the
// consumer is stopping and the database does not answer. Dead-lettering
// it as given up would record a failure the intent never had; left
// alone, the server gives up on it after AckWait, its max-deliveries
// advisory is kept in the advisory stream, and the next consumer rescues
// it once the database is back.
func (c *Consumer) lettingGo(ctx context.Context) bool {
	if !c.stoppingNow() {
		return false
	}
	if c.dbDown.Load() {
		return true
	}
	pctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	return c.proc.Ping(pctx) != nil
}

// stoppingNow reports whether Run's context has ended.
func (c *Consumer) stoppingNow() bool {
	select {
	case <-c.stopping:
		return true
	default:
		return false
	}
}
