// What a consumer tells about itself: counters, the server's view of its
// durable, and a hook that sees every batch.

package jsinbox

import (
	"context"
	"errors"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/jetinbox/jetinbox/inbox"
)

// Observer watches batches. ObserveBatch runs on the batch's goroutine: keep
// it fast.
type Observer interface {
	ObserveBatch(BatchReport)
}

// BatchReport describes one processed batch. Its slices belong to the
// consumer: read them during the call only.
type BatchReport struct {
	Messages []inbox.Message
	Outcomes []inbox.Outcome
	// Err is the batch-level error, if the batch failed as a whole.
	Err error
	// Began and Ended bracket the transaction (Ended is after COMMIT).
	Began, Ended time.Time
}

// ConsumerStats counts what a Consumer did.
type ConsumerStats struct {
	Received, Applied, Duplicates, Rejected, Conflicts int64
	// Redeliveries: messages received with a delivery count above 1.
	Redeliveries int64
	// Naks: messages handed back for a later retry (NakWithDelay).
	Naks int64
	// DeadLettered: messages published to the dead-letter stream, then
	// terminated.
	DeadLettered int64
	// Batches committed or failed, and batches that failed as a whole.
	Batches, FailedBatches int64
	// InFlight: batches being processed now.
	InFlight int64
	// Rescued: messages the server gave up on after MaxDeliver, settled
	// from its advisory.
	Rescued int64
	// RejectedRepeats: copies of an intent rejected before at another
	// stream sequence (a re-publish of the rejected ID), terminated
	// without a second dead letter.
	RejectedRepeats int64
	// DeadLettersHeld: messages on their final delivery held now because
	// the dead-letter stream refuses them (missing, full). Above 0 the
	// consumer is not ready.
	DeadLettersHeld int64
	// CopyClaims and CopyFallbacks: see [inbox.ProcessorStats].
	CopyClaims, CopyFallbacks int64
}

// Stats returns the counters so far.
func (c *Consumer) Stats() ConsumerStats {
	ps := c.proc.Stats()
	return ConsumerStats{
		Received: c.received.Load(), Applied: c.applied.Load(), Duplicates: c.duplicates.Load(),
		Rejected: c.rejected.Load(), Conflicts: c.conflicts.Load(), Redeliveries: c.redeliveries.Load(),
		Naks: c.naks.Load(), DeadLettered: c.deadLettered.Load(), Batches: c.batches.Load(), FailedBatches: c.failedBatches.Load(),
		InFlight: c.inFlight.Load(), Rescued: c.rescued.Load(), RejectedRepeats: c.rejectedRepeats.Load(), DeadLettersHeld: c.deadLettersHeld.Load(),
		CopyClaims: ps.CopyClaims, CopyFallbacks: ps.CopyFallbacks,
	}
}

// Info returns the server's view of the durable (pending and ack-pending
// counts), once Run has bound it.
func (c *Consumer) Info(ctx context.Context) (*jetstream.ConsumerInfo, error) {
	b := c.bound.Load()
	if b == nil {
		return nil, errors.New("jsinbox: consumer not running")
	}
	return (*b).Info(ctx)
}
