// Group commit: intents handed over at the same time gathered into
// JetStream atomic batches (ADR-50), one fsync and one PubAck a batch, each
// intent settled on its own, and the fallback to one by one.
//
// What a batch costs decides the shape of it. The server stages an atomic
// batch before committing it, on a single-node file stream in a file store
// of its own, created and removed per batch, and stages batches one at a
// time per stream: on a 2-core test machine a batch took 2-3 ms whatever
// its size up to 64 when the disk was quiet, 7-20 ms when it was busy, as
// long as 10-55 single publishes with sync_interval: always. So one group
// is in flight at a time, it takes everything that arrived meanwhile, and
// a group smaller than MinBatch goes as single publishes: at a low rate
// fewer intents than that arrive while a batch is stored, so the publisher
// falls back to single publishes instead of staying with batches that each
// wait for the one before.

package jsinbox

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/synadia-io/orbit.go/jetstreamext"

	"github.com/jetinbox/jetinbox/internal/hook"
)

// gatherBatches is the group commit. One group of intents is in flight at
// a time; meanwhile the next one gathers what arrives (up to Batch), and it
// goes out as soon as the one in flight has its PubAcks, or, if Linger is
// set, once its first intent has also waited Linger. A group of MinBatch
// intents or more is one atomic batch; a smaller one is published one
// intent at a time, pipelined, which costs the server less than the
// staging store of a batch.
func (p *Publisher) gatherBatches() {
	defer p.bg.Done()
	timer := time.NewTimer(time.Hour)
	timer.Stop()
	var cur []*tracker
	inFlight, ready := false, false
	for {
		in := p.batchIn
		if len(cur) >= p.cfg.Batch {
			in = nil // full: wait for the group in flight
		}
		select {
		case t := <-in:
			if len(cur) == 0 && p.cfg.Linger > 0 {
				timer.Reset(p.cfg.Linger)
				ready = false
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
			inFlight = false
		case <-timer.C:
			ready = true
		case <-p.ctx.Done():
			for _, t := range cur {
				t.fail(ErrClosed)
			}
			return
		}
		if !inFlight && len(cur) > 0 && (ready || p.cfg.Linger <= 0 || len(cur) >= p.cfg.Batch) {
			timer.Stop()
			p.sendGroup(cur)
			cur, inFlight, ready = nil, true, false
		}
	}
}

// group counts the intents of a group published one by one whose first
// PubAck (or error) has not come yet.
type group struct{ left atomic.Int32 }

// leaveGroup tells the group commit that this intent's first attempt is
// over; the last of its group lets the next group go.
func (t *tracker) leaveGroup() {
	g := t.grp
	if g == nil {
		return
	}
	t.grp = nil
	if g.left.Add(-1) == 0 {
		t.p.groupDone()
	}
}

// groupDone lets the group commit send its next group. Never blocks: one
// group is in flight at a time, so the one-slot channel is empty.
func (p *Publisher) groupDone() {
	select {
	case p.batchDone <- struct{}{}:
	default:
	}
}

// sendGroup publishes ts as one atomic batch, on a goroutine of its own,
// or one by one if they are fewer than MinBatch or the stream takes no
// batches. Either way, groupDone follows once.
func (p *Publisher) sendGroup(ts []*tracker) {
	if len(ts) < p.cfg.MinBatch || p.noBatch.Load() {
		g := &group{}
		g.left.Store(int32(len(ts)))
		for _, t := range ts {
			t.grp = g
		}
		for _, t := range ts {
			t.send()
		}
		return
	}
	p.goBG(func() {
		ack, err := p.commitBatch(ts)
		p.settleBatch(ts, ack, err)
		p.groupDone()
	}, func() {
		for _, t := range ts {
			t.fail(ErrClosed)
		}
	})
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
