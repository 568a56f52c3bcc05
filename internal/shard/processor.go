package shard

import (
	"context"
	"fmt"
	"slices"
	"sync/atomic"

	"github.com/jetinbox/jetinbox/inbox"
	"github.com/jetinbox/jetinbox/inbox/jsinbox"
)

// Processor checks every message's binding before the inbox sees it: a
// message stored under another partition than its ID's, or on a subject
// whose key token is not its ID's, is rejected with the reason (and so
// dead-lettered) and never claimed, so no shard applies an ID outside its
// partition. A message of a partition the shard does not own now is
// retried (nak'd) without a claim, marked as no fault of its own
// ([inbox.Outcome.NotMessageFault]): on its last delivery it is left
// unsettled for the rescue of the partition's new owner, never
// dead-lettered. The rest goes to the inner processor.
type Processor struct {
	jsinbox.BatchProcessor
	m     *Map
	owned atomic.Pointer[[]bool]
	// handedOff[q], if not 0: partition q was given away with a hand-off
	// durable that delivers it from this stream sequence on.
	handedOff atomic.Pointer[[]uint64]
	warmed    atomic.Bool
}

// NewProcessor wraps inner for the shard map m; it owns no partition
// until SetOwned.
func NewProcessor(inner jsinbox.BatchProcessor, m *Map) *Processor {
	p := &Processor{BatchProcessor: inner, m: m}
	none := make([]bool, m.Partitions)
	p.owned.Store(&none)
	return p
}

// SetOwned sets the partitions this shard takes.
func (p *Processor) SetOwned(s Set) {
	o := make([]bool, p.m.Partitions)
	for _, q := range s {
		if q >= 0 && q < len(o) {
			o[q] = true
		}
	}
	p.owned.Store(&o)
}

// SetHandedOff sets, for each partition the shard gave away with a
// hand-off durable (see [Map.ShardDurables]), the first stream sequence
// that durable delivers (0: none). A message of such a partition at or
// after it that still reaches this shard is acked without being applied:
// the hand-off delivers it to the partition's owner.
func (p *Processor) SetHandedOff(from []uint64) {
	c := slices.Clone(from)
	p.handedOff.Store(&c)
}

// Process implements jsinbox.BatchProcessor.
func (p *Processor) Process(ctx context.Context, msgs []inbox.Message) ([]inbox.Outcome, error) {
	var handedOff []uint64
	if h := p.handedOff.Load(); h != nil {
		handedOff = *h
	}
	return p.process(ctx, msgs, handedOff)
}

// HandOffProcessor returns the processor a hand-off durable's consumer
// runs (with a batcher of its own: a batcher runs all its batches through
// one processor): p, except that it never acks a message as handed off. A
// hand-off is where such messages go; settling one there unapplied would
// lose it.
func (p *Processor) HandOffProcessor() jsinbox.BatchProcessor { return handOffProcessor{p} }

type handOffProcessor struct{ *Processor }

func (h handOffProcessor) Process(ctx context.Context, msgs []inbox.Message) ([]inbox.Outcome, error) {
	return h.process(ctx, msgs, nil)
}

func (p *Processor) process(ctx context.Context, msgs []inbox.Message, handedOff []uint64) ([]inbox.Outcome, error) {
	owned := *p.owned.Load()
	var out []inbox.Outcome
	var keep []int
	for i := range msgs {
		part, err := Check(p.m.Subject, p.m.Partitions, msgs[i].ID, msgs[i].Subject)
		var o inbox.Outcome
		switch {
		case err != nil:
			o = inbox.Outcome{Status: inbox.StatusRejected, Cause: inbox.CauseBadInput, Reason: inbox.SanitizeReason(err.Error()), Err: inbox.BadInput(err)}
		case !owned[part] && part < len(handedOff) && handedOff[part] > 0 && msgs[i].StreamSeq >= handedOff[part]:
			// Settled here, applied by the partition's owner, to which its
			// hand-off durable delivers it.
			o = inbox.Outcome{Status: inbox.StatusDuplicate, Reason: fmt.Sprintf("partition %d handed off from stream sequence %d", part, handedOff[part])}
		case !owned[part] && part < len(handedOff) && handedOff[part] > 0:
			// Before the hand-off's start: it can reach this shard only
			// through a max-deliveries rescue that came after the move,
			// and no shard reads it any more. Dead-lettered with the way
			// to the owner, never left to retry for ever.
			err = inbox.Permanent(fmt.Errorf("partition %d was handed off to its new owner from stream sequence %d; this earlier message reached the old owner after the move: re-drive it (jetinbox dlq -shards FILE -redrive -id ID) for the new owner", part, handedOff[part]))
			o = inbox.Outcome{Status: inbox.StatusRejected, Cause: inbox.CausePermanent, Reason: inbox.SanitizeReason(err.Error()), Err: err}
		case !owned[part]:
			err = fmt.Errorf("%w: partition %d", ErrNotOwned, part)
			// Not the message's fault: on its last delivery it is left
			// for the rescue, which the partition's new owner runs.
			o = inbox.Outcome{Status: inbox.StatusRetry, Cause: inbox.CauseTransient, Reason: err.Error(), Err: err, NotMessageFault: true}
		default:
			if out != nil {
				keep = append(keep, i)
			}
			continue
		}
		if out == nil { // the first message held back: from now on, keep count
			out = make([]inbox.Outcome, len(msgs))
			keep = make([]int, 0, len(msgs))
			for j := range i {
				keep = append(keep, j)
			}
		}
		out[i] = o
	}
	if out == nil {
		return p.BatchProcessor.Process(ctx, msgs)
	}
	if len(keep) == 0 {
		return out, nil
	}
	sub := make([]inbox.Message, len(keep))
	for j, i := range keep {
		sub[j] = msgs[i]
	}
	res, err := p.BatchProcessor.Process(ctx, sub)
	for j, i := range keep {
		if j < len(res) {
			out[i] = res[j]
		}
	}
	return out, err
}

// Warm warms the inner processor's connections once for the whole shard.
// Its partition consumers share one small pool, and each warming its
// batches' connections at once would hold a connection while waiting for
// another: every consumer stalled until the warm-up gave up.
func (p *Processor) Warm(ctx context.Context, n int) error {
	if !p.warmed.CompareAndSwap(false, true) {
		return nil
	}
	return p.BatchProcessor.Warm(ctx, n)
}

// Check forwards the inner processor's check of its database (see
// [jsinbox.Checker]), or pings it if the inner processor has no check, so
// that a partition consumer refuses an unfit database and pauses while it
// cannot take batches, as any consumer does.
func (p *Processor) Check(ctx context.Context) error {
	if c, ok := p.BatchProcessor.(jsinbox.Checker); ok {
		return c.Check(ctx)
	}
	return p.BatchProcessor.Ping(ctx)
}

// Map returns the shard map the processor checks against.
func (p *Processor) Map() *Map { return p.m }

// Owns reports whether the shard takes partition q now.
func (p *Processor) Owns(q int) bool {
	o := *p.owned.Load()
	return q >= 0 && q < len(o) && o[q]
}

var (
	_ jsinbox.BatchProcessor = (*Processor)(nil)
	_ jsinbox.Checker        = (*Processor)(nil)
)
