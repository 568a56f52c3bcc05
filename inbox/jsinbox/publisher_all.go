// PublishAll: a caller's own intents sent as JetStream atomic batches of
// its choosing (the outbox relay's round), each intent settled on its own.

package jsinbox

import (
	"context"
	"fmt"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/jetinbox/jetinbox/inbox"
)

// Result is one intent's outcome in [Publisher.PublishAll]: Ack when the
// stream stored it (Ack.Duplicate set when it already held the ID with
// the same payload), else Err, as [Publisher.Publish] returns them.
type Result struct {
	Ack *jetstream.PubAck
	Err error
}

// Sent is the intents of one [Publisher.PublishAll] on their way.
type Sent struct {
	ins  []inbox.Intent
	ts   []*tracker // nil where the intent was not handed over
	errs []error    // why not
}

// PublishAll publishes ins, in order, as JetStream atomic batches of up to
// [MaxBatch] intents (fewer if MaxInFlight is smaller), and returns once
// every intent is on its way, without waiting for a PubAck: [Sent.Wait]
// returns each intent's own outcome. A batch stored as a whole costs the
// server one fsync and the client one PubAck; a batch of fewer than
// MinBatch intents, or any batch once the stream has refused atomic
// publishing, goes one intent at a time (pipelined), as does every intent
// of a batch the server refuses as a whole (an ID it already holds, a
// subject another stream captures, a lost or late PubAck): deduplication,
// the conflict check and the stream check then hold for each intent.
//
// The batches bypass the group commit of [PublisherConfig].Batch: the
// caller has gathered them. An intent that fails validation, or that
// cannot be handed over because ctx ended or the publisher is closed, is
// not sent and gets that error.
func (p *Publisher) PublishAll(ctx context.Context, ins []inbox.Intent) *Sent {
	s := &Sent{ins: ins, ts: make([]*tracker, len(ins)), errs: make([]error, len(ins))}
	size := min(MaxBatch, p.cfg.MaxInFlight)
	var chunk []*tracker
	for i, in := range ins {
		t, err := p.start(ctx, in, true, true)
		if err != nil {
			s.errs[i] = err
			continue
		}
		s.ts[i] = t
		if chunk = append(chunk, t); len(chunk) == size {
			p.sendChunk(chunk)
			chunk = nil
		}
	}
	if len(chunk) > 0 {
		p.sendChunk(chunk)
	}
	return s
}

// sendChunk sends ts as one atomic batch, on a goroutine of its own, or one
// by one when they are fewer than MinBatch or the stream takes no batches.
func (p *Publisher) sendChunk(ts []*tracker) {
	if len(ts) < p.cfg.MinBatch || p.noBatch.Load() {
		for _, t := range ts {
			t.send()
		}
		return
	}
	p.goBG(func() {
		ack, err := p.commitBatch(ts)
		p.settleBatch(ts, ack, err)
	}, func() {
		for _, t := range ts {
			t.fail(ErrClosed)
		}
	})
}

// Wait waits for the outcome of every intent and returns them in the
// order of PublishAll's ins. If ctx ends first, the intents not settled
// yet get an error saying their outcome is not known (each may or may not
// be stored; publishing it again with the same ID is safe).
func (s *Sent) Wait(ctx context.Context) []Result {
	out := make([]Result, len(s.ts))
	for i, t := range s.ts {
		if t == nil {
			out[i].Err = s.errs[i]
			continue
		}
		select {
		case <-t.res:
			if t.err != nil {
				out[i].Err = t.err
			} else {
				ack := t.ack
				out[i].Ack = &ack
			}
		case <-ctx.Done():
			out[i].Err = fmt.Errorf("jsinbox: intent %s: outcome not known yet: %w", s.ins[i].ID, ctx.Err())
		}
	}
	return out
}
