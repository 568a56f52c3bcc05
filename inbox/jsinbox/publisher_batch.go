// Group commit: intents handed over at the same time gathered into
// JetStream atomic batches (ADR-50), one fsync and one PubAck a batch, each
// intent settled on its own, and the fallback to one by one.

package jsinbox

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/synadia-io/orbit.go/jetstreamext"

	"github.com/jetinbox/jetinbox/internal/hook"
)

// gatherBatches is the group commit: it takes every intent waiting (never
// waiting for more) and sends them as one batch when the batch is full,
// when no batch awaits its PubAck, or when its first intent has waited
// Linger. While a batch is being stored, the next one gathers what arrives.
func (p *Publisher) gatherBatches() {
	defer p.bg.Done()
	timer := time.NewTimer(time.Hour)
	timer.Stop()
	var cur []*tracker
	inFlight, lingered := 0, false
	for {
		select {
		case t := <-p.batchIn:
			if len(cur) == 0 {
				timer.Reset(p.cfg.Linger)
				lingered = false
			}
			cur = append(cur, t)
		more:
			for len(cur) < p.cfg.Batch {
				select {
				case t := <-p.batchIn:
					cur = append(cur, t)
				default:
					break more
				}
			}
		case <-p.batchDone:
			inFlight--
		case <-timer.C:
			lingered = true
		case <-p.ctx.Done():
			for _, t := range cur {
				t.fail(ErrClosed)
			}
			return
		}
		if len(cur) > 0 && (inFlight == 0 || lingered || len(cur) >= p.cfg.Batch) {
			timer.Stop()
			if p.sendBatch(cur) {
				inFlight++
			}
			cur, lingered = nil, false
		}
	}
}

// sendBatch publishes ts as one atomic batch on a goroutine of its own,
// which tells batchDone when the batch is settled. It returns false if it
// published them one by one instead (the stream does not take batches).
func (p *Publisher) sendBatch(ts []*tracker) bool {
	if p.noBatch.Load() {
		for _, t := range ts {
			t.send()
		}
		return false
	}
	p.goBG(func() {
		ack, err := p.commitBatch(ts)
		p.settleBatch(ts, ack, err)
		select {
		case p.batchDone <- struct{}{}:
		case <-p.ctx.Done():
		}
	}, func() {
		for _, t := range ts {
			t.fail(ErrClosed)
		}
	})
	return true
}

// commitBatch publishes ts with jetstreamext's atomic batch publishing:
// every message but the last without a reply, the last with the commit
// header as a request whose reply is the batch's PubAck. Each message
// keeps its headers: the server checks Nats-Msg-Id (and
// Nats-Expected-Stream, if sent) on every message of an atomic batch and
// refuses the whole batch if one fails (an ID it holds, another stream). A
// message whose subject another stream captures leaves the batch incomplete
// in ours, which refuses it too.
func (p *Publisher) commitBatch(ts []*tracker) (*jetstreamext.BatchAck, error) {
	msgs := make([]*nats.Msg, len(ts))
	for i, t := range ts {
		t.attempts++
		msgs[i] = &nats.Msg{Subject: t.in.Subject, Data: t.in.Payload, Header: t.header}
	}
	ctx, cancel := context.WithTimeout(p.ctx, p.cfg.AckTimeout)
	defer cancel()
	// No flow control: a batch is at most MaxBatch messages, which the
	// server takes without a round trip on its first message.
	ack, err := jetstreamext.PublishMsgBatch(ctx, p.js, msgs, jetstreamext.BatchFlowControl{})
	// The messages were written: their batch headers go, so that a
	// publish of an intent on its own is not taken for part of a batch.
	for _, t := range ts {
		t.header.Del(jetstreamext.BatchIDHeader)
		t.header.Del(jetstreamext.BatchSeqHeader)
		t.header.Del(jetstreamext.BatchCommitHeader)
	}
	if err != nil {
		return nil, fmt.Errorf("atomic batch of %d: %w", len(ts), err)
	}
	return ack, nil
}

// settleBatch settles a batch from its commit's reply. Stored: every
// intent is published, at consecutive sequences ending at the PubAck's.
// Refused, lost or late: every intent is published again on its own with
// its ID, and the stream's duplicate window drops those it already stored.
func (p *Publisher) settleBatch(ts []*tracker, ack *jetstreamext.BatchAck, err error) {
	if err == nil && ack.Stream != p.cfg.Stream {
		// Each intent goes again on its own and fails with
		// ErrWrongStream there.
		err = fmt.Errorf("batch stored by stream %q, not %q", ack.Stream, p.cfg.Stream)
	}
	if err == nil && p.hook != nil && p.hook(hook.LosePubAck) {
		err = errors.New("batch PubAck lost (simulated)")
	}
	if err == nil {
		p.batches.Add(1)
		first := ack.Sequence + 1 - uint64(len(ts))
		for i, t := range ts {
			p.published.Add(1)
			t.ack = jetstream.PubAck{Stream: ack.Stream, Sequence: first + uint64(i), Domain: ack.Domain}
			t.done()
		}
		return
	}
	var apiErr *jetstream.APIError
	if errors.As(err, &apiErr) && apiErr.ErrorCode == jetstreamext.JSErrCodeBatchPublishNotEnabled && p.streamOf(ts[len(ts)-1].in.Subject) == "" &&
		!p.noBatch.Swap(true) {
		// The refusal came from our stream, not from another one that
		// captured the commit's subject.
		p.cfg.Logger.Warn("jsinbox: the stream does not allow atomic batches; publishing one intent at a time",
			"stream", p.cfg.Stream, "err", err)
	}
	p.batchFallbacks.Add(1)
	p.cfg.Logger.Debug("jsinbox: batch not stored as a whole; publishing its intents one at a time", "size", len(ts), "err", err)
	for _, t := range ts {
		t.send()
	}
}
