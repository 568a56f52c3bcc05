// What a consumer tells about itself: counters, the server's view of its
// durable, and a hook that sees every batch.

package jsinbox

import (
	"context"
	"errors"
	"fmt"
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
	// Received and Acked are set for an [AckObserver] only: when the NATS
	// client handed each message to the consumer, and when the batch's
	// acks were handed to the connection.
	Received []time.Time
	Acked    time.Time
	// Steps: for an [AckObserver] only, when the transaction's last
	// attempt passed each of its steps (BEGIN, the claim, the effect's
	// turn, the effect, COMMIT), if the processor records them (an
	// *inbox.Processor does).
	Steps inbox.StepTimes
}

// AckObserver is an [Observer] that is also told when a batch's acks were
// sent, with when each of its messages was received: latency split by
// stage (jetinbox bench). ObserveAcked runs on the batch's goroutine.
type AckObserver interface {
	Observer
	ObserveAcked(BatchReport)
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
	// RescueExpired: messages the server gave up on that aged out of the
	// stream before their rescue; each is recorded in the dead-letter
	// stream with status [DeadLetterExpired]. Their fate is unknown.
	RescueExpired int64
	// ForeignAdvisories: messages in the advisory stream that are no
	// max-deliveries advisory of this durable (a JetStream answer routed
	// there by a reply subject, garbage, or one naming a message the
	// stream never held), terminated without rescuing anything.
	ForeignAdvisories int64
	// RescueStaleReads: read-backs of a message the server gave up on
	// that found nothing while the stream, as its leader reports it, still
	// holds the message (a replica or mirror behind the leader answered the
	// direct get). The advisory is left unsettled and tried again after a
	// jittered backoff; the message is never recorded as expired for it.
	RescueStaleReads int64
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
	// LeftForRescue: messages on their last delivery left unsettled
	// because what kept them from being applied was not their fault (the
	// database unavailable or unfit, a partition moved away): the server
	// gives up on each after AckWait, and the rescue applies it from its
	// advisory.
	LeftForRescue int64
}

// Stats returns the counters so far.
func (c *Consumer) Stats() ConsumerStats {
	ps := c.proc.Stats()
	return ConsumerStats{
		Received: c.received.Load(), Applied: c.applied.Load(), Duplicates: c.duplicates.Load(),
		Rejected: c.rejected.Load(), Conflicts: c.conflicts.Load(), Redeliveries: c.redeliveries.Load(),
		Naks: c.naks.Load(), DeadLettered: c.deadLettered.Load(), Batches: c.batches.Load(), FailedBatches: c.failedBatches.Load(),
		InFlight: c.inFlight.Load(), Rescued: c.rescued.Load(), RejectedRepeats: c.rejectedRepeats.Load(), DeadLettersHeld: c.deadLettersHeld.Load(),
		RescueExpired: c.rescueExpired.Load(), ForeignAdvisories: c.foreignAdvisories.Load(), LeftForRescue: c.leftForRescue.Load(),
		RescueStaleReads: c.rescueStaleReads.Load(),
		CopyClaims:       ps.CopyClaims, CopyFallbacks: ps.CopyFallbacks,
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

// StreamUsage is how full one of a consumer's streams is against its
// limits. A stream of intents is DiscardNew: full, it refuses what comes
// next, and what it refuses depends on the stream (see
// [Consumer.StreamUsage]).
type StreamUsage struct {
	Stream string
	// Msgs and Bytes: what the stream holds now.
	Msgs, Bytes uint64
	// MaxMsgs and MaxBytes: its limits; 0 or less is no limit.
	MaxMsgs, MaxBytes int64
}

// Fill is the larger of Msgs/MaxMsgs and Bytes/MaxBytes: 1 is full. A
// stream with neither limit is never full by this measure: 0.
func (u StreamUsage) Fill() float64 {
	var f float64
	if u.MaxMsgs > 0 {
		f = float64(u.Msgs) / float64(u.MaxMsgs)
	}
	if u.MaxBytes > 0 {
		f = max(f, float64(u.Bytes)/float64(u.MaxBytes))
	}
	return f
}

// StreamUsage reads how full the consumer's three streams are: its
// intents (full: producers' publishes are refused and retried), their
// dead-letter stream (full: messages to dead-letter are held, and the
// consumer goes unready) and the advisory stream that keeps the server's
// give-ups (full: the server's reports of give-ups are refused, and those
// messages are settled by nobody). A stream that does not exist is left
// out. It asks the server once per stream.
func (c *Consumer) StreamUsage(ctx context.Context) ([]StreamUsage, error) {
	names := [...]string{c.cfg.Stream, DeadLetterStream(c.cfg.Stream), AdvisoryStream(c.cfg.Stream)}
	out := make([]StreamUsage, 0, len(names))
	for _, name := range names {
		s, err := c.js.Stream(ctx, name)
		if errors.Is(err, jetstream.ErrStreamNotFound) {
			continue
		}
		if err != nil {
			return out, fmt.Errorf("jsinbox: stream %s: %w", name, err)
		}
		info := s.CachedInfo()
		out = append(out, StreamUsage{Stream: name, Msgs: info.State.Msgs, Bytes: info.State.Bytes,
			MaxMsgs: info.Config.MaxMsgs, MaxBytes: info.Config.MaxBytes})
	}
	return out, nil
}
